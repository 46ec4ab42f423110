//! One module per area; each owns its arguments and calls its library. The benchmarks'
//! commands live in `strata_bench::cmd`.

pub mod broker;
pub mod info;
pub mod run;
mod run_target;
pub mod serve;
