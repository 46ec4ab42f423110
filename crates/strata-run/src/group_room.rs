//! Keeps free room in the process's memory cgroup, so that the program is never OOM-killed
//! for want of memory that Strata's own pages could have given back.
//!
//! Why: a group at its limit must reclaim before it can charge a page, and the page the
//! pager installs for a fault (`UFFDIO_COPY`) is charged like any other. Page cache that is
//! dirty, under write-back, or held by a `read()` that waits on that very fault (the program
//! reads a file into arena memory) cannot be reclaimed, and the kernel then kills the
//! biggest process, the program (measured with GNU sort in a 32 MiB group: results,
//! session 11 and 12). The budget alone cannot prevent it: what the program charges beside
//! the budget (its own heap, kernel memory, page cache) changes while it runs.
//!
//! How: a thread (`strata-room`) reads the group's usage and page cache every
//! [`TICK`]. The *room* is what a charge can surely get: the limit less the usage, plus the
//! page cache beyond the headroom (see [`room`] for why not all of it). When it falls below the headroom (`STRATA_RUN_KEEP_ROOM`,
//! default [`DEFAULT_HEADROOM`]), the arena withholds frames for the shortfall
//! ([`strata_pager::Region::withhold_frames`], which evicts at once, so the memory is back
//! when the call returns); once the room is the headroom plus [`RELEASE_GAP`] again, it
//! gives them back. When the free room alone (limit less usage) is short and the group
//! holds page cache, the cache of the files the program writes is dropped first
//! (`POSIX_FADV_DONTNEED`), so that cache the kernel would reclaim at the limit does not
//! stand in the pager's way. Files it only reads keep theirs: that cache may be charged to
//! another group, and dropping it would only make the program read and charge it again
//! ([`crate::sys::OwnFds`]). And while the free room alone (page cache not counted) is below the
//! headroom, every fill evicts as many pages as it installs just before it installs them
//! ([`strata_pager::Region::evict_before_fills`]): a millisecond's watching cannot see a
//! `read()` pin the page cache its fill would need, but a fill charged against memory given
//! back just before never needs the kernel to reclaim. Each paged process has its own watcher over the same group: together
//! they may give back more than needed, never less.
//!
//! The group is found from `/proc/self/cgroup` and `/proc/self/mountinfo`: the cgroup v1
//! `memory` controller, else the v2 unified hierarchy; of the group and its ancestors, the
//! one with the lowest limit is watched. No limit, no watcher.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_pager::Region;

/// How often the group is read: a fill plus read-ahead (half a MiB with 64 KiB pages) takes
/// about this long from a fast store, so the room cannot drain much faster than it is seen.
pub const TICK: Duration = Duration::from_millis(1);
/// Default room kept free: what a fault's fill and its read-ahead window charge at once
/// (9 pages of 64 KiB), plus page cache a program's `read()` may hold while it waits on that
/// fault. Measured with GNU sort in a 32 MiB group (results, session 12).
pub const DEFAULT_HEADROOM: u64 = 2 << 20;
/// Room beyond the headroom before withheld frames go back: without a gap, every page the
/// program faults in would take the room below the headroom again.
pub const RELEASE_GAP: u64 = 1 << 20;
/// Memory the watcher holds while the group has room and gives back the moment its free room
/// falls below the headroom: what the pager's threads charge as they make room (the
/// eviction's own small allocations, a new heap page of this very thread) then finds it
/// free. Without it, a group at its limit whose page cache a `read()` held could not charge
/// that one page, and the kernel killed the program in the middle of its rescue: the most
/// common OOM kill of `sort` in a 32 MiB group (session 15; the failing charge was a heap
/// page of `strata-room` in every report).
pub const RESERVE: usize = 256 << 10;
/// How often the list of the program's open files is made again (while the group has room).
const FDS_EVERY: Duration = Duration::from_millis(20);
/// How often the limit is read again (a container can be resized while it runs).
const LIMIT_EVERY: Duration = Duration::from_secs(1);
/// A limit at or above this is no limit (cgroup v1 writes about 2^63 for none).
const NO_LIMIT: u64 = 1 << 60;

/// Which cgroup hierarchy holds the memory controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The v1 `memory` controller.
    V1,
    /// The v2 unified hierarchy.
    V2,
}

/// A memory cgroup's directory and hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Where its files are.
    pub dir: PathBuf,
    /// Its hierarchy.
    pub version: Version,
    /// The mount point of the hierarchy (ancestors are looked at up to here).
    pub mount: PathBuf,
}

/// The memory cgroup of the process whose `/proc/PID/cgroup` is `cgroup` and whose
/// `/proc/PID/mountinfo` is `mountinfo`; None when neither hierarchy is mounted here.
pub fn find_group(cgroup: &str, mountinfo: &str) -> Option<Group> {
    let mut v1_path = None;
    let mut v2_path = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            v1_path = Some(path);
        } else if id == "0" && controllers.is_empty() {
            v2_path = Some(path);
        }
    }
    let mut v1_mount = None;
    let mut v2_mount = None;
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let theirs: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(mount), Some(fstype)) =
            (fields.get(3), fields.get(4), theirs.first())
        else {
            continue;
        };
        let supers = theirs.get(2).copied().unwrap_or("");
        if *fstype == "cgroup" && supers.split(',').any(|o| o == "memory") {
            v1_mount.get_or_insert((*root, *mount));
        } else if *fstype == "cgroup2" {
            v2_mount.get_or_insert((*root, *mount));
        }
    }
    let (path, (root, mount), version) = match (v1_path, v1_mount, v2_path, v2_mount) {
        (Some(path), Some(m), _, _) => (path, m, Version::V1),
        (_, _, Some(path), Some(m)) => (path, m, Version::V2),
        _ => return None,
    };
    let mount = PathBuf::from(unescape(mount));
    // Inside a cgroup namespace or a bind mount, the mount shows the hierarchy from `root`.
    let inside = path
        .strip_prefix(root)
        .filter(|_| root != "/")
        .unwrap_or(path);
    let dir = mount.join(inside.trim_start_matches('/'));
    Some(Group {
        dir,
        version,
        mount,
    })
}

/// Mount points escape spaces and a few other characters as octal (`\040`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(char::from(v));
            i += 4;
        } else {
            out.push(char::from(b[i]));
            i += 1;
        }
    }
    out
}

/// What one read of the group shows, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sample {
    /// Charged to the group now (with its descendants).
    pub usage: u64,
    /// File page cache (active and inactive).
    pub file: u64,
    /// Of it, dirty or under write-back (not reclaimable at once).
    pub unclean: u64,
}

/// What a charge can surely get: the room under `limit`, plus the page cache beyond
/// `pinned` bytes. Only beyond: page cache can be unreclaimable while clean (a `read()`
/// into arena memory holds the folios it reads while it waits on the fault that needs the
/// room: 2.8 MiB of clean, inactive cache at one kill), and dirty cache in a v1 group is
/// written back only once the group is at its limit, so counting neither would keep the
/// group off the limit while cache grows into every frame withheld (measured: 22 MiB
/// withheld, sort 10x slower).
pub fn room(limit: u64, s: Sample, pinned: u64) -> u64 {
    limit.saturating_sub(s.usage) + s.file.saturating_sub(pinned)
}

/// The sum of the `keys` lines of a `memory.stat` text.
fn stat_sum(stat: &str, keys: &[&str]) -> u64 {
    stat.lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(k, _)| keys.contains(k))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// The group's sample from its `memory.stat` text and usage.
pub fn sample_from(version: Version, usage: u64, stat: &str) -> Sample {
    let (file, unclean): (&[&str], &[&str]) = match version {
        Version::V1 => (
            &["total_inactive_file", "total_active_file"],
            &["total_dirty", "total_writeback"],
        ),
        Version::V2 => (
            &["inactive_file", "active_file"],
            &["file_dirty", "file_writeback"],
        ),
    };
    Sample {
        usage,
        file: stat_sum(stat, file),
        unclean: stat_sum(stat, unclean),
    }
}

/// A limit file's value: None for no limit (`max`, or about 2^63 in v1).
pub fn parse_limit(text: &str) -> Option<u64> {
    let v = text.trim().parse::<u64>().ok()?;
    (v < NO_LIMIT).then_some(v)
}

/// The lowest limit of `group` and its ancestors (up to the mount), and the directory that
/// sets it; None when none has a limit.
fn lowest_limit(group: &Group) -> Option<(u64, PathBuf)> {
    let files: &[&str] = match group.version {
        Version::V1 => &["memory.limit_in_bytes"],
        // Beyond memory.high the program is throttled hard: as good as the limit.
        Version::V2 => &["memory.max", "memory.high"],
    };
    let mut best: Option<(u64, PathBuf)> = None;
    let mut dir = group.dir.as_path();
    loop {
        for f in files {
            if let Some(limit) = std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|t| parse_limit(&t))
                && best.as_ref().is_none_or(|(b, _)| limit < *b)
            {
                best = Some((limit, dir.to_path_buf()));
            }
        }
        if dir == group.mount {
            break;
        }
        match dir.parent() {
            Some(p) if p.starts_with(&group.mount) => dir = p,
            _ => break,
        }
    }
    best
}

/// Open files of the watched group, read again each tick without reopening.
struct Watched {
    version: Version,
    usage: File,
    stat: File,
    buf: String,
}

impl Watched {
    fn open(version: Version, dir: &Path) -> std::io::Result<Self> {
        let usage = match version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        };
        Ok(Self {
            version,
            usage: File::open(dir.join(usage))?,
            stat: File::open(dir.join("memory.stat"))?,
            buf: String::with_capacity(4096),
        })
    }

    fn read(file: &mut File, buf: &mut String) -> std::io::Result<()> {
        buf.clear();
        file.seek(SeekFrom::Start(0))?;
        file.read_to_string(buf)?;
        Ok(())
    }

    fn sample(&mut self) -> std::io::Result<Sample> {
        Self::read(&mut self.usage, &mut self.buf)?;
        let usage = self
            .buf
            .trim()
            .parse::<u64>()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Self::read(&mut self.stat, &mut self.buf)?;
        Ok(sample_from(self.version, usage, &self.buf))
    }
}

/// What the watcher did, for the report.
#[derive(Debug, Default)]
pub struct RoomStats {
    /// The limit watched, in bytes.
    pub limit: AtomicU64,
    /// Times frames were withheld for a shortfall.
    pub withholds: AtomicU64,
    /// Most frames withheld at once.
    pub peak_withheld: AtomicU64,
    /// Least room seen, in bytes.
    pub least_room: AtomicU64,
    /// Times the free room fell below the headroom (fills then evict before they install).
    pub tight_spells: AtomicU64,
    /// Times the program's open files' page cache was dropped for room.
    pub cache_drops: AtomicU64,
}

impl RoomStats {
    /// The report's fields.
    pub fn to_json(&self, headroom: u64, page: u64) -> serde_json::Value {
        serde_json::json!({
            "headroom_bytes": headroom,
            "limit_bytes": self.limit.load(Ordering::Relaxed),
            "withholds": self.withholds.load(Ordering::Relaxed),
            "peak_withheld_bytes": self.peak_withheld.load(Ordering::Relaxed) * page,
            "least_room_bytes": self.least_room.load(Ordering::Relaxed),
            "tight_spells": self.tight_spells.load(Ordering::Relaxed),
            "cache_drops": self.cache_drops.load(Ordering::Relaxed),
        })
    }
}

/// The frames to withhold next, from the room seen, the headroom, the frames withheld now
/// (`held`) and the target (`target`): more by the shortfall, fewer by the surplus past
/// [`RELEASE_GAP`], else unchanged.
pub fn next_target(room: u64, headroom: u64, held: usize, target: usize, page: u64) -> usize {
    let pages = |bytes: u64| usize::try_from(bytes.div_ceil(page)).unwrap_or(usize::MAX);
    if room < headroom {
        // From what is held, not the target: frames still owed are not memory back yet.
        held.saturating_add(pages(headroom - room))
    } else if room > headroom + RELEASE_GAP && target > 0 {
        // Give back half the surplus at a time, so that the program's faults into it are
        // seen before the rest goes.
        let surplus = (room - headroom - RELEASE_GAP / 2) / 2;
        target.saturating_sub(usize::try_from(surplus / page).unwrap_or(usize::MAX).max(1))
    } else {
        target
    }
}

/// Starts the watcher for `region` when the process's memory group has a limit; None (and
/// no thread) otherwise. A group that cannot be read is treated as none.
pub fn start(region: &'static Region, headroom: u64, stats: Arc<RoomStats>) -> Option<()> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let group = find_group(&cgroup, &mountinfo)?;
    let (limit, dir) = lowest_limit(&group)?;
    let watched = Watched::open(group.version, &dir).ok()?;
    stats.limit.store(limit, Ordering::Relaxed);
    stats.least_room.store(u64::MAX, Ordering::Relaxed);
    std::thread::Builder::new()
        .name("strata-room".into())
        .stack_size(64 << 10)
        .spawn(move || watch(region, headroom, group, limit, watched, &stats))
        .ok()?;
    Some(())
}

fn watch(
    region: &Region,
    headroom: u64,
    group: Group,
    mut limit: u64,
    mut watched: Watched,
    stats: &RoomStats,
) {
    let _g = crate::runtime::Guard::enter();
    let page = region.config().page_bytes;
    let mut limit_read = Instant::now();
    let mut neutral = false;
    let mut fds = crate::sys::OwnFds::open().ok();
    let mut dents = [0u8; 2048];
    let mut fds_read = Instant::now() - FDS_EVERY;
    let mut warned = false;
    // Made below once the group has room for it: populating it in a group already at its
    // limit would be the very charge it is there to spare.
    let mut reserve: Option<crate::sys::Reserve> = None;
    loop {
        std::thread::sleep(TICK);
        if limit_read.elapsed() >= LIMIT_EVERY {
            limit_read = Instant::now();
            match lowest_limit(&group) {
                Some((l, _)) => {
                    limit = l;
                    stats.limit.store(l, Ordering::Relaxed);
                }
                // The limit was lifted: nothing to keep; give everything back.
                None => {
                    region.evict_before_fills(false);
                    region.withhold_frames(0);
                    return;
                }
            }
        }
        // A group that can no longer be read (moved, removed): stop watching, give back.
        let Ok(sample) = watched.sample() else {
            region.evict_before_fills(false);
            region.withhold_frames(0);
            return;
        };
        // The headroom also stands for the page cache a waiting `read()` may hold.
        let mut sample = sample;
        let free = limit.saturating_sub(sample.usage);
        if free < headroom && reserve.is_some() {
            // Given back before anything below charges the group.
            reserve = None;
            sample.usage = sample.usage.saturating_sub(RESERVE as u64);
        } else if reserve.is_none() && free > headroom + RELEASE_GAP + RESERVE as u64 {
            reserve = crate::sys::Reserve::new(RESERVE);
            if reserve.is_some() {
                sample.usage += RESERVE as u64;
            }
        }
        // The list of open files is made while there is room: listing them charges the
        // group (kernel inodes), which a group short of room may answer with a kill. While
        // it is short, descriptor numbers are asked one by one, which charges nothing: a
        // file opened then (GNU sort's temporary runs) was otherwise never listed, its cache
        // never dropped, and the group stayed short for good (sort over a node: 2.5 s ->
        // 7 s in 6 of 16 runs, 86-107 k faults with the text evicting itself; session 16).
        if fds_read.elapsed() >= FDS_EVERY
            && let Some(fds) = &mut fds
        {
            if limit.saturating_sub(sample.usage) >= headroom + RELEASE_GAP {
                fds.refresh(&mut dents);
            } else {
                fds.probe();
            }
            fds_read = Instant::now();
        }
        if limit.saturating_sub(sample.usage) < headroom && sample.file > 0 {
            // Short of free room with page cache in the group: the program's own files'
            // cache goes (what reclaim would drop at the limit, but now, and never what a
            // waiting `read()` holds). Else the kernel never reclaims the cache that grows
            // into the room kept free, and fills would evict (below) for ever.
            if let Some(fds) = &fds {
                fds.drop_file_cache();
                stats.cache_drops.fetch_add(1, Ordering::Relaxed);
                match watched.sample() {
                    Ok(again) => sample = again,
                    Err(_) => {
                        region.evict_before_fills(false);
                        region.withhold_frames(0);
                        return;
                    }
                }
            }
        }
        // Fills evict before they install while the free room itself (page cache not
        // counted: it may be held by the `read()` waiting on the fill) is short.
        let free = limit.saturating_sub(sample.usage);
        if !neutral && free < headroom {
            region.evict_before_fills(true);
            neutral = true;
            stats.tight_spells.fetch_add(1, Ordering::Relaxed);
        } else if neutral && free > headroom + RELEASE_GAP {
            region.evict_before_fills(false);
            neutral = false;
        }
        let room = room(limit, sample, headroom);
        stats.least_room.fetch_min(room, Ordering::Relaxed);
        let now = region.withheld();
        let target = next_target(room, headroom, now.held, now.target, page);
        if target == now.target {
            continue;
        }
        if target > now.target {
            stats.withholds.fetch_add(1, Ordering::Relaxed);
        }
        let after = region.withhold_frames(target);
        stats
            .peak_withheld
            .fetch_max(after.held as u64, Ordering::Relaxed);
        if after.target < target && !warned {
            // The pager keeps a floor of frames to make progress at all: below it, the
            // program pages on every few accesses and looks hung. Say why, once.
            warned = true;
            crate::sys::write_stderr(
                floor_warning(limit, sample.usage, region.frames() - after.target, page).as_bytes(),
            );
        }
    }
}

/// What `strata run` says when its memory group holds so much besides the paged memory that
/// the pager is down to its floor of `floor_frames` frames.
pub fn floor_warning(limit: u64, usage: u64, floor_frames: usize, page: u64) -> String {
    use strata_core::format_size;
    format!(
        "strata run: the memory group's limit ({}) is taken by memory Strata does not page ({} in use: page cache or other processes in the group); paged memory is down to its floor of {}, so the program will page on most accesses and run very slowly. Give the group more memory, or move the other processes out of it\n",
        format_size(limit),
        format_size(usage),
        format_size(floor_frames as u64 * page),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
30 25 0:26 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu rw,relatime shared:15 - cgroup cgroup rw,cpu
40 30 0:35 / /sys/fs/cgroup/unified rw shared:16 - cgroup2 cgroup2 rw,nsdelegate
";

    #[test]
    fn finds_the_v1_memory_group_before_the_unified_one() {
        let cgroup = "9:name=systemd:/\n4:memory:/jobs/sort\n1:cpu,cpuacct:/\n0::/user.slice\n";
        let g = find_group(cgroup, MOUNTS).unwrap();
        assert_eq!(g.version, Version::V1);
        assert_eq!(g.dir, PathBuf::from("/sys/fs/cgroup/memory/jobs/sort"));
        assert_eq!(g.mount, PathBuf::from("/sys/fs/cgroup/memory"));
    }

    #[test]
    fn finds_a_v2_group_and_one_seen_from_a_namespace_root() {
        let only_v2 = "29 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let g = find_group("0::/system.slice/job.service\n", only_v2).unwrap();
        assert_eq!(g.version, Version::V2);
        assert_eq!(
            g.dir,
            PathBuf::from("/sys/fs/cgroup/system.slice/job.service")
        );
        // A container's mount shows the hierarchy from its own group.
        let bound = "29 1 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let g = find_group("0::/kubepods/pod1/c1\n", bound).unwrap();
        assert_eq!(g.dir, PathBuf::from("/sys/fs/cgroup/c1"));
        // v1 line without a v1 memory mount: the unified one.
        let g = find_group("4:memory:/a\n0::/b\n", only_v2).unwrap();
        assert_eq!(
            (g.version, g.dir),
            (Version::V2, PathBuf::from("/sys/fs/cgroup/b"))
        );
    }

    #[test]
    fn no_group_without_a_mounted_hierarchy_or_a_cgroup_file() {
        assert_eq!(
            find_group("4:memory:/a\n", "22 1 0:21 / /proc rw - proc proc rw\n"),
            None
        );
        assert_eq!(find_group("", MOUNTS), None);
        assert_eq!(find_group("garbage without colons\n", MOUNTS), None);
    }

    #[test]
    fn escaped_mount_points_are_read_back() {
        let m = "35 30 0:31 / /mnt/my\\040cgroups rw - cgroup cgroup rw,memory\n";
        let g = find_group("4:memory:/x\n", m).unwrap();
        assert_eq!(g.dir, PathBuf::from("/mnt/my cgroups/x"));
    }

    #[test]
    fn limits_of_none_and_of_bytes() {
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("33554432\n"), Some(32 << 20));
        assert_eq!(parse_limit(""), None);
    }

    #[test]
    fn room_counts_clean_page_cache_and_not_dirty() {
        let v1 = "cache 4000\ntotal_inactive_file 3145728\ntotal_active_file 1048576\ntotal_dirty 2097152\ntotal_writeback 0\ninactive_file 1\n";
        let s = sample_from(Version::V1, 31 << 20, v1);
        assert_eq!(
            s,
            Sample {
                usage: 31 << 20,
                file: 4 << 20,
                unclean: 2 << 20
            }
        );
        assert_eq!(room(32 << 20, s, 0), 5 << 20);
        assert_eq!(room(32 << 20, s, 2 << 20), 3 << 20);
        assert_eq!(
            room(32 << 20, s, 8 << 20),
            1 << 20,
            "cache below the pinned share"
        );
        let v2 =
            "anon 5\nfile_dirty 4096\nactive_file 8192\ninactive_file 8192\nfile_writeback 4096\n";
        let s = sample_from(Version::V2, 100, v2);
        assert_eq!((s.file, s.unclean), (16384, 8192));
        // Usage past the limit (v2's memory.high) is no room, not a wrap.
        assert_eq!(room(50, s, 4096), 12288);
    }

    #[test]
    fn the_floor_warning_names_the_limit_the_usage_and_the_floor() {
        let w = floor_warning(32 << 20, 31 << 20, 16, 64 << 10);
        assert!(
            w.contains("(32 MiB)") && w.contains("31 MiB in use") && w.contains("floor of 1 MiB"),
            "{w}"
        );
        assert!(
            w.ends_with('\n') && w.contains("Give the group more memory"),
            "{w}"
        );
    }

    #[test]
    fn targets_rise_by_the_shortfall_and_fall_past_the_gap() {
        let page = 64 << 10;
        let h = DEFAULT_HEADROOM;
        // 1 MiB short: 16 pages more than held (not more than the target still owed).
        assert_eq!(next_target(h - (1 << 20), h, 10, 30, page), 26);
        // A sliver short still withholds a page.
        assert_eq!(next_target(h - 1, h, 0, 0, page), 1);
        // Within the gap: unchanged.
        assert_eq!(next_target(h + RELEASE_GAP, h, 5, 5, page), 5);
        // Past it: half the surplus over half the gap goes back (256 KiB: 4 pages), and
        // at least a page.
        assert_eq!(next_target(h + RELEASE_GAP + 1, h, 5, 5, page), 1);
        assert_eq!(
            next_target(h + RELEASE_GAP / 2 + 1, h, 0, 5, page),
            5,
            "within the gap"
        );
        let t = next_target(h + (9 << 20), h, 100, 100, page);
        assert!(t < 100 && t > 20, "{t}");
        assert_eq!(next_target(h + (90 << 20), h, 100, 100, page), 0);
        // Nothing withheld, plenty of room: nothing to do.
        assert_eq!(next_target(h * 10, h, 0, 0, page), 0);
    }
}
