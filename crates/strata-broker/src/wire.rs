//! One frame of the broker protocol: a fixed 12-byte header (magic, version, body length)
//! followed by a JSON body. Frames travel over a `SOCK_SEQPACKET` socket, one frame per
//! packet, so a frame is never split or merged; the length field still has to match what
//! arrived, which catches truncation and hostile peers. Chunk file descriptors ride along as
//! `SCM_RIGHTS` ancillary data of the frame that names them.

use crate::message::Message;

/// `b"STRB"`: the first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"STRB";
/// The protocol version this build speaks. A peer with another version is refused at once.
pub const VERSION: u16 = 1;
/// Bytes before the body.
pub const HEADER_BYTES: usize = 12;
/// The longest body accepted (checked before anything is parsed).
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The most chunk descriptors one frame may carry (Linux allows 253 per message).
pub const MAX_FDS_PER_FRAME: usize = 64;

/// Why bytes received are not a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error(
        "frame of {0} bytes is shorter than the {HEADER_BYTES}-byte header: the peer does not speak the Strata broker protocol"
    )]
    Short(usize),
    /// The magic bytes are wrong.
    #[error("frame does not start with STRB: the peer does not speak the Strata broker protocol")]
    BadMagic,
    /// Another protocol version.
    #[error(
        "peer speaks broker protocol version {theirs}, this build speaks {VERSION}: run the same Strata version on both sides"
    )]
    Version {
        /// The version the peer sent.
        theirs: u16,
    },
    /// Header says more than the limit.
    #[error("frame body of {0} bytes is over the {MAX_BODY_BYTES}-byte limit")]
    Oversized(u64),
    /// Header length and bytes received differ.
    #[error("frame header announces {announced} body bytes but {received} arrived")]
    LengthMismatch {
        /// From the header.
        announced: u64,
        /// Received.
        received: usize,
    },
    /// The body is not a known message.
    #[error("frame body is not a valid broker message: {0}")]
    Body(String),
    /// A message could not be encoded (it would exceed the frame limit).
    #[error("message of {0} bytes does not fit in one frame ({MAX_BODY_BYTES} bytes)")]
    TooLarge(usize),
}

/// Encodes `message` as one frame.
///
/// # Errors
/// [`FrameError::TooLarge`] when the body would exceed [`MAX_BODY_BYTES`].
pub fn encode(message: &Message) -> Result<Vec<u8>, FrameError> {
    encode_with_version(message, VERSION)
}

/// Like [`encode`] with another version in the header (tests of version refusal).
///
/// # Errors
/// As [`encode`].
pub fn encode_with_version(message: &Message, version: u16) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(message).map_err(|e| FrameError::Body(e.to_string()))?;
    if body.len() > MAX_BODY_BYTES {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut frame = Vec::with_capacity(HEADER_BYTES + body.len());
    frame.extend_from_slice(&MAGIC);
    frame.extend_from_slice(&version.to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Decodes one received packet.
///
/// # Errors
/// Any [`FrameError`] but `TooLarge`; nothing is parsed before the header checks pass.
pub fn decode(packet: &[u8]) -> Result<Message, FrameError> {
    if packet.len() < HEADER_BYTES {
        return Err(FrameError::Short(packet.len()));
    }
    if packet[0..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let version = u16::from_le_bytes([packet[4], packet[5]]);
    if version != VERSION {
        return Err(FrameError::Version { theirs: version });
    }
    let announced = u64::from(u32::from_le_bytes([
        packet[8], packet[9], packet[10], packet[11],
    ]));
    if announced > MAX_BODY_BYTES as u64 {
        return Err(FrameError::Oversized(announced));
    }
    let body = &packet[HEADER_BYTES..];
    if body.len() as u64 != announced {
        return Err(FrameError::LengthMismatch {
            announced,
            received: body.len(),
        });
    }
    serde_json::from_slice(body).map_err(|e| FrameError::Body(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Role;

    #[test]
    fn round_trip_and_header_checks() {
        let m = Message::Hello {
            role: Role::Borrower { gpu: 0 },
        };
        let f = encode(&m).unwrap();
        assert_eq!(decode(&f).unwrap(), m);
        assert_eq!(decode(&f[..5]), Err(FrameError::Short(5)));
        let mut bad = f.clone();
        bad[0] = b'X';
        assert_eq!(decode(&bad), Err(FrameError::BadMagic));
        let v2 = encode_with_version(&m, 2).unwrap();
        assert_eq!(decode(&v2), Err(FrameError::Version { theirs: 2 }));
        let mut long = f.clone();
        long[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode(&long),
            Err(FrameError::Oversized(u64::from(u32::MAX)))
        );
        let mut cut = f.clone();
        cut.pop();
        assert!(matches!(
            decode(&cut),
            Err(FrameError::LengthMismatch { .. })
        ));
        let mut junk = f[..HEADER_BYTES].to_vec();
        junk[8..12].copy_from_slice(&3u32.to_le_bytes());
        junk.extend_from_slice(b"{{{");
        assert!(matches!(decode(&junk), Err(FrameError::Body(_))));
    }
}
