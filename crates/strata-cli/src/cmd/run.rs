//! `strata run`: runs an unmodified program with `libstrata_run.so` preloaded, so that its
//! large allocations are paged by Strata over the chosen store within one memory budget.
//! Settings are checked (and each memory node is asked what it has free) before the program
//! starts; the program's exit status or signal is passed through (127: the program was not
//! found, 126: it could not be run); a summary and a JSON report come from the per-process
//! reports the library writes at exit.

use std::ffi::OsString;
use std::io::{Read, Seek};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use strata_core::config::{EnvVars, StoreKind};
use strata_core::{PagerConfig, StoreConfig, format_size, parse_size};

/// `strata run [OPTIONS] -- PROGRAM ARGS...`
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Resident budget of the whole program's paged memory (STRATA_RUN_MEMORY).
    #[arg(long)]
    memory: Option<String>,
    /// memory | file[:DIR] | remote:HOST:PORT[,...] (STRATA_STORE; file stores are created in
    /// DIR, default the temporary directory, and removed at once; read and written with
    /// O_DIRECT unless a codec is used or STRATA_FILE_DIRECT=false).
    #[arg(long)]
    store: Option<String>,
    /// none | lz4 | zfp:TOL (STRATA_CODEC). zfp is lossy and needs --lossy-floats.
    #[arg(long)]
    codec: Option<String>,
    /// Allow a lossy codec (zfp): every allocation of at least the threshold holds only f64
    /// values, which may come back changed by up to the tolerance (STRATA_RUN_LOSSY=floats).
    #[arg(long)]
    lossy_floats: bool,
    /// Pager page size (STRATA_PAGE_SIZE). Default 64KiB, or 32KiB when the program's first
    /// large request is over 3x the budget (on this host), 4KiB over 4x (16KiB over memory
    /// nodes on other hosts).
    #[arg(long)]
    page_size: Option<String>,
    /// Smallest allocation paged by Strata (STRATA_RUN_THRESHOLD, default 256KiB, or the page
    /// size if larger).
    #[arg(long)]
    threshold: Option<String>,
    /// Free room kept in the program's memory cgroup (v1 or v2) whenever the group nears its
    /// limit (the cache of files the program writes dropped, fills evicting before they
    /// install, paged memory given back), so that the kernel does not OOM-kill the program
    /// for memory Strata could have freed: a size, on (default, 2MiB) or off
    /// (STRATA_RUN_KEEP_ROOM).
    /// Nothing happens without a limit.
    #[arg(long, value_name = "SIZE|on|off")]
    keep_room: Option<String>,
    /// Write a JSON report (per process and totals) to this file.
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Print a summary (faults, bytes per tier, time waiting on faults) on stderr.
    #[arg(long)]
    summary: bool,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

/// Runs the program; never returns when the program ran (exits with its status).
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let env = settings(args)?;
    let mut check: EnvVars = strata_core::config::process_env()?;
    check.extend(env.iter().cloned());
    validate(&check)?;
    if let Some(why) = super::run_target::preload_refusal(&args.program[0]) {
        bail!("{why}");
    }
    // Opened now, so that an unwritable path is refused before the program runs.
    let stats_file = match &args.stats {
        Some(path) => Some(std::fs::File::create(path).with_context(|| {
            format!(
                "cannot write the report to {}; pick a writable path for --stats",
                path.display()
            )
        })?),
        None => None,
    };
    let library = library()?;
    let report = sys::memfd().context("creating the report file (memfd_create)")?;
    let mut preload = library.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(&args.program[0]);
    if std::env::var_os("UCX_ERROR_SIGNALS").is_none() {
        // UCX (loaded into the program to reach memory nodes) would otherwise take over the
        // program's SIGSEGV and SIGBUS and print its own backtraces over ours.
        cmd.env("UCX_ERROR_SIGNALS", "");
    }
    // A client of memory nodes runs inside the program, so its UCX queues count against
    // the program's memory like the rest of it: small ones (1-2 MiB of shared memory per
    // connection to a node on this host instead of 19-25; strata_net::footprint), unless
    // the user chose.
    match std::env::var_os(strata_net::footprint::FOOTPRINT_VAR) {
        None => {
            cmd.env(strata_net::footprint::FOOTPRINT_VAR, "lean");
        }
        Some(_) => {
            strata_net::UcxFootprint::from_env().map_err(anyhow::Error::msg)?;
        }
    }
    cmd.args(&args.program[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("STRATA_RUN_REPORT_FD", report.as_raw_fd().to_string())
        .env("LD_PRELOAD", preload);
    sys::die_with_parent(&mut cmd);
    let started = Instant::now();
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            // As `env`, `nice` and `timeout` do: 127 when the program is not found, 126 when
            // it cannot be run, so scripts can tell that from the program's own failure.
            let status = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
            eprintln!(
                "strata run: cannot start {:?}: {e}; check the program's name and that it is executable",
                args.program[0]
            );
            std::process::exit(status)
        }
    };
    sys::forward_signals(child.id());
    let status = child.wait().context("waiting for the program")?;
    let wall = started.elapsed().as_secs_f64();
    let reports = read_reports(report);
    for r in &reports {
        if let Some(e) = r.get("error").and_then(|e| e.as_str()) {
            match r.get("store_failed").and_then(|s| s.as_str()) {
                Some(store) => eprintln!("strata run: store {store} failed: {e}"),
                None => eprintln!("strata run: {e}"),
            }
        }
    }
    let totals = totals(&reports);
    if let Some(line) = fallbacks(&totals) {
        eprintln!("{line}");
    }
    if args.summary {
        eprintln!("{}", summary(&totals, wall, reports.len()));
        if let Some(line) = sized_by_nodes(&reports) {
            eprintln!("{line}");
        }
    }
    if let (Some(path), Some(mut file)) = (&args.stats, stats_file) {
        let doc = serde_json::json!({
            "program": args.program.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>(),
            "exit_code": status.code(),
            "signal": status.signal(),
            "wall_s": wall,
            "totals": totals,
            "processes": reports,
        });
        // The program has run: a failed write is reported, and its status still passes.
        if let Err(e) =
            std::io::Write::write_all(&mut file, serde_json::to_string_pretty(&doc)?.as_bytes())
        {
            eprintln!(
                "strata run: writing the report to {} failed: {e}",
                path.display()
            );
        }
    }
    if let Some(sig) = status.signal() {
        if sig == sys::SIGBUS {
            eprintln!(
                "strata run: the program died of SIGBUS (a store that cannot serve a page, or the program's own bus error)"
            );
        }
        sys::die_by_signal(sig);
    }
    std::process::exit(status.code().unwrap_or(1))
}

/// The `STRATA_*` settings for the program, from the options (the environment supplies the
/// rest).
fn settings(args: &RunArgs) -> anyhow::Result<EnvVars> {
    let mut env = EnvVars::new();
    let mut size = |flag: &str, name: &str, v: &Option<String>| -> anyhow::Result<()> {
        if let Some(v) = v {
            parse_size(v)
                .with_context(|| format!("--{flag} {v:?} is not a size; write e.g. 2GiB"))?;
            env.push((name.into(), v.clone()));
        }
        Ok(())
    };
    size("memory", "STRATA_RUN_MEMORY", &args.memory)?;
    size("page-size", "STRATA_PAGE_SIZE", &args.page_size)?;
    size("threshold", "STRATA_RUN_THRESHOLD", &args.threshold)?;
    if let Some(s) = &args.store {
        let spec = if s == "file" {
            format!("file:{}", std::env::temp_dir().display())
        } else {
            s.clone()
        };
        env.push(("STRATA_STORE".into(), spec));
    }
    if let Some(c) = &args.codec {
        env.push(("STRATA_CODEC".into(), c.clone()));
    }
    if let Some(v) = &args.keep_room {
        if !matches!(v.as_str(), "on" | "off") {
            parse_size(v).with_context(|| {
                format!("--keep-room {v:?} is neither a size (e.g. 2MiB), on nor off")
            })?;
        }
        env.push(("STRATA_RUN_KEEP_ROOM".into(), v.clone()));
    }
    if args.lossy_floats {
        env.push(("STRATA_RUN_LOSSY".into(), "floats".into()));
    }
    Ok(env)
}

/// Refuses settings the library would refuse, before the program starts; asks each memory
/// node what it has free (proving the token), so that an unreachable node, a service that is
/// no Strata node, a wrong token, and an arena the nodes cannot hold are reported here.
fn validate(env: &EnvVars) -> anyhow::Result<()> {
    let lookup = |k: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let mut pager = PagerConfig::builder()
        .page_bytes(64 << 10)
        .buffer_bytes(1 << 30)
        .with_env_vars(env)?;
    if let Some(m) = lookup("STRATA_RUN_MEMORY") {
        let bytes = parse_size(&m)?;
        if bytes == 0 {
            bail!("a memory budget of 0 cannot run anything; give --memory a size such as 1GiB");
        }
        pager = pager.buffer_bytes(bytes);
    }
    if let Some(p) = lookup("STRATA_PAGE_SIZE") {
        // A bad page size on its own, not as a budget too small for it.
        let bytes = parse_size(&p)?;
        PagerConfig::builder()
            .page_bytes(bytes)
            .buffer_bytes(bytes.saturating_mul(64))
            .build()
            .with_context(|| format!("--page-size {p} (STRATA_PAGE_SIZE) cannot be used"))?;
    }
    let pager = pager.build().context(
        "the memory budget is too small to run at all (the pager needs at least 4 pages); raise --memory or lower --page-size",
    )?;
    if let Some(t) = lookup("STRATA_RUN_THRESHOLD")
        && parse_size(&t)? < pager.page_bytes
    {
        bail!(
            "--threshold {t} is below the page size ({}); use at least one page",
            format_size(pager.page_bytes)
        );
    }
    let store = StoreConfig::builder().with_env_vars(env)?.build()?;
    strata_core::config::check_run_codec(store.codec, lookup("STRATA_RUN_LOSSY").as_deref())?;
    match &store.kind {
        StoreKind::Memory => {}
        StoreKind::File { path } => {
            if !path.is_dir() {
                bail!(
                    "the file store's directory {} does not exist; create it or pass --store file:DIR",
                    path.display()
                );
            }
            // Each process makes its store file there: a directory it cannot create files in
            // (read-only, another user's, /proc) would fail only inside the program.
            let probe = path.join(format!(".strata-run-probe-{}", std::process::id()));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&probe)
                .with_context(|| {
                    format!(
                        "cannot create files in the file store's directory {}; pick a writable directory with --store file:DIR",
                        path.display()
                    )
                })?;
            let _ = std::fs::remove_file(&probe);
        }
        StoreKind::Remote { nodes } => {
            // One authenticated TCP conversation per node (about 1 ms, no UCX): the nodes
            // answer, take the token, and say what they have free. The program opens the
            // store itself, in the background.
            let spec = lookup("STRATA_STORE").unwrap_or_default();
            let arena = lookup("STRATA_RUN_ARENA")
                .map(|a| {
                    parse_size(&a).with_context(|| {
                        format!("STRATA_RUN_ARENA={a:?} is not a size; write e.g. 4GiB")
                    })
                })
                .transpose()?;
            let pages = candidate_pages(lookup("STRATA_PAGE_SIZE").is_some(), pager.page_bytes);
            // A client that just ended (the command before this one) has its regions freed
            // within milliseconds of its exit: give that a second before refusing for want
            // of room.
            let patience = Instant::now() + Duration::from_secs(1);
            loop {
                let free = strata_net::node_capacities(&store).map_err(|e| {
                    let refused = matches!(
                        e,
                        strata_net::OpenStoreError::Remote(
                            strata_net::RemoteOpenError::Refused { .. }
                        )
                    );
                    anyhow::Error::new(e).context(if refused {
                        format!("the store {spec} refused this client")
                    } else {
                        format!("the store {spec} cannot be reached")
                    })
                })?;
                match check_node_room(&store, nodes, &free, arena, &pages) {
                    Err(_)
                        if Instant::now() < patience
                            && free.iter().any(|n| n.free < n.capacity) =>
                    {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    outcome => break outcome?,
                }
            }
        }
    }
    Ok(())
}

/// The page sizes the library may give the arena (`strata_run::options::page_for`): the
/// given one, else the default or, beyond the budget, 32 KiB, 16 KiB or 4 KiB.
fn candidate_pages(given: bool, page: u64) -> Vec<u64> {
    if given {
        vec![page]
    } else {
        vec![page, 32 << 10, 16 << 10, 4 << 10]
    }
}

/// Refuses, before the program starts, an arena the memory nodes cannot hold: one that
/// `STRATA_RUN_ARENA` sets above what a node has free (saying both numbers and what to do), or,
/// when the arena is sized to the nodes (no `STRATA_RUN_ARENA`), nodes with no room at all.
/// A page size the library may choose that fits is enough (`pages`): it is chosen later, from
/// the program's first large request.
fn check_node_room(
    store: &StoreConfig,
    names: &[String],
    free: &[strata_net::NodeCapacity],
    arena: Option<u64>,
    pages: &[u64],
) -> anyhow::Result<()> {
    let smallest_page = pages.iter().copied().min().unwrap_or(4096);
    let room = pages
        .iter()
        .map(|&page| strata_net::largest_store_within(store, page, free))
        .max()
        .unwrap_or(0);
    let Some(arena) = arena else {
        if room == 0 {
            bail!("{}", strata_net::no_room(names, free, smallest_page));
        }
        return Ok(());
    };
    // The share each node lends, with the page size that asks least of it.
    let mut share = u64::MAX;
    for &page in pages {
        share = share.min(strata_net::bytes_per_node(
            store,
            arena.div_ceil(page) * page,
            page,
        )?);
    }
    if let Some((name, node)) = names.iter().zip(free).find(|(_, n)| n.free < share) {
        let lower = if room > 0 {
            format!("set it to at most {}", format_size(room))
        } else {
            "wait until other clients free some".to_string()
        };
        bail!(
            "STRATA_RUN_ARENA ({}) asks memory node {name} for {}, but it has {} free (of its {} capacity): unset STRATA_RUN_ARENA to size each process's arena to what the nodes have free, {lower}, or start the node with --capacity {} or more (with --overcommit beyond its memory)",
            format_size(arena),
            format_size(share),
            format_size(node.free),
            format_size(node.capacity),
            format_size(node.capacity.saturating_add(share - node.free)).replace(' ', ""),
        );
    }
    Ok(())
}

/// `libstrata_run.so`: `STRATA_RUN_LIBRARY`, else next to this executable.
fn library() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("STRATA_RUN_LIBRARY") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("finding the strata executable")?;
    let lib = exe.with_file_name("libstrata_run.so");
    if !lib.is_file() {
        bail!(
            "{} is missing; build it with `cargo build -p strata-run` (same profile as strata) or set STRATA_RUN_LIBRARY",
            lib.display()
        );
    }
    Ok(lib)
}

fn read_reports(fd: OwnedFd) -> Vec<serde_json::Value> {
    let mut file = std::fs::File::from(fd);
    let mut text = String::new();
    if file.rewind().is_err() || file.read_to_string(&mut text).is_err() {
        eprintln!("strata run: the program's reports could not be read");
    }
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Sums the per-process statistics.
fn totals(reports: &[serde_json::Value]) -> serde_json::Value {
    let mut t = std::collections::BTreeMap::<&str, u64>::new();
    let num = |v: &serde_json::Value, path: &[&str]| {
        let mut v = v;
        for p in path {
            v = &v[*p];
        }
        v.as_u64().unwrap_or(0)
    };
    for r in reports.iter().filter(|r| r.get("stats").is_some()) {
        *t.entry("processes_paged").or_default() += 1;
        *t.entry("faults").or_default() += num(r, &["stats", "faults"]);
        *t.entry("evictions").or_default() += num(r, &["stats", "evictions"]);
        *t.entry("writebacks").or_default() += num(r, &["stats", "writebacks"]);
        *t.entry("fault_wait_ns").or_default() += num(r, &["stats", "service_time", "sum_ns"]);
        *t.entry("arena_peak_bytes").or_default() += num(r, &["arena_peak_bytes"]);
        *t.entry("arena_fallbacks").or_default() += num(r, &["arena_fallbacks"]);
        *t.entry("arena_fallback_bytes").or_default() += num(r, &["arena_fallback_bytes"]);
        *t.entry("arena_store_late").or_default() += num(r, &["arena_store_late"]);
        if let Some(tiers) = r["stats"]["tiers"].as_array() {
            for tier in tiers {
                *t.entry("bytes_read").or_default() += num(tier, &["bytes_read"]);
                *t.entry("bytes_written").or_default() += num(tier, &["bytes_written"]);
            }
        }
    }
    serde_json::json!(t)
}

/// A line when large requests found no room in their arena and came from the C library,
/// unpaged (so beyond the budget): said whether or not a summary was asked for.
fn fallbacks(t: &serde_json::Value) -> Option<String> {
    let count = t["arena_fallbacks"].as_u64().filter(|&n| n > 0)?;
    let late = t["arena_store_late"].as_u64().unwrap_or(0);
    let late = if late > 0 {
        format!(
            "; {late} of them because the memory nodes' next chunk came late (an allocation waits at most 2 s for one)"
        )
    } else {
        String::new()
    };
    Some(format!(
        "strata run: {count} large allocation(s), {} in all, found the arena full and came from the C library, unpaged (beyond --memory){late}; set STRATA_RUN_ARENA higher, or over memory nodes give them more --capacity",
        format_size(t["arena_fallback_bytes"].as_u64().unwrap_or(0))
    ))
}

/// A line for the summary when processes borrowed from the memory nodes as their arenas
/// grew (no `STRATA_RUN_ARENA`), and whether the nodes ran out of room.
fn sized_by_nodes(reports: &[serde_json::Value]) -> Option<String> {
    let grown: Vec<&serde_json::Value> = reports
        .iter()
        .filter(|r| r["arena_sized_by"] == "memory nodes")
        .collect();
    let most = grown
        .iter()
        .filter_map(|r| r["arena_store_bytes"].as_u64())
        .max()?;
    let refused = grown
        .iter()
        .find_map(|r| r["arena_store_refused"].as_str())
        .map_or(String::new(), |why| format!("; then {why}"));
    Some(format!(
        "strata run: {} process(es) borrowed from the memory nodes as their arenas grew, as far as the nodes had room (the most, {}, by one process){refused}; STRATA_RUN_ARENA borrows a set size at once instead",
        grown.len(),
        format_size(most)
    ))
}

fn summary(t: &serde_json::Value, wall: f64, reports: usize) -> String {
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    #[allow(clippy::cast_precision_loss)] // seconds for display
    let wait = n("fault_wait_ns") as f64 / 1e9;
    format!(
        "strata run: {wall:.2} s wall, {} paged process(es) of {reports} reporting; {} faults, {} evictions, {} write-backs; read {} and wrote {} from/to the store; {wait:.2} s waiting on faults (summed over threads); peak arena {}",
        n("processes_paged"),
        n("faults"),
        n("evictions"),
        n("writebacks"),
        format_size(n("bytes_read")),
        format_size(n("bytes_written")),
        format_size(n("arena_peak_bytes")),
    )
}

/// The raw calls `strata run` needs.
mod sys {
    use super::{FromRawFd, OwnedFd};
    use std::sync::atomic::{AtomicI32, Ordering};

    pub const SIGBUS: i32 = libc::SIGBUS;
    static CHILD: AtomicI32 = AtomicI32::new(0);

    /// An anonymous file the program's processes append their reports to.
    pub fn memfd() -> std::io::Result<OwnedFd> {
        // SAFETY: a NUL-terminated name; flags 0 leave the descriptor inheritable on purpose.
        let fd = unsafe { libc::memfd_create(c"strata-run-report".as_ptr(), 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    extern "C" fn forward(sig: libc::c_int) {
        let pid = CHILD.load(Ordering::Relaxed);
        if pid > 0 {
            // SAFETY: kill is async-signal-safe.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Terminal signals reach the program directly (same process group), so `strata run`
    /// ignores them while it waits; signals sent to `strata run` alone are passed on.
    pub fn forward_signals(child: u32) {
        CHILD.store(i32::try_from(child).unwrap_or(0), Ordering::Relaxed);
        for sig in [libc::SIGINT, libc::SIGQUIT] {
            // SAFETY: ignoring a signal is always valid.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
        for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            // SAFETY: `forward` is async-signal-safe (one atomic load and kill).
            unsafe { libc::signal(sig, forward as *const () as usize) };
        }
    }

    /// Makes the program die with `strata run`: killed by `SIGKILL` when `strata run` ends
    /// before it (killed itself, say by `kill -9` or the OOM killer), rather than run on with
    /// nobody to pass its status on or report for it.
    pub fn die_with_parent(cmd: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        // SAFETY: getpid is always valid.
        let parent = unsafe { libc::getpid() };
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe calls (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // `strata run` may have died between the fork and the prctl.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
                Ok(())
            });
        }
    }

    /// Ends this process by `sig`, as the program ended, so the caller sees the same status.
    pub fn die_by_signal(sig: i32) -> ! {
        // SAFETY: restoring the default action, unblocking and raising are plain calls.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            libc::sigaddset(&raw mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
            libc::raise(sig);
        }
        // Signals whose default is to continue (or a core-dump limit) land here.
        std::process::exit(128 + sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> (StoreConfig, Vec<String>) {
        let names = vec!["10.0.0.1:7400".to_string(), "10.0.0.2:7400".to_string()];
        let store = StoreConfig::builder()
            .kind(StoreKind::Remote {
                nodes: names.clone(),
            })
            .token("strata-cli-test-token")
            .build()
            .unwrap();
        (store, names)
    }

    fn free(free: u64, capacity: u64) -> strata_net::NodeCapacity {
        strata_net::NodeCapacity { free, capacity }
    }

    /// Pages are striped evenly: two nodes with 1 GiB and 512 MiB free hold an arena of
    /// 1 GiB; a 2 GiB arena is refused naming the node that lacks room and both numbers.
    #[test]
    fn an_arena_set_above_what_the_nodes_hold_is_refused_with_both_numbers() {
        let (store, names) = two_nodes();
        let (mib, gib) = (1u64 << 20, 1u64 << 30);
        let nodes = [free(gib, gib), free(512 * mib, gib)];
        let pages = candidate_pages(false, 64 << 10);
        check_node_room(&store, &names, &nodes, Some(gib), &pages).unwrap();
        check_node_room(&store, &names, &nodes, None, &pages).unwrap();
        let e = check_node_room(&store, &names, &nodes, Some(2 * gib), &pages)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("STRATA_RUN_ARENA (2 GiB) asks memory node 10.0.0.2:7400 for 1 GiB")
                && e.contains("it has 512 MiB free (of its 1 GiB capacity)")
                && e.contains("at most 1 GiB")
                && e.contains("--capacity 1.50GiB"),
            "{e}"
        );
    }

    /// With the arena sized to the nodes, only nodes without room for one page are refused.
    #[test]
    fn nodes_without_room_for_a_page_are_refused() {
        let (store, names) = two_nodes();
        let gib = 1u64 << 30;
        let pages = candidate_pages(true, 64 << 10);
        let full = [free(gib, gib), free(60 << 10, gib)];
        let e = check_node_room(&store, &names, &full, None, &pages)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no room")
                && e.contains("10.0.0.1:7400 has 1 GiB of 1 GiB free")
                && e.contains("10.0.0.2:7400 has 60 KiB of 1 GiB free"),
            "{e}"
        );
        // A smaller page the library may choose still fits.
        let pages = candidate_pages(false, 64 << 10);
        check_node_room(&store, &names, &full, None, &pages).unwrap();
        let e = check_node_room(&store, &names, &full, Some(gib), &pages)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 120 KiB"), "{e}");
    }
}
