//! UCX binding (filled in by the network work).
#![warn(missing_docs)]
pub mod probe;
