//! The raw kernel interface: userfaultfd ioctls and their `#[repr(C)]` argument structs, plus
//! the handful of `mmap`/`madvise`/`epoll`/`eventfd` calls the pager needs. Everything unsafe
//! about talking to the kernel lives here; [`Uffd`] and the helpers below are safe to call.
//!
//! The structs mirror `include/uapi/linux/userfaultfd.h`; their sizes and field offsets are
//! checked by the unit tests below (and the ioctl numbers are derived from those sizes the way
//! the kernel's `_IOWR`/`_IOR` macros do), so a layout slip fails a test instead of corrupting
//! an ioctl. We do not use the `userfaultfd` crate: its `-sys` crate needs libclang at build
//! time and its safe API cannot install a page write-protected in one step (`UFFDIO_COPY_MODE_WP`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `UFFD_API`: the API version we speak.
pub const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: trap user-mode faults only (allowed without privileges).
pub const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// `UFFD_FEATURE_PAGEFAULT_FLAG_WP`: write-protect faults are reported.
pub const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
/// `UFFD_FEATURE_THREAD_ID`: fault messages carry the faulting thread's id.
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
/// `UFFD_FEATURE_POISON`: `UFFDIO_POISON` is available (Linux 6.6).
pub const FEATURE_POISON: u64 = 1 << 14;

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_PAGEFAULT_FLAG_WRITE`: the fault was a write.
pub const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// `UFFD_PAGEFAULT_FLAG_WP`: the fault hit a write-protected page.
pub const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const REGISTER_MODE_MISSING: u64 = 1 << 0;
/// `UFFDIO_REGISTER_MODE_WP`.
pub const REGISTER_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_COPY_MODE_WP`: install the page write-protected.
pub const COPY_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_WRITEPROTECT_MODE_WP`: protect (without it: unprotect and wake).
pub const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`.
pub const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioApi {
    /// Requested / granted API.
    pub api: u64,
    /// Requested / granted features.
    pub features: u64,
    /// Out: available ioctls.
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdioRange {
    /// Start address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioRegister {
    /// The range.
    pub range: UffdioRange,
    /// `REGISTER_MODE_*` bits.
    pub mode: u64,
    /// Out: ioctls allowed on the range.
    pub ioctls: u64,
}

/// `struct uffdio_copy`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioCopy {
    /// Destination (in the registered range).
    pub dst: u64,
    /// Source buffer.
    pub src: u64,
    /// Bytes.
    pub len: u64,
    /// `COPY_MODE_*` bits.
    pub mode: u64,
    /// Out: bytes copied, or a negated errno.
    pub copy: i64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioWriteprotect {
    /// The range.
    pub range: UffdioRange,
    /// `WRITEPROTECT_MODE_*` bits.
    pub mode: u64,
}

/// `struct uffdio_poison`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct UffdioPoison {
    /// The range.
    pub range: UffdioRange,
    /// Mode bits (`DONTWAKE` only).
    pub mode: u64,
    /// Out: bytes poisoned, or a negated errno.
    pub updated: i64,
}

/// `struct uffd_msg`, restricted to the page-fault member of its union (the only event we
/// enable). 32 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct UffdMsg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    /// Reserved.
    pub reserved1: u8,
    /// Reserved.
    pub reserved2: u16,
    /// Reserved.
    pub reserved3: u32,
    /// `UFFD_PAGEFAULT_FLAG_*`.
    pub flags: u64,
    /// Faulting address.
    pub address: u64,
    /// Faulting thread id (with `FEATURE_THREAD_ID`), padded to the union's size.
    pub ptid: u32,
    /// Padding of the union.
    pub pad: u32,
}

const IOC_WRITE: libc::c_ulong = 1;
const IOC_READ: libc::c_ulong = 2;
const UFFDIO: libc::c_ulong = 0xAA;

const fn ioc(dir: libc::c_ulong, nr: libc::c_ulong, size: usize) -> libc::c_ulong {
    (dir << 30) | ((size as libc::c_ulong) << 16) | (UFFDIO << 8) | nr
}

/// `UFFDIO_API`.
pub const UFFDIO_API: libc::c_ulong = ioc(IOC_READ | IOC_WRITE, 0x3F, size_of::<UffdioApi>());
/// `UFFDIO_REGISTER`.
pub const UFFDIO_REGISTER: libc::c_ulong =
    ioc(IOC_READ | IOC_WRITE, 0x00, size_of::<UffdioRegister>());
/// `UFFDIO_WAKE` (declared `_IOR` by the kernel, for historical reasons).
pub const UFFDIO_WAKE: libc::c_ulong = ioc(IOC_READ, 0x02, size_of::<UffdioRange>());
/// `UFFDIO_COPY`.
pub const UFFDIO_COPY: libc::c_ulong = ioc(IOC_READ | IOC_WRITE, 0x03, size_of::<UffdioCopy>());
/// `UFFDIO_WRITEPROTECT`.
pub const UFFDIO_WRITEPROTECT: libc::c_ulong =
    ioc(IOC_READ | IOC_WRITE, 0x06, size_of::<UffdioWriteprotect>());
/// `UFFDIO_POISON`.
pub const UFFDIO_POISON: libc::c_ulong = ioc(IOC_READ | IOC_WRITE, 0x08, size_of::<UffdioPoison>());

fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An open userfaultfd with its negotiated features.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// Features granted by `UFFDIO_API`.
    pub features: u64,
    /// Whether kernel-mode faults are trapped too (false if only user-mode faults could be).
    pub kernel_faults: bool,
}

/// Why a userfaultfd could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum UffdOpenError {
    /// The syscall failed.
    #[error(
        "userfaultfd(2) failed: {0}; run as root, set vm.unprivileged_userfaultfd=1, or allow the syscall in the container's seccomp profile"
    )]
    Syscall(#[source] io::Error),
    /// The API handshake failed.
    #[error(
        "UFFDIO_API handshake failed: {0}; the kernel is too old (Strata needs Linux 5.10 or newer)"
    )]
    Api(#[source] io::Error),
    /// The kernel lacks write-protect support.
    #[error(
        "this kernel's userfaultfd has no write-protect support, which Strata needs to track dirty pages; use Linux 5.10 or newer"
    )]
    NoWriteProtect,
}

impl Uffd {
    /// Opens a non-blocking userfaultfd and negotiates write-protect faults plus, where the
    /// kernel has them, thread ids and poisoning.
    pub fn open() -> Result<Self, UffdOpenError> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let (fd, kernel_faults) = match raw_userfaultfd(flags) {
            Ok(fd) => (fd, true),
            Err(first) => match raw_userfaultfd(flags | UFFD_USER_MODE_ONLY) {
                Ok(fd) => (fd, false),
                Err(_) => return Err(UffdOpenError::Syscall(first)),
            },
        };
        // Ask for what this kernel offers of the features we use: a first handshake on a
        // throw-away descriptor tells us, because requesting an unknown feature fails.
        let offered = {
            let probe = match raw_userfaultfd(flags | if kernel_faults { 0 } else { 1 }) {
                Ok(p) => p,
                Err(e) => return Err(UffdOpenError::Syscall(e)),
            };
            let mut api = UffdioApi {
                api: UFFD_API,
                ..Default::default()
            };
            // SAFETY: `probe` is a userfaultfd we own; `api` is a live `uffdio_api`.
            cvt(unsafe { libc::ioctl(probe.as_raw_fd(), UFFDIO_API, &raw mut api) })
                .map_err(UffdOpenError::Api)?;
            api.features
        };
        let wanted = FEATURE_PAGEFAULT_FLAG_WP | FEATURE_THREAD_ID | FEATURE_POISON;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: offered & wanted,
            ioctls: 0,
        };
        // SAFETY: as above, on the descriptor we keep.
        cvt(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &raw mut api) })
            .map_err(UffdOpenError::Api)?;
        if api.features & FEATURE_PAGEFAULT_FLAG_WP == 0 {
            return Err(UffdOpenError::NoWriteProtect);
        }
        Ok(Self {
            fd,
            features: api.features,
            kernel_faults,
        })
    }

    /// The raw descriptor (for `epoll`).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether `UFFDIO_POISON` may be used.
    pub fn can_poison(&self) -> bool {
        self.features & FEATURE_POISON != 0
    }

    /// Registers `[start, start+len)` for missing and write-protect faults.
    pub fn register(&self, start: usize, len: usize) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: range(start, len),
            mode: REGISTER_MODE_MISSING | REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: `reg` is a live `uffdio_register`; the kernel validates the range.
        cvt(unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER, &raw mut reg) })
    }

    /// Copies `src` into the registered range at `dst` (which must hold no pages), waking
    /// threads waiting on it; with `write_protect` the pages arrive write-protected. Retries
    /// the kernel's transient `EAGAIN` until every byte is in.
    pub fn copy(&self, dst: usize, src: &[u8], write_protect: bool) -> io::Result<()> {
        let mut done = 0usize;
        while done < src.len() {
            let mut arg = UffdioCopy {
                dst: (dst + done) as u64,
                src: src[done..].as_ptr() as u64,
                len: (src.len() - done) as u64,
                mode: if write_protect { COPY_MODE_WP } else { 0 },
                copy: 0,
            };
            // SAFETY: `src[done..]` is readable for `len` bytes for the duration of the call;
            // the destination lies in a range this descriptor registered (the kernel checks and
            // refuses otherwise); `arg` is a live `uffdio_copy`.
            let rc = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_COPY, &raw mut arg) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if arg.copy > 0 {
                done += usize::try_from(arg.copy).unwrap_or(0);
                continue;
            }
            if err.raw_os_error() == Some(libc::EAGAIN) {
                std::thread::yield_now();
                continue;
            }
            return Err(err);
        }
        Ok(())
    }

    /// Wakes threads waiting on faults in the range (they retry their access).
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut arg = range(start, len);
        // SAFETY: `arg` is a live `uffdio_range`.
        cvt(unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE, &raw mut arg) })
    }

    /// Write-protects the range (no wake), or removes protection and wakes waiters.
    pub fn write_protect(&self, start: usize, len: usize, protect: bool) -> io::Result<()> {
        let mut arg = UffdioWriteprotect {
            range: range(start, len),
            // The kernel refuses DONTWAKE with WP (a protect wakes nobody anyway).
            mode: if protect { WRITEPROTECT_MODE_WP } else { 0 },
        };
        loop {
            // SAFETY: `arg` is a live `uffdio_writeprotect`.
            let rc = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WRITEPROTECT, &raw mut arg) };
            match cvt(rc) {
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => std::thread::yield_now(),
                other => return other,
            }
        }
    }

    /// Installs poison markers on the range and wakes waiters: their access (and any later
    /// one until the range is evicted) gets `SIGBUS`.
    pub fn poison(&self, start: usize, len: usize) -> io::Result<()> {
        let mut arg = UffdioPoison {
            range: range(start, len),
            mode: 0,
            updated: 0,
        };
        // SAFETY: `arg` is a live `uffdio_poison`.
        cvt(unsafe { libc::ioctl(self.raw_fd(), UFFDIO_POISON, &raw mut arg) })
    }

    /// Reads up to `out.len()` fault messages without blocking; returns how many arrived.
    pub fn read_messages(&self, out: &mut [UffdMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(out);
        // SAFETY: `out` is writable for `bytes` bytes; `UffdMsg` is plain old data, so any bytes
        // the kernel writes form valid values.
        let n = unsafe { libc::read(self.raw_fd(), out.as_mut_ptr().cast(), bytes) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = usize::try_from(n).unwrap_or(0);
        Ok(n / size_of::<UffdMsg>())
    }
}

fn range(start: usize, len: usize) -> UffdioRange {
    UffdioRange {
        start: start as u64,
        len: len as u64,
    }
}

fn raw_userfaultfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: userfaultfd takes one int of flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An anonymous private mapping, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; which threads may touch which bytes is the owner's
// business (the pager's state machine), not the mapping's.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Reserves `len` bytes of anonymous memory (no swap reservation, no huge pages: the pager
    /// installs base pages itself).
    pub fn anonymous(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing touches no
        // existing memory.
        unsafe { Self::anonymous_at(std::ptr::null_mut(), len) }
    }

    /// As [`Mapping::anonymous`], at exactly `addr` when it is not null (`MAP_FIXED`).
    ///
    /// # Safety
    /// A non-null `addr` replaces whatever is mapped at `[addr, addr+len)`: the caller must
    /// own that range (as `mmap(MAP_FIXED)` requires).
    pub unsafe fn anonymous_at(addr: *mut u8, len: usize) -> io::Result<Self> {
        let fixed = if addr.is_null() { 0 } else { libc::MAP_FIXED };
        // SAFETY: without MAP_FIXED the kernel picks a free range; with it, the caller vouches
        // for the range (see above).
        let ptr = unsafe {
            libc::mmap(
                addr.cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mapping = Self {
            ptr: ptr.cast(),
            len,
        };
        // Transparent huge pages would let the kernel populate 2 MiB behind our back; the
        // call can only fail on kernels without THP, where there is nothing to turn off.
        let _ = mapping.advise(0, len, libc::MADV_NOHUGEPAGE);
        Ok(mapping)
    }

    /// Start address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mappings have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes the whole mapping read-only (`true`) or read-write. The pager's own
    /// `UFFDIO_COPY` still installs pages into a read-only mapping.
    pub fn set_read_only(&self, read_only: bool) -> io::Result<()> {
        let prot = if read_only {
            libc::PROT_READ
        } else {
            libc::PROT_READ | libc::PROT_WRITE
        };
        // SAFETY: changes the protection of our own mapping only.
        cvt(unsafe { libc::mprotect(self.ptr.cast(), self.len, prot) })
    }

    /// `madvise` on `[offset, offset+len)` of the mapping.
    pub fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        assert!(offset + len <= self.len, "advice outside the mapping");
        // SAFETY: the range lies inside our mapping (checked above); the advices we use
        // (`DONTNEED`, `NOHUGEPAGE`) only drop or reconfigure pages the pager owns (a
        // region's pages, or a scratch buffer whose contents are no longer needed).
        cvt(unsafe { libc::madvise(self.ptr.add(offset).cast(), len, advice) })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and nothing refers to it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// An `eventfd` used to tell sleeping threads to stop.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just handed us.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable for good.
    pub fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64.
        let n = unsafe { libc::write(self.0.as_raw_fd(), (&raw const one).cast(), 8) };
        if n == 8 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// The raw descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One thread's epoll set: the userfaultfd (exclusive wake-ups, so one fault wakes one
/// handler rather than all of them) and the stop eventfd.
#[derive(Debug)]
pub struct FaultPoller(OwnedFd);

/// The epoll token of the userfaultfd.
pub const TOKEN_UFFD: u64 = 1;
/// The epoll token of the stop eventfd.
pub const TOKEN_STOP: u64 = 2;

impl FaultPoller {
    /// Builds the set.
    pub fn new(uffd: RawFd, stop: RawFd) -> io::Result<Self> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just handed us.
        let poller = Self(unsafe { OwnedFd::from_raw_fd(ep) });
        #[allow(clippy::cast_sign_loss)] // epoll flag bits, reinterpreted as the kernel does
        let events = [
            (
                uffd,
                (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
                TOKEN_UFFD,
            ),
            (stop, libc::EPOLLIN as u32, TOKEN_STOP),
        ];
        for (fd, flags, token) in events {
            let mut ev = libc::epoll_event {
                events: flags,
                u64: token,
            };
            // SAFETY: both descriptors are open; `ev` is a live epoll_event.
            cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &raw mut ev) })?;
        }
        Ok(poller)
    }

    /// Waits for readiness; returns the tokens that are ready (bit 0: uffd, bit 1: stop).
    pub fn wait(&self) -> io::Result<u64> {
        self.wait_for(None)
    }

    /// As [`FaultPoller::wait`], for at most `timeout` (`None`: no limit); 0 when it passed
    /// with nothing ready.
    pub fn wait_for(&self, timeout: Option<std::time::Duration>) -> io::Result<u64> {
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 2];
        loop {
            // SAFETY: `events` has room for 2 entries, as passed.
            let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), 2, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = usize::try_from(n).unwrap_or(0);
            return Ok(events[..n].iter().fold(0, |acc, e| acc | e.u64));
        }
    }
}

/// A pidfd of this process, for `process_madvise` (several ranges, one call, and on recent
/// kernels one TLB flush for all of them).
#[derive(Debug)]
pub struct SelfPidFd(OwnedFd);

impl SelfPidFd {
    /// Opens a pidfd of the calling process (Linux 5.3+).
    pub fn open() -> io::Result<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
        // SAFETY: a descriptor the kernel just handed us.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `MADV_DONTNEED` on every `(address, length)` range of this process in one call
    /// (process_madvise accepts any advice for the calling process since Linux 6.13). Returns
    /// the bytes advised, which may be fewer than asked.
    pub fn dontneed(&self, ranges: &[(usize, usize)]) -> io::Result<usize> {
        let iov: Vec<libc::iovec> = ranges
            .iter()
            .map(|&(addr, len)| libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        // SAFETY: `iov` holds `iov.len()` live iovecs naming ranges of our own mappings; the
        // advice only drops pages the caller owns (the pager's evicting pages).
        let n = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                self.0.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                libc::MADV_DONTNEED,
                0,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(n).unwrap_or(0))
    }
}

/// Bytes of `[ptr, ptr+len)` resident in memory (`mincore`), for tests of what the pager
/// gives back. `ptr` must be page-aligned and the range mapped.
pub fn resident_bytes(ptr: *const u8, len: usize) -> io::Result<usize> {
    const PAGE: usize = 4096;
    let mut vec = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: mincore only reads the page tables of the range and writes one byte per page
    // into `vec`, which has room for every page of it.
    cvt(unsafe { libc::mincore(ptr.cast_mut().cast(), len, vec.as_mut_ptr()) })?;
    Ok(vec.iter().filter(|&&b| b & 1 != 0).count() * PAGE)
}

/// The calling thread's kernel thread id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Sends `SIGBUS` to thread `tid` of this process (the fallback fault-error outcome on
/// kernels without `UFFDIO_POISON`).
pub fn sigbus_thread(tid: u32) -> io::Result<()> {
    let tid = libc::pid_t::try_from(tid).map_err(|_| io::Error::other("thread id out of range"))?;
    // SAFETY: tgkill sends a signal; it touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGBUS) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn struct_layouts_match_the_kernel_abi() {
        assert_eq!(size_of::<UffdioApi>(), 24);
        assert_eq!(size_of::<UffdioRange>(), 16);
        assert_eq!(size_of::<UffdioRegister>(), 32);
        assert_eq!(offset_of!(UffdioRegister, mode), 16);
        assert_eq!(offset_of!(UffdioRegister, ioctls), 24);
        assert_eq!(size_of::<UffdioCopy>(), 40);
        assert_eq!(offset_of!(UffdioCopy, mode), 24);
        assert_eq!(offset_of!(UffdioCopy, copy), 32);
        assert_eq!(size_of::<UffdioWriteprotect>(), 24);
        assert_eq!(size_of::<UffdioPoison>(), 32);
        assert_eq!(offset_of!(UffdioPoison, updated), 24);
        assert_eq!(size_of::<UffdMsg>(), 32);
        assert_eq!(offset_of!(UffdMsg, flags), 8);
        assert_eq!(offset_of!(UffdMsg, address), 16);
        assert_eq!(offset_of!(UffdMsg, ptid), 24);
    }

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Values of the kernel macros, computed by hand from _IOWR/_IOR.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(UFFDIO_COPY, 0xC028_AA03);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(UFFDIO_POISON, 0xC020_AA08);
    }
}
