//! Strata's shared vocabulary: page geometry, configuration, the [`store::Store`] trait with
//! memory and file stores, and statistics. Every other Strata crate builds on these types.
//!
//! This crate holds no GPU code and no raw OS calls beyond `pread`/`pwrite`/`fdatasync` through
//! the standard library; the pager, GPU and network crates own their unsafe code.
//!
//! Page codecs (LZ4, ZFP) live in their own crate, `strata-codec`, rather than here as the
//! design first proposed: ZFP comes from a C library, and keeping it out of the core keeps
//! every other crate free of that dependency.

#![warn(missing_docs)]

pub mod config;
pub mod geometry;
pub mod stats;
pub mod store;
pub mod units;

pub use config::{ConfigError, PagerConfig, SpaceConfig, StoreConfig};
pub use geometry::{GeometryError, PageSize, SpaceGeometry};
pub use stats::{Stats, StatsSnapshot, Tier};
pub use store::{
    FaultPlan, FaultyStore, FileStore, FileStoreOpenError, FileStoreOptions, MemoryStore,
    PackedMemoryStore, Store, StoreError,
};
pub use units::{format_size, parse_size};
