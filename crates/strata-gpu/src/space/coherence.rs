//! What a coherence layer above a space (one allocation shared by CPU code and kernels,
//! `strata-unified`) needs from it besides flush/evict/prefetch: which pages the GPU holds
//! dirty, and dropping the GPU's copies of pages *without* writing them back (the CPU wrote
//! newer bytes into the host copy, so a write-back would destroy them).
//!
//! Both run from the host with no kernel in flight (they wait for the whole context first, as
//! every maintenance call does), so they read and edit the page and frame tables with plain
//! copies: at rest no page is LOADING or EVICTING and no pin is held, and a page word and its
//! frame entry change together exactly as the device's eviction changes them
//! (`retire_page_word`: state NOT_RESIDENT, version bumped, history kept; frame freed).

use std::ops::Range;

use super::{Space, SpaceError};
use crate::layout::{DeviceCounters, FrameEntry, NO_PAGE, PageWord, RESIDENT};

/// Frame flag: the frame is in the protected segment (`STRATA_FRAME_PROTECTED`, layout.cuh).
const FRAME_PROTECTED: u32 = 2;

/// What [`Space::drop_pages`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DroppedPages {
    /// Pages whose frame was freed.
    pub dropped: u64,
    /// Of those, pages that were dirty in their frame (their GPU writes are gone).
    pub dirty_dropped: Vec<u64>,
}

impl Space {
    /// Pages in `pages` (page indices) that sit dirty in a GPU frame, in ascending order: the
    /// GPU wrote them since they were loaded or last written down. Waits for every kernel
    /// queued on the GPU first.
    pub fn gpu_dirty_pages(&self, pages: Range<u64>) -> Result<Vec<u64>, SpaceError> {
        Ok(self
            .resident_pages(pages)?
            .into_iter()
            .filter(|&(_, w)| w.dirty)
            .map(|(p, _)| p)
            .collect())
    }

    /// Pages in `pages` that sit in a GPU frame (clean or dirty), ascending.
    pub fn gpu_resident_pages(&self, pages: Range<u64>) -> Result<Vec<u64>, SpaceError> {
        Ok(self
            .resident_pages(pages)?
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    fn check_pages(&self, pages: &Range<u64>) -> Result<(), SpaceError> {
        if pages.start > pages.end || pages.end > self.handle.pages {
            return Err(SpaceError::Invalid(format!(
                "page range {}..{} is outside the space's {} pages: pass page indices below {}",
                pages.start, pages.end, self.handle.pages, self.handle.pages
            )));
        }
        Ok(())
    }

    /// The resident pages of a page range with their decoded words.
    fn resident_pages(&self, pages: Range<u64>) -> Result<Vec<(u64, PageWord)>, SpaceError> {
        self.check_pages(&pages)?;
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        self.gpu.synchronize_context()?;
        let words = self.page_words(&pages)?;
        Ok(pages
            .zip(words)
            .map(|(p, w)| (p, PageWord::decode(w)))
            .filter(|(_, w)| w.state == RESIDENT)
            .collect())
    }

    fn page_words(&self, pages: &Range<u64>) -> Result<Vec<u64>, SpaceError> {
        let n = usize::try_from(pages.end - pages.start)
            .map_err(|_| SpaceError::Invalid("page range too large".into()))?;
        let mut words = vec![0u64; n];
        self.page_table
            .download(to_offset(pages.start)?, &mut words)?;
        Ok(words)
    }

    /// For a list of ascending, distinct pages: the first page and the page words from it to
    /// the last (read with no kernel running), or `None` for an empty list.
    fn words_of_listed(
        &self,
        pages: &[u64],
        call: &str,
    ) -> Result<Option<(u64, Vec<u64>)>, SpaceError> {
        if pages.windows(2).any(|w| w[0] >= w[1]) {
            return Err(SpaceError::Invalid(format!(
                "{call} takes ascending, distinct page indices"
            )));
        }
        let (Some(&first), Some(&last)) = (pages.first(), pages.last()) else {
            return Ok(None);
        };
        let span = first..last + 1;
        self.check_pages(&span)?;
        self.gpu.synchronize_context()?;
        Ok(Some((first, self.page_words(&span)?)))
    }

    /// Frees the GPU frames of the listed pages (ascending page indices) **without writing
    /// them back**, dirty or not: the next kernel access loads the page again from the tier
    /// below. For a coherence layer whose CPU side wrote newer bytes into the host copy
    /// (dropping stale GPU copies), and for discards. A space over a store or with a peer tier
    /// is refused: a page there may have other copies (host cache slots, peer slots) this call
    /// does not reach. Waits for every kernel queued on the GPU first; returns what it freed.
    pub fn drop_pages(&self, pages: &[u64]) -> Result<DroppedPages, SpaceError> {
        if !matches!(self.backing, crate::tier::Backing::HostCopy(_)) || self.peer.is_some() {
            return Err(SpaceError::Invalid(
                "dropping GPU copies without write-back needs a space whose only other copy is its pinned host copy (Strata::space without peers); for a space over a store use drop_clean_copies".into(),
            ));
        }
        self.drop_frames(pages, false)
    }

    /// For a space over a store whose store was written by someone else (a coherence layer's
    /// CPU side): frees every copy the space holds of the listed pages (ascending, distinct),
    /// the GPU frames and the host cache's slots, so the next access reads the store. The
    /// copies must be clean: if a listed page is dirty in a GPU frame the call is refused with
    /// nothing dropped (write it down with [`Space::flush`] first, or it would be lost); a
    /// dirty host-cache slot of a listed page is written to the store before it is dropped
    /// (as the ring's invalidate does), so the caller must have flushed the space since the
    /// kernels that wrote it. Spaces with a host copy use [`Space::drop_pages`]; peers are
    /// refused. Waits for every kernel queued on the GPU first; returns the GPU frames freed.
    pub fn drop_clean_copies(&self, pages: &[u64]) -> Result<u64, SpaceError> {
        let crate::tier::Backing::Store(store) = &self.backing else {
            return Err(SpaceError::Invalid(
                "drop_clean_copies is for spaces over a store: use drop_pages for a space with a host copy".into(),
            ));
        };
        if self.peer.is_some() {
            return Err(SpaceError::Invalid(
                "dropping copies of a space with a peer tier is not supported: its pages may sit in peer slots this call does not reach".into(),
            ));
        }
        // Frames first, so a dirty one refuses the call before anything changed; then the
        // host cache's slots, which the next load would otherwise read instead of the store.
        let dropped = self.drop_frames(pages, true)?;
        let mut listed: Vec<usize> = Vec::with_capacity(pages.len());
        for &p in pages {
            listed.push(
                usize::try_from(p).map_err(|_| {
                    SpaceError::Invalid("page index too large for this host".into())
                })?,
            );
        }
        let server = store.server()?;
        for run in runs(&listed) {
            server.invalidate(run.start as u64..run.end as u64)?;
        }
        Ok(dropped.dropped)
    }

    /// Frees the GPU frames of the listed pages without write-back (the page-table and frame
    /// edits of the device's eviction); with `refuse_dirty`, a dirty page refuses the whole
    /// call before anything changes.
    fn drop_frames(&self, pages: &[u64], refuse_dirty: bool) -> Result<DroppedPages, SpaceError> {
        let Some((first, mut words)) = self.words_of_listed(pages, "drop_pages")? else {
            return Ok(DroppedPages::default());
        };
        let mut frames = vec![
            FrameEntry {
                page: NO_PAGE,
                flags: 0
            };
            self.handle.frame_count as usize
        ];
        self.frames.download(0, &mut frames)?;
        let mut out = DroppedPages::default();
        let mut freed_frames = Vec::new();
        let mut protected_freed = 0u32;
        for &p in pages {
            let i = usize::try_from(p - first).unwrap_or(usize::MAX);
            let w = PageWord::decode(words[i]);
            if w.state != RESIDENT {
                continue;
            }
            if w.pins != 0 {
                return Err(SpaceError::Invalid(format!(
                    "page {p} is pinned with no kernel running (a kernel ended holding it): nothing was dropped"
                )));
            }
            if refuse_dirty && w.dirty {
                return Err(SpaceError::Invalid(format!(
                    "page {p} holds GPU writes not written down: flush the space before dropping its copies (nothing was dropped)"
                )));
            }
            let f = w.frame as usize;
            if frames.get(f).map(|e| e.page) != u32::try_from(p).ok() {
                return Err(SpaceError::Invalid(format!(
                    "page {p} names frame {f}, which does not hold it: the tables disagree, nothing was dropped"
                )));
            }
            // The device's retire_page_word: not resident, version bumped, history kept.
            let history = words[i] & crate::layout::HISTORY;
            let version =
                (words[i] + (1 << crate::layout::VERSION_SHIFT)) & crate::layout::VERSION_MASK;
            words[i] = history | version;
            if frames[f].flags & FRAME_PROTECTED != 0 {
                protected_freed += 1;
            }
            frames[f] = FrameEntry {
                page: NO_PAGE,
                flags: 0,
            };
            freed_frames.push(f);
            out.dropped += 1;
            if w.dirty {
                out.dirty_dropped.push(p);
            }
        }
        if out.dropped == 0 {
            return Ok(out);
        }
        self.page_table.upload(to_offset(first)?, &words)?;
        freed_frames.sort_unstable();
        for run in runs(&freed_frames) {
            self.frames.upload(run.start * 8, &frames[run])?;
        }
        // The frames are free again, as after the device's eviction (which counts them back):
        // a later sweep that takes one counts it out, so without this the count would wrap.
        let c = counted_free(self.counters()?, out.dropped, protected_freed);
        self.counters.upload(0, std::slice::from_ref(&c))?;
        Ok(out)
    }

    /// Writes the listed pages (ascending) that sit dirty in a GPU frame down into the host
    /// copy, one copy each, and marks them clean (they stay cached): a flush of just these
    /// pages. Returns the pages written. A space over a store is refused (its pages go down
    /// through the ring; use [`Space::flush`]). Waits for every kernel queued on the GPU first.
    pub fn write_down_pages(&mut self, pages: &[u64]) -> Result<Vec<u64>, SpaceError> {
        let Some((first, mut words)) = self.words_of_listed(pages, "write_down_pages")? else {
            return Ok(Vec::new());
        };
        let ps = self.page_size();
        let page_bytes = usize::try_from(ps).unwrap_or(usize::MAX);
        let crate::tier::Backing::HostCopy(h) = &mut self.backing else {
            return Err(SpaceError::NoHostCopy);
        };
        let host = h.buffer.as_mut_slice();
        let sectors = held_sectors(&self.frames, self.handle)?;
        let mut written = Vec::new();
        for &p in pages {
            let i = usize::try_from(p - first).unwrap_or(usize::MAX);
            let w = PageWord::decode(words[i]);
            if w.state != RESIDENT || !w.dirty {
                continue;
            }
            let at = usize::try_from(p * ps).unwrap_or(usize::MAX);
            let frame_at = usize::try_from(u64::from(w.frame) * ps).unwrap_or(usize::MAX);
            match &sectors {
                // Sub-page fetch: only the sectors the frame holds; the others are current in
                // the host copy, and the frame's bytes there mean nothing.
                Some((sector, held)) => {
                    let mask = held.get(w.frame as usize).copied().unwrap_or(0);
                    for run in sector_runs(mask) {
                        let (from, len) = (run.start * *sector, run.len() * *sector);
                        self._frame_data
                            .download(frame_at + from, &mut host[at + from..at + from + len])?;
                    }
                }
                None => self
                    ._frame_data
                    .download(frame_at, &mut host[at..at + page_bytes])?,
            }
            words[i] &= !crate::layout::DIRTY;
            written.push(p);
        }
        if !written.is_empty() {
            self.page_table.upload(to_offset(first)?, &words)?;
        }
        Ok(written)
    }
}

/// The device counters after `dropped` frames were freed by the host, `protected` of them
/// from the protected segment.
fn counted_free(mut c: DeviceCounters, dropped: u64, protected: u32) -> DeviceCounters {
    c.protected_now = c.protected_now.saturating_sub(protected);
    c.free_frames += dropped;
    c
}

fn to_offset(page: u64) -> Result<usize, SpaceError> {
    usize::try_from(page * 8).map_err(|_| SpaceError::Invalid("page index too large".into()))
}

/// Sub-page fetch: the sector size and each frame's mask of held sectors (the low half of its
/// sector word, after the frame table); `None` when the space loads whole pages.
fn held_sectors(
    frames: &crate::driver::DeviceBuffer,
    handle: crate::layout::SpaceHandle<'_>,
) -> Result<Option<(usize, Vec<u32>)>, SpaceError> {
    let shift =
        (handle.policy & crate::layout::POLICY_SECTOR_MASK) >> crate::layout::POLICY_SECTOR_SHIFT;
    if shift == 0 {
        return Ok(None);
    }
    let n = handle.frame_count as usize;
    let mut words = vec![0u64; n];
    frames.download(n * 8, &mut words)?;
    #[allow(clippy::cast_possible_truncation)] // the held mask is the low 32 bits by layout
    let held = words.iter().map(|&w| w as u32).collect();
    Ok(Some((1usize << shift, held)))
}

/// Runs of consecutive set bits of a sector mask, as sector index ranges.
fn sector_runs(mask: u32) -> Vec<Range<usize>> {
    let set: Vec<usize> = (0..32).filter(|k| mask >> k & 1 == 1).collect();
    runs(&set)
}

/// Runs of consecutive values in a sorted list, as index ranges into the values' domain.
fn runs(sorted: &[usize]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for &v in sorted {
        match out.last_mut() {
            Some(r) if r.end == v => r.end += 1,
            _ => out.push(v..v + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{counted_free, runs};
    use crate::layout::DeviceCounters;

    #[test]
    fn dropped_frames_count_as_free_again() {
        let mut c = DeviceCounters::initial();
        c.free_frames = 3;
        c.protected_now = 2;
        let after = counted_free(c, 5, 3);
        assert_eq!(after.free_frames, 8);
        assert_eq!(after.protected_now, 0, "never below zero");
        assert_eq!(counted_free(c, 0, 0).free_frames, 3);
    }

    #[test]
    fn runs_group_consecutive_frames() {
        assert_eq!(runs(&[]), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(runs(&[3]), vec![3..4]);
        assert_eq!(runs(&[0, 1, 2, 5, 7, 8]), vec![0..3, 5..6, 7..9]);
    }

    #[test]
    fn sector_runs_cover_exactly_the_held_sectors() {
        assert!(super::sector_runs(0).is_empty());
        assert_eq!(super::sector_runs(u32::MAX), vec![0..32]);
        assert_eq!(super::sector_runs(0b1011_0001), vec![0..1, 4..6, 7..8]);
        assert_eq!(super::sector_runs(1 << 31), vec![31..32]);
    }
}
