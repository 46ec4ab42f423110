//! GPU-driven demand paging (filled in by the GPU work).
#![warn(missing_docs)]
pub mod probe;
