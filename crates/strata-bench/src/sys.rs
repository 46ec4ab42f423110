//! The raw calls this crate makes: whether a process is alive, a thread that waits for the
//! signals that end a benchmark, whether a directory is on tmpfs, and dropping a file's pages
//! from the OS page cache.

/// Whether a process with this id exists (it may belong to another user).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the pid exists and may be
    // signalled, and touches no memory of ours.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The signals that end a benchmark early: Ctrl-C, `kill`, a closed terminal.
const ENDING: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn ending_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe { libc::sigemptyset(&raw mut set) };
    for signal in ENDING {
        // SAFETY: as above; the signal numbers are valid constants.
        unsafe { libc::sigaddset(&raw mut set, signal) };
    }
    set
}

/// Blocks the ending signals in the calling thread (threads it starts later inherit the
/// mask) and starts a thread that waits for one with `sigwait`, then calls `on_signal` with
/// its number. Call it before starting other threads, so no thread takes the signal itself.
pub fn wait_for_ending_signal(on_signal: impl FnOnce(i32) + Send + 'static) -> std::io::Result<()> {
    let set = ending_set();
    // SAFETY: `set` is initialised; a null old-mask pointer is allowed.
    let rc =
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("strata-bench-signals".into())
        .spawn(move || {
            let mut signal: libc::c_int = 0;
            // SAFETY: `set` is initialised and `signal` is a valid out pointer; every ending
            // signal is blocked in this thread (inherited), as sigwait requires.
            let rc = unsafe { libc::sigwait(&raw const set, &raw mut signal) };
            if rc == 0 {
                on_signal(signal);
            }
        })?;
    Ok(())
}

/// Whether `dir` is on tmpfs (or ramfs), where file pages live in memory for good (and
/// `O_DIRECT` is refused).
pub fn on_tmpfs(dir: &std::path::Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: statfs fills the struct it is given for a NUL-terminated path.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs succeeded, so the struct is initialised.
    let kind = unsafe { st.assume_init() }.f_type;
    matches!(kind, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Bytes an unprivileged writer may still put on the file system holding `path`.
pub fn free_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: statvfs fills the struct it is given for a NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Drops `file`'s clean pages from the OS page cache (advisory), so the next reader pays for
/// them from the disk.
pub fn drop_from_page_cache(file: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: posix_fadvise on a descriptor `file` keeps open for the call; advisory only,
    // it touches no memory of ours.
    let rc = unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}
