//! A borrowing process's side: asks the broker for chunks, hands the received descriptors to
//! a [`ChunkSink`] (real: a `strata_gpu` space's peer tier; tests: the memfd fake), and obeys
//! revokes: the sink stops using the chunks and unmaps them, then the release is acknowledged.
//! When the broker goes away the sink drops everything borrowed and the process carries on
//! with its other tiers.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{ClientError, Shared, connect, next_message};
use crate::ledger::{ChunkId, LeaseId};
use crate::message::{Message, Role};
use crate::socket::Conn;

/// Chunks of one lender, as granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Lease.
    pub lease: LeaseId,
    /// Lender's GPU.
    pub lender_gpu: u32,
    /// Chunk size.
    pub chunk_bytes: u64,
    /// Chunk ids, in the order of the descriptors.
    pub chunks: Vec<ChunkId>,
}

/// Where borrowed chunks go.
pub trait ChunkSink: Send + 'static {
    /// Imports and maps the chunks of `grant`, one descriptor each (the sink may close them
    /// once imported).
    ///
    /// # Errors
    /// Why they could not be used; the chunks are then released back at once.
    fn attach(&mut self, grant: &Grant, fds: Vec<OwnedFd>) -> Result<(), String>;
    /// Stops using `chunks` of `lease` and unmaps them; must return only once nothing can
    /// touch them any more.
    ///
    /// # Errors
    /// Why not (the release is then not acknowledged, and the broker's deadline applies).
    fn revoke(
        &mut self,
        lease: LeaseId,
        chunks: &[ChunkId],
        deadline: Instant,
    ) -> Result<(), String>;
    /// The broker is gone: drop every borrowed chunk.
    fn broker_lost(&mut self);
}

/// How a borrow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BorrowOutcome {
    /// Bytes granted (and attached).
    pub granted_bytes: u64,
    /// The grants.
    pub grants: Vec<Grant>,
    /// Why less than asked, if so.
    pub shortfall: Option<String>,
}

#[derive(Debug, Default)]
struct BorrowerState {
    grants: BTreeMap<u64, Vec<Grant>>,
    done: BTreeMap<u64, (u64, Option<String>)>,
    held: BTreeMap<LeaseId, BTreeSet<ChunkId>>,
    revokes: u64,
    errors: Vec<String>,
    lost: bool,
}

/// A connected borrower; its thread serves grants and revokes until dropped.
#[derive(Debug)]
pub struct Borrower<S: ChunkSink> {
    conn: Arc<Conn>,
    sink: Arc<Mutex<S>>,
    shared: Arc<Shared<BorrowerState>>,
    thread: Option<JoinHandle<()>>,
    next_request: u64,
}

impl<S: ChunkSink> Borrower<S> {
    /// Connects to the broker at `path` as a borrower for GPU `gpu`.
    ///
    /// # Errors
    /// No broker, or it refused.
    pub fn start(path: &Path, gpu: u32, sink: S) -> Result<Self, ClientError> {
        let (conn, _) = connect(path, Role::Borrower { gpu }, Duration::from_secs(5))?;
        let conn = Arc::new(conn);
        let sink = Arc::new(Mutex::new(sink));
        let shared = Arc::new(Shared::<BorrowerState>::default());
        let thread = {
            let (conn, sink, shared) = (conn.clone(), sink.clone(), shared.clone());
            std::thread::Builder::new()
                .name("strata-borrower".into())
                .spawn(move || serve(&conn, &sink, &shared))
                .map_err(|e| {
                    ClientError::Unexpected(format!("cannot start the borrower thread: {e}"))
                })?
        };
        Ok(Borrower {
            conn,
            sink,
            shared,
            thread: Some(thread),
            next_request: 1,
        })
    }

    /// The sink (shared with the serving thread).
    pub fn sink(&self) -> &Arc<Mutex<S>> {
        &self.sink
    }

    /// Borrows `bytes` (whole chunks) from lenders on `from` (empty: any other GPU); waits up
    /// to `timeout` for every chunk to be attached.
    ///
    /// # Errors
    /// The broker refused (the reason says how much is lendable), went away, or did not
    /// finish in time.
    pub fn borrow(
        &mut self,
        bytes: u64,
        from: &[u32],
        timeout: Duration,
    ) -> Result<BorrowOutcome, ClientError> {
        let request = self.next_request;
        self.next_request += 1;
        self.conn.send(
            &Message::Borrow {
                request,
                bytes,
                from: from.to_vec(),
            },
            &[],
        )?;
        let got = self.shared.wait_for(timeout, |s| {
            if let Some((granted_bytes, shortfall)) = s.done.remove(&request) {
                let grants = s.grants.remove(&request).unwrap_or_default();
                return Some(Ok(BorrowOutcome {
                    granted_bytes,
                    grants,
                    shortfall,
                }));
            }
            s.lost.then_some(Err(ClientError::BrokerLost))
        });
        match got {
            Some(Ok(o)) if o.granted_bytes == 0 => Err(ClientError::Refused(
                o.shortfall.unwrap_or_else(|| "nothing granted".into()),
            )),
            Some(r) => r,
            None => Err(ClientError::Timeout(timeout, "borrow_done")),
        }
    }

    /// Gives a whole lease back on our own: the sink unmaps it, then the broker is told.
    ///
    /// # Errors
    /// The lease is not held, the sink failed, or the broker is gone.
    pub fn give_back(&self, lease: LeaseId) -> Result<(), ClientError> {
        let chunks: Vec<ChunkId> = self
            .shared
            .lock()
            .held
            .get(&lease)
            .map(|c| c.iter().copied().collect())
            .ok_or_else(|| ClientError::Refused(format!("lease {lease} is not held here")))?;
        release(
            &self.conn,
            &self.sink,
            &self.shared,
            lease,
            &chunks,
            Instant::now() + Duration::from_secs(60),
        )
        .map_err(ClientError::Refused)
    }

    /// Bytes held now, per lease.
    pub fn held(&self) -> BTreeMap<LeaseId, usize> {
        self.shared
            .lock()
            .held
            .iter()
            .map(|(&l, c)| (l, c.len()))
            .collect()
    }

    /// Revokes served so far.
    pub fn revokes(&self) -> u64 {
        self.shared.lock().revokes
    }

    /// Errors seen (broker refusals, failed attaches).
    pub fn errors(&self) -> Vec<String> {
        self.shared.lock().errors.clone()
    }

    /// True once the broker's connection ended (everything borrowed has been dropped).
    pub fn broker_lost(&self) -> bool {
        self.shared.lock().lost
    }

    /// Waits up to `timeout` for the broker's connection to end.
    pub fn wait_broker_lost(&self, timeout: Duration) -> bool {
        self.shared
            .wait_for(timeout, |s| s.lost.then_some(()))
            .is_some()
    }
}

impl<S: ChunkSink> Drop for Borrower<S> {
    fn drop(&mut self) {
        // The serving thread sees end of stream and has the sink drop everything borrowed.
        let _ = rustix::net::shutdown(self.conn.as_fd(), rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn release<S: ChunkSink>(
    conn: &Conn,
    sink: &Mutex<S>,
    shared: &Shared<BorrowerState>,
    lease: LeaseId,
    chunks: &[ChunkId],
    deadline: Instant,
) -> Result<(), String> {
    sink.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .revoke(lease, chunks, deadline)?;
    shared.update(|s| {
        if let Some(held) = s.held.get_mut(&lease) {
            for c in chunks {
                held.remove(c);
            }
            if held.is_empty() {
                s.held.remove(&lease);
            }
        }
    });
    conn.send(
        &Message::Released {
            lease,
            chunks: chunks.to_vec(),
        },
        &[],
    )
    .map_err(|e| e.to_string())
}

fn serve<S: ChunkSink>(conn: &Conn, sink: &Mutex<S>, shared: &Shared<BorrowerState>) {
    loop {
        let Some((message, fds)) = next_message(conn, "borrower") else {
            break;
        };
        match message {
            Message::Granted {
                request,
                lease,
                lender_gpu,
                chunk_bytes,
                chunks,
            } => {
                let grant = Grant {
                    lease,
                    lender_gpu,
                    chunk_bytes,
                    chunks,
                };
                let attached = if fds.len() == grant.chunks.len() {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .attach(&grant, fds)
                } else {
                    Err(format!(
                        "{} chunk ids but {} descriptors",
                        grant.chunks.len(),
                        fds.len()
                    ))
                };
                match attached {
                    Ok(()) => shared.update(|s| {
                        s.held
                            .entry(lease)
                            .or_default()
                            .extend(grant.chunks.iter().copied());
                        s.grants.entry(request).or_default().push(grant);
                    }),
                    Err(why) => {
                        tracing::warn!("borrower: cannot use granted chunks: {why}");
                        shared.update(|s| s.errors.push(why));
                        let back = Message::Released {
                            lease,
                            chunks: grant.chunks,
                        };
                        if conn.send(&back, &[]).is_err() {
                            break;
                        }
                    }
                }
            }
            Message::BorrowDone {
                request,
                granted_bytes,
                shortfall,
            } => shared.update(|s| {
                s.done.insert(request, (granted_bytes, shortfall));
            }),
            Message::Revoke {
                lease,
                chunks,
                deadline_ms,
            } => {
                let deadline = Instant::now() + Duration::from_millis(deadline_ms);
                shared.update(|s| s.revokes += 1);
                if let Err(why) = release(conn, sink, shared, lease, &chunks, deadline) {
                    tracing::error!("borrower: revoke of lease {lease} failed: {why}");
                    shared.update(|s| s.errors.push(why));
                }
            }
            Message::Error { message, .. } => shared.update(|s| s.errors.push(message)),
            other => tracing::warn!(
                "borrower: ignoring unexpected `{}` from the broker",
                other.name()
            ),
        }
    }
    sink.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .broker_lost();
    shared.update(|s| {
        s.held.clear();
        s.lost = true;
    });
}
