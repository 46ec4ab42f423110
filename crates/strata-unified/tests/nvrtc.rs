//! CI-side (no GPU): `strata/unified.cuh` and the GPU tests' kernels compile through NVRTC for
//! sm_90 (skipped without NVRTC unless `CI` is set), and the header's struct matches the
//! handle's size.

use strata_gpu::nvrtc;

#[test]
fn unified_header_and_kernels_compile_for_sm90() {
    if !nvrtc::available() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but NVRTC could not be loaded: put the nvidia-cuda-nvrtc wheel's lib dir on LD_LIBRARY_PATH"
        );
        eprintln!("skipped: NVRTC not found");
        return;
    }
    for (name, src) in [
        ("header_only.cu", "#include \"strata/unified.cuh\"\n"),
        ("kernels.cu", include_str!("kernels.cu")),
    ] {
        let cubin = nvrtc::compile(&strata_unified::with_header(src), name, "sm_90", &[])
            .unwrap_or_else(|e| panic!("{name} failed to compile: {e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "{name}");
    }
    // A kernel using a missing name fails with NVRTC's log, naming the line.
    let bad = strata_unified::with_header(
        "extern \"C\" __global__ void k(StrataUnified u) { strata::nope(u); }",
    );
    let e = nvrtc::compile(&bad, "bad.cu", "sm_90", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn handle_has_the_header_layout() {
    assert_eq!(
        std::mem::size_of::<strata_unified::UnifiedHandle<'_>>(),
        128
    );
    assert!(strata_unified::UNIFIED_CUH.contains("sizeof(StrataUnified) == 128"));
}
