//! Statistics over the samples: min, median, and picking the samples of one configuration and
//! size.

use crate::config::Config;
use crate::sample::Sample;

pub(crate) fn min(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

pub(crate) fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

pub(crate) fn of(samples: &[Sample], c: Config, n: usize) -> Vec<&Sample> {
    samples
        .iter()
        .filter(|s| s.config == c && s.n == n)
        .collect()
}

pub(crate) fn col(ss: &[&Sample], f: impl Fn(&Sample) -> f64) -> Vec<f64> {
    ss.iter().map(|s| f(s)).collect()
}

/// "min / median".
pub(crate) fn mm(xs: &[f64]) -> String {
    if xs.is_empty() {
        "-".into()
    } else {
        format!("{:.1} / {:.1}", min(xs), median(xs))
    }
}
