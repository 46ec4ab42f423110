//! Workloads on GPU paging (filled in by the workloads work).
