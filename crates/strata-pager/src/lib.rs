//! Strata's user-space pager: CPU memory regions whose pages live in any
//! [`Store`](strata_core::Store) and are brought in on demand through userfaultfd.
//!
//! ```no_run
//! use std::sync::Arc;
//! use strata_core::{MemoryStore, PagerConfig};
//! use strata_pager::Region;
//!
//! let store = Arc::new(MemoryStore::new(1 << 30));
//! let config = PagerConfig::builder().page_bytes(64 << 10).buffer_bytes(64 << 20).build()?;
//! let mut region = Region::new(store, 1 << 30, config)?;
//! region.as_mut_slice()[12345] = 7; // faults the page in, marks it dirty
//! region.flush()?;                  // writes it back to the store
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layout (rustix-style): [`sys`] holds every raw kernel call (userfaultfd ioctls with
//! `#[repr(C)]` structs checked by layout tests, `mmap`, `epoll`); [`pages`] the lock-free page
//! and frame tables; [`region`] the safe [`Region`] API and its filler and evictor threads;
//! [`stream`] the STREAM kernels that `strata bench stream` (and other benchmarks) run over a
//! region; [`probe`] the userfaultfd capability probe used by `strata info`.
#![warn(missing_docs)]

pub mod bench;
pub mod pages;
pub mod probe;
pub mod region;
pub mod stream;
pub mod sys;

pub use region::{EvictionPolicy, PagerCounters, Region, RegionBuilder, RegionError, UnmapError};
