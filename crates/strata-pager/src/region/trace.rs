//! An optional record of evictions and fills, for studying read-back policies offline.
//!
//! Set `STRATA_PAGER_TRACE=PREFIX` and every region writes `PREFIX.PID.N` (N counts the
//! process's regions): 16-byte little-endian records, two `u64` each. The first holds the
//! event kind in its top byte and the page number below; the second the eviction batch (for
//! evictions) or 1 for a fill of zeros and 0 for a fill from the store. Records are written in
//! 4 KiB chunks, so a process that exits without dropping its regions loses at most the last
//! chunk. Off (the default), each event costs one branch on a `None`. Which pages a program
//! writes, and which evictions cost a write, are recorded too (`Written`, `WroteBack`): a
//! policy study needs to tell a page read at random from one rewritten by a stream.

use std::fs::File;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What happened to a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Event {
    /// The first record: the page size in place of a page, the buffer's frames as the extra.
    Header = 0,
    /// Dropped from memory by an eviction (written back first if dirty).
    Evicted = 1,
    /// Filled for a missing-page fault on this very page: the synchronous read.
    Demand = 2,
    /// Filled without a fault on it: read with a demand page, read ahead, or prefetched.
    Ahead = 3,
    /// Read back with a fault on another page (evicted next to it).
    ReadBack = 4,
    /// The first write to a clean resident page (its write-protect fault).
    Written = 5,
    /// Written back to the store as it was evicted (the `Evicted` record follows); the extra
    /// is 1 when the page was made writable on a guess and never seen written.
    WroteBack = 6,
}

const CHUNK: usize = 4 << 10;
const PAGE_MASK: u64 = (1 << 56) - 1;

/// The open trace of one region.
#[derive(Debug)]
pub(super) struct Trace {
    out: Mutex<(File, Vec<u8>)>,
    batches: AtomicU64,
}

static REGIONS: AtomicUsize = AtomicUsize::new(0);

impl Trace {
    /// The trace `STRATA_PAGER_TRACE` asks for, if any. A trace that cannot be opened is
    /// reported and skipped: tracing never stops a region from working.
    pub(super) fn from_env(page_bytes: usize, frames: usize) -> Option<Self> {
        let prefix = std::env::var_os("STRATA_PAGER_TRACE")?;
        let n = REGIONS.fetch_add(1, Ordering::Relaxed);
        let mut path = prefix;
        path.push(format!(".{}.{n}", std::process::id()));
        match File::create(&path) {
            Ok(file) => {
                let trace = Self {
                    out: Mutex::new((file, Vec::with_capacity(CHUNK))),
                    batches: AtomicU64::new(0),
                };
                trace.note(Event::Header, page_bytes, frames as u64);
                Some(trace)
            }
            Err(e) => {
                eprintln!("strata-pager: cannot open the trace {path:?}: {e}; not tracing");
                None
            }
        }
    }

    /// A new eviction batch number.
    pub(super) fn next_batch(&self) -> u64 {
        self.batches.fetch_add(1, Ordering::Relaxed)
    }

    /// Records one event.
    pub(super) fn note(&self, event: Event, page: usize, extra: u64) {
        let head = (u64::from(event as u8) << 56) | (page as u64 & PAGE_MASK);
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        out.1.extend_from_slice(&head.to_le_bytes());
        out.1.extend_from_slice(&extra.to_le_bytes());
        if out.1.len() >= CHUNK {
            Self::write_out(&mut out);
        }
    }

    fn write_out(out: &mut (File, Vec<u8>)) {
        let (file, buf) = out;
        if let Err(e) = file.write_all(buf) {
            eprintln!("strata-pager: writing the trace failed: {e}");
        }
        buf.clear();
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        let out = self.out.get_mut().unwrap_or_else(|e| e.into_inner());
        Self::write_out(out);
    }
}
