//! Does userfaultfd work here, and with which features? Used by `strata info` and by tests that
//! must fail loudly (not skip silently) when CI cannot page.

use std::io;

/// What the kernel offers this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UffdSupport {
    /// The `UFFD_API` version the kernel answered with.
    pub api: u64,
    /// Feature bits from `UFFDIO_API`.
    pub features: u64,
    /// Whether kernel-mode faults can be trapped (false when only `UFFD_USER_MODE_ONLY` worked).
    pub kernel_faults: bool,
}

impl UffdSupport {
    /// Whether write-protect faults (dirty tracking) are available.
    pub fn write_protect(&self) -> bool {
        self.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP != 0
    }
}

/// Why userfaultfd is not usable.
#[derive(Debug, thiserror::Error)]
pub enum UffdProbeError {
    /// The syscall failed.
    #[error(
        "userfaultfd(2) failed: {0}; run as root, set vm.unprivileged_userfaultfd=1, or allow the syscall in the container's seccomp profile"
    )]
    Syscall(#[source] io::Error),
    /// The API handshake failed.
    #[error("UFFDIO_API handshake failed: {0}; the kernel is too old (need Linux 5.10 or newer)")]
    Api(#[source] io::Error),
}

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `_IOWR(0xAA, 0x3F, struct uffdio_api)`, 24 bytes.
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// Opens a userfaultfd, performs the API handshake, and closes it again.
pub fn probe() -> Result<UffdSupport, UffdProbeError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let (fd, kernel_faults) = match open(flags) {
        Ok(fd) => (fd, true),
        Err(first) => match open(flags | UFFD_USER_MODE_ONLY) {
            Ok(fd) => (fd, false),
            Err(_) => return Err(UffdProbeError::Syscall(first)),
        },
    };
    let mut api = UffdioApi {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: `fd` is a userfaultfd we own, and `api` is a live, correctly sized `uffdio_api`.
    let rc = unsafe { libc::ioctl(fd, UFFDIO_API, &raw mut api) };
    let result = if rc == 0 {
        Ok(UffdSupport {
            api: api.api,
            features: api.features,
            kernel_faults,
        })
    } else {
        Err(UffdProbeError::Api(io::Error::last_os_error()))
    };
    // SAFETY: `fd` is ours and not used after this.
    unsafe { libc::close(fd) };
    result
}

fn open(flags: libc::c_int) -> io::Result<libc::c_int> {
    // SAFETY: userfaultfd takes one int of flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        libc::c_int::try_from(fd).map_err(|_| io::Error::other("fd out of range"))
    }
}
