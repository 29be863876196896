//! Hand-written SVG charts: lines, steps (CDFs) and dots, linear or log x
//! axis, nice ticks, a legend. Enough for the replay's three plots without
//! a plotting crate.

use std::fmt::Write;

const W: f64 = 760.0;
const PLOT_H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const PALETTE: &[&str] = &["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Style {
    Line,
    /// A step function (for CDFs): horizontal then vertical.
    Step,
    Dots,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: Style,
}

#[derive(Debug, Clone, Default)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub x_log: bool,
    /// Fixed y range (e.g. 0..1 for fractions); default: from the data.
    pub y_range: Option<(f64, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Round numbers spanning [lo, hi], about `n` of them.
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).max(f64::EPSILON);
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let mults: &[f64] = if b - a <= 2 { &[1.0, 2.0, 5.0] } else { &[1.0] };
    (a..=b).flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e))).filter(|t| *t >= lo * 0.999 && *t <= hi * 1.001).collect()
}

fn label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{}", (v * 100.0).round() / 100.0)
    } else {
        format!("{}", (v * 10000.0).round() / 10000.0)
    }
}

impl Chart {
    pub fn render(&self) -> String {
        let pts = self.series.iter().flat_map(|s| s.points.iter()).filter(|(x, y)| x.is_finite() && y.is_finite());
        let pts: Vec<(f64, f64)> = pts.filter(|(x, _)| !self.x_log || *x > 0.0).copied().collect();
        let legend_rows = self.series.len().div_ceil(2);
        let h = TOP + PLOT_H + 50.0 + 20.0 * legend_rows as f64;
        let pw = W - LEFT - RIGHT;
        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
            W / 2.0,
            esc(&self.title)
        );
        if pts.is_empty() {
            let _ = writeln!(
                svg,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#777\">no data</text>\n</svg>",
                W / 2.0,
                TOP + PLOT_H / 2.0
            );
            return svg;
        }
        let (mut x0, mut x1) = pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
        let (mut y0, mut y1) =
            self.y_range.unwrap_or_else(|| pts.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1))));
        if self.y_range.is_none() {
            y0 = y0.min(0.0);
            y1 = if y1 <= y0 { y0 + 1.0 } else { y1 * 1.05 };
        }
        if !self.x_log && x0 > 0.0 && x0 < 0.2 * (x1 - x0) {
            // Time axes start at zero.
            x0 = 0.0;
        }
        if x1 <= x0 {
            (x0, x1) = if self.x_log { (x0 / 2.0, x1 * 2.0) } else { (x0 - 0.5, x1 + 0.5) };
        }
        let (lx0, lx1) = (x0.log10(), x1.log10());
        let sx = |x: f64| {
            let f = if self.x_log { (x.log10() - lx0) / (lx1 - lx0) } else { (x - x0) / (x1 - x0) };
            LEFT + f * pw
        };
        let sy = |y: f64| TOP + PLOT_H - (y - y0) / (y1 - y0) * PLOT_H;

        // Axes, grid, ticks.
        let xt = if self.x_log { log_ticks(x0, x1) } else { ticks(x0, x1, 6) };
        for t in xt {
            let x = sx(t);
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + PLOT_H,
                TOP + PLOT_H + 16.0,
                label(t)
            );
        }
        for t in ticks(y0, y1, 5) {
            let y = sy(t);
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                label(t)
            );
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{PLOT_H}\" fill=\"none\" stroke=\"#333\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
             <text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            LEFT + pw / 2.0,
            TOP + PLOT_H + 34.0,
            esc(&self.x_label),
            TOP + PLOT_H / 2.0,
            esc(&self.y_label)
        );

        for (i, s) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let p: Vec<(f64, f64)> =
                s.points.iter().filter(|(x, y)| x.is_finite() && y.is_finite() && (!self.x_log || *x > 0.0)).copied().collect();
            match s.style {
                Style::Dots => {
                    let _ = write!(svg, "<g fill=\"{color}\" fill-opacity=\"0.6\">");
                    for (x, y) in &p {
                        let _ = write!(svg, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.2\"/>", sx(*x), sy(*y));
                    }
                    svg.push_str("</g>\n");
                }
                Style::Line | Style::Step => {
                    let mut d = String::new();
                    for (j, (x, y)) in p.iter().enumerate() {
                        let (px, py) = (sx(*x), sy(*y));
                        if j == 0 {
                            let _ = write!(d, "M{px:.1},{py:.1}");
                        } else if s.style == Style::Step {
                            let _ = write!(d, " H{px:.1} V{py:.1}");
                        } else {
                            let _ = write!(d, " L{px:.1},{py:.1}");
                        }
                    }
                    let _ = writeln!(svg, "<path d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.8\"/>");
                }
            }
            let (col, row) = (i % 2, i / 2);
            let (lx, ly) = (LEFT + col as f64 * pw / 2.0, TOP + PLOT_H + 52.0 + row as f64 * 20.0);
            let _ = writeln!(
                svg,
                "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{ly:.1}\">{}</text>",
                ly - 10.0,
                lx + 18.0,
                esc(&s.name)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// The empirical CDF of `xs` as step points (x, fraction <= x).
pub fn cdf(mut xs: Vec<f64>) -> Vec<(f64, f64)> {
    xs.retain(|x| x.is_finite());
    xs.sort_by(f64::total_cmp);
    let n = xs.len() as f64;
    xs.iter().enumerate().map(|(i, x)| (*x, (i + 1) as f64 / n)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_numbers_inside_the_range() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(log_ticks(0.01, 10.0), vec![0.01, 0.1, 1.0, 10.0]);
        assert!(log_ticks(0.05, 0.9).contains(&0.1));
    }

    #[test]
    fn charts_are_well_formed_svg_with_escaped_labels() {
        let c = Chart {
            title: "TTFT <by path>".into(),
            x_label: "s".into(),
            y_label: "fraction".into(),
            series: vec![
                Series { name: "local/prefix_hit".into(), points: cdf(vec![0.2, 0.1, 0.4]), style: Style::Step },
                Series { name: "b".into(), points: vec![(1.0, 2.0), (2.0, f64::NAN)], style: Style::Dots },
            ],
            x_log: true,
            y_range: Some((0.0, 1.0)),
        };
        let s = c.render();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("TTFT &lt;by path&gt;") && s.contains("local/prefix_hit"));
        assert!(!s.contains("NaN"));
        assert_eq!(cdf(vec![3.0, 1.0]), vec![(1.0, 0.5), (3.0, 1.0)]);
        assert!(Chart::default().render().contains("no data"));
    }
}
