//! `libstrata_run.so`: run an unmodified program with its large allocations paged by Strata.
//!
//! Preloaded by `strata run` (or by hand: `LD_PRELOAD=libstrata_run.so STRATA_RUN_MEMORY=2GiB
//! program`), the library replaces `malloc`, `calloc`, `realloc`, `free`, `posix_memalign`,
//! `aligned_alloc`, `memalign`, `valloc`, `pvalloc`, `malloc_usable_size` (C++ `new` reaches
//! these) and `mmap`/`munmap`/`mremap` of private anonymous memory called through the
//! dynamic linker. Requests at or above a threshold (`STRATA_RUN_THRESHOLD`, default 256 KiB
//! or the page size if larger) get space in one large pager region, the *arena*, over the
//! chosen store; smaller ones and everything else go to the C library. The arena's one
//! buffer is the process's whole resident budget (`STRATA_RUN_MEMORY`), shared by all its
//! blocks, so no pager change is needed; `free`/`munmap` drop a block's pages with
//! `Region::evict`.
//!
//! Semantics a user should know:
//! - Each process that makes a large allocation gets its own arena, store and budget
//!   (started lazily, so small helpers started by `system()` cost nothing).
//! - `fork` then `exec` works. A forked child that does *not* exec keeps working with memory
//!   it allocates itself (from the C library), but the parent's arena is not copied into it
//!   (`MADV_DONTFORK`): touching it is refused with a message and `SIGSEGV`, never silent
//!   zeros.
//! - The arena's page size is 64 KiB unless given (`STRATA_PAGE_SIZE`); when the first
//!   large request is more than 3x the budget it is 32 KiB (on this host), more than 4x
//!   4 KiB (16 KiB over memory nodes on other hosts): see [`options::page_for`].
//! - A memory-node store (`remote:`) is connected in the background: the program runs on
//!   while it connects, and waits only when the budget is full and a page must go to the
//!   node. If the connection fails, the process ends with exit status 125 and the reason.
//! - Over memory nodes, unless `STRATA_RUN_ARENA` sets the arena's size, the arena's store
//!   borrows from the nodes as the arena grows, never more than they have free
//!   ([`node_backing`]). A large request that finds no room, there or in any full arena, is
//!   served by the C library (unpaged), as if Strata were not there, and counted in the
//!   report (`arena_fallbacks`).
//! - A store that fails on a fault delivers `SIGBUS` to the faulting thread (as the pager
//!   does); a message names the store and the error first.
//! - File stores (`file:DIR`) are created in `DIR` and unlinked at once, so they vanish
//!   however the process ends.
//! - `free` discards a freed block's pages (dropped without write-back; reused space reads
//!   as zeros, filled without a store read). Partial `munmap` of an arena mapping keeps the
//!   memory until the whole mapping is unmapped.
//!
//! Layout: [`sys`] raw calls and the lookup of the real functions; [`arena`] the block
//! allocator's bookkeeping; [`group_room`] the watcher that keeps free room in the process's
//! memory cgroup (`STRATA_RUN_KEEP_ROOM`); [`options`] settings; [`runtime`] the arena region and blocks;
//! [`pending_store`] a memory-node store that connects in the background while the program
//! runs; [`growing_store`] a store of chunks added in use, and [`node_backing`] when it
//! borrows them from memory nodes; `interpose` the exported C functions (left out of
//! unit-test builds, where they would replace the test harness's allocator).
#![warn(missing_docs)]
#![allow(missing_docs)] // sys's Real fields are C prototypes, named after the functions

pub mod arena;
pub mod group_room;
pub mod growing_store;
pub mod node_backing;
pub mod options;
pub mod pending_store;
pub mod runtime;
pub mod sys;

#[cfg(not(test))]
mod interpose;
