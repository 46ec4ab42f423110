//! Which pages the CPU wrote since the last sync.
//!
//! The CPU writes the host copy through an ordinary pointer, so nothing sees the writes as they
//! happen. Two ways to find them, chosen per allocation ([`DirtyTracking`]):
//!
//! * **Hashes** (the default): a 64-bit XXH3 of every page as of the last sync; a sync hashes
//!   the pages again and a changed hash is a CPU write. It catches every write through any
//!   pointer (C code, linked structures, memcpy) at the price of reading the synced range once
//!   per sync (tens of GB/s over all cores), and needs nothing from the kernel or the driver.
//!   Write protection (mprotect or userfaultfd write-protect) was the alternative: the pinned
//!   host copy is the CUDA driver's mapping (`cuMemHostAlloc`), which userfaultfd cannot
//!   register and whose protection the driver owns, and a SIGSEGV handler in a library
//!   fights the program's own. A hash misses a write only if the new page hashes equal to
//!   the old one (probability 2^-64 per changed page).
//! * **Declared**: only the ranges the caller names (`Unified::cpu_mut`, `mark_cpu_written`)
//!   count; no page is read at a sync. For programs that know what they wrote.

use std::ops::Range;

/// How CPU writes are found at a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyTracking {
    /// Every page of the synced range is hashed and compared with its hash at the last sync.
    #[default]
    Hash,
    /// Only ranges declared written (`cpu_mut`, `mark_cpu_written`) count.
    Declared,
}

/// Pages below this many bytes in total are hashed on the calling thread.
const PARALLEL_FROM: usize = 8 << 20;

/// The per-page record of a tracker.
#[derive(Debug)]
pub struct CpuTracker {
    mode: DirtyTracking,
    page: usize,
    /// Hash of each page at the last sync (Hash mode).
    hashes: Vec<u64>,
    /// Pages declared written since the last sync (Declared mode; kept in Hash mode too, so a
    /// declared write is never missed).
    declared: Vec<bool>,
}

impl CpuTracker {
    /// A tracker for `bytes` (whole pages of `page` bytes) as they are now.
    pub fn new(mode: DirtyTracking, page: usize, bytes: &[u8]) -> Self {
        let pages = bytes.len() / page;
        let hashes = match mode {
            DirtyTracking::Hash => hash_pages(bytes, page, 0..pages),
            DirtyTracking::Declared => Vec::new(),
        };
        CpuTracker {
            mode,
            page,
            hashes,
            declared: vec![false; pages],
        }
    }

    /// The mode.
    pub fn mode(&self) -> DirtyTracking {
        self.mode
    }

    /// Records that the CPU wrote `pages`.
    pub fn declare(&mut self, pages: Range<usize>) {
        for d in &mut self.declared[pages] {
            *d = true;
        }
    }

    /// The pages of `pages` the CPU wrote since they were last recorded, ascending, each with
    /// its new hash (0 in Declared mode). Records nothing: call [`CpuTracker::record`] once
    /// the sync took them.
    pub fn written(&self, bytes: &[u8], pages: Range<usize>) -> Vec<(usize, u64)> {
        let declared = |p: usize| self.declared[p];
        match self.mode {
            DirtyTracking::Declared => pages.filter(|&p| declared(p)).map(|p| (p, 0)).collect(),
            DirtyTracking::Hash => {
                let now = hash_pages(bytes, self.page, pages.clone());
                pages
                    .zip(now)
                    .filter(|&(p, h)| h != self.hashes[p] || declared(p))
                    .collect()
            }
        }
    }

    /// Of `pages` (ascending), those the CPU wrote since they were last recorded: runs of
    /// consecutive pages are hashed together, in parallel when large.
    pub fn written_among(&self, bytes: &[u8], pages: &[usize]) -> Vec<usize> {
        let mut out = Vec::new();
        for run in runs(pages) {
            out.extend(self.written(bytes, run).into_iter().map(|(p, _)| p));
        }
        out
    }

    /// Takes the hashes `written` returned as the pages' state at this sync.
    pub fn record(&mut self, taken: &[(usize, u64)]) {
        for &(p, h) in taken {
            if self.mode == DirtyTracking::Hash {
                self.hashes[p] = h;
            }
            self.declared[p] = false;
        }
    }

    /// The host copy of `pages` changed by a GPU write-down (not a CPU write): hash them again.
    pub fn rehash(&mut self, bytes: &[u8], pages: &[usize]) {
        if self.mode != DirtyTracking::Hash || pages.is_empty() {
            return;
        }
        // Runs of consecutive pages are hashed together (in parallel when large).
        for run in runs(pages) {
            let fresh = hash_pages(bytes, self.page, run.clone());
            self.hashes[run].copy_from_slice(&fresh);
        }
    }

    /// The whole host copy may have changed under GPU write-downs: hash all of it again,
    /// except pages declared written (still the CPU's).
    pub fn rehash_all(&mut self, bytes: &[u8]) {
        if self.mode != DirtyTracking::Hash {
            return;
        }
        let fresh = hash_pages(bytes, self.page, 0..self.hashes.len());
        for (p, h) in fresh.into_iter().enumerate() {
            if !self.declared[p] {
                self.hashes[p] = h;
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
        t.record(&found);
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
        t.record(&w);
        assert!(t.written(&bytes, 0..4).is_empty());
    }
}
