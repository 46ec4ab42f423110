//! Raw kernel calls of CPU write tracking: userfaultfd in asynchronous write-protect mode and
//! the `PAGEMAP_SCAN` ioctl of `/proc/self/pagemap` (Linux 6.7+). Nothing else in the crate
//! makes system calls.
//!
//! The structures and request numbers are the kernel's UAPI (`linux/userfaultfd.h`,
//! `linux/fs.h`), written out here because the `libc` crate does not carry all of them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const UFFDIO_WRITEPROTECT: libc::c_ulong = 0xc018_aa06;
const UFFDIO_REGISTER_MODE_WP: u64 = 2;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
/// Write protection of shmem mappings (the CUDA driver's pinned host memory is one).
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
/// The kernel resolves write faults itself (un-protects the page), no handler thread.
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
/// Only faults from user mode reach the descriptor (lets unprivileged processes use it).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
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

/// A userfaultfd with asynchronous write protection: writes to protected pages are resolved
/// by the kernel (the page becomes writable, its write-protect bit clear), and
/// [`scan_written`] reports them.
pub fn open_async_wp_uffd() -> io::Result<OwnedFd> {
    let open = |flags: libc::c_int| {
        // SAFETY: the userfaultfd syscall takes only flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd < 0 {
            Err(io::Error::last_os_error())
        } else {
            let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::other("bad descriptor"))?;
            // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
    };
    let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fd = open(base).or_else(|_| open(base | UFFD_USER_MODE_ONLY))?;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_HUGETLBFS_SHMEM,
        ioctls: 0,
    };
    ioctl(&fd, UFFDIO_API, &mut api)?;
    Ok(fd)
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
