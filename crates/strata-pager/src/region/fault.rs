//! The fault path: filler threads read userfaultfd messages and serve them (missing pages
//! are read from the store and installed; first writes to clean pages mark them dirty), and
//! what a failed fill answers (a poisoned page or `SIGBUS`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::RegionError;
use super::discard::is_discarded;
use super::read_ahead::WINDOWS_AHEAD;
use super::shared::{IDLE_RELEASE, Scratch, Shared, bump};
use super::trace::Event;
use crate::pages::{REF, STAMP_BITS, State, word};
use crate::sys::{self, FaultPoller, UffdMsg};

/// Where a run's frames come from. Only the first frame of a run may wait (for an eviction):
/// a thread never holds frames while it waits for more, so runs cannot deadlock on the buffer.
pub(super) enum FrameSource {
    /// A demand fault: its own page may wait for an eviction; the pages read with it are
    /// read-ahead and take only free frames above the reserve.
    Demand,
    /// `Region::prefetch`: the first page may wait; later pages take a free frame or evict one
    /// page each without waiting.
    Prefetch,
    /// Read-ahead with a faulting page: free frames above the reserve only, never an
    /// eviction, never a wait (the faulting thread is waiting for this fill).
    ReadAhead,
    /// Read-ahead by a read-ahead thread: free frames above the reserve, and for the rest
    /// pages it evicts itself, together, without waiting. Off the fault path, so a stream
    /// keeps its windows while the evictors keep only a few frames free.
    Background,
}

pub(super) enum OnFillError {
    /// Poison the first page of the run (and SIGBUS the faulting thread).
    Poison { tid: u32 },
    /// Leave the pages absent.
    Release,
}

/// Fault messages read per `read(2)`: a few, so that a burst spreads over the fillers.
const MESSAGES_PER_READ: usize = 4;

impl Shared {
    /// Waits for fault messages and serves them. After serving, a filler keeps reading for
    /// `fault_spin_us` before it sleeps, so that a thread faulting again soon finds a filler
    /// awake rather than waking one on another CPU (and being woken back from there). One
    /// filler polls at a time, and only while its faults take less than the window on
    /// average: a store slower than that (a disk read, a memory node) gains little beside its
    /// own latency, and the poll takes a CPU the evictor needs (sort at 6x over a file store
    /// was 9-25 % slower with polling, over LZ4 memory 2.5x faster:
    /// `crates/strata-run/results/RESULTS.md`).
    pub(super) fn filler_main(&self, poller: &FaultPoller) {
        // One page stays: random faults read one page each and never touch fresh memory.
        let mut scratch = Scratch::new(self.page_bytes);
        let mut msgs = [UffdMsg::default(); MESSAGES_PER_READ];
        let per_read = if self.config.fillers > 1 {
            MESSAGES_PER_READ
        } else {
            1
        };
        let window = Duration::from_micros(u64::from(self.config.fault_spin_us));
        // This filler's recent fault service time, and while it polls, until when.
        let mut service = ServiceTime::default();
        let mut polling_until: Option<Instant> = None;
        loop {
            match self.uffd.read_messages(&mut msgs[..per_read]) {
                Ok(n) if n > 0 => {
                    let start = Instant::now();
                    for m in &msgs[..n] {
                        self.handle(m, &mut scratch);
                    }
                    if !window.is_zero() {
                        let now = Instant::now();
                        service.add(now - start, n);
                        if polling_until.is_some() {
                            polling_until = Some(now + window);
                        }
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    eprintln!("strata-pager: reading fault messages failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if self.stop.load(Ordering::Acquire) {
                if polling_until.is_some() {
                    self.fault_poller_busy.store(false, Ordering::Release);
                }
                scratch.release(0, Some(self));
                return;
            }
            let fast = !window.is_zero() && service.mean() <= window;
            match polling_until {
                Some(until) if fast && Instant::now() < until => {
                    std::hint::spin_loop();
                    continue;
                }
                Some(_) => {
                    self.fault_poller_busy.store(false, Ordering::Release);
                    polling_until = None;
                }
                None if fast && !self.fault_poller_busy.swap(true, Ordering::AcqRel) => {
                    polling_until = Some(Instant::now() + window);
                    continue;
                }
                None => {}
            }
            // Idle with a window's scratch held: give it back after a while.
            let timeout = scratch.holds_more_than_kept().then_some(IDLE_RELEASE);
            match poller.wait_for(timeout) {
                Ok(0) if timeout.is_some() => scratch.release(self.page_bytes, Some(self)),
                Ok(_) => {}
                Err(e) => {
                    eprintln!("strata-pager: epoll_wait failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if self.stop.load(Ordering::Acquire) {
                scratch.release(0, Some(self));
                return;
            }
        }
    }

    pub(super) fn handle(&self, msg: &UffdMsg, scratch: &mut Scratch) {
        if msg.event != sys::EVENT_PAGEFAULT {
            return;
        }
        self.in_service.fetch_add(1, Ordering::AcqRel);
        self.serve(msg, scratch);
        self.in_service.fetch_sub(1, Ordering::AcqRel);
    }

    pub(super) fn serve(&self, msg: &UffdMsg, scratch: &mut Scratch) {
        let base = self.map.ptr() as usize;
        let addr = usize::try_from(msg.address).unwrap_or(usize::MAX);
        let Some(page) = addr.checked_sub(base).map(|d| d / self.page_bytes) else {
            return;
        };
        if page >= self.pages.len() {
            return;
        }
        if msg.flags & sys::PAGEFAULT_FLAG_WP != 0 {
            self.on_write_protect_fault(page);
        } else {
            let write = msg.flags & sys::PAGEFAULT_FLAG_WRITE != 0;
            self.on_missing_fault(page, write, msg.ptid, scratch);
        }
    }

    pub(super) fn on_write_protect_fault(&self, page: usize) {
        loop {
            let w = self.pages.load(page);
            match word::state(w) {
                s @ (State::Clean | State::Dirty) => {
                    if !self
                        .pages
                        .cas(page, w, word::with_state(w, State::Unprotecting))
                    {
                        continue;
                    }
                    if s == State::Clean {
                        bump(&self.counters.write_faults, 1);
                        if let Some(trace) = &self.trace {
                            trace.note(Event::Written, page, 0);
                        }
                    }
                    // Seen written: its next eviction marks it so (write_intent.rs).
                    self.guessed.set(page, false);
                    self.read_back_unused.set(page, false);
                    // Unprotecting wakes the writer; the page is already marked in transition,
                    // so no evictor or flush can re-protect it underneath us.
                    if let Err(e) =
                        self.uffd
                            .write_protect(self.page_addr(page), self.page_bytes, false)
                    {
                        eprintln!("strata-pager: removing write protection failed: {e}");
                    }
                    self.finish(page, word::with_state(w | REF, State::Dirty));
                    if self.read_ahead > 0 {
                        self.continue_write_stream(page);
                    }
                    return;
                }
                State::Absent | State::Poisoned => {
                    // Evicted meanwhile: the retry faults as missing.
                    return self.wake_duplicate(page);
                }
                _ => {
                    if self.wait_for_owner(page) {
                        return;
                    }
                }
            }
        }
    }

    /// After the first write to `page`: if it continues a sequential write stream (a recent
    /// run made writable ended here), the clean resident pages after it (pages read ahead) are
    /// made writable and dirty now, with one call, instead of each trapping on its first
    /// write. A wrong guess costs only the write-back of pages that were not changed.
    pub(super) fn continue_write_stream(&self, page: usize) {
        let mut end = page + 1;
        if self.write_streams.continues(page) {
            end = self.unprotect_run(page + 1, self.read_ahead);
            self.write_streams.note_stream(page, end);
        }
        self.write_streams.note(page, end);
    }

    /// Makes up to `max` clean resident pages from `first` on writable and dirty, stopping
    /// at the first that is not clean. Returns one past the last page made writable.
    fn unprotect_run(&self, first: usize, max: usize) -> usize {
        let end = (first + max).min(self.pages.len());
        let mut claimed = Vec::new();
        for q in first..end {
            let w = self.pages.load(q);
            if word::state(w) != State::Clean
                || !self
                    .pages
                    .cas(q, w, word::with_state(w, State::Unprotecting))
            {
                break;
            }
            claimed.push(w);
        }
        if claimed.is_empty() {
            return first;
        }
        let unprotected = self.uffd.write_protect(
            self.page_addr(first),
            claimed.len() * self.page_bytes,
            false,
        );
        let state = if let Err(e) = unprotected {
            eprintln!("strata-pager: removing write protection ahead failed: {e}");
            State::Clean
        } else {
            State::Dirty
        };
        for (i, &w) in claimed.iter().enumerate() {
            self.finish(first + i, word::with_state(w, state));
        }
        if state == State::Clean {
            return first;
        }
        first + claimed.len()
    }

    /// A fault that needs no work of ours: wake its thread so it retries.
    pub(super) fn wake_duplicate(&self, page: usize) {
        bump(&self.counters.duplicate_faults, 1);
        self.wake(page);
    }

    /// A fault on a page another thread is working on: leave a note so that thread wakes
    /// the faulter when done. False if the page left its transition meanwhile.
    pub(super) fn wait_for_owner(&self, page: usize) -> bool {
        let noted = self.pages.add_waiter(page);
        if noted {
            bump(&self.counters.duplicate_faults, 1);
        }
        noted
    }

    pub(super) fn on_missing_fault(
        &self,
        page: usize,
        write: bool,
        tid: u32,
        scratch: &mut Scratch,
    ) {
        let started = Instant::now();
        loop {
            let w = self.pages.load(page);
            match word::state(w) {
                State::Absent | State::Poisoned => {
                    if self.pages.cas(page, w, word::with_state(w, State::Filling)) {
                        break;
                    }
                }
                State::Clean | State::Dirty => {
                    // Another filler installed it; make sure this faulter is awake.
                    return self.wake_duplicate(page);
                }
                _ => {
                    if self.wait_for_owner(page) {
                        return;
                    }
                }
            }
        }
        // A fault right after the end of a recent fill, on a page whose predecessor is still
        // resident, continues a sequential run: read this window with the faulting page, and
        // hand the window after it to a read-ahead thread first, so that both reads are in
        // flight together and the next fault finds its pages arriving.
        let sequential = self.read_ahead > 0
            && self.fill_streams.continues(page)
            && !matches!(
                word::state(self.pages.load(page - 1)),
                State::Absent | State::Poisoned
            );
        // Where most faults are random, streams keep a lean footprint (see
        // `Streams::mostly_random`): half a window, none queued, a gap of the page left.
        let lean = self.read_ahead > 0 && self.fill_streams.mostly_random();
        let (window, windows_ahead, gap) = if lean {
            (self.read_ahead.div_ceil(2), 0, 2)
        } else {
            (self.read_ahead, WINDOWS_AHEAD, 2 * self.read_ahead + 1)
        };
        let mut extra = 0;
        if sequential {
            let zero = is_discarded(self.pages.load(page));
            extra = self.claim_run(page + 1, window, Some(zero));
            let mut filling = 1 + extra;
            if extra == window {
                for k in 0..windows_ahead {
                    self.queue_read_ahead(page + 1 + extra * (k + 1), window);
                }
                filling += windows_ahead * window;
            }
            // What the stream passed goes first: the page it left and the window it read
            // stay (the gap), and it may owe at most a few faults' worth.
            self.behind.stream_at(page, gap, filling, 4 * filling);
        }
        // Just below the start of a recent fill, whose first page is still resident: a
        // descending stream. The window below the faulting page is claimed now (a fault on
        // it waits for this filler) and read right after the faulting page, which is filled
        // alone (only a run's first page may wait for a frame, and here it would be the
        // last); the windows below that go to the read-ahead threads.
        let descending = !sequential
            && self.read_ahead > 0
            && self.fill_streams.continues_down(page)
            && page + 1 < self.pages.len()
            && !matches!(
                word::state(self.pages.load(page + 1)),
                State::Absent | State::Poisoned
            );
        let mut below = 0;
        if descending {
            let zero = is_discarded(self.pages.load(page));
            below = self.claim_run_down(page, window, zero);
            let mut filling = 1 + below;
            if below == window {
                for k in 2..=windows_ahead + 1 {
                    let Some(first) = page.checked_sub(k * window) else {
                        break;
                    };
                    self.queue_read_ahead(first, window);
                    filling += window;
                }
            }
            // As for an ascending stream, mirrored (what it passed lies above it), but only
            // while streams are lean: a slow stream beside pages read at random (sort's
            // merges) must not push them out. A fast one is often a partition (NumPy's
            // sort), whose pages the recursion wants back soon: evicting behind it there
            // read 10 % more (session 15).
            if lean {
                self.behind.stream_down_at(page, gap, filling, 4 * filling);
            }
        }
        if self.read_ahead > 0 {
            self.fill_streams.count_fault(sequential || descending);
        }
        // A fault that starts no stream: its neighbours in eviction order come back with it.
        if !sequential && !descending && self.read_back > 0 && !is_discarded(self.pages.load(page))
        {
            let others = self.claim_read_back(page);
            if !others.is_empty() {
                match self.fill_with_read_back(page, write, others, tid, scratch) {
                    Ok(_) => self.stats.record_fault(started.elapsed()),
                    Err(e) => return self.record(e),
                }
                if write && self.read_ahead > 0 {
                    self.continue_write_stream(page);
                }
                return;
            }
        }
        let together = if write { 1 } else { 1 + extra };
        match self.fill_run(
            page,
            together,
            write,
            &FrameSource::Demand,
            &OnFillError::Poison { tid },
            scratch,
        ) {
            Ok(n) => {
                if sequential || descending {
                    self.fill_streams.note_stream(page, page + n.max(1));
                }
                self.stats.record_fault(started.elapsed());
                let ahead = n.saturating_sub(1) as u64;
                bump(&self.counters.read_ahead_pages, ahead);
                self.stats.add_prefetched(ahead);
            }
            Err(e) => {
                if together > 1 {
                    // fill_run released the window with the failed page.
                } else if extra > 0 {
                    self.release_run(page + 1, extra);
                }
                if below > 0 {
                    self.release_run(page - below, below);
                }
                self.record(e);
                return;
            }
        }
        if below > 0 {
            self.fill_ahead(page - below, below, &FrameSource::ReadAhead, scratch);
        }
        if write && self.read_ahead > 0 {
            self.continue_write_stream(page);
        }
        if write && extra > 0 {
            self.fill_ahead(page + 1, extra, &FrameSource::ReadAhead, scratch);
        }
    }

    /// Fills pages `first..first+count`, which the caller has moved to `Filling`. Returns how
    /// many were installed (fewer than `count` when frames ran short; the rest are released).
    /// On a store error every page of the run is released (or the first poisoned).
    pub(super) fn fill_run(
        &self,
        first: usize,
        count: usize,
        write: bool,
        source: &FrameSource,
        on_error: &OnFillError,
        scratch: &mut Scratch,
    ) -> Result<usize, RegionError> {
        // A run of discarded pages is filled with zeros, without reading the store (the
        // callers claim runs of one kind only: see `claim_run`).
        let zero = is_discarded(self.pages.load(first));
        let same = (first..first + count)
            .take_while(|&p| is_discarded(self.pages.load(p)) == zero)
            .count();
        if same < count {
            // Never happens with runs from `claim_run`; were it to, zeros or a store read
            // must not cover a page of the other kind.
            self.release_run(first + same, count - same);
        }
        let count = same;
        // Installed writable when writes are found by digest, or, for a single page (a run
        // is installed with one mode), when it was written during its last stay, so its next
        // write does not trap (see `write_intent.rs`).
        let guessed = !write && !zero && self.fill_writable(count, self.pages.load(first));
        let write = write || guessed;
        let mut frames = Vec::with_capacity(count);
        // Fills that must evict for their frames (see `withhold.rs`) get them like
        // background ones, from pages evicted now; only a demand fault's first frame may
        // then come from elsewhere (it must have one).
        let evict_first = self.evict_before_fills.load(Ordering::Relaxed);
        if matches!(source, FrameSource::Background) || evict_first {
            frames = self.frames_evicting(count);
        }
        for i in frames.len()..count {
            let frame = match (source, i) {
                (FrameSource::Demand | FrameSource::Prefetch, 0) => self.wait_for_frame(),
                _ if evict_first => Ok(None),
                (FrameSource::Prefetch, _) => Ok(self.frame_now()),
                (FrameSource::Demand | FrameSource::ReadAhead, _) => Ok(self.frame_for_ahead()),
                // frames_evicting got what could be had without waiting.
                (FrameSource::Background, _) => Ok(None),
            };
            match frame {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    // Only a first frame waits, so nothing is held here.
                    self.release_run(first, count);
                    if let OnFillError::Poison { tid } = on_error {
                        // Released pages are claimable again; poisoning the faulting page
                        // (unless another filler took it meanwhile) answers the faulter.
                        self.fail_absent_page(first, *tid);
                    }
                    return Err(e);
                }
            }
        }
        let got = frames.len();
        if got < count {
            self.release_run(first + got, count - got);
        }
        if got == 0 {
            return Ok(0);
        }
        let bytes = got * self.page_bytes;
        let inside = (0..got).map(|i| self.io_len(first + i)).sum::<usize>();
        // Zeros come from a mapping never written, whose pages are all the kernel's shared
        // zero page: no memset, and no scratch memory charged for a window of new pages.
        let read_into = (!zero || bytes > self.zeros.len()).then(|| {
            let buf = scratch.get(bytes, Some(self));
            buf[if zero { 0 } else { inside }..].fill(0);
            buf
        });
        let (buf, read): (&[u8], _) = match read_into {
            Some(buf) => {
                let read = if zero {
                    Ok(())
                } else {
                    self.store
                        .read_at(self.store_offset(first), &mut buf[..inside])
                };
                (buf, read)
            }
            None => (self.zeros.bytes(bytes), Ok(())),
        };
        if let Err(source) = read {
            for f in &frames {
                self.frames.push(*f);
            }
            let error = RegionError::Fill {
                page: first,
                offset: self.store_offset(first),
                source,
            };
            match on_error {
                OnFillError::Poison { tid } => {
                    self.release_run(first + 1, got - 1);
                    self.poison(first, *tid);
                }
                OnFillError::Release => self.release_run(first, got),
            }
            return Err(error);
        }
        if !zero {
            self.stats.add_read(self.tier, inside as u64);
        }
        if matches!(source, FrameSource::ReadAhead | FrameSource::Background) {
            self.fill_streams.note_stream(first, first + got);
        } else {
            self.fill_streams.note(first, first + got);
        }
        for (i, f) in frames.iter().enumerate() {
            self.frames.assign(*f, first + i);
        }
        let mut got = got;
        let mut copied = self.uffd.copy(self.page_addr(first), buf, !write);
        if copied.is_err() && got > 1 {
            // The kernel copies into one of its mappings at a time (ENOENT otherwise), and a
            // program can split the region into several (mprotect, a partial mremap): keep
            // the first page alone and give the rest of the run back.
            for f in &frames[1..] {
                self.frames.push(*f);
            }
            self.release_run(first + 1, got - 1);
            got = 1;
            frames.truncate(1);
            copied = self
                .uffd
                .copy(self.page_addr(first), &buf[..self.page_bytes], !write);
        }
        if let Err(e) = copied {
            // EEXIST would mean someone mapped the page behind the pager's back (for example
            // MADV_DONTNEED undone by a write from the kernel); ENOENT that the page is no
            // longer in a mapping registered with the pager.
            eprintln!("strata-pager: UFFDIO_COPY of page {first} failed: {e}");
            self.frames.push(frames[0]);
            match on_error {
                // The faulting thread sleeps until this page is answered: poison it (or send
                // SIGBUS) rather than leave the thread asleep for ever.
                OnFillError::Poison { tid } => self.poison(first, *tid),
                OnFillError::Release => {
                    self.release_run(first, 1);
                    self.wake(first);
                }
            }
            return Err(RegionError::Kernel {
                op: "UFFDIO_COPY",
                source: e,
                hint: "this is a pager bug or a program that remapped the region; report it",
            });
        }
        for (i, f) in frames.iter().enumerate() {
            let event = match (source, i) {
                (FrameSource::Demand, 0) => Event::Demand,
                _ => Event::Ahead,
            };
            // Still `Filling`, so unchanged since the copy: the bytes read are the page's.
            if zero {
                self.digests.forget(first + i);
            } else {
                let at = i * self.page_bytes;
                let bytes = &buf[at..at + self.io_len(first + i)];
                self.digests.set(first + i, bytes);
            }
            // A zero page differs from the store's copy: dirty, so eviction writes it.
            self.installed(first + i, *f, write || zero, guessed, event, zero);
        }
        Ok(got)
    }

    /// Bookkeeping for `page`, just installed in `frame` (dirty or clean; `guessed`: made
    /// writable on a guess): reference and heat bits, the re-fault count, the trace.
    pub(super) fn installed(
        &self,
        page: usize,
        frame: u32,
        dirty: bool,
        guessed: bool,
        event: Event,
        zero: bool,
    ) {
        let now = self.evictions.load(Ordering::Relaxed) / self.stamp_unit;
        let span = self.frames.len() as u64 / self.stamp_unit;
        let old = self.pages.load(page);
        let mut new = REF;
        if old & crate::pages::GHOST != 0 {
            let distance = now.wrapping_sub(word::stamp(old)) & ((1 << STAMP_BITS) - 1);
            if distance <= span {
                // Back within one buffer's worth of evictions: a little more memory would
                // have kept it, so it earns (more) extra passes.
                new = word::with_heat(new, word::heat(old) + 1);
                bump(&self.counters.refaults, 1);
            }
        }
        let state = if dirty { State::Dirty } else { State::Clean };
        self.guessed.set(page, guessed);
        self.read_back_unused.set(page, event == Event::ReadBack);
        if let Some(trace) = &self.trace {
            trace.note(event, page, u64::from(zero));
        }
        self.finish(page, word::with_frame(word::with_state(new, state), frame));
    }

    pub(super) fn release_run(&self, first: usize, count: usize) {
        for page in first..first + count {
            self.finish(page, self.released(page, State::Absent));
        }
    }

    /// Answers a failed fault on `page` (in `Filling`): poison, else SIGBUS to the thread.
    pub(super) fn poison(&self, page: usize, tid: u32) {
        bump(&self.counters.failed_faults, 1);
        if self.use_poison {
            match self.uffd.poison(self.page_addr(page), self.page_bytes) {
                Ok(()) => {
                    self.finish(page, self.released(page, State::Poisoned));
                    return;
                }
                Err(e) => eprintln!("strata-pager: UFFDIO_POISON failed: {e}; sending SIGBUS"),
            }
        }
        if let Err(e) = sys::sigbus_thread(tid) {
            eprintln!("strata-pager: cannot deliver SIGBUS to thread {tid}: {e}");
        }
        self.finish(page, self.released(page, State::Absent));
        self.wake(page);
    }

    /// As [`Shared::poison`] for a page already released to `Absent`.
    pub(super) fn fail_absent_page(&self, page: usize, tid: u32) {
        let w = self.pages.load(page);
        if word::state(w) == State::Absent
            && self.pages.cas(page, w, word::with_state(w, State::Filling))
        {
            self.poison(page, tid);
        } else {
            self.wake(page);
        }
    }
}

/// A filler's mean fault service time, weighted to the recent faults (each new one counts
/// 1/8), so that a store's occasional fast fault does not start a poll.
#[derive(Debug, Default)]
struct ServiceTime {
    mean_ns: u64,
}

impl ServiceTime {
    fn add(&mut self, took: Duration, faults: usize) {
        let each = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX) / (faults.max(1) as u64);
        // mean += (each - mean) / 8, in integers.
        self.mean_ns = self.mean_ns - self.mean_ns / 8 + each / 8;
    }

    fn mean(&self) -> Duration {
        Duration::from_nanos(self.mean_ns)
    }
}
