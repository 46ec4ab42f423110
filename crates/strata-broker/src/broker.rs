//! The broker: one per host, on a Unix socket. It keeps the books (`ledger`), asks lenders
//! for chunks when a borrower wants some, forwards the chunk descriptors (and closes its own
//! copies at once: an open descriptor pins GPU memory), and runs reclaims with deadlines.
//!
//! One thread, one `poll` over the listener and every client; the poll timeout is the nearest
//! reclaim deadline, so a deadline is acted on within milliseconds of passing. A client that
//! sends garbage is told why and cut off; a client that does not read its messages is cut off
//! (the broker never blocks on a client).
//!
//! Reclaim, and its last resort: the borrowers holding the chunks a lender wants back get
//! `Revoke` with the deadline. Each `Released` is passed to the lender as `ChunksFreed` at
//! once. A borrower that has not released by the deadline is killed with `SIGKILL` (its
//! process id comes from `SO_PEERCRED`, not from anything it said): the CUDA driver then drops
//! the process's mappings and imported handles, which is the only way to take memory back
//! from a process that will not give it (no CUDA call removes another process's mapping).
//! The lender gets `ReclaimDone` at the deadline, listing whom was killed, and `ChunksFreed`
//! (`borrower_killed`) when the killed borrower's connection ends.
//!
//! Borrower death: the kernel closes its socket, the broker sees end of stream, ends its
//! leases and tells each lender `ChunksFreed` (`borrower_gone`); process exit has released the
//! borrower's CUDA references. Lender death: its leases are revoked like a reclaim (borrowers
//! unmap; the memory is freed when the last of them does). Broker death: every client sees end
//! of stream; borrowers drop all borrowed chunks and go on with their other tiers, lenders
//! release every chunk they created.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, poll};

use crate::ledger::{ChunkId, ClientId, LeaseId, Ledger};
use crate::message::{ErrorCode, FreeReason, LeaseReport, Message, Role};
use crate::socket::{Conn, ConnError, Listener, Packet};
use crate::wire::MAX_FDS_PER_FRAME;

/// How the broker enforces a missed deadline.
pub trait Enforcer: Send {
    /// Ends process `pid` so that the driver drops its mappings.
    ///
    /// # Errors
    /// Why it could not.
    fn kill(&mut self, pid: u32) -> Result<(), String>;
}

/// The real enforcer: `SIGKILL`. Refuses pid 0, 1 and the broker itself.
#[derive(Debug, Default)]
pub struct Sigkill;

impl Enforcer for Sigkill {
    fn kill(&mut self, pid: u32) -> Result<(), String> {
        if pid <= 1 || pid == std::process::id() {
            return Err(format!("refusing to kill process {pid}"));
        }
        let target = i32::try_from(pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| format!("process id {pid} is out of range"))?;
        rustix::process::kill_process(target, rustix::process::Signal::KILL)
            .map_err(|e| format!("kill {pid}: {e}"))
    }
}

/// Broker settings.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Deadline for borrowers when a lender disappears (a lender's `Reclaim` brings its own).
    pub lender_gone_deadline: Duration,
    /// How long a lender may take to answer a request for chunks; after that the borrow is
    /// completed without them (and chunks arriving later go straight back).
    pub create_timeout: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            lender_gone_deadline: Duration::from_secs(5),
            create_timeout: Duration::from_secs(10),
        }
    }
}

/// A broker failure (the broker itself, not one client).
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Socket setup or polling failed.
    #[error("broker socket: {0}")]
    Socket(#[from] ConnError),
}

#[derive(Debug)]
struct Client {
    conn: Conn,
    pid: u32,
    role: Option<Role>,
    killed: bool,
}

#[derive(Debug)]
struct PendingCreate {
    /// When the lender must have answered.
    due: Instant,
    lender: ClientId,
    lease: LeaseId,
    borrower: ClientId,
    borrow: u64,
    count: u64,
}

#[derive(Debug, Default)]
struct BorrowRun {
    outstanding: u32,
    granted_bytes: u64,
    shortfall: Option<String>,
}

#[derive(Debug)]
struct ReclaimRun {
    /// Lender to tell, and its reclaim id (none when the lender is gone).
    notify: Option<(ClientId, u64)>,
    deadline: Instant,
    chunk_bytes: u64,
    pending: BTreeMap<LeaseId, BTreeSet<ChunkId>>,
    freed_bytes: u64,
}

/// The broker's state; [`Broker::run`] serves until stopped.
pub struct Broker {
    listener: Listener,
    config: BrokerConfig,
    enforcer: Box<dyn Enforcer>,
    clients: BTreeMap<ClientId, Client>,
    ledger: Ledger,
    creates: BTreeMap<u64, PendingCreate>,
    borrows: BTreeMap<(ClientId, u64), BorrowRun>,
    reclaims: Vec<ReclaimRun>,
    next_id: u64,
    doomed: BTreeSet<ClientId>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("clients", &self.clients.len())
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// Listens at `path`.
    ///
    /// # Errors
    /// When another broker answers there or the socket cannot be created.
    pub fn bind(
        path: &Path,
        config: BrokerConfig,
        enforcer: Box<dyn Enforcer>,
    ) -> Result<Self, BrokerError> {
        Ok(Broker {
            listener: Listener::bind(path)?,
            config,
            enforcer,
            clients: BTreeMap::new(),
            ledger: Ledger::default(),
            creates: BTreeMap::new(),
            borrows: BTreeMap::new(),
            reclaims: Vec::new(),
            next_id: 1,
            doomed: BTreeSet::new(),
        })
    }

    /// The books (tests).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Serves until `stop` is set (checked at least every 100 ms).
    ///
    /// # Errors
    /// When polling itself fails.
    pub fn run(&mut self, stop: &Arc<AtomicBool>) -> Result<(), BrokerError> {
        while !stop.load(Ordering::Relaxed) {
            self.turn(Duration::from_millis(100))?;
        }
        Ok(())
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// One poll round: accepts, reads what is ready, enforces deadlines.
    ///
    /// # Errors
    /// When polling fails.
    pub fn turn(&mut self, most: Duration) -> Result<(), BrokerError> {
        let now = Instant::now();
        let wait = self
            .reclaims
            .iter()
            .map(|r| r.deadline)
            .chain(self.creates.values().map(|p| p.due))
            .map(|d| d.saturating_duration_since(now))
            .min()
            .map_or(most, |d| d.min(most));
        let ids: Vec<ClientId> = self.clients.keys().copied().collect();
        let ready: Vec<(ClientId, bool)>;
        let listener_ready;
        {
            let mut fds = Vec::with_capacity(ids.len() + 1);
            fds.push(PollFd::new(&self.listener, PollFlags::IN));
            for id in &ids {
                fds.push(PollFd::new(&self.clients[id].conn, PollFlags::IN));
            }
            let ts = rustix::event::Timespec {
                tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(wait.subsec_nanos()),
            };
            match poll(&mut fds, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    return Err(ConnError::Io {
                        call: "poll",
                        source: e.into(),
                    }
                    .into());
                }
            }
            listener_ready = !fds[0].revents().is_empty();
            ready = ids
                .iter()
                .zip(&fds[1..])
                .filter(|(_, f)| !f.revents().is_empty())
                .map(|(&id, f)| (id, f.revents().intersects(PollFlags::IN)))
                .collect();
        }
        if listener_ready {
            while let Some(conn) = self.listener.accept()? {
                let pid = conn.peer_pid().unwrap_or(0);
                let id = self.id();
                self.clients.insert(
                    id,
                    Client {
                        conn,
                        pid,
                        role: None,
                        killed: false,
                    },
                );
            }
        }
        for (id, readable) in ready {
            if self.doomed.contains(&id) {
                continue;
            }
            let Some(client) = self.clients.get(&id) else {
                continue;
            };
            if !readable {
                self.doomed.insert(id);
                continue;
            }
            match client.conn.recv_now() {
                Ok(Some(packet)) => self.handle(id, packet),
                Ok(None) => {}
                Err(ConnError::Closed) => {
                    self.doomed.insert(id);
                }
                Err(e) => self.refuse(id, &e.to_string()),
            }
        }
        self.enforce_deadlines();
        while let Some(id) = self.doomed.pop_first() {
            self.drop_client(id);
        }
        Ok(())
    }

    fn send(&mut self, to: ClientId, message: &Message, fds: &[OwnedFd]) {
        let Some(c) = self.clients.get(&to) else {
            return;
        };
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        if let Err(e) = c.conn.send_with(message, &borrowed, false) {
            tracing::warn!(client = to, pid = c.pid, "dropping client: {e}");
            self.doomed.insert(to);
        }
    }

    fn error(&mut self, to: ClientId, code: ErrorCode, message: String) {
        self.send(to, &Message::Error { code, message }, &[]);
    }

    /// A protocol violation: say why, then cut the client off.
    fn refuse(&mut self, id: ClientId, why: &str) {
        self.error(
            id,
            ErrorCode::Protocol,
            format!("{why}; closing the connection"),
        );
        self.doomed.insert(id);
    }

    fn handle(&mut self, id: ClientId, packet: Packet) {
        let Packet { message, fds } = packet;
        let message = match message {
            Ok(m) => m,
            Err(e) => return self.refuse(id, &e.to_string()),
        };
        let role = self.clients[&id].role.clone();
        if !fds.is_empty()
            && !matches!(
                (&role, &message),
                (Some(Role::Lender { .. }), Message::Chunks { .. })
            )
        {
            // Dropping `fds` closes them.
            return self.refuse(
                id,
                &format!("descriptors attached to a `{}` message", message.name()),
            );
        }
        match (role, message) {
            (None, Message::Hello { role }) => {
                let pid = std::process::id();
                if let Some(c) = self.clients.get_mut(&id) {
                    c.role = Some(role);
                }
                self.send(
                    id,
                    &Message::Welcome {
                        client: id,
                        broker_pid: pid,
                    },
                    &[],
                );
            }
            (None, m) => self.refuse(id, &format!("`{}` before `hello`", m.name())),
            (Some(_), Message::Hello { .. }) => self.refuse(id, "a second `hello`"),
            (Some(_), Message::Status) => {
                let gpus = self.ledger.gpus();
                let leases = self
                    .ledger
                    .leases()
                    .map(|l| LeaseReport {
                        lease: l.id,
                        borrower_pid: self.clients.get(&l.borrower).map_or(0, |c| c.pid),
                        borrower_gpu: l.borrower_gpu,
                        lender_gpu: self.ledger.lender(l.lender).map_or(0, |b| b.gpu),
                        bytes: l.chunks.len() as u64
                            * self.ledger.lender(l.lender).map_or(0, |b| b.chunk_bytes),
                    })
                    .collect();
                self.send(id, &Message::StatusReply { gpus, leases }, &[]);
            }
            (
                Some(Role::Lender { gpu }),
                Message::Offer {
                    max_bytes,
                    chunk_bytes,
                },
            ) => {
                if let Err(e) = self.ledger.offer(id, gpu, chunk_bytes, max_bytes) {
                    self.error(id, ErrorCode::Invalid, e.to_string());
                }
            }
            (Some(Role::Lender { .. }), Message::Chunks { request, chunks }) => {
                self.on_chunks(id, request, &chunks, fds)
            }
            (Some(Role::Lender { .. }), Message::ChunksFailed { request, message }) => {
                match self.creates.get(&request) {
                    Some(p) if p.lender == id => {
                        let p = self.creates.remove(&request).expect("checked above");
                        self.ledger.unreserve(p.lease, p.count);
                        self.borrow_progress(
                            p.borrower,
                            p.borrow,
                            0,
                            Some(format!("lender failed: {message}")),
                        );
                    }
                    _ => self.error(
                        id,
                        ErrorCode::NotHeld,
                        format!("no chunk request {request} is open for you"),
                    ),
                }
            }
            (
                Some(Role::Lender { .. }),
                Message::Reclaim {
                    reclaim,
                    bytes,
                    deadline_ms,
                },
            ) => {
                self.on_reclaim(id, reclaim, bytes, deadline_ms);
            }
            (
                Some(Role::Borrower { gpu }),
                Message::Borrow {
                    request,
                    bytes,
                    from,
                },
            ) => {
                self.on_borrow(id, gpu, request, bytes, &from);
            }
            (Some(Role::Borrower { .. }), Message::Released { lease, chunks }) => {
                self.on_released(id, lease, &chunks)
            }
            (Some(_), m) => self.error(
                id,
                ErrorCode::Unexpected,
                format!(
                    "`{}` is not a request this client's role may send",
                    m.name()
                ),
            ),
        }
    }

    fn on_borrow(&mut self, id: ClientId, gpu: u32, request: u64, bytes: u64, from: &[u32]) {
        if self.borrows.contains_key(&(id, request)) {
            return self.error(
                id,
                ErrorCode::Invalid,
                format!("borrow request {request} is already open"),
            );
        }
        let portions = match self.ledger.plan_borrow(id, gpu, bytes, from) {
            Ok(p) => p,
            Err(e) => {
                let done = Message::BorrowDone {
                    request,
                    granted_bytes: 0,
                    shortfall: Some(e.to_string()),
                };
                return self.send(id, &done, &[]);
            }
        };
        let mut run = BorrowRun::default();
        let mut asks = Vec::new();
        for p in portions {
            let mut left = p.chunks;
            while left > 0 {
                let count = left.min(MAX_FDS_PER_FRAME as u64);
                left -= count;
                let req = self.id();
                self.creates.insert(
                    req,
                    PendingCreate {
                        due: Instant::now() + self.config.create_timeout,
                        lender: p.lender,
                        lease: p.lease,
                        borrower: id,
                        borrow: request,
                        count,
                    },
                );
                run.outstanding += 1;
                asks.push((p.lender, req, count));
            }
        }
        self.borrows.insert((id, request), run);
        for (lender, req, count) in asks {
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            self.send(
                lender,
                &Message::CreateChunks {
                    request: req,
                    count,
                },
                &[],
            );
        }
    }

    fn on_chunks(&mut self, lender: ClientId, request: u64, chunks: &[ChunkId], fds: Vec<OwnedFd>) {
        let valid = match self.creates.get(&request) {
            Some(p) if p.lender == lender => {
                if fds.len() != chunks.len() {
                    Err(format!(
                        "{} chunk ids but {} descriptors",
                        chunks.len(),
                        fds.len()
                    ))
                } else if chunks.len() as u64 > p.count {
                    Err(format!("{} chunks sent, {} asked", chunks.len(), p.count))
                } else {
                    Ok(())
                }
            }
            _ => {
                // Late (timed out) or never asked: the chunks go straight back to the lender
                // so that it does not keep them as lent.
                drop(fds);
                self.error(
                    lender,
                    ErrorCode::NotHeld,
                    format!(
                        "no chunk request {request} is open for you (timed out, or never made)"
                    ),
                );
                let back = Message::ChunksFreed {
                    chunks: chunks.to_vec(),
                    reason: FreeReason::NeverDelivered,
                };
                return self.send(lender, &back, &[]);
            }
        };
        let p = self.creates.remove(&request).expect("checked above");
        if let Err(why) = valid {
            self.ledger.unreserve(p.lease, p.count);
            self.borrow_progress(
                p.borrower,
                p.borrow,
                0,
                Some(format!("lender sent bad chunks: {why}")),
            );
            return self.refuse(lender, &why);
        }
        if self.ledger.lease(p.lease).is_none() {
            // The borrower left meanwhile: nobody will map these.
            drop(fds);
            let freed = Message::ChunksFreed {
                chunks: chunks.to_vec(),
                reason: FreeReason::NeverDelivered,
            };
            return self.send(lender, &freed, &[]);
        }
        if let Err(e) = self.ledger.grant(p.lease, chunks) {
            self.ledger.unreserve(p.lease, p.count);
            self.borrow_progress(
                p.borrower,
                p.borrow,
                0,
                Some(format!("lender sent bad chunks: {e}")),
            );
            return self.refuse(lender, &e.to_string());
        }
        let missing = p.count - chunks.len() as u64;
        self.ledger.unreserve(p.lease, missing);
        let (gpu, chunk_bytes) = self
            .ledger
            .lender(lender)
            .map_or((0, 0), |b| (b.gpu, b.chunk_bytes));
        let granted = Message::Granted {
            request: p.borrow,
            lease: p.lease,
            lender_gpu: gpu,
            chunk_bytes,
            chunks: chunks.to_vec(),
        };
        self.send(p.borrower, &granted, &fds);
        // The broker's copies are closed here, before anything else happens.
        drop(fds);
        let short = (missing > 0)
            .then(|| format!("lender delivered {} of {} chunks", chunks.len(), p.count));
        self.borrow_progress(
            p.borrower,
            p.borrow,
            chunks.len() as u64 * chunk_bytes,
            short,
        );
    }

    fn borrow_progress(
        &mut self,
        borrower: ClientId,
        request: u64,
        bytes: u64,
        shortfall: Option<String>,
    ) {
        let Some(run) = self.borrows.get_mut(&(borrower, request)) else {
            return;
        };
        run.outstanding -= 1;
        run.granted_bytes += bytes;
        if shortfall.is_some() {
            run.shortfall = shortfall;
        }
        if run.outstanding == 0 {
            let run = self.borrows.remove(&(borrower, request)).expect("present");
            let done = Message::BorrowDone {
                request,
                granted_bytes: run.granted_bytes,
                shortfall: run.shortfall,
            };
            self.send(borrower, &done, &[]);
        }
    }

    fn on_reclaim(&mut self, lender: ClientId, reclaim: u64, bytes: u64, deadline_ms: u64) {
        let picks = match self.ledger.reclaim(lender, bytes) {
            Ok(p) => p,
            Err(e) => return self.error(lender, ErrorCode::Unexpected, e.to_string()),
        };
        let chunk_bytes = self.ledger.lender(lender).map_or(0, |b| b.chunk_bytes);
        let deadline = Instant::now() + Duration::from_millis(deadline_ms.min(3_600_000));
        self.start_revoke(Some((lender, reclaim)), deadline, chunk_bytes, picks);
    }

    fn start_revoke(
        &mut self,
        notify: Option<(ClientId, u64)>,
        deadline: Instant,
        chunk_bytes: u64,
        picks: Vec<(LeaseId, Vec<ChunkId>)>,
    ) {
        let mut run = ReclaimRun {
            notify,
            deadline,
            chunk_bytes,
            pending: BTreeMap::new(),
            freed_bytes: 0,
        };
        let ms = u64::try_from(
            deadline
                .saturating_duration_since(Instant::now())
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        for (lease, chunks) in picks {
            let Some(borrower) = self.ledger.lease(lease).map(|l| l.borrower) else {
                continue;
            };
            run.pending.insert(lease, chunks.iter().copied().collect());
            for part in chunks.chunks(MAX_FDS_PER_FRAME * 8) {
                let revoke = Message::Revoke {
                    lease,
                    chunks: part.to_vec(),
                    deadline_ms: ms,
                };
                self.send(borrower, &revoke, &[]);
            }
        }
        if run.pending.is_empty() {
            self.finish_reclaim(run, Vec::new());
        } else {
            self.reclaims.push(run);
        }
    }

    fn finish_reclaim(&mut self, run: ReclaimRun, killed_pids: Vec<u32>) {
        let outstanding: u64 = run.pending.values().map(|c| c.len() as u64).sum();
        if let Some((lender, reclaim)) = run.notify {
            let done = Message::ReclaimDone {
                reclaim,
                freed_bytes: run.freed_bytes,
                killed_pids,
                outstanding_bytes: outstanding * run.chunk_bytes,
            };
            self.send(lender, &done, &[]);
        }
    }

    /// Chunks of `lease` are no longer mapped by its borrower: reclaims waiting on them move on.
    fn settle(&mut self, lease: LeaseId, chunks: &[ChunkId]) {
        let mut finished = Vec::new();
        for (i, run) in self.reclaims.iter_mut().enumerate() {
            if let Some(pending) = run.pending.get_mut(&lease) {
                for c in chunks {
                    if pending.remove(c) {
                        run.freed_bytes += run.chunk_bytes;
                    }
                }
                if pending.is_empty() {
                    run.pending.remove(&lease);
                }
                if run.pending.is_empty() {
                    finished.push(i);
                }
            }
        }
        for i in finished.into_iter().rev() {
            let run = self.reclaims.remove(i);
            self.finish_reclaim(run, Vec::new());
        }
    }

    fn on_released(&mut self, borrower: ClientId, lease: LeaseId, chunks: &[ChunkId]) {
        match self.ledger.release(borrower, lease, chunks) {
            Ok(lender) => {
                if self.clients.contains_key(&lender) {
                    let freed = Message::ChunksFreed {
                        chunks: chunks.to_vec(),
                        reason: FreeReason::Released,
                    };
                    self.send(lender, &freed, &[]);
                }
                self.settle(lease, chunks);
            }
            Err(e) => self.error(borrower, ErrorCode::NotHeld, e.to_string()),
        }
    }

    fn enforce_deadlines(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = self
            .creates
            .iter()
            .filter(|(_, p)| p.due <= now)
            .map(|(&r, _)| r)
            .collect();
        for r in late {
            let p = self.creates.remove(&r).expect("listed");
            tracing::warn!(
                lender = p.lender,
                "a lender did not answer a chunk request in time"
            );
            self.ledger.unreserve(p.lease, p.count);
            self.borrow_progress(
                p.borrower,
                p.borrow,
                0,
                Some("a lender did not answer in time".into()),
            );
        }
        let (expired, live): (Vec<ReclaimRun>, Vec<ReclaimRun>) =
            std::mem::take(&mut self.reclaims)
                .into_iter()
                .partition(|r| r.deadline <= now);
        self.reclaims = live;
        for run in expired {
            let borrowers: BTreeSet<ClientId> = run
                .pending
                .keys()
                .filter_map(|lease| self.ledger.lease(*lease).map(|l| l.borrower))
                .collect();
            let mut killed = Vec::new();
            for b in borrowers {
                let Some(c) = self.clients.get_mut(&b) else {
                    continue;
                };
                if c.killed {
                    killed.push(c.pid);
                    continue;
                }
                match self.enforcer.kill(c.pid) {
                    Ok(()) => {
                        tracing::warn!(pid = c.pid, "borrower missed its reclaim deadline: killed");
                        c.killed = true;
                        killed.push(c.pid);
                    }
                    Err(e) => tracing::error!(
                        pid = c.pid,
                        "borrower missed its reclaim deadline and could not be killed: {e}"
                    ),
                }
            }
            self.finish_reclaim(run, killed);
        }
    }

    fn drop_client(&mut self, id: ClientId) {
        let Some(client) = self.clients.remove(&id) else {
            return;
        };
        match client.role {
            Some(Role::Borrower { .. }) => {
                let leases: Vec<LeaseId> = self
                    .ledger
                    .leases()
                    .filter(|l| l.borrower == id)
                    .map(|l| l.id)
                    .collect();
                let reason = if client.killed {
                    FreeReason::BorrowerKilled
                } else {
                    FreeReason::BorrowerGone
                };
                for (lender, chunks) in self.ledger.borrower_gone(id) {
                    for part in chunks.chunks(MAX_FDS_PER_FRAME * 8) {
                        let freed = Message::ChunksFreed {
                            chunks: part.to_vec(),
                            reason,
                        };
                        self.send(lender, &freed, &[]);
                    }
                }
                for lease in leases {
                    let all: Vec<ChunkId> = self
                        .reclaims
                        .iter()
                        .filter_map(|r| r.pending.get(&lease))
                        .flat_map(|s| s.iter().copied())
                        .collect();
                    self.settle(lease, &all);
                }
                self.borrows.retain(|(b, _), _| *b != id);
            }
            Some(Role::Lender { .. }) => {
                let picks: Vec<(LeaseId, Vec<ChunkId>)> = self
                    .ledger
                    .lender_gone(id)
                    .into_iter()
                    .map(|(lease, _, chunks)| (lease, chunks))
                    .collect();
                let chunk_bytes = self.ledger.lender(id).map_or(0, |b| b.chunk_bytes);
                let deadline = Instant::now() + self.config.lender_gone_deadline;
                self.start_revoke(None, deadline, chunk_bytes, picks);
                let open: Vec<u64> = self
                    .creates
                    .iter()
                    .filter(|(_, p)| p.lender == id)
                    .map(|(&r, _)| r)
                    .collect();
                for r in open {
                    let p = self.creates.remove(&r).expect("listed");
                    self.ledger.unreserve(p.lease, p.count);
                    self.borrow_progress(p.borrower, p.borrow, 0, Some("the lender left".into()));
                }
                for run in &mut self.reclaims {
                    if run.notify.is_some_and(|(l, _)| l == id) {
                        run.notify = None;
                    }
                }
            }
            _ => {}
        }
    }
}
