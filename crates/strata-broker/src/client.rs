//! What lender and borrower clients share: the opening handshake, errors, a status query, and
//! the event log a client's serving thread fills and its caller waits on.

use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::message::{GpuLending, LeaseReport, Message, Role};
use crate::socket::{Conn, ConnError, Packet};
use std::os::fd::OwnedFd;

/// A client-side failure.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection failed.
    #[error("broker connection: {0}")]
    Conn(#[from] ConnError),
    /// The broker refused the request.
    #[error("the broker refused: {0}")]
    Refused(String),
    /// No answer in time.
    #[error(
        "no answer from the broker within {0:?} ({1}): is `strata broker` running and responsive?"
    )]
    Timeout(Duration, &'static str),
    /// The broker went away.
    #[error("the broker went away (its connection ended); borrowed chunks were dropped")]
    BrokerLost,
    /// The broker said something out of place.
    #[error("unexpected answer from the broker: {0}")]
    Unexpected(String),
}

/// Connects to `path` and introduces the client as `role`; returns the connection and the
/// broker's process id.
///
/// # Errors
/// No broker at `path`, or no welcome within `timeout`.
pub fn connect(path: &Path, role: Role, timeout: Duration) -> Result<(Conn, u32), ClientError> {
    let conn = Conn::connect(path)?;
    conn.send(&Message::Hello { role }, &[])?;
    match conn.recv(Some(timeout))? {
        Some(p) => match p.message {
            Ok(Message::Welcome { broker_pid, .. }) => Ok((conn, broker_pid)),
            Ok(Message::Error { message, .. }) => Err(ClientError::Refused(message)),
            Ok(m) => Err(ClientError::Unexpected(m.name().into())),
            Err(e) => Err(ConnError::Frame(e).into()),
        },
        None => Err(ClientError::Timeout(timeout, "welcome")),
    }
}

/// Asks the broker at `path` what is lendable and lent.
///
/// # Errors
/// No broker there, or no answer within `timeout`.
pub fn status(
    path: &Path,
    timeout: Duration,
) -> Result<(Vec<GpuLending>, Vec<LeaseReport>), ClientError> {
    let (conn, _) = connect(path, Role::Observer, timeout)?;
    conn.send(&Message::Status, &[])?;
    match conn.recv(Some(timeout))? {
        Some(p) => match p.message {
            Ok(Message::StatusReply { gpus, leases }) => Ok((gpus, leases)),
            Ok(m) => Err(ClientError::Unexpected(m.name().into())),
            Err(e) => Err(ConnError::Frame(e).into()),
        },
        None => Err(ClientError::Timeout(timeout, "status")),
    }
}

/// The broker's next message to a serving thread and its descriptors; `None` when the
/// connection ended or the broker sent something that is not a frame (logged).
pub(crate) fn next_message(conn: &Conn, who: &str) -> Option<(Message, Vec<OwnedFd>)> {
    match conn.recv(None) {
        Ok(Some(Packet {
            message: Ok(m),
            fds,
        })) => Some((m, fds)),
        Ok(Some(Packet {
            message: Err(e), ..
        })) => {
            tracing::warn!("{who}: the broker sent a bad frame: {e}");
            None
        }
        Ok(None) => unreachable!("recv without a timeout waits"),
        Err(ConnError::Closed) => None,
        Err(e) => {
            tracing::warn!("{who}: broker connection failed: {e}");
            None
        }
    }
}

/// State shared by a client's serving thread and its callers, with a condition variable.
#[derive(Debug, Default)]
pub(crate) struct Shared<T> {
    state: Mutex<T>,
    changed: Condvar,
}

impl<T> Shared<T> {
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut T)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits until `pick` returns something, or `timeout` passes.
    pub(crate) fn wait_for<R>(
        &self,
        timeout: Duration,
        mut pick: impl FnMut(&mut T) -> Option<R>,
    ) -> Option<R> {
        let end = Instant::now() + timeout;
        let mut g = self.lock();
        loop {
            if let Some(r) = pick(&mut g) {
                return Some(r);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}
