//! One module per area; each owns its arguments and calls its library.

pub mod gpu;
pub mod info;
pub mod pager;
pub mod remote;
pub mod run;
pub mod run_bench;
pub mod workloads;
