//! GPU-driven demand paging: a *space* is a byte range that may be far larger than the GPU's
//! memory. A page cache of frames in GPU memory holds the resident pages; a page table (one
//! 64-bit word per page: state, dirty bit, frame, version, pin count) and a frame table (page,
//! reference/protected bits) live in GPU memory. Kernels include `strata.cuh` and read and write
//! elements or whole pages; a page fault is served by the faulting warp itself (claim, clock
//! sweep with reference bits, dirty victim written down, 16-byte coalesced copy-in, release
//! fence), with no kernel launch or driver call on the path.
//!
//! # The tier chain
//! Below the GPU cache, a page lives in one of these, and the fault path asks them in order
//! (device side `cuda/strata/tiers.cuh`, host side the crate's `tier` module):
//!
//! ```text
//!  GPU frames ──miss──> [peer slots] optional (SpaceOptions::peers): neighbour GPUs' memory
//!      ^                             borrowed as a victim cache (CUDA VMM); every evicted page
//!      │                             is copied there too, a fault on it loads over NVLink
//!      │        ──then──> [host copy] the whole space in pinned host memory (Strata::space):
//!      │                             the warp copies the page straight in; a dirty victim
//!      │                             goes back in the same pass
//!      │        ──or──> [host cache] bounded pinned slots (Strata::space_over_store): a page
//!      │                     │       there is copied straight in (checked like a seqlock);
//!      │                     │       else the warp posts a READ on the request ring and waits
//!      │                     v       on the page's slot word; dirty victims go down as WRITEs
//!      └──────────────  [store]      memory, file, memory node, compressed: host threads
//!                                    (ring::RingServer) drain the ring in ticket order and
//!                                    batch read_batch/write_batch, with read-ahead
//! ```
//! Background write-back (`cuda/strata/write_back.cuh`, [`space::BackgroundWriteBack`], on by
//! default): every kernel launched with a space's handle gets a few of Strata's warps beside
//! it, on a high-priority stream, that write dirty pages down the chain just ahead of the
//! clock hand (between two water marks), so the fault that takes such a frame only loads; a
//! stop queued after the kernel on its stream ends them.
//!
//! A new tier (a neighbour GPU's memory, one allocation shared with the CPU) is one device
//! header beside `tier_host_copy.cuh` and `tier_ring.cuh` and one host module beside
//! `tier/host_copy.rs` and `tier/store.rs`.
//!
//! Layers: [`driver`] (thin safe wrappers over the CUDA driver, loaded at run time), [`nvrtc`]
//! (run-time compilation to CUBIN with a disk cache in `STRATA_KERNEL_CACHE`), [`layout`] (the
//! `#[repr(C)]` structures shared with the header), [`runtime`] (a GPU with Strata's kernels),
//! [`space`] (spaces: options, errors, statistics, maintenance), [`ring`] (the request ring's
//! host side and its host cache).
//! The benchmarks (`strata bench gpu-micro`) live in the `strata-bench` crate.
//!
//! ```no_run
//! use strata_gpu::{Strata, SpaceOptions, ElementType, driver::Args};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let strata = Strata::new(0)?;                       // GPU 0 + Strata's kernels
//! let opts = SpaceOptions { page_size: 64 << 10, cache_bytes: 1 << 30,
//!                           element: ElementType::F64, ..Default::default() };
//! let n: u64 = 1 << 30;                               // 8 GiB of doubles, 1 GiB cache
//! let mut space = strata.space(n * 8, &opts)?;
//! space.with_host_mut(|bytes| bytes.fill(0))?;        // or fill_from_slice / fill_from_store
//! let module = strata.compile(r#"
//!     #include "strata.cuh"
//!     extern "C" __global__ void scale(StrataSpace s, unsigned long long n, double k) {
//!         strata::Array<double> a(s);
//!         for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
//!              i < n; i += (unsigned long long)gridDim.x * blockDim.x)
//!             a.write(i, a.read(i) * k);
//!     }"#, "scale.cu")?;                              // compile errors carry NVRTC's log
//! let scale = module.function("scale")?;
//! scale.launch(scale.full_grid(256)?, &Args::new().arg(space.handle()).arg(n).arg(2.0f64))?;
//! space.check_errors()?;                              // out-of-range accesses surface here
//! let mut head = vec![0f64; 16];
//! space.read_back(0, &mut head)?;                     // flushes dirty pages first
//! println!("{}", space.stats()?.to_snapshot());
//! # Ok(()) }
//! ```
//!
//! Device API (`strata.cuh`, path via [`nvrtc::STRATA_CUH`] for nvcc users: write it out):
//! `strata::Array<T>(space)` with `read(i)`, `write(i, v)`, `atomic_add(i, v)` for 4/8-byte
//! integers and floats; `strata::acquire(space, page, write)` / `strata::release(space, ref)`
//! for bulk loops over a page's bytes (`ref.data`). All are warp-collective over the calling
//! lanes, which coalesce on equal (space, page); a group pins for writing if any lane writes.
//! Lanes may differ in everything. `strata.cuh` says what a kernel may hold at once; beyond
//! that a warp waits at most [`Space::set_wait_limit`] and the access fails with
//! [`SpaceError::NoFrame`]. Page indices past the end fail with [`SpaceError::PageOutOfRange`]
//! and touch nothing. Every error surfaces through [`Space::check_errors`].
//!
//! Host maintenance (`flush`, `evict`, `prefetch`, `read_back`) waits for every kernel queued
//! in the GPU's context (any stream, any `Strata` handle) before it runs, and so does dropping
//! a space; a [`layout::SpaceHandle`] borrows its space; kernels keep their module loaded.
//!
//! Reads need no atomic on a hit: `read(i)` (and `strata::view_page` / `strata::view_valid`
//! for bulk reads) reads the page word, the bytes from its frame, and the word again, and keeps
//! the bytes only if the page stayed resident in that frame with the same version; an
//! evictor marks the word EVICTING before it overwrites a frame and bumps the page's version
//! when it leaves, so a reader can never keep another page's bytes. Misses, moved pages,
//! writes and atomics take the pinned path (one atomic pins and reads the word, one unpins).
//!
//! Eviction: [`EvictionPolicy::Clock`] (clock with reference bits) or
//! [`EvictionPolicy::ScanResistant`] (a protected segment that pages enter only when referenced
//! again after the hand passed them, and leave only after many epochs of faults without a
//! reference; probationary pages keep a second chance for half the probationary segment's
//! turnover in faults, however fast busy sweeps spin the hand), per space.
//!
//! Deviation from DESIGN.md, on purpose: the pin count lives in the page-table word rather than
//! the frame table, so a hit is a single atomic that pins and reads the state at once, and an
//! evictor's compare-and-swap fails whenever a pin exists (no window between check and pin).
#![warn(missing_docs)]
pub mod driver;
pub mod layout;
pub mod nvrtc;
pub mod probe;
pub mod ring;
pub mod runtime;
pub mod space;
mod tier;

pub use runtime::{KernelModule, Strata};
pub use space::{
    ElementType, EvictionPolicy, GpuStats, Space, SpaceError, SpaceOptions, SpacePlan,
};
