//! The kernel's own swap as a baseline for `strata bench run`: a swap device switched on for
//! the run (zram with LZ4, or a swap file on disk) and a cgroup v1 memory group of the same
//! limit that a program runs in.
//!
//! Why the kernel was OOM-killed before, and what is done about it. In a v1 memory cgroup
//! the kernel swaps fine (the swap counters rise, `memory.memsw.limit_in_bytes` is
//! unlimited, the group's `memory.swappiness` is honoured): a program touching 4x the limit
//! at random runs through. But a program whose working set refaults faster than reclaim
//! makes progress (`sort`'s merge: every refaulted page is put straight back on the active
//! list by the workingset code, so `inactive_anon` is 0 at the kill) makes the charge of a
//! swap-in (`mem_cgroup_swapin_charge_folio`) fail its reclaim retries, and the group's OOM
//! killer ends the program (`oom-kill: constraint=CONSTRAINT_MEMCG` in the kernel log). It
//! happens at random (the same `sort` is killed in one run and finishes in the next), with
//! zram and a swap file alike. Cgroup v2's `memory.high`, which throttles instead of
//! killing, is not available where the memory controller is bound to v1 (as on our
//! machines). So the group runs with `memory.oom_control` = 1 (no OOM kill: the faulting
//! task waits instead), and a watcher wakes a waiting group by raising its limit by one page
//! and lowering it again (the kernel wakes OOM waiters when a limit grows), so the fault
//! retries its reclaim. Lowering fails (EBUSY) while reclaim cannot get under the limit; it
//! is retried every 2 ms. Every wake-up and the seconds the limit stood one page higher are
//! counted in the results.
//!
//! Everything set up is registered with [`crate::cleanup`]: swap is switched off, zram reset
//! and the swap file removed when the benchmark ends, also by a panic or Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cleanup::{Temporary, is_active_swap};

/// Why the kernel baseline cannot run here; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// Not root.
    #[error(
        "the kernel baselines switch swap on and every row runs in a memory cgroup, which needs root; run as root, or leave the kernel baselines out with --contestants and run the strata rows without cgroups (--strata-cgroup false)"
    )]
    NotRoot,
    /// Some swap is already on: switching it off would change the machine for others.
    #[error(
        "swap is already on ({0}); the kernel baselines must be the only swap: switch it off (swapoff) first, or leave them out with --contestants"
    )]
    SwapAlreadyOn(String),
    /// Swap is on while a Strata row would run.
    #[error(
        "swap is on ({0}) while a strata run row would run in its memory group; swap must not hold any of its pages: switch it off (swapoff) first"
    )]
    SwapOnForStrata(String),
    /// No v1 memory controller.
    #[error(
        "no cgroup v1 memory controller at /sys/fs/cgroup/memory ({0}); this benchmark runs every row in one (cgroup v2's memory controller is not supported yet)"
    )]
    NoMemoryCgroup(String),
    /// A setup step failed.
    #[error("{step}: {why}")]
    Step {
        /// What was being done.
        step: String,
        /// The error.
        why: String,
    },
}

pub(crate) fn step(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> SwapError {
    let step = step.into();
    move |e| SwapError::Step {
        step,
        why: e.to_string(),
    }
}

fn command(step_name: &str, program: &str, args: &[&std::ffi::OsStr]) -> Result<(), SwapError> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(step(format!("running {program} ({step_name})")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(SwapError::Step {
            step: format!("{program} ({step_name})"),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Checks that the kernel baselines can run here: root, no swap on, a v1 memory cgroup.
pub fn check() -> Result<(), SwapError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if uid != "0" {
        return Err(SwapError::NotRoot);
    }
    let swaps: Vec<String> = std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    if !swaps.is_empty() {
        return Err(SwapError::SwapAlreadyOn(swaps.join(", ")));
    }
    let parent = own_memory_cgroup();
    if !parent.join("memory.oom_control").is_file() {
        return Err(SwapError::NoMemoryCgroup(format!(
            "{} has no memory.oom_control",
            parent.display()
        )));
    }
    Ok(())
}

/// A swap device or file that is on until dropped.
#[derive(Debug)]
pub struct SwapOn {
    /// The device or file.
    pub path: PathBuf,
    /// Switches it off and resets or removes it when dropped (or on a panic or signal).
    _guard: Temporary,
}

impl SwapOn {
    /// `/dev/zram0` with LZ4, `bytes` of uncompressed capacity, as the only swap.
    pub fn zram(bytes: u64) -> Result<Self, SwapError> {
        let sys = Path::new("/sys/block/zram0");
        if !sys.exists() {
            // The module may just not be loaded.
            let _ = Command::new("modprobe")
                .args(["zram", "num_devices=1"])
                .status();
        }
        if !sys.exists() {
            return Err(SwapError::Step {
                step: "finding /sys/block/zram0".into(),
                why: "no zram device (modprobe zram failed)".into(),
            });
        }
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        if mounts.lines().any(|l| l.starts_with("/dev/zram0 ")) {
            return Err(SwapError::Step {
                step: "taking /dev/zram0".into(),
                why: "it is mounted (in use for something else); unmount it or leave the zram baseline out".into(),
            });
        }
        let path = PathBuf::from("/dev/zram0");
        // Registered before anything changes, so a failure below still resets the device.
        let guard = Temporary::register(path.clone());
        std::fs::write(sys.join("reset"), "1").map_err(step("resetting zram0"))?;
        let algorithms = std::fs::read_to_string(sys.join("comp_algorithm"))
            .map_err(step("reading zram0's algorithms"))?;
        if !algorithms
            .split_whitespace()
            .any(|a| a.trim_matches(['[', ']']) == "lz4")
        {
            return Err(SwapError::Step {
                step: "choosing lz4 for zram0".into(),
                why: format!("this kernel's zram offers only {}", algorithms.trim()),
            });
        }
        std::fs::write(sys.join("comp_algorithm"), "lz4")
            .map_err(step("choosing lz4 for zram0"))?;
        std::fs::write(sys.join("disksize"), bytes.to_string())
            .map_err(step("sizing zram0 (disksize)"))?;
        command("zram0", "mkswap", &[path.as_os_str()])?;
        command("zram0", "swapon", &[path.as_os_str()])?;
        Ok(Self {
            path,
            _guard: guard,
        })
    }

    /// A swap file of `bytes` in `dir` (on a disk, not tmpfs), as the only swap.
    pub fn file(dir: &Path, bytes: u64) -> Result<Self, SwapError> {
        if crate::sys::on_tmpfs(dir) {
            return Err(SwapError::Step {
                step: format!("making a swap file in {}", dir.display()),
                why: "it is on tmpfs (memory); give --dir on a disk".into(),
            });
        }
        let path = crate::cleanup::temporary_name(dir, "run-swap", "swap");
        let guard = Temporary::register(path.clone());
        write_zeros(&path, bytes).map_err(step(format!("writing {}", path.display())))?;
        command("swap file", "mkswap", &[path.as_os_str()])?;
        command("swap file", "swapon", &[path.as_os_str()])?;
        Ok(Self {
            path,
            _guard: guard,
        })
    }

    /// Whether it is still on.
    pub fn is_on(&self) -> bool {
        is_active_swap(&self.path)
    }
}

/// A swap file must have no holes: write it out (mode 0600, as swapon wants).
fn write_zeros(path: &Path, bytes: u64) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()
}

/// This process's v1 memory cgroup directory.
pub fn own_memory_cgroup() -> PathBuf {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = own
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctl, path) = (parts.next()?, parts.next()?, parts.next()?);
            ctl.split(',').any(|c| c == "memory").then_some(path)
        })
        .unwrap_or("/");
    PathBuf::from("/sys/fs/cgroup/memory").join(rel.trim_start_matches('/'))
}

/// Reads a cgroup file that holds one number (0 if it cannot be read).
pub(crate) fn cgroup_number(dir: &Path, file: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Reads one `key value` line of a cgroup file.
pub(crate) fn cgroup_value(dir: &Path, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// A global `/proc/vmstat` counter.
fn vmstat(key: &str) -> u64 {
    cgroup_value(Path::new("/proc"), "vmstat", key)
}

/// What one program did in the group.
#[derive(Debug, Clone)]
pub struct KernelRun {
    /// Wall seconds.
    pub seconds: f64,
    /// Whether it exited with status 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Major faults in the group (`pgmajfault`).
    pub major_faults: u64,
    /// Bytes swapped in and out (machine-wide `pswpin`/`pswpout`: this is the only swap).
    pub swap_in_bytes: u64,
    /// See `swap_in_bytes`.
    pub swap_out_bytes: u64,
    /// Times the group waited in OOM and was woken to retry its reclaim.
    pub oom_retries: u64,
    /// Seconds the group's limit stood one page above the limit after a wake-up, because
    /// putting it back failed while the program kept charging (retried every 2 ms).
    pub over_limit_seconds: f64,
    /// OOM kills in the group (0 unless the OOM kill could not be disabled).
    pub oom_kills: u64,
    /// `memory.max_usage_in_bytes` over the run (one page above the limit after a wake-up).
    pub max_usage_bytes: u64,
}

/// Makes a memory group named `KIND-PID` (with the cleanup prefix) under this process's own
/// memory cgroup, after removing groups that dead runs left there; removed when the guard
/// drops. The process id comes last, as `cleanup::remove_stale` reads it.
pub(crate) fn new_group(kind: &str) -> Result<(PathBuf, Temporary), SwapError> {
    let parent = own_memory_cgroup();
    crate::cleanup::remove_stale(&parent);
    let dir = parent.join(format!(
        "{}{kind}-{}",
        crate::cleanup::PREFIX,
        std::process::id()
    ));
    std::fs::create_dir(&dir).map_err(step(format!("creating {}", dir.display())))?;
    let guard = Temporary::register(dir.clone());
    Ok((dir, guard))
}

/// A v1 memory cgroup of `limit` bytes whose OOM kill is replaced by retries.
#[derive(Debug)]
pub struct SwapCgroup {
    dir: PathBuf,
    limit: u64,
    _guard: Temporary,
}

impl SwapCgroup {
    /// Makes the group under this process's own memory cgroup.
    pub fn new(limit: u64) -> Result<Self, SwapError> {
        let (dir, guard) = new_group("run")?;
        std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(step("setting memory.limit_in_bytes"))?;
        std::fs::write(dir.join("memory.oom_control"), "1")
            .map_err(step("disabling the OOM kill (memory.oom_control)"))?;
        Ok(Self {
            dir,
            limit,
            _guard: guard,
        })
    }

    /// The group's `memory.swappiness` (inherited from its parent).
    pub fn swappiness(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.swappiness"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Runs `argv` in the group (killed after `limit`), waking it whenever it waits in OOM.
    pub fn run(&self, argv: &[String], limit: Duration) -> std::io::Result<KernelRun> {
        let (faults0, kills0) = (
            cgroup_value(&self.dir, "memory.stat", "pgmajfault"),
            cgroup_value(&self.dir, "memory.oom_control", "oom_kill"),
        );
        let (in0, out0) = (vmstat("pswpin"), vmstat("pswpout"));
        let _ = std::fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
        let t = Instant::now();
        let child = spawn_in_group(&self.dir, argv, &[], limit, Stdio::piped())?;
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (done, dir, limit) = (done.clone(), self.dir.clone(), self.limit);
            std::thread::spawn(move || watch(&dir, limit, &done))
        };
        let out = child.wait_with_output();
        let seconds = t.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let watched = watcher.join().unwrap_or_default();
        let out = out?;
        Ok(KernelRun {
            seconds,
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            major_faults: cgroup_value(&self.dir, "memory.stat", "pgmajfault") - faults0,
            swap_in_bytes: (vmstat("pswpin") - in0) * 4096,
            swap_out_bytes: (vmstat("pswpout") - out0) * 4096,
            oom_retries: watched.retries,
            over_limit_seconds: watched.over_limit.as_secs_f64(),
            oom_kills: cgroup_value(&self.dir, "memory.oom_control", "oom_kill") - kills0,
            max_usage_bytes: cgroup_number(&self.dir, "memory.max_usage_in_bytes"),
        })
    }
}

/// Starts `argv` with `env` in the memory group `dir` (the shell joins it, then becomes the
/// program), killed after `limit`; standard output goes to `stdout`.
pub(crate) fn spawn_in_group(
    dir: &Path,
    argv: &[String],
    env: &[(&str, &str)],
    limit: Duration,
    stdout: Stdio,
) -> std::io::Result<std::process::Child> {
    let join = format!("echo $$ > '{}/cgroup.procs' && exec \"$@\"", dir.display());
    Command::new("timeout")
        .args([
            "-s",
            "KILL",
            &limit.as_secs().to_string(),
            "sh",
            "-c",
            &join,
            "sh",
        ])
        .args(argv)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::inherit())
        .spawn()
}

/// What the OOM watcher did.
#[derive(Debug, Default)]
struct Watched {
    retries: u64,
    over_limit: Duration,
}

/// Until `done`: wakes the group whenever it waits in OOM by raising its limit by a page
/// (the kernel wakes OOM waiters when a limit grows), then puts the limit back; writing the
/// lower limit reclaims down to it and fails (EBUSY) while it cannot, so it is retried on
/// every poll until it holds, and the time spent above the limit is counted.
fn watch(dir: &Path, limit: u64, done: &AtomicBool) -> Watched {
    let file = dir.join("memory.limit_in_bytes");
    let mut w = Watched::default();
    let mut raised: Option<Instant> = None;
    loop {
        if let Some(since) = raised
            && std::fs::write(&file, limit.to_string()).is_ok()
        {
            w.over_limit += since.elapsed();
            raised = None;
        }
        if done.load(Ordering::Relaxed) {
            break;
        }
        if raised.is_none() && cgroup_value(dir, "memory.oom_control", "under_oom") == 1 {
            if std::fs::write(&file, (limit + 4096).to_string()).is_ok() {
                raised = Some(Instant::now());
            }
            w.retries += 1;
            continue;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(since) = raised {
        // The program has ended: nothing charges any more, so the limit goes back at once.
        let _ = std::fs::write(&file, limit.to_string());
        w.over_limit += since.elapsed();
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_values_are_read_by_whole_key() {
        let dir =
            std::env::temp_dir().join(format!("strata-kernel-swap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("memory.oom_control"),
            "oom_kill_disable 1\nunder_oom 0\noom_kill 7\n",
        )
        .unwrap();
        // "oom_kill" must not match "oom_kill_disable".
        assert_eq!(cgroup_value(&dir, "memory.oom_control", "oom_kill"), 7);
        assert_eq!(
            cgroup_value(&dir, "memory.oom_control", "oom_kill_disable"),
            1
        );
        assert_eq!(cgroup_value(&dir, "memory.oom_control", "under_oom"), 0);
        assert_eq!(cgroup_value(&dir, "memory.oom_control", "missing"), 0);
        assert_eq!(cgroup_value(&dir, "no-such-file", "oom_kill"), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_is_not_swap_is_not_active_swap() {
        assert!(!is_active_swap(Path::new("/nonexistent/strata-swap")));
        assert!(vmstat("pgfault") > 0, "/proc/vmstat is readable");
    }

    #[test]
    fn the_own_memory_cgroup_is_under_the_v1_mount() {
        assert!(own_memory_cgroup().starts_with("/sys/fs/cgroup/memory"));
    }
}
