//! Opening and closing a store's conversation with its nodes: the front-door handshake, UCX
//! endpoints to the nodes' workers, region allocation, bounded control calls, and the
//! goodbye that gives regions back.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_core::units::format_size;
use strata_ucx::{AmAction, Context, ContextOptions, Endpoint, Worker};

use crate::handshake::{self, Welcome};
use crate::protocol::{AM_REPLY, AM_REQUEST, Op, ReplyHeader, RequestHeader, Status};

use super::{IoLoop, Node, Pacer, Reply, ReplyData};
use crate::client::{AccessPath, NetworkCounters, RemoteOpenError, RemoteStoreOptions};

impl IoLoop {
    /// Passes every node's front door, connects to its worker and borrows `per_node` bytes
    /// there (one region per node).
    pub(crate) fn connect(
        options: &RemoteStoreOptions,
        addresses: &[SocketAddr],
        per_node: u64,
        counters: Arc<NetworkCounters>,
    ) -> Result<Self, RemoteOpenError> {
        let ucx = |node: &str| {
            let node = node.to_string();
            move |source| RemoteOpenError::Ucx { node, source }
        };
        let first = options.nodes[0].as_str();
        let config = crate::footprint::ucx_config(
            options.transports.as_deref(),
            options.footprint,
            crate::footprint::env_is_set,
        );
        let context = Context::new(&ContextOptions {
            transports: config.transports,
            rma: options.access == AccessPath::OneSided,
            settings: config.settings,
        })
        .map_err(ucx(first))?;
        let worker = Worker::new(&context).map_err(ucx(first))?;
        let replies: Rc<RefCell<VecDeque<Reply>>> = Rc::default();
        let sink = Rc::clone(&replies);
        worker
            .set_am_handler(AM_REPLY, move |message| {
                let data = match message.length() {
                    0 => ReplyData::None,
                    _ => match message.hold() {
                        Some(held) => ReplyData::Held(held),
                        None => ReplyData::Copied(message.data().unwrap_or_default().to_vec()),
                    },
                };
                sink.borrow_mut().push_back(Reply {
                    header: ReplyHeader::decode(message.header()),
                    data,
                });
                AmAction::Done
            })
            .map_err(ucx(first))?;
        let pacer = |rate: Option<u64>| {
            rate.map(|bytes_per_sec| Pacer {
                bytes_per_sec,
                next_free: Instant::now(),
            })
        };
        let mut io = Self {
            worker,
            nodes: Vec::new(),
            replies,
            in_flight: HashMap::new(),
            next_id: 1,
            timeout: options.timeout,
            access: options.access,
            max_in_flight: options.max_in_flight.max(1),
            counters,
            pace_send: pacer(options.link_bytes_per_sec),
            pace_receive: pacer(options.link_bytes_per_sec),
            control: HashMap::new(),
        };
        let own_address = io.worker.address().map_err(ucx(first))?;
        for (name, address) in options.nodes.iter().zip(addresses) {
            let (welcome, door) = front_door(
                name,
                *address,
                &options.token,
                &own_address,
                options.timeout,
            )?;
            // A node on this host is reached over shared memory when both sides allow it;
            // such an endpoint cannot see the node die, so the front-door connection is
            // watched instead (`IoLoop::run`).
            let endpoint = if handshake::on_this_host(&door) {
                io.worker.connect_worker_on_host(&welcome.node_address)
            } else {
                io.worker.connect_worker(&welcome.node_address)
            }
            .map_err(ucx(name))?;
            io.nodes.push(Node {
                name: name.clone(),
                session: welcome.session,
                door: Some(door),
                endpoint: Some(endpoint),
                remote_key: None,
                region: 0,
                base: 0,
                size: 0,
                lost: None,
                in_flight: 0,
                waiting: VecDeque::new(),
                unflushed: false,
                flush_epoch: 0,
                flushed_epoch: 0,
                flushes: Vec::new(),
            });
        }
        for index in 0..io.nodes.len() {
            let name = io.nodes[index].name.clone();
            let alloc = RequestHeader {
                op: Op::Alloc,
                session: io.nodes[index].session,
                id: 0,
                region: 0,
                offset: 0,
                length: per_node,
            };
            let mut reply = io.control_call(index, alloc, &[])?;
            // Copy the key out and give UCX its buffer back before anything can fail.
            let key = match std::mem::replace(&mut reply.data, ReplyData::None) {
                ReplyData::Held(held) => {
                    let key = held.bytes().map(<[u8]>::to_vec).unwrap_or_default();
                    held.release(&io.worker);
                    key
                }
                ReplyData::Copied(bytes) => bytes,
                ReplyData::None => Vec::new(),
            };
            if let Some(refusal) = reply.header
                && refusal.status == Status::NoCapacity
            {
                return Err(RemoteOpenError::NoCapacity {
                    node: name,
                    asked: per_node,
                    free: refusal.size,
                });
            }
            let header = expect_ok(&name, &reply)?;
            let node = &mut io.nodes[index];
            node.region = header.region;
            node.base = header.base;
            node.size = header.size;
            if io.access == AccessPath::OneSided {
                if key.is_empty() {
                    return Err(RemoteOpenError::Refused {
                        node: name,
                        reason: "the node does not offer one-sided access (it needs `strata serve --one-sided` on InfiniBand/RoCE transports); use the messages access path",
                    });
                }
                let endpoint = node.endpoint.as_ref().expect("connected above");
                node.remote_key = Some(endpoint.unpack_remote_key(&key).map_err(ucx(&name))?);
            }
            tracing::debug!(node = %name, region = header.region, size = %format_size(header.size), "region borrowed");
        }
        Ok(io)
    }

    /// Sends a control request to node `index` and waits (bounded) for its reply; on every
    /// way out its slot goes, and a reply that came too late is given back to UCX.
    fn control_call(
        &mut self,
        index: usize,
        header: RequestHeader,
        data: &[u8],
    ) -> Result<Reply, RemoteOpenError> {
        let id = self.next_id;
        let outcome = self.control_call_once(index, header, data);
        if let Some(Some(late)) = self.control.remove(&id) {
            self.release(late.data);
        }
        outcome
    }

    fn control_call_once(
        &mut self,
        index: usize,
        mut header: RequestHeader,
        data: &[u8],
    ) -> Result<Reply, RemoteOpenError> {
        let name = self.nodes[index].name.clone();
        header.id = self.next_id;
        self.next_id += 1;
        self.control.insert(header.id, None);
        let endpoint =
            self.nodes[index]
                .endpoint
                .as_ref()
                .ok_or_else(|| RemoteOpenError::Connection {
                    node: name.clone(),
                    reason: "not connected".into(),
                })?;
        // SAFETY: `data` outlives this call: every return path below either sees the send
        // complete or closes the endpoint with force and drains it, which cancels the send.
        let mut request = unsafe {
            endpoint.am_send(
                AM_REQUEST,
                &header.encode(),
                data.as_ptr(),
                data.len(),
                true,
            )
        }
        .map_err(|source| RemoteOpenError::Ucx {
            node: name.clone(),
            source,
        })?;
        let deadline = Instant::now() + self.timeout;
        let mut sent = false;
        loop {
            while self.worker.progress() > 0 {}
            if !sent && let Some(outcome) = request.poll() {
                sent = true;
                if let Err(e) = outcome {
                    if let Some(endpoint) = self.nodes[index].endpoint.take() {
                        self.close_and_drain(endpoint);
                    }
                    return Err(RemoteOpenError::Connection {
                        node: name,
                        reason: e.to_string(),
                    });
                }
            }
            self.route_replies();
            if let Some((_, error)) = self
                .worker
                .take_endpoint_errors()
                .into_iter()
                .find(|(id, _)| Some(*id) == self.nodes[index].endpoint.as_ref().map(Endpoint::id))
            {
                if let Some(endpoint) = self.nodes[index].endpoint.take() {
                    self.close_and_drain(endpoint);
                }
                return Err(RemoteOpenError::Connection {
                    node: name,
                    reason: error.to_string(),
                });
            }
            if sent && let Some(reply) = self.control.get_mut(&header.id).and_then(Option::take) {
                self.control.remove(&header.id);
                return Ok(reply);
            }
            let now = Instant::now();
            if now >= deadline {
                // Cancel the send so UCX stops reading `data` before we return.
                if let Some(endpoint) = self.nodes[index].endpoint.take() {
                    self.close_and_drain(endpoint);
                }
                drop(request);
                return Err(RemoteOpenError::Timeout {
                    node: name,
                    timeout: self.timeout,
                });
            }
            let _ = self
                .worker
                .wait((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Closes an endpoint with force and progresses until UCX confirms (bounded), so no
    /// operation on it still touches a caller's buffer.
    pub(super) fn close_and_drain(&mut self, endpoint: Endpoint) {
        match endpoint.close(true) {
            Ok(mut request) => {
                let deadline = Instant::now() + Duration::from_secs(2);
                while request.poll().is_none() && Instant::now() < deadline {
                    self.worker.progress();
                }
            }
            Err(e) => tracing::debug!(error = %e, "closing a failed endpoint"),
        }
        // Progress once more so cancelled operations report completion.
        while self.worker.progress() > 0 {}
    }

    /// Gives the regions back and closes the connections (best effort, bounded).
    pub(crate) fn goodbye(&mut self) {
        for index in 0..self.nodes.len() {
            if self.nodes[index].lost.is_some() || self.nodes[index].endpoint.is_none() {
                continue;
            }
            self.nodes[index].remote_key = None;
            let free = RequestHeader {
                op: Op::Free,
                session: self.nodes[index].session,
                id: 0,
                region: self.nodes[index].region,
                offset: 0,
                length: 0,
            };
            let saved = self.timeout;
            self.timeout = saved.min(Duration::from_secs(1));
            match self.control_call(index, free, &[]) {
                Ok(reply) => self.release(reply.data),
                Err(e) => tracing::debug!(error = %e, "freeing a region at shutdown"),
            }
            self.timeout = saved;
            if let Some(endpoint) = self.nodes[index].endpoint.take() {
                match endpoint.close(false) {
                    Ok(mut request) => {
                        let deadline = Instant::now() + Duration::from_secs(1);
                        while request.poll().is_none() && Instant::now() < deadline {
                            self.worker.progress();
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "closing a connection at shutdown"),
                }
            }
        }
    }
}

/// Passes a node's front door (TCP handshake) and returns its session and worker address,
/// with the connection, which must stay open as long as the session is used.
fn front_door(
    node: &str,
    address: SocketAddr,
    token: &str,
    own_address: &[u8],
    timeout: Duration,
) -> Result<(Welcome, TcpStream), RemoteOpenError> {
    crate::client::through_door(node, address, timeout, |stream, deadline| {
        let _ = stream.set_nodelay(true);
        handshake::client_side(stream, token.as_bytes(), own_address, deadline)
    })
}

fn expect_ok(node: &str, reply: &Reply) -> Result<ReplyHeader, RemoteOpenError> {
    let header = reply.header.ok_or_else(|| RemoteOpenError::Connection {
        node: node.to_string(),
        reason: "malformed reply".into(),
    })?;
    if header.status == Status::Ok {
        Ok(header)
    } else {
        Err(RemoteOpenError::Refused {
            node: node.to_string(),
            reason: header.status.explain(),
        })
    }
}
