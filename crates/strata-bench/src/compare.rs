//! `strata bench compare OLD.json NEW.json`: the figures both files have, the ratio new/old
//! of each, and a flag on every figure that got worse by more than its run-to-run spread.
//!
//! It reads the records this crate writes ([`crate::record::Record`]) and the bare result
//! files of builds before records existed (the pager's, remote's, stream's, gpu-micro's,
//! graph's and embed's own JSON): [`figures`] extracts the same named figures from either,
//! so the first before/after comparison can be old binary against new.

use std::fmt::Write as _;

use serde_json::Value;

use crate::record::Figure;

/// Spread assumed for a figure measured once (or whose file records no repetitions).
pub const DEFAULT_SPREAD: f64 = 0.10;

fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// A byte count read from JSON, as `64KiB`.
fn size(bytes: f64) -> String {
    let whole = if bytes.is_finite() && bytes >= 0.0 {
        // JSON numbers for byte counts are whole and far below 2^53, so this is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let b = bytes as u64;
        b
    } else {
        0
    };
    strata_core::format_size(whole).replace(' ', "")
}

/// (highest - lowest) / median of some positive samples, if there are at least two.
pub fn spread_of(samples: &[f64]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = s[s.len() / 2];
    (mid > 0.0).then(|| (s[s.len() - 1] - s[0]) / mid)
}

fn samples(v: &Value, key: &str) -> Vec<f64> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

/// A figure; a spread of exactly zero (one repetition, or identical ones) counts as unknown.
fn figure(
    name: String,
    value: f64,
    unit: &str,
    higher_is_better: bool,
    spread: Option<f64>,
) -> Figure {
    Figure {
        name,
        value,
        unit: unit.into(),
        higher_is_better,
        spread: spread.filter(|s| *s > 0.0),
    }
}

/// The rows of a gpu-micro result: `{"rows": [...]}` (with the GPU's name beside them) or a
/// bare array.
fn micro_rows(body: &Value) -> Option<&Vec<Value>> {
    let rows = body
        .get("rows")
        .and_then(Value::as_array)
        .or_else(|| body.as_array())?;
    rows.first()
        .is_some_and(|r| r.get("pattern").is_some())
        .then_some(rows)
}

/// Which benchmark wrote this bare result body.
pub fn detect(body: &Value) -> Option<&'static str> {
    if body.get("kernel_limit").is_some() && body.get("rows").is_some() {
        Some("pager")
    } else if body.get("loopback_tcp_bytes_per_sec").is_some() {
        Some("remote")
    } else if body.get("pager").and_then(|p| p.get("kernels")).is_some() {
        Some("stream")
    } else if micro_rows(body).is_some() {
        Some("gpu-micro")
    } else if let Some(rows) = body.get("rows").and_then(Value::as_array) {
        let embed = rows.first().is_some_and(|r| text(r, "workload") == "embed");
        Some(if embed { "embed" } else { "graph" })
    } else {
        None
    }
}

/// The figures of one benchmark's result body.
pub fn figures(bench: &str, body: &Value) -> Vec<Figure> {
    let mut out = Vec::new();
    let rows = |key: &str| {
        body.get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match bench {
        "pager" => {
            for r in rows("rows") {
                let seconds = samples(&r, "all_seconds");
                let name = format!(
                    "{} {} {} f{} {}",
                    text(&r, "access"),
                    size(num(&r, "page_bytes").unwrap_or(0.0)),
                    text(&r, "contestant"),
                    text(&r, "fillers"),
                    text(&r, "policy"),
                );
                if let Some(v) = num(&r, "bytes_per_sec") {
                    out.push(figure(
                        format!("{name} bandwidth"),
                        v / 1e6,
                        "MB/s",
                        true,
                        spread_of(&seconds),
                    ));
                }
            }
            for r in rows("ratios") {
                let paired = samples(&r, "paired_ratio");
                let spread = (paired.len() == 3 && paired[0] > 0.0)
                    .then(|| (paired[2] - paired[1]) / paired[0]);
                if let Some(v) = num(&r, "strata_file_over_kernel") {
                    let name = format!(
                        "{} {} strata-file/kernel",
                        text(&r, "access"),
                        size(num(&r, "page_bytes").unwrap_or(0.0))
                    );
                    out.push(figure(name, v, "x", true, spread));
                }
            }
        }
        "remote" => {
            if let Some(v) = num(body, "loopback_tcp_bytes_per_sec") {
                out.push(figure("loopback TCP".into(), v / 1e6, "MB/s", true, None));
            }
            for r in rows("raw") {
                let link = num(&r, "link_bytes_per_sec")
                    .map_or(String::new(), |l| format!(" link {}", size(l)));
                let name = format!(
                    "raw {} {} {} {} depth {}x{}{link}",
                    text(&r, "store"),
                    text(&r, "access"),
                    text(&r, "codec"),
                    text(&r, "data"),
                    text(&r, "depth"),
                    text(&r, "submitters"),
                );
                for (key, samples_key, what) in [
                    ("read_bytes_per_sec", "read_samples", "read"),
                    ("write_bytes_per_sec", "write_samples", "write"),
                ] {
                    if let Some(v) = num(&r, key) {
                        out.push(figure(
                            format!("{name} {what}"),
                            v / 1e6,
                            "MB/s",
                            true,
                            spread_of(&samples(&r, samples_key)),
                        ));
                    }
                }
            }
            for r in rows("pager") {
                let name = format!(
                    "pager {} {} {} f{} e{}",
                    text(&r, "workload"),
                    text(&r, "codec"),
                    text(&r, "data"),
                    text(&r, "fillers"),
                    text(&r, "evictors")
                );
                for pair in r
                    .get("bytes_per_sec")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    if let (Some(k), Some(v)) = (
                        pair.get(0).and_then(Value::as_str),
                        pair.get(1).and_then(Value::as_f64),
                    ) {
                        out.push(figure(format!("{name} {k}"), v / 1e6, "MB/s", true, None));
                    }
                }
            }
        }
        "stream" => {
            for (part, label) in [("pager", "pager"), ("dram_baseline", "dram")] {
                let kernels = body
                    .get(part)
                    .and_then(|p| p.get("kernels"))
                    .and_then(Value::as_array)
                    .cloned();
                for k in kernels.unwrap_or_default() {
                    let bytes = num(&k, "bytes").unwrap_or(0.0);
                    let secs = samples(&k, "seconds");
                    let counted = if secs.len() > 1 {
                        &secs[1..]
                    } else {
                        &secs[..]
                    };
                    let rates: Vec<f64> = counted
                        .iter()
                        .filter(|s| **s > 0.0)
                        .map(|s| bytes / s)
                        .collect();
                    if let Some(v) = num(&k, "median_bytes_per_sec") {
                        let name = format!("{label} {}", text(&k, "kernel"));
                        out.push(figure(name, v / 1e6, "MB/s", true, spread_of(&rates)));
                    }
                }
            }
        }
        "gpu-micro" => {
            for r in micro_rows(body).cloned().unwrap_or_default() {
                let name = format!(
                    "{} {} {} x{}",
                    text(&r, "pattern"),
                    size(num(&r, "page_size").unwrap_or(0.0)),
                    text(&r, "policy"),
                    text(&r, "ratio")
                );
                let unit = text(&r, "unit");
                for who in ["strata", "zero_copy", "chunked_copy", "uvm"] {
                    if let Some(rate) = r.get(who).and_then(|m| num(m, "rate")) {
                        out.push(figure(format!("{name} {who}"), rate, &unit, true, None));
                    }
                }
            }
        }
        "gpu-store" => {
            for r in rows("rows") {
                let name = format!(
                    "{} {} {}",
                    text(&r, "target"),
                    text(&r, "store"),
                    size(num(&r, "page_size").unwrap_or(0.0))
                );
                let unit = text(&r, "unit");
                for who in ["strata", "baseline"] {
                    if let Some(rate) = r.get(who).and_then(|m| num(m, "rate")) {
                        out.push(figure(format!("{name} {who}"), rate, &unit, true, None));
                    }
                }
            }
        }
        "graph" | "embed" => {
            for r in rows("rows") {
                let name = format!("{} {}", text(&r, "workload"), text(&r, "mode"));
                if let Some(v) = num(&r, "median_ms") {
                    out.push(figure(
                        format!("{name} time"),
                        v,
                        "ms",
                        false,
                        spread_of(&samples(&r, "times_ms")),
                    ));
                }
            }
        }
        _ => {}
    }
    out
}

/// The figures of a result file's JSON (a record, or a bare body of an older build), and the
/// benchmark's name.
pub fn figures_of(json: &Value) -> Result<(String, Vec<Figure>), String> {
    if json.get("strata_bench_record").is_some() {
        let bench = text(json, "bench");
        let figs = json
            .get("figures")
            .cloned()
            .map(serde_json::from_value::<Vec<Figure>>)
            .transpose()
            .map_err(|e| format!("bad figures: {e}"))?
            .unwrap_or_default();
        return Ok((bench, figs));
    }
    let bench = detect(json)
        .ok_or("not a result of `strata bench pager|remote|stream|gpu-micro|graph|embed`")?;
    Ok((bench.to_string(), figures(bench, json)))
}

/// One compared figure.
#[derive(Debug, Clone)]
pub struct Compared {
    /// The figure's name.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Old value.
    pub old: f64,
    /// New value.
    pub new: f64,
    /// new / old for rates, old / new for times: above 1 is better.
    pub better_by: f64,
    /// The spread a change must exceed to count (the larger of both files' spreads).
    pub spread: f64,
    /// Worse by more than `spread`.
    pub dropped: bool,
}

/// Compares two sets of figures by name.
pub fn compare(old: &[Figure], new: &[Figure]) -> Vec<Compared> {
    let mut out = Vec::new();
    for n in new {
        let Some(o) = old.iter().find(|o| o.name == n.name) else {
            continue;
        };
        if o.value <= 0.0 || n.value <= 0.0 {
            continue;
        }
        let better_by = if n.higher_is_better {
            n.value / o.value
        } else {
            o.value / n.value
        };
        let spread = match (o.spread, n.spread) {
            (None, None) => DEFAULT_SPREAD,
            (a, b) => a.unwrap_or(0.0).max(b.unwrap_or(0.0)),
        };
        out.push(Compared {
            name: n.name.clone(),
            unit: n.unit.clone(),
            old: o.value,
            new: n.value,
            better_by,
            spread,
            dropped: better_by < 1.0 - spread,
        });
    }
    out
}

/// The comparison as a table, with a summary line.
pub fn table(
    old_label: &str,
    new_label: &str,
    rows: &[Compared],
    only_old: usize,
    only_new: usize,
) -> String {
    let mut s = String::new();
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        s,
        "{:<width$} {:>12} {:>12} {:>6}  {:>7}  {:>6}",
        "figure", "old", "new", "unit", "new/old", "spread"
    );
    for r in rows {
        let flag = if r.dropped {
            "  DROP beyond spread"
        } else if r.better_by > 1.0 + r.spread {
            "  gain beyond spread"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "{:<width$} {:>12.3} {:>12.3} {:>6}  {:>6.3}x  {:>5.0}%{flag}",
            r.name,
            r.old,
            r.new,
            r.unit,
            r.better_by,
            r.spread * 100.0
        );
    }
    let drops = rows.iter().filter(|r| r.dropped).count();
    let mut logs: Vec<f64> = rows.iter().map(|r| r.better_by.ln()).collect();
    logs.sort_by(f64::total_cmp);
    let geo = if logs.is_empty() {
        1.0
    } else {
        (logs.iter().sum::<f64>() / logs.len() as f64).exp()
    };
    let _ = writeln!(
        s,
        "{} figures in both ({only_old} only in {old_label}, {only_new} only in {new_label}); geometric mean new/old (above 1 = better) {geo:.3}; {drops} dropped beyond their run-to-run spread (default {:.0}% where a file records none)",
        rows.len(),
        DEFAULT_SPREAD * 100.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str, value: f64, spread: Option<f64>, higher: bool) -> Figure {
        figure(name.into(), value, "MB/s", higher, spread)
    }

    #[test]
    fn drops_beyond_the_spread_are_flagged_and_times_invert() {
        let old = [
            f("a", 100.0, Some(0.05), true),
            f("b", 100.0, None, true),
            f("t", 10.0, Some(0.02), false),
            f("gone", 1.0, None, true),
        ];
        let new = [
            f("a", 90.0, Some(0.04), true),
            f("b", 95.0, None, true),
            f("t", 12.0, Some(0.02), false),
            f("fresh", 1.0, None, true),
        ];
        let c = compare(&old, &new);
        assert_eq!(c.len(), 3);
        let a = &c[0];
        assert!(a.dropped && (a.better_by - 0.9).abs() < 1e-9 && (a.spread - 0.05).abs() < 1e-12);
        assert!(!c[1].dropped, "5% is within the default 10%");
        assert!(
            c[2].dropped && (c[2].better_by - 10.0 / 12.0).abs() < 1e-9,
            "a slower time is a drop"
        );
        let t = table("old", "new", &c, 1, 1);
        assert!(t.contains("DROP") && t.contains("2 dropped"), "{t}");
    }

    #[test]
    fn gpu_store_rows_give_strata_and_baseline_figures() {
        let body = serde_json::json!({ "rows": [{
            "target": "stream-store", "store": "file(direct)+lz4", "page_size": 65536,
            "unit": "GB/s",
            "strata": { "median_ms": 400.0, "rate": 20.0 },
            "baseline": { "median_ms": 320.0, "rate": 25.0 },
        }, {
            "target": "cold-4k", "store": "memory", "page_size": 4096, "unit": "Mpages/s",
            "strata": { "median_ms": 90.0, "rate": 11.5 }, "baseline": null,
        }]});
        let figs = figures("gpu-store", &body);
        let names: Vec<&str> = figs.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(
            names[0].starts_with("stream-store file(direct)+lz4 64"),
            "{names:?}"
        );
        assert!(names[1].ends_with("baseline"), "{names:?}");
        assert!((figs[2].value - 11.5).abs() < 1e-12 && figs[2].unit == "Mpages/s");
    }

    #[test]
    fn bare_results_of_older_builds_are_recognised() {
        let pager = serde_json::json!({"kernel_limit": "none", "rows": [{"contestant": "kernel-mmap", "access": "seq",
            "page_bytes": 4096, "fillers": 0, "policy": "kernel", "bytes_per_sec": 2e8, "all_seconds": [1.0, 1.1, 0.9]}],
            "ratios": [{"access": "seq", "page_bytes": 4096, "strata_file_over_kernel": 1.5, "paired_ratio": [1.5, 1.4, 1.6]}]});
        let (bench, figs) = figures_of(&pager).unwrap();
        assert_eq!(bench, "pager");
        assert_eq!(figs.len(), 2);
        assert!(
            (figs[0].value - 200.0).abs() < 1e-9
                && figs[0].spread.is_some_and(|s| (s - 0.2).abs() < 1e-9)
        );
        let micro = serde_json::json!([{"pattern": "stream-read", "page_size": 65536, "policy": "clock", "ratio": 2,
            "unit": "GB/s", "strata": {"rate": 10.0, "median_ms": 1.0}, "zero_copy": null}]);
        assert_eq!(figures_of(&micro).unwrap().1.len(), 1);
        assert!(figures_of(&serde_json::json!({"x": 1})).is_err());
        let once = serde_json::json!({"kernel_limit": "none", "rows": [], "ratios": [{"access": "seq",
            "page_bytes": 4096, "strata_file_over_kernel": 2.0, "paired_ratio": [2.0, 2.0, 2.0]}]});
        let (_, figs) = figures_of(&once).unwrap();
        assert_eq!(figs[0].spread, None, "one repetition measures no spread");
    }
}
