//! Raw calls of the node's lent files ([`crate::server`]): a memory file and committing its
//! pages. Everything else in this crate goes through std or UCX.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _};

/// A new memory file (`memfd_create`) named `name`, closed on exec, that may be sealed.
pub fn memory_file(name: &str) -> io::Result<File> {
    let name = std::ffi::CString::new(name).map_err(io::Error::other)?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call; the flags ask for
    // nothing but close-on-exec and sealing.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Allocates every page of `file`'s first `bytes` now (`fallocate`), so they are charged to
/// this process and its memory group, not to whoever writes them first.
pub fn commit(file: &File, bytes: u64) -> io::Result<()> {
    let length = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
    // SAFETY: the descriptor is `file`'s, open for the call; mode 0 only allocates.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, length) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Seals `file` against growing and shrinking, so a borrower can neither make the node hold
/// more than it lent nor drop pages it committed.
pub fn seal_size(file: &File) -> io::Result<()> {
    // SAFETY: the descriptor is `file`'s, open for the call; F_ADD_SEALS takes an int.
    let rc = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
