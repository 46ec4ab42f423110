//! A thin, safe binding to the parts of UCX's UCP API that Strata uses: context, worker,
//! listener, endpoints, memory registration and remote keys, put/get, active messages and
//! progress with event-fd wake-ups.
//!
//! # Why the library is loaded at run time
//! The issue asked for a binding *linked* against the system UCX. The same `strata` binary is
//! carried to GPU hosts that have no UCX at all, and it must still start there (for `strata
//! info`, GPU benchmarks and pager work). A link-time dependency would make the dynamic loader
//! refuse to start it. So, like cudarc's `dynamic-loading` mode, this crate opens
//! `libucp.so.0` and `libucs.so.0` with `libloading` on first use; a missing UCX becomes a
//! clear [`UcxError::NotInstalled`] ("install libucx0") from the call that needed it.
//!
//! # Layers (cudarc-style)
//! - [`sys`]: hand-written `#[repr(C)]` declarations matching the UCX 1.13 headers and the
//!   table of function pointers. There is no bindgen (no libclang here); instead a test
//!   compiles a C program against the installed headers and compares every size and offset.
//! - The safe layer ([`Context`], [`Worker`], [`Listener`], [`Endpoint`], [`MemoryHandle`],
//!   [`RemoteKey`], [`Request`]): ownership and destruction order are enforced by types.
//!   Operations whose buffers UCX reads or writes after the call returns (`put`, `get`, AM
//!   sends and rendezvous receives) stay `unsafe fn`s with a documented contract, because the
//!   buffer's lifetime is tied to a completion that only the caller's event loop observes.
//!
//! # Threading
//! A [`Worker`] and everything made from it is used by one thread (`UCS_THREAD_MODE_SINGLE`);
//! it is created on the thread that drives it. The only cross-thread entry point is
//! [`WorkerWaker::wake`] (`ucp_worker_signal`, documented as safe from any thread).
#![warn(missing_docs)]

pub mod probe;
pub mod sys;
mod worker;

pub use worker::{
    AmAction, AmIncoming, ConnRequest, Endpoint, EndpointId, HeldAmData, Listener, RemoteKey,
    Request, Worker, WorkerWaker,
};

use std::ffi::{CStr, CString, c_void};
use std::ptr;
use std::sync::{Arc, OnceLock};

use sys::UcxApi;

/// Why a UCX operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UcxError {
    /// `libucp`/`libucs` could not be loaded or lack a symbol Strata needs.
    #[error(
        "UCX is not available: {0}; install UCX 1.13 or newer (Debian/Ubuntu: apt-get install libucx0) or put its lib directory on LD_LIBRARY_PATH"
    )]
    NotInstalled(String),
    /// A UCX call returned an error status.
    #[error("UCX {call} failed: {message} (status {code}); {hint}")]
    Call {
        /// The UCX function.
        call: &'static str,
        /// The `ucs_status_t` value.
        code: i8,
        /// UCX's text for the status.
        message: String,
        /// What the user can do.
        hint: &'static str,
    },
    /// An argument Strata passed cannot be expressed to UCX.
    #[error("invalid UCX argument: {0}")]
    InvalidArgument(String),
}

impl UcxError {
    /// The UCX status code, when the error came from a UCX call.
    pub fn status(&self) -> Option<i8> {
        match self {
            UcxError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Shared-library names of libucs tried, newest ABI first.
const UCS_LIBRARY_NAMES: &[&str] = &["libucs.so.0", "libucs.so"];

/// Loads UCX once per process and returns the resolved function table.
pub fn api() -> Result<Arc<UcxApi>, UcxError> {
    static API: OnceLock<Result<Arc<UcxApi>, String>> = OnceLock::new();
    API.get_or_init(|| load(UCS_LIBRARY_NAMES, probe::UCP_LIBRARY_NAMES).map(Arc::new))
        .clone()
        .map_err(UcxError::NotInstalled)
}

/// Opens the first of `ucs_names` and of `ucp_names` that loads and resolves every symbol.
fn load(ucs_names: &[&str], ucp_names: &[&str]) -> Result<UcxApi, String> {
    let open = |names: &[&str]| {
        let mut first = None;
        for name in names {
            // SAFETY: loading libucp/libucs runs their ELF constructors, which only set up
            // UCX's own global state.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Ok(lib),
                Err(e) => {
                    first.get_or_insert_with(|| format!("{name}: {e}"));
                }
            }
        }
        Err(first.unwrap_or_else(|| "no library name to try".into()))
    };
    let ucs = open(ucs_names)?;
    let ucp = open(ucp_names)?;
    // SAFETY: the libraries are UCX's libucp/libucs; the declarations in `sys` follow the
    // 1.13 headers (checked by the layout test) and the symbols keep their C ABI across UCX
    // 1.x releases.
    unsafe { UcxApi::resolve(ucp, ucs) }.map_err(|e| e.to_string())
}

/// UCX's description of a status code.
pub(crate) fn status_message(api: &UcxApi, code: sys::ucs_status_t) -> String {
    // SAFETY: ucs_status_string accepts any status value and returns a pointer to a static
    // NUL-terminated string (or NULL, handled below).
    let text = unsafe { (api.ucs_status_string)(code) };
    if text.is_null() {
        return format!("unknown status {code}");
    }
    // SAFETY: non-null pointers from ucs_status_string point at static C strings.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

pub(crate) fn check(
    api: &UcxApi,
    call: &'static str,
    code: sys::ucs_status_t,
    hint: &'static str,
) -> Result<(), UcxError> {
    if code == sys::UCS_OK {
        Ok(())
    } else {
        Err(UcxError::Call {
            call,
            code,
            message: status_message(api, code),
            hint,
        })
    }
}

/// The loaded library's version, `(major, minor, release)`.
pub fn version() -> Result<(u32, u32, u32), UcxError> {
    let api = api()?;
    let (mut major, mut minor, mut release) = (0, 0, 0);
    // SAFETY: ucp_get_version only writes the three integers it is given.
    unsafe { (api.ucp_get_version)(&mut major, &mut minor, &mut release) };
    Ok((major, minor, release))
}

/// How to create a [`Context`].
#[derive(Debug, Clone, Default)]
pub struct ContextOptions {
    /// Restrict UCX to these transports (UCX's `TLS` setting, such as `tcp` or `tcp,self`).
    /// `None` keeps UCX's own choice (and its `UCX_TLS` environment variable).
    pub transports: Option<String>,
    /// Ask for one-sided RMA (`put`/`get`) in addition to active messages.
    pub rma: bool,
    /// Further UCX settings, names without the `UCX_` prefix (such as `SYSV_FIFO_SIZE`),
    /// applied over the `UCX_*` environment.
    pub settings: Vec<(String, String)>,
}

/// A UCP context: the library instance holding transports and memory registrations.
#[derive(Debug)]
pub struct Context {
    api: Arc<UcxApi>,
    handle: sys::ucp_context_h,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes UCP serialise the
// context-level state it shares between workers; Strata calls context functions (mem_map,
// rkey_pack) from the thread that owns the worker using them.
unsafe impl Send for Context {}
// SAFETY: see `Send`; shared references only reach UCP's thread-safe context functions.
unsafe impl Sync for Context {}

impl Context {
    /// Creates a context with active messages, wake-up support and, if asked, RMA.
    pub fn new(options: &ContextOptions) -> Result<Arc<Self>, UcxError> {
        let api = api()?;
        let mut config = ptr::null_mut();
        // SAFETY: NULL prefix and file mean "UCX_ environment, default file"; config receives
        // an allocated config released below.
        let code = unsafe { (api.ucp_config_read)(ptr::null(), ptr::null(), &mut config) };
        check(
            &api,
            "ucp_config_read",
            code,
            "check the UCX_* environment variables",
        )?;
        let result = (|| {
            if let Some(tls) = &options.transports {
                let value = CString::new(tls.as_str())
                    .map_err(|_| UcxError::InvalidArgument(format!("transport list {tls:?}")))?;
                // SAFETY: config is a live config object; both strings are NUL-terminated.
                let code =
                    unsafe { (api.ucp_config_modify)(config, c"TLS".as_ptr(), value.as_ptr()) };
                check(
                    &api,
                    "ucp_config_modify(TLS)",
                    code,
                    "name transports UCX knows (see `ucx_info -d`), such as tcp",
                )?;
            }
            for (name, value) in &options.settings {
                let (c_name, c_value) = CString::new(name.as_str())
                    .ok()
                    .zip(CString::new(value.as_str()).ok())
                    .ok_or_else(|| {
                        UcxError::InvalidArgument(format!("UCX setting {name}={value:?}"))
                    })?;
                // SAFETY: config is a live config object; both strings are NUL-terminated.
                let code =
                    unsafe { (api.ucp_config_modify)(config, c_name.as_ptr(), c_value.as_ptr()) };
                check(
                    &api,
                    "ucp_config_modify",
                    code,
                    "name a UCX setting this UCX knows (see `ucx_info -c`) with a valid value",
                )?;
            }
            let mut features = sys::UCP_FEATURE_AM | sys::UCP_FEATURE_WAKEUP;
            if options.rma {
                features |= sys::UCP_FEATURE_RMA;
            }
            let params = sys::ucp_params_t {
                field_mask: sys::UCP_PARAM_FIELD_FEATURES
                    | sys::UCP_PARAM_FIELD_NAME
                    | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED,
                features,
                request_size: 0,
                request_init: None,
                request_cleanup: None,
                tag_sender_mask: 0,
                mt_workers_shared: 1,
                estimated_num_eps: 0,
                estimated_num_ppn: 0,
                name: c"strata".as_ptr(),
            };
            let mut handle = ptr::null_mut();
            // SAFETY: params and config are valid for the call; handle receives the context.
            let code = unsafe {
                (api.ucp_init_version)(
                    sys::UCP_API_MAJOR,
                    sys::UCP_API_MINOR,
                    &params,
                    config,
                    &mut handle,
                )
            };
            check(
                &api,
                "ucp_init",
                code,
                "check that UCX finds a usable transport (`ucx_info -d`) and the UCX_* settings",
            )?;
            Ok(handle)
        })();
        // SAFETY: config came from ucp_config_read and is no longer used.
        unsafe { (api.ucp_config_release)(config) };
        let handle = result?;
        Ok(Arc::new(Self { api, handle }))
    }

    /// The function table.
    pub fn api(&self) -> &UcxApi {
        &self.api
    }

    /// Registers `[address, address + length)` for remote access and returns its handle.
    ///
    /// # Safety
    /// The memory must stay mapped for the handle's lifetime.
    pub unsafe fn map_memory(
        self: &Arc<Self>,
        address: *mut u8,
        length: usize,
    ) -> Result<MemoryHandle, UcxError> {
        let params = sys::ucp_mem_map_params_t {
            field_mask: sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            address: address.cast::<c_void>(),
            length,
            flags: 0,
            prot: 0,
            memory_type: sys::UCS_MEMORY_TYPE_HOST,
        };
        let mut memh = ptr::null_mut();
        // SAFETY: the caller keeps the range mapped; params is valid for the call.
        let code = unsafe { (self.api.ucp_mem_map)(self.handle, &params, &mut memh) };
        check(
            &self.api,
            "ucp_mem_map",
            code,
            "check the locked-memory limit (ulimit -l) and free memory",
        )?;
        Ok(MemoryHandle {
            context: Arc::clone(self),
            memh,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker and memory handle holds an Arc to the context, so none is left.
        unsafe { (self.api.ucp_cleanup)(self.handle) };
    }
}

/// A registration of local memory that peers may access with a packed remote key.
#[derive(Debug)]
pub struct MemoryHandle {
    context: Arc<Context>,
    memh: sys::ucp_mem_h,
}

impl MemoryHandle {
    /// Packs the remote key a peer needs to `put`/`get` this memory.
    pub fn pack_remote_key(&self) -> Result<Vec<u8>, UcxError> {
        let api = &self.context.api;
        let mut buffer = ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: memh is live; UCX allocates the packed buffer and returns its size.
        let code =
            unsafe { (api.ucp_rkey_pack)(self.context.handle, self.memh, &mut buffer, &mut size) };
        check(api, "ucp_rkey_pack", code, "re-register the memory")?;
        // SAFETY: UCX returned `size` readable bytes at `buffer`.
        let bytes = unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), size) }.to_vec();
        // SAFETY: buffer came from ucp_rkey_pack and is released exactly once.
        unsafe { (api.ucp_rkey_buffer_release)(buffer) };
        Ok(bytes)
    }

    /// The raw handle, for sends that name a registration.
    pub fn raw(&self) -> sys::ucp_mem_h {
        self.memh
    }
}

impl Drop for MemoryHandle {
    fn drop(&mut self) {
        // SAFETY: memh was returned by ucp_mem_map on this context and is unmapped once.
        let _ = unsafe { (self.context.api.ucp_mem_unmap)(self.context.handle, self.memh) };
    }
}

// SAFETY: a memory handle is an immutable registration record; UCP allows unmapping it from
// any thread of a context created with mt_workers_shared.
unsafe impl Send for MemoryHandle {}
// SAFETY: shared references only pack keys, which reads the registration.
unsafe impl Sync for MemoryHandle {}

#[cfg(test)]
mod layout_test;

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn a_missing_ucx_is_a_clear_error() {
        let e = load(&["libucs-strata-missing.so.0"], probe::UCP_LIBRARY_NAMES).unwrap_err();
        assert!(e.contains("libucs-strata-missing.so.0"), "{e}");
        let message = UcxError::NotInstalled(e).to_string();
        assert!(message.contains("apt-get install libucx0"), "{message}");
        let e = load(UCS_LIBRARY_NAMES, &["libucp-strata-missing.so.0"]).unwrap_err();
        assert!(e.contains("libucp-strata-missing.so.0"), "{e}");
    }

    #[test]
    fn the_installed_ucx_loads_and_starts() {
        let (major, minor, _) = version().expect("UCX is installed in CI (libucx0)");
        assert!(
            (major, minor) >= (1, 13),
            "UCX {major}.{minor} is older than 1.13"
        );
        let context = Context::new(&ContextOptions {
            transports: Some("tcp".into()),
            rma: true,
            settings: Vec::new(),
        })
        .unwrap();
        let worker = Worker::new(&context).unwrap();
        let listener = worker.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        assert!(
            address.ip().is_loopback() && address.port() != 0,
            "{address}"
        );
        let e = Context::new(&ContextOptions {
            transports: Some("no-such-transport".into()),
            rma: false,
            settings: Vec::new(),
        })
        .unwrap_err();
        assert!(e.to_string().contains("UCX"), "{e}");
        println!("bad transport: {e}");
    }

    #[test]
    fn workers_connect_by_address_without_a_listener() {
        let context = Context::new(&ContextOptions {
            transports: Some("tcp".into()),
            rma: false,
            settings: Vec::new(),
        })
        .unwrap();
        let (a, b) = (
            Worker::new(&context).unwrap(),
            Worker::new(&context).unwrap(),
        );
        let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let sink = std::rc::Rc::clone(&got);
        b.set_am_handler(7, move |m| {
            sink.borrow_mut().extend_from_slice(m.header());
            AmAction::Done
        })
        .unwrap();
        let address = b.address().unwrap();
        assert!(!address.is_empty());
        let endpoint = a.connect_worker(&address).unwrap();
        // SAFETY: no payload (null, 0); the header is a static string.
        let mut sent = unsafe { endpoint.am_send(7, b"hello", std::ptr::null(), 0, true) }.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.borrow().is_empty() || sent.poll().is_none() {
            a.progress();
            b.progress();
            assert!(
                std::time::Instant::now() < deadline,
                "no message by worker address"
            );
        }
        assert_eq!(&got.borrow()[..], b"hello");
        assert!(
            a.connect_worker(&[]).is_err(),
            "an empty address must be refused"
        );
        drop(endpoint.close(true));
    }

    type Collected = Rc<RefCell<Vec<u8>>>;

    /// Two workers: `a` to send, `b` collecting the data of active messages 9 into the
    /// returned vector.
    fn sender_and_collector(
        context: &Arc<Context>,
    ) -> Result<(Worker, Worker, Collected), UcxError> {
        let (a, b) = (Worker::new(context)?, Worker::new(context)?);
        let got = Rc::new(RefCell::new(Vec::new()));
        let sink = Rc::clone(&got);
        b.set_am_handler(9, move |m| {
            sink.borrow_mut()
                .extend_from_slice(m.data().unwrap_or_default());
            AmAction::Done
        })?;
        Ok((a, b, got))
    }

    /// Sends `payload` from `a` to `b` over `endpoint` and waits for it (5 s at most).
    fn deliver(
        a: &Worker,
        b: &Worker,
        endpoint: &Endpoint,
        got: &RefCell<Vec<u8>>,
        payload: &[u8],
    ) {
        // SAFETY: `payload` outlives the loop below, which waits for the send to complete.
        let mut sent =
            unsafe { endpoint.am_send(9, b"", payload.as_ptr(), payload.len(), true) }.unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.borrow().len() < payload.len() || sent.poll().is_none() {
            a.progress();
            b.progress();
            assert!(
                std::time::Instant::now() < deadline,
                "no message over shared memory"
            );
        }
        assert!(got.borrow()[..] == *payload, "the message arrived damaged");
    }

    #[test]
    fn shared_memory_serves_on_host_endpoints_only() {
        // Shared memory only: no TCP to fall back to.
        let context = Context::new(&ContextOptions {
            transports: Some("posix,sysv".into()),
            rma: false,
            settings: Vec::new(),
        })
        .unwrap();
        let (a, b, got) = sender_and_collector(&context).unwrap();
        let address = b.address().unwrap();
        // UCX offers shared memory only to endpoints without peer-failure handling.
        let e = a.connect_worker(&address).unwrap_err();
        println!("peer-failure endpoint over shared memory: {e}");
        let endpoint = a.connect_worker_on_host(&address).unwrap();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        println!("seed {seed}");
        let mut state = u64::from(seed) | 1;
        // A page larger than one shared-memory fragment (8 KiB), of random bytes.
        let payload: Vec<u8> = (0..64 << 10)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        deliver(&a, &b, &endpoint, &got, &payload);
        got.borrow_mut().clear();
        deliver(&a, &b, &endpoint, &got, &payload[..100]);
        drop(endpoint.close(true));
    }

    #[test]
    fn settings_reach_the_transports() {
        // Shared memory over sysv only, with FIFOs of `size` elements (MM_ applies to sysv and
        // posix): can two workers talk?
        let talk = |size: &str| -> Result<(), UcxError> {
            let context = Context::new(&ContextOptions {
                transports: Some("sysv".into()),
                rma: false,
                settings: vec![("MM_FIFO_SIZE".into(), size.into())],
            })?;
            let (a, b, got) = sender_and_collector(&context)?;
            let endpoint = a.connect_worker_on_host(&b.address()?)?;
            deliver(&a, &b, &endpoint, &got, &[7u8; 20000]);
            Ok(())
        };
        talk("1024").unwrap();
        // UCX takes FIFO sizes that are powers of two only: with 3 the transport does not
        // open, so the setting did reach it.
        let e = talk("3").unwrap_err();
        println!("FIFO of 3: {e}");
        let e = Context::new(&ContextOptions {
            transports: None,
            rma: false,
            settings: vec![("A\0B".into(), "1".into())],
        })
        .unwrap_err();
        assert!(matches!(e, UcxError::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn a_wait_wakes_when_a_watched_connection_closes() {
        use std::os::fd::AsFd;
        use std::time::{Duration, Instant};
        let context = Context::new(&ContextOptions {
            transports: Some("tcp".into()),
            rma: false,
            settings: Vec::new(),
        })
        .unwrap();
        let worker = Worker::new(&context).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let near = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut far, _) = listener.accept().unwrap();
        while worker.progress() > 0 {}
        // Data from the peer is not a closing: the wait runs to its timeout.
        std::io::Write::write_all(&mut far, b"x").unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(200) {
            let closed = worker
                .wait_watching(Duration::from_millis(50), &[near.as_fd()])
                .unwrap();
            assert!(closed.is_empty(), "{closed:?}");
            while worker.progress() > 0 {}
        }
        drop(far);
        let started = Instant::now();
        let closed = worker
            .wait_watching(Duration::from_secs(10), &[near.as_fd()])
            .unwrap();
        assert_eq!(closed, vec![0]);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
