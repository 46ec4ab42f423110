//! Skipping the write-back of pages that were written but hold the store's bytes again.
//!
//! Programs often write a page and put its bytes back: GNU `sort` writes each line's newline
//! over its terminating zero to print it, then restores the zero, so every page of lines it
//! prints is dirty and unchanged. Evicting such a page used to cost a store write of the whole
//! page (sort of 32 MiB at a 24.8 MiB budget: every one of its 53 k evictions). Each page read
//! from the store now keeps a 128-bit digest of the bytes read, and a dirty victim whose bytes
//! still have that digest is dropped without a write.
//!
//! The digest is XXH3-128 keyed with a secret drawn from the operating system for each region,
//! so bytes that do not know the secret meet a false match with a chance of about 2^-128.
//! XXH3 is not a cryptographic MAC: a program that holds data crafted by someone who can also
//! observe its digests should turn this off (`PagerConfig::skip_unchanged`,
//! `STRATA_SKIP_UNCHANGED=false`). Cost: one digest per page read from the store and per
//! dirty page evicted, and 16 bytes per page of the region (touched only where pages are).
//!
//! The invariant that makes a skip safe: a page's digest, when set, is the digest of the
//! store's copy of that page. It is set only by a fill from the store (the filler owns the
//! page) or by a flush that has just written it, cleared by a fill of zeros and by every
//! write-back (after which the store holds other bytes), and read only by the evictor or flush
//! that owns the page, with the page write-protected so its bytes cannot change while they are
//! hashed.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};

use super::shared::{Shared, bump};

/// XXH3's secret: at least 136 bytes; 192 is its default size.
const SECRET_BYTES: usize = 192;

/// Per page, the digest of the store's copy (two words; both zero: not known).
#[derive(Debug)]
pub(super) struct Digests {
    words: Box<[AtomicU64]>,
    secret: Vec<u8>,
}

impl Digests {
    /// Digests for `pages` pages, or none (`enabled` false, or no random secret to be had:
    /// then every dirty page is written back, as before).
    pub(super) fn new(pages: usize, enabled: bool) -> Self {
        let secret = if enabled { random_secret() } else { None };
        match secret {
            Some(secret) => Self {
                words: crate::pages::zeroed_words(pages * 2),
                secret,
            },
            None => Self {
                words: crate::pages::zeroed_words(0),
                secret: Vec::new(),
            },
        }
    }

    /// Whether digests are kept at all.
    pub(super) fn enabled(&self) -> bool {
        !self.secret.is_empty()
    }

    fn digest(&self, bytes: &[u8]) -> (u64, u64) {
        let d = xxhash_rust::xxh3::xxh3_128_with_secret(bytes, &self.secret);
        // A digest of zero would read as "not known"; nudging it costs a 2^-128 collision.
        #[allow(clippy::cast_possible_truncation)] // the two halves, on purpose
        let (lo, hi) = (d as u64, (d >> 64) as u64);
        if lo == 0 && hi == 0 { (1, 0) } else { (lo, hi) }
    }

    /// Records `bytes` as the store's copy of `page` (just read from the store).
    pub(super) fn set(&self, page: usize, bytes: &[u8]) {
        if !self.enabled() {
            return;
        }
        let (lo, hi) = self.digest(bytes);
        self.words[2 * page].store(lo, Ordering::Relaxed);
        self.words[2 * page + 1].store(hi, Ordering::Relaxed);
    }

    /// The store's copy of `page` is no longer known (filled with zeros, or written back).
    pub(super) fn forget(&self, page: usize) {
        if !self.enabled() {
            return;
        }
        self.words[2 * page].store(0, Ordering::Relaxed);
        self.words[2 * page + 1].store(0, Ordering::Relaxed);
    }

    /// Whether the store's copy of `page` is known.
    fn known(&self, page: usize) -> bool {
        self.enabled()
            && (self.words[2 * page].load(Ordering::Relaxed) != 0
                || self.words[2 * page + 1].load(Ordering::Relaxed) != 0)
    }

    /// Whether `bytes` (the page, write-protected) match the store's copy of `page`.
    pub(super) fn matches(&self, page: usize, bytes: &[u8]) -> bool {
        if !self.enabled() {
            return false;
        }
        let lo = self.words[2 * page].load(Ordering::Relaxed);
        let hi = self.words[2 * page + 1].load(Ordering::Relaxed);
        (lo, hi) != (0, 0) && self.digest(bytes) == (lo, hi)
    }
}

impl Shared {
    /// Of `dirty` (sorted, each owned by the caller in `Evicting` or `Flushing`), the pages
    /// whose bytes are the store's copy again, so they need no write-back. Pages with a known copy are
    /// write-protected first (a run with one call), so their bytes cannot change while hashed:
    /// a program thread that writes meanwhile waits for the eviction and faults the page back.
    pub(super) fn unchanged_of(&self, dirty: &[usize]) -> Vec<usize> {
        let known: Vec<usize> = dirty
            .iter()
            .copied()
            .filter(|&p| self.digests.known(p))
            .collect();
        let mut unchanged = Vec::new();
        let mut i = 0;
        while i < known.len() {
            let first = known[i];
            let n = known[i..]
                .iter()
                .enumerate()
                .take_while(|&(k, &p)| p == first + k)
                .count();
            i += n;
            let protected =
                self.uffd
                    .write_protect(self.page_addr(first), n * self.page_bytes, true);
            if protected.is_err() {
                // Written back as usual (write_back_many protects and reports).
                continue;
            }
            for page in first..first + n {
                // SAFETY: the page is resident (this evictor owns it in `Evicting`, so nobody
                // drops it) and write-protected above, so no thread changes these bytes while
                // they are hashed; the length stays inside the region.
                let bytes = unsafe {
                    std::slice::from_raw_parts(self.page_addr(page) as *const u8, self.io_len(page))
                };
                if self.digests.matches(page, bytes) {
                    unchanged.push(page);
                }
            }
        }
        bump(&self.counters.unchanged_write_backs, unchanged.len() as u64);
        unchanged
    }

    /// Records the bytes of `pages` as the store's copy, just written back by a flush (each
    /// owned by the caller in `Flushing` and write-protected since before the write), so that
    /// a later write that puts those bytes back, or a page made writable without being
    /// written, costs no second write. An eviction has no use for this: its pages are dropped.
    pub(super) fn remember_written(&self, pages: &[usize]) {
        if !self.digests.enabled() {
            return;
        }
        for &page in pages {
            // SAFETY: the page is resident (the caller owns it in `Flushing`, so nobody drops
            // it) and write-protected by its write-back, so its bytes are the ones the store
            // now holds while they are hashed; the length stays inside the region.
            let bytes = unsafe {
                std::slice::from_raw_parts(self.page_addr(page) as *const u8, self.io_len(page))
            };
            self.digests.set(page, bytes);
        }
    }
}

/// A secret from the operating system's random source, or none if it cannot be read.
fn random_secret() -> Option<Vec<u8>> {
    let mut secret = vec![0u8; SECRET_BYTES];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .ok()?;
    Some(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_matches_only_the_bytes_it_was_read_with_until_forgotten() {
        let d = Digests::new(4, true);
        assert!(d.enabled(), "/dev/urandom gives a secret");
        let mut page = vec![0u8; 4096];
        for (i, b) in page.iter_mut().enumerate() {
            *b = u8::try_from((i * 7 + 3) % 256).expect("below 256");
        }
        assert!(!d.matches(1, &page), "nothing known yet");
        d.set(1, &page);
        assert!(d.matches(1, &page));
        assert!(!d.matches(2, &page), "another page's digest is not known");
        // One bit changed anywhere, or a byte moved, is a change.
        for i in [0, 1, 2047, 4095] {
            page[i] ^= 1;
            assert!(!d.matches(1, &page), "bit flipped at {i}");
            page[i] ^= 1;
        }
        page.swap(10, 11);
        assert!(!d.matches(1, &page), "bytes swapped");
        page.swap(10, 11);
        assert!(d.matches(1, &page), "restored bytes match again");
        d.forget(1);
        assert!(!d.matches(1, &page), "forgotten");
        // Zeros have a digest too (a page of zeros read from the store).
        let zeros = vec![0u8; 4096];
        d.set(3, &zeros);
        assert!(d.matches(3, &zeros));
    }

    #[test]
    fn disabled_digests_never_match() {
        let d = Digests::new(2, false);
        let page = vec![5u8; 4096];
        d.set(0, &page);
        assert!(!d.enabled());
        assert!(!d.matches(0, &page));
    }

    #[test]
    fn two_regions_have_different_secrets() {
        let (a, b) = (Digests::new(1, true), Digests::new(1, true));
        let page = vec![9u8; 4096];
        assert_ne!(a.digest(&page), b.digest(&page));
    }
}
