//! The service kernel compiles through NVRTC for sm_90 (no GPU needed). NVRTC comes from the
//! nvidia-cuda-nvrtc wheel on LD_LIBRARY_PATH; without it this test says it skipped, unless
//! `CI` is set, where a missing NVRTC fails.

#[test]
fn service_kernel_compiles_for_sm90() {
    if !strata_copy::sys::nvrtc_present() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but NVRTC could not be loaded: put the nvidia-cuda-nvrtc wheel's lib dir on LD_LIBRARY_PATH"
        );
        eprintln!(
            "skipped: NVRTC not found (set LD_LIBRARY_PATH to the nvidia-cuda-nvrtc wheel's lib dir)"
        );
        return;
    }
    let cubin = strata_copy::service::service_cubin("sm_90").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&cubin[..4], b"\x7fELF");
    let name = strata_copy::service::SERVICE_KERNEL.as_bytes();
    assert!(
        cubin.windows(name.len()).any(|w| w == name),
        "kernel symbol missing from the CUBIN"
    );
    // A broken source reports NVRTC's log.
    let err = strata_copy::sys::nvrtc_compile(
        "extern \"C\" __global__ void k() { nope; }",
        "bad.cu",
        "sm_90",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("nope"), "{err}");
}
