//! The wire protocol between `RemoteStore` clients and memory nodes: two active-message ids,
//! fixed little-endian headers, payloads carried as AM data.
//!
//! Every request carries a client-chosen id that the reply echoes, so many requests can be in
//! flight on one endpoint and complete in any order.

/// Active-message id of client-to-node requests.
pub const AM_REQUEST: u32 = 0x5354_0001;
/// Active-message id of node-to-client replies.
pub const AM_REPLY: u32 = 0x5354_0002;

/// Protocol version (the handshake carries it; see `handshake::HANDSHAKE_VERSION`).
pub const PROTOCOL_VERSION: u64 = crate::handshake::HANDSHAKE_VERSION;

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Lend a region of `length` bytes.
    Alloc = 2,
    /// Give region `region` back.
    Free = 3,
    /// Read `length` bytes at `offset` of `region` (reply data = the bytes).
    Read = 4,
    /// Write the data at `offset` of `region`.
    Write = 5,
}

impl Op {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            2 => Op::Alloc,
            3 => Op::Free,
            4 => Op::Read,
            5 => Op::Write,
            _ => return None,
        })
    }
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// The operation.
    pub op: Op,
    /// The session the handshake issued; the node serves no request without a live one.
    pub session: crate::handshake::Session,
    /// Echoed in the reply.
    pub id: u64,
    /// Region the operation applies to (Read, Write, Free).
    pub region: u64,
    /// Byte offset inside the region.
    pub offset: u64,
    /// Byte count (Read, Write, Alloc).
    pub length: u64,
}

/// Encoded size of a [`RequestHeader`].
pub const REQUEST_HEADER_BYTES: usize = 56;

impl RequestHeader {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0] = self.op as u8;
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.region.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.length.to_le_bytes());
        b[40..56].copy_from_slice(&self.session);
        b
    }
    /// Decodes a header; `None` if it is malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != REQUEST_HEADER_BYTES {
            return None;
        }
        let mut session = [0u8; crate::handshake::SESSION_BYTES];
        session.copy_from_slice(&b[40..56]);
        Some(Self {
            op: Op::from_u8(b[0])?,
            session,
            id: u64_at(b, 8),
            region: u64_at(b, 16),
            offset: u64_at(b, 24),
            length: u64_at(b, 32),
        })
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(word)
}

/// How a node answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The token was wrong (or the protocol version differs).
    Denied = 1,
    /// A request other than Hello came before a successful Hello.
    NotAuthenticated = 2,
    /// The range lies outside the region.
    OutOfBounds = 3,
    /// The node has no capacity left for the region.
    NoCapacity = 4,
    /// The region does not exist or belongs to another client.
    UnknownRegion = 5,
    /// The request was malformed.
    BadRequest = 6,
}

impl Status {
    /// Decodes a status code (unknown codes read as `BadRequest`).
    pub fn from_u32(v: u32) -> Self {
        match v {
            0 => Status::Ok,
            1 => Status::Denied,
            2 => Status::NotAuthenticated,
            3 => Status::OutOfBounds,
            4 => Status::NoCapacity,
            5 => Status::UnknownRegion,
            _ => Status::BadRequest,
        }
    }
    /// What the status means to a user, with what to do.
    pub fn explain(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Denied => {
                "the memory node refused the token (or speaks another protocol version); use the token printed by `strata serve` (STRATA_REMOTE_TOKEN) and the same Strata version"
            }
            Status::NotAuthenticated => "the client sent a request before authenticating",
            Status::OutOfBounds => {
                "the request reaches outside the region the node lent; this is a client bug, report it"
            }
            Status::NoCapacity => {
                "the memory node has too little free capacity; start it with a larger --capacity, add nodes, or ask for less"
            }
            Status::UnknownRegion => {
                "the region is unknown to the node or belongs to another client"
            }
            Status::BadRequest => {
                "the node could not parse the request; use matching Strata versions"
            }
        }
    }
}

/// A reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyHeader {
    /// The request's id.
    pub id: u64,
    /// Outcome.
    pub status: Status,
    /// Alloc: the region id.
    pub region: u64,
    /// Alloc: the region's base address at the node (for one-sided access).
    pub base: u64,
    /// Alloc: the region's size; refused with [`Status::NoCapacity`]: the bytes the node
    /// has free.
    pub size: u64,
}

/// Encoded size of a [`ReplyHeader`].
pub const REPLY_HEADER_BYTES: usize = 40;

impl ReplyHeader {
    /// A reply with only a status.
    pub fn status(id: u64, status: Status) -> Self {
        Self {
            id,
            status,
            region: 0,
            base: 0,
            size: 0,
        }
    }
    /// Encodes the header.
    pub fn encode(&self) -> [u8; REPLY_HEADER_BYTES] {
        let mut b = [0u8; REPLY_HEADER_BYTES];
        b[0..8].copy_from_slice(&self.id.to_le_bytes());
        b[8..12].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.region.to_le_bytes());
        b[24..32].copy_from_slice(&self.base.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b
    }
    /// Decodes a header; `None` if it is malformed.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != REPLY_HEADER_BYTES {
            return None;
        }
        let mut status = [0u8; 4];
        status.copy_from_slice(&b[8..12]);
        Some(Self {
            id: u64_at(b, 0),
            status: Status::from_u32(u32::from_le_bytes(status)),
            region: u64_at(b, 16),
            base: u64_at(b, 24),
            size: u64_at(b, 32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_garbage() {
        let r = RequestHeader {
            op: Op::Write,
            session: [9; 16],
            id: u64::MAX - 3,
            region: 7,
            offset: 1 << 40,
            length: 65536,
        };
        assert_eq!(RequestHeader::decode(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[0] = 99;
        assert_eq!(RequestHeader::decode(&bad), None);
        assert_eq!(RequestHeader::decode(&bad[..10]), None);
        let p = ReplyHeader {
            id: 42,
            status: Status::NoCapacity,
            region: 3,
            base: 0xdead_beef,
            size: 1 << 30,
        };
        assert_eq!(ReplyHeader::decode(&p.encode()), Some(p));
        assert_eq!(ReplyHeader::decode(&[0; 3]), None);
    }
}
