//! What can go wrong in the ring's host side, and what a caller does about it.

use std::fmt;

use strata_core::store::StoreError;

/// Which store operation failed on a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PageOp {
    /// Filling the host cache from the store (the device saw an ERROR slot word).
    Read,
    /// Writing a dirty host-cache page to the store (the page stays dirty in the host cache).
    Write,
}

/// One page the store failed on, with the store's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageFailure {
    /// Page of the space.
    pub page: u64,
    /// What was being done.
    pub op: PageOp,
    /// The store's message (or why no store call was possible).
    pub message: String,
}

impl fmt::Display for PageFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.op {
            PageOp::Read => "reading",
            PageOp::Write => "writing",
        };
        write!(f, "page {} failed {op}: {}", self.page, self.message)
    }
}

/// Copies of dirty pages the store would not take, handed back inside an error so that nothing
/// is lost. Its `Debug` shows pages and sizes, not the bytes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct DirtyPages(pub Vec<(u64, Vec<u8>)>);

impl fmt::Debug for DirtyPages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(page, bytes)| (page, bytes.len())))
            .finish()
    }
}

fn summary(failures: &[PageFailure]) -> String {
    match failures.first() {
        Some(first) if failures.len() > 1 => {
            format!("{first} (and {} more)", failures.len() - 1)
        }
        Some(first) => first.to_string(),
        None => "no page named".into(),
    }
}

/// Errors of the ring's host side. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// The shared memory's shape is unusable.
    #[error("ring geometry is invalid: {0}; fix the sizes the ring is built with")]
    Geometry(String),
    /// The server's options are unusable.
    #[error("ring server option {name} = {value} is invalid: {fix}")]
    Options {
        /// The option.
        name: &'static str,
        /// Its value, as text.
        value: String,
        /// What a valid value is.
        fix: &'static str,
    },
    /// The store is smaller than the space it backs.
    #[error(
        "{store} holds {store_size} bytes but the space needs {space_size}; give a store at least as large as the space"
    )]
    StoreTooSmall {
        /// The store.
        store: String,
        /// Its size.
        store_size: u64,
        /// The space's size.
        space_size: u64,
    },
    /// Host memory for the shared structures could not be had.
    #[error(
        "cannot allocate {bytes} bytes of host memory for the ring; use a smaller host cache or ring"
    )]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Pages named by a host call lie outside the space.
    #[error(
        "pages {start}..{end} are not inside the space's {pages} pages; name pages below {pages}"
    )]
    PageRange {
        /// First page asked for.
        start: u64,
        /// End (exclusive) asked for.
        end: u64,
        /// Pages of the space.
        pages: u64,
    },
    /// A server thread could not be started.
    #[error("cannot start a ring server thread: {0}; free some threads or memory and retry")]
    Spawn(#[source] std::io::Error),
    /// Dirty pages could not be written to the store; they stay dirty in the host cache.
    #[error(
        "{} dirty page(s) could not be written to the store: {}; they stay dirty in the host cache: fix the store and flush again, or take them with dirty_pages",
        failures.len(), summary(failures)
    )]
    Flush {
        /// The pages and the store's messages.
        failures: Vec<PageFailure>,
    },
    /// Every page reached the store but the store's own flush (durability point) failed.
    #[error(
        "the store's flush failed: {0}; the pages were written but may not be durable: fix the store and flush again"
    )]
    StoreFlush(#[source] StoreError),
    /// The server stopped with pages the store would not take; here they are.
    #[error(
        "the ring server stopped with {} page(s) the store would not take ({}); their bytes are in `dirty`: write them elsewhere",
        dirty.0.len(), summary(failures)
    )]
    Unflushed {
        /// Why each page could not be written.
        failures: Vec<PageFailure>,
        /// The pages' bytes.
        dirty: DirtyPages,
    },
}
