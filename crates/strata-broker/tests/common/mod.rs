//! Helpers shared by the broker's test binaries: a broker on a thread, child processes that
//! re-run the test binary in a role (bounded: killed on drop), bounded waits.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_broker::message::FreeReason;
use strata_broker::{Broker, BrokerConfig, Enforcer, Lender, LenderEvent};

/// Longest any single wait in a test lasts.
pub const WAIT: Duration = Duration::from_secs(10);
/// Names a child's role (set by `spawn_child`, read by each binary's `child_entry`).
pub const CHILD_ENV: &str = "STRATA_BROKER_TEST_CHILD";
/// What a child prints once it is ready.
pub const READY: &str = "STRATA-CHILD-READY";

pub fn seed() -> u64 {
    let s = rand::random::<u64>();
    println!("seed {s:#x}");
    s
}

pub fn socket_path(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "strata-broker-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    dir.join(format!("{tag}.sock"))
}

pub struct Running {
    pub path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_dir_all(self.path.parent().unwrap());
    }
}

pub fn start_broker(enforcer: Box<dyn Enforcer>) -> Running {
    start_broker_with(BrokerConfig::default(), enforcer)
}

pub fn start_broker_with(config: BrokerConfig, enforcer: Box<dyn Enforcer>) -> Running {
    let path = socket_path("broker");
    let mut broker = Broker::bind(&path, config, enforcer).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::spawn(move || broker.run(&s).unwrap());
    Running {
        path,
        stop,
        thread: Some(thread),
    }
}

pub fn freed(lender: &Lender, reason: FreeReason, want: usize) -> bool {
    let count = |l: &Lender| -> usize {
        l.events()
            .iter()
            .map(|e| match e {
                LenderEvent::Freed { chunks, reason: r } if *r == reason => chunks.len(),
                _ => 0,
            })
            .sum()
    };
    let end = Instant::now() + WAIT;
    while count(lender) < want && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    count(lender) == want
}

/// A child process, killed and reaped on drop; its stdout lines after the ready line arrive on
/// `lines`, and `send` writes a line to its stdin.
pub struct ChildGuard(pub Child, pub std::sync::mpsc::Receiver<String>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl ChildGuard {
    /// Writes `line` to the child's stdin.
    pub fn send(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.0.stdin.as_mut().expect("stdin is piped");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// The child's next stdout line starting with `prefix` (within WAIT).
    pub fn expect_line(&self, prefix: &str) -> String {
        let end = Instant::now() + WAIT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let line = self
                .1
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no `{prefix}` line from the child in time"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }
}

pub fn spawn_child(spec: &str) -> ChildGuard {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if line.contains(READY) {
                let _ = ready_tx.send(());
            } else {
                let _ = tx.send(line);
            }
        }
    });
    let guard = ChildGuard(child, rx);
    ready_rx
        .recv_timeout(WAIT)
        .expect("the child got ready in time");
    guard
}

pub fn wait_exit(child: &mut ChildGuard) -> std::process::ExitStatus {
    let end = Instant::now() + WAIT;
    loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < end, "child did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's role, socket path and further arguments, when it is a child started by
/// `spawn_child` (`role|path|args...`).
pub fn child_spec() -> Option<(String, PathBuf, Vec<String>)> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    let mut parts = spec.split('|').map(str::to_string);
    let role = parts.next()?;
    let path = PathBuf::from(parts.next()?);
    Some((role, path, parts.collect()))
}

/// Child role `broker`: serves at `path` until killed.
pub fn run_broker_child(path: &std::path::Path) -> ! {
    let mut broker = Broker::bind(
        path,
        BrokerConfig::default(),
        Box::new(strata_broker::Sigkill),
    )
    .unwrap();
    println!("{READY}");
    broker.run(&Arc::new(AtomicBool::new(false))).unwrap();
    std::process::exit(4);
}

/// Says the child is ready (with `note`), then keeps `held` alive until killed (60 s at most).
pub fn ready_and_hold<T>(held: T, note: &str) -> ! {
    println!("{READY} {note}");
    std::thread::sleep(Duration::from_secs(60));
    drop(held);
    std::process::exit(3);
}
