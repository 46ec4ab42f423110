//! Umap-compatible C API over strata-pager (filled in by the pager work).
