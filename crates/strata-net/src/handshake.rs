//! The front door: a TCP handshake, in our code, that a client must pass before anything of
//! it reaches UCX.
//!
//! Mutual HMAC-SHA256 challenge-response over the shared token; the token itself never
//! travels. Every message before authentication has a fixed size, or a length checked against
//! [`MAX_WORKER_ADDRESS`] before it is read, and every read runs against one deadline for the
//! whole handshake, so a silent, slow or garbage-sending peer costs the node one bounded
//! thread for at most that long.
//!
//! ```text
//! node   -> client  NODE_MAGIC, version u64, status u8, node nonce [32]
//! client -> node    CLIENT_MAGIC, version u64, client nonce [32], client MAC [32],
//!                   address length u32, client worker address
//! node   -> client  status u8; if Ok: node MAC [32], session [16], address length u32,
//!                   node worker address; if Busy: reason u8 (see below)
//! ```
//! The client MAC covers both nonces and the client's worker address; the node MAC covers
//! both nonces, the session and the node's worker address, so neither side accepts an address
//! or session an on-path party swapped. The session is a random capability the client puts in
//! every request; the node serves only requests whose session it issued. The handshake
//! authenticates; it does not encrypt: an on-path attacker sees the pages and the session.
//!
//! A node that accepts the proof but gives the client no session answers `Busy` followed by
//! a [`Refusal`] byte saying why (all clients taken, or the client's UCX worker unreachable),
//! so the client can say what to fix. The byte came after version 4 was fixed, so it is
//! optional: a node that sends none closes the connection after `Busy`, and the client then
//! names every possible reason; a client that does not read it just closes.
//!
//! A client may instead ask how much the node can still lend ([`query_capacity`]): its proof
//! then carries no worker address (length 0) and a MAC of its own label, and the node answers
//! `status u8; if Ok: node MAC [32], free u64, capacity u64` (the MAC covers both nonces and
//! both numbers) and closes. No session is issued and nothing reaches UCX; only a holder of
//! the token learns the numbers. `strata run` sizes a process's arena with it.
//!
//! A client on the node's host may ask for memory lent as a file ([`ask_for_file`]): its
//! proof starts with [`CLIENT_FILE_MAGIC`], carries the bytes it wants (u64) where an address
//! would go and a MAC of its own label over both nonces and the request; the node answers
//! `status u8; if Ok: node MAC [32], pid u32, fd u32, name [16]` (the MAC covers both nonces
//! and the grant) or `Busy` with [`Refusal::NoFile`]. The connection then stays open as the
//! loan's lifeline, as a session's does.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// First bytes of the node's greeting.
pub const NODE_MAGIC: [u8; 8] = *b"STRATA-N";
/// First bytes of the client's proof.
pub const CLIENT_MAGIC: [u8; 8] = *b"STRATA-C";
/// First bytes of the proof of a client that asks for memory lent as a file
/// ([`ask_for_file`]).
pub const CLIENT_FILE_MAGIC: [u8; 8] = *b"STRATA-F";
/// Handshake version; a node refuses another. Version 3: two ends on one host (see
/// [`on_this_host`]) connect their UCX endpoints without peer-failure handling so UCX may use
/// shared memory; both ends must agree on that, or the endpoints never pair. Version 4: the
/// capacity query ([`query_capacity`]), and a refused region's reply says how much the node
/// has free. Version 5: shared-memory FIFOs of [`crate::footprint::FIFO_ENTRIES`] entries at
/// both ends instead of 1024; UCX needs both ends to use the same size, so a version 4 peer is
/// refused at the door rather than hanging or crashing on the first message. Version 6: a
/// client on the node's host may ask for memory lent as a file ([`ask_for_file`]).
pub const HANDSHAKE_VERSION: u64 = 6;
/// Largest UCX worker address either side accepts (InfiniBand addresses are a few hundred
/// bytes; this leaves room for many devices).
pub const MAX_WORKER_ADDRESS: usize = 8 << 10;
/// Fewest bytes a token may have.
pub const MIN_TOKEN_BYTES: usize = 16;

/// Bytes of a nonce.
const NONCE: usize = 32;
/// Bytes of an HMAC-SHA256 tag.
const TAG: usize = 32;
/// Bytes of a session.
pub const SESSION_BYTES: usize = 16;
/// A session: the capability an authenticated client puts in every request.
pub type Session = [u8; SESSION_BYTES];

/// Encoded size of the node's greeting.
pub const GREETING_BYTES: usize = 8 + 8 + 1 + NONCE;
/// Encoded size of the client's proof before its worker address.
pub const PROOF_BYTES: usize = 8 + 8 + NONCE + TAG + 4;

/// A verdict byte of the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Verdict {
    /// Go on / admitted.
    Ok = 0,
    /// The proof did not match the token (or the version differs).
    Denied = 1,
    /// The node is at its connection cap, or this peer failed recently and must wait.
    Busy = 2,
}

impl Verdict {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Verdict::Ok,
            1 => Verdict::Denied,
            2 => Verdict::Busy,
            _ => return None,
        })
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer did not finish within the deadline.
    #[error("the handshake did not finish in time")]
    Deadline,
    /// The connection failed.
    #[error("the handshake connection failed: {0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection mid-handshake.
    #[error("the peer closed the connection during the handshake")]
    Closed,
    /// The peer is not a Strata node or client of this version.
    #[error("the peer does not speak the Strata handshake version {HANDSHAKE_VERSION}: {0}")]
    Protocol(&'static str),
    /// The proof did not match the token.
    #[error(
        "the token does not match; use the memory node's token (STRATA_REMOTE_TOKEN) and the same Strata version"
    )]
    Denied,
    /// The node turned the connection away before the handshake: it is at its cap of
    /// handshakes, or throttles this peer after failures.
    #[error(
        "the memory node is at its connection limit or throttles this host after failed attempts; retry later"
    )]
    Busy,
    /// The node accepted the proof but gave no session.
    #[error("{0}")]
    Refused(Refusal),
    /// The node's answer did not prove knowledge of the token.
    #[error("the memory node could not prove it knows the token; it is not the node you meant")]
    NodeNotAuthentic,
}

/// Why a node that accepted a client's proof gave it no session: the byte after its `Busy`
/// verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Refusal {
    /// No reason came (a node that does not send one) or one this client does not know.
    Unknown = 0,
    /// The node serves its maximum number of clients.
    Full = 1,
    /// The node could not connect a UCX endpoint to the client's worker address.
    Unreachable = 2,
    /// The node did not take the client before the handshake deadline (it is stopping or
    /// overloaded).
    NoAnswer = 3,
    /// The node lends this client no file (it is not on the node's host, the node
    /// overcommits or has it turned off, has too little free, or cannot make one): the client
    /// asks for messages instead.
    NoFile = 4,
}

impl Refusal {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Refusal::Full,
            2 => Refusal::Unreachable,
            3 => Refusal::NoAnswer,
            4 => Refusal::NoFile,
            _ => Refusal::Unknown,
        }
    }
}

/// How to tell that the node cannot reach the client's worker, and what to check.
const CHECK_REACHABLE: &str = "check that the memory node can open connections to this host's addresses (firewall, routing) and that both sides have a UCX transport in common (strata serve --transports, UCX_TLS, UCX_NET_DEVICES)";

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unknown => write!(
                f,
                "the memory node accepted the token but gave this client no session: it serves its maximum number of clients (strata serve --max-clients; retry when one has left), or it cannot reach this host's UCX worker ({CHECK_REACHABLE}); the node's log says which"
            ),
            Refusal::Full => write!(
                f,
                "the memory node accepted the token but serves its maximum number of clients (strata serve --max-clients); retry when one has left, or raise the limit"
            ),
            Refusal::Unreachable => write!(
                f,
                "the memory node accepted the token but cannot reach this host's UCX worker: {CHECK_REACHABLE}; the node's log has UCX's error"
            ),
            Refusal::NoAnswer => write!(
                f,
                "the memory node accepted the token but did not take this client before the handshake deadline (it is stopping or overloaded); retry later, or raise strata serve --handshake-timeout"
            ),
            Refusal::NoFile => write!(
                f,
                "the memory node lends this client no memory as a file (it runs on another host or in another namespace, overcommits, was started with --lend-files false, or has too little free); the client reaches it over messages instead"
            ),
        }
    }
}

/// Longest a client waits for a [`Refusal`] byte after `Busy` (a node that sends none closes
/// the connection at once, so this only bounds a stalled one).
const REFUSAL_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// What the node learns from a client that passed.
#[derive(Debug)]
pub struct Admitted {
    /// The client's UCX worker address.
    pub client_address: Vec<u8>,
}

/// How much a node can lend, as its front door reports it to a client that proved the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCapacity {
    /// Bytes not lent to any client now.
    pub free: u64,
    /// Most bytes the node lends to all clients together (`strata serve --capacity`).
    pub capacity: u64,
}

/// Encoded size of the node's answer to a capacity query after its verdict byte.
const CAPACITY_ANSWER_BYTES: usize = TAG + 8 + 8;

/// What a client that passed the node's side of the handshake came for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// A session (it was admitted, or refused as busy).
    Session,
    /// The node's free capacity (answered; no session).
    Capacity,
    /// Memory lent as a file (granted; the connection is the loan's lifeline).
    File,
}

/// Where a client on the node's host opens the memory a node lent it as a file: the node's
/// descriptor of a memory file (`memfd`) whose name carries `name`, opened through
/// `/proc/PID/fd/FD`. The node's proof covers all three, and the client checks the name of
/// what it opened, so a different process or file is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileGrant {
    /// The node's process id (in the client's PID namespace if they share it).
    pub pid: u32,
    /// The node's descriptor of the file.
    pub fd: u32,
    /// Random bytes in the file's name.
    pub name: [u8; 16],
}

/// Encoded size of a [`FileGrant`].
const FILE_GRANT_BYTES: usize = 4 + 4 + 16;
/// Encoded size of a file request in a proof: the bytes wanted (u64).
const FILE_REQUEST_BYTES: usize = 8;

impl FileGrant {
    /// A grant of process `pid` for a file still to be made (descriptor 0 until it is), with
    /// fresh random bytes for its name.
    pub fn with_random_name(pid: u32) -> Self {
        Self {
            pid,
            fd: 0,
            name: random(),
        }
    }
    fn encode(&self) -> [u8; FILE_GRANT_BYTES] {
        let mut b = [0u8; FILE_GRANT_BYTES];
        b[..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.fd.to_le_bytes());
        b[8..].copy_from_slice(&self.name);
        b
    }
    fn decode(b: &[u8; FILE_GRANT_BYTES]) -> Self {
        let mut name = [0u8; 16];
        name.copy_from_slice(&b[8..]);
        Self {
            pid: u32_at(b, 0),
            fd: u32_at(b, 4),
            name,
        }
    }
    /// The file's name as the node creates it (and `/proc` shows it, after `memfd:`).
    pub fn file_name(&self) -> String {
        let hex: String = self.name.iter().map(|b| format!("{b:02x}")).collect();
        format!("strata-lent-{hex}")
    }
}

/// What the client learns from a node that admitted it.
#[derive(Debug)]
pub struct Welcome {
    /// The session to put in every request.
    pub session: Session,
    /// The node's UCX worker address.
    pub node_address: Vec<u8>,
}

fn mac(token: &[u8], label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes keys of any size");
    m.update(label);
    m.update(&HANDSHAKE_VERSION.to_le_bytes());
    for part in parts {
        m.update(&(part.len() as u64).to_le_bytes());
        m.update(part);
    }
    m
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::Rng::fill(&mut rand::rng(), &mut bytes[..]);
    bytes
}

/// Reads exactly `buf.len()` bytes, each read bounded by what is left of `deadline`.
fn read_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), HandshakeError> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(HandshakeError::Deadline)?;
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => return Err(HandshakeError::Closed),
            Ok(n) => done += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(HandshakeError::Deadline);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_by(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), HandshakeError> {
    let left = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(HandshakeError::Deadline)?;
    stream.set_write_timeout(Some(left))?;
    stream.write_all(bytes).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => HandshakeError::Deadline,
        _ => e.into(),
    })
}

/// The wire length of a worker address; refuses one the peer would refuse.
fn encoded_len(address: &[u8]) -> Result<[u8; 4], HandshakeError> {
    match u32::try_from(address.len()) {
        Ok(n) if (1..=MAX_WORKER_ADDRESS).contains(&address.len()) => Ok(n.to_le_bytes()),
        _ => Err(HandshakeError::Protocol(
            "this side's UCX worker address is longer than the handshake allows",
        )),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// Tells a peer the node will not talk to it now (cap reached or throttled), then returns.
pub fn turn_away(stream: &mut TcpStream, deadline: Instant) {
    let mut greeting = [0u8; GREETING_BYTES];
    greeting[..8].copy_from_slice(&NODE_MAGIC);
    greeting[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    greeting[16] = Verdict::Busy as u8;
    let _ = write_by(stream, &greeting, deadline);
}

/// The node's side: greets, checks the client's proof, and on success lets `admit` register
/// the client (it returns the session, or why the node cannot take it, which the client is
/// told), then proves itself and sends the session and `node_address`. A proof without a worker address asks
/// for the node's capacity instead: `capacity` says it, and no session is issued.
pub fn node_side(
    stream: &mut TcpStream,
    token: &[u8],
    node_address: &[u8],
    deadline: Instant,
    admit: impl FnOnce(Admitted) -> Result<Session, Refusal>,
    capacity: impl FnOnce() -> NodeCapacity,
) -> Result<Visit, HandshakeError> {
    node_side_lending(
        stream,
        token,
        node_address,
        deadline,
        admit,
        capacity,
        |_| Err(Refusal::NoFile),
    )
}

/// [`node_side`] for a node that may lend memory as files: `lend_file` gets the bytes a
/// client on this host asked for ([`ask_for_file`]) and answers with the grant or why not.
pub fn node_side_lending(
    stream: &mut TcpStream,
    token: &[u8],
    node_address: &[u8],
    deadline: Instant,
    admit: impl FnOnce(Admitted) -> Result<Session, Refusal>,
    capacity: impl FnOnce() -> NodeCapacity,
    lend_file: impl FnOnce(u64) -> Result<FileGrant, Refusal>,
) -> Result<Visit, HandshakeError> {
    let node_nonce: [u8; NONCE] = random();
    let mut greeting = [0u8; GREETING_BYTES];
    greeting[..8].copy_from_slice(&NODE_MAGIC);
    greeting[8..16].copy_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    greeting[16] = Verdict::Ok as u8;
    greeting[17..].copy_from_slice(&node_nonce);
    write_by(stream, &greeting, deadline)?;
    let mut proof = [0u8; PROOF_BYTES];
    read_by(stream, &mut proof, deadline)?;
    let proof = decode_proof(&proof)?;
    if proof.wants_file {
        return answer_file(stream, token, &node_nonce, &proof, deadline, lend_file);
    }
    if proof.address_len == 0 {
        return answer_capacity(stream, token, &node_nonce, &proof, deadline, capacity);
    }
    let mut client_address = vec![0u8; proof.address_len];
    read_by(stream, &mut client_address, deadline)?;
    let verified = mac(
        token,
        b"strata client",
        &[&node_nonce, &proof.nonce, &client_address],
    )
    .verify_slice(&proof.tag)
    .is_ok();
    deny_unless(stream, verified, deadline)?;
    let session = refuse_unless(stream, admit(Admitted { client_address }), deadline)?;
    let tag = mac(
        token,
        b"strata node",
        &[&proof.nonce, &node_nonce, &session, node_address],
    )
    .finalize()
    .into_bytes();
    let mut welcome = Vec::with_capacity(1 + TAG + SESSION_BYTES + 4 + node_address.len());
    welcome.push(Verdict::Ok as u8);
    welcome.extend_from_slice(&tag);
    welcome.extend_from_slice(&session);
    welcome.extend_from_slice(&encoded_len(node_address)?);
    welcome.extend_from_slice(node_address);
    write_by(stream, &welcome, deadline)?;
    Ok(Visit::Session)
}

/// Tells the client its proof was wrong unless `verified`.
fn deny_unless(
    stream: &mut TcpStream,
    verified: bool,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    if verified {
        return Ok(());
    }
    write_by(stream, &[Verdict::Denied as u8], deadline)?;
    Err(HandshakeError::Denied)
}

/// What the node grants, or `Busy` and the refusal's byte sent to the client.
fn refuse_unless<T>(
    stream: &mut TcpStream,
    outcome: Result<T, Refusal>,
    deadline: Instant,
) -> Result<T, HandshakeError> {
    match outcome {
        Ok(granted) => Ok(granted),
        Err(refusal) => {
            write_by(stream, &[Verdict::Busy as u8, refusal as u8], deadline)?;
            Err(HandshakeError::Refused(refusal))
        }
    }
}

/// The node's answer to a capacity query whose proof (without an address) was read.
fn answer_capacity(
    stream: &mut TcpStream,
    token: &[u8],
    node_nonce: &[u8; NONCE],
    proof: &Proof,
    deadline: Instant,
    capacity: impl FnOnce() -> NodeCapacity,
) -> Result<Visit, HandshakeError> {
    let verified = mac(token, b"strata query", &[node_nonce, &proof.nonce])
        .verify_slice(&proof.tag)
        .is_ok();
    deny_unless(stream, verified, deadline)?;
    let NodeCapacity { free, capacity } = capacity();
    let (free, capacity) = (free.to_le_bytes(), capacity.to_le_bytes());
    let tag = mac(
        token,
        b"strata capacity",
        &[&proof.nonce, node_nonce, &free, &capacity],
    )
    .finalize()
    .into_bytes();
    let mut answer = Vec::with_capacity(1 + CAPACITY_ANSWER_BYTES);
    answer.push(Verdict::Ok as u8);
    answer.extend_from_slice(&tag);
    answer.extend_from_slice(&free);
    answer.extend_from_slice(&capacity);
    write_by(stream, &answer, deadline)?;
    Ok(Visit::Capacity)
}

/// The node's answer to a file request whose proof (without its request) was read.
fn answer_file(
    stream: &mut TcpStream,
    token: &[u8],
    node_nonce: &[u8; NONCE],
    proof: &Proof,
    deadline: Instant,
    lend_file: impl FnOnce(u64) -> Result<FileGrant, Refusal>,
) -> Result<Visit, HandshakeError> {
    let mut request = [0u8; FILE_REQUEST_BYTES];
    read_by(stream, &mut request, deadline)?;
    let verified = mac(
        token,
        b"strata file client",
        &[node_nonce, &proof.nonce, &request],
    )
    .verify_slice(&proof.tag)
    .is_ok();
    deny_unless(stream, verified, deadline)?;
    let grant = refuse_unless(stream, lend_file(u64_at(&request, 0)), deadline)?.encode();
    let tag = mac(
        token,
        b"strata file node",
        &[&proof.nonce, node_nonce, &grant],
    )
    .finalize()
    .into_bytes();
    let mut answer = Vec::with_capacity(1 + TAG + FILE_GRANT_BYTES);
    answer.push(Verdict::Ok as u8);
    answer.extend_from_slice(&tag);
    answer.extend_from_slice(&grant);
    write_by(stream, &answer, deadline)?;
    Ok(Visit::File)
}

/// A decoded client proof (before its worker address).
#[derive(Debug, PartialEq, Eq)]
pub struct Proof {
    nonce: [u8; NONCE],
    tag: [u8; TAG],
    /// Length of the worker address that follows (checked against [`MAX_WORKER_ADDRESS`]);
    /// 0 for a capacity query; the request's for a file.
    pub address_len: usize,
    /// The client asks for memory lent as a file ([`CLIENT_FILE_MAGIC`]).
    pub wants_file: bool,
}

/// Decodes a client proof; refuses a wrong magic, version or an address over the limit.
pub fn decode_proof(b: &[u8; PROOF_BYTES]) -> Result<Proof, HandshakeError> {
    let wants_file = b[..8] == CLIENT_FILE_MAGIC;
    if b[..8] != CLIENT_MAGIC && !wants_file {
        return Err(HandshakeError::Protocol("not a Strata client"));
    }
    if u64_at(b, 8) != HANDSHAKE_VERSION {
        return Err(HandshakeError::Protocol("another handshake version"));
    }
    let mut nonce = [0u8; NONCE];
    nonce.copy_from_slice(&b[16..16 + NONCE]);
    let mut tag = [0u8; TAG];
    tag.copy_from_slice(&b[16 + NONCE..16 + NONCE + TAG]);
    let address_len = u32_at(b, 16 + NONCE + TAG) as usize;
    if address_len > MAX_WORKER_ADDRESS {
        return Err(HandshakeError::Protocol(
            "worker address length out of bounds",
        ));
    }
    if wants_file && address_len != FILE_REQUEST_BYTES {
        return Err(HandshakeError::Protocol("file request of the wrong length"));
    }
    Ok(Proof {
        nonce,
        tag,
        address_len,
        wants_file,
    })
}

/// Reads the node's greeting and checks that it comes from a Strata memory node of this
/// version that takes clients now.
fn read_greeting(
    stream: &mut TcpStream,
    deadline: Instant,
) -> Result<[u8; GREETING_BYTES], HandshakeError> {
    let mut greeting = [0u8; GREETING_BYTES];
    read_by(stream, &mut greeting, deadline)?;
    if greeting[..8] != NODE_MAGIC || u64_at(&greeting, 8) != HANDSHAKE_VERSION {
        return Err(HandshakeError::Protocol(
            "not a Strata memory node of this version",
        ));
    }
    match Verdict::from_u8(greeting[16]) {
        Some(Verdict::Ok) => Ok(greeting),
        Some(Verdict::Busy) => Err(HandshakeError::Busy),
        _ => Err(HandshakeError::Protocol("unknown greeting status")),
    }
}

/// A reachability check: reads the node's greeting and stops (the caller closes the
/// connection). It shows that a Strata memory node of this version listens there and takes
/// clients now, in one TCP round trip and without UCX; it proves nothing about the token.
/// The node sees a peer that closed during the handshake (not a failed proof, so it is not
/// throttled).
pub fn greeting_only(stream: &mut TcpStream, deadline: Instant) -> Result<(), HandshakeError> {
    read_greeting(stream, deadline).map(|_| ())
}

/// What a client's proof asks for.
enum Ask<'a> {
    /// A session for this UCX worker address.
    Session(&'a [u8]),
    /// The node's free capacity.
    Capacity,
    /// This many bytes lent as a file.
    File(u64),
}

/// Sends the client's proof for `ask` (each kind under its own MAC label) in answer to the
/// node's greeting; returns the client's nonce.
fn send_proof(
    stream: &mut TcpStream,
    token: &[u8],
    greeting: &[u8; GREETING_BYTES],
    ask: Ask<'_>,
    deadline: Instant,
) -> Result<[u8; NONCE], HandshakeError> {
    let node_nonce = &greeting[17..];
    let client_nonce: [u8; NONCE] = random();
    let file_request;
    let (magic, label, address): (_, &[u8], &[u8]) = match ask {
        Ask::Session(address) => (CLIENT_MAGIC, b"strata client", address),
        Ask::Capacity => (CLIENT_MAGIC, b"strata query", &[]),
        Ask::File(bytes) => {
            file_request = bytes.to_le_bytes();
            (CLIENT_FILE_MAGIC, b"strata file client", &file_request)
        }
    };
    let (tag, length) = if address.is_empty() {
        (mac(token, label, &[node_nonce, &client_nonce]), [0u8; 4])
    } else {
        (
            mac(token, label, &[node_nonce, &client_nonce, address]),
            encoded_len(address)?,
        )
    };
    let mut proof = Vec::with_capacity(PROOF_BYTES + address.len());
    proof.extend_from_slice(&magic);
    proof.extend_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    proof.extend_from_slice(&client_nonce);
    proof.extend_from_slice(&tag.finalize().into_bytes());
    proof.extend_from_slice(&length);
    proof.extend_from_slice(address);
    write_by(stream, &proof, deadline)?;
    Ok(client_nonce)
}

/// Reads the node's verdict on a proof; a `Busy` verdict is followed by why (if the node
/// says).
fn read_verdict(stream: &mut TcpStream, deadline: Instant) -> Result<(), HandshakeError> {
    let mut verdict = [0u8; 1];
    read_by(stream, &mut verdict, deadline)?;
    match Verdict::from_u8(verdict[0]) {
        Some(Verdict::Ok) => Ok(()),
        Some(Verdict::Denied) => Err(HandshakeError::Denied),
        Some(Verdict::Busy) => {
            let mut reason = [0u8; 1];
            let by = deadline.min(Instant::now() + REFUSAL_WAIT);
            let refusal = match read_by(stream, &mut reason, by) {
                Ok(()) => Refusal::from_u8(reason[0]),
                // A node that sends no reason closes the connection after the verdict.
                Err(_) => Refusal::Unknown,
            };
            Err(HandshakeError::Refused(refusal))
        }
        None => Err(HandshakeError::Protocol("unknown verdict")),
    }
}

/// The client's side: answers the node's challenge with a proof over `client_address`, checks
/// the node's proof, and returns the session and the node's worker address.
pub fn client_side(
    stream: &mut TcpStream,
    token: &[u8],
    client_address: &[u8],
    deadline: Instant,
) -> Result<Welcome, HandshakeError> {
    if client_address.is_empty() {
        return Err(HandshakeError::Protocol(
            "this side's UCX worker address is empty",
        ));
    }
    let greeting = read_greeting(stream, deadline)?;
    let node_nonce = &greeting[17..];
    let client_nonce = send_proof(
        stream,
        token,
        &greeting,
        Ask::Session(client_address),
        deadline,
    )?;
    read_verdict(stream, deadline)?;
    let mut head = [0u8; TAG + SESSION_BYTES + 4];
    read_by(stream, &mut head, deadline)?;
    let address_len = u32_at(&head, TAG + SESSION_BYTES) as usize;
    if address_len == 0 || address_len > MAX_WORKER_ADDRESS {
        return Err(HandshakeError::Protocol(
            "node worker address length out of bounds",
        ));
    }
    let mut node_address = vec![0u8; address_len];
    read_by(stream, &mut node_address, deadline)?;
    let mut session = [0u8; SESSION_BYTES];
    session.copy_from_slice(&head[TAG..TAG + SESSION_BYTES]);
    mac(
        token,
        b"strata node",
        &[&client_nonce, node_nonce, &session, &node_address],
    )
    .verify_slice(&head[..TAG])
    .map_err(|_| HandshakeError::NodeNotAuthentic)?;
    Ok(Welcome {
        session,
        node_address,
    })
}

/// Asks a node how much it can lend: proves the token (a wrong one is refused as by
/// [`client_side`], and counts as a failed attempt), checks the node's proof over the
/// numbers, and returns them. One TCP conversation, no UCX, no session.
pub fn query_capacity(
    stream: &mut TcpStream,
    token: &[u8],
    deadline: Instant,
) -> Result<NodeCapacity, HandshakeError> {
    let greeting = read_greeting(stream, deadline)?;
    let node_nonce = &greeting[17..];
    let client_nonce = send_proof(stream, token, &greeting, Ask::Capacity, deadline)?;
    read_verdict(stream, deadline)?;
    let mut answer = [0u8; CAPACITY_ANSWER_BYTES];
    read_by(stream, &mut answer, deadline)?;
    let (free, capacity) = (&answer[TAG..TAG + 8], &answer[TAG + 8..]);
    mac(
        token,
        b"strata capacity",
        &[&client_nonce, node_nonce, free, capacity],
    )
    .verify_slice(&answer[..TAG])
    .map_err(|_| HandshakeError::NodeNotAuthentic)?;
    Ok(NodeCapacity {
        free: u64_at(&answer, TAG),
        capacity: u64_at(&answer, TAG + 8),
    })
}

/// Asks a node on this host for `bytes` of memory lent as a file: proves the token (a wrong
/// one is refused as by [`client_side`]), checks the node's proof over the grant, and
/// returns where to open the file. The connection stays open as the loan's lifeline: the
/// node takes the file back when it closes. A node that lends no file here answers with
/// [`Refusal::NoFile`].
pub fn ask_for_file(
    stream: &mut TcpStream,
    token: &[u8],
    bytes: u64,
    deadline: Instant,
) -> Result<FileGrant, HandshakeError> {
    let greeting = read_greeting(stream, deadline)?;
    let node_nonce = &greeting[17..];
    let client_nonce = send_proof(stream, token, &greeting, Ask::File(bytes), deadline)?;
    read_verdict(stream, deadline)?;
    let mut answer = [0u8; TAG + FILE_GRANT_BYTES];
    read_by(stream, &mut answer, deadline)?;
    let mut grant = [0u8; FILE_GRANT_BYTES];
    grant.copy_from_slice(&answer[TAG..]);
    mac(
        token,
        b"strata file node",
        &[&client_nonce, node_nonce, &grant],
    )
    .verify_slice(&answer[..TAG])
    .map_err(|_| HandshakeError::NodeNotAuthentic)?;
    Ok(FileGrant::decode(&grant))
}

/// A fresh random session.
pub fn new_session() -> Session {
    random()
}

/// Whether a TCP connection joins two ends on this host (in one network namespace): the
/// kernel gave it the same local and peer address. Both sides of a front door ask this to
/// decide whether UCX may use shared memory between them.
pub fn on_this_host(stream: &TcpStream) -> bool {
    match (stream.local_addr(), stream.peer_addr()) {
        (Ok(local), Ok(peer)) => local.ip() == peer.ip(),
        _ => false,
    }
}
