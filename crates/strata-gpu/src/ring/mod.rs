//! The GPU-to-host request ring of store-backed spaces and the pinned host cache it fills.
//! See [`layout`] for the protocol both sides follow.
//!
//! Host side: [`SharedRing`] (the shared memory, the only raw-pointer code), the host cache
//! (`host_cache`: slots, CLOCK, dirty pages), [`RingServer`] (a dispatcher thread draining the
//! ring in ticket order, `copier` threads copying WRITEs' staging pages into slots in parallel,
//! `store_io` workers batching store reads and writes).

mod copier;
mod dispatcher;
mod error;
mod host_cache;
pub mod layout;
mod server;
mod shared;
mod store_io;

pub use error::{DirtyPages, PageFailure, PageOp, RingError};
pub use server::{RingServer, RingServerOptions, RingStats};
pub use shared::{RingGeometry, SHARED_ALIGN, SharedRing};
