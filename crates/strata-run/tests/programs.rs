//! Unmodified programs under `strata run` with a budget well below their footprint must print
//! what they print without it: `sort -S`, NumPy, `stress-ng --vm --verify`, a multi-threaded
//! C program that checks every byte, and fork/exec. Plus bad input to `strata run`.
//!
//! Needs the `strata` binary and `libstrata_run.so` of the same profile (both built by
//! `cargo test --workspace`; `cargo build -p strata-cli -p strata-run` otherwise), gcc, and
//! for two tests Debian's `stress-ng` and Python's NumPy (installed here with pip if missing).
//! Each program runs in a child process with a deadline.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    // target/<profile>/deps/<test binary>
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binaries live in target/<profile>/deps")
        .to_path_buf()
}

fn strata() -> Option<PathBuf> {
    let bin = target_dir().join("strata");
    let lib = target_dir().join("libstrata_run.so");
    if bin.is_file() && lib.is_file() {
        Some(bin)
    } else {
        eprintln!(
            "\n*** SKIPPED: {} or {} is missing; run `cargo build -p strata-cli -p strata-run` first (cargo test --workspace builds both) ***\n",
            bin.display(),
            lib.display()
        );
        None
    }
}

fn seed() -> u64 {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| u64::from(d.subsec_nanos()) ^ d.as_secs());
    println!("seed {s}");
    s
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-run-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// How many times its stated limit a program may run before [`run`] calls it hung. Every
/// program here runs a pager (and often a memory node) beside the program: a sort that takes
/// 1-4 s alone took more than 60 s with two copies of this binary on a 2-core machine under
/// CPU load (both copies failed so, twice, in `a_node_mostly_taken_by_another_client_...` and
/// then in `sort_of_a_file_larger_than_the_budget`); the binary alone takes about 75 s.
const HANG_GUARD_STRETCH: u32 = 3;

/// Runs `cmd` with a deadline, killing it and everything it started if it overruns (it
/// runs in a process group of its own: a process it left behind would hold the output pipes
/// open, and waiting for them would never end). Output is collected by a helper thread, so
/// a program printing more than a pipe holds never blocks.
///
/// `limit` is what the program takes on a busy machine, and only stops a hang: it is
/// stretched by [`HANG_GUARD_STRETCH`] before it is enforced.
fn run(mut cmd: Command, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    let limit = limit * HANG_GUARD_STRETCH;
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = cmd.spawn().expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{pid}")])
                .status();
            let out = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("output after kill")
                .expect("output");
            panic!(
                "{cmd:?} ran past {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

fn compile(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let out = dir.join(name);
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc is needed for these tests (apt-get install gcc)");
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// `strata run OPTIONS -- PROGRAM ARGS`.
fn under(strata: &Path, opts: &[&str], program: &[&str]) -> Command {
    let mut c = Command::new(strata);
    c.arg("run").args(opts).arg("--").args(program);
    c
}

fn native(program: &[&str]) -> Command {
    let mut c = Command::new(program[0]);
    c.args(&program[1..]);
    c
}

/// Output of the program alone and under `strata run` (each store and codec) must match.
fn same_output(strata: &Path, program: &[&str], configs: &[&[&str]], limit: Duration) {
    same_output_with(strata, program, configs, limit, &[]);
}

/// [`same_output`] with extra environment for `strata run` (a memory node's token).
fn same_output_with(
    strata: &Path,
    program: &[&str],
    configs: &[&[&str]],
    limit: Duration,
    env: &[(&str, &str)],
) {
    let want = run(native(program), limit);
    assert!(
        want.status.success(),
        "{program:?} failed natively: {want:?}"
    );
    for opts in configs {
        // One file per run: tests run in parallel in this process.
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stats = scratch("stats").join(format!("report-{n}.json"));
        let mut all: Vec<&str> = opts.to_vec();
        let stats_s = stats.to_string_lossy().into_owned();
        all.extend(["--stats", &stats_s]);
        let t = Instant::now();
        let mut cmd = under(strata, &all, program);
        cmd.envs(env.iter().copied());
        let got = run(cmd, limit);
        println!("{program:?} {opts:?}: {:?}", t.elapsed());
        assert!(
            got.status.success(),
            "{program:?} under {opts:?} failed: {}",
            String::from_utf8_lossy(&got.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&got.stdout),
            String::from_utf8_lossy(&want.stdout),
            "{program:?} under {opts:?} printed something else"
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).expect("--stats file")).expect("JSON");
        let faults = report["totals"]["faults"].as_u64().unwrap_or(0);
        assert!(
            faults > 0,
            "{program:?} under {opts:?} never faulted: the budget did not bind ({report})"
        );
    }
}

const CONFIGS: &[&[&str]] = &[
    &["--memory", "16MiB"],
    &["--memory", "16MiB", "--codec", "lz4"],
    &["--memory", "16MiB", "--store", "file"],
    &["--memory", "16MiB", "--store", "file", "--codec", "lz4"],
];

/// A memory node on loopback for one test, and what `strata run` needs to reach it.
struct TestNode {
    node: strata_net::MemoryNode,
    store: String,
    token: String,
    /// Programs reach the node over messages (`STRATA_REMOTE_FILES=false`), not through the
    /// files a node on their host lends by default.
    messages: bool,
}

impl TestNode {
    /// A node with the default capacity (1 GiB) and a fresh token.
    fn start() -> Self {
        Self::start_with_token(&format!("strata-run-test-token-{:x}", seed()))
    }

    fn start_with_token(token: &str) -> Self {
        let node = strata_net::MemoryNode::start(strata_net::ServeOptions::new(
            "127.0.0.1:0".parse().expect("address"),
            1 << 30,
            token,
        ))
        .expect("a memory node on loopback");
        let store = format!("remote:{}", node.address());
        Self {
            node,
            store,
            token: token.to_string(),
            messages: false,
        }
    }

    /// A node that programs reach over messages only.
    fn start_messages() -> Self {
        Self {
            messages: true,
            ..Self::start()
        }
    }

    /// The environment of a program over this node (also harmless for the other stores). No
    /// STRATA_RUN_ARENA: each process's arena is sized to what the node has free (1 GiB).
    fn env(&self) -> Vec<(&str, &str)> {
        vec![
            ("STRATA_REMOTE_TOKEN", self.token.as_str()),
            ("STRATA_REMOTE_TIMEOUT", "30"),
            (
                "STRATA_REMOTE_FILES",
                if self.messages { "false" } else { "true" },
            ),
        ]
    }

    /// Another client of this node holding `bytes` of it until dropped.
    fn hold(&self, bytes: u64) -> strata_net::RemoteStore {
        let mut o = strata_net::RemoteStoreOptions::new(
            vec![self.node.address().to_string()],
            self.token.clone(),
            Duration::from_secs(30),
        );
        o.stripe_bytes = 1 << 20;
        let store = strata_net::RemoteStore::connect(bytes, o).expect("another client");
        let lent = self
            .node
            .counters()
            .lent_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            lent >= bytes,
            "the node lends {lent} bytes, not the {bytes} held"
        );
        store
    }

    /// [`CONFIGS`] followed by this node without and with LZ4, each with `budget`.
    fn configs(&self, budget: &str) -> Vec<Vec<String>> {
        let mut all: Vec<Vec<String>> = CONFIGS
            .iter()
            .map(|c| {
                let mut c: Vec<String> = c.iter().map(ToString::to_string).collect();
                c[1] = budget.to_string();
                c
            })
            .collect();
        for codec in ["none", "lz4"] {
            all.push(
                ["--memory", budget, "--store", &self.store, "--codec", codec]
                    .map(String::from)
                    .to_vec(),
            );
        }
        all
    }

    /// Checks that `what`'s pages went to this node: over messages, more than `written`
    /// bytes written and some read back; through lent files (which the node does not see
    /// pages cross), that it lent some and none crossed its messages.
    fn assert_paged(&self, what: &str, written: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = self.node.counters();
        let (w, r) = (c.bytes_written.load(Relaxed), c.bytes_read.load(Relaxed));
        let files = c.files_lent.load(Relaxed);
        println!("memory node: {w} bytes written, {r} bytes read, {files} files lent");
        if self.messages {
            assert!(
                w > written && r > 0 && files == 0,
                "{what}: the pages did not go over the memory node's messages ({w} written, {r} read, {files} files lent)"
            );
        } else {
            assert!(
                files > 0 && w == 0,
                "{what}: the memory node lent no file ({files}; {w} bytes written over messages)"
            );
        }
    }
}

/// 2 threads x 24 MiB plus a 16 MiB mapping, with a 16 MiB budget over `node` without and
/// with LZ4, every byte checked, and the pages went to the node.
fn node_serves_every_byte(strata: &Path, prog: &Path, node: &TestNode) {
    let p = prog.to_string_lossy();
    let seed_s = seed().to_string();
    same_output_with(
        strata,
        &[&p, &seed_s, "2", "24"],
        &[
            &["--memory", "16MiB", "--store", &node.store],
            &[
                "--memory",
                "16MiB",
                "--store",
                &node.store,
                "--codec",
                "lz4",
            ],
        ],
        Duration::from_secs(90),
        &node.env(),
    );
    node.assert_paged("check_bytes", 16 << 20);
}

/// A page larger than the default threshold (256 KiB) raises the threshold with it: the
/// program runs, paged in 1 MiB pages, without `--threshold` (it used to be refused inside
/// the program, after it had started).
#[test]
fn a_page_above_the_default_threshold_raises_the_threshold() {
    let Some(strata) = strata() else { return };
    let dir = scratch("big-page");
    let prog = compile("check_bytes", &dir);
    let s = seed().to_string();
    let p = prog.to_string_lossy();
    same_output(
        &strata,
        &[&p, &s, "2", "8"],
        &[&["--memory", "8MiB", "--page-size", "1MiB"]],
        Duration::from_secs(60),
    );
}

/// The arena's file store bypasses the page cache unless a codec is used or
/// `STRATA_FILE_DIRECT` says otherwise: the program itself reads the flags of its store's
/// descriptor.
#[test]
fn a_file_store_bypasses_the_page_cache_unless_a_codec_is_used() {
    let Some(strata) = strata() else { return };
    let dir = scratch("direct");
    let d = dir.to_string_lossy().into_owned();
    let store = format!("file:{d}");
    let script = r#"import os
b = bytearray(32 << 20)
for i in range(0, len(b), 4096): b[i] = 1
for fd in os.listdir('/proc/self/fd'):
    try: target = os.readlink('/proc/self/fd/' + fd)
    except OSError: continue
    if '.store' in target:
        flags = [l for l in open('/proc/self/fdinfo/' + fd) if l.startswith('flags')][0]
        print('direct' if int(flags.split()[1], 8) & 0o40000 else 'buffered')
"#;
    for (codec, env, want) in [
        ("none", None, "direct"),
        ("lz4", None, "buffered"),
        ("none", Some("false"), "buffered"),
        ("lz4", Some("true"), "direct"),
    ] {
        let mut c = under(
            &strata,
            &["--memory", "8MiB", "--store", &store, "--codec", codec],
            &["python3", "-c", script],
        );
        if let Some(v) = env {
            c.env("STRATA_FILE_DIRECT", v);
        }
        let out = run(c, Duration::from_secs(60));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim() == want,
            "codec {codec}, STRATA_FILE_DIRECT {env:?}: {out:?}"
        );
    }
}

/// `configs` as the slices [`same_output`] takes.
fn borrowed(configs: &[Vec<String>]) -> Vec<Vec<&str>> {
    configs
        .iter()
        .map(|c| c.iter().map(String::as_str).collect())
        .collect()
}

/// [`same_output`] over every store (memory, file, a memory node on loopback), each without
/// and with LZ4, with `budget`; checks that pages went through the node.
fn same_output_everywhere(strata: &Path, program: &[&str], budget: &str, limit: Duration) {
    let node = TestNode::start();
    let configs = node.configs(budget);
    let configs = borrowed(&configs);
    let slices: Vec<&[&str]> = configs.iter().map(Vec::as_slice).collect();
    same_output_with(strata, program, &slices, limit, &node.env());
    node.assert_paged(&format!("{program:?}"), 0);
    node.node.shutdown();
}

#[test]
fn threads_check_every_byte_over_each_store() {
    let Some(strata) = strata() else { return };
    let dir = scratch("bytes");
    let prog = compile("check_bytes", &dir);
    let s = seed().to_string();
    // 4 threads x 24 MiB plus a 16 MiB mapping, with a 16 MiB budget.
    let p = prog.to_string_lossy();
    same_output(
        &strata,
        &[&p, &s, "4", "24"],
        CONFIGS,
        Duration::from_secs(60),
    );
}

#[test]
fn a_memory_node_on_loopback_serves_the_arena() {
    let Some(strata) = strata() else { return };
    let dir = scratch("node");
    let prog = compile("check_bytes", &dir);
    // Over messages, then through the files a node on this host lends (the default), which
    // the rest of the test uses.
    node_serves_every_byte(&strata, &prog, &TestNode::start_messages());
    let node = TestNode::start();
    node_serves_every_byte(&strata, &prog, &node);
    // A wrong token is refused by `strata run`'s check (it asks each node what it has free,
    // proving the token), before the program starts.
    let once = compile("write_once", &dir);
    let once = once.to_string_lossy();
    let mut c = under(
        &strata,
        &["--memory", "16MiB", "--store", &node.store],
        &[&once, "64", "7"],
    );
    c.env("STRATA_REMOTE_TOKEN", "strata-run-test-wrong-token");
    let out = run(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("refused this client") && err.contains("token"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "a result without its data: {out:?}");
    // Preloaded by hand, the process asks the node itself when it sizes its arena: the
    // wrong token ends it there, saying so once.
    std::thread::sleep(Duration::from_millis(600)); // the node throttles a failed proof
    let mut c = Command::new(once.as_ref());
    c.args(["64", "7"])
        .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
        .env("STRATA_RUN_MEMORY", "16MiB")
        .env("STRATA_STORE", &node.store)
        .env("STRATA_REMOTE_TOKEN", "strata-run-test-wrong-token")
        .env_remove("STRATA_RUN_ARENA");
    let out = run(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        err.contains("cannot open the store") && err.contains("token"),
        "{err}"
    );
    assert_eq!(err.matches("cannot open the store").count(), 1, "{err}");
    assert!(out.stdout.is_empty(), "a result without its data: {out:?}");
    node.node.shutdown();
}

/// A text file of `mib` MiB of random lines (fresh each run) for `sort`.
fn sort_input(dir: &Path, mib: usize) -> PathBuf {
    let input = dir.join("input.txt");
    let mut x = seed();
    let mut text = String::with_capacity(mib << 20);
    while text.len() < mib << 20 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        text.push_str(&format!("{:016x} {}\n", x, x >> 50));
    }
    std::fs::write(&input, text).expect("input");
    input
}

/// `program` under `strata run --memory 16MiB` over `node` with no arena setting, `extra`
/// options and a report: its output and its report.
fn over_node_with_report(
    strata: &Path,
    node: &TestNode,
    extra: &[&str],
    program: &[&str],
    limit: Duration,
) -> (Output, serde_json::Value) {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stats = scratch("node-reports").join(format!("report-{n}.json"));
    let stats_s = stats.to_string_lossy();
    let mut opts = vec![
        "--memory",
        "16MiB",
        "--store",
        &node.store,
        "--stats",
        &stats_s,
    ];
    opts.extend(extra);
    let mut cmd = under(strata, &opts, program);
    cmd.envs(node.env()).env_remove("STRATA_RUN_ARENA");
    let got = run(cmd, limit);
    assert!(
        got.status.success(),
        "{program:?} under strata run failed: {}",
        String::from_utf8_lossy(&got.stderr)
    );
    let report = serde_json::from_slice(&std::fs::read(&stats).expect("--stats file"));
    (got, report.expect("JSON"))
}

/// `sort -S 48M` of `input` under `strata run` over `node` with a 16 MiB budget and no arena
/// setting (plus `extra` options): its output must be plain sort's. Returns the process's
/// report and `strata run`'s stderr.
fn sort_over_node(
    strata: &Path,
    node: &TestNode,
    input: &Path,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let i = input.to_string_lossy();
    let program = ["sort", "-S", "48M", &i];
    let want = run(native(&program), Duration::from_secs(60));
    assert!(want.status.success(), "plain sort failed: {want:?}");
    let (got, report) =
        over_node_with_report(strata, node, extra, &program, Duration::from_secs(60));
    assert!(
        got.stdout == want.stdout,
        "sort under strata run printed something else"
    );
    let processes = report["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 1, "{report}");
    (
        processes[0].clone(),
        String::from_utf8_lossy(&got.stderr).into_owned(),
    )
}

/// The issue's own example: a node started with defaults (1 GiB), `strata run` with no arena
/// setting. Before, each process asked the node for a 64 GiB arena and was refused; now each
/// borrows from the node as its arena grows, said only when the summary is asked for. Two
/// processes paging at once share the node, and an arena that outgrows its first chunk
/// borrows more.
#[test]
fn a_default_node_serves_sort_with_no_arena_setting() {
    let Some(strata) = strata() else { return };
    let dir = scratch("default-node");
    let input = sort_input(&dir, 12);
    let node = TestNode::start();
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    let (report, err) = sort_over_node(&strata, &node, &input, &["--summary"]);
    assert_eq!(report["arena_sized_by"], "memory nodes", "{report}");
    // sort -S 48M under a 16 MiB budget: a first chunk of 128 MiB (the least), enough.
    assert_eq!(report["arena_store_bytes"], 128 * mib, "{report}");
    assert_eq!(report["arena_fallbacks"], 0, "{report}");
    assert!(report["stats"]["faults"].as_u64() > Some(0), "{report}");
    assert!(
        err.contains("borrowed from the memory nodes as their arenas grew"),
        "said with --summary: {err}"
    );
    node.assert_paged("sort", 16 << 20);
    // Without --summary, nothing is said.
    let (report, err) = sort_over_node(&strata, &node, &input, &[]);
    assert_eq!(report["arena_store_bytes"], 128 * mib, "{report}");
    assert!(err.is_empty(), "silent without --summary: {err}");
    // Two processes paging at once: each borrows what it uses, so both run.
    let once = compile("write_once", &dir);
    let once = once.to_string_lossy();
    let both = [
        "sh",
        "-c",
        "\"$0\" 48 3 & \"$0\" 40 5 & wait",
        once.as_ref(),
    ];
    let want = run(native(&both), Duration::from_secs(30));
    let sorted = |o: &[u8]| {
        let mut lines: Vec<String> = String::from_utf8_lossy(o)
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    };
    let (got, report) = over_node_with_report(&strata, &node, &[], &both, Duration::from_secs(60));
    assert_eq!(sorted(&got.stdout), sorted(&want.stdout));
    assert_eq!(report["totals"]["processes_paged"], 2, "{report}");
    assert_eq!(report["totals"]["arena_fallbacks"], 0, "{report}");
    // Four threads of 40 MiB and a 16 MiB mapping: more than the first chunk (128 MiB).
    let check = compile("check_bytes", &dir);
    let seed_s = seed().to_string();
    let program = [
        check.to_string_lossy().into_owned(),
        seed_s,
        "4".into(),
        "40".into(),
    ];
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let want = run(native(&program), Duration::from_secs(60));
    let (got, report) =
        over_node_with_report(&strata, &node, &[], &program, Duration::from_secs(90));
    assert_eq!(got.stdout, want.stdout);
    let process = &report["processes"][0];
    let borrowed = process["arena_store_bytes"].as_u64().unwrap_or(0);
    assert!(
        borrowed > 128 * mib && borrowed < gib,
        "the store did not grow past its first chunk: {process}"
    );
    assert_eq!(process["arena_fallbacks"], 0, "{process}");
    node.node.shutdown();
}

/// A one-thread `sort -S s` of `mib` MiB of fresh lines in a scratch directory named `name`:
/// the directory, the command line, and plain sort's output.
fn plain_sort(name: &str, mib: usize, s: &str) -> (PathBuf, Vec<String>, Output) {
    let dir = scratch(name);
    let input = sort_input(&dir, mib);
    let program: Vec<String> = ["sort", "-S", s, "--parallel=1"]
        .into_iter()
        .map(String::from)
        .chain([input.to_string_lossy().into_owned()])
        .collect();
    let args: Vec<&str> = program.iter().map(String::as_str).collect();
    let want = run(native(&args), Duration::from_secs(60));
    assert!(want.status.success(), "plain sort failed: {want:?}");
    (dir, program, want)
}

/// A chunk is borrowed only when an allocation needs it: sort's two merge buffers (half its
/// `-S` each, plus a page) do not fit in its freed main buffer, so the second lands at the
/// arena's top, past three quarters of the first chunk but inside it. Before, that borrowed
/// a second chunk ahead, never used, whose connection the program's memory limit paid for.
#[test]
fn a_node_lends_no_chunk_before_an_allocation_needs_it() {
    let Some(strata) = strata() else { return };
    // Larger than what `-S 64M` holds at once, so sort merges two temporary files.
    let (_dir, program, want) = plain_sort("no-chunk-ahead", 24, "64M");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let node = TestNode::start();
    let (got, report) = over_node_with_report(
        &strata,
        &node,
        &["--page-size", "64KiB"],
        &program,
        Duration::from_secs(120),
    );
    assert!(
        got.stdout == want.stdout,
        "sort under strata run printed something else"
    );
    let process = &report["processes"][0];
    // First chunk: twice the 64 MiB buffer. The merge buffers end at 96 MiB and a page.
    assert_eq!(process["arena_store_bytes"], 128u64 << 20, "{process}");
    assert_eq!(process["arena_fallbacks"], 0, "{process}");
    node.node.shutdown();
}

/// An arena the user set larger than the node holds is refused before the program starts,
/// saying both numbers and what to do; preloaded by hand (no `strata run` to check first),
/// the process ends with status 125 saying the same.
#[test]
fn an_arena_larger_than_the_node_is_refused_with_both_numbers() {
    let Some(strata) = strata() else { return };
    let dir = scratch("arena-too-large");
    let marker = dir.join("started");
    let m = marker.to_string_lossy().into_owned();
    let node = TestNode::start();
    let mut c = under(
        &strata,
        &["--memory", "16MiB", "--store", &node.store],
        &["sh", "-c", "touch \"$0\"", &m],
    );
    c.envs(node.env()).env("STRATA_RUN_ARENA", "3GiB");
    let out = run(c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("STRATA_RUN_ARENA (3 GiB)")
            && err.contains("for 3 GiB")
            && err.contains("1 GiB free")
            && err.contains("unset STRATA_RUN_ARENA")
            && err.contains("at most 1 GiB")
            && err.contains("--capacity 3GiB"),
        "{err}"
    );
    assert!(!marker.exists(), "the program started anyway");
    // By hand: the library opens the store in the background; the node refuses the region
    // and says how much it has free.
    let prog = compile("write_once", &dir);
    let mut c = Command::new(&prog);
    c.args(["64", "7"])
        .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
        .env("STRATA_RUN_MEMORY", "16MiB")
        .env("STRATA_RUN_ARENA", "3GiB")
        .env("STRATA_STORE", &node.store)
        .envs(node.env());
    let out = run(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        err.contains("1 GiB free")
            && err.contains("needs 3 GiB")
            && err.contains("STRATA_RUN_ARENA = 3 GiB"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "a result without its data: {out:?}");
    node.node.shutdown();
}

/// A node whose capacity another client mostly holds: the arena borrows what is left. When
/// the program fits, it runs paged as ever; when its buffer does not fit, the buffer comes
/// from the C library (unpaged, as when an arena is full), counted and said; when nothing is
/// left, the run is refused before the program starts.
#[test]
fn a_node_mostly_taken_by_another_client_gives_what_it_has_left() {
    let Some(strata) = strata() else { return };
    let dir = scratch("node-taken");
    let input = sort_input(&dir, 12);
    let node = TestNode::start();
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    // 64 MiB left: sort's 48 MiB buffer fits and is paged through the node.
    let held = node.hold(gib - 64 * mib);
    let (report, err) = sort_over_node(&strata, &node, &input, &[]);
    assert_eq!(report["arena_store_bytes"], 64 * mib, "{report}");
    assert_eq!(report["arena_sized_by"], "memory nodes", "{report}");
    assert_eq!(report["arena_fallbacks"], 0, "{report}");
    assert!(report["stats"]["faults"].as_u64() > Some(0), "{report}");
    assert!(err.is_empty(), "{err}");
    // 24 MiB left: the buffer does not fit; the program still sorts, unpaged, and says so.
    let more = node.hold(40 * mib);
    let (report, err) = sort_over_node(&strata, &node, &input, &["--summary"]);
    assert_eq!(report["arena_store_bytes"], 24 * mib, "{report}");
    assert!(report["arena_fallbacks"].as_u64() >= Some(1), "{report}");
    assert!(
        report["arena_fallback_bytes"].as_u64() >= Some(48 * mib),
        "{report}"
    );
    assert!(
        report["arena_store_refused"]
            .as_str()
            .is_some_and(|why| why.contains("no room")),
        "{report}"
    );
    assert!(
        err.contains("found the arena full") && err.contains("no room for"),
        "{err}"
    );
    // Nothing left: refused before the program starts, naming what the node has free.
    let last = node.hold(24 * mib);
    let marker = dir.join("started");
    let m = marker.to_string_lossy().into_owned();
    let mut c = under(
        &strata,
        &["--memory", "16MiB", "--store", &node.store],
        &["sh", "-c", "touch \"$0\"", &m],
    );
    c.envs(node.env()).env_remove("STRATA_RUN_ARENA");
    let started = Instant::now();
    let out = run(c, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no room") && err.contains("0 B of 1 GiB free"),
        "{err}"
    );
    assert!(!marker.exists(), "the program started anyway");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Once the other client lets go, the node's room is back for the next run.
    drop((held, more, last));
    let (report, _) = sort_over_node(&strata, &node, &input, &[]);
    assert_eq!(report["arena_store_bytes"], 128 * mib, "{report}");
    assert_eq!(report["arena_fallbacks"], 0, "{report}");
    node.node.shutdown();
}

/// A node that stops while a program pages through the file it lent ends the program as a
/// lost node over messages does: SIGBUS, with the store and the reason said, never zeros or
/// a hang.
#[test]
fn a_node_that_stops_mid_run_ends_the_program_with_the_reason() {
    let Some(strata) = strata() else { return };
    let node = TestNode::start();
    let toucher = "import time\nb = bytearray(96 << 20)\nt = time.time()\nwhile time.time() - t < 60:\n    for i in range(0, len(b), 4096):\n        b[i] = (b[i] + 1) & 255\nprint('never lost')\n";
    let mut cmd = under(
        &strata,
        &["--memory", "16MiB", "--store", &node.store],
        &["python3", "-c", toucher],
    );
    cmd.envs(node.env());
    let running = std::thread::spawn(move || run(cmd, Duration::from_secs(60)));
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        node.node
            .counters()
            .files_lent
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the program borrowed no file"
    );
    node.node.shutdown();
    let out = running.join().expect("the run");
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        err.contains("SIGBUS") && err.contains("is lost"),
        "the failure is not explained: {err}"
    );
}

/// Two nodes, one mostly held by another client: pages are striped evenly over the nodes, so
/// together they lend twice what the fuller one has free, and the arena borrows that.
#[test]
fn two_nodes_lend_twice_what_the_fuller_has_free() {
    let Some(strata) = strata() else { return };
    let input = sort_input(&scratch("two-nodes"), 12);
    let (mib, gib) = (1u64 << 20, 1u64 << 30);
    let roomy = TestNode::start();
    // Both nodes take the same token (a program has one STRATA_REMOTE_TOKEN).
    let full = TestNode::start_with_token(&roomy.token);
    let _held = full.hold(gib - 40 * mib);
    let both = TestNode {
        node: roomy.node,
        store: format!(
            "{},{}",
            roomy.store,
            full.store.trim_start_matches("remote:")
        ),
        token: roomy.token.clone(),
        messages: false,
    };
    let (report, _) = sort_over_node(&strata, &both, &input, &[]);
    assert_eq!(report["arena_store_bytes"], 80 * mib, "{report}");
    assert_eq!(report["arena_fallbacks"], 0, "{report}");
    assert!(report["stats"]["faults"].as_u64() > Some(0), "{report}");
    full.assert_paged("sort's second node", 0);
    both.node.shutdown();
}

#[test]
fn sort_of_a_file_larger_than_the_budget() {
    let Some(strata) = strata() else { return };
    let input = sort_input(&scratch("sort"), 12);
    let i = input.to_string_lossy();
    same_output_everywhere(
        &strata,
        &["sort", "-S", "64M", "--parallel=2", &i],
        "16MiB",
        Duration::from_secs(60),
    );
}

/// GNU sort writes each line's newline over its terminating zero to print it and puts the
/// zero back, so the pages of lines it prints are dirty but unchanged: with a budget below its
/// lines, they are evicted without a write. Output equal to sort's own with the skip and
/// without it (`STRATA_SKIP_UNCHANGED=false`), over the file store and a compressed one.
#[test]
fn sort_pages_put_back_unchanged_are_not_written_and_output_is_exact() {
    let Some(strata) = strata() else { return };
    let (dir, program, want) = plain_sort("unchanged", 3, "18M");
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let file_store = format!("file:{}", dir.display());
    for store in [
        &["--store", &file_store][..],
        &["--store", "memory", "--codec", "lz4"],
    ] {
        for skip in ["true", "false"] {
            let stats = dir.join(format!("stats-{skip}.json"));
            let s = stats.to_string_lossy();
            let mut opts = vec!["--memory", "3MiB", "--page-size", "16KiB", "--stats", &s];
            opts.extend_from_slice(store);
            let mut cmd = under(&strata, &opts, &program);
            cmd.env("STRATA_SKIP_UNCHANGED", skip);
            let out = run(cmd, Duration::from_secs(120));
            assert!(out.status.success(), "{store:?} skip {skip}: {out:?}");
            assert!(
                out.stdout == want.stdout,
                "{store:?} skip {skip}: output differs from sort's own"
            );
            let report: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats written"))
                    .expect("stats are JSON");
            let p = &report["processes"][0];
            let skipped = p["counters"]["unchanged_write_backs"]
                .as_u64()
                .expect("counter");
            let written = p["stats"]["writebacks"].as_u64().expect("write-backs");
            println!(
                "{store:?} skip {skip}: {skipped} unchanged pages not written, {written} written"
            );
            if skip == "true" {
                assert!(skipped > 0, "{store:?}: no unchanged page was skipped");
            } else {
                assert_eq!(skipped, 0, "{store:?}: skipped while turned off");
            }
        }
    }
}

/// Whether `python3` has NumPy (installed with pip if missing); says so loudly if not.
fn numpy_or_skip() -> bool {
    let has_numpy = || {
        Command::new("python3")
            .args(["-c", "import numpy"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !has_numpy() {
        let pip = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "numpy"])
            .status();
        if !pip.is_ok_and(|s| s.success()) || !has_numpy() {
            eprintln!(
                "\n*** SKIPPED: NumPy is missing and `python3 -m pip install numpy` failed; install pip ***\n"
            );
            return false;
        }
    }
    true
}

#[test]
fn numpy_sorts_an_array_four_times_the_budget() {
    let Some(strata) = strata() else { return };
    if !numpy_or_skip() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/numpy_sort.py");
    let s = seed().to_string();
    let sc = script.to_string_lossy();
    // 64 MiB of float64 against a 16 MiB budget.
    same_output_everywhere(
        &strata,
        &["python3", &sc, &s, "64"],
        "16MiB",
        Duration::from_secs(90),
    );
}

/// ZFP is lossy, so `strata run` takes it only with `--lossy-floats`; given that word, a
/// program whose paged memory holds doubles reads each back within the tolerance, over the
/// memory and the file store.
#[test]
fn a_lossy_codec_keeps_its_bound_for_a_program_of_floats() {
    let Some(strata) = strata() else { return };
    if !numpy_or_skip() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/zfp_floats.py");
    let s = seed().to_string();
    let sc = script.to_string_lossy();
    let program = ["python3", &sc, &s, "64", "1e-6"];
    let refused = run(
        under(
            &strata,
            &["--memory", "16MiB", "--codec", "zfp:1e-6"],
            &program,
        ),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("lossy") && err.contains("--lossy-floats"),
        "zfp without --lossy-floats: {refused:?}"
    );
    same_output(
        &strata,
        &program,
        &[
            &["--memory", "16MiB", "--codec", "zfp:1e-6", "--lossy-floats"],
            &[
                "--memory",
                "16MiB",
                "--store",
                "file",
                "--codec",
                "zfp:1e-6",
                "--lossy-floats",
            ],
        ],
        Duration::from_secs(90),
    );
}

#[test]
fn stress_ng_vm_verifies_under_the_budget() {
    let Some(strata) = strata() else { return };
    if Command::new("stress-ng").arg("--version").output().is_err() {
        eprintln!(
            "\n*** SKIPPED: stress-ng is missing; apt-get install stress-ng (.ci/run does) ***\n"
        );
        return;
    }
    let node = TestNode::start();
    let configs = node.configs("16MiB");
    for opts in borrowed(&configs) {
        let mut all = opts.clone();
        all.push("--summary");
        let mut cmd = under(
            &strata,
            &all,
            &[
                "stress-ng",
                "--vm",
                "2",
                "--vm-bytes",
                "32M",
                "--verify",
                "--vm-ops",
                "300",
                "-t",
                "30s",
            ],
        );
        cmd.envs(node.env());
        let out = run(cmd, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&out.stderr);
        println!("{err}");
        assert!(
            out.status.success(),
            "stress-ng failed under {opts:?}: {err}"
        );
        assert!(
            err.contains("successful run completed") && !err.contains("fail"),
            "stress-ng did not verify cleanly under {opts:?}: {err}"
        );
        assert!(
            !err.contains(" 0 faults"),
            "stress-ng's memory was not paged: {err}"
        );
    }
    node.assert_paged("stress-ng", 0);
    node.node.shutdown();
}

#[test]
fn fork_exec_works_and_a_forked_child_is_refused_clearly() {
    let Some(strata) = strata() else { return };
    let dir = scratch("fork");
    let prog = compile("fork_exec", &dir);
    let p = prog.to_string_lossy();
    same_output_everywhere(&strata, &[&p, "exec"], "4MiB", Duration::from_secs(30));
    let out = run(
        under(&strata, &["--memory", "4MiB"], &[&p, "touch"]),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("child own memory ok"), "{stdout}");
    assert!(
        stdout.contains("child signal 11"),
        "the child must be refused, not read zeros: {stdout}"
    );
    assert!(
        stdout.contains("parent data ok"),
        "the parent's paged memory must be intact after its child was refused: {stdout}"
    );
    assert!(
        stderr.contains("forked child touched memory that Strata pages"),
        "{stderr}"
    );
}

#[test]
fn exit_status_and_signals_pass_through() {
    let Some(strata) = strata() else { return };
    let out = run(
        under(&strata, &[], &["sh", "-c", "exit 7"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(7));
    let out = run(
        under(&strata, &[], &["sh", "-c", "kill -USR1 $$"]),
        Duration::from_secs(10),
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc_sigusr1()));
}

fn libc_sigusr1() -> i32 {
    10
}

/// `strata run` killed outright (`kill -9`, the OOM killer) takes its program with it rather
/// than leave it running with nobody to pass its status on.
#[test]
fn the_program_dies_with_strata_run() {
    let Some(strata) = strata() else { return };
    let dir = scratch("dies-with");
    let pid_file = dir.join("pid");
    let p = pid_file.to_string_lossy().into_owned();
    let mut wrapper = under(
        &strata,
        &["--memory", "16MiB"],
        &[
            "sh",
            "-c",
            "echo $$ > \"$0.tmp\" && mv \"$0.tmp\" \"$0\" && exec sleep 120",
            &p,
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawns strata run");
    let started = Instant::now();
    let program: i32 = loop {
        if let Ok(text) = std::fs::read_to_string(&pid_file) {
            break text.trim().parse().expect("a pid");
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the program never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            // A zombie (state Z) has ended; only its parent has yet to collect it.
            .is_ok_and(|stat| !stat.contains(") Z "))
    };
    assert!(alive(program));
    wrapper.kill().expect("kill -9 strata run");
    wrapper.wait().expect("reaped");
    let killed = Instant::now();
    while alive(program) {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "the program (pid {program}) outlived strata run"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_input_is_refused_before_the_program_starts() {
    let Some(strata) = strata() else { return };
    let marker = scratch("bad").join("started");
    let m = marker.to_string_lossy().into_owned();
    let touch = ["sh", "-c", "touch \"$0\"", m.as_str()];
    let cases: &[(&[&str], &str)] = &[
        (&["--bogus"], "unexpected argument"),
        (&["--memory", "0"], "budget of 0"),
        (&["--memory", "64KiB"], "too small to run at all"),
        (&["--memory", "lots"], "is not a size"),
        (&["--codec", "gzip"], "codec"),
        (&["--codec", "zfp:1e-6"], "--lossy-floats"),
        (&["--page-size", "3000"], "--page-size 3000"),
        (&["--stats", "/nonexistent/dir/report.json"], "--stats"),
        (&["--store", "file:/nonexistent/dir"], "does not exist"),
        (&["--store", "file:/proc"], "cannot create files"),
        (&["--store", "remote:127.0.0.1:1"], "token"),
    ];
    for (opts, want) in cases {
        let out = run(under(&strata, opts, &touch), Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{opts:?} was accepted");
        assert!(err.contains(want), "{opts:?}: expected {want:?} in {err}");
        assert!(!marker.exists(), "{opts:?}: the program started anyway");
    }
    // An unreachable memory node is reported before the program starts.
    let mut c = under(&strata, &["--store", "remote:127.0.0.1:1"], &touch);
    c.env("STRATA_REMOTE_TOKEN", "x")
        .env("STRATA_REMOTE_TIMEOUT", "2");
    let out = run(c, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("cannot be reached"),
        "{err}"
    );
    assert!(!marker.exists());
    // No program at all.
    let out = run(
        {
            let mut c = Command::new(&strata);
            c.args(["run", "--memory", "1GiB"]);
            c
        },
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROGRAM"));
    // A program that does not exist.
    let out = run(
        under(&strata, &[], &["/nonexistent/program"]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start"));
    // A file that is not executable: 126, as `env` says.
    let dir = scratch("not-executable");
    let plain = dir.join("plain.txt");
    std::fs::write(&plain, "not a program\n").expect("writes");
    let out = run(
        under(&strata, &[], &[&plain.to_string_lossy()]),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(126), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start"));
    // A statically linked program has no loader to preload the library: refused, not run
    // unpaged. (Skipped where the C library has no static archive.)
    let dir = scratch("static");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/write_once.c");
    let out_path = dir.join("write_once_static");
    let built = Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&out_path)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if built {
        let out = run(
            under(
                &strata,
                &["--memory", "4MiB"],
                &[&out_path.to_string_lossy(), "16", "3"],
            ),
            Duration::from_secs(10),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("statically linked") && out.stdout.is_empty(),
            "a static program: {out:?}"
        );
    } else {
        eprintln!("\n*** SKIPPED the static-program case: gcc -static failed (no libc.a) ***\n");
    }
}

#[test]
fn preloaded_alone_writes_its_report_and_leaves_no_store_file() {
    let Some(_) = strata() else { return };
    let dir = scratch("alone");
    let prog = compile("check_bytes", &dir);
    let stats = dir.join("stats.jsonl");
    let store_dir = dir.join("store");
    std::fs::create_dir_all(&store_dir).expect("store dir");
    let mut c = Command::new(&prog);
    c.args([&seed().to_string(), "2", "8"])
        .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
        .env("STRATA_RUN_MEMORY", "4MiB")
        .env("STRATA_STORE", format!("file:{}", store_dir.display()))
        .env("STRATA_RUN_STATS", &stats);
    let out = run(c, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("ok "));
    let line = std::fs::read_to_string(&stats).expect("report written at exit");
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert!(v["stats"]["faults"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(
        std::fs::read_dir(&store_dir).unwrap().count(),
        0,
        "the store file must be gone"
    );
    // A program killed mid-run leaves no store file either (it was unlinked when opened).
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "python3 -c 'import time; b = bytearray(64 << 20); time.sleep(30)' & sleep 2; kill -9 $!",
    ])
    .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
    .env("STRATA_RUN_MEMORY", "4MiB")
    .env("STRATA_STORE", format!("file:{}", store_dir.display()));
    let _ = run(c, Duration::from_secs(30));
    assert_eq!(std::fs::read_dir(&store_dir).unwrap().count(), 0);
}

#[test]
fn fresh_memory_is_filled_without_reading_the_store() {
    let Some(strata) = strata() else { return };
    // 48 MiB written once, page by page, under an 8 MiB budget: every page faults in as
    // never-used space (zeros without a store read) and is written back when evicted, and is
    // read back only where it was evicted before the program was done with it.
    let dir = scratch("fresh");
    let prog = compile("write_once", &dir);
    let s = seed() % 251;
    let mib = 48u64;
    let want: u64 = ((mib << 20) - (1 << 20)..mib << 20)
        .step_by(4096)
        .map(|i| (i >> 12) * s % 251)
        .sum();
    for store in ["memory", "file"] {
        let stats = dir.join(format!("report-{store}.json"));
        let stats_s = stats.to_string_lossy().into_owned();
        let opts = ["--memory", "8MiB", "--store", store, "--stats", &stats_s];
        let program = [
            prog.to_str().expect("path"),
            &mib.to_string(),
            &s.to_string(),
        ];
        let out = run(under(&strata, &opts, &program), Duration::from_secs(120));
        assert!(out.status.success(), "{store}: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want.to_string(),
            "{store}: wrong sum"
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&stats).expect("--stats file")).expect("JSON");
        let t = &report["totals"];
        println!("{store}: {t}");
        assert!(
            t["faults"].as_u64().unwrap_or(0) > 0,
            "{store}: no faults: {t}"
        );
        assert!(
            t["bytes_written"].as_u64().unwrap_or(0) > 0,
            "{store}: nothing was evicted: {t}"
        );
        // Before, every first touch read the store: 48 MiB. A page the evictors take while
        // it is being written (or from the last MiB) may come back, so allow a few.
        assert!(
            t["bytes_read"].as_u64().unwrap_or(u64::MAX) <= (mib << 20) / 16,
            "{store}: fresh memory was read from the store: {t}"
        );
    }
}

#[test]
fn a_program_does_not_wait_for_its_memory_node_until_it_needs_it() {
    let Some(_) = strata() else { return };
    let dir = scratch("stalled-node");
    let prog = compile("write_once", &dir);
    // A "node" that accepts connections and never answers: the connection can only end by
    // the client's timeout. Before, the first large allocation waited for it (and the
    // process died after the timeout); now the connection is made in the background.
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
    let address = stalled.local_addr().expect("address");
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        while let Ok((c, _)) = stalled.accept() {
            conns.push(c);
            if conns.len() >= 2 {
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(20));
    });
    let s = seed() % 251;
    let preloaded = |mib: u64| {
        let mut c = Command::new(&prog);
        c.args([&mib.to_string(), &s.to_string()])
            .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
            .env("STRATA_RUN_MEMORY", "16MiB")
            .env("STRATA_RUN_ARENA", "256MiB")
            .env("STRATA_STORE", format!("remote:{address}"))
            .env("STRATA_REMOTE_TOKEN", "strata-run-test-token-stalled")
            .env("STRATA_REMOTE_TIMEOUT", "3");
        c
    };
    let want = |mib: u64| -> u64 {
        ((mib << 20) - (1 << 20)..mib << 20)
            .step_by(4096)
            .map(|i| (i >> 12) * s % 251)
            .sum()
    };
    // 4 MiB fits the 16 MiB budget: the store is never needed, so the program finishes
    // well before the connection could time out.
    let started = Instant::now();
    let out = run(preloaded(4), Duration::from_secs(30));
    let took = started.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        want(4).to_string()
    );
    assert!(
        took < Duration::from_millis(2500),
        "the program waited for the memory node: {took:?}"
    );
    // 64 MiB does not fit: the first write-back waits for the store, whose opening fails
    // at the timeout; the process ends saying why, and prints no result.
    let out = run(preloaded(64), Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(err.contains("cannot open the store remote:"), "{err}");
    assert!(out.stdout.is_empty(), "a result without its data: {out:?}");
    drop(held);
}

#[test]
fn the_page_size_follows_the_first_request_unless_given() {
    let Some(_) = strata() else { return };
    let dir = scratch("page-choice");
    let prog = compile("write_once", &dir);
    let s = seed() % 251;
    let page_of = |mib: u64, given: Option<&str>| -> u64 {
        let stats = dir.join(format!("stats-{mib}-{}.jsonl", given.unwrap_or("auto")));
        let mut c = Command::new(&prog);
        c.args([&mib.to_string(), &s.to_string()])
            .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
            .env("STRATA_RUN_MEMORY", "8MiB")
            .env("STRATA_RUN_STATS", &stats);
        if let Some(p) = given {
            c.env("STRATA_PAGE_SIZE", p);
        }
        let out = run(c, Duration::from_secs(60));
        assert!(out.status.success(), "{out:?}");
        let want: u64 = ((mib << 20) - (1 << 20)..mib << 20)
            .step_by(4096)
            .map(|i| (i >> 12) * s % 251)
            .sum();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want.to_string()
        );
        let line = std::fs::read_to_string(&stats).expect("report written at exit");
        let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
        v["page_bytes"].as_u64().expect("page_bytes in the report")
    };
    // A first request of 6x the budget: deep thrashing ahead, small pages.
    assert_eq!(page_of(48, None), 4 << 10);
    // 2x: the default.
    assert_eq!(page_of(16, None), 64 << 10);
    // A page size the user gave is kept.
    assert_eq!(page_of(48, Some("64KiB")), 64 << 10);
}

/// Runs `write_once MIB SEED` with the library preloaded by hand (8 MiB budget, 4 KiB pages
/// over the default 64 GiB arena, plus `env`) and returns its report and peak resident bytes.
fn write_once_preloaded(name: &str, mib: &str, env: &[(&str, &str)]) -> (serde_json::Value, u64) {
    let dir = scratch(name);
    let prog = compile("write_once", &dir);
    let stats = dir.join("stats.jsonl");
    let mut c = Command::new(&prog);
    c.args([mib, &(1 + seed() % 250).to_string()])
        .env("LD_PRELOAD", target_dir().join("libstrata_run.so"))
        .env("STRATA_RUN_MEMORY", "8MiB")
        .env("STRATA_PAGE_SIZE", "4KiB")
        .env("STRATA_RUN_STATS", &stats)
        .envs(env.iter().copied());
    let out = run(c, Duration::from_secs(60));
    assert!(out.status.success(), "{out:?}");
    let line = std::fs::read_to_string(&stats).expect("report written at exit");
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let peak = v["peak_rss_bytes"]
        .as_u64()
        .expect("peak_rss_bytes in the report");
    println!("peak resident: {} KiB", peak >> 10);
    (v, peak)
}

#[test]
fn small_pages_over_a_large_arena_cost_no_memory_until_used() {
    let Some(_) = strata() else { return };
    // 4 KiB pages over the default 64 GiB arena: 16 M pages, a 128 MiB page table. Before,
    // the interposer's allocator wrote the table's zeros, so the process was 145 MiB
    // resident before its first fault, against an 8 MiB budget.
    let (v, peak) = write_once_preloaded("tables", "4", &[]);
    assert!(
        peak > 0 && peak < 48 << 20,
        "peak resident {peak} bytes: {v}"
    );
}

/// LZ4 in memory holds each page at its compressed size. Before, a memory store kept whole
/// slots (a 4 KiB page took at least a 4 KiB page of RAM) and the codec's page table over
/// the 64 GiB arena was all resident: writing 96 MiB of nearly empty pages in an 8 MiB budget
/// left the process over 160 MiB resident, more than running it without Strata.
#[test]
fn a_compressed_memory_store_holds_pages_at_their_compressed_size() {
    let Some(_) = strata() else { return };
    let (v, peak) = write_once_preloaded("packed", "96", &[("STRATA_CODEC", "lz4")]);
    let evictions = v["stats"]["evictions"].as_u64().unwrap_or(0);
    assert!(evictions > 10_000, "the budget did not bind: {v}");
    assert!(
        peak > 0 && peak < 40 << 20,
        "peak resident {peak} bytes for 96 MiB of compressible pages in 8 MiB: {v}"
    );
}

/// Under an address-space limit (`ulimit -v`) the arena shrinks to fit instead of failing to
/// map its default 64 GiB (before: status 125, "cannot map the arena"); a limit that cannot
/// hold the budget is refused, saying so.
#[test]
fn an_address_space_limit_shrinks_the_arena() {
    let Some(strata) = strata() else { return };
    let dir = scratch("ulimit");
    let prog = compile("write_once", &dir);
    let p = prog.to_string_lossy().into_owned();
    let s = (1 + seed() % 250).to_string();
    let want = run(native(&[&p, "48", &s]), Duration::from_secs(30));
    let under_limit = |kib: &str, budget: &str| {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "ulimit -v \"$1\" && exec \"$2\" run --memory \"$3\" -- \"$4\" 48 \"$5\"",
            "sh",
            kib,
        ])
        .arg(&strata)
        .args([budget, &p, &s]);
        run(c, Duration::from_secs(60))
    };
    // 4 GiB of address space: an arena of about 2 GiB.
    let got = under_limit("4194304", "8MiB");
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(got.stdout, want.stdout);
    // 100 MiB cannot hold a 64 MiB budget in half of it.
    let got = under_limit("102400", "64MiB");
    let err = String::from_utf8_lossy(&got.stderr);
    assert!(
        !got.status.success() && err.contains("ulimit -v") && got.stdout.is_empty(),
        "{got:?}"
    );
}

/// The allocation calls' edges give what they give without Strata (alignments past a page,
/// bad alignments, calloc overflow and reuse, realloc both ways, a hole punched in a mapping,
/// mremap, MAP_FIXED of fresh memory over a mapping). A file mapped with MAP_FIXED over paged
/// memory would split the pager's mapping: refused with EINVAL and a message, the rest of the
/// mapping intact.
#[test]
fn allocation_edges_behave_as_without_strata() {
    let Some(strata) = strata() else { return };
    let dir = scratch("edges");
    let prog = compile("alloc_edges", &dir);
    let p = prog.to_string_lossy();
    same_output(
        &strata,
        &[&p],
        &[
            &["--memory", "4MiB"],
            &["--memory", "4MiB", "--store", "file"],
        ],
        Duration::from_secs(60),
    );
    // The requests no allocator can serve are the program's failures: `strata run` must not
    // report them as memory the C library gave beyond the budget.
    let stats = dir.join("edges-report.json");
    let s = stats.to_string_lossy();
    let out = run(
        under(&strata, &["--memory", "4MiB", "--stats", &s], &[&p]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("arena full"),
        "{out:?}"
    );
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&stats).expect("--stats file")).expect("JSON");
    assert_eq!(report["processes"][0]["arena_fallbacks"], 0, "{report}");

    let out = run(
        under(&strata, &["--memory", "4MiB"], &[&p, "fixed-file"]),
        Duration::from_secs(30),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && stdout.contains(&format!("fixed-file: refused errno {}", libc::EINVAL))
            && stdout.contains(&format!("fixed-remap: refused errno {}", libc::EINVAL))
            && stdout.contains(&format!("mlock: refused errno {}", libc::ENOMEM))
            && stdout.contains(&format!("mlockall: refused errno {}", libc::ENOMEM))
            && stdout.contains("rest ok")
            && stderr.contains("MAP_FIXED"),
        "{out:?}"
    );
}

/// `strata run` gives the program's memory-node client lean UCX queues unless the user chose
/// (`STRATA_UCX_FOOTPRINT`), and refuses a value it does not know before the program runs.
#[test]
fn strata_run_chooses_lean_ucx_queues_unless_told_otherwise() {
    let Some(strata) = strata() else { return };
    // The program prints the footprint its environment names.
    let with = |footprint: Option<&str>| {
        let show = ["sh", "-c", "echo \"footprint=$STRATA_UCX_FOOTPRINT\""];
        let mut c = under(&strata, &["--memory", "16MiB"], &show);
        match footprint {
            Some(value) => c.env("STRATA_UCX_FOOTPRINT", value),
            None => c.env_remove("STRATA_UCX_FOOTPRINT"),
        };
        let out = run(c, Duration::from_secs(30));
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out, stdout)
    };
    for (given, seen) in [
        (None, "lean"),
        (Some("standard"), "standard"),
        (Some("lean"), "lean"),
    ] {
        let (out, stdout) = with(given);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(stdout, format!("footprint={seen}"), "given {given:?}");
    }
    let (out, stdout) = with(Some("tiny"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stdout.is_empty(),
        "the program ran: {out:?}"
    );
    assert!(
        err.contains("STRATA_UCX_FOOTPRINT") && err.contains("lean"),
        "{err}"
    );
}
