//! The STREAM kernels (copy, scale, add, triad) over three `f64` arrays laid end to end in a
//! byte range, with STREAM's own validation: after the run every element must equal the value
//! the same operations give on scalars, so a pager that loses or corrupts a page cannot report
//! a bandwidth.
//!
//! [`run_stream`] runs them over a [`Region`]; [`run_stream_raw`] over any memory (plain DRAM,
//! a kernel `mmap` of a file) so baselines run the very same code.

use std::time::Instant;

use strata_pager::Region;

/// STREAM's scalar.
pub const SCALAR: f64 = 3.0;

/// What to run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamConfig {
    /// Elements per array (the range holds `3 * elements` doubles).
    pub elements: usize,
    /// Timed iterations of the four kernels (the first counts as warm-up when there are more).
    pub iterations: usize,
    /// Worker threads; each takes a contiguous share of every array.
    pub threads: usize,
}

impl StreamConfig {
    /// The largest arrays that fit in `bytes` (three arrays of whole doubles).
    pub fn for_bytes(bytes: u64, iterations: usize, threads: usize) -> Self {
        Self {
            elements: usize::try_from(bytes / 24).unwrap_or(usize::MAX),
            iterations,
            threads,
        }
    }

    /// Bytes the three arrays span.
    pub fn bytes(&self) -> u64 {
        self.elements as u64 * 24
    }
}

/// The four kernels, in STREAM's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// `c = a`
    Copy,
    /// `b = s * c`
    Scale,
    /// `c = a + b`
    Add,
    /// `a = b + s * c`
    Triad,
}

impl Kernel {
    /// All four, in order.
    pub const ALL: [Kernel; 4] = [Kernel::Copy, Kernel::Scale, Kernel::Add, Kernel::Triad];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Copy => "copy",
            Kernel::Scale => "scale",
            Kernel::Add => "add",
            Kernel::Triad => "triad",
        }
    }

    /// Bytes moved per element (STREAM's count: reads plus writes).
    pub fn bytes_per_element(self) -> u64 {
        match self {
            Kernel::Copy | Kernel::Scale => 16,
            Kernel::Add | Kernel::Triad => 24,
        }
    }
}

/// Timings of one kernel.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelResult {
    /// Which kernel.
    pub kernel: Kernel,
    /// Bytes moved per iteration.
    pub bytes: u64,
    /// Seconds of every iteration, in order.
    pub seconds: Vec<f64>,
    /// Best bandwidth over the counted iterations, bytes/s.
    pub best_bytes_per_sec: f64,
    /// Median bandwidth over the counted iterations, bytes/s.
    pub median_bytes_per_sec: f64,
}

/// The outcome of a validated run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamReport {
    /// The configuration.
    pub config: StreamConfig,
    /// Seconds to initialise the arrays.
    pub init_seconds: f64,
    /// Per kernel.
    pub kernels: Vec<KernelResult>,
    /// Seconds the validation pass took.
    pub validate_seconds: f64,
    /// Elements checked (all of them).
    pub checked_elements: u64,
}

/// Why a STREAM run failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The range is too small.
    #[error(
        "STREAM needs {needed} bytes for 3 arrays of {elements} doubles but the memory holds {have}; use fewer elements or a larger region"
    )]
    TooSmall {
        /// Bytes needed.
        needed: u64,
        /// Elements per array.
        elements: usize,
        /// Bytes available.
        have: u64,
    },
    /// Nothing to do.
    #[error("STREAM needs at least 1 element, 1 iteration and 1 thread")]
    Empty,
    /// The results are wrong: the memory lost or corrupted data.
    #[error(
        "STREAM validation failed: {mismatches} elements are wrong, first {array}[{index}] = {got} where {expected} was expected; the pager lost or corrupted data, so no bandwidth is reported"
    )]
    Validation {
        /// Wrong elements in total.
        mismatches: u64,
        /// `a`, `b` or `c`.
        array: &'static str,
        /// First wrong index.
        index: usize,
        /// Value found.
        got: f64,
        /// Value expected.
        expected: f64,
    },
}

/// Progress of a run, for a progress bar.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Steps done (initialisation, each kernel of each iteration, validation).
    pub done: u64,
    /// Steps in total.
    pub total: u64,
    /// What just finished.
    pub step: &'static str,
}

/// Runs STREAM over `region` (which must hold `cfg.bytes()`).
pub fn run_stream(
    region: &Region,
    cfg: &StreamConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<StreamReport, StreamError> {
    // SAFETY: the region is mapped and readable/writable for `len()` bytes while `region` is
    // borrowed; STREAM's threads write disjoint elements.
    unsafe { run_stream_raw(region.as_ptr(), region.len() as u64, cfg, progress) }
}

/// Runs STREAM over `len` bytes at `base`.
///
/// # Safety
/// `base` must be valid for reads and writes of `len` bytes, 8-byte aligned, and not accessed
/// by anything else for the duration of the call.
pub unsafe fn run_stream_raw(
    base: *mut u8,
    len: u64,
    cfg: &StreamConfig,
    progress: &mut dyn FnMut(Progress),
) -> Result<StreamReport, StreamError> {
    if cfg.elements == 0 || cfg.iterations == 0 || cfg.threads == 0 {
        return Err(StreamError::Empty);
    }
    if cfg.bytes() > len {
        return Err(StreamError::TooSmall {
            needed: cfg.bytes(),
            elements: cfg.elements,
            have: len,
        });
    }
    assert!(
        (base as usize).is_multiple_of(8),
        "STREAM arrays must be 8-byte aligned"
    );
    let arrays = Arrays {
        base: base as usize,
        n: cfg.elements,
    };
    let total = 2 + (cfg.iterations * 4) as u64;
    let mut done = 0;
    let mut tick = |step| {
        done += 1;
        progress(Progress { done, total, step });
    };

    let t = Instant::now();
    arrays.parallel(cfg.threads, |a, b, c| {
        for i in 0..a.len() {
            a[i] = 2.0; // STREAM's a = 1, then a = 2 * a
            b[i] = 2.0;
            c[i] = 0.0;
        }
    });
    let init_seconds = t.elapsed().as_secs_f64();
    tick("init");

    let mut seconds: Vec<Vec<f64>> = (0..4).map(|_| Vec::with_capacity(cfg.iterations)).collect();
    for _ in 0..cfg.iterations {
        for (k, kernel) in Kernel::ALL.iter().enumerate() {
            let t = Instant::now();
            match kernel {
                Kernel::Copy => arrays.parallel(cfg.threads, |a, _, c| c.copy_from_slice(a)),
                Kernel::Scale => arrays.parallel(cfg.threads, |_, b, c| {
                    for (b, c) in b.iter_mut().zip(c.iter()) {
                        *b = SCALAR * c;
                    }
                }),
                Kernel::Add => arrays.parallel(cfg.threads, |a, b, c| {
                    for ((c, a), b) in c.iter_mut().zip(a.iter()).zip(b.iter()) {
                        *c = a + b;
                    }
                }),
                Kernel::Triad => arrays.parallel(cfg.threads, |a, b, c| {
                    for ((a, b), c) in a.iter_mut().zip(b.iter()).zip(c.iter()) {
                        *a = b + SCALAR * c;
                    }
                }),
            }
            seconds[k].push(t.elapsed().as_secs_f64());
            tick(kernel.name());
        }
    }

    let t = Instant::now();
    let checked = arrays.validate(cfg.iterations, cfg.threads);
    let validate_seconds = t.elapsed().as_secs_f64();
    tick("validate");
    let checked_elements = checked?;

    let kernels = Kernel::ALL
        .iter()
        .zip(seconds)
        .map(|(&kernel, secs)| {
            let bytes = kernel.bytes_per_element() * cfg.elements as u64;
            let counted = if secs.len() > 1 {
                &secs[1..]
            } else {
                &secs[..]
            };
            let mut rates: Vec<f64> = counted.iter().map(|s| bytes as f64 / s).collect();
            rates.sort_by(f64::total_cmp);
            KernelResult {
                kernel,
                bytes,
                best_bytes_per_sec: *rates.last().unwrap_or(&0.0),
                median_bytes_per_sec: median(&rates),
                seconds: secs,
            }
        })
        .collect();
    Ok(StreamReport {
        config: cfg.clone(),
        init_seconds,
        kernels,
        validate_seconds,
        checked_elements,
    })
}

/// Median of sorted values (0 for none).
pub fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The values every element of a, b and c must hold after `iterations`.
fn expected(iterations: usize) -> (f64, f64, f64) {
    let (mut a, mut b, mut c) = (2.0f64, 2.0f64, 0.0f64);
    for _ in 0..iterations {
        c = a;
        b = SCALAR * c;
        c = a + b;
        a = b + SCALAR * c;
    }
    (a, b, c)
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= want.abs() * 1e-13
}

/// Three arrays of `n` doubles laid end to end at `base`.
#[derive(Clone, Copy)]
struct Arrays {
    base: usize,
    n: usize,
}

impl Arrays {
    /// Checks every element against STREAM's expected values after `iterations`.
    fn validate(&self, iterations: usize, threads: usize) -> Result<u64, StreamError> {
        let (ea, eb, ec) = expected(iterations);
        let found = std::sync::Mutex::new((0u64, None::<(&'static str, usize, f64, f64)>));
        self.parallel_indexed(threads, |offset, a, b, c| {
            let mut bad = 0u64;
            let mut first = None;
            for i in 0..a.len() {
                for (name, got, want) in [("a", a[i], ea), ("b", b[i], eb), ("c", c[i], ec)] {
                    if !close(got, want) {
                        bad += 1;
                        first.get_or_insert((name, offset + i, got, want));
                    }
                }
            }
            if bad > 0 {
                let mut f = found.lock().unwrap_or_else(|e| e.into_inner());
                f.0 += bad;
                if f.1.is_none_or(|(_, i, _, _)| i > offset) {
                    f.1 = first;
                }
            }
        });
        let (mismatches, first) = found.into_inner().unwrap_or_else(|e| e.into_inner());
        match first {
            Some((array, index, got, expected)) => Err(StreamError::Validation {
                mismatches,
                array,
                index,
                got,
                expected,
            }),
            None => Ok(self.n as u64 * 3),
        }
    }

    fn parallel(&self, threads: usize, f: impl Fn(&mut [f64], &mut [f64], &mut [f64]) + Sync) {
        self.parallel_indexed(threads, |_, a, b, c| f(a, b, c));
    }

    fn parallel_indexed(
        &self,
        threads: usize,
        f: impl Fn(usize, &mut [f64], &mut [f64], &mut [f64]) + Sync,
    ) {
        let threads = threads.min(self.n).max(1);
        let share = self.n.div_ceil(threads);
        let this = *self;
        std::thread::scope(|s| {
            for t in 0..threads {
                let lo = t * share;
                let hi = ((t + 1) * share).min(self.n);
                if lo >= hi {
                    continue;
                }
                let f = &f;
                s.spawn(move || {
                    let ptr = this.base as *mut f64;
                    // SAFETY: the caller of `run_stream_raw` guarantees `3 * n` doubles at
                    // `base`, exclusively ours; thread `t` takes elements `lo..hi` of each
                    // array, and these ranges are disjoint between threads and arrays.
                    let (a, b, c) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(ptr.add(lo), hi - lo),
                            std::slice::from_raw_parts_mut(ptr.add(this.n + lo), hi - lo),
                            std::slice::from_raw_parts_mut(ptr.add(2 * this.n + lo), hi - lo),
                        )
                    };
                    f(lo, a, b, c);
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_over_plain_memory_validates() {
        let cfg = StreamConfig::for_bytes(3 * 8 * 10_007, 3, 3);
        let mut mem = vec![0f64; 3 * cfg.elements];
        let mut steps = 0;
        // SAFETY: `mem` holds 3 * elements doubles and is ours for the call.
        let report = unsafe {
            run_stream_raw(mem.as_mut_ptr().cast(), cfg.bytes(), &cfg, &mut |_| {
                steps += 1
            })
        }
        .unwrap();
        assert_eq!(steps, 2 + 3 * 4);
        assert_eq!(report.kernels.len(), 4);
        assert!(report.kernels.iter().all(|k| k.best_bytes_per_sec > 0.0));
        // The validator catches one corrupted element (and says which).
        let arrays = Arrays {
            base: mem.as_mut_ptr() as usize,
            n: cfg.elements,
        };
        assert_eq!(arrays.validate(3, 2).unwrap(), 3 * cfg.elements as u64);
        let victim = cfg.elements + 4321;
        mem[victim] += 1.0;
        match arrays.validate(3, 2) {
            Err(StreamError::Validation {
                mismatches: 1,
                array: "b",
                index: 4321,
                ..
            }) => {}
            other => panic!("corruption not caught: {other:?}"),
        }
        let too_small = StreamConfig::for_bytes(1 << 20, 1, 1);
        // SAFETY: the call fails its size check before touching memory.
        let e = unsafe { run_stream_raw(mem.as_mut_ptr().cast(), 64, &too_small, &mut |_| {}) };
        assert!(matches!(e, Err(StreamError::TooSmall { .. })));
    }

    #[test]
    fn expected_values_follow_stream() {
        let (a, b, c) = expected(1);
        // c = 2; b = 6; c = 8; a = 6 + 24 = 30
        assert_eq!((a, b, c), (30.0, 6.0, 8.0));
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 3.0]), 2.0);
    }
}
