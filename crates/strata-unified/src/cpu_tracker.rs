//! Which pages the CPU wrote since the last sync.
//!
//! The CPU writes the host copy through an ordinary pointer, so nothing in this crate sees the
//! writes as they happen. Three ways to find them, chosen per allocation ([`DirtyTracking`]):
//!
//! * **Write protection** (the default where the kernel has it): the host copy is
//!   write-protected through a userfaultfd in asynchronous mode ([`crate::write_watch`]); the
//!   first CPU write to a 4 KiB page costs one minor fault resolved by the kernel, and a sync
//!   asks the kernel which pages were written (`PAGEMAP_SCAN`) and protects them again. A sync
//!   reads no data, so a hand-off that rewrote a few pages costs microseconds, not a pass over
//!   the range. Many faults cost more than one hash pass (about 0.7 us per 4 KiB, 170 ms for
//!   a whole GiB against 16 ms of hashing), so pages written in a sync where at least
//!   1/[`HOT_DIVISOR`] of the synced pages were written stay unprotected and are hashed at the
//!   next sync instead ("hot" pages); a hot page found unchanged is protected again (a sync
//!   that loads pages into the GPU may take hot pages as written and hash them meanwhile:
//!   [`CpuTracker::written_deferring_hot`]). Writes by
//!   DMA into the host copy (a `cudaMemcpy` into the pointer, RDMA) are not seen: declare them
//!   ([`CpuTracker::declare`]) or use hashes. Falls back to hashes when the kernel refuses
//!   (before Linux 6.7, or userfaultfd disabled); [`CpuTracker::mode`] says which runs.
//!   The kernel reports writes in one of two ways ([`WatchMode`]): by default a sync walks
//!   the page table of the synced range (`PAGEMAP_SCAN`, about 0.3 ms per GiB even when
//!   nothing was written); for data the CPU seldom writes (read-mostly) the tracker can be
//!   moved ([`CpuTracker::prefer_watch`]) to notified protection, where a handler thread
//!   records each page's first write and a sync reads the records (microseconds), at the
//!   price of a slower first write per page.
//! * **Hashes**: a 64-bit XXH3 of every page as of the last sync; a sync hashes the pages
//!   again and a changed hash is a CPU write. It catches every write through any path
//!   (DMA too) at the price of reading the synced range once per sync (about 16 ms per GiB
//!   on 16 cores), and needs nothing from the kernel. A hash misses a write only if the new
//!   page hashes equal to the old one (probability 2^-64 per changed page).
//! * **Declared**: only the ranges the caller names (`Unified::cpu_mut`, `mark_cpu_written`)
//!   count; no page is read at a sync. For programs that know what they wrote.

use std::ops::Range;

use crate::write_watch::{WatchMode, WriteWatch};

/// How CPU writes are found at a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyTracking {
    /// The host copy is write-protected between syncs and the kernel reports the written
    /// pages (hot pages hashed); falls back to [`DirtyTracking::Hash`] where unavailable.
    /// Does not see DMA writes into the host copy (declare those).
    #[default]
    WriteProtect,
    /// Every page of the synced range is hashed and compared with its hash at the last sync.
    Hash,
    /// Only ranges declared written (`cpu_mut`, `mark_cpu_written`) count.
    Declared,
}

/// Pages below this many bytes in total are hashed on the calling thread.
const PARALLEL_FROM: usize = 8 << 20;

/// A sync that finds at least 1/HOT_DIVISOR of its pages written leaves them unprotected and
/// hashes them next time (a fault per 4 KiB costs more than hashing it once the CPU rewrites
/// most of the data each phase).
pub const HOT_DIVISOR: usize = 8;

/// Syncs of fewer pages than this never make pages hot (too little to be worth hashing).
const HOT_MIN_PAGES: usize = 64;

/// The per-page record of a tracker.
#[derive(Debug)]
pub struct CpuTracker {
    mode: DirtyTracking,
    page: usize,
    /// Hash of each page at the last sync (Hash mode; hot pages in WriteProtect mode).
    hashes: Vec<u64>,
    /// Pages declared written since the last sync (kept in every mode, so a declared write is
    /// never missed).
    declared: Vec<bool>,
    /// Pages set in `declared`.
    declared_count: usize,
    /// WriteProtect mode: the kernel's view of the host copy.
    watch: Option<WriteWatch>,
    /// A notified watch was refused here (not tried again).
    notified_refused: bool,
    /// WriteProtect mode: pages left unprotected and tracked by hash.
    hot: Vec<bool>,
    /// Pages set in `hot`.
    hot_count: usize,
    /// Bytes hashed by the last call that looked for writes.
    hashed: u64,
}

impl CpuTracker {
    /// A tracker for `bytes` (whole pages of `page` bytes) as they are now. `WriteProtect`
    /// starts with asynchronous protection ([`WatchMode::Scanned`]; see
    /// [`CpuTracker::prefer_watch`] for the other) and falls back to `Hash` when the kernel
    /// cannot protect `bytes` (logged).
    pub fn new(mode: DirtyTracking, page: usize, bytes: &[u8]) -> Self {
        Self::with_watch(mode, page, bytes, &[WatchMode::Scanned])
    }

    /// [`CpuTracker::new`] trying only the watch modes `watch` (in order) for `WriteProtect`.
    pub fn with_watch(mode: DirtyTracking, page: usize, bytes: &[u8], watch: &[WatchMode]) -> Self {
        let pages = bytes.len() / page;
        let mut t = CpuTracker {
            mode,
            page,
            hashes: Vec::new(),
            declared: vec![false; pages],
            declared_count: 0,
            notified_refused: false,
            watch: None,
            hot: Vec::new(),
            hot_count: 0,
            hashed: 0,
        };
        match mode {
            DirtyTracking::Hash => t.hashes = hash_pages(bytes, page, 0..pages),
            DirtyTracking::Declared => {}
            DirtyTracking::WriteProtect => {
                let mut why = std::io::Error::other("no watch mode was asked for");
                for &m in watch {
                    match WriteWatch::new(bytes.as_ptr(), pages * page, page, m) {
                        Ok(w) => {
                            t.watch = Some(w);
                            break;
                        }
                        Err(e) => why = e,
                    }
                }
                if t.watch.is_some() {
                    t.hashes = vec![0; pages];
                    t.hot = vec![false; pages];
                } else {
                    t.fall_back_to_hash(bytes, &why);
                }
            }
        }
        t
    }

    /// How the watch learns of writes (`None` unless in `WriteProtect` mode).
    pub fn watch_mode(&self) -> Option<WatchMode> {
        self.watch.as_ref().map(WriteWatch::mode)
    }

    /// The watch of `WriteProtect` mode.
    pub fn watch(&self) -> Option<&WriteWatch> {
        self.watch.as_ref()
    }

    fn declare_page(&mut self, p: usize) {
        self.declared_count += usize::from(!self.declared[p]);
        self.declared[p] = true;
    }

    /// Moves a `WriteProtect` tracker to watch mode `want` (nothing happens in other modes,
    /// or where the tracker is in that mode already, or where a notified watch was refused
    /// before). [`WatchMode::Notified`] suits data the CPU seldom writes (read-mostly): a sync
    /// that finds nothing written costs microseconds instead of a page-table walk of the
    /// range, but each first write to a page costs a round trip through the handler thread
    /// (measured 12-30 us on a loaded 2-core machine, against 0.7-1.2 us per 4 KiB
    /// asynchronously). If `want` is refused (no privilege for a notified userfaultfd) the
    /// tracker stays in its mode.
    ///
    /// No write is lost across the move, even one made by another thread meanwhile: the old
    /// watch's written pages are carried over (declared), and a write in the moment between
    /// the old watch ending and the new one protecting everything is caught by hashing the
    /// watched (not hot) pages before and after: two passes over the data, once per move.
    pub fn prefer_watch(&mut self, bytes: &[u8], want: WatchMode) {
        let Some(old) = self.watch.as_ref().map(WriteWatch::mode) else {
            return;
        };
        if old == want || (want == WatchMode::Notified && self.notified_refused) {
            return;
        }
        let pages = self.declared.len();
        let cold: Vec<usize> = (0..pages).filter(|&p| !self.hot[p]).collect();
        let hash_cold = |t: &Self| -> Vec<u64> {
            runs(&cold)
                .into_iter()
                .flat_map(|r| hash_pages(bytes, t.page, r))
                .collect()
        };
        // Order matters: hashes first, then the old watch's list (a write between the two is
        // in the list), then the swap, then hashes again (a write during the swap changes a
        // hash).
        let before = hash_cold(self);
        let carried = match self.watch.as_ref().map(|w| w.written_pages(0..pages)) {
            Some(Ok(list)) => list,
            Some(Err(e)) => {
                self.fall_back_to_hash(bytes, &e);
                (0..pages).for_each(|p| self.declare_page(p));
                return;
            }
            None => return,
        };
        self.watch = None;
        let base = bytes.as_ptr();
        let watch = WriteWatch::new(base, pages * self.page, self.page, want).or_else(|e| {
            if want == WatchMode::Notified {
                tracing::debug!("no notified write protection ({e}): keeping {old:?}");
                self.notified_refused = true;
            }
            WriteWatch::new(base, pages * self.page, self.page, old)
        });
        match watch {
            Ok(w) => self.watch = Some(w),
            Err(e) => {
                // Unwatched for a moment and now for good: every page counts as written once.
                self.fall_back_to_hash(bytes, &e);
                (0..pages).for_each(|p| self.declare_page(p));
                return;
            }
        }
        let after = hash_cold(self);
        for (i, &p) in cold.iter().enumerate() {
            if before[i] != after[i] {
                self.declare_page(p);
            }
        }
        // Hot pages are unprotected (so always listed) and tracked by their hashes, which
        // the move leaves valid: only watched pages carry a write over.
        for p in carried {
            if !self.hot[p] {
                self.declare_page(p);
            }
        }
    }

    fn fall_back_to_hash(&mut self, bytes: &[u8], why: &std::io::Error) {
        tracing::warn!(
            "write protection of a unified allocation is unavailable ({why}): CPU writes are found by page hashes instead"
        );
        self.watch = None;
        self.hot = Vec::new();
        self.hot_count = 0;
        self.mode = DirtyTracking::Hash;
        self.hashes = hash_pages(bytes, self.page, 0..self.declared.len());
    }

    /// The mode in force (`WriteProtect` may have fallen back to `Hash`).
    pub fn mode(&self) -> DirtyTracking {
        self.mode
    }

    /// Bytes hashed by the last [`CpuTracker::written`] / [`CpuTracker::written_among`].
    pub fn hashed_bytes(&self) -> u64 {
        self.hashed
    }

    /// Pages tracked by hash now (all in Hash mode, the hot ones with write protection).
    pub fn hot_pages(&self) -> usize {
        match self.mode {
            DirtyTracking::Hash => self.declared.len(),
            DirtyTracking::Declared => 0,
            DirtyTracking::WriteProtect => self.hot_count,
        }
    }

    /// Records that the CPU wrote `pages`.
    pub fn declare(&mut self, pages: Range<usize>) {
        for p in pages {
            self.declare_page(p);
        }
    }

    /// The pages of `pages` the CPU wrote since they were last recorded, ascending, each with
    /// its new hash (0 where no hash is kept). Records nothing: call [`CpuTracker::record`]
    /// once the sync took them.
    pub fn written(&mut self, bytes: &[u8], pages: Range<usize>) -> Vec<(usize, u64)> {
        self.hashed = 0;
        match self.mode {
            DirtyTracking::Declared => pages
                .filter(|&p| self.declared[p])
                .map(|p| (p, 0))
                .collect(),
            DirtyTracking::Hash => {
                self.hashed = (pages.len() * self.page) as u64;
                let now = hash_pages(bytes, self.page, pages.clone());
                pages
                    .zip(now)
                    .filter(|&(p, h)| h != self.hashes[p] || self.declared[p])
                    .collect()
            }
            DirtyTracking::WriteProtect => {
                let found = self.written_deferring_hot(bytes, pages);
                let hashes = hash_listed(bytes, self.page, &found.hot);
                let changed = self.hot_changes(&found.hot, &hashes);
                merge_ascending(found.sure, changed)
            }
        }
    }

    /// [`CpuTracker::written`] without hashing the hot pages: `sure` are the pages known
    /// written without reading them (with their hash where one was taken: in `Hash` mode, and
    /// for every page when the watch just failed), `hot` the hot pages that may have been
    /// written, ascending. The caller hashes `hot` ([`hash_listed`], possibly on another thread
    /// while it does other work) and asks [`CpuTracker::hot_changes`] which of them changed;
    /// until then it may treat them all as written (a false positive only moves a page that
    /// did not change). Outside `WriteProtect` mode `hot` is empty.
    pub fn written_deferring_hot(&mut self, bytes: &[u8], pages: Range<usize>) -> Written {
        if self.mode != DirtyTracking::WriteProtect {
            return Written {
                sure: self.written(bytes, pages),
                hot: Vec::new(),
            };
        }
        self.hashed = 0;
        let seen = match self.watch.as_ref().map(|w| w.written_pages(pages.clone())) {
            Some(Ok(s)) => s,
            Some(Err(e)) => {
                // Nothing was recorded since the last sync's hashes... there are none for
                // cold pages: every page counts as written this once.
                self.fall_back_to_hash(bytes, &e);
                return Written {
                    sure: pages.map(|p| (p, self.hashes[p])).collect(),
                    hot: Vec::new(),
                };
            }
            None => unreachable!("WriteProtect mode always has a watch"),
        };
        // Pages seen by the watch, declared, or hot, ascending; the per-page pass only when
        // some page is declared or hot, so a sync after a CPU phase that wrote nothing costs
        // what the watch costs.
        let mut candidates = seen;
        if self.declared_count > 0 || self.hot_count > 0 {
            candidates.extend(pages.filter(|&p| self.declared[p] || self.hot[p]));
            candidates.sort_unstable();
            candidates.dedup();
        }
        let (hot, sure): (Vec<usize>, Vec<usize>) =
            candidates.into_iter().partition(|&p| self.hot[p]);
        Written {
            sure: sure.into_iter().map(|p| (p, 0)).collect(),
            hot,
        }
    }

    /// Of the hot pages `hot` (ascending, from [`CpuTracker::written_deferring_hot`]) with
    /// their fresh hashes `hashes` (from [`hash_listed`]), those written since the last
    /// record, with their hashes (for [`CpuTracker::record`]). Counts the hashed bytes.
    pub fn hot_changes(&mut self, hot: &[usize], hashes: &[u64]) -> Vec<(usize, u64)> {
        debug_assert_eq!(hot.len(), hashes.len());
        self.hashed += (hot.len() * self.page) as u64;
        hot.iter()
            .zip(hashes)
            .filter(|&(&p, &h)| h != self.hashes[p] || self.declared[p])
            .map(|(&p, &h)| (p, h))
            .collect()
    }

    /// Whether page `p` is hot (unprotected, tracked by its hash).
    pub fn is_hot(&self, p: usize) -> bool {
        self.hot.get(p).copied().unwrap_or(false)
    }

    /// Of `pages` (ascending), those the CPU wrote since they were last recorded.
    pub fn written_among(&mut self, bytes: &[u8], pages: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        let mut hashed = 0;
        if self.mode == DirtyTracking::WriteProtect {
            // One scan over the span (cheap: no data is read), then the list's pages.
            if let (Some(&a), Some(&b)) = (pages.first(), pages.last()) {
                let w = self.written(bytes, a..b + 1);
                hashed = self.hashed;
                out = w
                    .into_iter()
                    .map(|(p, _)| p)
                    .filter(|p| pages.binary_search(p).is_ok())
                    .collect();
            }
        } else {
            // Runs of consecutive pages are hashed together, in parallel when large.
            for run in runs(pages) {
                out.extend(self.written(bytes, run).into_iter().map(|(p, _)| p));
                hashed += self.hashed;
            }
        }
        self.hashed = hashed;
        out
    }

    /// Takes the pages `written` returned for `synced` as the pages' state at this sync. With
    /// write protection, decides per page whether it is watched (protected again) or hot
    /// (hashed at the next sync).
    pub fn record(&mut self, bytes: &[u8], synced: Range<usize>, taken: &[(usize, u64)]) {
        for &(p, _) in taken {
            self.declared_count -= usize::from(self.declared[p]);
            self.declared[p] = false;
        }
        match self.mode {
            DirtyTracking::Declared => {}
            DirtyTracking::Hash => {
                for &(p, h) in taken {
                    self.hashes[p] = h;
                }
            }
            DirtyTracking::WriteProtect => self.record_watched(bytes, synced, taken),
        }
    }

    /// `record` with write protection: a heavy sync's pages become hot (hashed from now on),
    /// a light sync's pages are protected again, and hot pages found unchanged are protected
    /// again (cool).
    fn record_watched(&mut self, bytes: &[u8], synced: Range<usize>, taken: &[(usize, u64)]) {
        let heavy = synced.len() >= HOT_MIN_PAGES && taken.len() * HOT_DIVISOR >= synced.len();
        if heavy {
            // Pages hot already were hashed by `written` for this sync: keep those hashes
            // rather than read the pages a second time (a second pass over a rewritten GiB
            // cost a hand-off about 20 ms on 16 cores). Hashing them again would also hide a
            // write that raced with the sync; with the earlier hash, the next sync sees it.
            for &(p, h) in taken {
                if self.hot[p] {
                    self.hashes[p] = h;
                }
            }
        }
        let taken: Vec<usize> = taken.iter().map(|&(p, _)| p).collect();
        let mut cool = Vec::new();
        if self.hot_count > 0 {
            cool.extend(
                synced
                    .clone()
                    .filter(|&p| self.hot[p] && taken.binary_search(&p).is_err()),
            );
        }
        let (heat, protect) = if heavy {
            // Only pages that were watched until now need a hash.
            let newly: Vec<usize> = taken.into_iter().filter(|&p| !self.hot[p]).collect();
            (newly, Vec::new())
        } else {
            (Vec::new(), taken)
        };
        for run in runs(&heat) {
            let h = hash_pages(bytes, self.page, run.clone());
            self.hashes[run.clone()].copy_from_slice(&h);
            self.hot_count += run.len();
            self.hot[run].fill(true);
        }
        for run in runs(&protect) {
            self.hot_count -= self.hot[run.clone()].iter().filter(|&&x| x).count();
            self.hot[run.clone()].fill(false);
            let result = self.watch.as_ref().map(|w| w.protect(run));
            if let Some(Err(e)) = result {
                self.fall_back_to_hash(bytes, &e);
                return;
            }
        }
        for run in runs(&cool) {
            self.hot_count -= run.len();
            self.hot[run.clone()].fill(false);
            let result = self.watch.as_ref().map(|w| w.protect(run.clone()));
            if let Some(Err(e)) = result {
                self.fall_back_to_hash(bytes, &e);
                return;
            }
            // A write that landed between this sync's hash and the protection above is in
            // no record: hash again now that later writes are watched, and count a change as
            // written at the next sync.
            for (p, h) in run.clone().zip(hash_pages(bytes, self.page, run)) {
                if h != self.hashes[p] {
                    self.declare_page(p);
                }
            }
        }
    }

    /// The host copy of `pages` changed by a GPU write-down (not a CPU write): take their
    /// hashes again. (Write protection does not see DMA, so only hot pages need it.)
    pub fn rehash(&mut self, bytes: &[u8], pages: &[usize]) {
        let pages: Vec<usize> = match self.mode {
            DirtyTracking::Declared => return,
            DirtyTracking::Hash => pages.to_vec(),
            DirtyTracking::WriteProtect => pages.iter().copied().filter(|&p| self.hot[p]).collect(),
        };
        // Runs of consecutive pages are hashed together (in parallel when large).
        for run in runs(&pages) {
            let fresh = hash_pages(bytes, self.page, run.clone());
            self.hashes[run].copy_from_slice(&fresh);
        }
    }

    /// The whole host copy may have changed under GPU write-downs: take the hashes again,
    /// except of pages declared written (still the CPU's).
    pub fn rehash_all(&mut self, bytes: &[u8]) {
        match self.mode {
            DirtyTracking::Declared => {}
            DirtyTracking::Hash => {
                let fresh = hash_pages(bytes, self.page, 0..self.hashes.len());
                for (p, h) in fresh.into_iter().enumerate() {
                    if !self.declared[p] {
                        self.hashes[p] = h;
                    }
                }
            }
            DirtyTracking::WriteProtect if self.hot_count == 0 => {}
            DirtyTracking::WriteProtect => {
                let hot: Vec<usize> = (0..self.hot.len())
                    .filter(|&p| self.hot[p] && !self.declared[p])
                    .collect();
                self.rehash(bytes, &hot);
            }
        }
    }
}

/// Runs of consecutive values in an ascending list.
fn runs(pages: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some(r) if r.end == p => r.end += 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}

/// What [`CpuTracker::written_deferring_hot`] found: pages known written, and hot pages whose
/// hashes decide.
#[derive(Debug, Default)]
pub struct Written {
    /// Pages written for sure (ascending), each with its hash where one was taken (else 0).
    pub sure: Vec<(usize, u64)>,
    /// Hot pages that may have been written (ascending); hash them to know.
    pub hot: Vec<usize>,
}

/// Two ascending lists of pages (no page in both) as one ascending list.
pub fn merge_ascending(a: Vec<(usize, u64)>, b: Vec<(usize, u64)>) -> Vec<(usize, u64)> {
    if b.is_empty() {
        return a;
    }
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    while let (Some(x), Some(y)) = (a.peek(), b.peek()) {
        if x.0 <= y.0 {
            out.extend(a.next());
        } else {
            out.extend(b.next());
        }
    }
    out.extend(a);
    out.extend(b);
    out
}

/// XXH3 of each listed page (ascending), runs of consecutive pages hashed together (in
/// parallel when large). Reads `bytes` only, so it may run beside other work on the data.
pub fn hash_listed(bytes: &[u8], page: usize, pages: &[usize]) -> Vec<u64> {
    let mut out = Vec::with_capacity(pages.len());
    for run in runs(pages) {
        out.extend(hash_pages(bytes, page, run));
    }
    out
}

/// XXH3 of each page in `pages`, spread over the machine's cores for large ranges.
pub fn hash_pages(bytes: &[u8], page: usize, pages: Range<usize>) -> Vec<u64> {
    let span = &bytes[pages.start * page..pages.end * page];
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    if span.len() < PARALLEL_FROM || threads == 1 {
        return span
            .chunks_exact(page)
            .map(xxhash_rust::xxh3::xxh3_64)
            .collect();
    }
    let per = pages.len().div_ceil(threads);
    let mut out = vec![0u64; pages.len()];
    std::thread::scope(|s| {
        for (chunk, hashes) in span.chunks(per * page).zip(out.chunks_mut(per)) {
            s.spawn(move || {
                for (h, p) in hashes.iter_mut().zip(chunk.chunks_exact(page)) {
                    *h = xxhash_rust::xxh3::xxh3_64(p);
                }
            });
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn seeded() -> rand::rngs::StdRng {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        rand::rngs::StdRng::seed_from_u64(seed)
    }

    #[test]
    fn hashes_find_exactly_the_written_pages() {
        let mut rng = seeded();
        let page = 4096;
        let pages = 3000; // over PARALLEL_FROM: the threaded path
        let mut bytes: Vec<u8> = (0..page * pages).map(|_| rng.random()).collect();
        let mut t = CpuTracker::new(DirtyTracking::Hash, page, &bytes);
        assert!(t.written(&bytes, 0..pages).is_empty());
        let mut want: Vec<usize> = (0..40).map(|_| rng.random_range(0..pages)).collect();
        want.sort_unstable();
        want.dedup();
        for &p in &want {
            // One byte is enough, and a write of the same value is no change.
            let at = p * page + rng.random_range(0..page);
            bytes[at] = bytes[at].wrapping_add(1);
        }
        let same = (want[0] + 1) % pages;
        if !want.contains(&same) {
            let at = same * page;
            let v = bytes[at];
            bytes[at] = v.wrapping_add(1);
            bytes[at] = v;
        }
        let found = t.written(&bytes, 0..pages);
        assert_eq!(found.iter().map(|&(p, _)| p).collect::<Vec<_>>(), want);
        // A sub-range sees only its own pages.
        let half = t.written(&bytes, 0..pages / 2);
        assert!(half.iter().all(|&(p, _)| p < pages / 2));
        let among: Vec<usize> = (0..pages)
            .step_by(3)
            .chain(want.iter().copied())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let got = t.written_among(&bytes, &among);
        assert_eq!(got, want, "written_among finds the written pages of a list");
        t.record(&bytes, 0..pages, &found);
        assert!(t.written(&bytes, 0..pages).is_empty());
    }

    #[test]
    fn rehash_absorbs_gpu_write_downs_and_keeps_declared_writes() {
        let mut rng = seeded();
        let page = 4096;
        let mut bytes: Vec<u8> = (0..page * 8).map(|_| rng.random()).collect();
        let mut t = CpuTracker::new(DirtyTracking::Hash, page, &bytes);
        bytes[3 * page] ^= 0xff; // a GPU write-down
        t.rehash(&bytes, &[3]);
        assert!(t.written(&bytes, 0..8).is_empty());
        t.declare(5..6);
        bytes[6 * page] ^= 1; // GPU again, absorbed by rehash_all
        t.rehash_all(&bytes);
        assert_eq!(t.written(&bytes, 0..8), vec![(5, t.hashes[5])]);
    }

    #[test]
    fn declared_mode_reads_no_page() {
        let page = 4096;
        let mut bytes = vec![0u8; page * 4];
        let mut t = CpuTracker::new(DirtyTracking::Declared, page, &bytes);
        bytes[0] = 1; // not declared: not seen, by contract
        assert!(t.written(&bytes, 0..4).is_empty());
        t.declare(1..3);
        let w = t.written(&bytes, 0..4);
        assert_eq!(w, vec![(1, 0), (2, 0)]);
        t.record(&bytes, 0..4, &w);
        assert!(t.written(&bytes, 0..4).is_empty());
    }
}

#[cfg(test)]
mod write_protect_tests {
    use super::*;
    use crate::write_watch::test_memory::Shared;
    use rand::{Rng, SeedableRng};

    /// Random CPU writes over rounds of syncs: the tracker reports exactly the written pages,
    /// whether a page is watched or hot, and heavy rounds make pages hot, light ones cold.
    #[test]
    fn write_protection_finds_exactly_the_written_pages_through_hot_and_cold() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let page = 8192;
        let pages = 1024;
        let Some((mem, mut t)) = watched(page, pages) else {
            return;
        };
        assert!(t.written(mem.bytes(), 0..pages).is_empty());
        assert_eq!(
            t.hashed_bytes(),
            0,
            "nothing hashed while everything is watched"
        );
        for round in 0..12 {
            // Alternate heavy rounds (half the pages) and light ones (a few pages).
            let count = if round % 3 == 0 {
                pages / 2
            } else {
                rng.random_range(1..20)
            };
            let mut want = change_random_bytes(&mem, &mut rng, page, count);
            // Declared writes count whether or not the page changed.
            if round == 5 {
                t.declare(7..8);
                want[7] = true;
            }
            let found = t.written(mem.bytes(), 0..pages);
            let got: Vec<usize> = found.iter().map(|&(p, _)| p).collect();
            let expect: Vec<usize> = (0..pages).filter(|&p| want[p]).collect();
            assert_eq!(got, expect, "round {round} ({count} writes)");
            t.record(mem.bytes(), 0..pages, &found);
            let hot = t.hot_pages();
            if count * HOT_DIVISOR >= pages {
                assert_eq!(hot, expect.len(), "a heavy round makes its pages hot");
            } else {
                assert_eq!(hot, 0, "a light round protects every page again");
            }
            assert!(t.written(mem.bytes(), 0..pages).is_empty(), "round {round}");
        }
        // GPU write-downs (DMA; here a plain write stands in, absorbed by rehash) are not
        // CPU writes.
        let heavy: Vec<(usize, u64)> = (0..pages / 2).map(|p| (p, 0)).collect();
        for &(p, _) in &heavy {
            mem.bytes()[p * page] ^= 1;
        }
        let found = t.written(mem.bytes(), 0..pages);
        assert_eq!(found.len(), pages / 2);
        t.record(mem.bytes(), 0..pages, &found);
        mem.bytes()[3 * page] ^= 0x10;
        t.rehash(mem.bytes(), &[3]);
        assert!(t.written(mem.bytes(), 0..pages).is_empty());
    }

    /// The deferred path (hot pages listed unhashed, hashed by the caller, then settled)
    /// finds exactly what `written` finds, round after round through hot and cold pages;
    /// `sure` never holds a hot page and `hot` lists every hot page of the range.
    #[test]
    fn deferring_hot_pages_finds_exactly_the_written_pages() {
        let mut rng = seeded_rng();
        let (page, pages) = (4096, 768);
        let Some((mem, mut t)) = watched(page, pages) else {
            return;
        };
        for round in 0..10 {
            let count = if round % 4 == 3 {
                rng.random_range(1..8)
            } else {
                rng.random_range(pages / 4..pages)
            };
            let want = change_random_bytes(&mem, &mut rng, page, count);
            let hot_before: Vec<usize> = (0..pages).filter(|&p| t.is_hot(p)).collect();
            let f = t.written_deferring_hot(mem.bytes(), 0..pages);
            assert_eq!(f.hot, hot_before, "round {round}: every hot page is listed");
            assert!(f.sure.iter().all(|&(p, _)| !t.is_hot(p)));
            let hashes = hash_listed(mem.bytes(), page, &f.hot);
            let changed = t.hot_changes(&f.hot, &hashes);
            assert_eq!(t.hashed_bytes(), (f.hot.len() * page) as u64);
            let found = merge_ascending(f.sure, changed);
            let got: Vec<usize> = found.iter().map(|&(p, _)| p).collect();
            let expect: Vec<usize> = (0..pages).filter(|&p| want[p]).collect();
            assert_eq!(got, expect, "round {round} ({count} writes)");
            t.record(mem.bytes(), 0..pages, &found);
            assert!(t.written(mem.bytes(), 0..pages).is_empty(), "round {round}");
        }
    }

    #[test]
    fn merged_lists_stay_ascending() {
        let mut rng = seeded_rng();
        for _ in 0..50 {
            let all: Vec<usize> = (0..rng.random_range(0..40)).map(|i| i * 3).collect();
            let (a, b): (Vec<usize>, Vec<usize>) = all.iter().partition(|_| rng.random());
            let tag = |v: Vec<usize>| v.into_iter().map(|p| (p, p as u64 + 1)).collect();
            let m = merge_ascending(tag(a), tag(b));
            assert_eq!(m, tag(all));
        }
    }

    /// Heavy syncs one after another: pages already hot keep the hashes `written` took (no
    /// second pass), pages newly hot are hashed at the record; either way the next sync
    /// finds exactly the pages written since, down to one byte of one hot page.
    #[test]
    fn consecutive_heavy_syncs_keep_hot_pages_exact() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (page, pages) = (4096, 512);
        let Some((mem, mut t)) = watched(page, pages) else {
            return;
        };
        let mut hot_before = 0;
        for round in 0..6 {
            // Most pages each round (rewritten hot pages and some cold ones), at random bytes.
            let mut want = vec![false; pages];
            for (p, wanted) in want.iter_mut().enumerate() {
                if rng.random_range(0..4) != 0 {
                    let at = p * page + rng.random_range(0..page);
                    let b = &mut mem.bytes()[at];
                    *b = b.wrapping_add(rng.random_range(1..=255));
                    *wanted = true;
                }
            }
            let found = t.written(mem.bytes(), 0..pages);
            let got: Vec<usize> = found.iter().map(|&(p, _)| p).collect();
            let expect: Vec<usize> = (0..pages).filter(|&p| want[p]).collect();
            assert_eq!(got, expect, "round {round}");
            if round > 0 {
                assert!(
                    hot_before > 0,
                    "round {round}: earlier heavy rounds made pages hot"
                );
                assert!(
                    t.hashed_bytes() >= (hot_before * page / 2) as u64,
                    "round {round}: hot pages are hashed at the sync"
                );
            }
            t.record(mem.bytes(), 0..pages, &found);
            hot_before = t.hot_pages();
            assert_eq!(
                hot_before,
                expect.len(),
                "round {round}: a heavy round's pages are hot"
            );
            assert!(
                t.written(mem.bytes(), 0..pages).is_empty(),
                "round {round}: hashes current"
            );
        }
        // One byte of one hot page.
        let p = (0..pages).find(|&p| t.hot[p]).expect("a hot page");
        mem.bytes()[p * page + page / 2] ^= 0x5A;
        let found = t.written(mem.bytes(), 0..pages);
        assert_eq!(found.iter().map(|&(q, _)| q).collect::<Vec<_>>(), vec![p]);
    }

    /// Writer threads race with a thread that syncs (written + record) and now and then
    /// moves the tracker between watch modes: no write is lost, through watched, hot (heavy
    /// syncs of a small range) and cooling pages and across the moves.
    #[test]
    fn no_write_is_lost_racing_with_syncs_and_watch_moves() {
        use crate::write_watch::WatchMode;
        use crate::write_watch::test_memory::{no_concurrent_write_is_lost, with_deadline};
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let page = 4096;
        let pages = 1024;
        let Some((mem, mut t)) = watched(page, pages) else {
            return;
        };
        let (mut max_hot, mut modes) = (0, std::collections::BTreeSet::new());
        let mut light = 0;
        let (writes, syncs) = with_deadline(
            std::time::Duration::from_secs(60),
            "no_write_is_lost_racing_with_syncs_and_watch_moves",
            || {
                no_concurrent_write_is_lost(
                    &mem,
                    page,
                    2,
                    std::time::Duration::from_millis(900),
                    seed,
                    |k| {
                        let mut found = t.written(mem.bytes(), 0..pages);
                        t.record(mem.bytes(), 0..pages, &found);
                        max_hot = max_hot.max(t.hot_pages());
                        if k % 2 == 1 {
                            // A second sync at once: few writes, so hot pages cool down (are
                            // protected again) while the writers go on.
                            let again = t.written(mem.bytes(), 0..pages);
                            t.record(mem.bytes(), 0..pages, &again);
                            light += usize::from(again.len() * HOT_DIVISOR < pages);
                            found.extend(again);
                            found.sort_unstable();
                            found.dedup_by_key(|x| x.0);
                        }
                        modes.insert(format!("{:?}", t.watch_mode()));
                        if k % 7 == 6 {
                            let to = if k % 14 == 6 {
                                WatchMode::Notified
                            } else {
                                WatchMode::Scanned
                            };
                            t.prefer_watch(mem.bytes(), to);
                        }
                        found.into_iter().map(|(p, _)| p).collect()
                    },
                )
            },
        );
        println!(
            "{writes} writes over {syncs} syncs, none lost; up to {max_hot} pages hot, {light} light syncs; modes {modes:?}"
        );
        assert!(
            writes > 100 && syncs >= 20,
            "{writes} writes, {syncs} syncs"
        );
        assert_eq!(
            t.mode(),
            DirtyTracking::WriteProtect,
            "no fallback to hashes"
        );
        // A fault message handled after the last sync (two writers faulted on one page, the
        // second message read late) may list its page once more: one sync drains that.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let late = t.written(mem.bytes(), 0..pages);
        t.record(mem.bytes(), 0..pages, &late);
        let left = t.written(mem.bytes(), 0..pages);
        assert!(
            left.is_empty(),
            "all taken, but {left:?} left in {:?}",
            t.watch_mode()
        );
    }

    /// A move between watch modes carries the written pages over and refuses nothing; a
    /// tracker in Hash or Declared mode ignores it; reads are never writes.
    #[test]
    fn a_watch_move_carries_written_pages() {
        use crate::write_watch::WatchMode;
        let mut rng = seeded_rng();
        let page = 8192;
        let pages = 128;
        let Some((mem, mut t)) = watched(page, pages) else {
            return;
        };
        assert_eq!(t.watch_mode(), Some(WatchMode::Scanned));
        for to in [
            WatchMode::Notified,
            WatchMode::Notified,
            WatchMode::Scanned,
            WatchMode::Notified,
        ] {
            let mut want: Vec<usize> = (0..rng.random_range(1..10))
                .map(|_| rng.random_range(0..pages))
                .collect();
            want.sort_unstable();
            want.dedup();
            for &p in &want {
                mem.bytes()[p * page + rng.random_range(0..page)] ^= 0x81;
            }
            let sum: u64 = mem.bytes().iter().map(|&b| u64::from(b)).sum();
            assert!(sum > 0);
            t.prefer_watch(mem.bytes(), to);
            let mode = t.watch_mode().unwrap();
            assert!(mode == to || to == WatchMode::Notified, "{mode:?}");
            let found = t.written(mem.bytes(), 0..pages);
            let got: Vec<usize> = found.iter().map(|&(p, _)| p).collect();
            assert_eq!(got, want, "after a move to {to:?} (now {mode:?})");
            t.record(mem.bytes(), 0..pages, &found);
            assert!(t.written(mem.bytes(), 0..pages).is_empty());
            // Protection is back after the sync: the next write is seen.
            mem.bytes()[want[0] * page] ^= 1;
            assert_eq!(t.written(mem.bytes(), 0..pages), vec![(want[0], 0)]);
            let found = t.written(mem.bytes(), 0..pages);
            t.record(mem.bytes(), 0..pages, &found);
        }
        let mut h = CpuTracker::new(DirtyTracking::Hash, page, mem.bytes());
        h.prefer_watch(mem.bytes(), WatchMode::Notified);
        assert_eq!((h.mode(), h.watch_mode()), (DirtyTracking::Hash, None));
    }

    /// Test memory of `pages` pages of `page` bytes and a write-protect tracker over it;
    /// `None` (skipped) where the kernel cannot protect it.
    /// Changes one random byte in each of `count` random pages (repeats allowed); which pages
    /// changed.
    fn change_random_bytes(
        mem: &Shared,
        rng: &mut rand::rngs::StdRng,
        page: usize,
        count: usize,
    ) -> Vec<bool> {
        let pages = mem.bytes().len() / page;
        let mut want = vec![false; pages];
        for _ in 0..count {
            let p = rng.random_range(0..pages);
            let at = p * page + rng.random_range(0..page);
            let b = &mut mem.bytes()[at];
            *b = b.wrapping_add(rng.random_range(1..=255));
            want[p] = true;
        }
        want
    }

    fn watched(page: usize, pages: usize) -> Option<(Shared, CpuTracker)> {
        let mem = Shared::new(page * pages);
        let t = CpuTracker::new(DirtyTracking::WriteProtect, page, mem.bytes());
        if t.mode() != DirtyTracking::WriteProtect {
            println!("skipped: no asynchronous write protection here (fell back to hashes)");
            return None;
        }
        Some((mem, t))
    }

    fn seeded_rng() -> rand::rngs::StdRng {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        rand::rngs::StdRng::seed_from_u64(seed)
    }
}
