//! Workers, listeners, endpoints, requests, remote keys and active messages.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sys::{self, UcxApi};
use crate::{Context, UcxError, check, status_message};

/// Identifies an endpoint within its worker (the endpoint's address), so events such as
/// errors and active messages can be matched to the connection they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(usize);

/// Events UCX reports through callbacks during `progress`; drained by the owner afterwards.
#[derive(Default)]
struct Events {
    conn_requests: RefCell<Vec<sys::ucp_conn_request_h>>,
    endpoint_errors: RefCell<Vec<(EndpointId, i8)>>,
}

/// The worker pointer shared with wakers; `None` once the worker is destroyed.
struct SharedWorker {
    api: Arc<UcxApi>,
    handle: Mutex<Option<usize>>,
}

/// Wakes a [`Worker`] blocked in [`Worker::wait`] from any thread.
#[derive(Clone)]
pub struct WorkerWaker {
    shared: Arc<SharedWorker>,
}

impl std::fmt::Debug for WorkerWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerWaker")
    }
}

impl WorkerWaker {
    /// Interrupts the worker's wait. Harmless after the worker is gone.
    pub fn wake(&self) {
        let guard = self.shared.handle.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(handle) = *guard {
            // SAFETY: the worker is alive while its pointer is in the mutex (Worker::drop
            // clears it under the lock before destroying), and ucp_worker_signal is documented
            // as safe to call from any thread.
            let _ = unsafe { (self.shared.api.ucp_worker_signal)(handle as sys::ucp_worker_h) };
        }
    }
}

/// What an active-message handler decided about the message's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AmAction {
    /// The data may be released when the handler returns.
    Done,
}

/// An active message, as seen inside its handler (during [`Worker::progress`]).
#[derive(Debug)]
pub struct AmIncoming<'a> {
    header: &'a [u8],
    data: *mut c_void,
    length: usize,
    attributes: u64,
    reply_endpoint: sys::ucp_ep_h,
    held: &'a Cell<bool>,
}

impl<'a> AmIncoming<'a> {
    /// The sender's header bytes.
    pub fn header(&self) -> &'a [u8] {
        self.header
    }
    /// Length of the data in bytes.
    pub fn length(&self) -> usize {
        self.length
    }
    /// True when the data has not arrived yet and must be fetched with
    /// [`HeldAmData::receive_into`] (UCX's rendezvous protocol).
    pub fn is_rendezvous(&self) -> bool {
        self.attributes & sys::UCP_AM_RECV_ATTR_FLAG_RNDV != 0
    }
    /// The data, when it has already arrived (eager protocol).
    pub fn data(&self) -> Option<&'a [u8]> {
        if self.is_rendezvous() {
            return None;
        }
        if self.length == 0 {
            return Some(&[]);
        }
        // SAFETY: for eager messages UCX passes `length` readable bytes at `data`, valid at
        // least until the handler returns, which bounds 'a.
        Some(unsafe { std::slice::from_raw_parts(self.data.cast::<u8>(), self.length) })
    }
    /// The endpoint the sender asked replies to go to, if it sent with the reply flag.
    pub fn reply_endpoint(&self) -> Option<EndpointId> {
        (!self.reply_endpoint.is_null()).then_some(EndpointId(self.reply_endpoint as usize))
    }
    /// Keeps the data past the handler: always possible for rendezvous data, and for eager
    /// data when UCX allows it (otherwise `None`: copy from [`AmIncoming::data`] instead).
    pub fn hold(&self) -> Option<HeldAmData> {
        let keepable = sys::UCP_AM_RECV_ATTR_FLAG_DATA | sys::UCP_AM_RECV_ATTR_FLAG_RNDV;
        if self.attributes & keepable == 0 || self.held.get() {
            return None;
        }
        self.held.set(true);
        Some(HeldAmData {
            descriptor: self.data,
            length: self.length,
            rendezvous: self.is_rendezvous(),
        })
    }
}

/// Active-message data kept past its handler. It must be consumed with
/// [`HeldAmData::receive_into`] or [`HeldAmData::release`] on the same worker; dropping it
/// leaks the descriptor inside UCX.
#[derive(Debug)]
pub struct HeldAmData {
    descriptor: *mut c_void,
    length: usize,
    rendezvous: bool,
}

impl HeldAmData {
    /// Length in bytes.
    pub fn length(&self) -> usize {
        self.length
    }
    /// True when the bytes are still at the sender.
    pub fn is_rendezvous(&self) -> bool {
        self.rendezvous
    }
    /// The bytes, when they have already arrived.
    pub fn bytes(&self) -> Option<&[u8]> {
        if self.rendezvous {
            return None;
        }
        if self.length == 0 {
            return Some(&[]);
        }
        // SAFETY: held eager data stays valid until released, and release takes `self`.
        Some(unsafe { std::slice::from_raw_parts(self.descriptor.cast::<u8>(), self.length) })
    }
    /// Starts receiving the data into `buffer` (`length()` bytes). Consumes the descriptor.
    ///
    /// # Safety
    /// `buffer` must be valid for `self.length()` bytes of writes until the returned request
    /// completes (or the worker is destroyed).
    pub unsafe fn receive_into(
        self,
        worker: &Worker,
        buffer: *mut u8,
    ) -> Result<Request, UcxError> {
        let param = request_param(0);
        // SAFETY: descriptor came from this worker's AM callback and is consumed once; the
        // caller keeps `buffer` valid until completion.
        let status = unsafe {
            (worker.api().ucp_am_recv_data_nbx)(
                worker.raw(),
                self.descriptor,
                buffer.cast::<c_void>(),
                self.length,
                &param,
            )
        };
        Request::from_status_ptr(
            Rc::clone(&worker.core),
            "ucp_am_recv_data_nbx",
            status,
            None,
        )
    }
    /// Gives the data back to UCX.
    pub fn release(self, worker: &Worker) {
        // SAFETY: descriptor came from this worker's AM callback and is released once.
        unsafe { (worker.api().ucp_am_data_release)(worker.raw(), self.descriptor) };
    }
}

type AmHandlerFn = dyn FnMut(&AmIncoming<'_>) -> AmAction;

struct AmHandlerSlot {
    handler: Box<AmHandlerFn>,
}

unsafe extern "C" fn am_trampoline(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerSlot registered with this handler; it is owned by the worker
    // and outlives every progress call, and only the worker's thread calls progress.
    let slot = unsafe { &mut *arg.cast::<AmHandlerSlot>() };
    // SAFETY: UCX passes a valid param for the duration of the callback.
    let param = unsafe { &*param };
    let header = if header_length == 0 || header.is_null() {
        &[][..]
    } else {
        // SAFETY: UCX passes header_length readable bytes valid during the callback.
        unsafe { std::slice::from_raw_parts(header.cast::<u8>(), header_length) }
    };
    let held = Cell::new(false);
    let incoming = AmIncoming {
        header,
        data,
        length,
        attributes: param.recv_attr,
        reply_endpoint: param.reply_ep,
        held: &held,
    };
    match (slot.handler)(&incoming) {
        AmAction::Done if held.get() => sys::UCS_INPROGRESS,
        AmAction::Done => sys::UCS_OK,
    }
}

unsafe extern "C" fn conn_trampoline(request: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: arg is the worker's boxed Events, alive while the listener exists (the worker
    // outlives its listeners' callbacks: callbacks only run inside its progress).
    let events = unsafe { &*arg.cast::<Events>() };
    events.conn_requests.borrow_mut().push(request);
}

unsafe extern "C" fn error_trampoline(arg: *mut c_void, ep: sys::ucp_ep_h, status: i8) {
    // SAFETY: arg is the worker's boxed Events, alive until the worker is destroyed, which is
    // the last moment UCX may call an endpoint's error handler.
    let events = unsafe { &*arg.cast::<Events>() };
    events
        .endpoint_errors
        .borrow_mut()
        .push((EndpointId(ep as usize), status));
}

fn request_param(flags: u32) -> sys::ucp_request_param_t {
    sys::ucp_request_param_t {
        op_attr_mask: if flags == 0 {
            0
        } else {
            sys::UCP_OP_ATTR_FIELD_FLAGS
        },
        flags,
        request: ptr::null_mut(),
        cb: sys::ucp_request_param_cb {
            any: ptr::null_mut(),
        },
        datatype: 0,
        user_data: ptr::null_mut(),
        reply_buffer: ptr::null_mut(),
        memory_type: sys::UCS_MEMORY_TYPE_HOST,
        recv_info: sys::ucp_request_param_recv_info {
            any: ptr::null_mut(),
        },
        memh: ptr::null_mut(),
    }
}

/// The worker itself, shared by everything made from it (endpoints, listeners, keys,
/// requests), so UCX destroys the worker only after all of them are gone: dropping a
/// `Worker` before its endpoints is then harmless rather than a use after free.
struct WorkerCore {
    context: Arc<Context>,
    handle: sys::ucp_worker_h,
    shared: Arc<SharedWorker>,
    events: Box<Events>,
    /// Boxed so each slot keeps its address (UCX holds it) when the Vec grows.
    #[allow(clippy::vec_box)]
    am_handlers: RefCell<Vec<Box<AmHandlerSlot>>>,
}

impl Drop for WorkerCore {
    fn drop(&mut self) {
        // Hide the worker from wakers first, then destroy it while the callback state (events,
        // AM slots) is still alive: destruction may run endpoint error callbacks.
        *self.shared.handle.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // SAFETY: the worker is live, used by no other thread (WorkerCore is !Send), nothing
        // made from it remains (they all hold this Rc), and it is destroyed once.
        unsafe { (self.context.api().ucp_worker_destroy)(self.handle) };
    }
}

/// A UCP worker: the progress engine for a set of endpoints. Used by one thread.
pub struct Worker {
    core: Rc<WorkerCore>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("handle", &self.core.handle)
            .finish()
    }
}

impl Worker {
    /// Creates a single-threaded worker on `context`.
    pub fn new(context: &Arc<Context>) -> Result<Self, UcxError> {
        let api = context.api();
        // SAFETY: an all-zero ucp_worker_params_t is valid (plain integers and pointers).
        let mut params: sys::ucp_worker_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        params.thread_mode = sys::UCS_THREAD_MODE_SINGLE;
        let mut handle = ptr::null_mut();
        // SAFETY: context is live; params is valid for the call.
        let code = unsafe { (api.ucp_worker_create)(context.handle, &params, &mut handle) };
        check(
            api,
            "ucp_worker_create",
            code,
            "check free memory and UCX settings",
        )?;
        Ok(Self {
            core: Rc::new(WorkerCore {
                context: Arc::clone(context),
                handle,
                shared: Arc::new(SharedWorker {
                    api: Arc::clone(&context.api),
                    handle: Mutex::new(Some(handle as usize)),
                }),
                events: Box::default(),
                am_handlers: RefCell::new(Vec::new()),
            }),
        })
    }

    pub(crate) fn api(&self) -> &UcxApi {
        self.core.context.api()
    }
    fn raw(&self) -> sys::ucp_worker_h {
        self.core.handle
    }
    /// The context this worker belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.core.context
    }

    /// Runs UCX's progress engine once; returns how many events it handled.
    pub fn progress(&self) -> u32 {
        // SAFETY: the worker is live and only used from this thread (Worker is !Send).
        unsafe { (self.api().ucp_worker_progress)(self.raw()) }
    }

    /// A handle other threads can use to wake this worker.
    pub fn waker(&self) -> WorkerWaker {
        WorkerWaker {
            shared: Arc::clone(&self.core.shared),
        }
    }

    /// Blocks until UCX has something to do, a [`WorkerWaker`] fires, or `timeout` passes.
    /// Call [`Worker::progress`] until it returns 0 before waiting.
    pub fn wait(&self, timeout: Duration) -> Result<(), UcxError> {
        self.wait_watching(timeout, &[]).map(drop)
    }

    /// Like [`Worker::wait`], and also wakes when the peer of one of `sockets` (connected
    /// stream sockets) closes its end or the connection fails. Returns the indices of those
    /// sockets; data waiting on a socket does not wake the worker.
    pub fn wait_watching(
        &self,
        timeout: Duration,
        sockets: &[BorrowedFd<'_>],
    ) -> Result<Vec<usize>, UcxError> {
        // SAFETY: the worker is live and used from this thread.
        let code = unsafe { (self.api().ucp_worker_arm)(self.raw()) };
        if code == sys::UCS_ERR_BUSY {
            return Ok(Vec::new()); // events are pending: go and progress
        }
        check(
            self.api(),
            "ucp_worker_arm",
            code,
            "the context needs wake-up support",
        )?;
        let mut fd = 0;
        // SAFETY: the worker was created with UCP_FEATURE_WAKEUP; fd receives its event fd.
        let code = unsafe { (self.api().ucp_worker_get_efd)(self.raw(), &mut fd) };
        check(
            self.api(),
            "ucp_worker_get_efd",
            code,
            "the context needs wake-up support",
        )?;
        let mut pollfds = Vec::with_capacity(1 + sockets.len());
        pollfds.push(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        // POLLRDHUP: the peer shut its side down; POLLHUP and POLLERR are always reported.
        pollfds.extend(sockets.iter().map(|socket| libc::pollfd {
            fd: socket.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        }));
        let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let count = libc::nfds_t::try_from(pollfds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: pollfds holds `count` valid elements, each naming an open descriptor (the
        // worker's event fd, and sockets the caller's borrows keep open); EINTR and timeouts
        // just return to the caller.
        unsafe { libc::poll(pollfds.as_mut_ptr(), count, millis) };
        let closed = libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
        Ok(pollfds[1..]
            .iter()
            .enumerate()
            .filter(|(_, p)| p.revents & closed != 0)
            .map(|(index, _)| index)
            .collect())
    }

    /// Installs `handler` for active messages with `id`. Handlers run inside
    /// [`Worker::progress`] and must not call it.
    pub fn set_am_handler(
        &self,
        id: u32,
        handler: impl FnMut(&AmIncoming<'_>) -> AmAction + 'static,
    ) -> Result<(), UcxError> {
        let mut slot = Box::new(AmHandlerSlot {
            handler: Box::new(handler),
        });
        let params = sys::ucp_am_handler_param_t {
            field_mask: sys::UCP_AM_HANDLER_PARAM_FIELD_ID
                | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
                | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
                | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id,
            flags: sys::UCP_AM_FLAG_PERSISTENT_DATA,
            cb: Some(am_trampoline),
            arg: ptr::from_mut::<AmHandlerSlot>(&mut slot).cast::<c_void>(),
        };
        // SAFETY: the slot is boxed (stable address) and kept in the core's am_handlers until
        // the worker is destroyed, so the callback's arg stays valid.
        let code = unsafe { (self.api().ucp_worker_set_am_recv_handler)(self.raw(), &params) };
        check(
            self.api(),
            "ucp_worker_set_am_recv_handler",
            code,
            "the context needs active-message support",
        )?;
        self.core.am_handlers.borrow_mut().push(slot);
        Ok(())
    }

    fn events_arg(&self) -> *mut c_void {
        ptr::from_ref::<Events>(&self.core.events)
            .cast_mut()
            .cast::<c_void>()
    }

    /// Listens for connections on `address` (port 0 picks a free port; see
    /// [`Listener::local_addr`]).
    pub fn listen(&self, address: SocketAddr) -> Result<Listener, UcxError> {
        let (storage, length) = to_sockaddr(&address);
        let params = sys::ucp_listener_params_t {
            field_mask: sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
                | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
            sockaddr: sys::ucs_sock_addr_t {
                addr: ptr::from_ref(&storage).cast::<libc::sockaddr>(),
                addrlen: length,
            },
            accept_handler: sys::ucp_listener_accept_handler_t {
                cb: None,
                arg: ptr::null_mut(),
            },
            conn_handler: sys::ucp_listener_conn_handler_t {
                cb: Some(conn_trampoline),
                arg: self.events_arg(),
            },
        };
        let mut handle = ptr::null_mut();
        // SAFETY: the worker is live; params and the sockaddr it points to outlive the call;
        // the handler's arg (boxed Events) outlives the listener (see Listener's lifetime).
        let code = unsafe { (self.api().ucp_listener_create)(self.raw(), &params, &mut handle) };
        check(
            self.api(),
            "ucp_listener_create",
            code,
            "check that the address belongs to this host and the port is free",
        )?;
        Ok(Listener {
            core: Rc::clone(&self.core),
            handle,
        })
    }

    /// Connection requests that arrived during progress (accept or reject each).
    pub fn take_conn_requests(&self) -> Vec<ConnRequest> {
        self.core
            .events
            .conn_requests
            .borrow_mut()
            .drain(..)
            .map(|raw| ConnRequest { raw })
            .collect()
    }

    /// Endpoints that failed (peer gone, connection reset) during progress, with the status.
    pub fn take_endpoint_errors(&self) -> Vec<(EndpointId, UcxError)> {
        self.core
            .events
            .endpoint_errors
            .borrow_mut()
            .drain(..)
            .map(|(id, code)| {
                (
                    id,
                    UcxError::Call {
                        call: "endpoint",
                        code,
                        message: status_message(self.api(), code),
                        hint: "the peer closed the connection or became unreachable",
                    },
                )
            })
            .collect()
    }

    fn endpoint_params(&self) -> sys::ucp_ep_params_t {
        // SAFETY: an all-zero ucp_ep_params_t is valid (integers, pointers, None callbacks).
        let mut params: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        params.field_mask =
            sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_mode = sys::UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler = sys::ucp_err_handler_t {
            cb: Some(error_trampoline),
            arg: self.events_arg(),
        };
        params
    }

    fn create_endpoint(&self, params: &sys::ucp_ep_params_t) -> Result<Endpoint, UcxError> {
        let mut ep = ptr::null_mut();
        // SAFETY: the worker is live; params (and what it points to) outlive the call.
        let code = unsafe { (self.api().ucp_ep_create)(self.raw(), params, &mut ep) };
        check(
            self.api(),
            "ucp_ep_create",
            code,
            "check that the peer is running and reachable",
        )?;
        Ok(Endpoint {
            core: Rc::clone(&self.core),
            handle: ep,
            closed: false,
        })
    }

    /// Connects to a listener at `address`. The connection completes during progress.
    pub fn connect(&self, address: SocketAddr) -> Result<Endpoint, UcxError> {
        let (storage, length) = to_sockaddr(&address);
        let mut params = self.endpoint_params();
        params.field_mask |= sys::UCP_EP_PARAM_FIELD_SOCK_ADDR | sys::UCP_EP_PARAM_FIELD_FLAGS;
        params.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
        params.sockaddr = sys::ucs_sock_addr_t {
            addr: ptr::from_ref(&storage).cast::<libc::sockaddr>(),
            addrlen: length,
        };
        self.create_endpoint(&params)
    }

    /// This worker's address: what a peer needs to reach it with [`Worker::connect_worker`].
    /// Hand it only to authenticated peers (it names the transports' ports).
    pub fn address(&self) -> Result<Vec<u8>, UcxError> {
        let mut address = ptr::null_mut();
        let mut length = 0usize;
        // SAFETY: the worker is live; UCX allocates the address, released below.
        let code =
            unsafe { (self.api().ucp_worker_get_address)(self.raw(), &mut address, &mut length) };
        check(
            self.api(),
            "ucp_worker_get_address",
            code,
            "check free memory",
        )?;
        // SAFETY: UCX returned `length` readable bytes at `address`.
        let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), length) }.to_vec();
        // SAFETY: `address` came from ucp_worker_get_address on this worker, released once.
        unsafe { (self.api().ucp_worker_release_address)(self.raw(), address) };
        Ok(bytes)
    }

    /// Connects to the worker whose [`Worker::address`] is `address` (no listener, no
    /// connection manager). The connection completes during progress. UCX reports the
    /// peer's failure through [`Worker::take_endpoint_errors`]; it uses only transports that
    /// can (TCP, InfiniBand), never shared memory.
    pub fn connect_worker(&self, address: &[u8]) -> Result<Endpoint, UcxError> {
        self.connect_worker_as(address, sys::UCP_ERR_HANDLING_MODE_PEER)
    }

    /// Like [`Worker::connect_worker`], for a peer known to run on this host: UCX may then
    /// pick shared memory (`posix`, `sysv`), whose round trip on one host is several times
    /// shorter than TCP over loopback. Shared-memory transports cannot detect a dead peer
    /// (UCX 1.13 offers them only to endpoints without peer-failure handling), so the
    /// caller must watch the peer another way, such as a TCP connection whose closing it
    /// polls with [`Worker::wait_watching`]; errors UCX does see are still reported through
    /// [`Worker::take_endpoint_errors`]. Over a transport that is not shared memory the
    /// endpoint works as well, only without UCX's keep-alive.
    pub fn connect_worker_on_host(&self, address: &[u8]) -> Result<Endpoint, UcxError> {
        self.connect_worker_as(address, sys::UCP_ERR_HANDLING_MODE_NONE)
    }

    fn connect_worker_as(
        &self,
        address: &[u8],
        err_mode: sys::ucp_err_handling_mode_t,
    ) -> Result<Endpoint, UcxError> {
        if address.is_empty() {
            return Err(UcxError::InvalidArgument("an empty worker address".into()));
        }
        let mut params = self.endpoint_params();
        params.err_mode = err_mode;
        params.field_mask |= sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        params.address = address.as_ptr().cast::<sys::ucp_address>();
        self.create_endpoint(&params)
    }

    /// Accepts a connection request.
    pub fn accept(&self, request: ConnRequest) -> Result<Endpoint, UcxError> {
        let mut params = self.endpoint_params();
        params.field_mask |= sys::UCP_EP_PARAM_FIELD_CONN_REQUEST;
        params.conn_request = request.raw;
        self.create_endpoint(&params)
    }

    /// Refuses a connection request.
    pub fn reject(&self, listener: &Listener, request: ConnRequest) {
        // SAFETY: the request came from this listener's callback and is consumed once.
        let _ = unsafe { (self.api().ucp_listener_reject)(listener.handle, request.raw) };
    }
}

/// A pending connection request on a listener.
#[derive(Debug)]
pub struct ConnRequest {
    raw: sys::ucp_conn_request_h,
}

/// Accepts connections for a worker.
pub struct Listener {
    core: Rc<WorkerCore>,
    handle: sys::ucp_listener_h,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listener")
    }
}

impl Listener {
    /// The address the listener is bound to (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> Result<SocketAddr, UcxError> {
        // SAFETY: an all-zero ucp_listener_attr_t is valid.
        let mut attr: sys::ucp_listener_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        // SAFETY: the listener is live; attr is a valid out-parameter.
        let code = unsafe { (self.core.context.api().ucp_listener_query)(self.handle, &mut attr) };
        check(
            self.core.context.api(),
            "ucp_listener_query",
            code,
            "recreate the listener",
        )?;
        from_sockaddr(&attr.sockaddr)
            .ok_or_else(|| UcxError::InvalidArgument("listener reported a non-IP address".into()))
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: the listener is live and destroyed once.
        unsafe { (self.core.context.api().ucp_listener_destroy)(self.handle) };
    }
}

/// A connection to a peer. Used from its worker's thread; closed (forcefully, if not closed
/// before) when dropped.
pub struct Endpoint {
    core: Rc<WorkerCore>,
    handle: sys::ucp_ep_h,
    closed: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("id", &self.id()).finish()
    }
}

impl Endpoint {
    /// This endpoint's identity within its worker.
    pub fn id(&self) -> EndpointId {
        EndpointId(self.handle as usize)
    }

    /// Sends an active message `id` with `header` (copied) and `length` bytes at `data`.
    /// `eager` asks UCX to push the data with the message instead of letting the receiver
    /// fetch it (rendezvous), saving a round trip on transports without hardware RMA.
    ///
    /// # Safety
    /// `data` must be valid for `length` bytes of reads until the request completes.
    pub unsafe fn am_send(
        &self,
        id: u32,
        header: &[u8],
        data: *const u8,
        length: usize,
        eager: bool,
    ) -> Result<Request, UcxError> {
        let header: Box<[u8]> = header.into();
        let mut flags = sys::UCP_AM_SEND_FLAG_REPLY;
        if eager {
            flags |= sys::UCP_AM_SEND_FLAG_EAGER;
        }
        let param = request_param(flags);
        // SAFETY: the endpoint is live; the header box is kept in the request until it
        // completes; the caller keeps `data` valid until completion.
        let status = unsafe {
            (self.core.context.api().ucp_am_send_nbx)(
                self.handle,
                id,
                header.as_ptr().cast::<c_void>(),
                header.len(),
                data.cast::<c_void>(),
                length,
                &param,
            )
        };
        Request::from_status_ptr(
            Rc::clone(&self.core),
            "ucp_am_send_nbx",
            status,
            Some(header),
        )
    }

    /// Writes `length` bytes at `data` to `remote_address` in the peer's memory.
    /// Completion means the local buffer may be reused; call [`Endpoint::flush`] for remote
    /// completion.
    ///
    /// # Safety
    /// `data` must be valid for `length` bytes of reads until the request completes.
    pub unsafe fn put(
        &self,
        data: *const u8,
        length: usize,
        remote_address: u64,
        key: &RemoteKey,
    ) -> Result<Request, UcxError> {
        let param = request_param(0);
        // SAFETY: endpoint and key are live; the caller keeps `data` valid until completion.
        let status = unsafe {
            (self.core.context.api().ucp_put_nbx)(
                self.handle,
                data.cast::<c_void>(),
                length,
                remote_address,
                key.handle,
                &param,
            )
        };
        Request::from_status_ptr(Rc::clone(&self.core), "ucp_put_nbx", status, None)
    }

    /// Reads `length` bytes from `remote_address` in the peer's memory into `buffer`.
    ///
    /// # Safety
    /// `buffer` must be valid for `length` bytes of writes until the request completes.
    pub unsafe fn get(
        &self,
        buffer: *mut u8,
        length: usize,
        remote_address: u64,
        key: &RemoteKey,
    ) -> Result<Request, UcxError> {
        let param = request_param(0);
        // SAFETY: endpoint and key are live; the caller keeps `buffer` valid until completion.
        let status = unsafe {
            (self.core.context.api().ucp_get_nbx)(
                self.handle,
                buffer.cast::<c_void>(),
                length,
                remote_address,
                key.handle,
                &param,
            )
        };
        Request::from_status_ptr(Rc::clone(&self.core), "ucp_get_nbx", status, None)
    }

    /// Completes every operation issued on this endpoint so far, at the remote side too.
    pub fn flush(&self) -> Result<Request, UcxError> {
        let param = request_param(0);
        // SAFETY: the endpoint is live; param is valid for the call.
        let status = unsafe { (self.core.context.api().ucp_ep_flush_nbx)(self.handle, &param) };
        Request::from_status_ptr(Rc::clone(&self.core), "ucp_ep_flush_nbx", status, None)
    }

    /// Unpacks a peer's packed remote key for use on this endpoint.
    pub fn unpack_remote_key(&self, packed: &[u8]) -> Result<RemoteKey, UcxError> {
        let mut handle = ptr::null_mut();
        // SAFETY: the endpoint is live; UCX reads the packed key it produced on the peer.
        let code = unsafe {
            (self.core.context.api().ucp_ep_rkey_unpack)(
                self.handle,
                packed.as_ptr().cast::<c_void>(),
                &mut handle,
            )
        };
        check(
            self.core.context.api(),
            "ucp_ep_rkey_unpack",
            code,
            "the peer sent a damaged key; reconnect",
        )?;
        Ok(RemoteKey {
            core: Rc::clone(&self.core),
            handle,
        })
    }

    /// Closes the endpoint. `force` cancels outstanding operations at once (their requests
    /// complete with an error) instead of flushing them.
    pub fn close(mut self, force: bool) -> Result<Request, UcxError> {
        self.closed = true;
        self.close_raw(force)
    }

    fn close_raw(&self, force: bool) -> Result<Request, UcxError> {
        let param = request_param(if force {
            sys::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        });
        // SAFETY: the endpoint is live and closed once (`closed` guards Drop).
        let status = unsafe { (self.core.context.api().ucp_ep_close_nbx)(self.handle, &param) };
        Request::from_status_ptr(Rc::clone(&self.core), "ucp_ep_close_nbx", status, None)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if !self.closed {
            // The request (if any) frees itself when it completes during later progress.
            let _ = self.close_raw(true);
        }
    }
}

/// A peer's unpacked remote key.
pub struct RemoteKey {
    core: Rc<WorkerCore>,
    handle: sys::ucp_rkey_h,
}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RemoteKey")
    }
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // SAFETY: the key is live and destroyed once.
        unsafe { (self.core.context.api().ucp_rkey_destroy)(self.handle) };
    }
}

/// An operation in flight, or already finished. Poll it after [`Worker::progress`].
pub struct Request {
    core: Rc<WorkerCore>,
    call: &'static str,
    pending: *mut c_void,
    outcome: Option<Result<(), UcxError>>,
    _header: Option<Box<[u8]>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("call", &self.call)
            .field("pending", &!self.pending.is_null())
            .finish()
    }
}

impl Request {
    fn from_status_ptr(
        core: Rc<WorkerCore>,
        call: &'static str,
        status: sys::ucs_status_ptr_t,
        header: Option<Box<[u8]>>,
    ) -> Result<Self, UcxError> {
        let value = status as isize;
        if value < 0 && value > sys::UCS_ERR_LAST {
            // UCS_PTR_IS_ERR: the pointer carries a status code in (UCS_ERR_LAST, 0).
            let code = i8::try_from(value).unwrap_or(i8::MIN);
            return Err(UcxError::Call {
                call,
                code,
                message: status_message(core.context.api(), code),
                hint: "the connection may be gone; reconnect",
            });
        }
        let done = status.is_null();
        Ok(Self {
            core,
            call,
            pending: status,
            outcome: done.then_some(Ok(())),
            _header: header,
        })
    }

    /// `Some(outcome)` once the operation has finished.
    pub fn poll(&mut self) -> Option<Result<(), UcxError>> {
        if self.outcome.is_none() {
            // SAFETY: pending is a live request from an nbx call, not yet freed.
            let code = unsafe { (self.core.context.api().ucp_request_check_status)(self.pending) };
            if code == sys::UCS_INPROGRESS {
                return None;
            }
            // SAFETY: the request completed and is freed once; pending is cleared below.
            unsafe { (self.core.context.api().ucp_request_free)(self.pending) };
            self.pending = ptr::null_mut();
            self.outcome = Some(check(
                self.core.context.api(),
                self.call,
                code,
                "the connection failed or the operation was cancelled",
            ));
        }
        self.outcome.clone()
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.pending.is_null() {
            // SAFETY: a pending request may be freed early; UCX releases it on completion.
            unsafe { (self.core.context.api().ucp_request_free)(self.pending) };
        }
    }
}

fn to_sockaddr(address: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_storage is a valid (AF_UNSPEC) value.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let length = match address {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or_default(),
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write(ptr::from_mut(&mut storage).cast::<libc::sockaddr_in>(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::sa_family_t::try_from(libc::AF_INET6).unwrap_or_default(),
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe {
                ptr::write(
                    ptr::from_mut(&mut storage).cast::<libc::sockaddr_in6>(),
                    sin6,
                )
            };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (
        storage,
        libc::socklen_t::try_from(length).unwrap_or_default(),
    )
}

fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*ptr::from_ref(storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 = unsafe { &*ptr::from_ref(storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}
