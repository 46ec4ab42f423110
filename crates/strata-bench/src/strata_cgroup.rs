//! The memory cgroup a `strata run` row of `strata bench run` runs in, so that Strata is held
//! to the same limit as the kernel baselines and everything its process charges counts: the
//! arena's resident pages (its `--memory` budget), the program's small allocations and
//! stacks, the pager's tables, an in-process store's contents (the LZ4 memory store's
//! compressed pages), kernel memory (page tables, the userfaultfd), and the page cache it
//! reads. A store in another process (the memory node on loopback) is charged there,
//! outside the group, as zram's compressed pool is kernel memory outside the kernel rows'
//! group.
//!
//! The group differs from the kernel rows' ([`crate::kernel_swap::SwapCgroup`]): swap must
//! not help, so `memory.memsw.limit_in_bytes` (memory plus swap) is the limit too and
//! `memory.swappiness` is 0, besides swap being off while Strata rows run; and the OOM kill
//! stays on, so a row that does not fit is killed and reported as failed, never retried
//! above the limit.
//!
//! What the pager does not page has to fit beside the budget, so `--memory` is the limit
//! minus a measured margin ([`next_budget`]): the row is first run in a group without a limit
//! and the peak of what reclaim cannot take back without swap (everything charged but the
//! page cache's file pages, [`Charge`]) is sampled; what rose above the budget is the margin.
//! For the in-process LZ4 store the margin grows as the budget shrinks (more pages go to the
//! store), so the measurement is repeated at the new budget until it fits or cannot.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::cleanup::Temporary;
use crate::kernel_swap::{SwapError, cgroup_number, cgroup_value, new_group, spawn_in_group, step};

/// What a group has charged at one moment, from `memory.usage_in_bytes`,
/// `memory.kmem.usage_in_bytes` and `memory.stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Charge {
    /// Everything charged (`memory.usage_in_bytes`).
    pub usage_bytes: u64,
    /// What reclaim cannot free without swap: the usage less the page cache's file pages
    /// (`active_file` + `inactive_file`). Anonymous memory, shared memory and kernel memory.
    pub unreclaimable_bytes: u64,
    /// Anonymous memory (`rss`): the arena's resident pages, the heap, stacks, an
    /// in-process store. The kernel adds to this count late (per-CPU batches), so a sample
    /// can trail `usage_bytes` by megabytes: use it to tell the charge's parts apart, not
    /// to size it.
    pub anon_bytes: u64,
    /// Shared memory (`shmem`), e.g. transport queues mapped from `/dev/shm`.
    pub shmem_bytes: u64,
    /// Kernel memory (`memory.kmem.usage_in_bytes`): page tables, slab.
    pub kmem_bytes: u64,
    /// Page cache of files (input, binaries, libraries): reclaimable.
    pub file_bytes: u64,
}

impl Charge {
    /// The charge from the files' contents (`stat` is `memory.stat`). Keys are matched
    /// whole; a missing key reads 0.
    pub fn from_files(usage: u64, kmem: u64, stat: &str) -> Self {
        let key = |k: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0u64)
        };
        let file = key("total_active_file") + key("total_inactive_file");
        Self {
            usage_bytes: usage,
            unreclaimable_bytes: usage.saturating_sub(file),
            anon_bytes: key("total_rss"),
            shmem_bytes: key("total_shmem"),
            kmem_bytes: kmem,
            file_bytes: file,
        }
    }

    fn read(dir: &Path) -> Self {
        Self::from_files(
            cgroup_number(dir, "memory.usage_in_bytes"),
            cgroup_number(dir, "memory.kmem.usage_in_bytes"),
            &std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default(),
        )
    }
}

/// Room a measured peak must leave free below the limit, for what sampling every
/// millisecond can miss and for page cache the program pins: with 1 MiB, one sort in six
/// over the file store was OOM-killed at 32 MiB; with 2 MiB (session 11) sort over the file
/// store was still killed, 2 runs in 12 in the benchmark and 3 in 8 by hand, old and new
/// pager alike, each time in the pager's `UFFDIO_COPY` with 3.4-4.8 MiB of clean page cache
/// in the group that reclaim could not free (sort reading its temporary files into the
/// arena holds its read batch while it waits for the page). With 3 MiB, 0 of 6 by hand.
/// Rows over a memory node had 1 MiB more until session 12 (the UCX client's transport
/// memory came and went inside the program); a node on this host now lends files and the
/// program loads no UCX, so they charge as the file store's rows do.
/// Since session 13, 1 MiB: the clean page cache reclaim could not free was sort's input,
/// read again from the disk because `strata run`'s room keeping had dropped its cache
/// (cached by another group, so dropping it gave this one nothing), its read-ahead locked
/// under I/O. Room keeping now drops only the cache of files the program writes; by hand, at
/// a 27.25 MiB budget in 32 MiB, sort was killed in 0 of 22 runs (file store and node), 9 of
/// 32 before; the benchmark at 1 MiB ran every row without a kill.
pub const SLACK_BYTES: u64 = 1 << 20;

/// How far below the slack a new budget aims, so that a margin that moves a little between
/// measurements (an LZ4 store's grows as the budget shrinks) still fits at the next one.
pub const AIM_BELOW_BYTES: u64 = 1 << 20;

/// Smallest budget worth running: below it the row is reported as not fitting.
pub const MIN_BUDGET_BYTES: u64 = 1 << 20;

/// The next `--memory` budget from a measurement at `budget` whose unreclaimable peak was
/// `peak`: `Ok(None)` when the peak plus `slack` ([`SLACK_BYTES`]) fits in `limit` (keep
/// `budget`), `Ok(Some(b))` to measure again at the smaller `b` (the limit less the margin
/// that rose above `budget` in whole pages, less the slack and [`AIM_BELOW_BYTES`], in whole
/// `page` bytes), `Err(margin)` when no budget of at least [`MIN_BUDGET_BYTES`] is left
/// beside the margin.
pub fn next_budget(
    limit: u64,
    budget: u64,
    peak: u64,
    page: u64,
    slack: u64,
) -> Result<Option<u64>, u64> {
    let page = page.max(1);
    if peak + slack <= limit {
        return Ok(None);
    }
    let margin = peak.saturating_sub(budget).next_multiple_of(page);
    let room = limit.saturating_sub(margin + slack + AIM_BELOW_BYTES);
    let next = room / page * page;
    if next < MIN_BUDGET_BYTES {
        return Err(margin);
    }
    // A budget that did not shrink would measure the same peak again.
    Ok(Some(next.min(budget.saturating_sub(page))))
}

/// Swap devices and files now on.
pub fn active_swaps() -> Vec<String> {
    std::fs::read_to_string("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

/// One run of a program in the group.
#[derive(Debug, Clone)]
pub struct GroupRun {
    /// Wall seconds.
    pub seconds: f64,
    /// Exited 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// The sampled charge at the moment its unreclaimable part peaked.
    pub peak: Charge,
    /// `memory.max_usage_in_bytes`: the kernel's own peak of everything charged.
    pub max_usage_bytes: u64,
    /// OOM kills in the group.
    pub oom_kills: u64,
    /// Swap devices that were on at the start or end (none, or the row is void).
    pub swap_seen: Vec<String>,
}

/// A v1 memory group for Strata rows: `limit` of memory and of memory plus swap, no
/// swapping, OOM kill on; or, for measuring the margin, no limit.
#[derive(Debug)]
pub struct StrataCgroup {
    dir: PathBuf,
    limit: Option<u64>,
    _guard: Temporary,
}

impl StrataCgroup {
    /// Makes the group under this process's own memory cgroup (`limit` `None`: unlimited).
    pub fn new(limit: Option<u64>) -> Result<Self, SwapError> {
        let swaps = active_swaps();
        if !swaps.is_empty() {
            return Err(SwapError::SwapOnForStrata(swaps.join(", ")));
        }
        // Numbered, so that groups made at once (tests) do not meet.
        static MADE: AtomicU64 = AtomicU64::new(0);
        let (dir, guard) = new_group(&format!("strata{}", MADE.fetch_add(1, Ordering::Relaxed)))?;
        let write = |file: &str, value: &str| {
            std::fs::write(dir.join(file), value).map_err(step(format!("setting {file}")))
        };
        write("memory.swappiness", "0")?;
        write("memory.oom_control", "0")?;
        if let Some(limit) = limit {
            write("memory.limit_in_bytes", &limit.to_string())?;
            // Memory plus swap at the same limit: swap cannot hold any of the group's pages.
            write("memory.memsw.limit_in_bytes", &limit.to_string())?;
        }
        Ok(Self {
            dir,
            limit,
            _guard: guard,
        })
    }

    /// The group's limit (`None`: none).
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// Runs `argv` with `env` in the group (killed after `time_limit`), sampling the charge
    /// every `every`.
    pub fn run(
        &self,
        argv: &[String],
        env: &[(&str, &str)],
        time_limit: Duration,
        every: Duration,
    ) -> std::io::Result<GroupRun> {
        let mut swap_seen = active_swaps();
        let kills0 = cgroup_value(&self.dir, "memory.oom_control", "oom_kill");
        let _ = std::fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
        let t = Instant::now();
        let child = spawn_in_group(&self.dir, argv, env, time_limit, Stdio::piped())?;
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (done, dir) = (done.clone(), self.dir.clone());
            std::thread::spawn(move || sample(&dir, every, &done))
        };
        let out = child.wait_with_output();
        let seconds = t.elapsed().as_secs_f64();
        done.store(true, Ordering::Relaxed);
        let peak = sampler.join().unwrap_or_default();
        let out = out?;
        for s in active_swaps() {
            if !swap_seen.contains(&s) {
                swap_seen.push(s);
            }
        }
        let number = |f: &str| cgroup_number(&self.dir, f);
        Ok(GroupRun {
            seconds,
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            peak,
            max_usage_bytes: number("memory.max_usage_in_bytes"),
            oom_kills: cgroup_value(&self.dir, "memory.oom_control", "oom_kill") - kills0,
            swap_seen,
        })
    }
}

/// Until `done`, the charge at the moment its unreclaimable part was highest.
fn sample(dir: &Path, every: Duration, done: &AtomicBool) -> Charge {
    let mut peak = Charge::default();
    loop {
        let now = Charge::read(dir);
        if now.unreclaimable_bytes > peak.unreclaimable_bytes {
            peak = now;
        }
        if done.load(Ordering::Relaxed) {
            return peak;
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_charge_leaves_out_only_file_pages() {
        let stat = "cache 9000\nrss 5000\nshmem 300\ntotal_cache 7000\ntotal_rss 4000\n\
                    total_shmem 200\ntotal_inactive_file 1500\ntotal_active_file 2500\n\
                    inactive_file 1\nactive_file 1\n";
        let c = Charge::from_files(20_000, 600, stat);
        assert_eq!(c.file_bytes, 4000, "total_ keys, not the group's own");
        assert_eq!(c.unreclaimable_bytes, 16_000);
        assert_eq!(
            (c.anon_bytes, c.shmem_bytes, c.kmem_bytes),
            (4000, 200, 600)
        );
        // A usage read before the stat can be below the file pages: never wraps.
        assert_eq!(Charge::from_files(100, 0, stat).unreclaimable_bytes, 0);
        assert_eq!(Charge::from_files(5, 0, "").unreclaimable_bytes, 5);
    }

    #[test]
    fn a_peak_that_fits_keeps_the_budget() {
        let fits = 32 * MIB - SLACK_BYTES;
        assert_eq!(
            next_budget(32 * MIB, 32 * MIB, fits, 4096, SLACK_BYTES),
            Ok(None)
        );
        assert_eq!(
            next_budget(32 * MIB, 20 * MIB, fits, 4096, SLACK_BYTES),
            Ok(None)
        );
        // Within the slack is not fitting.
        assert!(
            next_budget(32 * MIB, 20 * MIB, fits + 1, 4096, SLACK_BYTES)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn the_margin_above_the_budget_comes_off_the_limit() {
        // 3.5 MiB above a 32 MiB budget, the slack, aimed 1 MiB lower.
        let next = next_budget(
            32 * MIB,
            32 * MIB,
            32 * MIB + 3 * MIB + MIB / 2,
            4096,
            SLACK_BYTES,
        );
        assert_eq!(
            next,
            Ok(Some(28 * MIB + MIB / 2 - SLACK_BYTES - AIM_BELOW_BYTES))
        );
        // A margin of part of a page takes the whole page.
        let next = next_budget(32 * MIB, 32 * MIB, 32 * MIB + 100, 65_536, SLACK_BYTES);
        assert_eq!(
            next,
            Ok(Some(32 * MIB - 65_536 - SLACK_BYTES - AIM_BELOW_BYTES))
        );
        // Whole pages of 64 KiB.
        let next = next_budget(32 * MIB + 4096, 32 * MIB, 40 * MIB, 65_536, SLACK_BYTES).unwrap();
        assert_eq!(next.unwrap() % 65_536, 0);
        // A peak over the limit never keeps (or raises) the budget.
        let next = next_budget(32 * MIB, 10 * MIB, 33 * MIB, 4096, SLACK_BYTES)
            .unwrap()
            .unwrap();
        assert!(next < 10 * MIB, "{next}");
    }

    #[test]
    fn a_margin_as_large_as_the_limit_does_not_fit() {
        // An incompressible in-process store: 200 MiB charged at a 32 MiB budget.
        assert_eq!(
            next_budget(32 * MIB, 32 * MIB, 200 * MIB, 4096, SLACK_BYTES),
            Err(168 * MIB)
        );
        assert!(next_budget(32 * MIB, 2 * MIB, 33 * MIB, 4096, SLACK_BYTES).is_err());
        // Room for the margin and the slack but not for a budget of 1 MiB; a page less of
        // margin leaves exactly 1 MiB.
        let peak = 64 * MIB - SLACK_BYTES - AIM_BELOW_BYTES - MIN_BUDGET_BYTES;
        assert!(next_budget(32 * MIB, 32 * MIB, peak + 4096, 4096, SLACK_BYTES).is_err());
        assert_eq!(
            next_budget(32 * MIB, 32 * MIB, peak, 4096, SLACK_BYTES),
            Ok(Some(MIN_BUDGET_BYTES))
        );
    }

    #[test]
    fn the_budget_search_converges_on_a_fixed_margin() {
        // A store outside the process: the margin does not depend on the budget.
        use rand::{Rng, SeedableRng};
        let seed: u64 = rand::rng().random();
        println!("seed {seed}");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..2000 {
            let limit = rng.random_range(8..128) * MIB + rng.random_range(0..MIB);
            let margin = rng.random_range(0..limit / 2);
            let page = [4096, 16_384, 65_536][rng.random_range(0..3)];
            let mut budget = limit / page * page;
            let mut steps = 0;
            if limit < margin + SLACK_BYTES + AIM_BELOW_BYTES + MIN_BUDGET_BYTES + page {
                continue;
            }
            while let Some(next) =
                next_budget(limit, budget, budget + margin, page, SLACK_BYTES).unwrap()
            {
                budget = next;
                steps += 1;
                assert!(steps <= 2, "limit {limit} margin {margin}");
            }
            assert!(budget + margin + SLACK_BYTES <= limit);
            assert_eq!(budget % page, 0);
            assert!(
                budget + margin + SLACK_BYTES + AIM_BELOW_BYTES + 2 * page >= limit,
                "limit {limit} margin {margin}: budget {budget} too small"
            );
        }
    }

    /// Why memory groups cannot be made here (the test then prints it and skips).
    fn no_groups_here() -> Option<String> {
        crate::kernel_swap::check().err().map(|e| e.to_string())
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_string()).collect()
    }

    #[test]
    fn a_group_holds_its_program_to_the_limit_and_is_removed_after() {
        if let Some(why) = no_groups_here() {
            println!("skipped: {why}");
            return;
        }
        let limit = 32 * MIB;
        let group = StrataCgroup::new(Some(limit)).unwrap();
        let dir = group.dir.clone();
        let number = |f: &str| -> u64 {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(number("memory.limit_in_bytes"), limit);
        assert_eq!(
            number("memory.memsw.limit_in_bytes"),
            limit,
            "swap cannot help"
        );
        assert_eq!(number("memory.swappiness"), 0);
        let time = Duration::from_secs(30);
        // 8 MiB of buffer, refilled 1000 times: fits, and the sampled peak sees it (most
        // of it: a sample can fall in the first fill). The charge, not the anon count: the
        // kernel flushes its per-CPU stat counts (`total_rss`) late, so a sample can read
        // the whole buffer in the usage while the stat still shows almost none of it.
        let small = argv(&["dd", "if=/dev/zero", "of=/dev/null", "bs=8M", "count=1000"]);
        let r = group
            .run(&small, &[], time, Duration::from_millis(1))
            .unwrap();
        assert!(r.success && r.oom_kills == 0, "{r:?}");
        assert!(r.peak.unreclaimable_bytes >= 7 * MIB, "{r:?}");
        assert!(r.peak.unreclaimable_bytes <= limit && r.max_usage_bytes <= limit);
        assert!(r.swap_seen.is_empty());
        // 64 MiB of buffer does not fit: the OOM kill ends it, and the run says so.
        let big = argv(&["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=2"]);
        let r = group
            .run(&big, &[], time, Duration::from_millis(1))
            .unwrap();
        assert!(!r.success && r.oom_kills >= 1, "{r:?}");
        assert!(r.max_usage_bytes <= limit, "{r:?}");
        // A program still in the group when it is dropped is killed, and the group goes.
        let mut sleeper =
            spawn_in_group(&dir, &argv(&["sleep", "60"]), &[], time, Stdio::null()).unwrap();
        let t = Instant::now();
        while std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap()
            .trim()
            .is_empty()
        {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the sleeper never joined"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(group);
        assert!(!dir.exists(), "{} left behind", dir.display());
        let status = sleeper.wait().unwrap();
        assert!(!status.success(), "the sleeper was killed, not left to run");
        assert!(t.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn an_unlimited_group_measures_what_a_program_charges() {
        if let Some(why) = no_groups_here() {
            println!("skipped: {why}");
            return;
        }
        let group = StrataCgroup::new(None).unwrap();
        let dir = group.dir.clone();
        let buffer = 48 * MIB;
        let dd = argv(&["dd", "if=/dev/zero", "of=/dev/null", "bs=48M", "count=30"]);
        let r = group
            .run(&dd, &[], Duration::from_secs(30), Duration::from_millis(1))
            .unwrap();
        assert!(r.success && r.oom_kills == 0, "{r:?}");
        assert!(r.peak.unreclaimable_bytes >= buffer, "{r:?}");
        assert!(r.peak.unreclaimable_bytes < buffer + 16 * MIB, "{r:?}");
        assert!(r.max_usage_bytes >= r.peak.unreclaimable_bytes);
        drop(group);
        assert!(!dir.exists());
    }
}
