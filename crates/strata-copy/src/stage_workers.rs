//! Host threads kept for large copies: spawning threads for each copy cost about 20 us apiece
//! on our H100 host, as much as the whole copy of a megabyte, so the pinned pipeline keeps its
//! helpers. Between copies they spin briefly (a following copy starts at once), then sleep.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A job shared with the workers for the duration of one [`Workers::run`], its lifetime erased.
#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the job is Sync, and `run` keeps it alive until every worker finished with it.
unsafe impl Send for JobRef {}

struct State {
    generation: u64,
    job: Option<JobRef>,
    /// Workers given a part of the current job (workers 0..parts).
    parts: usize,
    /// Of those, how many have not finished it.
    running: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    finished: Condvar,
    /// Mirror of `state.generation`, for spinning without the lock.
    generation: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long an idle worker spins for the next job before it sleeps.
const SPIN: Duration = Duration::from_micros(200);

/// A fixed set of helper threads.
pub(crate) struct Workers {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("threads", &self.handles.len())
            .finish()
    }
}

fn work(shared: &Shared, index: usize) {
    let mut seen = 0;
    loop {
        let start = Instant::now();
        while shared.generation.load(Ordering::Acquire) == seen && start.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        let job = {
            let mut st = shared.lock();
            while st.generation == seen && !st.shutdown {
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            if st.shutdown {
                return;
            }
            seen = st.generation;
            if index >= st.parts {
                continue;
            }
            st.job
        };
        if let Some(job) = job {
            // SAFETY: `run` published this job and waits for `running` to reach 0 before the
            // closure it points to goes away.
            unsafe { (*job.0)(index + 1) };
        }
        let mut st = shared.lock();
        st.running -= 1;
        if st.running == 0 {
            shared.finished.notify_all();
        }
    }
}

impl Workers {
    /// Starts up to `n` threads (fewer if the system refuses some).
    pub(crate) fn new(n: usize) -> Workers {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                job: None,
                parts: 0,
                running: 0,
                shutdown: false,
            }),
            wake: Condvar::new(),
            finished: Condvar::new(),
            generation: AtomicU64::new(0),
        });
        let mut handles = Vec::with_capacity(n);
        for _ in 0..n {
            let (s, index) = (shared.clone(), handles.len());
            match std::thread::Builder::new()
                .name("strata-copy-stage".into())
                .spawn(move || work(&s, index))
            {
                Ok(h) => handles.push(h),
                Err(_) => break,
            }
        }
        Workers { shared, handles }
    }

    /// Threads available.
    pub(crate) fn len(&self) -> usize {
        self.handles.len()
    }

    /// Runs `job(1)`, ..., `job(helpers)` on `helpers` workers (at most [`Self::len`]) while the
    /// calling thread runs `own`; returns `own`'s result once every worker finished its part.
    /// `job` must not panic (a worker that panics never reports back).
    pub(crate) fn run<R>(
        &self,
        helpers: usize,
        job: &(dyn Fn(usize) + Sync),
        own: impl FnOnce() -> R,
    ) -> R {
        let helpers = helpers.min(self.len());
        if helpers == 0 {
            return own();
        }
        // SAFETY: only the lifetime is erased; the guard below waits until no worker uses the
        // job any more, also when `own` panics, so it never outlives its borrow.
        let erased: *const (dyn Fn(usize) + Sync + 'static) =
            unsafe { std::mem::transmute(std::ptr::from_ref(job)) };
        {
            let mut st = self.shared.lock();
            st.generation += 1;
            st.job = Some(JobRef(erased));
            st.parts = helpers;
            st.running = helpers;
            self.shared
                .generation
                .store(st.generation, Ordering::Release);
        }
        self.shared.wake.notify_all();
        struct WaitForWorkers<'a>(&'a Shared);
        impl Drop for WaitForWorkers<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                while st.running > 0 {
                    st = self.0.finished.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.job = None;
            }
        }
        let _wait = WaitForWorkers(&self.shared);
        own()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once_per_job_and_the_caller_waits() {
        let w = Workers::new(3);
        assert_eq!(w.len(), 3);
        for round in 0..200 {
            let helpers = round % 5;
            let hits: Vec<AtomicUsize> = (0..5).map(|_| AtomicUsize::new(0)).collect();
            let own = w.run(
                helpers,
                &|part| {
                    if round % 7 == 0 {
                        std::thread::sleep(Duration::from_micros(300));
                    }
                    hits[part].fetch_add(1, Ordering::Relaxed);
                },
                || 42,
            );
            assert_eq!(own, 42);
            let ran = helpers.min(3);
            for (part, h) in hits.iter().enumerate() {
                let want = usize::from(part >= 1 && part <= ran);
                assert_eq!(h.load(Ordering::Relaxed), want, "round {round} part {part}");
            }
        }
        drop(w);
    }
}
