//! The I/O thread: owns the UCX worker and every endpoint, issues queued pieces (messages or
//! one-sided), matches replies, retires, paces and times pieces out, and marks nodes lost.

mod setup;

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use strata_core::store::StoreError;
use strata_ucx::{Endpoint, HeldAmData, RemoteKey, Request, Worker};

use super::lost_error;

use crate::handshake::Session;
use crate::protocol::{AM_REQUEST, Op, ReplyHeader, RequestHeader, Status};

use super::pieces::Piece;
use super::{AccessPath, NetworkCounters, Shared};

/// Closes the submission queue when the I/O thread ends (normally or by panic); queued
/// pieces fail as they drop.
pub(super) struct CloseQueueOnExit<'a>(pub(super) &'a Shared);

impl Drop for CloseQueueOnExit<'_> {
    fn drop(&mut self) {
        let left = self
            .0
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(left);
    }
}

struct Reply {
    header: Option<ReplyHeader>,
    data: ReplyData,
}

enum ReplyData {
    None,
    Held(HeldAmData),
    Copied(Vec<u8>),
}

struct Node {
    name: String,
    /// The capability the node's handshake issued; every request carries it.
    session: Session,
    /// The front-door connection, held open while the store lives: its closing tells the
    /// node this client is gone, even if it dies idle.
    door: Option<TcpStream>,
    endpoint: Option<Endpoint>,
    remote_key: Option<RemoteKey>,
    region: u64,
    base: u64,
    size: u64,
    lost: Option<String>,
    in_flight: usize,
    waiting: VecDeque<Piece>,
    /// One-sided writes: puts were issued since the last flush.
    unflushed: bool,
    /// One-sided writes: flushes issued so far; a put waits for flush number `epoch`.
    flush_epoch: u64,
    /// One-sided writes: the highest flush number that completed.
    flushed_epoch: u64,
    /// One-sided writes: flushes in flight, with their numbers. One flush per round covers
    /// every put issued in that round, instead of one flush per page.
    flushes: Vec<(u64, Request)>,
}

/// A piece on the wire and what it still waits for.
struct InFlight {
    piece: Piece,
    deadline: Instant,
    /// The send / get / put / flush / rendezvous-receive requests still pending.
    requests: Vec<Request>,
    /// Messages path: still waiting for the node's reply.
    awaiting_reply: bool,
    /// One-sided writes: the flush that makes this put remotely complete.
    flush_epoch: Option<u64>,
    failed: Option<StoreError>,
}

/// Paces pieces to an emulated link rate (one direction).
struct Pacer {
    bytes_per_sec: u64,
    next_free: Instant,
}

impl Pacer {
    /// When a transfer of `bytes` may start; reserves the link if now.
    fn admit(&mut self, bytes: usize, now: Instant) -> Option<Instant> {
        if now < self.next_free {
            return Some(self.next_free);
        }
        let seconds = bytes as f64 / self.bytes_per_sec as f64;
        self.next_free = now + Duration::from_secs_f64(seconds);
        None
    }
}

pub(crate) struct IoLoop {
    pub(super) worker: Worker,
    nodes: Vec<Node>,
    replies: Rc<RefCell<VecDeque<Reply>>>,
    in_flight: HashMap<u64, InFlight>,
    next_id: u64,
    timeout: Duration,
    access: AccessPath,
    max_in_flight: usize,
    counters: Arc<NetworkCounters>,
    pace_send: Option<Pacer>,
    pace_receive: Option<Pacer>,
    /// Control requests (hello, alloc, free) during set-up and tear-down: id -> reply.
    control: HashMap<u64, Option<Reply>>,
}

impl IoLoop {
    /// Hands replies to the control table or to in-flight pieces.
    fn route_replies(&mut self) {
        loop {
            let next = self.replies.borrow_mut().pop_front();
            let Some(reply) = next else { break };
            let Some(header) = reply.header else {
                tracing::warn!("malformed reply from a memory node dropped");
                self.release(reply.data);
                continue;
            };
            if let Some(slot) = self.control.get_mut(&header.id) {
                if slot.is_some() {
                    // A second reply to one control request: keep the first, free this one.
                    self.release(reply.data);
                } else {
                    *slot = Some(reply);
                }
                continue;
            }
            self.deliver(header, reply.data);
        }
    }

    fn release(&self, data: ReplyData) {
        if let ReplyData::Held(held) = data {
            held.release(&self.worker);
        }
    }

    /// Applies a reply to its in-flight piece.
    fn deliver(&mut self, header: ReplyHeader, data: ReplyData) {
        let Some(flight) = self.in_flight.get_mut(&header.id) else {
            // The piece already failed (its node was declared lost): drop the late reply.
            self.release(data);
            return;
        };
        flight.awaiting_reply = false;
        let node_name = self.nodes[flight.piece.node].name.clone();
        if header.status != Status::Ok {
            flight.failed = Some(StoreError::Unavailable {
                store: format!("remote:{node_name}"),
                reason: header.status.explain().to_string(),
            });
            self.release(data);
            return;
        }
        if flight.piece.write {
            self.release(data);
            return;
        }
        let length = flight.piece.length;
        let buffer = flight.piece.buffer as *mut u8;
        let wrong_length = |got: usize| StoreError::Corrupt {
            store: format!("remote:{node_name}"),
            offset: flight.piece.remote_offset,
            detail: format!("asked for {length} bytes, the node sent {got}"),
        };
        match data {
            // Nodes reply eagerly (the page travels with the reply). Receiving rendezvous
            // data would make this client fetch it from wherever the node's worker address
            // and key say (on one host, `cma` reads any process the client may trace), so
            // it is refused unread.
            ReplyData::Held(held) if held.is_rendezvous() => {
                held.release(&self.worker);
                flight.failed = Some(StoreError::Unavailable {
                    store: format!("remote:{node_name}"),
                    reason: "the node sent a rendezvous reply, which this client does not take; run a memory node of this version".into(),
                });
            }
            other => {
                let bytes: &[u8] = match &other {
                    ReplyData::Held(held) => held.bytes().unwrap_or_default(),
                    ReplyData::Copied(bytes) => bytes,
                    ReplyData::None => &[],
                };
                if bytes.len() == length {
                    // SAFETY: the caller's buffer has `length` writable bytes, is alive until
                    // the piece finishes, and cannot overlap UCX's receive buffer.
                    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer, length) };
                } else {
                    flight.failed = Some(wrong_length(bytes.len()));
                }
                if let ReplyData::Held(held) = other {
                    held.release(&self.worker);
                }
            }
        }
    }

    pub(crate) fn run(&mut self, shared: &Shared) {
        loop {
            while self.worker.progress() > 0 {}
            self.route_replies();
            for (id, error) in self.worker.take_endpoint_errors() {
                if let Some(index) = self
                    .nodes
                    .iter()
                    .position(|n| n.endpoint.as_ref().map(Endpoint::id) == Some(id))
                {
                    self.lose_node(index, format!("the connection failed ({error})"));
                }
            }
            let queued: Vec<Piece> = shared
                .queue
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .map(|q| q.drain(..).collect())
                .unwrap_or_default();
            for piece in queued {
                let node = piece.node;
                self.nodes[node].waiting.push_back(piece);
            }
            let next_pace = self.issue();
            self.flush_puts();
            self.poll_flushes();
            self.retire();
            let next_deadline = self.expire();
            if shared.stop.load(Ordering::SeqCst)
                && self.in_flight.is_empty()
                && self.nodes.iter().all(|n| n.waiting.is_empty())
            {
                break;
            }
            let now = Instant::now();
            // Requests still going out may wait for room in a shared-memory FIFO, which
            // frees without waking this worker: look again soon.
            let sending = self.in_flight.values().any(|f| !f.requests.is_empty());
            let mut wake_at = now
                + if sending {
                    Duration::from_millis(1)
                } else {
                    Duration::from_millis(50)
                };
            for t in [next_pace, next_deadline].into_iter().flatten() {
                wake_at = wake_at.min(t);
            }
            if wake_at > now && self.replies.borrow().is_empty() {
                self.wait_or_notice_closed_doors(wake_at - now);
            }
        }
        self.goodbye();
    }

    /// Sleeps until UCX has work, a submission wakes the worker, `timeout` passes, or a
    /// node's front-door connection closes; such a node is lost (the node stopped or died:
    /// a shared-memory endpoint would not tell, and a TCP one may tell later).
    fn wait_or_notice_closed_doors(&mut self, timeout: Duration) {
        let watched: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].lost.is_none() && self.nodes[i].door.is_some())
            .collect();
        let closed = {
            let doors: Vec<BorrowedFd<'_>> = watched
                .iter()
                .filter_map(|&i| self.nodes[i].door.as_ref().map(AsFd::as_fd))
                .collect();
            self.worker
                .wait_watching(timeout, &doors)
                .unwrap_or_default()
        };
        for position in closed {
            self.lose_node(
                watched[position],
                "the node closed its front-door connection (it stopped or died)".into(),
            );
        }
    }

    /// Issues waiting pieces up to the in-flight limit; returns when paced pieces may go.
    fn issue(&mut self) -> Option<Instant> {
        let mut next_pace = None;
        for index in 0..self.nodes.len() {
            while self.nodes[index].in_flight < self.max_in_flight {
                let Some(piece) = self.nodes[index].waiting.pop_front() else {
                    break;
                };
                if let Some(reason) = &self.nodes[index].lost {
                    let error = lost_error(&self.nodes[index].name, reason);
                    piece.finish(Err(error));
                    continue;
                }
                let now = Instant::now();
                let pacer = if piece.write {
                    self.pace_send.as_mut()
                } else {
                    self.pace_receive.as_mut()
                };
                if let Some(at) = pacer.and_then(|p| p.admit(piece.length, now)) {
                    self.nodes[index].waiting.push_front(piece);
                    next_pace = Some(next_pace.map_or(at, |n: Instant| n.min(at)));
                    break;
                }
                self.start(index, piece);
            }
        }
        next_pace
    }

    fn start(&mut self, index: usize, piece: Piece) {
        let id = self.next_id;
        self.next_id += 1;
        let node = &mut self.nodes[index];
        let store = format!("remote:{}", node.name);
        let endpoint = node
            .endpoint
            .as_ref()
            .expect("a node not lost has an endpoint");
        // Client-side bounds check: the node checks too on the messages path, and the NIC's
        // registration bounds on the one-sided path.
        if piece.remote_offset + piece.length as u64 > node.size {
            let error = StoreError::OutOfRange {
                store,
                offset: piece.remote_offset,
                len: piece.length as u64,
                size: node.size,
            };
            piece.finish(Err(error));
            return;
        }
        let mut requests = Vec::with_capacity(2);
        let mut awaiting_reply = false;
        // SAFETY: (all three paths) piece.buffer has piece.length bytes, readable (write) or
        // writable (read), alive until the piece finishes; a piece finishes only after every
        // request in `requests` completed or its endpoint was closed with force.
        let issued = unsafe {
            match (self.access, piece.write) {
                (AccessPath::Messages, write) => {
                    awaiting_reply = true;
                    let header = RequestHeader {
                        op: if write { Op::Write } else { Op::Read },
                        session: node.session,
                        id,
                        region: node.region,
                        offset: piece.remote_offset,
                        length: piece.length as u64,
                    };
                    let (data, length) = if write {
                        (piece.buffer as *const u8, piece.length)
                    } else {
                        (std::ptr::null(), 0)
                    };
                    endpoint.am_send(AM_REQUEST, &header.encode(), data, length, true)
                }
                (AccessPath::OneSided, false) => endpoint.get(
                    piece.buffer as *mut u8,
                    piece.length,
                    node.base + piece.remote_offset,
                    node.remote_key
                        .as_ref()
                        .expect("one-sided nodes hold a key"),
                ),
                (AccessPath::OneSided, true) => endpoint.put(
                    piece.buffer as *const u8,
                    piece.length,
                    node.base + piece.remote_offset,
                    node.remote_key
                        .as_ref()
                        .expect("one-sided nodes hold a key"),
                ),
            }
        };
        match issued {
            Ok(request) => requests.push(request),
            Err(e) => {
                // Operations already issued for this piece are cancelled when the node is
                // declared lost below.
                let reason = format!("sending a request failed ({e})");
                self.in_flight.insert(
                    id,
                    InFlight {
                        piece,
                        deadline: Instant::now(),
                        requests,
                        awaiting_reply: false,
                        flush_epoch: None,
                        failed: None,
                    },
                );
                self.nodes[index].in_flight += 1;
                self.lose_node(index, reason);
                return;
            }
        }
        if piece.write {
            self.counters
                .bytes_sent
                .fetch_add(piece.length as u64, Ordering::Relaxed);
        } else {
            self.counters
                .bytes_received
                .fetch_add(piece.length as u64, Ordering::Relaxed);
        }
        self.counters.operations.fetch_add(1, Ordering::Relaxed);
        node.in_flight += 1;
        let flush_epoch = (self.access == AccessPath::OneSided && piece.write).then(|| {
            node.unflushed = true;
            node.flush_epoch + 1
        });
        self.in_flight.insert(
            id,
            InFlight {
                piece,
                deadline: Instant::now() + self.timeout,
                requests,
                awaiting_reply,
                flush_epoch,
                failed: None,
            },
        );
    }

    /// Issues one flush per node that got puts this round (one-sided writes complete at the
    /// node only once a later flush completes).
    fn flush_puts(&mut self) {
        for index in 0..self.nodes.len() {
            let node = &mut self.nodes[index];
            if !node.unflushed || node.lost.is_some() {
                continue;
            }
            let Some(endpoint) = node.endpoint.as_ref() else {
                continue;
            };
            node.unflushed = false;
            node.flush_epoch += 1;
            match endpoint.flush() {
                Ok(request) => {
                    let epoch = node.flush_epoch;
                    node.flushes.push((epoch, request));
                }
                Err(e) => self.lose_node(index, format!("flushing writes failed ({e})")),
            }
        }
    }

    /// Notes completed flushes; a failed flush loses its node.
    fn poll_flushes(&mut self) {
        let mut failed = Vec::new();
        for (index, node) in self.nodes.iter_mut().enumerate() {
            let mut error = None;
            let mut done = node.flushed_epoch;
            node.flushes
                .retain_mut(|(epoch, request)| match request.poll() {
                    None => true,
                    Some(Ok(())) => {
                        done = done.max(*epoch);
                        false
                    }
                    Some(Err(e)) => {
                        error.get_or_insert(e);
                        false
                    }
                });
            node.flushed_epoch = done;
            if let Some(e) = error {
                failed.push((index, format!("flushing writes failed ({e})")));
            }
        }
        for (index, reason) in failed {
            self.lose_node(index, reason);
        }
    }

    /// Finishes pieces whose requests and reply are all in.
    fn retire(&mut self) {
        let mut done = Vec::new();
        for (id, flight) in &mut self.in_flight {
            let mut transport_error = None;
            flight.requests.retain_mut(|r| match r.poll() {
                None => true,
                Some(Ok(())) => false,
                Some(Err(e)) => {
                    transport_error.get_or_insert(e);
                    false
                }
            });
            if let Some(e) = transport_error {
                let store = format!("remote:{}", self.nodes[flight.piece.node].name);
                flight
                    .failed
                    .get_or_insert_with(|| StoreError::Unavailable {
                        store,
                        reason: format!("a transfer failed ({e}); the memory node may be gone"),
                    });
            }
            let flushed = flight
                .flush_epoch
                .is_none_or(|epoch| epoch <= self.nodes[flight.piece.node].flushed_epoch);
            if flight.requests.is_empty()
                && ((!flight.awaiting_reply && flushed) || flight.failed.is_some())
            {
                done.push(*id);
            }
        }
        for id in done {
            let flight = self.in_flight.remove(&id).expect("listed above");
            // A failed piece may still have a reply coming; a late reply finds no entry and
            // is dropped (deliver), so nothing writes to the buffer after this point...
            // unless a rendezvous receive is pending, which `requests.is_empty()` excludes.
            self.nodes[flight.piece.node].in_flight -= 1;
            let outcome = match flight.failed {
                Some(e) => Err(e),
                None => Ok(()),
            };
            flight.piece.finish(outcome);
        }
    }

    /// Declares nodes with overdue pieces lost; returns the next deadline.
    fn expire(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let overdue: Vec<usize> = self
            .in_flight
            .values()
            .filter(|f| f.deadline <= now)
            .map(|f| f.piece.node)
            .collect();
        for index in overdue {
            if self.nodes[index].lost.is_none() {
                let reason = format!("no answer within {:?}", self.timeout);
                self.lose_node(index, reason);
            }
        }
        self.in_flight.values().map(|f| f.deadline).min()
    }

    /// Marks a node lost: cancels everything on its endpoint, then fails its pieces.
    fn lose_node(&mut self, index: usize, reason: String) {
        if self.nodes[index].lost.is_some() {
            return;
        }
        tracing::error!(node = %self.nodes[index].name, %reason, "memory node lost");
        self.nodes[index].remote_key = None;
        if let Some(endpoint) = self.nodes[index].endpoint.take() {
            self.close_and_drain(endpoint);
        }
        self.nodes[index].door = None;
        self.nodes[index].flushes.clear();
        self.nodes[index].unflushed = false;
        self.nodes[index].lost = Some(reason.clone());
        let ids: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, f)| f.piece.node == index)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let flight = self.in_flight.remove(&id).expect("listed above");
            // The force close completed every operation on the endpoint; dropping the
            // requests frees them.
            drop(flight.requests);
            flight
                .piece
                .finish(Err(lost_error(&self.nodes[index].name, &reason)));
        }
        self.nodes[index].in_flight = 0;
        for piece in std::mem::take(&mut self.nodes[index].waiting) {
            piece.finish(Err(lost_error(&self.nodes[index].name, &reason)));
        }
    }
}

impl Drop for IoLoop {
    /// Gives UCX back every reply still held (queued, or parked for a control call that gave
    /// up), on every way out, set-up failures included; a dropped one would leak inside UCX.
    fn drop(&mut self) {
        let mut leftovers: Vec<Reply> = self.replies.borrow_mut().drain(..).collect();
        leftovers.extend(self.control.drain().filter_map(|(_, reply)| reply));
        for reply in leftovers {
            self.release(reply.data);
        }
    }
}
