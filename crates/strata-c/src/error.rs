//! The library's error type, its C status codes, and the thread-local last-error string.

use std::cell::RefCell;
use std::ffi::{CString, c_char};

use strata_gpu::SpaceError;
use strata_gpu::driver::DriverError;

/// Everything a Strata C call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A null pointer, bad string or bad number from the caller.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A store or codec spec that does not parse, or a bad pager configuration.
    #[error(transparent)]
    Config(#[from] strata_core::ConfigError),
    /// The store could not be opened.
    #[error(transparent)]
    Open(#[from] strata_net::OpenStoreError),
    /// The pager region failed.
    #[error(transparent)]
    Region(#[from] strata_pager::RegionError),
    /// The GPU runtime or a space failed.
    #[error(transparent)]
    Space(#[from] SpaceError),
    /// A unified allocation failed (strata_alloc and its calls).
    #[error(transparent)]
    Unified(#[from] strata_unified::UnifiedError),
    /// A unified allocation handle that is not live (freed, or never allocated).
    #[error("{0}")]
    Handle(String),
}

/// C status codes (`STRATA_OK` and the `STRATA_E_*` values of `strata.h`).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// Bad argument (null pointer, bad string, out-of-range value).
    Invalid = 1,
    /// Bad store, codec or pager configuration.
    Config = 2,
    /// The store could not be opened (file, remote node, codec).
    Store = 3,
    /// The pager region failed (userfaultfd, write-back, range).
    Region = 4,
    /// No CUDA driver on this machine.
    NoDriver = 5,
    /// A CUDA driver call failed.
    Cuda = 6,
    /// A kernel did not compile.
    Compile = 7,
    /// The page cache does not fit in free GPU memory.
    NoMemory = 8,
    /// A host-side range outside the space.
    Range = 9,
    /// A kernel accessed an element outside the space.
    KernelOutOfRange = 10,
    /// A kernel's warps waited past the space's wait limit for a free frame (more pages held
    /// at once than the cache has frames).
    NoFrame = 11,
    /// Not a live unified allocation handle (freed already, or never allocated).
    Handle = 12,
    /// The CPU and the GPU both wrote a page of a unified allocation since the last sync.
    Conflict = 13,
    /// A kernel wrote a page advised read-mostly (its writes were dropped).
    ReadMostly = 14,
    /// A use this version refuses (a unified allocation larger than host memory).
    Unsupported = 15,
}

impl Error {
    /// The status code C callers see.
    pub fn status(&self) -> Status {
        match self {
            Error::Invalid(_) => Status::Invalid,
            Error::Config(_) => Status::Config,
            Error::Open(_) => Status::Store,
            Error::Region(_) => Status::Region,
            Error::Handle(_) => Status::Handle,
            Error::Unified(e) => {
                use strata_unified::UnifiedError as U;
                match e {
                    U::Space(s) => Error::space_status(s),
                    U::Invalid(_) => Status::Invalid,
                    U::Range { .. } => Status::Range,
                    U::BeyondHostMemory { .. } => Status::Unsupported,
                    U::Conflict { .. } => Status::Conflict,
                    U::ReadMostlyWritten { .. } => Status::ReadMostly,
                    // Allocations over a store (not offered through C yet).
                    U::PhaseOrder(_) => Status::Invalid,
                    U::Region { .. } => Status::Region,
                }
            }
            Error::Space(e) => Error::space_status(e),
        }
    }

    fn space_status(e: &SpaceError) -> Status {
        match e {
            SpaceError::Driver(DriverError::NoDriver) => Status::NoDriver,
            SpaceError::Driver(_) => Status::Cuda,
            SpaceError::Compile(_) => Status::Compile,
            SpaceError::Invalid(_) | SpaceError::NoHostCopy => Status::Invalid,
            SpaceError::CacheTooLarge { .. } => Status::NoMemory,
            SpaceError::OutOfRange { .. } | SpaceError::PageOutOfRange { .. } => {
                Status::KernelOutOfRange
            }
            SpaceError::NoFrame { .. } => Status::NoFrame,
            // The nearest code: writes a kernel made were dropped (spaces cannot be marked
            // read-only through C yet, so a C caller does not meet this one).
            SpaceError::WroteReadOnly { .. } => Status::ReadMostly,
            SpaceError::Range { .. } => Status::Range,
            SpaceError::Store { .. }
            | SpaceError::StoreFailed { .. }
            | SpaceError::Unflushed { .. }
            | SpaceError::Ring(_) => Status::Store,
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last error and returns its status code.
pub(crate) fn record(e: &Error) -> i32 {
    // Interior NULs cannot be carried by a C string; they never occur in these messages, but
    // replacing them keeps the message rather than dropping it.
    let text = e.to_string().replace('\0', " ");
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
    e.status() as i32
}

/// Clears this thread's last error (every successful call does).
pub(crate) fn clear() {
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
}

/// Runs `f`, turning its error (or a panic) into a status code and a last-error string.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Error>) -> i32 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            clear();
            Status::Ok as i32
        }
        Ok(Err(e)) => record(&e),
        Err(_) => record(&Error::Invalid(
            "internal panic in libstrata (a bug: please report it with the call that caused it)"
                .into(),
        )),
    }
}

/// This thread's last error message: empty when the last call succeeded. The pointer stays
/// valid until the next Strata call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn strata_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// The name of a status code (`"STRATA_E_NO_DRIVER"`, ...), or `"STRATA_E_UNKNOWN"`.
#[unsafe(no_mangle)]
pub extern "C" fn strata_status_name(status: i32) -> *const c_char {
    let s: &'static [u8] = match status {
        0 => b"STRATA_OK\0",
        1 => b"STRATA_E_INVALID\0",
        2 => b"STRATA_E_CONFIG\0",
        3 => b"STRATA_E_STORE\0",
        4 => b"STRATA_E_REGION\0",
        5 => b"STRATA_E_NO_DRIVER\0",
        6 => b"STRATA_E_CUDA\0",
        7 => b"STRATA_E_COMPILE\0",
        8 => b"STRATA_E_NO_MEMORY\0",
        9 => b"STRATA_E_RANGE\0",
        10 => b"STRATA_E_KERNEL_OUT_OF_RANGE\0",
        11 => b"STRATA_E_NO_FRAME\0",
        12 => b"STRATA_E_HANDLE\0",
        13 => b"STRATA_E_CONFLICT\0",
        14 => b"STRATA_E_READ_MOSTLY\0",
        15 => b"STRATA_E_UNSUPPORTED\0",
        _ => b"STRATA_E_UNKNOWN\0",
    };
    s.as_ptr().cast()
}
