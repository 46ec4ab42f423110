//! Raw UCP declarations, written by hand against the UCX 1.13 headers (`ucp/api/ucp.h`,
//! `ucp/api/ucp_def.h`, `ucs/type/status.h`), and the table of function pointers resolved from
//! `libucp.so.0` / `libucs.so.0` at run time.
//!
//! Only what Strata uses is declared. Every struct here is `#[repr(C)]` and its size and field
//! offsets are compared with the C compiler's view of the installed headers by the
//! `layout_matches_headers` test, so a drift between these declarations and the library is
//! caught in CI rather than as memory corruption.

#![allow(non_camel_case_types, missing_docs, missing_debug_implementations)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// UCX status code (`ucs_status_t`: a C enum declared `__attribute__((packed))`, so one
/// signed byte).
pub type ucs_status_t = i8;
/// A request handle, or an error status encoded in the pointer value.
pub type ucs_status_ptr_t = *mut c_void;
pub type ucp_datatype_t = u64;
/// `ucs_memory_type_t` (a C enum).
pub type ucs_memory_type_t = c_int;
/// `ucs_thread_mode_t` (a C enum).
pub type ucs_thread_mode_t = c_int;
/// `ucp_err_handling_mode_t` (a C enum).
pub type ucp_err_handling_mode_t = c_int;

pub const UCS_OK: ucs_status_t = 0;
pub const UCS_INPROGRESS: ucs_status_t = 1;
pub const UCS_ERR_BUSY: ucs_status_t = -15;
pub const UCS_ERR_CANCELED: ucs_status_t = -16;
pub const UCS_ERR_CONNECTION_RESET: ucs_status_t = -25;
/// `UCS_ERR_LAST`: pointers whose value lies in `(UCS_ERR_LAST, 0)` as signed integers are
/// error codes (`UCS_PTR_IS_ERR`).
pub const UCS_ERR_LAST: isize = -100;

pub const UCP_API_MAJOR: c_uint = 1;
pub const UCP_API_MINOR: c_uint = 13;

pub const UCS_THREAD_MODE_SINGLE: ucs_thread_mode_t = 0;
pub const UCP_ERR_HANDLING_MODE_NONE: ucp_err_handling_mode_t = 0;
pub const UCP_ERR_HANDLING_MODE_PEER: ucp_err_handling_mode_t = 1;
pub const UCS_MEMORY_TYPE_HOST: ucs_memory_type_t = 0;

pub const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub const UCP_FEATURE_RMA: u64 = 1 << 1;
pub const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub const UCP_FEATURE_AM: u64 = 1 << 6;

pub const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;

pub const UCP_LISTENER_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 0;
pub const UCP_LISTENER_PARAM_FIELD_CONN_HANDLER: u64 = 1 << 2;
pub const UCP_LISTENER_ATTR_FIELD_SOCKADDR: u64 = 1 << 0;

pub const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub const UCP_EP_PARAM_FIELD_SOCK_ADDR: u64 = 1 << 4;
pub const UCP_EP_PARAM_FIELD_FLAGS: u64 = 1 << 5;
pub const UCP_EP_PARAM_FIELD_CONN_REQUEST: u64 = 1 << 6;
pub const UCP_EP_PARAMS_FLAGS_CLIENT_SERVER: c_uint = 1 << 0;
pub const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

pub const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;

pub const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub const UCP_AM_HANDLER_PARAM_FIELD_FLAGS: u64 = 1 << 1;
pub const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub const UCP_AM_FLAG_PERSISTENT_DATA: u32 = 1 << 1;
pub const UCP_AM_SEND_FLAG_REPLY: u32 = 1 << 0;
pub const UCP_AM_SEND_FLAG_EAGER: u32 = 1 << 1;
pub const UCP_AM_RECV_ATTR_FLAG_DATA: u64 = 1 << 16;
pub const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;

pub const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;

/// Opaque handle types.
#[repr(C)]
pub struct ucp_context {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_config {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_worker {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_listener {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_ep {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_conn_request {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_mem {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_rkey {
    _private: [u8; 0],
}
#[repr(C)]
pub struct ucp_address {
    _private: [u8; 0],
}

pub type ucp_context_h = *mut ucp_context;
pub type ucp_worker_h = *mut ucp_worker;
pub type ucp_listener_h = *mut ucp_listener;
pub type ucp_ep_h = *mut ucp_ep;
pub type ucp_conn_request_h = *mut ucp_conn_request;
pub type ucp_mem_h = *mut ucp_mem;
pub type ucp_rkey_h = *mut ucp_rkey;

pub type ucp_request_init_callback_t = Option<unsafe extern "C" fn(request: *mut c_void)>;
pub type ucp_request_cleanup_callback_t = Option<unsafe extern "C" fn(request: *mut c_void)>;
pub type ucp_err_handler_cb_t =
    Option<unsafe extern "C" fn(arg: *mut c_void, ep: ucp_ep_h, status: ucs_status_t)>;
pub type ucp_listener_accept_callback_t =
    Option<unsafe extern "C" fn(ep: ucp_ep_h, arg: *mut c_void)>;
pub type ucp_listener_conn_callback_t =
    Option<unsafe extern "C" fn(conn_request: ucp_conn_request_h, arg: *mut c_void)>;
pub type ucp_am_recv_callback_t = Option<
    unsafe extern "C" fn(
        arg: *mut c_void,
        header: *const c_void,
        header_length: usize,
        data: *mut c_void,
        length: usize,
        param: *const ucp_am_recv_param_t,
    ) -> ucs_status_t,
>;
pub type ucp_send_nbx_callback_t = Option<
    unsafe extern "C" fn(request: *mut c_void, status: ucs_status_t, user_data: *mut c_void),
>;

#[repr(C)]
pub struct ucp_params_t {
    pub field_mask: u64,
    pub features: u64,
    pub request_size: usize,
    pub request_init: ucp_request_init_callback_t,
    pub request_cleanup: ucp_request_cleanup_callback_t,
    pub tag_sender_mask: u64,
    pub mt_workers_shared: c_int,
    pub estimated_num_eps: usize,
    pub estimated_num_ppn: usize,
    pub name: *const c_char,
}

/// `ucs_cpu_set_t`: 1024 CPU bits.
#[repr(C)]
pub struct ucs_cpu_set_t {
    pub ucs_bits: [u64; 1024 / 64],
}

#[repr(C)]
pub struct ucp_worker_params_t {
    pub field_mask: u64,
    pub thread_mode: ucs_thread_mode_t,
    pub cpu_mask: ucs_cpu_set_t,
    pub events: c_uint,
    pub user_data: *mut c_void,
    pub event_fd: c_int,
    pub flags: u64,
    pub name: *const c_char,
    pub am_alignment: usize,
    pub client_id: u64,
}

#[repr(C)]
pub struct ucs_sock_addr_t {
    pub addr: *const libc::sockaddr,
    pub addrlen: libc::socklen_t,
}

#[repr(C)]
pub struct ucp_listener_accept_handler_t {
    pub cb: ucp_listener_accept_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_listener_conn_handler_t {
    pub cb: ucp_listener_conn_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_listener_params_t {
    pub field_mask: u64,
    pub sockaddr: ucs_sock_addr_t,
    pub accept_handler: ucp_listener_accept_handler_t,
    pub conn_handler: ucp_listener_conn_handler_t,
}

#[repr(C)]
pub struct ucp_listener_attr_t {
    pub field_mask: u64,
    pub sockaddr: libc::sockaddr_storage,
}

#[repr(C)]
pub struct ucp_err_handler_t {
    pub cb: ucp_err_handler_cb_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_ep_params_t {
    pub field_mask: u64,
    pub address: *const ucp_address,
    pub err_mode: ucp_err_handling_mode_t,
    pub err_handler: ucp_err_handler_t,
    pub user_data: *mut c_void,
    pub flags: c_uint,
    pub sockaddr: ucs_sock_addr_t,
    pub conn_request: ucp_conn_request_h,
    pub name: *const c_char,
    pub local_sockaddr: ucs_sock_addr_t,
}

/// The callback union of `ucp_request_param_t` (all members are function pointers).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ucp_request_param_cb {
    pub send: ucp_send_nbx_callback_t,
    pub any: *mut c_void,
}

/// The receive-info union of `ucp_request_param_t` (both members are pointers).
#[repr(C)]
#[derive(Clone, Copy)]
pub union ucp_request_param_recv_info {
    pub length: *mut usize,
    pub any: *mut c_void,
}

#[repr(C)]
pub struct ucp_request_param_t {
    pub op_attr_mask: u32,
    pub flags: u32,
    pub request: *mut c_void,
    pub cb: ucp_request_param_cb,
    pub datatype: ucp_datatype_t,
    pub user_data: *mut c_void,
    pub reply_buffer: *mut c_void,
    pub memory_type: ucs_memory_type_t,
    pub recv_info: ucp_request_param_recv_info,
    pub memh: ucp_mem_h,
}

#[repr(C)]
pub struct ucp_mem_map_params_t {
    pub field_mask: u64,
    pub address: *mut c_void,
    pub length: usize,
    pub flags: c_uint,
    pub prot: c_uint,
    pub memory_type: ucs_memory_type_t,
}

#[repr(C)]
pub struct ucp_am_handler_param_t {
    pub field_mask: u64,
    pub id: c_uint,
    pub flags: u32,
    pub cb: ucp_am_recv_callback_t,
    pub arg: *mut c_void,
}

#[repr(C)]
pub struct ucp_am_recv_param_t {
    pub recv_attr: u64,
    pub reply_ep: ucp_ep_h,
}

/// Declares the function-pointer table and its loader in one place, so a symbol's name and
/// its signature cannot drift apart.
macro_rules! ucx_functions {
    ($( $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? ; )*) => {
        /// Every UCX function Strata calls, resolved once when the libraries are loaded.
        #[derive(Debug)]
        pub struct UcxApi {
            $( pub $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
            _ucp: libloading::Library,
            _ucs: libloading::Library,
        }

        impl UcxApi {
            /// Resolves every symbol from the loaded libraries.
            ///
            /// # Safety
            /// The libraries must be UCX 1.13-compatible builds of `libucp`/`libucs`, whose
            /// symbols have the C signatures declared here.
            pub unsafe fn resolve(
                ucp: libloading::Library,
                ucs: libloading::Library,
            ) -> Result<Self, libloading::Error> {
                $(
                    let lib = match stringify!($lib) { "ucs" => &ucs, _ => &ucp };
                    // SAFETY: the caller guarantees the library exports this symbol with the
                    // declared signature; the pointer is copied out and stays valid because
                    // the library is stored in the same struct and never unloaded before it.
                    let $name = unsafe {
                        *lib.get::<unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                            concat!(stringify!($name), "\0").as_bytes(),
                        )?
                    };
                )*
                Ok(Self { $( $name, )* _ucp: ucp, _ucs: ucs })
            }
        }
    };
}

ucx_functions! {
    ucp fn ucp_get_version(major: *mut c_uint, minor: *mut c_uint, release: *mut c_uint);
    ucp fn ucp_config_read(env_prefix: *const c_char, filename: *const c_char, config: *mut *mut ucp_config) -> ucs_status_t;
    ucp fn ucp_config_modify(config: *mut ucp_config, name: *const c_char, value: *const c_char) -> ucs_status_t;
    ucp fn ucp_config_release(config: *mut ucp_config);
    ucp fn ucp_init_version(major: c_uint, minor: c_uint, params: *const ucp_params_t, config: *const ucp_config, context: *mut ucp_context_h) -> ucs_status_t;
    ucp fn ucp_cleanup(context: ucp_context_h);
    ucp fn ucp_worker_create(context: ucp_context_h, params: *const ucp_worker_params_t, worker: *mut ucp_worker_h) -> ucs_status_t;
    ucp fn ucp_worker_destroy(worker: ucp_worker_h);
    ucp fn ucp_worker_get_address(worker: ucp_worker_h, address: *mut *mut ucp_address, length: *mut usize) -> ucs_status_t;
    ucp fn ucp_worker_release_address(worker: ucp_worker_h, address: *mut ucp_address);
    ucp fn ucp_worker_progress(worker: ucp_worker_h) -> c_uint;
    ucp fn ucp_worker_get_efd(worker: ucp_worker_h, fd: *mut c_int) -> ucs_status_t;
    ucp fn ucp_worker_arm(worker: ucp_worker_h) -> ucs_status_t;
    ucp fn ucp_worker_signal(worker: ucp_worker_h) -> ucs_status_t;
    ucp fn ucp_worker_set_am_recv_handler(worker: ucp_worker_h, param: *const ucp_am_handler_param_t) -> ucs_status_t;
    ucp fn ucp_listener_create(worker: ucp_worker_h, params: *const ucp_listener_params_t, listener: *mut ucp_listener_h) -> ucs_status_t;
    ucp fn ucp_listener_destroy(listener: ucp_listener_h);
    ucp fn ucp_listener_query(listener: ucp_listener_h, attr: *mut ucp_listener_attr_t) -> ucs_status_t;
    ucp fn ucp_listener_reject(listener: ucp_listener_h, conn_request: ucp_conn_request_h) -> ucs_status_t;
    ucp fn ucp_ep_create(worker: ucp_worker_h, params: *const ucp_ep_params_t, ep: *mut ucp_ep_h) -> ucs_status_t;
    ucp fn ucp_ep_close_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_ep_flush_nbx(ep: ucp_ep_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_am_send_nbx(ep: ucp_ep_h, id: c_uint, header: *const c_void, header_length: usize, buffer: *const c_void, count: usize, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_am_recv_data_nbx(worker: ucp_worker_h, data_desc: *mut c_void, buffer: *mut c_void, count: usize, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_am_data_release(worker: ucp_worker_h, data: *mut c_void);
    ucp fn ucp_mem_map(context: ucp_context_h, params: *const ucp_mem_map_params_t, memh: *mut ucp_mem_h) -> ucs_status_t;
    ucp fn ucp_mem_unmap(context: ucp_context_h, memh: ucp_mem_h) -> ucs_status_t;
    ucp fn ucp_rkey_pack(context: ucp_context_h, memh: ucp_mem_h, rkey_buffer: *mut *mut c_void, size: *mut usize) -> ucs_status_t;
    ucp fn ucp_rkey_buffer_release(rkey_buffer: *mut c_void);
    ucp fn ucp_ep_rkey_unpack(ep: ucp_ep_h, rkey_buffer: *const c_void, rkey: *mut ucp_rkey_h) -> ucs_status_t;
    ucp fn ucp_rkey_destroy(rkey: ucp_rkey_h);
    ucp fn ucp_put_nbx(ep: ucp_ep_h, buffer: *const c_void, count: usize, remote_addr: u64, rkey: ucp_rkey_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_get_nbx(ep: ucp_ep_h, buffer: *mut c_void, count: usize, remote_addr: u64, rkey: ucp_rkey_h, param: *const ucp_request_param_t) -> ucs_status_ptr_t;
    ucp fn ucp_request_check_status(request: *mut c_void) -> ucs_status_t;
    ucp fn ucp_request_free(request: *mut c_void);
    ucs fn ucs_status_string(status: ucs_status_t) -> *const c_char;
}
