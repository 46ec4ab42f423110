//! Written pages recorded as they are written: the range is write-protected through a
//! userfaultfd in notified (synchronous) mode, so the first write to a protected page blocks
//! the writer and sends a fault message; a handler thread records the page in a bitmap and
//! un-protects the whole page (which wakes the writer). Asking which pages were written then
//! reads the bitmap: nothing is scanned, and a range nobody wrote answers in microseconds
//! whatever its size (the asynchronous mode of [`crate::write_watch`] walks the page table,
//! about 0.3 ms per GiB).
//!
//! A fault costs a round trip through the handler thread (more than the asynchronous mode's
//! in-kernel fault) but comes once per page of the watch, not once per 4 KiB. Writes the
//! kernel makes for the process wait for the handler like any other (`read(2)` into the
//! memory, `process_vm_writev`, direct I/O); the few kernel paths that cannot wait for a
//! handler refuse the write instead (a debugger's write through `/proc/PID/mem` or ptrace
//! fails with EIO while the page is protected), so a write is seen or visibly refused.
//!
//! # Why no write is lost
//! One lock covers "record the page, then un-protect it" in the handler and "protect pages,
//! then clear their records" on the caller's side, so a page is writable only while its
//! record is set (invariant). A write to a page whose record is clear therefore faults, and
//! it completes only after the handler has set the record. A write racing with a caller's
//! `protect` either lands before it (the caller reads the data after protecting, so it sees
//! the bytes) or faults after it and is recorded for the next round. A fault message handled
//! late (its page protected again meanwhile) records the page once more: a page counted
//! written that was not, never the reverse.
//!
//! # Failure
//! If the handler cannot serve a fault (an ioctl fails), blocked writers must not wait
//! forever: it un-protects the whole range, notes the error, and stops; from then on every
//! call fails (the caller falls back to hashing and counts every page written once), and
//! nothing is protected again, so no write can block.

use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::sys;

/// Fault messages read per `read(2)`.
const MESSAGES_PER_READ: usize = 64;

/// Tries of an ioctl that the kernel answered with EAGAIN (the address space was changing).
const RETRIES: usize = 100;

/// Pages recorded written, shared by the handler and the callers.
#[derive(Debug)]
struct Records {
    /// One bit per page.
    bits: Vec<u64>,
    /// Bits set.
    count: usize,
    /// Faults handled so far.
    faults: u64,
    /// Why the handler gave up (the range is unprotected for good).
    failure: Option<String>,
}

impl Records {
    fn set(&mut self, p: usize) {
        let (w, b) = (p / 64, 1u64 << (p % 64));
        if self.bits[w] & b == 0 {
            self.bits[w] |= b;
            self.count += 1;
        }
    }

    fn clear(&mut self, pages: Range<usize>) {
        if self.count == 0 {
            return;
        }
        for p in pages {
            let (w, b) = (p / 64, 1u64 << (p % 64));
            if self.bits[w] & b != 0 {
                self.bits[w] &= !b;
                self.count -= 1;
            }
        }
    }

    fn listed(&self, pages: Range<usize>) -> Vec<usize> {
        let mut out = Vec::new();
        if self.count == 0 || pages.is_empty() {
            return out;
        }
        for w in pages.start / 64..pages.end.div_ceil(64) {
            let mut word = self.bits[w];
            while word != 0 {
                let p = w * 64 + word.trailing_zeros() as usize;
                word &= word - 1;
                if pages.contains(&p) {
                    out.push(p);
                }
            }
        }
        out
    }
}

/// What the handler thread and the owner share.
#[derive(Debug)]
struct Shared {
    uffd: OwnedFd,
    /// Readable when the handler must stop.
    stop: OwnedFd,
    base: u64,
    len: u64,
    page: u64,
    records: Mutex<Records>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Records> {
        // The lock guards plain data that every holder leaves consistent; a panic elsewhere
        // must not stop fault handling (writers would block forever).
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Byte range of `pages`, clipped to the watch.
    fn bytes(&self, pages: &Range<usize>) -> (u64, u64) {
        let start = self.base + pages.start as u64 * self.page;
        let end = self.base + (pages.end as u64 * self.page).min(self.len);
        (start, end - start)
    }

    /// (Un-)protects `pages`, retrying while the kernel says the address space is changing.
    fn write_protect(&self, pages: &Range<usize>, protect: bool) -> io::Result<()> {
        let (start, len) = self.bytes(pages);
        let mut tries = 0;
        loop {
            match sys::write_protect(&self.uffd, start, len, protect) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < RETRIES => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Gives up (handler side): the whole range is made writable and every blocked writer
    /// woken, and every later call fails.
    fn fail(&self, records: &mut Records, why: String) {
        let all = 0..records.bits.len() * 64;
        let (start, len) = (self.base, self.len);
        if self.write_protect(&all, false).is_err() {
            // Last resort: blocked writers retry (and, the page still protected, fault
            // again, so the handler loop keeps serving them with this same path).
            let _ = sys::wake(&self.uffd, start, len);
        }
        records.failure.get_or_insert(why);
    }

    /// Handles one batch of fault messages: records their pages, then un-protects them (and
    /// so wakes their writers), under the lock.
    fn handle(&self, messages: &[sys::UffdMsg], pages: &mut Vec<usize>) -> Result<(), ()> {
        pages.clear();
        let mut stray = Vec::new();
        for m in messages {
            let Some(addr) = m.wp_fault_address() else {
                continue;
            };
            match addr.checked_sub(self.base).filter(|&o| o < self.len) {
                Some(o) => pages.push(usize::try_from(o / self.page).unwrap_or(usize::MAX)),
                None => stray.push(addr & !4095),
            }
        }
        pages.sort_unstable();
        pages.dedup();
        let mut records = self.lock();
        if records.failure.is_some() {
            return Err(());
        }
        records.faults += messages.len() as u64;
        for &p in pages.iter() {
            records.set(p);
        }
        for run in runs(pages) {
            if let Err(e) = self.write_protect(&run, false) {
                self.fail(
                    &mut records,
                    format!("un-protecting pages {run:?} after a write fault failed: {e}"),
                );
                return Err(());
            }
        }
        drop(records);
        // Not ours (cannot happen: only the watched range is registered): let the writer go.
        for a in stray {
            let _ = sys::wake(&self.uffd, a, 4096);
        }
        Ok(())
    }

    /// The handler thread's loop: until the stop descriptor is readable or the handler fails.
    fn serve(&self) {
        let mut messages = [sys::UffdMsg::default(); MESSAGES_PER_READ];
        let mut pages = Vec::with_capacity(MESSAGES_PER_READ);
        loop {
            let ready = sys::poll_readable([&self.uffd, &self.stop]).and_then(|[fault, stop]| {
                if stop {
                    Ok(None)
                } else if fault {
                    sys::read_wp_faults(&self.uffd, &mut messages).map(Some)
                } else {
                    Ok(Some(0))
                }
            });
            let n = match ready {
                Ok(None) => return,
                Ok(Some(n)) => n,
                Err(e) => {
                    let mut records = self.lock();
                    self.fail(
                        &mut records,
                        format!("waiting for write faults failed: {e}"),
                    );
                    return;
                }
            };
            if self.handle(&messages[..n], &mut pages).is_err() {
                return;
            }
        }
    }
}

/// Runs of consecutive values in an ascending list.
fn runs(pages: &[usize]) -> impl Iterator<Item = Range<usize>> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = *pages.get(i)?;
        let mut end = start + 1;
        i += 1;
        while pages.get(i) == Some(&end) {
            end += 1;
            i += 1;
        }
        Some(start..end)
    })
}

/// A write-protected range whose written pages a handler thread records as they are written.
#[derive(Debug)]
pub struct WriteLog {
    shared: Arc<Shared>,
    handler: Option<JoinHandle<()>>,
    handler_tid: i64,
}

impl WriteLog {
    /// Watches `len` bytes at `base` (4 KiB-aligned) in pages of `page` bytes (a multiple of
    /// 4 KiB dividing `len`: checked by the caller) and protects all of it. Fails where a
    /// notified userfaultfd is refused (no privilege, old kernel) or the memory cannot be
    /// registered.
    pub(crate) fn new(base: u64, len: u64, page: u64) -> io::Result<Self> {
        let uffd = sys::open_notified_wp_uffd()?;
        sys::register_wp(&uffd, base, len)?;
        let pages = usize::try_from(len / page).map_err(io::Error::other)?;
        let shared = Arc::new(Shared {
            uffd,
            stop: sys::eventfd()?,
            base,
            len,
            page,
            records: Mutex::new(Records {
                bits: vec![0; pages.div_ceil(64)],
                count: 0,
                faults: 0,
                failure: None,
            }),
        });
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let s = Arc::clone(&shared);
        let handler = std::thread::Builder::new()
            .name("strata-wp-log".into())
            .spawn(move || {
                let _ = tid_tx.send(sys::thread_id());
                s.serve();
            })?;
        let handler_tid = tid_rx.recv().map_err(io::Error::other)?;
        let log = WriteLog {
            shared,
            handler: Some(handler),
            handler_tid,
        };
        // Protected only now that the handler runs: no write can wait for a missing handler.
        log.protect(0..pages)?;
        Ok(log)
    }

    /// The handler's failure, as an error for the caller.
    fn failed(records: &Records) -> io::Result<()> {
        match &records.failure {
            Some(why) => Err(io::Error::other(format!(
                "the write-fault handler gave up, so the range is no longer watched: {why}"
            ))),
            None => Ok(()),
        }
    }

    /// Protects `pages` again and forgets their records: their next write is recorded.
    pub fn protect(&self, pages: Range<usize>) -> io::Result<()> {
        if pages.is_empty() {
            return Ok(());
        }
        let mut records = self.shared.lock();
        Self::failed(&records)?;
        self.shared.write_protect(&pages, true)?;
        records.clear(pages);
        Ok(())
    }

    /// The pages of `pages` written since they were last protected, ascending.
    pub fn written(&self, pages: Range<usize>) -> io::Result<Vec<usize>> {
        let records = self.shared.lock();
        Self::failed(&records)?;
        Ok(records.listed(pages))
    }

    /// Write faults handled so far.
    pub fn faults(&self) -> u64 {
        self.shared.lock().faults
    }

    /// The kernel thread id of the handler thread (to check that it ends with the log).
    pub fn handler_thread_id(&self) -> i64 {
        self.handler_tid
    }
}

impl Drop for WriteLog {
    fn drop(&mut self) {
        // Everything writable first (waking any blocked writer) so that no write can wait for
        // the handler once it is gone; then the handler stops, then the descriptors close
        // (which unregisters the range).
        {
            let records = self.shared.lock();
            if records.failure.is_none() {
                let all = 0..records.bits.len() * 64;
                let _ = self.shared.write_protect(&all, false);
            }
        }
        if sys::eventfd_signal(&self.shared.stop).is_ok()
            && let Some(h) = self.handler.take()
        {
            let _ = h.join();
        }
        // If the stop signal could not be sent the handler keeps its own reference and stays
        // blocked in poll on a range nothing can fault in any more; the descriptors close
        // with it at exit.
    }
}

#[cfg(test)]
mod tests {
    use crate::write_watch::test_memory::{Shared, with_deadline};
    use crate::write_watch::{WatchMode, WriteWatch};
    use rand::{Rng, SeedableRng};
    use std::time::{Duration, Instant};

    fn task_alive(tid: i64) -> bool {
        std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
    }

    /// Faults are counted once per page until it is protected again; the handler thread ends
    /// with the log, and the memory stays writable after it.
    #[test]
    fn protection_comes_back_after_protect_and_the_handler_ends_with_the_log() {
        let seed: u64 = rand::random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let page = 16 << 10;
        let pages = 64;
        let mem = Shared::new(page * pages);
        let w = match WriteWatch::new(mem.ptr, mem.len, page, WatchMode::Notified) {
            Ok(w) => w,
            Err(e) => {
                println!("skipped: no notified write protection here ({e})");
                return;
            }
        };
        let log = w.log().expect("a notified watch has a log");
        let tid = log.handler_thread_id();
        assert!(task_alive(tid), "handler thread {tid} runs");
        with_deadline(Duration::from_secs(60), "write_log protection test", || {
            assert_eq!(log.faults(), 0);
            let mut chosen: Vec<usize> = (0..5).map(|_| rng.random_range(0..pages)).collect();
            chosen.sort_unstable();
            chosen.dedup();
            for round in 0..3 {
                for &p in &chosen {
                    // Every 4 KiB of the page: the first write un-protects the whole page.
                    for k in 0..page / 4096 {
                        mem.bytes()[p * page + k * 4096 + round] ^= 0x5a;
                    }
                }
                let faults = log.faults();
                assert!(
                    faults >= (round + 1) as u64 * chosen.len() as u64,
                    "round {round}: {faults} faults for {} pages",
                    chosen.len()
                );
                assert!(
                    faults <= (round + 1) as u64 * chosen.len() as u64 * 4,
                    "round {round}: {faults} faults: a page must fault once, not per 4 KiB"
                );
                assert_eq!(w.written_pages(0..pages).unwrap(), chosen);
                // Listing takes nothing: the pages stay listed until protected.
                assert_eq!(w.written_pages(0..pages).unwrap(), chosen);
                for &p in &chosen {
                    w.protect(p..p + 1).unwrap();
                }
                assert!(
                    w.written_pages(0..pages).unwrap().is_empty(),
                    "round {round}"
                );
            }
        });
        drop(w);
        let t0 = Instant::now();
        while task_alive(tid) && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !task_alive(tid),
            "handler thread {tid} still runs after the drop"
        );
        // Unwatched now: writes go through without anyone to serve a fault.
        with_deadline(
            Duration::from_secs(20),
            "write after the log's drop",
            || {
                mem.bytes().iter_mut().step_by(4096).for_each(|b| *b ^= 1);
            },
        );
    }

    /// Two logs over two ranges at once, each with its own handler, each seeing only its own
    /// pages; dropping one leaves the other working.
    #[test]
    fn two_logs_are_independent() {
        let page = 4096;
        let (a, b) = (Shared::new(page * 32), Shared::new(page * 32));
        let Ok(wa) = WriteWatch::new(a.ptr, a.len, page, WatchMode::Notified) else {
            println!("skipped: no notified write protection here");
            return;
        };
        let wb = WriteWatch::new(b.ptr, b.len, page, WatchMode::Notified).unwrap();
        with_deadline(Duration::from_secs(60), "two logs", || {
            a.bytes()[3 * page] ^= 1;
            b.bytes()[7 * page + 9] ^= 1;
            assert_eq!(wa.written_pages(0..32).unwrap(), vec![3]);
            assert_eq!(wb.written_pages(0..32).unwrap(), vec![7]);
            drop(wa);
            b.bytes()[31 * page] ^= 1;
            a.bytes()[31 * page] ^= 1;
            assert_eq!(wb.written_pages(0..32).unwrap(), vec![7, 31]);
        });
    }
}
