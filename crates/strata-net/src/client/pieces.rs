//! A caller's request cut into per-node pieces, and the completion the caller waits on until
//! every piece has finished (or failed).

use std::sync::{Arc, Condvar, Mutex};

use strata_core::store::StoreError;

/// Completion of one caller's request (all its pieces).
pub(super) struct Completion {
    pub(super) state: Mutex<(usize, Option<StoreError>)>,
    pub(super) done: Condvar,
}

impl Completion {
    pub(super) fn new(pieces: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new((pieces, None)),
            done: Condvar::new(),
        })
    }
    pub(super) fn finish(&self, outcome: Result<(), StoreError>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        if let Err(e) = outcome {
            state.1.get_or_insert(e);
        }
        if state.0 == 0 {
            self.done.notify_all();
        }
    }
    pub(super) fn wait(&self) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.0 > 0 {
            state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        match state.1.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// One piece: a contiguous range on one node.
pub(super) struct Piece {
    pub(super) node: usize,
    pub(super) write: bool,
    pub(super) remote_offset: u64,
    /// Caller's buffer (read: written by the I/O thread; write: read by it). The caller
    /// blocks in `Completion::wait` until the piece finishes, keeping the buffer alive.
    pub(super) buffer: usize,
    pub(super) length: usize,
    pub(super) completion: Arc<Completion>,
    pub(super) finished: bool,
}

impl Piece {
    pub(super) fn finish(mut self, outcome: Result<(), StoreError>) {
        self.finished = true;
        self.completion.finish(outcome);
    }
}

impl Drop for Piece {
    /// A piece dropped unfinished (the I/O thread stopped or panicked) fails its request, so
    /// no caller waits forever. By then no progress call can touch the caller's buffer.
    fn drop(&mut self) {
        if !self.finished {
            self.completion.finish(Err(StoreError::Unavailable {
                store: "remote".into(),
                reason: "the remote I/O thread stopped; reopen the store".into(),
            }));
        }
    }
}
