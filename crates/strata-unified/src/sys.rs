//! Raw kernel calls of CPU write tracking: userfaultfd write protection, in asynchronous mode
//! with the `PAGEMAP_SCAN` ioctl of `/proc/self/pagemap` (Linux 6.7+), or in notified mode
//! (fault messages read by a handler thread, an eventfd to stop it, `poll`). Nothing else in
//! the crate makes system calls.
//!
//! The structures and request numbers are the kernel's UAPI (`linux/userfaultfd.h`,
//! `linux/fs.h`), written out here because the `libc` crate does not carry all of them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_aa02;
const UFFDIO_REGISTER_MODE_WP: u64 = 2;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
/// Write protection of shmem mappings (the CUDA driver's pinned host memory is one).
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
/// The kernel resolves write faults itself (un-protects the page), no handler thread.
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// Only faults from user mode reach the descriptor (lets unprivileged processes use it).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
/// `uffd_msg.event` of a page fault.
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// `uffd_msg.arg.pagefault.flags`: the fault is a write to a write-protected page.
const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// One region of a `PAGEMAP_SCAN` answer (`struct page_region`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PageRegion {
    /// First byte address.
    pub start: u64,
    /// One past the last byte address.
    pub end: u64,
    /// The matched categories.
    pub categories: u64,
}

#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

fn ioctl<T>(fd: &OwnedFd, request: libc::c_ulong, arg: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] struct of the layout `request`
    // expects (the kernel UAPI's, sizes encoded in the request numbers above); the kernel
    // reads and writes only that struct (and, for PAGEMAP_SCAN, the vector it names, which
    // the caller keeps alive and large enough).
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, std::ptr::from_mut(arg)) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn open_uffd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: the userfaultfd syscall takes only flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("bad descriptor"))?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn handshake(fd: OwnedFd, features: u64) -> io::Result<OwnedFd> {
    let mut api = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    ioctl(&fd, UFFDIO_API, &mut api)?;
    Ok(fd)
}

/// A userfaultfd with asynchronous write protection: writes to protected pages are resolved
/// by the kernel (the page becomes writable, its write-protect bit clear), and
/// [`scan_written`] reports them.
pub fn open_async_wp_uffd() -> io::Result<OwnedFd> {
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fd = open_uffd(base).or_else(|_| open_uffd(base | UFFD_USER_MODE_ONLY))?;
    handshake(fd, UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_HUGETLBFS_SHMEM)
}

/// A userfaultfd with notified write protection: a write to a protected page blocks the
/// writer until a handler reads the fault ([`read_wp_faults`]) and un-protects the page
/// ([`write_protect`], which wakes it). Faults taken inside the kernel (a `read(2)` into the
/// memory) must reach the handler too, or such system calls would fail with EFAULT: so
/// never in user-mode-only mode, which needs the privilege to open a full userfaultfd (root,
/// CAP_SYS_PTRACE, or `vm.unprivileged_userfaultfd = 1`); fails otherwise.
pub fn open_notified_wp_uffd() -> io::Result<OwnedFd> {
    let fd = open_uffd(libc::O_CLOEXEC | libc::O_NONBLOCK)?;
    handshake(fd, UFFD_FEATURE_WP_HUGETLBFS_SHMEM)
}

/// Registers `[start, start + len)` for write protection on `uffd`.
pub fn register_wp(uffd: &OwnedFd, start: u64, len: u64) -> io::Result<()> {
    let mut r = UffdioRegister {
        range: UffdioRange { start, len },
        mode: UFFDIO_REGISTER_MODE_WP,
        ioctls: 0,
    };
    ioctl(uffd, UFFDIO_REGISTER, &mut r).map(drop)
}

/// Write-protects (`protect`) or un-protects `[start, start + len)`.
pub fn write_protect(uffd: &OwnedFd, start: u64, len: u64, protect: bool) -> io::Result<()> {
    let mut w = UffdioWriteprotect {
        range: UffdioRange { start, len },
        mode: if protect {
            UFFDIO_WRITEPROTECT_MODE_WP
        } else {
            0
        },
    };
    ioctl(uffd, UFFDIO_WRITEPROTECT, &mut w).map(drop)
}

/// Wakes the threads blocked on faults in `[start, start + len)` without changing protection
/// (they fault again if the page is still protected).
pub fn wake(uffd: &OwnedFd, start: u64, len: u64) -> io::Result<()> {
    let mut r = UffdioRange { start, len };
    ioctl(uffd, UFFDIO_WAKE, &mut r).map(drop)
}

/// One message of a userfaultfd (`struct uffd_msg`, packed, 32 bytes).
#[repr(C, packed)]
#[derive(Clone, Copy, Default)]
pub struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    feat: u32,
    pad: u32,
}

const _: () = assert!(std::mem::size_of::<UffdMsg>() == 32);

impl UffdMsg {
    /// The address of a write fault on a write-protected page, if the message is one.
    pub fn wp_fault_address(&self) -> Option<u64> {
        let (event, flags, address) = (self.event, self.flags, self.address);
        (event == UFFD_EVENT_PAGEFAULT && flags & UFFD_PAGEFAULT_FLAG_WP != 0).then_some(address)
    }
}

/// Reads the pending messages of a (non-blocking) userfaultfd into `out`: how many were read,
/// 0 when none was pending.
pub fn read_wp_faults(uffd: &OwnedFd, out: &mut [UffdMsg]) -> io::Result<usize> {
    // SAFETY: `out` is a live, exclusively borrowed buffer of `size_of_val(out)` bytes of
    // plain-old-data messages; the kernel writes at most that many bytes of whole messages.
    let n = unsafe {
        libc::read(
            uffd.as_raw_fd(),
            out.as_mut_ptr().cast(),
            std::mem::size_of_val(out),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    Ok(usize::try_from(n).unwrap_or(0) / std::mem::size_of::<UffdMsg>())
}

/// A non-blocking eventfd (the handler thread's stop signal).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes an initial value and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to an eventfd (makes it readable).
pub fn eventfd_signal(fd: &OwnedFd) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes the 8 bytes of `one`, a live local, to the descriptor.
    let n = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits until `fds[i]` is readable for some `i` (no time limit): for each, whether it is.
pub fn poll_readable<const N: usize>(fds: [&OwnedFd; N]) -> io::Result<[bool; N]> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    loop {
        // SAFETY: `p` is a live array of N pollfd structures, N passed as their count.
        let rc = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, -1) };
        if rc >= 0 {
            return Ok(p.map(|x| x.revents != 0));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The calling thread's kernel id.
pub fn thread_id() -> i64 {
    // SAFETY: gettid takes nothing and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

/// Opens `/proc/self/pagemap` for [`scan_written`].
pub fn open_pagemap() -> io::Result<OwnedFd> {
    Ok(std::fs::File::open("/proc/self/pagemap")?.into())
}

/// The written (not write-protected) regions of `[start, end)`, at most `out.len()` of them:
/// returns how many were filled and where the walk stopped (`end` when it saw everything).
pub fn scan_written(
    pagemap: &OwnedFd,
    start: u64,
    end: u64,
    out: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags: PM_SCAN_CHECK_WPASYNC,
        start,
        end,
        walk_end: 0,
        vec: out.as_mut_ptr() as u64,
        vec_len: out.len() as u64,
        max_pages: 0,
        category_inverted: 0,
        category_mask: PAGE_IS_WRITTEN,
        category_anyof_mask: 0,
        return_mask: PAGE_IS_WRITTEN,
    };
    let n = ioctl(pagemap, PAGEMAP_SCAN, &mut arg)?;
    Ok((usize::try_from(n).unwrap_or(0), arg.walk_end))
}
