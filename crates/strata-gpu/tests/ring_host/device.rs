//! A GPU emulated by host threads that follows the device side of `ring::layout` exactly:
//! tickets from an atomic tail, bounded waits for room, entry fields then `seq` last with
//! release; seqlock reads of host-cache slots; READ posts re-posted when the page's generation
//! moves on while it stays absent; WRITEs through staging pages, waiting on `done`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use strata_gpu::ring::SharedRing;
use strata_gpu::ring::layout::{REQ_READ, REQ_READ_AHEAD, REQ_WRITE, SlotWord};

/// Why a device access failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// A bounded wait ran out (what was awaited, page).
    Timeout(&'static str, u64),
    /// The page's slot word says ERROR.
    Error(u64),
}

/// Waits with back-off: spin, yield, then short sleeps.
struct Backoff {
    n: u32,
    deadline: Instant,
}

impl Backoff {
    fn new(limit: Duration) -> Self {
        Backoff {
            n: 0,
            deadline: Instant::now() + limit,
        }
    }

    fn wait(&mut self, what: &'static str, page: u64) -> Result<(), DeviceError> {
        if Instant::now() > self.deadline {
            return Err(DeviceError::Timeout(what, page));
        }
        self.n += 1;
        match self.n {
            0..32 => std::hint::spin_loop(),
            32..48 => std::thread::yield_now(),
            _ => std::thread::sleep(Duration::from_micros(20 << ((self.n - 48) / 8).min(3))),
        }
        Ok(())
    }
}

/// The emulated device. Share it among threads.
#[derive(Debug)]
pub struct Device {
    pub shared: Arc<SharedRing>,
    tail: AtomicU64,
    limit: Duration,
    /// READ requests posted (hits post none).
    pub reads_posted: AtomicU64,
    /// Per ring index: the last WRITE ticket posted there, + 1 (0: none).
    last_write: Box<[AtomicU64]>,
    /// Posts that found `head` past an earlier WRITE ticket of their staging page whose `done`
    /// was not yet stored: the host would have let the device overwrite a page it had not
    /// copied yet. Must stay 0.
    pub staging_overtaken: AtomicU64,
}

impl Device {
    pub fn new(shared: Arc<SharedRing>, limit: Duration) -> Self {
        let shared_capacity = shared.capacity();
        Device {
            shared,
            tail: AtomicU64::new(0),
            limit,
            reads_posted: AtomicU64::new(0),
            last_write: (0..shared_capacity).map(|_| AtomicU64::new(0)).collect(),
            staging_overtaken: AtomicU64::new(0),
        }
    }

    /// Posts a request; returns its ticket.
    pub fn post(&self, kind: u32, page: u64, data: Option<&[u8]>) -> Result<u64, DeviceError> {
        let r = &self.shared;
        let t = self.tail.fetch_add(1, Ordering::AcqRel);
        let cap = u64::from(r.capacity());
        let mut b = Backoff::new(self.limit);
        while t - r.head().load(Ordering::Acquire) >= cap {
            b.wait("room in the ring", page)?;
        }
        let i = r.ring_index(t);
        // An earlier WRITE at this index: head passed it, so its copy must be done.
        let earlier = self.last_write[i as usize].load(Ordering::Acquire);
        if earlier != 0 && earlier <= t && r.done(i).load(Ordering::Acquire) < earlier {
            self.staging_overtaken.fetch_add(1, Ordering::Relaxed);
        }
        if kind == REQ_WRITE {
            self.last_write[i as usize].fetch_max(t + 1, Ordering::AcqRel);
        }
        if let Some(d) = data {
            // SAFETY: ticket t is ours, unpublished, and head passed t - capacity.
            unsafe { r.copy_to_staging(i, d) };
        }
        r.entry_page(i).store(page, Ordering::Relaxed);
        r.entry_kind(i).store(kind, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        r.entry_seq(i).store(t + 1, Ordering::Release);
        Ok(t)
    }

    /// Reads page `page` (a whole page; bytes past the space's end come back as the slot has
    /// them, which must be zeros).
    pub fn read(&self, page: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        let r = &self.shared;
        let word = r.slot_word(page);
        let mut posted: Option<u32> = None;
        let mut b = Backoff::new(self.limit);
        loop {
            let w = word.load(Ordering::Acquire);
            let d = SlotWord::decode(w);
            if d.present {
                // SAFETY: a seqlock read: the copy is kept only if the word did not change.
                unsafe { r.copy_from_slot(d.slot, out) };
                fence(Ordering::Acquire);
                if word.load(Ordering::Relaxed) == w {
                    r.slot_ref(d.slot).store(1, Ordering::Relaxed);
                    return Ok(());
                }
                continue;
            }
            if d.error {
                return Err(DeviceError::Error(page));
            }
            if posted != Some(d.generation) {
                self.post(REQ_READ, page, None)?;
                self.reads_posted.fetch_add(1, Ordering::Relaxed);
                posted = Some(d.generation);
            }
            b.wait("the slot word", page)?;
        }
    }

    /// Asks the host to read a page ahead (nobody waits).
    pub fn read_ahead(&self, page: u64) -> Result<(), DeviceError> {
        self.post(REQ_READ_AHEAD, page, None).map(|_| ())
    }

    /// Writes page `page` (a whole page) and waits until the host has it.
    pub fn write(&self, page: u64, data: &[u8]) -> Result<(), DeviceError> {
        let t = self.post(REQ_WRITE, page, Some(data))?;
        self.wait_done(t, page)
    }

    /// Waits until the host stored `done` for WRITE ticket `t` (of `page`).
    pub fn wait_done(&self, t: u64, page: u64) -> Result<(), DeviceError> {
        let r = &self.shared;
        let done = r.done(r.ring_index(t));
        let mut b = Backoff::new(self.limit);
        while done.load(Ordering::Acquire) < t + 1 {
            b.wait("done", page)?;
        }
        Ok(())
    }
}
