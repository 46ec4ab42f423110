//! The large-block allocator inside the one pager region (the *arena*). Pure bookkeeping in
//! units of pager pages: no memory is touched here, so it is unit-tested directly.
//!
//! Blocks start and end on pager-page boundaries, so freeing one block can drop its pages
//! without touching a neighbour. Space above `top` was never handed out: the store still
//! holds zeros there, so `calloc` and anonymous `mmap` prefer it and need no zeroing.

use std::collections::{BTreeMap, BTreeSet};

/// A run of pages handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First page.
    pub start: u64,
    /// Pages.
    pub pages: u64,
    /// Every page of it was never used before (the store holds zeros there).
    pub fresh: bool,
}

/// Free-space bookkeeping for the arena.
#[derive(Debug)]
pub struct Arena {
    total: u64,
    top: u64,
    free_by_start: BTreeMap<u64, u64>,
    free_by_size: BTreeSet<(u64, u64)>,
    in_use: u64,
}

impl Arena {
    /// An empty arena of `total` pages.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            top: 0,
            free_by_start: BTreeMap::new(),
            free_by_size: BTreeSet::new(),
            in_use: 0,
        }
    }

    /// Pages handed out now.
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Takes `pages` pages. `want_fresh` prefers never-used space (for zeroed memory); else
    /// the best-fitting freed run is reused first, so the arena's high mark grows slowly.
    pub fn alloc(&mut self, pages: u64, want_fresh: bool) -> Option<Extent> {
        if pages == 0 {
            return None;
        }
        if want_fresh && let Some(e) = self.take_top(pages) {
            return Some(e);
        }
        if let Some(&(len, start)) = self.free_by_size.range((pages, 0)..).next() {
            self.remove_free(start, len);
            if len > pages {
                self.insert_free(start + pages, len - pages);
            }
            self.in_use += pages;
            return Some(Extent {
                start,
                pages,
                fresh: false,
            });
        }
        self.take_top(pages)
    }

    fn take_top(&mut self, pages: u64) -> Option<Extent> {
        let end = self.top.checked_add(pages)?;
        if end > self.total {
            return None;
        }
        let start = self.top;
        self.top = end;
        self.in_use += pages;
        Some(Extent {
            start,
            pages,
            fresh: true,
        })
    }

    /// Grows the run `[start, start+pages)` by `more` pages in place if the pages after it
    /// are free or never used. Returns whether it grew.
    pub fn grow(&mut self, start: u64, pages: u64, more: u64) -> bool {
        let end = start + pages;
        if end == self.top {
            if self.top.saturating_add(more) <= self.total {
                self.top += more;
                self.in_use += more;
                return true;
            }
            return false;
        }
        if let Some(&len) = self.free_by_start.get(&end)
            && len >= more
        {
            self.remove_free(end, len);
            if len > more {
                self.insert_free(end + more, len - more);
            }
            self.in_use += more;
            return true;
        }
        false
    }

    /// Gives `[start, start+pages)` back, merging it with free neighbours.
    pub fn release(&mut self, start: u64, pages: u64) {
        debug_assert!(
            start + pages <= self.top,
            "release of pages never handed out"
        );
        self.in_use -= pages;
        let mut start = start;
        let mut len = pages;
        if let Some((&prev, &prev_len)) = self.free_by_start.range(..start).next_back()
            && prev + prev_len == start
        {
            self.remove_free(prev, prev_len);
            start = prev;
            len += prev_len;
        }
        if let Some(&next_len) = self.free_by_start.get(&(start + len)) {
            self.remove_free(start + len, next_len);
            len += next_len;
        }
        self.insert_free(start, len);
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.free_by_start.insert(start, len);
        self.free_by_size.insert((len, start));
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.free_by_start.remove(&start);
        self.free_by_size.remove(&(len, start));
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // page numbers of a 4096-page test arena
mod tests {
    use super::*;

    /// A tiny deterministic generator (the tests print their seed).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
    }

    #[test]
    fn fresh_space_first_then_reuse_best_fit() {
        let mut a = Arena::new(100);
        let x = a.alloc(10, false).unwrap();
        let y = a.alloc(5, false).unwrap();
        assert_eq!((x.start, x.fresh, y.start), (0, true, 10));
        a.release(0, 10);
        let z = a.alloc(4, false).unwrap();
        assert_eq!((z.start, z.fresh), (0, false));
        // Zeroed requests go to never-used space even when freed space fits.
        let w = a.alloc(3, true).unwrap();
        assert_eq!((w.start, w.fresh), (15, true));
        assert!(
            a.alloc(200, false).is_none(),
            "more than the arena must fail"
        );
        assert!(a.alloc(0, false).is_none());
    }

    #[test]
    fn merges_neighbours_and_grows_in_place() {
        let mut a = Arena::new(64);
        let b: Vec<_> = (0..4).map(|_| a.alloc(4, false).unwrap()).collect();
        a.release(b[1].start, 4);
        a.release(b[2].start, 4);
        // The merged hole of 8 pages fits an 8-page request.
        assert_eq!(a.alloc(8, false).unwrap().start, 4);
        a.release(4, 8);
        assert!(a.grow(b[0].start, 4, 8), "grows into the free run after it");
        assert!(!a.grow(b[0].start, 12, 1), "the next block is in use");
        assert!(
            a.grow(b[3].start, 4, 10),
            "the last block grows into fresh space"
        );
        assert_eq!(a.in_use(), 4 + 8 + 4 + 10);
        assert!(!a.grow(b[3].start, 14, 100), "no room past the arena's end");
    }

    #[test]
    fn random_allocations_never_overlap() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        println!("seed {seed}");
        let mut rng = Lcg(seed);
        let total = 4096;
        let mut a = Arena::new(total);
        let mut owner = vec![usize::MAX; total as usize];
        let mut live: Vec<(u64, u64)> = Vec::new();
        for step in 0..20_000 {
            if live.is_empty() || !rng.next().is_multiple_of(3) {
                let pages = 1 + rng.next() % 64;
                if let Some(e) = a.alloc(pages, rng.next().is_multiple_of(4)) {
                    for p in e.start..e.start + e.pages {
                        assert_eq!(owner[p as usize], usize::MAX, "step {step}: overlap");
                        owner[p as usize] = step;
                    }
                    live.push((e.start, e.pages));
                }
            } else {
                let i = (rng.next() % live.len() as u64) as usize;
                let (s, n) = live.swap_remove(i);
                for p in s..s + n {
                    owner[p as usize] = usize::MAX;
                }
                a.release(s, n);
            }
            assert_eq!(a.in_use(), live.iter().map(|l| l.1).sum::<u64>());
        }
    }
}
