//! The workloads on a GPU: kernels, graph and embedding runners over Strata spaces and the
//! baselines (GPU memory, zero-copy pinned host memory, CUDA managed memory).

pub mod device;
pub mod embed;
pub mod graph;
pub mod kernels;
pub mod placed;
