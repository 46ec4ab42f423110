//! The raw calls this crate makes: whether a process is alive, and a thread that waits for
//! the signals that end a benchmark.

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
