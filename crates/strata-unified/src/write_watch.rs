//! Which pages of a memory range the CPU wrote, from the kernel's page tables: the range is
//! write-protected through a userfaultfd in one of two modes ([`WatchMode`]):
//!
//! * **Scanned** (asynchronous, Linux 6.7+): the first write to a protected 4 KiB page costs
//!   one minor fault that the kernel resolves itself (no handler thread, no signal), and
//!   `PAGEMAP_SCAN` on `/proc/self/pagemap` lists the pages written since they were last
//!   protected: a walk of the range's page table at every query, written or not.
//! * **Notified** ([`crate::write_log`]): the first write to a protected page blocks until a
//!   handler thread has recorded the page and un-protected it; a query reads the records, so
//!   a range nobody wrote answers in microseconds whatever its size. Costlier faults (a round
//!   trip through the thread, once per watched page), so for data the CPU seldom writes.
//!
//! Measured with `examples/sync_cost.rs` on the 2-core development machine (Linux 6.18, a
//! 1 GiB shared anonymous mapping in 64 KiB pages, tracker's `written` + `record`, median of
//! 30): nothing written 262 us scanned, 0.1 us notified; 16 pages written 323 us / 33 us;
//! one word in 1/32 of the pages 1.6 ms / 1.1 ms, but that CPU phase took 0.9 ms scanned and
//! 6.7 ms notified (faults at 13 us each there, against 0.7-1.2 us per 4 KiB scanned).
//!
//! Measured on the CUDA driver's pinned host memory (`cuMemHostAlloc`, a shared `/dev/zero`
//! mapping) on an H200 host (Linux 6.18): the first write to a 4 KiB page costs 0.65-0.8 us,
//! a scan of 1 GiB 0.3 ms when nothing was written and 4 ms when everything was. Writes by
//! DMA (the GPU's write-downs, `cuMemcpy` into the memory, RDMA) do not go through the CPU's
//! page tables and are **not** seen; writes by system calls (`read(2)` into the memory) are.
//! What else was tried on that memory: soft-dirty bits (`clear_refs` 4) stayed clear after
//! writes (pinned pages are never write-protected for soft-dirty), and mprotect with a
//! SIGSEGV handler worked but cost 5-7 us per fault, split the mapping into one VMA per
//! written page, and made system calls that write the memory fail with EFAULT.

use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;

use crate::sys;
use crate::write_log::WriteLog;

/// Regions asked for per `PAGEMAP_SCAN` call (the walk continues until the range is done).
const REGIONS_PER_SCAN: usize = 1024;

/// How a watch learns of writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchMode {
    /// Asynchronous write protection: the kernel resolves write faults itself (about 0.7 us
    /// per 4 KiB written) and a query walks the page table of the range (`PAGEMAP_SCAN`,
    /// about 0.3 ms per GiB whether or not anything was written).
    Scanned,
    /// Notified write protection ([`WriteLog`]): a handler thread records each page's first
    /// write (a fault round trip through that thread, once per watched page) and a query
    /// reads its records (microseconds, nothing scanned). Needs the privilege to open a full
    /// userfaultfd.
    Notified,
}

#[derive(Debug)]
enum Backend {
    Scanned { uffd: OwnedFd, pagemap: OwnedFd },
    Notified(WriteLog),
}

/// A write-protected range whose written pages can be listed.
#[derive(Debug)]
pub struct WriteWatch {
    backend: Backend,
    base: u64,
    len: u64,
    page: u64,
}

impl WriteWatch {
    /// Watches `len` bytes at `base` in pages of `page` bytes (a multiple of 4 KiB; `len` a
    /// multiple of `page`, `base` of 4 KiB) and protects all of it, in `mode`. Fails when the
    /// kernel lacks that mode of write protection for this memory (older kernels,
    /// userfaultfd disallowed; [`WatchMode::Notified`] also without the privilege for it).
    pub fn new(base: *const u8, len: usize, page: usize, mode: WatchMode) -> io::Result<Self> {
        let (base, len, page) = (base as u64, len as u64, page as u64);
        if page == 0 || page % 4096 != 0 || base % 4096 != 0 || len % page != 0 || len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a write watch needs a 4 KiB-aligned range of whole pages of a multiple of 4 KiB (base {base:#x}, {len} bytes, page {page})"
                ),
            ));
        }
        let backend = match mode {
            WatchMode::Notified => Backend::Notified(WriteLog::new(base, len, page)?),
            WatchMode::Scanned => {
                let uffd = sys::open_async_wp_uffd()?;
                sys::register_wp(&uffd, base, len)?;
                Backend::Scanned {
                    uffd,
                    pagemap: sys::open_pagemap()?,
                }
            }
        };
        let w = WriteWatch {
            backend,
            base,
            len,
            page,
        };
        if mode == WatchMode::Scanned {
            w.protect(0..w.pages())?;
        }
        Ok(w)
    }

    /// The mode in force.
    pub fn mode(&self) -> WatchMode {
        match self.backend {
            Backend::Scanned { .. } => WatchMode::Scanned,
            Backend::Notified(_) => WatchMode::Notified,
        }
    }

    /// The handler's record of a notified watch.
    pub fn log(&self) -> Option<&WriteLog> {
        match &self.backend {
            Backend::Notified(log) => Some(log),
            Backend::Scanned { .. } => None,
        }
    }

    /// Pages watched.
    pub fn pages(&self) -> usize {
        usize::try_from(self.len / self.page).unwrap_or(usize::MAX)
    }

    fn bytes(&self, pages: &Range<usize>) -> (u64, u64) {
        (
            self.base + pages.start as u64 * self.page,
            self.base + (pages.end as u64 * self.page).min(self.len),
        )
    }

    fn check(&self, pages: &Range<usize>) -> io::Result<()> {
        if pages.start > pages.end || pages.end > self.pages() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "pages {pages:?} are outside the watch of {} pages: pass a range within 0..{}",
                    self.pages(),
                    self.pages()
                ),
            ));
        }
        Ok(())
    }

    /// Protects `pages` again: their next write is seen. Callers read the pages' data only
    /// after this (a write racing with it lands before, or is seen next time).
    pub fn protect(&self, pages: Range<usize>) -> io::Result<()> {
        self.check(&pages)?;
        if pages.is_empty() {
            return Ok(());
        }
        match &self.backend {
            Backend::Notified(log) => log.protect(pages),
            Backend::Scanned { uffd, .. } => {
                let (start, end) = self.bytes(&pages);
                sys::write_protect(uffd, start, end - start, true)
            }
        }
    }

    /// The pages of `pages` the CPU wrote since they were last protected, ascending. Scanned:
    /// one thread walks the page table (about 1 ns per 4 KiB: 0.3 ms per GiB in a probe on
    /// an H200 host; the sync step took 1.5 ms per GiB there with the walk split over 8
    /// threads). Notified: the records are read, nothing is walked.
    pub fn written_pages(&self, pages: Range<usize>) -> io::Result<Vec<usize>> {
        self.check(&pages)?;
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        match &self.backend {
            Backend::Notified(log) => log.written(pages),
            Backend::Scanned { pagemap, .. } => self.scan(pagemap, pages),
        }
    }

    /// For each page of `pages`, whether the CPU wrote it since it was last protected.
    pub fn written(&self, pages: Range<usize>) -> io::Result<Vec<bool>> {
        let mut out = vec![false; pages.len()];
        for p in self.written_pages(pages.clone())? {
            out[p - pages.start] = true;
        }
        Ok(out)
    }

    /// The written pages of `pages` by `PAGEMAP_SCAN`.
    fn scan(&self, pagemap: &OwnedFd, pages: Range<usize>) -> io::Result<Vec<usize>> {
        let (mut at, end) = self.bytes(&pages);
        let mut regions = vec![sys::PageRegion::default(); REGIONS_PER_SCAN];
        let mut out: Vec<usize> = Vec::new();
        let index = |a: u64| usize::try_from((a - self.base) / self.page).unwrap_or(usize::MAX);
        while at < end {
            let (n, walk_end) = sys::scan_written(pagemap, at, end, &mut regions)?;
            for r in &regions[..n] {
                let a = index(r.start.max(at)).max(pages.start);
                let b = index(r.end.min(end) + self.page - 1).min(pages.end);
                // Regions are ascending; a page split over two regions is listed once.
                let a = out.last().map_or(a, |&l| a.max(l + 1));
                out.extend(a..b);
            }
            if walk_end <= at {
                return Err(io::Error::other(
                    "PAGEMAP_SCAN made no progress over the watched range",
                ));
            }
            at = walk_end;
        }
        Ok(out)
    }
}

impl Drop for WriteWatch {
    fn drop(&mut self) {
        // Un-protect before the descriptor closes (closing unregisters the range; pages left
        // protected would then be writable anyway, this only keeps the state tidy). A
        // notified watch's log does this itself, before stopping its handler.
        if let Backend::Scanned { uffd, .. } = &self.backend {
            let _ = sys::write_protect(uffd, self.base, self.len, false);
        }
    }
}

/// Test memory: a shared anonymous mapping (shmem, like the CUDA driver's pinned host memory).
#[cfg(test)]
pub(crate) mod test_memory {
    /// A populated shared anonymous mapping, unmapped on drop.
    pub(crate) struct Shared {
        pub(crate) ptr: *mut u8,
        pub(crate) len: usize,
    }
    impl Shared {
        pub(crate) fn new(len: usize) -> Self {
            // SAFETY: a fresh anonymous shared mapping; checked for MAP_FAILED below.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(ptr, libc::MAP_FAILED);
            let s = Shared {
                ptr: ptr.cast(),
                len,
            };
            s.bytes().fill(1); // populate, as pinned memory is
            s
        }
        #[allow(clippy::mut_from_ref)]
        pub(crate) fn bytes(&self) -> &mut [u8] {
            // SAFETY: the mapping is `len` bytes, alive until drop; tests use it from one thread.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }
    }
    impl Drop for Shared {
        fn drop(&mut self) {
            // SAFETY: unmaps exactly the mapping made in `new`.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    /// Ends the test process if `f` takes longer than `limit` (a write blocked for good on a
    /// fault nobody serves would otherwise hang the test run).
    pub(crate) fn with_deadline<T>(
        limit: std::time::Duration,
        what: &str,
        f: impl FnOnce() -> T,
    ) -> T {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&done);
        let what = what.to_string();
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while t0.elapsed() < limit {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            eprintln!("{what}: still running after {limit:?} (a write never served?): aborting");
            std::process::abort();
        });
        let out = f();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        out
    }

    /// `writers` threads write unique 8-byte values at random places of `mem` (pages of
    /// `page` bytes), in bursts, for `run` (and at least 20 syncs), while this thread calls
    /// `sync` (which returns the pages it
    /// found written, ascending, and protects them again) in a loop; then one last `sync`.
    /// Checks that every write shows up in a sync that ran while it was made or the next one:
    /// from the first sync not finished when the write began to the one after the last sync
    /// not finished when it completed. Returns (writes checked, syncs).
    pub(crate) fn no_concurrent_write_is_lost(
        mem: &Shared,
        page: usize,
        writers: u64,
        run: std::time::Duration,
        seed: u64,
        mut sync: impl FnMut(usize) -> Vec<usize>,
    ) -> (usize, usize) {
        use rand::{Rng, SeedableRng};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
        let pages = mem.len / page;
        let base = mem.ptr as usize;
        let (epoch, stop) = (AtomicUsize::new(0), AtomicBool::new(false));
        let mut sets: Vec<Vec<usize>> = Vec::new();
        let logs = std::thread::scope(|s| {
            let handles: Vec<_> = (0..writers)
                .map(|w| {
                    let (epoch, stop) = (&epoch, &stop);
                    s.spawn(move || {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ w);
                        let mut log = Vec::new();
                        let mut n = 0u64;
                        while !stop.load(SeqCst) {
                            let p = rng.random_range(0..pages);
                            let at = base + p * page + rng.random_range(0..page / 8) * 8;
                            n += 1;
                            let e0 = epoch.load(SeqCst);
                            // SAFETY: `at` is an 8-byte-aligned address inside the mapping,
                            // which outlives the scope; the value is unique to this write.
                            unsafe { std::ptr::write_volatile(at as *mut u64, (w << 48) | n) };
                            let e1 = epoch.load(SeqCst);
                            log.push((p, e0, e1));
                            // Bursts and pauses: syncs find few pages or many.
                            if n.is_multiple_of(64) {
                                let pause = rng.random_range(0..2000);
                                std::thread::sleep(std::time::Duration::from_micros(pause));
                            }
                        }
                        log
                    })
                })
                .collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let t0 = std::time::Instant::now();
            // At least `run` and 20 syncs, at most ten times `run`.
            while (t0.elapsed() < run || sets.len() < 20) && t0.elapsed() < 10 * run {
                sets.push(sync(sets.len()));
                epoch.fetch_add(1, SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(rng.random_range(0..2000)));
            }
            stop.store(true, SeqCst);
            let logs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            sets.push(sync(sets.len()));
            logs
        });
        let mut checked = 0;
        for (w, log) in logs.iter().enumerate() {
            for &(p, e0, e1) in log {
                // Sync e1 may have listed the pages before the write landed (then the write
                // is for sync e1 + 1); the last sync ran after every write.
                let last = (e1 + 1).min(sets.len() - 1);
                assert!(
                    (e0..=last).any(|s| sets[s].binary_search(&p).is_ok()),
                    "writer {w}: a write to page {p} made while syncs {e0}..={e1} ran was in none of syncs {e0}..={last} (seed {seed})"
                );
                checked += 1;
            }
        }
        (checked, sets.len())
    }
}

#[cfg(test)]
mod tests {
    use super::test_memory::Shared;
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn finds_exactly_the_written_pages_and_protects_again() {
        for mode in [WatchMode::Scanned, WatchMode::Notified] {
            finds_exactly_the_written_pages_in(mode);
        }
    }

    fn finds_exactly_the_written_pages_in(mode: WatchMode) {
        let seed: u64 = rand::random();
        println!("{mode:?}: seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let page = 16 << 10;
        let pages = 512;
        let mem = Shared::new(page * pages);
        let w = match WriteWatch::new(mem.ptr, mem.len, page, mode) {
            Ok(w) => w,
            Err(e) => {
                println!("skipped: no {mode:?} write protection here ({e})");
                return;
            }
        };
        assert_eq!(w.mode(), mode);
        assert!(w.written(0..pages).unwrap().iter().all(|&x| !x));
        for round in 0..3 {
            let mut want = vec![false; pages];
            for _ in 0..rng.random_range(1..60) {
                let p = rng.random_range(0..pages);
                want[p] = true;
                let at = p * page + rng.random_range(0..page);
                mem.bytes()[at] = mem.bytes()[at].wrapping_add(1);
            }
            // Reads are not writes.
            let s: u64 = mem.bytes().iter().map(|&b| u64::from(b)).sum();
            assert!(s > 0);
            assert_eq!(w.written(0..pages).unwrap(), want, "round {round}");
            let listed: Vec<usize> = (0..pages).filter(|&p| want[p]).collect();
            assert_eq!(w.written_pages(0..pages).unwrap(), listed, "round {round}");
            // A sub-range reports its own pages.
            assert_eq!(w.written(100..300).unwrap(), want[100..300].to_vec());
            // A system call writing the memory is seen too.
            let p = rng.random_range(0..pages);
            let f = std::fs::File::open("/dev/urandom").unwrap();
            // SAFETY: reads 64 bytes into the mapping at page p, inside it.
            let got = unsafe {
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    mem.ptr.add(p * page + 8).cast(),
                    64,
                )
            };
            assert_eq!(got, 64);
            assert!(w.written(p..p + 1).unwrap()[0], "read(2) into page {p}");
            w.protect(0..pages).unwrap();
            assert!(w.written(0..pages).unwrap().iter().all(|&x| !x));
        }
    }

    #[test]
    fn bad_geometry_and_ranges_are_refused() {
        let mem = Shared::new(64 << 10);
        for mode in [WatchMode::Scanned, WatchMode::Notified] {
            for (len, page) in [(0, 4096), (64 << 10, 1000), (6000, 4096), (64 << 10, 0)] {
                let e = WriteWatch::new(mem.ptr, len, page, mode).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{len} {page}");
                assert!(e.to_string().contains("4 KiB-aligned"), "{e}");
            }
            // SAFETY: one byte past the start: a misaligned address, refused before any use.
            let misaligned = unsafe { mem.ptr.add(1) };
            let e = WriteWatch::new(misaligned, 4096, 4096, mode).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            let Ok(w) = WriteWatch::new(mem.ptr, mem.len, 4096, mode) else {
                println!("skipped {mode:?}: unavailable here");
                continue;
            };
            for bad in [0..17, 16..17, 20..30] {
                let e = w.written_pages(bad.clone()).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
                assert!(e.to_string().contains("within 0..16"), "{e}");
                let e = w.protect(bad.clone()).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            }
            #[allow(clippy::reversed_empty_ranges)]
            let backwards = 5..3;
            assert!(w.written_pages(backwards).is_err());
            // Nothing was protected or lost by the refusals.
            assert!(w.written_pages(0..16).unwrap().is_empty());
            mem.bytes()[5 * 4096] ^= 1;
            assert_eq!(w.written_pages(0..16).unwrap(), vec![5]);
        }
    }

    /// Several threads write while another syncs (lists and protects again) in a loop: in
    /// both modes, every write is in the sync that ran during it or the next one.
    #[test]
    fn writes_racing_with_syncs_are_never_lost() {
        use super::test_memory::{no_concurrent_write_is_lost, with_deadline};
        for mode in [WatchMode::Notified, WatchMode::Scanned] {
            let seed: u64 = rand::random();
            println!("{mode:?}: seed {seed}");
            let page = 8192;
            let mem = Shared::new(page * 1024);
            let Ok(w) = WriteWatch::new(mem.ptr, mem.len, page, mode) else {
                println!("skipped {mode:?}: unavailable here");
                continue;
            };
            let (writes, syncs) = with_deadline(
                std::time::Duration::from_secs(60),
                "writes_racing_with_syncs_are_never_lost",
                || {
                    no_concurrent_write_is_lost(
                        &mem,
                        page,
                        3,
                        std::time::Duration::from_millis(700),
                        seed,
                        |_| {
                            let found = w.written_pages(0..1024).unwrap();
                            for &p in &found {
                                w.protect(p..p + 1).unwrap();
                            }
                            found
                        },
                    )
                },
            );
            println!("{mode:?}: {writes} writes by 3 threads over {syncs} syncs, none lost");
            assert!(
                writes > 100 && syncs >= 20,
                "{writes} writes, {syncs} syncs"
            );
            // A fault message read after the last sync may list its page once more (see
            // write_log): one more sync drains that.
            std::thread::sleep(std::time::Duration::from_millis(50));
            for p in w.written_pages(0..1024).unwrap() {
                w.protect(p..p + 1).unwrap();
            }
            assert!(w.written_pages(0..1024).unwrap().is_empty(), "all taken");
        }
    }

    /// Writes made by the kernel on the process's behalf through its page tables
    /// (`process_vm_writev`) are seen in both modes. A write through `/proc/self/mem` (how
    /// debuggers poke memory) is seen in scanned mode; in notified mode the kernel refuses it
    /// (EIO: that path cannot wait for a handler) and nothing changes. Either way a write
    /// is seen or visibly refused, never silently missed.
    #[test]
    fn writes_by_the_kernel_are_seen_or_refused() {
        use super::test_memory::with_deadline;
        use std::os::unix::fs::FileExt;
        for mode in [WatchMode::Scanned, WatchMode::Notified] {
            let seed: u64 = rand::random();
            println!("{mode:?}: seed {seed}");
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let page = 4096;
            let pages = 32;
            let mem = Shared::new(page * pages);
            let Ok(w) = WriteWatch::new(mem.ptr, mem.len, page, mode) else {
                println!("skipped {mode:?}: unavailable here");
                continue;
            };
            with_deadline(std::time::Duration::from_secs(30), "kernel writes", || {
                let (a, b) = (
                    rng.random_range(0..pages / 2),
                    rng.random_range(pages / 2..pages),
                );
                let data = [0xa5u8; 16];
                let local = libc::iovec {
                    iov_base: data.as_ptr().cast_mut().cast(),
                    iov_len: data.len(),
                };
                let remote = libc::iovec {
                    // SAFETY: an address inside the mapping (page a < pages), only passed on.
                    iov_base: unsafe { mem.ptr.add(a * page + 8) }.cast(),
                    iov_len: data.len(),
                };
                // SAFETY: one local and one remote iovec, both live and 16 bytes long, in this
                // process.
                let n =
                    unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
                assert_eq!(n, 16, "{mode:?}: {}", io::Error::last_os_error());
                assert_eq!(w.written_pages(0..pages).unwrap(), vec![a], "{mode:?}");
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open("/proc/self/mem")
                    .unwrap();
                let before = mem.bytes()[b * page];
                let wrote = f.write_at(&data, mem.ptr as u64 + (b * page) as u64);
                let listed = w.written_pages(0..pages).unwrap();
                println!("{mode:?}: /proc/self/mem write {wrote:?}, listed {listed:?}");
                match wrote {
                    Ok(16) => assert_eq!(listed, vec![a, b], "{mode:?}"),
                    _ => {
                        assert_eq!(
                            mem.bytes()[b * page],
                            before,
                            "{mode:?}: refused, unchanged"
                        );
                        assert_eq!(listed, vec![a], "{mode:?}");
                    }
                }
            });
        }
    }
}
