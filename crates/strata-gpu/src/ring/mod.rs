//! The GPU-to-host request ring of store-backed spaces and the pinned host cache it fills.
//! See [`layout`] for the protocol both sides follow.

pub mod layout;
