//! The plot (`docs/performance.svg`): median dump+restore against N, one line per
//! configuration.

use crate::config::CONFIGS;
use crate::report::Report;
use crate::summary::{col, median, min, of};
use std::fmt::Write as _;

impl Report<'_> {
    /// Median dump+restore against N, one line per configuration, min as hollow markers.
    pub(crate) fn svg(&self) -> String {
        let (w, h) = (720.0, 440.0);
        let (left, right, top, bottom) = (70.0, 190.0, 50.0, 60.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let nmax = self.o.sizes.iter().copied().max().unwrap_or(1) as f64;
        let ymax_data = self
            .samples
            .iter()
            .map(Self::dr)
            .fold(0.0, f64::max)
            .max(1.0);
        let step = nice_step(ymax_data / 5.0);
        let ymax = (ymax_data / step).ceil() * step;
        let x = |n: f64| left + pw * n / nmax;
        let y = |v: f64| top + ph * (1.0 - v / ymax);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"##
        );
        let _ = writeln!(
            s,
            r##"<rect width="{w}" height="{h}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">criu dump + criu restore -d, median of {} round(s) (CRIU {})</text>
<text x="{}" y="38" text-anchor="middle" font-size="11" fill="#555">{} · {} cores · load {} → {} · {} · hollow marks: min</text>"##,
            w / 2.0,
            self.o.rounds,
            self.criu_version,
            w / 2.0,
            self.m.cpu,
            self.m.cores,
            self.m.load_start,
            self.m.load_end,
            self.m.date
        );
        // Grid and axes.
        let mut v = 0.0;
        while v <= ymax + step / 2.0 {
            let yy = y(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
                left + pw,
                left - 6.0,
                yy + 4.0
            );
            v += step;
        }
        for &n in &self.o.sizes {
            let xx = x(n as f64);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{top}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{n}</text>"##,
                top + ph,
                top + ph + 18.0
            );
        }
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{:.1}" stroke="black"/><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle">N (processes in the tree)</text>
<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">dump + restore, ms</text>"##,
            top + ph,
            top + ph,
            left + pw,
            top + ph,
            left + pw / 2.0,
            h - 18.0,
            top + ph / 2.0
        );
        for (i, c) in CONFIGS.iter().enumerate() {
            let pts: Vec<(f64, f64, f64)> = self
                .o
                .sizes
                .iter()
                .filter_map(|&n| {
                    let ss = of(self.samples, *c, n);
                    (!ss.is_empty()).then(|| {
                        let v = col(&ss, Self::dr);
                        (n as f64, median(&v), min(&v))
                    })
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            let path: Vec<String> = pts
                .iter()
                .map(|&(n, m, _)| format!("{:.1},{:.1}", x(n), y(m)))
                .collect();
            let col = c.colour();
            let _ = writeln!(
                s,
                r##"<polyline fill="none" stroke="{col}" stroke-width="2" points="{}"/>"##,
                path.join(" ")
            );
            for &(n, m, mn) in &pts {
                let _ = writeln!(
                    s,
                    r##"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{col}"><title>{} N={n}: median {m:.1} ms, min {mn:.1} ms</title></circle><circle cx="{:.1}" cy="{:.1}" r="3" fill="none" stroke="{col}"/>"##,
                    x(n),
                    y(m),
                    c.name(),
                    x(n),
                    y(mn)
                );
            }
            let ly = top + 10.0 + 22.0 * i as f64;
            let lx = left + pw + 16.0;
            let label = c.label();
            let _ = writeln!(
                s,
                r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{col}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{label}</text>"##,
                lx + 22.0,
                lx + 28.0,
                ly + 4.0
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// 1, 2 or 5 × 10^k, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.max(1e-9).log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= raw {
            return m * p;
        }
    }
    10.0 * p
}
