//! One plotting module for every benchmark, on plotters, writing the same chart as SVG and
//! PNG (the PNG through plotters' bitmap backend with a bundled DejaVu Sans, so no system
//! fonts or fontconfig are needed).
//!
//! A chart answers what a reader asks first. The top panel: Strata's speed-up over each
//! baseline (baseline time / Strata time, or Strata rate / baseline rate) per group (a pattern
//! and oversubscription ratio, or a page size), as bars growing up from a 1.0 line when Strata
//! is faster and down when it is slower, on a log axis, each labelled with its value. The
//! bottom panel: the fraction of the ceiling measured on this machine (`strata bench
//! ceilings`) that Strata reached, each bar labelled with the percentage and the ceiling; or
//! a line saying no ceilings were used.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The font the PNG is drawn with (DejaVu Sans; license in `fonts/`).
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        // The bundled font is a valid TrueType file; failing to parse it is a build defect
        // that the tests catch (every text would be missing from PNGs).
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// One group of bars: a pattern at one oversubscription ratio, a page size, ...
#[derive(Debug, Clone)]
pub struct Group {
    /// Label under the bars (may hold `\n` for a second line).
    pub label: String,
    /// Strata's speed-up over each baseline of the chart (same order), if measured.
    pub speedups: Vec<Option<f64>>,
    /// Strata's rate as a fraction of the machine's ceiling, and the ceiling's description
    /// (`51.4 GB/s pcie-read-sm`).
    pub ceiling: Option<(f64, String)>,
}

/// A chart of speed-ups and ceiling fractions.
#[derive(Debug, Clone)]
pub struct Chart {
    /// Title.
    pub title: String,
    /// Second title line: machine, device, commit, ceilings source.
    pub subtitle: String,
    /// Names of the baselines (`kernel mmap`, `zero-copy`, ...).
    pub baselines: Vec<String>,
    /// The groups, left to right.
    pub groups: Vec<Group>,
    /// Why there is no ceiling panel, if there is none.
    pub no_ceilings: Option<String>,
    /// Mark a missing speed-up with "n/a" (a baseline that was skipped, such as UVM on data
    /// that does not fit); without it a missing bar means the baseline does not apply.
    pub mark_missing: bool,
}

/// Why a chart could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Drawing or writing failed.
    #[error("drawing {path}: {message}")]
    Draw {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Groups per row of panels; more groups wrap onto further rows (same scales), so a chart
/// stays readable at its natural size.
const GROUPS_PER_ROW: usize = 12;
/// Pixels of one row (speed-up and ceiling panels).
const ROW_HEIGHT: usize = 820;

fn size_of(chart: &Chart) -> (u32, u32) {
    let longest = chart
        .groups
        .iter()
        .flat_map(|g| g.label.lines().map(str::len))
        .max()
        .unwrap_or(0);
    let per_group = (chart.baselines.len().max(1) * 34 + 18).max(longest * 7 + 10);
    let per_row = chart.groups.len().clamp(1, GROUPS_PER_ROW);
    let rows = chart.groups.len().div_ceil(GROUPS_PER_ROW).max(1);
    let width = (per_row * per_group + 160).clamp(900, 6000);
    let height = 80 + rows * ROW_HEIGHT;
    (
        u32::try_from(width).unwrap_or(6000),
        u32::try_from(height).unwrap_or(u32::MAX),
    )
}

fn err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Writes `chart` to `base.svg` and `base.png`; returns both paths.
pub fn write(chart: &Chart, base: &Path) -> Result<(PathBuf, PathBuf), PlotError> {
    register_font();
    let svg = base.with_extension("svg");
    let png = base.with_extension("png");
    let dims = size_of(chart);
    {
        let root = SVGBackend::new(&svg, dims).into_drawing_area();
        draw(&root, chart).map_err(err(&svg))?;
        root.present().map_err(err(&svg))?;
    }
    {
        let root = BitMapBackend::new(&png, dims).into_drawing_area();
        draw(&root, chart).map_err(err(&png))?;
        root.present().map_err(err(&png))?;
    }
    Ok((svg, png))
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn fmt_speedup(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}x")
    } else if v >= 10.0 {
        format!("{v:.1}x")
    } else {
        format!("{v:.2}x")
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, chart: &Chart) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (w, _) = root.dim_in_pixel();
    let title =
        TextStyle::from(("sans-serif", 22).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        chart.title.clone(),
        (i32::try_from(w / 2).unwrap_or(0), 8),
        title,
    ))?;
    let sub = TextStyle::from(("sans-serif", 13).into_font())
        .color(&RGBColor(90, 90, 90))
        .pos(Pos::new(HPos::Center, VPos::Top));
    root.draw(&Text::new(
        chart.subtitle.clone(),
        (i32::try_from(w / 2).unwrap_or(0), 36),
        sub,
    ))?;
    let body = root.margin(58, 10, 10, 10);
    let values: Vec<f64> = chart
        .groups
        .iter()
        .flat_map(|g| g.speedups.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let range = (
        values.iter().copied().fold(1.0f64, f64::min) / 1.6,
        values.iter().copied().fold(1.0f64, f64::max) * 1.6,
    );
    let ceiling_top = chart
        .groups
        .iter()
        .filter_map(|g| g.ceiling.as_ref().map(|c| c.0))
        .fold(1.0f64, f64::max)
        * 1.2;
    let chunks: Vec<&[Group]> = chart.groups.chunks(GROUPS_PER_ROW).collect();
    let rows = body.split_evenly((chunks.len().max(1), 1));
    for (area, groups) in rows.iter().zip(chunks) {
        let part = Chart {
            groups: groups.to_vec(),
            ..chart.clone()
        };
        let (top, bottom) = area.split_vertically(area.dim_in_pixel().1 * 60 / 100);
        speedup_panel(&top, &part, range)?;
        ceiling_panel(&bottom.margin(10, 0, 0, 0), &part, ceiling_top)?;
    }
    Ok(())
}

fn group_labels<DB: DrawingBackend>(
    area: &DrawingArea<
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, impl Ranged<ValueType = f64>>,
    >,
    chart: &Chart,
    y: f64,
) -> DrawResult<DB> {
    let style =
        TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (i, g) in chart.groups.iter().enumerate() {
        for (line_no, line) in g.label.lines().enumerate() {
            let dy = i32::try_from(line_no).unwrap_or(0) * 14 + 6;
            area.draw(
                &(EmptyElement::at((i as f64 + 0.5, y))
                    + Text::new(line.to_string(), (0, dy), style.clone())),
            )?;
        }
    }
    Ok(())
}

fn speedup_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
    (lo, hi): (f64, f64),
) -> DrawResult<DB> {
    let n = chart.groups.len().max(1) as f64;
    let mut c = ChartBuilder::on(area)
        .caption(
            "Strata's speed-up over each baseline (above 1: Strata faster; log scale)",
            ("sans-serif", 16),
        )
        .margin_right(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, (lo..hi).log_scale())?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(8)
        .light_line_style(RGBColor(245, 245, 245))
        .y_desc("speed-up (x)")
        .y_label_formatter(&|v| fmt_speedup(*v))
        .label_style(("sans-serif", 12))
        .draw()?;
    let k = chart.baselines.len().max(1) as f64;
    let bar = 0.8 / k;
    for (gi, g) in chart.groups.iter().enumerate() {
        for (bi, s) in g.speedups.iter().enumerate() {
            let x0 = gi as f64 + 0.1 + bi as f64 * bar;
            let color = COLORS[bi % COLORS.len()];
            let Some(v) = s.filter(|v| *v > 0.0) else {
                if !chart.mark_missing {
                    continue;
                }
                c.draw_series(std::iter::once(Text::new(
                    "n/a",
                    (x0 + bar / 2.0, 1.0),
                    TextStyle::from(("sans-serif", 10).into_font())
                        .color(&RGBColor(120, 120, 120))
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))?;
                continue;
            };
            c.draw_series(std::iter::once(Rectangle::new(
                [(x0, 1.0), (x0 + bar * 0.9, v)],
                color.filled(),
            )))?;
            let vpos = if v >= 1.0 { VPos::Bottom } else { VPos::Top };
            c.draw_series(std::iter::once(Text::new(
                fmt_speedup(v),
                (x0 + bar * 0.45, v),
                TextStyle::from(("sans-serif", 11).into_font()).pos(Pos::new(HPos::Center, vpos)),
            )))?;
        }
    }
    c.draw_series(LineSeries::new(
        [(0.0, 1.0), (n, 1.0)],
        BLACK.stroke_width(2),
    ))?
    .label("1.0 = same speed as the baseline")
    .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    for (bi, name) in chart.baselines.iter().enumerate() {
        let color = COLORS[bi % COLORS.len()];
        c.draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(format!("vs {name}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], color.filled()));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    group_labels(c.plotting_area(), chart, lo)?;
    Ok(())
}

fn ceiling_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    chart: &Chart,
    top: f64,
) -> DrawResult<DB> {
    if let Some(why) = &chart.no_ceilings {
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from(("sans-serif", 15).into_font())
            .pos(Pos::new(HPos::Center, VPos::Center));
        area.draw(&Text::new(
            format!("fraction of the machine's ceiling: not shown ({why})"),
            (
                i32::try_from(w / 2).unwrap_or(0),
                i32::try_from(h / 2).unwrap_or(0),
            ),
            style,
        ))?;
        return Ok(());
    }
    let n = chart.groups.len().max(1) as f64;
    let mut names = chart
        .groups
        .iter()
        .filter_map(|g| g.ceiling.as_ref().map(|c| c.1.as_str()));
    let first = names.next();
    let common = first.filter(|f| names.all(|n| n == *f));
    let caption = match common {
        Some(what) => {
            format!("Strata's rate as a fraction of the ceiling measured on this machine: {what}")
        }
        None => "Strata's rate as a fraction of the ceiling measured on this machine".to_string(),
    };
    let mut c = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin_right(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, 0.0..top)?;
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_labels(7)
        .light_line_style(RGBColor(245, 245, 245))
        .y_desc("fraction of ceiling")
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .label_style(("sans-serif", 12))
        .draw()?;
    c.draw_series(LineSeries::new([(0.0, 1.0), (n, 1.0)], RED.stroke_width(1)))?;
    for (gi, g) in chart.groups.iter().enumerate() {
        let Some((f, what)) = &g.ceiling else {
            continue;
        };
        let x0 = gi as f64 + 0.25;
        c.draw_series(std::iter::once(Rectangle::new(
            [(x0, 0.0), (x0 + 0.5, *f)],
            RGBColor(100, 100, 100).filled(),
        )))?;
        c.draw_series(std::iter::once(Text::new(
            format!("{:.0}%", f * 100.0),
            (x0 + 0.25, *f),
            TextStyle::from(("sans-serif", 11).into_font())
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )))?;
        if common.is_some() || *f < top * 0.45 {
            // Named in the caption, or too short a bar to hold its name: the name goes above.
            if common.is_none() {
                c.draw_series(std::iter::once(
                    EmptyElement::at((x0 + 0.25, *f))
                        + Text::new(
                            what.clone(),
                            (0, -16),
                            TextStyle::from(("sans-serif", 10).into_font())
                                .color(&RGBColor(80, 80, 80))
                                .pos(Pos::new(HPos::Left, VPos::Center))
                                .transform(FontTransform::Rotate270),
                        ),
                ))?;
            }
            continue;
        }
        c.draw_series(std::iter::once(Text::new(
            what.clone(),
            (x0 + 0.25, *f / 2.0),
            TextStyle::from(("sans-serif", 10).into_font())
                .color(&WHITE)
                .pos(Pos::new(HPos::Center, VPos::Center))
                .transform(FontTransform::Rotate270),
        )))?;
    }
    group_labels(c.plotting_area(), chart, 0.0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_and_an_svg_with_values_and_labels() {
        let chart = Chart {
            title: "test chart".into(),
            subtitle: "machine x, commit y".into(),
            baselines: vec!["zero-copy".into(), "UVM".into()],
            groups: vec![
                Group {
                    label: "stream-read\nx1".into(),
                    speedups: vec![Some(0.24), Some(3.5)],
                    ceiling: Some((0.64, "51.4 GB/s pcie-read-sm".into())),
                },
                Group {
                    label: "gather\nx2".into(),
                    speedups: vec![Some(12.0), None],
                    ceiling: None,
                },
            ],
            no_ceilings: None,
            mark_missing: true,
        };
        let base = std::env::temp_dir().join(format!("strata-plot-test-{}", std::process::id()));
        let (svg, png) = write(&chart, &base).expect("drawn");
        let text = std::fs::read_to_string(&svg).unwrap();
        for needle in [
            "0.24x",
            "3.50x",
            "12.0x",
            "64%",
            "stream-read",
            "vs zero-copy",
            "n/a",
        ] {
            assert!(text.contains(needle), "{needle} missing from the SVG");
        }
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..4], b"\x89PNG");
        assert!(
            bytes.len() > 10_000,
            "a PNG with text and bars, {} bytes",
            bytes.len()
        );
        std::fs::remove_file(svg).unwrap();
        if std::env::var_os("STRATA_KEEP_PLOTS").is_none() {
            std::fs::remove_file(png).unwrap();
        }
    }
}
