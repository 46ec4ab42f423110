//! Errors of the copy library, each saying what to do.

use std::time::Duration;

/// What went wrong with a copy, a pin or a mapping.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// libcuda could not be loaded.
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded): run on a machine with an NVIDIA GPU and driver"
    )]
    NoDriver,
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed: {message} (code {code}){hint}")]
    Cuda {
        /// The driver function.
        call: &'static str,
        /// The numeric CUresult.
        code: u32,
        /// The driver's description.
        message: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// NVRTC failed to load or compile the service kernel.
    #[error("compiling the copy service kernel failed: {0}")]
    Compile(String),
    /// The address is not device memory of this GPU (or not CUDA memory at all).
    #[error(
        "{addr:#x} is not device memory of GPU {ordinal}: {why}; pin memory from cuMemAlloc/cudaMalloc or cuMemCreate (VMM) on this GPU"
    )]
    NotDeviceMemory {
        /// The address given.
        addr: u64,
        /// The GPU of the copier.
        ordinal: usize,
        /// What the driver said.
        why: String,
    },
    /// A pin range runs past the end of its allocation.
    #[error(
        "pin of {size} bytes at {addr:#x} runs past its allocation ({alloc_base:#x} + {alloc_size}): pin within one allocation"
    )]
    PastAllocation {
        /// Start of the pin.
        addr: u64,
        /// Its size.
        size: u64,
        /// The allocation's base.
        alloc_base: u64,
        /// The allocation's size.
        alloc_size: u64,
    },
    /// A copy falls outside the pinned (mapped) range.
    #[error(
        "copy of {len} bytes at offset {offset} falls outside the {size}-byte mapping: keep offset + len <= size"
    )]
    OutOfRange {
        /// Offset into the mapping.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Mapping size.
        size: u64,
    },
    /// Zero-sized pin, or a size that overflows.
    #[error("invalid size {0}: pin at least one byte and stay within the address space")]
    BadSize(u64),
    /// The device memory behind a pin was freed (or replaced) after pinning.
    #[error(
        "the device buffer at {addr:#x} was freed or reallocated after it was pinned: unpin before freeing, and pin the new buffer"
    )]
    Freed {
        /// The pinned address.
        addr: u64,
    },
    /// Used in a child process after fork: CUDA state does not survive fork.
    #[error(
        "this copier was opened by process {owner} and cannot be used in process {current} (after fork): open a new one in the child"
    )]
    Forked {
        /// The opening process.
        owner: u32,
        /// The calling process.
        current: u32,
    },
    /// The copy service did not answer in time.
    #[error(
        "the GPU copy service did not complete request {seq} within {waited:?} (last completed: {done}); the GPU may be hung or busy with a kernel that never ends"
    )]
    ServiceTimeout {
        /// The awaited request.
        seq: u64,
        /// The last completed one.
        done: u64,
        /// How long we waited.
        waited: Duration,
    },
    /// The ring protocol was misused (a bug in the caller or in Strata).
    #[error("copy ring protocol error: {0}")]
    Protocol(String),
    /// A handle, mapping or pointer that is not (or no longer) valid.
    #[error("{0}")]
    Invalid(String),
    /// An operating-system call failed.
    #[error("{call} failed: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// Its error.
        source: std::io::Error,
    },
}

impl CopyError {
    /// The errno a C caller sees for this error (GDRCopy reports errnos).
    pub fn errno(&self) -> i32 {
        match self {
            CopyError::NoDriver => libc::ENODEV,
            CopyError::Cuda { code, .. } if *code == 2 => libc::ENOMEM,
            CopyError::Cuda { .. } | CopyError::Compile(_) => libc::EIO,
            CopyError::NotDeviceMemory { .. }
            | CopyError::PastAllocation { .. }
            | CopyError::OutOfRange { .. }
            | CopyError::BadSize(_)
            | CopyError::Invalid(_)
            | CopyError::Protocol(_) => libc::EINVAL,
            CopyError::Freed { .. } => libc::EFAULT,
            CopyError::Forked { .. } => libc::EPERM,
            CopyError::ServiceTimeout { .. } => libc::ETIMEDOUT,
            CopyError::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}
