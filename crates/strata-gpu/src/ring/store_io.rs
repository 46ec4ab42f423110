//! Store I/O for the host cache: the job queue the dispatcher feeds, the worker threads that
//! fill slots from the store (`read_batch` straight into slot memory) and write dirty slots
//! back (`write_batch` straight from slot memory), and what happens when a store call fails
//! or panics, or a worker dies: the pages get ERROR (reads) or stay dirty (writes), and no
//! slot is left FILLING or WRITING for a waiter to wait on forever.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};

use strata_core::store::ReadRequest;

use super::host_cache::{HostCache, WriteResult};
use super::server::Inner;

/// Work for a store worker: (page, slot) pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Job {
    /// Read the pages into their FILLING slots.
    Fill(Vec<(u64, u32)>),
    /// Write the pages from their WRITING slots.
    WriteBack(Vec<(u64, u32)>),
}

#[derive(Debug)]
struct QueueState<J> {
    jobs: VecDeque<J>,
    closed: bool,
}

/// Jobs waiting for a worker (store jobs, or WRITE copies for the copiers). A fill queued
/// behind a fill that no worker has taken yet joins it (up to the batch limit): requests that
/// arrive while every worker is busy form one batch.
#[derive(Debug)]
pub(crate) struct JobQueue<J = Job> {
    state: Mutex<QueueState<J>>,
    ready: Condvar,
    max_batch: usize,
}

impl<J> JobQueue<J> {
    pub(crate) fn new(max_batch: usize) -> Self {
        JobQueue {
            state: Mutex::new(QueueState {
                jobs: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            max_batch,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState<J>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` as it is (no merging).
    pub(crate) fn push_one(&self, job: J) {
        self.lock().jobs.push_back(job);
        self.ready.notify_one();
    }

    /// Jobs queued and not yet taken by a worker.
    pub(crate) fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// The next job; `None` once closed and empty.
    pub(crate) fn pop(&self) -> Option<J> {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn drain(&self) -> Vec<J> {
        self.lock().jobs.drain(..).collect()
    }

    /// Workers finish the queued jobs, then exit.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

impl JobQueue<Job> {
    fn push(&self, job: Job) {
        let mut q = self.lock();
        let merged = match (q.jobs.back_mut(), &job) {
            (Some(Job::Fill(queued)), Job::Fill(more))
            | (Some(Job::WriteBack(queued)), Job::WriteBack(more))
                if queued.len() + more.len() <= self.max_batch =>
            {
                queued.extend_from_slice(more);
                true
            }
            _ => false,
        };
        if !merged {
            q.jobs.push_back(job);
        }
        drop(q);
        self.ready.notify_one();
    }
}

/// Hands `job` to the workers, or fails it at once when none is alive. The caller holds the
/// cache's lock (`cache`), under which the worker count changes.
pub(crate) fn submit(inner: &Inner, cache: &mut HostCache, job: Job) {
    if inner.alive_workers.load(Ordering::Acquire) == 0 {
        fail_job(
            inner,
            cache,
            job,
            "no store worker thread is alive (they panicked); close the space and open it again",
        );
        return;
    }
    inner.queue.push(job);
}

/// Ends `job` as failed: fills publish ERROR, write-backs stay dirty.
fn fail_job(inner: &Inner, cache: &mut HostCache, job: Job, why: &str) {
    match job {
        Job::Fill(items) => {
            for (page, slot) in items {
                cache.finish_fill(&inner.shared, page, slot, Err(why.to_string()));
            }
        }
        Job::WriteBack(items) => {
            let results: Vec<_> = items
                .into_iter()
                .map(|i| (i, Err(why.to_string())))
                .collect();
            cache.finish_write_back(&results);
        }
    }
    inner.changed.notify_all();
}

/// Fails the job a dying worker held, and every queued job when the last worker dies.
struct WorkerGuard<'a> {
    inner: &'a Inner,
    job: Option<Job>,
}

impl Drop for WorkerGuard<'_> {
    fn drop(&mut self) {
        let inner = self.inner;
        let mut cache = inner.lock();
        if let Some(job) = self.job.take() {
            fail_job(
                inner,
                &mut cache,
                job,
                "the store worker thread serving it died (panicked)",
            );
        }
        if inner.alive_workers.fetch_sub(1, Ordering::AcqRel) == 1 {
            for job in inner.queue.drain() {
                fail_job(
                    inner,
                    &mut cache,
                    job,
                    "no store worker thread is alive (they panicked); close the space and open it again",
                );
            }
        }
    }
}

/// A worker thread's body: serve jobs until the queue closes.
pub(crate) fn run_worker(inner: &Inner) {
    let mut guard = WorkerGuard { inner, job: None };
    while let Some(mut job) = inner.queue.pop() {
        match &mut job {
            Job::Fill(items) | Job::WriteBack(items) => items.sort_unstable(),
        }
        guard.job = Some(job.clone());
        match job {
            Job::Fill(items) => {
                let results = fill_slots(inner, &items);
                guard.job = None;
                let mut cache = inner.lock();
                for ((page, slot), result) in items.into_iter().zip(results) {
                    cache.finish_fill(&inner.shared, page, slot, result);
                }
            }
            Job::WriteBack(items) => {
                let results = write_slots(inner, &items);
                guard.job = None;
                inner.lock().finish_write_back(&results);
            }
        }
        inner.changed.notify_all();
    }
}

/// Text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Runs a store call, turning a panic into an error message.
fn guarded<T>(
    store: &str,
    call: impl FnOnce() -> Result<T, strata_core::store::StoreError>,
) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(payload) => Err(format!(
            "{store} panicked: {}; the store is broken, fix it and retry",
            panic_text(&*payload)
        )),
    }
}

/// Reads each (page, slot) from the store into its FILLING slot (the tail past the space's
/// end zeroed). One batch; if it fails, each page alone, so one bad page fails alone.
pub(crate) fn fill_slots(inner: &Inner, items: &[(u64, u32)]) -> Vec<Result<(), String>> {
    let shared = &inner.shared;
    let name = inner.store.describe();
    let mut bytes = 0;
    let mut requests: Vec<ReadRequest<'_>> = items
        .iter()
        .map(|&(page, slot)| {
            let (offset, len) = shared.page_range(page);
            // SAFETY: the slot is FILLING and owned by this job alone (slots of a job are
            // distinct, and no host thread touches a FILLING slot's bytes); its page's word was
            // withdrawn when the slot was taken, so device readers discard what they copy.
            let buf = unsafe { shared.slot_bytes_mut(slot) };
            buf[len..].fill(0);
            bytes += len as u64;
            ReadRequest {
                offset,
                buf: &mut buf[..len],
            }
        })
        .collect();
    inner.counters.batch(false, requests.len(), bytes);
    if guarded(&name, || inner.store.read_batch(&mut requests)).is_ok() {
        return vec![Ok(()); requests.len()];
    }
    requests
        .iter_mut()
        .map(|r| {
            inner.counters.batch(false, 1, r.buf.len() as u64);
            guarded(&name, || inner.store.read_at(r.offset, r.buf))
        })
        .collect()
}

/// Writes (offset, bytes) ranges: one batch; if it fails, each alone, so that only the
/// ranges the store refuses fail.
pub(crate) fn write_ranges(inner: &Inner, ranges: &[(u64, &[u8])]) -> Vec<Result<(), String>> {
    let name = inner.store.describe();
    let bytes = ranges.iter().map(|(_, b)| b.len() as u64).sum();
    inner.counters.batch(true, ranges.len(), bytes);
    match guarded(&name, || inner.store.write_batch(ranges)) {
        Ok(()) => vec![Ok(()); ranges.len()],
        Err(e) if ranges.len() == 1 => vec![Err(e)],
        Err(_) => ranges
            .iter()
            .map(|(offset, b)| {
                inner.counters.batch(true, 1, b.len() as u64);
                guarded(&name, || inner.store.write_at(*offset, b))
            })
            .collect(),
    }
}

/// Writes each (page, slot) from its WRITING slot to the store.
pub(crate) fn write_slots(inner: &Inner, items: &[(u64, u32)]) -> Vec<WriteResult> {
    let shared = &inner.shared;
    let ranges: Vec<(u64, &[u8])> = items
        .iter()
        .map(|&(page, slot)| {
            let (offset, len) = shared.page_range(page);
            // SAFETY: the slot is WRITING: no host thread writes its bytes until
            // `finish_write_back`, and the device never writes slots.
            let bytes = unsafe { shared.slot_bytes(slot) };
            (offset, &bytes[..len])
        })
        .collect();
    let results = write_ranges(inner, &ranges);
    items.iter().copied().zip(results).collect()
}
