//! Remote memory over UCX (filled in by the network work).
