//! The machine's own limits, measured where the benchmark runs (`strata bench ceilings`), so
//! a fraction of a ceiling means a fraction of *this* machine's rate, not of constants taken
//! on another GPU. Results are cached per host, device and driver in
//! `$XDG_CACHE_HOME/strata/` (or `~/.cache/strata/`); a benchmark reads the cache, runs the
//! probes first if there is none, and records which it used.
//!
//! Probes: host memory read bandwidth (all CPUs), the disk's `O_DIRECT` read rate (in the
//! benchmark's directory); on a GPU, PCIe read by SMs (zero-copy stream of pinned memory) and
//! by the copy engine (`cuMemcpyHtoD` from pinned memory), warp-per-page gathers of random
//! 4 KiB and 64 KiB pages from pinned memory, HBM stream read and random 8-byte gather, and
//! the zero-copy random 8-byte gather. Without a CUDA driver the GPU probes say so.

use std::io::{Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// The kernels of the GPU probes.
pub const CEILING_KERNELS_CU: &str = include_str!("../cuda/ceiling_kernels.cu");

/// One probe's result: a rate, or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Probe {
    /// The rate, in `unit`.
    pub value: Option<f64>,
    /// `GB/s`, `Mpages/s` or `Mgathers/s`.
    pub unit: String,
    /// How it was measured, or why it was skipped.
    pub note: String,
}

impl Probe {
    fn measured(value: f64, unit: &str, note: impl Into<String>) -> Self {
        Self {
            value: Some(value),
            unit: unit.into(),
            note: note.into(),
        }
    }

    fn skipped(unit: &str, why: impl Into<String>) -> Self {
        Self {
            value: None,
            unit: unit.into(),
            note: format!("skipped: {}", why.into()),
        }
    }
}

/// Every ceiling, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Ceilings {
    /// What was probed: host, device, driver.
    pub key: String,
    /// Name -> result (`host-memory-read`, `disk-direct-read`, `pcie-read-sm`,
    /// `pcie-read-copy-engine`, `page-gather-4k`, `page-gather-64k`, `hbm-read`,
    /// `hbm-random-gather`, `zero-copy-random-gather`, `peer-read`).
    pub probes: std::collections::BTreeMap<String, Probe>,
}

impl Ceilings {
    /// The value of ceiling `name`, if it was measured.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.probes.get(name).and_then(|p| p.value)
    }

    /// A table of every probe.
    pub fn table(&self) -> String {
        let mut out = format!("ceilings of {}\n", self.key);
        for (name, p) in &self.probes {
            let value = p
                .value
                .map_or_else(|| "-".to_string(), |v| format!("{v:.2} {}", p.unit));
            out.push_str(&format!("  {name:<24} {value:>18}  {}\n", p.note));
        }
        out
    }
}

/// Why ceilings could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CeilingsError {
    /// File I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A cache file that is not ceilings JSON.
    #[error("{path} is not a ceilings cache ({source}); delete it and run `strata bench ceilings`")]
    Json {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

/// Where the cache lives.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("strata")
}

/// The cache key: host, and for GPU 0 its PCI address, name and driver.
pub fn key(gpu: Option<&crate::record::Device>) -> String {
    let host = crate::record::Machine::this().hostname;
    match gpu {
        Some(d) => format!("{host} {} {} driver {}", d.name, d.pci_address, d.driver),
        None => format!("{host} (no GPU)"),
    }
}

/// The cache file for `key`.
pub fn cache_file(key: &str) -> PathBuf {
    let safe: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    cache_dir().join(format!("ceilings-{safe}.json"))
}

/// Reads the cached ceilings for `key`, if any.
pub fn cached(key: &str) -> Result<Option<(Ceilings, PathBuf)>, CeilingsError> {
    let path = cache_file(key);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CeilingsError::Io {
                what: format!("reading {}", path.display()),
                source,
            });
        }
    };
    let c = serde_json::from_str(&text).map_err(|source| CeilingsError::Json {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Some((c, path)))
}

/// Writes `ceilings` to the cache and returns the file.
pub fn store(ceilings: &Ceilings) -> Result<PathBuf, CeilingsError> {
    let path = cache_file(&ceilings.key);
    let dir = cache_dir();
    std::fs::create_dir_all(&dir).map_err(|source| CeilingsError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let text = serde_json::to_string_pretty(ceilings).unwrap_or_default();
    std::fs::write(&path, text).map_err(|source| CeilingsError::Io {
        what: format!("writing {}", path.display()),
        source,
    })?;
    Ok(path)
}

/// Options of the probes.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// Bytes the host-memory probe reads (per pass).
    pub host_bytes: usize,
    /// Bytes of the disk probe's file.
    pub disk_bytes: u64,
    /// Directory of the disk probe's file (the disk that benchmarks page from).
    pub disk_dir: PathBuf,
    /// Run the GPU probes on this GPU ordinal, when a driver is present (`None`: skip them).
    pub gpu: Option<usize>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        Self {
            host_bytes: 512 << 20,
            disk_bytes: 256 << 20,
            disk_dir: std::env::temp_dir(),
            gpu: Some(0),
        }
    }
}

/// Runs every probe.
pub fn measure(opts: &ProbeOptions, log: &mut dyn FnMut(String)) -> Ceilings {
    let device = opts.gpu.and_then(crate::record::Device::of);
    let mut c = Ceilings {
        key: key(device.as_ref()),
        probes: Default::default(),
    };
    log("probing host memory read bandwidth".into());
    c.probes
        .insert("host-memory-read".into(), host_memory_read(opts.host_bytes));
    log(format!(
        "probing O_DIRECT reads in {}",
        opts.disk_dir.display()
    ));
    c.probes.insert(
        "disk-direct-read".into(),
        disk_direct_read(&opts.disk_dir, opts.disk_bytes),
    );
    let gpu_probes = match opts.gpu {
        None => Err("GPU probes not asked for".to_string()),
        Some(_) if !strata_gpu::probe::driver_present() => Err("no CUDA driver".to_string()),
        Some(ordinal) => {
            log(format!(
                "probing GPU {ordinal} (PCIe, page gathers, HBM, peers)"
            ));
            crate::gpu_ceilings::measure(ordinal).map_err(|e| format!("GPU probe failed: {e}"))
        }
    };
    match gpu_probes {
        Ok(probes) => c.probes.extend(probes),
        Err(why) => {
            for (name, unit) in GPU_PROBES {
                c.probes
                    .insert((*name).into(), Probe::skipped(unit, why.clone()));
            }
        }
    }
    c
}

/// The GPU probes' names and units.
pub const GPU_PROBES: &[(&str, &str)] = &[
    ("pcie-read-sm", "GB/s"),
    ("pcie-read-copy-engine", "GB/s"),
    ("page-gather-4k", "Mpages/s"),
    ("page-gather-64k", "Mpages/s"),
    ("hbm-read", "GB/s"),
    ("hbm-random-gather", "Mgathers/s"),
    ("zero-copy-random-gather", "Mgathers/s"),
    ("peer-read", "GB/s"),
];

/// Median of three runs of `f`, which returns seconds.
fn median3(mut f: impl FnMut() -> std::io::Result<f64>) -> std::io::Result<f64> {
    let mut v = [f()?, f()?, f()?];
    v.sort_by(f64::total_cmp);
    Ok(v[1])
}

/// Host memory read bandwidth: every CPU sums its share of a buffer larger than the caches.
pub fn host_memory_read(bytes: usize) -> Probe {
    let words = (bytes / 8).max(1 << 16);
    let data: Vec<u64> = (0..words as u64).collect();
    let threads = strata_core::config::available_cpus().max(1);
    let chunk = words.div_ceil(threads);
    let once = || -> std::io::Result<f64> {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = data
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().fold(0u64, |a, &w| a.wrapping_add(w))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        Ok(start.elapsed().as_secs_f64())
    };
    match median3(once) {
        Ok(s) => Probe::measured(
            (words * 8) as f64 / s / 1e9,
            "GB/s",
            format!(
                "{threads} threads summing {} MiB, median of 3",
                (words * 8) >> 20
            ),
        ),
        Err(e) => Probe::skipped("GB/s", e.to_string()),
    }
}

/// The disk's `O_DIRECT` read rate: a file written in `dir`, read back in 1 MiB direct reads.
pub fn disk_direct_read(dir: &Path, bytes: u64) -> Probe {
    match disk_direct_read_gbs(dir, bytes) {
        Ok((gbs, note)) => Probe::measured(gbs, "GB/s", note),
        Err(e) => Probe::skipped("GB/s", format!("{} ({e})", dir.display())),
    }
}

fn disk_direct_read_gbs(dir: &Path, bytes: u64) -> std::io::Result<(f64, String)> {
    const BLOCK: usize = 1 << 20;
    let blocks = bytes.div_ceil(BLOCK as u64).max(1);
    crate::cleanup::remove_stale(dir);
    let file =
        crate::cleanup::Temporary::register(crate::cleanup::temporary_name(dir, "ceiling", "bin"));
    {
        let mut f = std::fs::File::create(file.path())?;
        let block: Vec<u8> = (0..BLOCK)
            .map(|i| u8::try_from(i * 31 % 251).unwrap_or(0))
            .collect();
        for _ in 0..blocks {
            f.write_all(&block)?;
        }
        f.sync_all()?;
    }
    // An aligned 1 MiB window inside a larger vector: O_DIRECT needs 4 KiB alignment.
    let mut backing = vec![0u8; BLOCK + 4096];
    let skew = backing.as_ptr().align_offset(4096);
    let once = || -> std::io::Result<f64> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(file.path())?;
        let buf = &mut backing[skew..skew + BLOCK];
        let start = Instant::now();
        for _ in 0..blocks {
            f.read_exact(buf)?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    let mut once = once;
    let s = median3(&mut once)?;
    Ok((
        (blocks * BLOCK as u64) as f64 / s / 1e9,
        format!(
            "{} MiB file in {}, 1 MiB O_DIRECT reads, median of 3",
            blocks,
            dir.display()
        ),
    ))
}

/// The ceilings a benchmark uses: the cache for this host (and GPU 0 if `gpu`), else fresh
/// probes (then cached), or none with the reason.
pub fn for_run(
    gpu: bool,
    disk_dir: &Path,
    log: &mut dyn FnMut(String),
) -> crate::record::CeilingsUsed {
    let device = if gpu {
        crate::record::Device::of(0)
    } else {
        None
    };
    let key = key(device.as_ref());
    match cached(&key) {
        Ok(Some((c, path))) => {
            return crate::record::CeilingsUsed {
                source: format!("cache {}", path.display()),
                values: Some(c),
            };
        }
        Ok(None) => {}
        Err(e) => {
            return crate::record::CeilingsUsed {
                source: format!("none: {e}"),
                values: None,
            };
        }
    }
    log(format!(
        "no ceilings cached for {key}; probing now (`strata bench ceilings` does this ahead)"
    ));
    let opts = ProbeOptions {
        disk_dir: disk_dir.to_path_buf(),
        gpu: gpu.then_some(0),
        ..ProbeOptions::default()
    };
    let c = measure(&opts, log);
    let source = match store(&c) {
        Ok(path) => format!("measured now, cached in {}", path.display()),
        Err(e) => format!("measured now (not cached: {e})"),
    };
    crate::record::CeilingsUsed {
        source,
        values: Some(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_probes_measure_here_and_gpu_probes_say_why_not() {
        let dir = std::env::temp_dir();
        let opts = ProbeOptions {
            host_bytes: 64 << 20,
            disk_bytes: 16 << 20,
            disk_dir: dir,
            gpu: Some(0),
        };
        let c = measure(&opts, &mut |_| {});
        let host = c
            .get("host-memory-read")
            .expect("host memory probe runs anywhere");
        assert!(host > 0.05 && host < 10_000.0, "{host} GB/s");
        let disk = &c.probes["disk-direct-read"];
        // tmpfs refuses O_DIRECT: then the probe must say so rather than report page-cache speed.
        assert!(
            disk.value.is_some_and(|v| v > 0.0) || disk.note.starts_with("skipped"),
            "{disk:?}"
        );
        for (name, _) in GPU_PROBES {
            let p = &c.probes[*name];
            if !strata_gpu::probe::driver_present() {
                assert_eq!(p.value, None);
                assert!(p.note.contains("no CUDA driver"), "{name}: {}", p.note);
            }
        }
        assert!(c.table().contains("host-memory-read"));
    }

    #[test]
    fn cache_round_trips_per_key() {
        let c = Ceilings {
            key: format!("test-host-{} GPU 00:01.0 driver 1.2", std::process::id()),
            probes: [("hbm-read".to_string(), Probe::measured(4000.0, "GB/s", "x"))].into(),
        };
        let path = store(&c).expect("cache writable");
        let (back, at) = cached(&c.key).unwrap().expect("found");
        assert_eq!(back, c);
        assert_eq!(at, path);
        assert!(
            cached("another key")
                .unwrap()
                .is_none_or(|(b, _)| b.key == "another key")
        );
        std::fs::remove_file(path).unwrap();
    }
}
