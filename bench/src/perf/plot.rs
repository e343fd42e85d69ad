//! `--plot FILE.png`: an HDR percentile plot. The x axis is the percentile on the "number of
//! nines" scale (50%, 90%, 99%, 99.9%, ...), the y axis latency in µs on a log scale; barewire's full
//! distribution is a line, a peer's reported percentiles are points joined by a line, and a peer
//! that reports one figure is a single marker at the median.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// A series to draw: a name and (percentile, µs) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Fonts tried, in order; Debian's fonts-dejavu-core provides the first.
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a TrueType font as "sans-serif" for plotters (once per process is enough).
pub fn load_font() -> Result<(), String> {
    if !FONTS.iter().any(|f| std::path::Path::new(f).exists()) {
        crate::apt::ensure(&["fonts-dejavu-core"])
            .map_err(|how| format!("no TrueType font found for the plot ({how})"))?;
    }
    for f in FONTS {
        if let Ok(bytes) = std::fs::read(f) {
            // plotters keeps the font for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{f}: not a usable TrueType font"));
        }
    }
    Err(format!(
        "no TrueType font found for the plot (looked for {}); apt-get install fonts-dejavu-core",
        FONTS[0]
    ))
}

/// The percentile curve of a histogram of nanoseconds, in (percentile, µs).
pub fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    let mut pts = Vec::new();
    for p in [
        0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
    ] {
        if h.len() as f64 * (1.0 - p / 100.0) >= 1.0 {
            pts.push((p, h.value_at_percentile(p) as f64 / 1000.0));
        }
    }
    pts.push((
        100.0 - 100.0 / h.len().max(2) as f64,
        h.max() as f64 / 1000.0,
    ));
    pts
}

/// The x coordinate of a percentile: log10(1 / (1 - p)), so each "nine" is one unit.
fn nines(p: f64) -> f64 {
    (1.0 / (1.0 - (p / 100.0).min(0.999_999))).log10()
}

/// Draws the series into a PNG at `path`.
pub fn plot(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    load_font()?;
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let ymax = pts.clone().map(|&(_, v)| v).fold(1.0f64, f64::max) * 1.5;
    let ymin = pts
        .clone()
        .map(|&(_, v)| v)
        .fold(f64::MAX, f64::min)
        .max(0.01)
        / 1.5;
    let xmax = pts.map(|&(p, _)| nines(p)).fold(1.0f64, f64::max).ceil();
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, (ymin..ymax).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (µs, log scale)")
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            format!("{}%", (p * 1000.0).round() / 1000.0)
        })
        .x_labels(xmax as usize + 1)
        .draw()
        .map_err(|x| e(&x))?;
    for (i, (name, p)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let xy: Vec<(f64, f64)> = p.iter().map(|&(q, v)| (nines(q), v)).collect();
        if xy.len() > 1 {
            chart
                .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color));
        }
        let s = chart
            .draw_series(xy.iter().map(|&c| Circle::new(c, 4, color.filled())))
            .map_err(|x| e(&x))?;
        if xy.len() == 1 {
            s.label(name.as_str())
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
