//! Strata's user-space pager (filled in by the pager work).
#![warn(missing_docs)]
pub mod probe;
