//! The `UMAP_*` environment variables, with Umap's meanings, read once per process.

use strata_core::config::available_cpus;

/// Configuration from the environment (or Umap's defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UmapConfig {
    /// `UMAP_PAGESIZE`: bytes per page (default: the system page size).
    pub page_size: u64,
    /// `UMAP_BUFSIZE`: pages per region's buffer (default: 90 % of free memory).
    pub buffer_pages: u64,
    /// `UMAP_PAGE_FILLERS` (default: the CPU count).
    pub fillers: u64,
    /// `UMAP_PAGE_EVICTORS` (default: the CPU count).
    pub evictors: u64,
    /// `UMAP_EVICT_LOW_WATER_THRESHOLD` in percent (default 70).
    pub low_water: u8,
    /// `UMAP_EVICT_HIGH_WATER_THRESHOLD` in percent (default 90).
    pub high_water: u8,
    /// `UMAP_MAX_FAULT_EVENTS` (default 256; accepted, reported, advisory: Strata's fillers
    /// read a few messages at a time so that bursts spread over them).
    pub max_fault_events: u64,
    /// `UMAP_READ_AHEAD` in pages (default 0).
    pub read_ahead: u64,
}

/// A `UMAP_*` variable with a value Strata cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {reason}")]
pub struct UmapEnvError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong and what to write.
    pub reason: String,
}

/// The system page size.
pub fn system_page_size() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).unwrap_or(4096)
}

fn mem_free_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemFree:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
        })
        .map_or(1 << 30, |kib| kib * 1024)
}

impl UmapConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, UmapEnvError> {
        Self::from_lookup(&|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Self, UmapEnvError> {
        // Unlike Umap, 0 is a value (and usually an error), not "unset".
        let number = |name: &'static str| -> Result<Option<u64>, UmapEnvError> {
            match lookup(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| UmapEnvError {
                    name,
                    value: v.clone(),
                    reason: "not a whole number; write digits only, such as 4".into(),
                }),
            }
        };
        let positive = |name: &'static str| -> Result<Option<u64>, UmapEnvError> {
            match number(name)? {
                Some(0) => Err(UmapEnvError {
                    name,
                    value: "0".into(),
                    reason: "must be at least 1 (Strata does not read 0 as unset); unset the variable for the default".into(),
                }),
                other => Ok(other),
            }
        };
        let percent = |name: &'static str, default: u8| -> Result<u8, UmapEnvError> {
            match number(name)? {
                None => Ok(default),
                Some(v) => u8::try_from(v)
                    .ok()
                    .filter(|p| *p <= 100)
                    .ok_or_else(|| UmapEnvError {
                        name,
                        value: v.to_string(),
                        reason: "a percentage from 0 to 100".into(),
                    }),
            }
        };
        let sys_page = system_page_size();
        let page_size = positive("UMAP_PAGESIZE")?.unwrap_or(sys_page);
        if !page_size.is_multiple_of(sys_page) || page_size > 2 << 20 {
            return Err(UmapEnvError {
                name: "UMAP_PAGESIZE",
                value: page_size.to_string(),
                reason: format!(
                    "must be a multiple of the system page size ({sys_page}) up to 2097152 (2 MiB)"
                ),
            });
        }
        let buffer_pages = match positive("UMAP_BUFSIZE")? {
            Some(p) => p,
            None => (mem_free_bytes() / 10 * 9 / page_size).max(4),
        };
        if buffer_pages < 4 {
            return Err(UmapEnvError {
                name: "UMAP_BUFSIZE",
                value: buffer_pages.to_string(),
                reason: "the buffer must hold at least 4 pages".into(),
            });
        }
        let cpus = available_cpus() as u64;
        let low_water = percent("UMAP_EVICT_LOW_WATER_THRESHOLD", 70)?;
        let high_water = percent("UMAP_EVICT_HIGH_WATER_THRESHOLD", 90)?;
        if low_water >= high_water {
            return Err(UmapEnvError {
                name: "UMAP_EVICT_LOW_WATER_THRESHOLD",
                value: low_water.to_string(),
                reason: format!("must be below UMAP_EVICT_HIGH_WATER_THRESHOLD ({high_water})"),
            });
        }
        let read_ahead = number("UMAP_READ_AHEAD")?.unwrap_or(0);
        if read_ahead > 1024 {
            return Err(UmapEnvError {
                name: "UMAP_READ_AHEAD",
                value: read_ahead.to_string(),
                reason: "use 0 to 1024 pages".into(),
            });
        }
        Ok(Self {
            page_size,
            buffer_pages,
            fillers: positive("UMAP_PAGE_FILLERS")?.unwrap_or(cpus).min(1024),
            evictors: positive("UMAP_PAGE_EVICTORS")?.unwrap_or(cpus).min(1024),
            low_water,
            high_water,
            max_fault_events: positive("UMAP_MAX_FAULT_EVENTS")?.unwrap_or(256),
            read_ahead,
        })
    }

    /// Umap's defaults (used by the getters when the environment is invalid).
    pub fn defaults() -> Self {
        Self::from_lookup(&|_| None).unwrap_or(Self {
            page_size: 4096,
            buffer_pages: 1 << 18,
            fillers: 1,
            evictors: 1,
            low_water: 70,
            high_water: 90,
            max_fault_events: 256,
            read_ahead: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<UmapConfig, UmapEnvError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        UmapConfig::from_lookup(&move |k| map.get(k).cloned())
    }

    #[test]
    fn umap_variables_and_defaults() {
        let c = with(&[]).unwrap();
        assert_eq!(c.page_size, system_page_size());
        assert_eq!(
            (c.low_water, c.high_water, c.max_fault_events),
            (70, 90, 256)
        );
        assert_eq!(c.fillers, available_cpus() as u64);
        let c = with(&[
            ("UMAP_PAGESIZE", "65536"),
            ("UMAP_BUFSIZE", "100"),
            ("UMAP_PAGE_FILLERS", "3"),
            ("UMAP_PAGE_EVICTORS", "2"),
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "50"),
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "80"),
            ("UMAP_READ_AHEAD", "8"),
            ("UMAP_MAX_FAULT_EVENTS", "64"),
        ])
        .unwrap();
        assert_eq!(
            (
                c.page_size,
                c.buffer_pages,
                c.fillers,
                c.evictors,
                c.read_ahead
            ),
            (65536, 100, 3, 2, 8)
        );
        assert_eq!(
            (c.low_water, c.high_water, c.max_fault_events),
            (50, 80, 64)
        );
    }

    #[test]
    fn bad_values_are_errors_not_defaults() {
        for (name, value, says) in [
            ("UMAP_PAGE_EVICTORS", "0", "at least 1"),
            ("UMAP_PAGESIZE", "5000", "multiple of the system page size"),
            ("UMAP_PAGESIZE", "4194304", "up to 2097152"),
            ("UMAP_BUFSIZE", "two", "whole number"),
            ("UMAP_BUFSIZE", "3", "at least 4 pages"),
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "101", "0 to 100"),
            ("UMAP_READ_AHEAD", "4096", "0 to 1024"),
        ] {
            let e = with(&[(name, value)]).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.to_string().contains(says), "{e}");
        }
        let e = with(&[
            ("UMAP_EVICT_LOW_WATER_THRESHOLD", "90"),
            ("UMAP_EVICT_HIGH_WATER_THRESHOLD", "90"),
        ])
        .unwrap_err();
        assert!(e.to_string().contains("below"), "{e}");
    }
}
