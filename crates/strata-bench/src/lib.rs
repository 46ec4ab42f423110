//! Strata's benchmarks and their reporting, kept out of the libraries they measure so that a
//! library user compiles none of it.
//!
//! - Measuring: [`pager`] (fault rate and bandwidth against the kernel's `mmap` paging),
//!   [`net`] (raw store throughput, the loopback TCP ceiling), [`gpu_micro`] (GPU paging
//!   against zero-copy, chunked copies and UVM), [`gpu_store`] (GPU spaces over stores against
//!   each target's baseline), [`workloads`] (graph and embedding workloads), [`kernel_swap`]
//!   (the kernel's zram and swap-file swap as the baseline of `strata bench run`), [`peer`]
//!   (the peer tier, borrowed neighbour-GPU memory, against host-only eviction).
//! - Reporting: [`ceilings`] (the machine's own limits, probed and cached per device and
//!   driver), [`record`] (the JSON every benchmark writes: machine, device, driver, commit,
//!   arguments, ceilings, figures), [`plot`] (one plotting module, PNG and SVG), [`compare`]
//!   (`strata bench compare OLD.json NEW.json`).
//! - [`store_spec`]: the `--store/--codec/--file-io/--host-cache` flags of the GPU benchmarks,
//!   parsed once and opened per space.
//! - [`cmd`]: the `strata bench ...` commands, their arguments and their printing; the
//!   `strata` binary only parses and calls [`cmd::run`].
#![warn(missing_docs)]

pub mod ceilings;
pub mod cleanup;
pub mod cmd;
pub mod compare;
pub mod gpu_ceilings;
pub mod gpu_micro;
pub mod gpu_store;
pub mod kernel_swap;
pub mod net;
pub mod pager;
pub mod peer;
pub mod plot;
pub mod record;
pub mod store_spec;
pub mod strata_cgroup;
pub mod stream;
pub mod sys;
pub mod unified;
pub mod workloads;
