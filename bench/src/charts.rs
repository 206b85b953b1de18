//! PNG charts with plotters' bitmap backend. Text is drawn with a TrueType font
//! from the system (Debian's fonts-dejavu-core or fonts-liberation), registered
//! for ab_glyph, so no fontconfig library is needed.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use plotters::{
    coord::{
        CoordTranslate, Shift,
        ranged1d::{Ranged, ValueFormatter},
    },
    prelude::*,
    style::{FontStyle, register_font},
};

use crate::{Plan, scenarios::Results, stats::Spread};

const FONTS: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/liberation2/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

fn load_font() -> anyhow::Result<()> {
    for path in FONTS {
        if let Ok(bytes) = std::fs::read(path) {
            // Registered once per process, for the whole run: leaking is the point.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Ok(());
            }
        }
    }
    bail!("no TrueType font found (apt-get install fonts-dejavu-core); looked in {FONTS:?}")
}

const CLASSIC: RGBColor = RGBColor(0x9e, 0x9e, 0x9e);
const OUTBOXD: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const PALETTE: [RGBColor; 5] = [
    OUTBOXD,
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
];

/// A white canvas of the charts' size, drawn into the file at `path`.
fn canvas(path: &Path) -> anyhow::Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    let root = BitMapBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// A chart on `root` with its caption, and label areas of `(x, y)` pixels.
fn frame<'a, 'p>(
    root: &'a DrawingArea<BitMapBackend<'p>, Shift>,
    caption: &str,
    (x_area, y_area): (u32, u32),
) -> ChartBuilder<'a, 'static, BitMapBackend<'p>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(caption, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(x_area)
        .y_label_area_size(y_area);
    builder
}

/// The mesh with the two axes' descriptions.
fn axes<X, Y>(
    chart: &mut ChartContext<'_, BitMapBackend<'_>, Cartesian2d<X, Y>>,
    x_desc: &str,
    y_desc: &str,
) -> anyhow::Result<()>
where
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .draw()?;
    Ok(())
}

/// The legend at `position`, then the file written.
fn finish<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    root: &DrawingArea<BitMapBackend<'a>, Shift>,
    position: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .position(position)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    Ok(())
}

/// A line series' legend key: a short stroke in its colour.
fn line_key(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
}

/// Draws what the results hold; returns the file names written.
pub fn draw(out: &Path, results: &Results, _plan: &Plan) -> anyhow::Result<Vec<PathBuf>> {
    load_font()?;
    let mut files = Vec::new();
    if !results.drain.is_empty() {
        let path = out.join("throughput.png");
        throughput(&path, results).context("throughput chart")?;
        files.push(path);
    }
    if !results.latency.is_empty() {
        let path = out.join("latency_cdf.png");
        latency_cdf(&path, results).context("latency chart")?;
        files.push(path);
    }
    if !results.scale.is_empty() {
        let path = out.join("claim_latency.png");
        claim_latency(&path, results).context("claim latency chart")?;
        files.push(path);
    }
    Ok(files)
}

fn throughput(path: &Path, r: &Results) -> anyhow::Result<()> {
    let root = canvas(path)?;
    let mut top = 0f64;
    for case in &r.drain {
        for runs in [&case.classic, &case.outboxd] {
            let v: Vec<f64> = runs.iter().map(|x| x.events_per_sec).collect();
            top = top.max(Spread::of(&v).max);
        }
    }
    let n = r.drain.len();
    let mut chart = frame(
        &root,
        "Drain throughput (median of repetitions, whiskers min–max)",
        (40, 70),
    )
    .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..(top * 1.15).max(1.0))?;
    let names: Vec<String> = r
        .drain
        .iter()
        .map(|c| {
            format!(
                "batch {}, {} worker{}",
                c.batch,
                c.workers,
                if c.workers == 1 { "" } else { "s" }
            )
        })
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1))
        .x_label_formatter(&|x: &f64| {
            let x = *x;
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("events / s")
        .label_style(("sans-serif", 15))
        .draw()?;
    for (design, color, offset) in [(0, CLASSIC, -0.2), (1, OUTBOXD, 0.2)] {
        let mut bars = Vec::new();
        let mut whiskers = Vec::new();
        for (i, case) in r.drain.iter().enumerate() {
            let runs = if design == 0 {
                &case.classic
            } else {
                &case.outboxd
            };
            let s = Spread::of(&runs.iter().map(|x| x.events_per_sec).collect::<Vec<_>>());
            let x = i as f64 + offset;
            bars.push(Rectangle::new(
                [(x - 0.18, 0.0), (x + 0.18, s.median)],
                color.filled(),
            ));
            whiskers.push(PathElement::new(
                vec![(x, s.min), (x, s.max)],
                BLACK.stroke_width(2),
            ));
        }
        let label = if design == 0 {
            "classic relay"
        } else {
            "outboxd + outbox-relay"
        };
        chart
            .draw_series(bars)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart.draw_series(whiskers)?;
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}

fn latency_cdf(path: &Path, r: &Results) -> anyhow::Result<()> {
    let root = canvas(path)?;
    let mut lo = f64::MAX;
    let mut hi = 0f64;
    for case in &r.latency {
        if case.merged.is_empty() {
            continue;
        }
        lo = lo.min(case.merged.min() as f64 / 1000.0);
        hi = hi.max(case.merged.max() as f64 / 1000.0);
    }
    if hi <= 0.0 {
        hi = 1000.0;
        lo = 0.1;
    }
    let lo = (lo * 0.8).max(0.05);
    let mut chart = frame(
        &root,
        "Commit → delivery latency, CDF (all repetitions)",
        (45, 60),
    )
    .build_cartesian_2d((lo..hi * 1.3).log_scale(), 0f64..100f64)?;
    axes(
        &mut chart,
        "latency, ms (log scale)",
        "% of events delivered within",
    )?;
    for (k, case) in r.latency.iter().enumerate() {
        if case.merged.is_empty() {
            continue;
        }
        let color = PALETTE[k % PALETTE.len()];
        let points: Vec<(f64, f64)> = (0..=1000)
            .map(|i| f64::from(i) / 1000.0)
            .chain([0.999, 0.9999])
            .map(|q| {
                (
                    case.merged.value_at_quantile(q.min(1.0)) as f64 / 1000.0,
                    q * 100.0,
                )
            })
            .collect();
        let mut points = points;
        points.sort_by(|a, b| a.1.total_cmp(&b.1));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(case.label())
            .legend(line_key(color));
    }
    finish(&mut chart, &root, SeriesLabelPosition::LowerRight)
}

fn claim_latency(path: &Path, r: &Results) -> anyhow::Result<()> {
    let root = canvas(path)?;
    let max_h = r.scale.iter().map(|p| p.history).max().unwrap_or(1).max(1) as f64 / 1e6;
    let top = r
        .scale
        .iter()
        .map(|p| Spread::of(&p.claim_ms).max.max(Spread::of(&p.empty_ms).max))
        .fold(0f64, f64::max)
        .max(0.1);
    let mut chart = frame(
        &root,
        "ClaimBatch(100): empty table vs history (median, whiskers min–max)",
        (45, 60),
    )
    .build_cartesian_2d(-max_h * 0.03..max_h * 1.05, 0f64..top * 1.2)?;
    axes(
        &mut chart,
        "published history rows, millions (at 0: the empty table claimed beside each point)",
        "ms per claim",
    )?;
    let mut pendings: Vec<u64> = r
        .scale
        .iter()
        .filter(|p| p.leases == 0)
        .map(|p| p.pending)
        .collect();
    pendings.sort_unstable();
    pendings.dedup();
    let mut series: Vec<(String, Vec<&crate::scenarios::ScalePoint>)> = pendings
        .iter()
        .map(|&pending| {
            (
                format!("{pending} pending"),
                r.scale
                    .iter()
                    .filter(|p| p.leases == 0 && p.pending == pending)
                    .collect(),
            )
        })
        .collect();
    let leased: Vec<_> = r.scale.iter().filter(|p| p.leases > 0).collect();
    if let Some(first) = leased.first() {
        series.push((
            format!(
                "{} pending behind {} leases in flight",
                first.pending, first.leases
            ),
            leased.clone(),
        ));
    }
    // Each point is a segment from the empty table claimed beside it (no
    // history, at 0) to its own history.
    for (k, (label, pts)) in series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        for (n, p) in pts.iter().enumerate() {
            let marks = [
                (0.0, p.empty_ms.as_slice()),
                (p.history as f64 / 1e6, p.claim_ms.as_slice()),
            ];
            let xy: Vec<(f64, f64)> = marks
                .iter()
                .map(|&(x, ms)| (x, Spread::of(ms).median))
                .collect();
            let line = chart.draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))?;
            if n == 0 {
                line.label(label.clone()).legend(line_key(color));
            }
            chart.draw_series(
                xy.iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
            chart.draw_series(marks.iter().map(|&(x, ms)| {
                let s = Spread::of(ms);
                PathElement::new(vec![(x, s.min), (x, s.max)], color.stroke_width(1))
            }))?;
        }
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}
