//! The run's plot: throughput (top) and latency percentiles on a log scale (bottom), second
//! by second, as a self-contained SVG written by hand (no plotting dependency). Pure.

use std::fmt::Write as _;

use crate::collect::IntervalPoint;
use crate::stats::LatencySummary;

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 90.0;
const MARGIN_RIGHT: f64 = 150.0;
const MARGIN_TOP: f64 = 50.0;
const PANEL_GAP: f64 = 60.0;
const MARGIN_BOTTOM: f64 = 50.0;
const HEIGHT: f64 = MARGIN_TOP + 2.0 * PANEL_HEIGHT + PANEL_GAP + MARGIN_BOTTOM;
const PLOT_WIDTH: f64 = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
/// Gridlines on the throughput axis.
const THROUGHPUT_TICKS: usize = 5;
/// Most labelled seconds on the time axis.
const TIME_TICKS_MAX: u64 = 10;

/// Picks one percentile out of a summary.
type Percentile = fn(&LatencySummary) -> u64;

/// One line of a panel.
struct Line<'a> {
    name: &'a str,
    color: &'a str,
    values: Vec<f64>,
}

/// The SVG document for `series`; `title` and `latency_name` are escaped.
pub fn render_svg(title: &str, latency_name: &str, series: &[IntervalPoint]) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/><text x="{MARGIN_LEFT}" y="28" font-size="16">{}</text>"#,
        escape(title)
    );
    if series.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{MARGIN_LEFT}" y="{}">no complete second was measured</text></svg>"#,
            MARGIN_TOP + 40.0
        );
        return svg;
    }
    let last_t = series
        .last()
        .map_or(1.0, |point| point.t_secs)
        .max(1.0)
        .ceil() as u64;
    let times: Vec<f64> = series.iter().map(|point| point.t_secs).collect();
    let x_of = |t: f64| MARGIN_LEFT + PLOT_WIDTH * t / last_t as f64;

    let mut throughput = Vec::new();
    if series.iter().any(|point| point.send_tps > 0.0) {
        throughput.push(Line {
            name: "sent msg/s",
            color: "#1f77b4",
            values: series.iter().map(|point| point.send_tps).collect(),
        });
    }
    if series.iter().any(|point| point.consume_tps > 0.0) {
        throughput.push(Line {
            name: "received msg/s",
            color: "#2ca02c",
            values: series.iter().map(|point| point.consume_tps).collect(),
        });
    }
    let top = MARGIN_TOP;
    let max_tps = throughput
        .iter()
        .flat_map(|line| line.values.iter().copied())
        .fold(0.0, f64::max);
    let tps_ceiling = nice_ceiling(max_tps);
    let y_tps = |value: f64| top + PANEL_HEIGHT * (1.0 - value / tps_ceiling);
    frame(&mut svg, top, "messages per second");
    for tick in 0..=THROUGHPUT_TICKS {
        let value = tps_ceiling * tick as f64 / THROUGHPUT_TICKS as f64;
        gridline(&mut svg, y_tps(value), &format_count(value));
    }
    for line in &throughput {
        polyline(&mut svg, &times, &line.values, x_of, y_tps, line.color);
    }
    legend(&mut svg, top, &throughput);

    let bottom = MARGIN_TOP + PANEL_HEIGHT + PANEL_GAP;
    let percentiles: [(&str, &str, Percentile); 4] = [
        ("p50", "#1f77b4", |latency| latency.p50_us),
        ("p99", "#ff7f0e", |latency| latency.p99_us),
        ("p99.9", "#d62728", |latency| latency.p99_9_us),
        ("p99.99", "#9467bd", |latency| latency.p99_99_us),
    ];
    let latency: Vec<Line> = percentiles
        .into_iter()
        .map(|(name, color, pick)| Line {
            name,
            color,
            values: series
                .iter()
                .map(|point| pick(&point.latency).max(1) as f64)
                .collect(),
        })
        .collect();
    let all_us = latency.iter().flat_map(|line| line.values.iter().copied());
    let (min_us, max_us) = all_us.fold((f64::MAX, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let low_decade = min_us.max(1.0).log10().floor();
    let high_decade = max_us.log10().ceil().max(low_decade + 1.0);
    let span = high_decade - low_decade;
    let y_latency = |us: f64| {
        let position = (us.max(1.0).log10() - low_decade) / span;
        bottom + PANEL_HEIGHT * (1.0 - position)
    };
    frame(&mut svg, bottom, &format!("{latency_name} (us, log)"));
    for decade in low_decade as i32..=high_decade as i32 {
        let us = 10f64.powi(decade);
        gridline(&mut svg, y_latency(us), &format_count(us));
    }
    for line in &latency {
        polyline(&mut svg, &times, &line.values, x_of, y_latency, line.color);
    }
    legend(&mut svg, bottom, &latency);

    let step = last_t.div_ceil(TIME_TICKS_MAX).max(1);
    let axis_y = bottom + PANEL_HEIGHT;
    for t in (0..=last_t).step_by(step as usize) {
        let x = x_of(t as f64);
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{t}</text>"#,
            axis_y + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since start</text></svg>"#,
        MARGIN_LEFT + PLOT_WIDTH / 2.0,
        axis_y + 38.0
    );
    svg
}

fn frame(svg: &mut String, top: f64, label: &str) {
    let _ = writeln!(
        svg,
        r##"<rect x="{MARGIN_LEFT}" y="{top}" width="{PLOT_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#888"/><text x="{MARGIN_LEFT}" y="{:.1}">{}</text>"##,
        top - 8.0,
        escape(label)
    );
}

fn gridline(svg: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
        MARGIN_LEFT + PLOT_WIDTH,
        MARGIN_LEFT - 6.0,
        y + 4.0
    );
}

fn polyline(
    svg: &mut String,
    times: &[f64],
    values: &[f64],
    x_of: impl Fn(f64) -> f64,
    y_of: impl Fn(f64) -> f64,
    color: &str,
) {
    let points: Vec<String> = times
        .iter()
        .zip(values)
        .map(|(&t, &value)| format!("{:.1},{:.1}", x_of(t), y_of(value)))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
        points.join(" ")
    );
}

fn legend(svg: &mut String, top: f64, lines: &[Line<'_>]) {
    let x = MARGIN_LEFT + PLOT_WIDTH + 12.0;
    for (index, line) in lines.iter().enumerate() {
        let y = top + 14.0 + 18.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{y:.1}">{}</text>"#,
            y - 4.0,
            x + 20.0,
            y - 4.0,
            line.color,
            x + 26.0,
            escape(line.name)
        );
    }
}

/// 1, 2 or 5 times a power of ten, at or above `value` (at least 1).
fn nice_ceiling(value: f64) -> f64 {
    if value <= 1.0 {
        return 1.0;
    }
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|step| step * power)
        .find(|ceiling| *ceiling >= value)
        .unwrap_or(10.0 * power)
}

/// 950, 12k, 1.5M.
fn format_count(value: f64) -> String {
    match value {
        v if v >= 1e6 => format!("{}M", trim(v / 1e6)),
        v if v >= 1e3 => format!("{}k", trim(v / 1e3)),
        v => trim(v),
    }
}

fn trim(value: f64) -> String {
    let text = format!("{value:.1}");
    text.trim_end_matches(".0").to_string()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(t_secs: f64, send_tps: f64, p99_us: u64) -> IntervalPoint {
        IntervalPoint {
            t_secs,
            send_tps,
            consume_tps: 0.0,
            latency: LatencySummary {
                count: 10,
                min_us: 1,
                mean_us: 100.0,
                p50_us: 100,
                p90_us: 200,
                p99_us,
                p99_9_us: p99_us * 2,
                p99_99_us: p99_us * 3,
                max_us: p99_us * 4,
            },
        }
    }

    #[test]
    fn svg_has_a_line_per_series_and_escapes_the_title() {
        let series = [
            point(1.0, 1000.0, 900),
            point(2.0, 1200.0, 1500),
            point(2.4, 0.0, 40_000),
        ];
        let svg = render_svg("a <b> & c", "send latency", &series);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        // One throughput line (nothing was received) and four percentiles.
        assert_eq!(svg.matches("<polyline").count(), 5);
        assert!(svg.contains("sent msg/s") && !svg.contains("received msg/s"));
        assert!(svg.contains(">p99.99<"));
        assert!(svg.contains(">100k<"), "log axis reaches 120 ms: {svg}");
    }

    #[test]
    fn empty_series_still_makes_a_document() {
        let svg = render_svg("t", "x", &[]);
        assert!(svg.contains("no complete second") && svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn axis_helpers() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(130.0), 200.0);
        assert_eq!(nice_ceiling(265_979.0), 500_000.0);
        assert_eq!(nice_ceiling(1000.0), 1000.0);
        assert_eq!(format_count(1_500_000.0), "1.5M");
        assert_eq!(format_count(12_000.0), "12k");
        assert_eq!(format_count(950.0), "950");
    }
}
