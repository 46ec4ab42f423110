//! CUDA sources of the workload kernels (compiled at run time through NVRTC with `strata.cuh`).

/// BFS, connected components and PageRank, each for a Strata space and for a plain pointer.
pub const GRAPH_CU: &str = include_str!("../../cuda/graph.cu");
/// Embedding gathers with sum pooling; needs `-DEMBED_DIM=<floats per row>`.
pub const EMBED_CU: &str = include_str!("../../cuda/embed.cu");

/// NVRTC options for the embedding kernels at row width `dim`.
#[must_use]
pub fn embed_options(dim: u32) -> Vec<String> {
    vec![format!("-DEMBED_DIM={dim}")]
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_gpu::nvrtc;

    /// Every kernel compiles for Hopper (no GPU needed: NVRTC only). Skips, saying so, when
    /// NVRTC is not installed; CI installs it.
    #[test]
    fn kernels_compile_for_sm_90() {
        if !nvrtc::available() {
            eprintln!("SKIPPED: NVRTC not found (put libnvrtc.so.13 on LD_LIBRARY_PATH)");
            return;
        }
        let cubin =
            nvrtc::compile(GRAPH_CU, "graph.cu", "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
        assert!(cubin.len() > 1000);
        for dim in [32, 64, 128, 256, 1024] {
            nvrtc::compile(EMBED_CU, "embed.cu", "sm_90", &embed_options(dim))
                .unwrap_or_else(|e| panic!("dim {dim}: {e}"));
        }
        let err = nvrtc::compile(EMBED_CU, "embed.cu", "sm_90", &embed_options(48)).unwrap_err();
        assert!(err.to_string().contains("multiple of 32"), "{err}");
        let err = nvrtc::compile(EMBED_CU, "embed.cu", "sm_90", &[]).unwrap_err();
        assert!(err.to_string().contains("EMBED_DIM"), "{err}");
    }
}
