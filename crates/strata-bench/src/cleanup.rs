//! Nothing left behind: the temporary files, memory cgroups and swap a benchmark makes are
//! registered here and removed when the benchmark ends, however it ends: normally (the
//! guards' `Drop`), by a panic (a panic hook, since a panic in another thread does not unwind
//! the owner), or by SIGINT/SIGTERM/SIGHUP (a thread waits for them, cleans up and exits with
//! 128 + the signal). What an earlier run killed with SIGKILL left behind is found by name
//! (`strata-bench-...-PID...`, with PID no longer running) and removed by [`remove_stale`]
//! at the start of the next run.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

use crate::sys;

/// What is registered: plain files are removed, directories (cgroups) are `rmdir`ed after
/// the processes in them are killed.
static LEFT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

/// The prefix of every temporary name a benchmark makes; the process id follows it.
pub const PREFIX: &str = "strata-bench-";

/// Whether `path` is in use as swap (listed in `/proc/swaps`).
pub fn is_active_swap(path: &Path) -> bool {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .any(|name| Path::new(name) == path)
}

/// Removes `path` (a file, or an empty cgroup directory after killing its processes). A
/// swap file or device is switched off first; a zram device is reset (its memory freed)
/// instead of removed.
fn remove(path: &Path) {
    if is_active_swap(path) {
        let _ = std::process::Command::new("swapoff").arg(path).status();
    }
    if let Some(zram) = path
        .to_str()
        .and_then(|p| p.strip_prefix("/dev/"))
        .filter(|name| name.starts_with("zram"))
    {
        let _ = std::fs::write(format!("/sys/block/{zram}/reset"), "1");
        return;
    }
    if path.is_dir() {
        if let Ok(procs) = std::fs::read_to_string(path.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        // The kernel tears a cgroup down shortly after its last process exits.
        for _ in 0..50 {
            if std::fs::remove_dir(path).is_ok() || !path.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    } else {
        let _ = std::fs::remove_file(path);
    }
}

fn remove_all_registered() {
    let paths = std::mem::take(
        &mut *LEFT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    // Last registered first, as guards drop: a cgroup (and the program in it) goes before
    // the swap it uses, so swapoff never waits on a program stuck at its limit.
    for path in paths.into_iter().rev() {
        remove(&path);
    }
}

/// Installs the panic hook and the signal thread (once per process). Call it from the main
/// thread before a benchmark starts its own threads.
pub fn install() {
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            remove_all_registered();
            previous(info);
        }));
        let started = sys::wait_for_ending_signal(|signal| {
            eprintln!("strata bench: signal {signal}, removing temporary files and cgroups");
            remove_all_registered();
            std::process::exit(128 + signal);
        });
        if let Err(e) = started {
            eprintln!("strata bench: cannot watch for Ctrl-C ({e}); a killed run may leave temporary files");
        }
    });
}

/// A registered temporary path, removed when dropped.
#[derive(Debug)]
pub struct Temporary(PathBuf);

impl Temporary {
    /// Registers `path` for removal at the end of the run, however it ends.
    pub fn register(path: PathBuf) -> Self {
        LEFT.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(path.clone());
        Self(path)
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        remove(&self.0);
        LEFT.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|p| p != &self.0);
    }
}

/// A temporary name in `dir` that [`remove_stale`] can recognise: `strata-bench-KIND-PID.EXT`.
pub fn temporary_name(dir: &Path, kind: &str, extension: &str) -> PathBuf {
    dir.join(format!("{PREFIX}{kind}-{}.{extension}", std::process::id()))
}

/// The process id in a name made by [`temporary_name`] or a cgroup named `strata-bench-PID`.
fn owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let stem = rest.split('.').next()?;
    stem.rsplit('-').next()?.parse().ok()
}

/// Removes, from `dir`, what benchmarks whose process is gone left behind (files and cgroup
/// directories named `strata-bench-...-PID`). Returns what it removed.
pub fn remove_stale(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(owner) else {
            continue;
        };
        if pid == std::process::id() || sys::process_alive(pid) {
            continue;
        }
        let path = entry.path();
        remove(&path);
        if !path.exists() {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("run true");
        let pid = child.id();
        child.wait().expect("wait");
        pid
    }

    #[test]
    fn stale_files_of_dead_runs_go_and_live_ones_stay() {
        let dir = std::env::temp_dir().join(format!("strata-cleanup-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dead = dead_pid();
        let stale = dir.join(format!("{PREFIX}pager-{dead}.bin"));
        let stale_dir = dir.join(format!("{PREFIX}{dead}"));
        let mine = temporary_name(&dir, "pager", "bin");
        let foreign = dir.join("strata-bench-notes.txt");
        for f in [&stale, &mine, &foreign] {
            std::fs::write(f, b"x").unwrap();
        }
        std::fs::create_dir(&stale_dir).unwrap();
        let removed = remove_stale(&dir);
        assert!(
            !stale.exists() && !stale_dir.exists(),
            "removed {removed:?}"
        );
        assert!(mine.exists(), "this process's file is in use");
        assert!(foreign.exists(), "a name without a pid is not ours");
        assert_eq!(removed.len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Set in the child process that [`a_registered_file_goes_on_drop_and_on_panic`] starts.
    const PANIC_CHILD: &str = "STRATA_CLEANUP_PANIC_CHILD";

    /// The panic hook removes everything the process registered, so the deliberate panic runs
    /// in a child process of its own: in this one it would also remove the cgroups and files
    /// of the tests running beside it (and kill the programs in those cgroups).
    #[test]
    fn a_registered_file_goes_on_drop_and_on_panic() {
        if std::env::var_os(PANIC_CHILD).is_none() {
            let name = "cleanup::tests::a_registered_file_goes_on_drop_and_on_panic";
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--test-threads=1", "--nocapture"])
                .env(PANIC_CHILD, "1")
                .output()
                .expect("run this test in a child process");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("1 passed"), "the child ran the test: {text}");
            return;
        }
        install();
        let dir = std::env::temp_dir();
        let path = temporary_name(&dir, "cleanup-test-drop", "tmp");
        std::fs::write(&path, b"x").unwrap();
        drop(Temporary::register(path.clone()));
        assert!(!path.exists());
        let path = temporary_name(&dir, "cleanup-test-panic", "tmp");
        std::fs::write(&path, b"x").unwrap();
        let kept = Temporary::register(path.clone());
        // A panic in another thread does not drop `kept`; the hook removes it anyway.
        let joined = std::thread::spawn(|| panic!("deliberate panic in a benchmark thread")).join();
        assert!(joined.is_err());
        assert!(!path.exists(), "the panic hook removed it");
        std::mem::forget(kept);
    }
}
