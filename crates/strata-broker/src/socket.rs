//! The broker's Unix socket: `SOCK_SEQPACKET` (message boundaries kept, one frame per packet),
//! descriptors passed with `SCM_RIGHTS`, the peer's process id from `SO_PEERCRED`. All calls
//! go through rustix's safe wrappers; nothing here is `unsafe`.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::message::Message;
use crate::wire::{self, FrameError, HEADER_BYTES, MAX_BODY_BYTES, MAX_FDS_PER_FRAME};

/// A failure on a broker connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The peer closed the connection (or died).
    #[error("the peer closed the connection")]
    Closed,
    /// A system call failed.
    #[error("{call} on the broker socket failed: {source}")]
    Io {
        /// The call.
        call: &'static str,
        /// The error.
        source: io::Error,
    },
    /// What arrived is not a frame.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// More descriptors than a frame may carry.
    #[error("a frame carried more than {MAX_FDS_PER_FRAME} descriptors (or they were cut off)")]
    TooManyFds,
    /// The peer did not read its messages (its socket buffer is full).
    #[error("the peer is not reading its messages")]
    Stalled,
}

fn io_err(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> ConnError {
    move |e| ConnError::Io {
        call,
        source: e.into(),
    }
}

/// A received frame and the descriptors that came with it (closed on drop unless taken).
#[derive(Debug)]
pub struct Packet {
    /// The message, or why the bytes were not one.
    pub message: Result<Message, FrameError>,
    /// Descriptors attached.
    pub fds: Vec<OwnedFd>,
}

/// One end of a broker connection.
#[derive(Debug)]
pub struct Conn {
    fd: OwnedFd,
}

fn seqpacket() -> Result<OwnedFd, ConnError> {
    rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(io_err("socket"))
}

fn address(path: &Path) -> Result<SocketAddrUnix, ConnError> {
    SocketAddrUnix::new(path).map_err(|e| ConnError::Io {
        call: "socket path",
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: {e} (Unix socket paths are limited to 107 bytes)",
                path.display()
            ),
        ),
    })
}

impl Conn {
    /// Connects to the broker listening at `path`.
    ///
    /// # Errors
    /// [`ConnError::Io`] when no broker listens there.
    pub fn connect(path: &Path) -> Result<Self, ConnError> {
        let fd = seqpacket()?;
        rustix::net::connect(&fd, &address(path)?).map_err(io_err("connect"))?;
        Ok(Conn { fd })
    }

    /// A connected pair (tests).
    ///
    /// # Errors
    /// When `socketpair` fails.
    pub fn pair() -> Result<(Conn, Conn), ConnError> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(io_err("socketpair"))?;
        Ok((Conn { fd: a }, Conn { fd: b }))
    }

    pub(crate) fn from_fd(fd: OwnedFd) -> Self {
        Conn { fd }
    }

    /// The process id of the peer, as the kernel recorded it at connect time.
    ///
    /// # Errors
    /// When `SO_PEERCRED` fails.
    pub fn peer_pid(&self) -> Result<u32, ConnError> {
        let cred =
            rustix::net::sockopt::socket_peercred(&self.fd).map_err(io_err("SO_PEERCRED"))?;
        Ok(cred.pid.as_raw_nonzero().get().unsigned_abs())
    }

    /// Sends `message` with `fds` attached; waits for room in the peer's buffer only while
    /// `wait` (a broker never waits on a client: one that does not read is cut off).
    ///
    /// # Errors
    /// [`ConnError::Closed`] when the peer is gone, [`ConnError::Stalled`] when it does not
    /// read and `wait` is false, [`ConnError::TooManyFds`] over the per-frame limit.
    pub fn send_with(
        &self,
        message: &Message,
        fds: &[BorrowedFd<'_>],
        wait: bool,
    ) -> Result<(), ConnError> {
        if fds.len() > MAX_FDS_PER_FRAME {
            return Err(ConnError::TooManyFds);
        }
        let frame = wire::encode(message)?;
        self.send_raw(&frame, fds, wait)
    }

    /// [`Conn::send_with`], waiting for room.
    ///
    /// # Errors
    /// As [`Conn::send_with`].
    pub fn send(&self, message: &Message, fds: &[BorrowedFd<'_>]) -> Result<(), ConnError> {
        self.send_with(message, fds, true)
    }

    /// Sends raw bytes as one packet (tests of hostile input).
    ///
    /// # Errors
    /// As [`Conn::send_with`].
    pub fn send_raw(
        &self,
        bytes: &[u8],
        fds: &[BorrowedFd<'_>],
        wait: bool,
    ) -> Result<(), ConnError> {
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(ConnError::TooManyFds);
        }
        let mut flags = SendFlags::NOSIGNAL;
        if !wait {
            flags |= SendFlags::DONTWAIT;
        }
        match rustix::net::sendmsg(&self.fd, &[io::IoSlice::new(bytes)], &mut control, flags) {
            Ok(_) => Ok(()),
            Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => Err(ConnError::Closed),
            Err(rustix::io::Errno::AGAIN) => Err(ConnError::Stalled),
            Err(e) => Err(io_err("sendmsg")(e)),
        }
    }

    /// Waits up to `timeout` (forever if `None`) for the next packet; `Ok(None)` on timeout.
    ///
    /// # Errors
    /// [`ConnError::Closed`] at end of stream; [`ConnError::Frame`] for an oversized packet;
    /// [`ConnError::TooManyFds`] when descriptors were cut off (those received are closed).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Option<Packet>, ConnError> {
        if let Some(t) = timeout {
            let ts = rustix::event::Timespec {
                tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(t.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            loop {
                match poll(&mut fds, Some(&ts)) {
                    Ok(0) => return Ok(None),
                    Ok(_) => break,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(io_err("poll")(e)),
                }
            }
        }
        self.recv_now()
    }

    /// Reads the packet that is ready (blocks if none is).
    pub(crate) fn recv_now(&self) -> Result<Option<Packet>, ConnError> {
        let mut buf = vec![0u8; HEADER_BYTES + MAX_BODY_BYTES + 1];
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS_PER_FRAME))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            match rustix::net::recvmsg(
                &self.fd,
                &mut [io::IoSliceMut::new(&mut buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Ok(got) => break got,
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::CONNRESET) => return Err(ConnError::Closed),
                Err(e) => return Err(io_err("recvmsg")(e)),
            }
        };
        let mut fds = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if got.flags.contains(ReturnFlags::CTRUNC) {
            return Err(ConnError::TooManyFds);
        }
        if got.bytes == 0 && fds.is_empty() {
            return Err(ConnError::Closed);
        }
        if got.flags.contains(ReturnFlags::TRUNC) || got.bytes > HEADER_BYTES + MAX_BODY_BYTES {
            return Err(FrameError::Oversized(got.bytes as u64).into());
        }
        Ok(Some(Packet {
            message: wire::decode(&buf[..got.bytes]),
            fds,
        }))
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The broker's listening socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Listens at `path`, creating its directory (mode 0700 when new). A stale socket file
    /// (nobody answers on it) is replaced; a live one is refused.
    ///
    /// # Errors
    /// [`ConnError::Io`] when another broker answers at `path` or the path is unusable.
    pub fn bind(path: &Path) -> Result<Self, ConnError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(dir).map_err(|source| ConnError::Io {
                call: "create socket directory",
                source,
            })?;
            // Only the owner may connect: a borrower gets GPU memory, a lender can kill.
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
        if path.exists() {
            if Conn::connect(path).is_ok() {
                return Err(ConnError::Io {
                    call: "bind",
                    source: io::Error::new(
                        io::ErrorKind::AddrInUse,
                        format!(
                            "a broker already listens at {}: use it, or stop it first",
                            path.display()
                        ),
                    ),
                });
            }
            std::fs::remove_file(path).map_err(|source| ConnError::Io {
                call: "remove stale socket",
                source,
            })?;
        }
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )
        .map_err(io_err("socket"))?;
        rustix::net::bind(&fd, &address(path)?).map_err(io_err("bind"))?;
        rustix::net::listen(&fd, 64).map_err(io_err("listen"))?;
        Ok(Listener { fd })
    }

    /// A connection waiting to be accepted, if any.
    ///
    /// # Errors
    /// When `accept` fails for another reason than none waiting.
    pub fn accept(&self) -> Result<Option<Conn>, ConnError> {
        match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
            Ok(fd) => Ok(Some(Conn::from_fd(fd))),
            Err(
                rustix::io::Errno::AGAIN | rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED,
            ) => Ok(None),
            Err(e) => Err(io_err("accept")(e)),
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
