//! Raw system calls of the stores: an `io_uring` that writes (or reads) a batch of positioned
//! buffers to (from) one file with one system call.
//!
//! Why: on a virtual disk a synchronous `O_DIRECT` `pwrite` of 4 KiB costs about 28 us of CPU
//! (system time: the block layer, the virtio doorbell, the completion interrupt and the
//! wake-up), and an eviction batch of scattered pages is dozens of them, one after another,
//! each waiting the disk's full latency. Queued together they cost about 4 us of CPU each and
//! the disk serves them in parallel (`fio` on the benchmark VM: 16 k writes/s one at a time,
//! 90 k/s 64 at a time).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use io_uring::{IoUring, opcode, types};

/// Entries of one ring: an evictor's batch (64 pages) fits in one submission.
const RING_ENTRIES: u32 = 64;

/// How long to keep retrying a wait for writes the kernel already holds before giving up on
/// the process (see [`WriteRing::write_many`]).
const STUCK_WAIT: Duration = Duration::from_secs(10);

/// One `io_uring` used for batches of writes, by one thread at a time.
pub(super) struct WriteRing {
    ring: IoUring,
    /// Entries were queued that never reached the kernel: the ring must be dropped (which
    /// discards them) rather than used again, or a later submission would send them.
    broken: bool,
}

impl std::fmt::Debug for WriteRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteRing").finish_non_exhaustive()
    }
}

impl WriteRing {
    /// A new ring, or the reason the kernel refused one (too old, `io_uring_disabled`,
    /// a seccomp filter, the locked-memory limit): callers then write one request at a time.
    pub(super) fn new() -> io::Result<Self> {
        Ok(Self {
            ring: IoUring::new(RING_ENTRIES)?,
            broken: false,
        })
    }

    /// Whether the ring must be dropped instead of used again.
    pub(super) fn is_broken(&self) -> bool {
        self.broken
    }

    /// The longest request a ring entry can carry; longer ones are written without the ring.
    pub(super) const MAX_REQUEST: usize = 1 << 30;

    /// Writes every `(offset, bytes)` of `requests` to `fd` at once and returns, for each, how
    /// many bytes the kernel wrote (possibly fewer than asked: the caller finishes the rest)
    /// or its error. Every request is complete (or failed) when this returns, so the borrowed
    /// buffers are free again. Requests must be at most [`WriteRing::MAX_REQUEST`] bytes.
    pub(super) fn write_many(
        &mut self,
        fd: BorrowedFd<'_>,
        requests: &[(u64, &[u8])],
    ) -> Vec<io::Result<usize>> {
        self.run_many(requests.len(), |i| {
            let (offset, bytes) = requests[i];
            let len = u32::try_from(bytes.len()).expect("requests are at most MAX_REQUEST");
            opcode::Write::new(types::Fd(fd.as_raw_fd()), bytes.as_ptr(), len)
                .offset(offset)
                .build()
        })
    }

    /// Reads every `(offset, buffer)` of `requests` from `fd` at once and returns, for each,
    /// how many bytes the kernel read (possibly fewer: the caller finishes the rest) or its
    /// error; as [`WriteRing::write_many`], every read is complete when this returns.
    pub(super) fn read_many(
        &mut self,
        fd: BorrowedFd<'_>,
        requests: &mut [(u64, &mut [u8])],
    ) -> Vec<io::Result<usize>> {
        let targets: Vec<(u64, *mut u8, u32)> = requests
            .iter_mut()
            .map(|(offset, buf)| {
                let len = u32::try_from(buf.len()).expect("requests are at most MAX_REQUEST");
                (*offset, buf.as_mut_ptr(), len)
            })
            .collect();
        self.run_many(targets.len(), |i| {
            let (offset, ptr, len) = targets[i];
            opcode::Read::new(types::Fd(fd.as_raw_fd()), ptr, len)
                .offset(offset)
                .build()
        })
    }

    /// Queues `count` entries (`entry(i)` builds the i-th, over buffers the caller borrows
    /// for the whole call) a ring load at a time, and returns each entry's result.
    fn run_many(
        &mut self,
        count: usize,
        entry: impl Fn(usize) -> io_uring::squeue::Entry,
    ) -> Vec<io::Result<usize>> {
        let mut results: Vec<io::Result<usize>> = Vec::with_capacity(count);
        results.resize_with(count, || Ok(0));
        let chunk = RING_ENTRIES as usize;
        let mut base = 0;
        while base < count {
            let end = (base + chunk).min(count);
            let mut queued = 0usize;
            {
                let mut sq = self.ring.submission();
                for i in base..end {
                    let e = entry(i).user_data(i as u64);
                    // SAFETY: the buffers are borrowed by the caller for this whole call and
                    // the call returns only once the kernel has completed every entry it took
                    // (below), so they outlive the transfer; so is the descriptor.
                    if unsafe { sq.push(&e) }.is_err() {
                        break; // cannot happen: the ring holds a whole chunk and starts empty
                    }
                    queued += 1;
                }
            }
            for r in &mut results[base + queued..end] {
                *r = Err(io::Error::other("the io_uring submission queue was full"));
            }
            if let Err(e) = self.complete(queued) {
                for r in &mut results[base..] {
                    *r = Err(io::Error::new(e.kind(), e.to_string()));
                }
                break;
            }
            for cqe in self.ring.completion() {
                let Ok(i) = usize::try_from(cqe.user_data()) else {
                    continue;
                };
                if let Some(slot) = results.get_mut(i) {
                    *slot = usize::try_from(cqe.result())
                        .map_err(|_| io::Error::from_raw_os_error(-cqe.result()));
                }
            }
            base = end;
        }
        results
    }

    /// Submits the `queued` entries and waits until all of them have completed. An error
    /// means none of them reached the kernel (the ring is then broken: dropping it discards
    /// them) or the
    /// wait for those it holds could not go on; the latter ends the process, because returning
    /// while the kernel may still read the buffers could write bytes the caller has reused.
    fn complete(&mut self, queued: usize) -> io::Result<()> {
        let mut submitted = 0usize;
        let started = std::time::Instant::now();
        loop {
            let done = self.ring.completion().len();
            if submitted == queued && done >= queued {
                return Ok(());
            }
            match self.ring.submit_and_wait(queued - done) {
                Ok(n) => submitted += n,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) if submitted == 0 => {
                    // Nothing reached the kernel; no later submission may send these buffers,
                    // which this call stops borrowing.
                    self.broken = true;
                    return Err(e);
                }
                Err(e) => {
                    if started.elapsed() > STUCK_WAIT {
                        eprintln!(
                            "strata-core: io_uring cannot wait for {queued} queued requests: {e}; \
                             stopping rather than let them write reused memory"
                        );
                        std::process::abort();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}
