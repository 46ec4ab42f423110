//! A lending process's side: offers a GPU's memory, creates and exports chunks when the
//! broker asks, releases them when the broker says they are free, and reclaims with a
//! deadline. The GPU stays behind [`ChunkSource`] (real: `strata_gpu`'s VMM export; tests: the
//! memfd fake in `fake`).

use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{ClientError, Shared, connect, next_message};
use crate::ledger::ChunkId;
use crate::message::{FreeReason, Message, Role};
use crate::socket::{Conn, ConnError};

/// A GPU that lends chunks.
pub trait ChunkSource: Send + 'static {
    /// The GPU's ordinal.
    fn gpu(&self) -> u32;
    /// Chunk size (a multiple of the allocation granularity).
    fn chunk_bytes(&self) -> u64;
    /// Creates `count` chunks and exports each as a descriptor; the source keeps its own
    /// reference until [`ChunkSource::release`].
    ///
    /// # Errors
    /// Why no chunks could be created (nothing is kept then).
    fn create(&mut self, count: u32) -> Result<Vec<(ChunkId, OwnedFd)>, String>;
    /// Drops the source's reference to `chunks` (their memory is free once no borrower maps
    /// them either).
    fn release(&mut self, chunks: &[ChunkId]);
}

/// What happened to a lender, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LenderEvent {
    /// The broker handed chunks on.
    Lent(Vec<ChunkId>),
    /// Chunks came back and were released.
    Freed {
        /// Chunks.
        chunks: Vec<ChunkId>,
        /// Why.
        reason: FreeReason,
    },
    /// A reclaim ended.
    ReclaimDone(ReclaimReport),
    /// The broker refused something.
    Error(String),
    /// The broker's connection ended; every chunk was released.
    BrokerLost,
}

/// How a reclaim ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimReport {
    /// The lender's reclaim id.
    pub reclaim: u64,
    /// Bytes borrowers released in time.
    pub freed_bytes: u64,
    /// Borrowers killed for missing the deadline.
    pub killed_pids: Vec<u32>,
    /// Bytes still mapped when it ended.
    pub outstanding_bytes: u64,
}

#[derive(Debug, Default)]
struct LenderState {
    events: Vec<LenderEvent>,
    lent: BTreeSet<ChunkId>,
    lost: bool,
}

/// A connected lender; its thread serves the broker's requests until dropped.
#[derive(Debug)]
pub struct Lender {
    conn: Arc<Conn>,
    shared: Arc<Shared<LenderState>>,
    thread: Option<JoinHandle<()>>,
    next_reclaim: u64,
    chunk_bytes: u64,
}

impl Lender {
    /// Connects to the broker at `path` and offers up to `max_bytes` of `source`'s GPU.
    ///
    /// # Errors
    /// No broker, or it refused.
    pub fn start<S: ChunkSource>(
        path: &Path,
        source: S,
        max_bytes: u64,
    ) -> Result<Self, ClientError> {
        let timeout = Duration::from_secs(5);
        let (conn, _) = connect(path, Role::Lender { gpu: source.gpu() }, timeout)?;
        let chunk_bytes = source.chunk_bytes();
        conn.send(
            &Message::Offer {
                max_bytes,
                chunk_bytes,
            },
            &[],
        )?;
        // The broker handles one connection's messages in order: once the status reply is
        // here, the offer is on the books (an offer error would come first).
        conn.send(&Message::Status, &[])?;
        match conn.recv(Some(timeout))?.map(|p| p.message) {
            Some(Ok(Message::StatusReply { .. })) => {}
            Some(Ok(Message::Error { message, .. })) => return Err(ClientError::Refused(message)),
            Some(Ok(m)) => return Err(ClientError::Unexpected(m.name().into())),
            Some(Err(e)) => return Err(ConnError::Frame(e).into()),
            None => return Err(ClientError::Timeout(timeout, "offer")),
        }
        let conn = Arc::new(conn);
        let shared = Arc::new(Shared::<LenderState>::default());
        let thread = {
            let conn = conn.clone();
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("strata-lender".into())
                .spawn(move || serve(&conn, source, &shared))
                .map_err(|e| {
                    ClientError::Unexpected(format!("cannot start the lender thread: {e}"))
                })?
        };
        Ok(Lender {
            conn,
            shared,
            thread: Some(thread),
            next_reclaim: 1,
            chunk_bytes,
        })
    }

    /// Changes the most bytes lent (does not revoke: see [`Lender::reclaim`]).
    ///
    /// # Errors
    /// The broker is gone.
    pub fn offer(&self, max_bytes: u64) -> Result<(), ClientError> {
        self.conn.send(
            &Message::Offer {
                max_bytes,
                chunk_bytes: self.chunk_bytes,
            },
            &[],
        )?;
        Ok(())
    }

    /// Bytes lent now.
    pub fn lent_bytes(&self) -> u64 {
        self.shared.lock().lent.len() as u64 * self.chunk_bytes
    }

    /// Everything that happened so far.
    pub fn events(&self) -> Vec<LenderEvent> {
        self.shared.lock().events.clone()
    }

    /// Waits up to `timeout` for an event matching `pick`.
    pub fn wait_event<R>(
        &self,
        timeout: Duration,
        mut pick: impl FnMut(&LenderEvent) -> Option<R>,
    ) -> Option<R> {
        self.shared
            .wait_for(timeout, |s| s.events.iter().find_map(&mut pick))
    }

    /// True once the broker's connection ended.
    pub fn broker_lost(&self) -> bool {
        self.shared.lock().lost
    }

    /// Asks for `bytes` back, borrowers getting `deadline`; returns when the broker reports
    /// the reclaim done (every chunk released by then is already released here) and how
    /// long it took.
    ///
    /// # Errors
    /// The broker is gone or does not answer within the deadline plus 5 s.
    pub fn reclaim(
        &mut self,
        bytes: u64,
        deadline: Duration,
    ) -> Result<(ReclaimReport, Duration), ClientError> {
        let reclaim = self.next_reclaim;
        self.next_reclaim += 1;
        let start = Instant::now();
        let deadline_ms = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
        self.conn.send(
            &Message::Reclaim {
                reclaim,
                bytes,
                deadline_ms,
            },
            &[],
        )?;
        let wait = deadline + Duration::from_secs(5);
        let got = self.shared.wait_for(wait, |s| {
            let done = s.events.iter().find_map(|e| match e {
                LenderEvent::ReclaimDone(r) if r.reclaim == reclaim => Some(Ok(r.clone())),
                _ => None,
            });
            done.or_else(|| s.lost.then_some(Err(ClientError::BrokerLost)))
        });
        match got {
            Some(Ok(r)) => Ok((r, start.elapsed())),
            Some(Err(e)) => Err(e),
            None => Err(ClientError::Timeout(wait, "reclaim_done")),
        }
    }
}

impl Drop for Lender {
    fn drop(&mut self) {
        // Ends the serving thread (it sees end of stream and releases every chunk).
        let _ = rustix::net::shutdown(self.conn.as_fd(), rustix::net::Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve<S: ChunkSource>(conn: &Conn, mut source: S, shared: &Shared<LenderState>) {
    loop {
        let Some((message, _)) = next_message(conn, "lender") else {
            break;
        };
        match message {
            Message::CreateChunks { request, count } => {
                let reply = match source.create(count) {
                    Ok(made) => {
                        let (ids, fds): (Vec<ChunkId>, Vec<OwnedFd>) = made.into_iter().unzip();
                        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
                        shared.update(|s| s.lent.extend(ids.iter().copied()));
                        let sent = conn.send(
                            &Message::Chunks {
                                request,
                                chunks: ids.clone(),
                            },
                            &borrowed,
                        );
                        // Our exported descriptors close here; the source keeps its handles.
                        drop(fds);
                        if sent.is_err() {
                            break;
                        }
                        shared.update(|s| s.events.push(LenderEvent::Lent(ids)));
                        continue;
                    }
                    Err(message) => Message::ChunksFailed { request, message },
                };
                if conn.send(&reply, &[]).is_err() {
                    break;
                }
            }
            Message::ChunksFreed { chunks, reason } => {
                source.release(&chunks);
                shared.update(|s| {
                    for c in &chunks {
                        s.lent.remove(c);
                    }
                    s.events.push(LenderEvent::Freed { chunks, reason });
                });
            }
            Message::ReclaimDone {
                reclaim,
                freed_bytes,
                killed_pids,
                outstanding_bytes,
            } => shared.update(|s| {
                s.events.push(LenderEvent::ReclaimDone(ReclaimReport {
                    reclaim,
                    freed_bytes,
                    killed_pids,
                    outstanding_bytes,
                }));
            }),
            Message::Error { message, .. } => {
                shared.update(|s| s.events.push(LenderEvent::Error(message)))
            }
            other => tracing::warn!(
                "lender: ignoring unexpected `{}` from the broker",
                other.name()
            ),
        }
    }
    // Broker gone (or we are shutting down): release our references. Borrowers see the same
    // end of stream and unmap; the memory is free when the last reference goes.
    let lent: Vec<ChunkId> = shared.lock().lent.iter().copied().collect();
    source.release(&lent);
    shared.update(|s| {
        s.lent.clear();
        s.lost = true;
        s.events.push(LenderEvent::BrokerLost);
    });
}
