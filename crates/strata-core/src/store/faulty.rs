//! `FaultyStore`: a wrapper that makes any store misbehave on purpose, for tests.
//!
//! Pagers, GPU tiers and codecs promise to lose nothing and hang nowhere when their store
//! fails. `FaultyStore` lets a test hold them to it: wrapped around any [`Store`], it injects,
//! with chosen probabilities, errors, short (partial) reads and writes, slow operations,
//! hangs, and the store's death in the middle of a batch. Every decision comes from a seeded
//! generator, so a failing run replays with the same seed (given the same order of calls).
//!
//! What each fault does, precisely:
//! - **error**: the operation does nothing and returns [`StoreError::Unavailable`].
//! - **short**: a read fills only the first half of the buffer, a write stores only the first
//!   half of its bytes (a torn write), then either returns `Unavailable`. The caller must
//!   treat the whole range as unknown.
//! - **slow**: the operation waits [`FaultPlan::slow_for`] and then succeeds.
//! - **hang**: the operation blocks until [`FaultyStore::release_hangs`] or for at most
//!   [`FaultPlan::hang_for`], then fails with `Unavailable` (as a remote store's timeout
//!   would). No operation ever blocks longer than `hang_for`: that is the documented bound.
//! - **death mid-batch**: a `read_batch` or `write_batch` serves some of its requests, then
//!   the store dies: that call and every later one fail until [`FaultyStore::revive`].
//!
//! ```
//! use std::sync::Arc;
//! use strata_core::store::{FaultPlan, FaultyStore};
//! use strata_core::{MemoryStore, Store};
//!
//! let store = FaultyStore::new(Arc::new(MemoryStore::new(1 << 20)), 42);
//! store.set_plan(FaultPlan { write_error: 1.0, ..FaultPlan::default() })?;
//! assert!(store.write_at(0, &[1, 2, 3]).is_err());
//! store.heal();
//! store.write_at(0, &[1, 2, 3])?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::{ReadRequest, Store, StoreError};

/// Which faults to inject and how often. Probabilities are per operation, in `0.0..=1.0`;
/// the default injects nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultPlan {
    /// Reads that fail outright.
    pub read_error: f64,
    /// Writes that fail outright.
    pub write_error: f64,
    /// Store flushes that fail.
    pub flush_error: f64,
    /// Reads that fill only half their buffer, then fail.
    pub short_read: f64,
    /// Writes that store only half their bytes, then fail.
    pub short_write: f64,
    /// Operations (read, write or flush) that take [`FaultPlan::slow_for`] longer.
    pub slow: f64,
    /// How long a slow operation waits.
    pub slow_for: Duration,
    /// Reads that hang, then fail.
    pub read_hang: f64,
    /// Writes that hang, then fail.
    pub write_hang: f64,
    /// Store flushes that hang, then fail.
    pub flush_hang: f64,
    /// The longest a hang lasts before the operation fails.
    pub hang_for: Duration,
    /// Batch calls during which the store dies (after serving part of the batch).
    pub die_mid_batch: f64,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self {
            read_error: 0.0,
            write_error: 0.0,
            flush_error: 0.0,
            short_read: 0.0,
            short_write: 0.0,
            slow: 0.0,
            slow_for: Duration::from_millis(1),
            read_hang: 0.0,
            write_hang: 0.0,
            flush_hang: 0.0,
            hang_for: Duration::from_millis(100),
            die_mid_batch: 0.0,
        }
    }
}

/// A [`FaultPlan`] that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("fault probability {name} = {value} is not in 0..=1; give a probability between 0 and 1")]
pub struct FaultPlanError {
    /// The field.
    pub name: &'static str,
    /// Its value.
    pub value: f64,
}

impl FaultPlan {
    fn check(&self) -> Result<(), FaultPlanError> {
        for (name, value) in [
            ("read_error", self.read_error),
            ("write_error", self.write_error),
            ("flush_error", self.flush_error),
            ("short_read", self.short_read),
            ("short_write", self.short_write),
            ("slow", self.slow),
            ("read_hang", self.read_hang),
            ("write_hang", self.write_hang),
            ("flush_hang", self.flush_hang),
            ("die_mid_batch", self.die_mid_batch),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultPlanError { name, value });
            }
        }
        Ok(())
    }
}

/// How many faults of each kind were injected so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Operations failed outright (including flushes and calls on a dead store).
    pub errors: u64,
    /// Short reads and writes.
    pub short: u64,
    /// Slow operations.
    pub slow: u64,
    /// Hangs.
    pub hangs: u64,
    /// Deaths in the middle of a batch.
    pub deaths: u64,
}

#[derive(Debug, Default)]
struct Counters {
    errors: AtomicU64,
    short: AtomicU64,
    slow: AtomicU64,
    hangs: AtomicU64,
    deaths: AtomicU64,
}

/// A store that injects faults into another. See the module documentation.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    plan: RwLock<FaultPlan>,
    /// splitmix64 state, advanced atomically so threads never share a draw.
    rng: AtomicU64,
    dead: AtomicBool,
    /// Hangs wait on this; `release_hangs` bumps the generation they started in.
    hang_generation: Mutex<u64>,
    hang_released: Condvar,
    counts: Counters,
}

#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
    Flush,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
        }
    }
}

impl FaultyStore {
    /// Wraps `inner`, injecting nothing until [`FaultyStore::set_plan`]. `seed` chooses the
    /// sequence of random decisions.
    pub fn new(inner: Arc<dyn Store>, seed: u64) -> Self {
        Self {
            inner,
            plan: RwLock::new(FaultPlan::default()),
            rng: AtomicU64::new(seed),
            dead: AtomicBool::new(false),
            hang_generation: Mutex::new(0),
            hang_released: Condvar::new(),
            counts: Counters::default(),
        }
    }

    /// The wrapped store (to check what really reached it).
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// Injects faults from now on as `plan` says. A plan with a probability outside `0..=1`
    /// is refused and the old one kept.
    pub fn set_plan(&self, plan: FaultPlan) -> Result<(), FaultPlanError> {
        plan.check()?;
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = plan;
        Ok(())
    }

    /// The plan in force.
    pub fn plan(&self) -> FaultPlan {
        self.plan.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops injecting faults, revives a dead store and ends every hang in progress.
    pub fn heal(&self) {
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = FaultPlan::default();
        self.revive();
        self.release_hangs();
    }

    /// Kills the store: every operation fails until [`FaultyStore::revive`].
    pub fn kill(&self) {
        self.dead.store(true, Ordering::Release);
    }

    /// Brings a dead store back.
    pub fn revive(&self) {
        self.dead.store(false, Ordering::Release);
    }

    /// Whether the store is dead.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Ends every hang in progress now (each fails as it would at its deadline).
    pub fn release_hangs(&self) {
        let mut generation = self
            .hang_generation
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *generation = generation.wrapping_add(1);
        self.hang_released.notify_all();
    }

    /// Faults injected so far.
    pub fn injected(&self) -> FaultCounts {
        let c = &self.counts;
        FaultCounts {
            errors: c.errors.load(Ordering::Relaxed),
            short: c.short.load(Ordering::Relaxed),
            slow: c.slow.load(Ordering::Relaxed),
            hangs: c.hangs.load(Ordering::Relaxed),
            deaths: c.deaths.load(Ordering::Relaxed),
        }
    }

    /// True with probability `p`.
    fn roll(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits as a fraction in [0, 1).
        #[allow(clippy::cast_precision_loss)] // 53 bits fit an f64 exactly
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        unit < p
    }

    fn fail(&self, op: Op, why: &str) -> StoreError {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        StoreError::Unavailable {
            store: self.describe(),
            reason: format!("injected {} fault: {why}", op.name()),
        }
    }

    /// Applies the faults common to every operation: death, slowness, a hang, an error.
    fn before(&self, op: Op, plan: &FaultPlan) -> Result<(), StoreError> {
        if self.is_dead() {
            return Err(self.fail(op, "the store is dead"));
        }
        if self.roll(plan.slow) {
            self.counts.slow.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(plan.slow_for);
        }
        let (hang, error) = match op {
            Op::Read => (plan.read_hang, plan.read_error),
            Op::Write => (plan.write_hang, plan.write_error),
            Op::Flush => (plan.flush_hang, plan.flush_error),
        };
        if self.roll(hang) {
            self.counts.hangs.fetch_add(1, Ordering::Relaxed);
            self.hang(plan.hang_for);
            return Err(self.fail(op, "it hung and timed out"));
        }
        if self.roll(error) {
            return Err(self.fail(op, "error"));
        }
        Ok(())
    }

    /// Blocks for at most `limit`, or until `release_hangs`.
    fn hang(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut generation = self
            .hang_generation
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let started_in = *generation;
        while *generation == started_in {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            generation = self
                .hang_released
                .wait_timeout(generation, left)
                .map_or_else(|e| e.into_inner().0, |r| r.0);
        }
    }
}

impl Store for FaultyStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let plan = self.plan();
        self.before(Op::Read, &plan)?;
        if buf.len() > 1 && self.roll(plan.short_read) {
            self.counts.short.fetch_add(1, Ordering::Relaxed);
            let half = buf.len() / 2;
            self.inner.read_at(offset, &mut buf[..half])?;
            return Err(self.fail(Op::Read, "short read (half the bytes)"));
        }
        self.inner.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let plan = self.plan();
        self.before(Op::Write, &plan)?;
        if buf.len() > 1 && self.roll(plan.short_write) {
            self.counts.short.fetch_add(1, Ordering::Relaxed);
            self.inner.write_at(offset, &buf[..buf.len() / 2])?;
            return Err(self.fail(Op::Write, "short write (half the bytes stored)"));
        }
        self.inner.write_at(offset, buf)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let plan = self.plan();
        self.before(Op::Flush, &plan)?;
        self.inner.flush()
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        let dies = self.roll(self.plan().die_mid_batch);
        let dies_after = requests.len() / 2;
        for (i, request) in requests.iter_mut().enumerate() {
            if dies && i == dies_after {
                self.counts.deaths.fetch_add(1, Ordering::Relaxed);
                self.kill();
            }
            self.read_at(request.offset, request.buf)?;
        }
        Ok(())
    }

    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let dies = self.roll(self.plan().die_mid_batch);
        let dies_after = requests.len() / 2;
        for (i, (offset, buf)) in requests.iter().enumerate() {
            if dies && i == dies_after {
                self.counts.deaths.fetch_add(1, Ordering::Relaxed);
                self.kill();
            }
            self.write_at(*offset, buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn faulty(size: u64) -> FaultyStore {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(7, |d| d.subsec_nanos().into());
        eprintln!("seed {seed}");
        FaultyStore::new(Arc::new(MemoryStore::new(size)), seed)
    }

    #[test]
    fn no_plan_means_no_faults() {
        let s = faulty(1 << 16);
        for i in 0..1000u64 {
            s.write_at(i * 8, &i.to_le_bytes()).unwrap();
        }
        let mut b = [0u8; 8];
        s.read_at(8 * 999, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 999);
        s.flush().unwrap();
        assert_eq!(s.injected(), FaultCounts::default());
        assert!(
            s.describe().starts_with("faulty(memory"),
            "{}",
            s.describe()
        );
    }

    #[test]
    fn errors_come_at_about_their_rate_and_do_nothing() {
        let s = faulty(1 << 20);
        s.set_plan(FaultPlan {
            write_error: 0.25,
            ..FaultPlan::default()
        })
        .unwrap();
        let mut failed = 0;
        for i in 0..4000u64 {
            if s.write_at(i * 8, &[0xAB; 8]).is_err() {
                failed += 1;
                let mut b = [1u8; 8];
                s.inner().read_at(i * 8, &mut b).unwrap();
                assert_eq!(b, [0; 8], "a failed write stored nothing");
            }
        }
        assert!((800..1200).contains(&failed), "{failed} of 4000 at 25 %");
        assert_eq!(s.injected().errors, failed);
    }

    #[test]
    fn short_operations_touch_half_then_fail() {
        let s = faulty(4096);
        s.inner().write_at(0, &[9; 64]).unwrap();
        s.set_plan(FaultPlan {
            short_read: 1.0,
            short_write: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
        let mut b = [0u8; 64];
        assert!(s.read_at(0, &mut b).is_err());
        assert_eq!((&b[..32], &b[32..]), (&[9u8; 32][..], &[0u8; 32][..]));
        assert!(s.write_at(0, &[5; 64]).is_err());
        let mut got = [0u8; 64];
        s.inner().read_at(0, &mut got).unwrap();
        assert_eq!((&got[..32], &got[32..]), (&[5u8; 32][..], &[9u8; 32][..]));
        assert_eq!(s.injected().short, 2);
    }

    #[test]
    fn hangs_end_at_their_bound_or_when_released() {
        let s = Arc::new(faulty(4096));
        s.set_plan(FaultPlan {
            flush_hang: 1.0,
            hang_for: Duration::from_millis(150),
            ..FaultPlan::default()
        })
        .unwrap();
        let t = Instant::now();
        assert!(s.flush().is_err());
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(150) && took < Duration::from_secs(5),
            "{took:?}"
        );
        s.set_plan(FaultPlan {
            write_hang: 1.0,
            hang_for: Duration::from_secs(60),
            ..FaultPlan::default()
        })
        .unwrap();
        let t = Instant::now();
        let hung = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.write_at(0, &[1]))
        };
        while s.injected().hangs < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
        s.heal();
        assert!(hung.join().unwrap().is_err(), "a released hang still fails");
        assert!(t.elapsed() < Duration::from_secs(30));
        s.write_at(0, &[1]).unwrap();
    }

    #[test]
    fn death_mid_batch_serves_the_first_half_then_fails_until_revived() {
        let s = faulty(1 << 16);
        s.set_plan(FaultPlan {
            die_mid_batch: 1.0,
            ..FaultPlan::default()
        })
        .unwrap();
        let data = [7u8; 16];
        let reqs: Vec<(u64, &[u8])> = (0..4u64).map(|i| (i * 16, &data[..])).collect();
        assert!(s.write_batch(&reqs).is_err());
        assert!(s.is_dead());
        let mut got = [0u8; 64];
        s.inner().read_at(0, &mut got).unwrap();
        assert_eq!(&got[..32], &[7u8; 32], "the first half was written");
        assert_eq!(&got[32..], &[0u8; 32], "the rest was not");
        assert!(
            s.read_at(0, &mut got).is_err(),
            "dead stores fail every call"
        );
        s.revive();
        s.set_plan(FaultPlan::default()).unwrap();
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        let mut batch = [
            ReadRequest {
                offset: 0,
                buf: &mut a,
            },
            ReadRequest {
                offset: 48,
                buf: &mut b,
            },
        ];
        s.read_batch(&mut batch).unwrap();
        assert_eq!((a, b), ([7; 16], [0; 16]));
        assert_eq!(s.injected().deaths, 1);
    }

    #[test]
    fn bad_probabilities_are_refused() {
        let s = faulty(4096);
        let e = s
            .set_plan(FaultPlan {
                write_hang: 1.5,
                ..FaultPlan::default()
            })
            .unwrap_err();
        assert_eq!(e.name, "write_hang");
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        let e = s
            .set_plan(FaultPlan {
                read_error: f64::NAN,
                ..FaultPlan::default()
            })
            .unwrap_err();
        assert_eq!(e.name, "read_error");
        assert_eq!(s.plan(), FaultPlan::default(), "the old plan stays");
    }
}
