//! The time model of checkpoint and restore: how fast device memory moves between a GPU and
//! the host when several transfers run at once.
//!
//! A transfer (one checkpoint or restore of one process) has one *part* per GPU it moves
//! bytes of. At any moment every active part runs at
//!
//! ```text
//! rate(part) = min( driver / parts of its process,
//!                   link   / active parts on its GPU (all processes),
//!                   host   / active parts on the host )
//! ```
//!
//! an equal share of each of the three limits ([`crate::config::RatesConfig`]): the
//! driver's copy path belongs to the process, the link to the GPU, the ceiling to the host.
//! The shares never add up to more than a limit. They are not max-min fair (a part held back
//! by a busy link does not hand its unused driver share to its sibling), which keeps the model
//! easy to state and to check. A transfer of `bytes` alone on a GPU therefore takes
//! `bytes / min(driver, link, host)`; every modelled duration is divided by `time_scale`.
//!
//! [`share`] computes the rates of a set of parts; [`simulate`] runs whole transfers through
//! it (the target's restore thread does the same step by step, against the transfers it finds
//! in the world); [`duration`] converts modelled time to wall-clock time.

use crate::config::RatesConfig;
use std::time::Duration;

/// One GB/s, in bytes per second.
pub const GBPS: f64 = 1e9;

/// The three limits, in bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Per process.
    pub driver: f64,
    /// Per GPU.
    pub link: f64,
    /// Per host.
    pub host: f64,
}

impl Limits {
    /// The limits of a world's `[rates]`.
    #[must_use]
    pub fn of(r: &RatesConfig) -> Limits {
        Limits {
            driver: r.driver_gbps * GBPS,
            link: r.link_gbps * GBPS,
            host: r.host_gbps * GBPS,
        }
    }

    /// The rate of a transfer that runs alone on the host with one GPU.
    #[must_use]
    pub fn alone(&self) -> f64 {
        self.driver.min(self.link).min(self.host)
    }
}

/// An active part of a transfer: the process that transfers and the GPU (any key that tells
/// processes and GPUs apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Part<P, G> {
    /// The transferring process.
    pub process: P,
    /// The GPU.
    pub gpu: G,
}

/// The rate (bytes/s) of each part, in order: an equal share of each limit (module docs).
#[must_use]
pub fn share<P: PartialEq, G: PartialEq>(parts: &[Part<P, G>], limits: &Limits) -> Vec<f64> {
    share_bypassing(parts, &vec![false; parts.len()], limits)
}

/// [`share`], where the parts marked in `bypass` do not use the driver's copy path (the copies
/// of a custom-storage caller, CUDA 13.4): they get an equal share of their link and of the
/// host only, and do not count against the driver share of their process's other parts.
#[must_use]
pub fn share_bypassing<P: PartialEq, G: PartialEq>(
    parts: &[Part<P, G>],
    bypass: &[bool],
    limits: &Limits,
) -> Vec<f64> {
    let host = parts.len() as f64;
    parts
        .iter()
        .zip(bypass)
        .map(|(p, &b)| {
            let link = parts.iter().filter(|q| q.gpu == p.gpu).count() as f64;
            let shared = (limits.link / link).min(limits.host / host);
            if b {
                return shared;
            }
            let own = parts
                .iter()
                .zip(bypass)
                .filter(|(q, &qb)| !qb && q.process == p.process)
                .count() as f64;
            (limits.driver / own).min(shared)
        })
        .collect()
}

/// Wall-clock time of `modelled_s` modelled seconds.
#[must_use]
pub fn duration(modelled_s: f64, time_scale: f64) -> Duration {
    Duration::try_from_secs_f64((modelled_s / time_scale).max(0.0)).unwrap_or(Duration::MAX)
}

/// One transfer for [`simulate`]: (GPU, bytes) for each GPU it moves, all starting at once.
pub type Transfer<G> = Vec<(G, u64)>;

/// Runs `transfers` (all starting at time 0) through [`share`] until every byte moved, and
/// returns the modelled time (seconds) at which each one finished.
#[must_use]
pub fn simulate<G: PartialEq + Copy>(transfers: &[Transfer<G>], limits: &Limits) -> Vec<f64> {
    let mut left: Vec<Vec<(G, f64)>> = transfers
        .iter()
        .map(|t| t.iter().map(|&(g, b)| (g, b as f64)).collect())
        .collect();
    let mut done = vec![0.0; transfers.len()];
    let mut now = 0.0;
    loop {
        let mut parts = Vec::new();
        let mut index = Vec::new();
        for (t, gpus) in left.iter().enumerate() {
            for (k, &(g, b)) in gpus.iter().enumerate() {
                if b > 0.0 {
                    parts.push(Part { process: t, gpu: g });
                    index.push((t, k));
                }
            }
        }
        if parts.is_empty() {
            return done;
        }
        let rates = share(&parts, limits);
        // Advance to the next moment a part finishes: the rates hold until then.
        let step = index
            .iter()
            .zip(&rates)
            .map(|(&(t, k), r)| left[t][k].1 / r)
            .fold(f64::INFINITY, f64::min);
        now += step;
        for (&(t, k), r) in index.iter().zip(&rates) {
            let b = &mut left[t][k].1;
            *b -= r * step;
            // The part that set the step (and any finishing with it, up to rounding) is done.
            if *b <= r * step * 1e-9 {
                *b = 0.0;
            }
            if left[t].iter().all(|&(_, b)| b <= 0.0) && done[t] == 0.0 {
                done[t] = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GB: u64 = 1_000_000_000;

    fn limits(driver: f64, link: f64, host: f64) -> Limits {
        Limits {
            driver: driver * GBPS,
            link: link * GBPS,
            host: host * GBPS,
        }
    }

    #[test]
    fn the_reference_figures_give_the_reference_times() {
        let l = Limits::of(&RatesConfig::default());
        // 80 GB alone: driver-path bound at 6 GB/s.
        let t = simulate(&[vec![(0, 80 * GB)]], &l);
        assert!((t[0] - 80.0 / 6.0).abs() < 1e-9, "{t:?}");
        // Eight processes on eight GPUs: each still has its own driver path and link; the
        // host ceiling (200) is not reached (8 × 6 = 48).
        let eight: Vec<_> = (0..8).map(|g| vec![(g, 80 * GB)]).collect();
        for t in simulate(&eight, &l) {
            assert!((t - 80.0 / 6.0).abs() < 1e-9);
        }
        assert_eq!(duration(80.0 / 6.0, 100.0).as_millis(), 133);
    }

    #[test]
    fn a_shared_link_halves_and_separate_links_overlap() {
        let l = limits(6.0, 6.0, 100.0);
        let one = simulate(&[vec![(0, 12 * GB)]], &l)[0];
        let same = simulate(&[vec![(0, 12 * GB)], vec![(0, 12 * GB)]], &l);
        let apart = simulate(&[vec![(0, 12 * GB)], vec![(1, 12 * GB)]], &l);
        assert!((one - 2.0).abs() < 1e-9);
        assert!(same.iter().all(|t| (t - 4.0).abs() < 1e-9), "{same:?}");
        assert!(apart.iter().all(|t| (t - 2.0).abs() < 1e-9), "{apart:?}");
        // A short transfer that shares the link only for a while: 2 GB at 3 GB/s, then the
        // long one runs alone at 6.
        let mixed = simulate(&[vec![(0, 12 * GB)], vec![(0, 2 * GB)]], &l);
        assert!((mixed[1] - 2.0 / 3.0).abs() < 1e-9, "{mixed:?}");
        assert!(
            (mixed[0] - (2.0 / 3.0 + 10.0 / 6.0)).abs() < 1e-9,
            "{mixed:?}"
        );
    }

    #[test]
    fn a_process_on_two_gpus_splits_its_driver_path() {
        let l = limits(6.0, 50.0, 100.0);
        let t = simulate(&[vec![(0, 6 * GB), (1, 6 * GB)]], &l)[0];
        assert!((t - 2.0).abs() < 1e-9, "{t}");
    }

    fn parts() -> impl Strategy<Value = Vec<Part<u8, u8>>> {
        proptest::collection::vec(
            (0u8..4, 0u8..3).prop_map(|(process, gpu)| Part { process, gpu }),
            1..12,
        )
    }

    fn some_limits() -> impl Strategy<Value = Limits> {
        (0.1..100.0f64, 0.1..100.0f64, 0.1..400.0f64).prop_map(|(d, l, h)| limits(d, l, h))
    }

    proptest! {
        /// No part, and no group of parts sharing a limit, ever exceeds that limit.
        #[test]
        fn shares_never_exceed_a_limit(parts in parts(), l in some_limits()) {
            let rates = share(&parts, &l);
            let eps = 1e-6;
            for (p, r) in parts.iter().zip(&rates) {
                prop_assert!(*r > 0.0);
                prop_assert!(*r <= l.driver.min(l.link).min(l.host) * (1.0 + 1e-12));
                let proc_sum: f64 = parts.iter().zip(&rates)
                    .filter(|(q, _)| q.process == p.process).map(|(_, r)| r).sum();
                let link_sum: f64 = parts.iter().zip(&rates)
                    .filter(|(q, _)| q.gpu == p.gpu).map(|(_, r)| r).sum();
                prop_assert!(proc_sum <= l.driver * (1.0 + eps));
                prop_assert!(link_sum <= l.link * (1.0 + eps));
            }
            prop_assert!(rates.iter().sum::<f64>() <= l.host * (1.0 + eps));
        }

        /// Two transfers on one GPU each get at most half of its link.
        #[test]
        fn two_on_a_link_get_half_each(l in some_limits(), a in 0u8..4, b in 4u8..8) {
            let r = share(&[Part { process: a, gpu: 0u8 }, Part { process: b, gpu: 0u8 }], &l);
            prop_assert!(r[0] <= l.link / 2.0 && r[1] <= l.link / 2.0);
        }

        /// More bytes never finish sooner, alone or next to other transfers; and a transfer
        /// never beats its bytes at the best single rate.
        #[test]
        fn time_is_monotone_in_bytes(
            l in some_limits(),
            bytes in 1u64..1_000 * GB,
            extra in 0u64..1_000 * GB,
            others in proptest::collection::vec((0u8..3, 1u64..500 * GB), 0..4),
            gpu in 0u8..3,
        ) {
            let mut small = vec![vec![(gpu, bytes)]];
            let mut large = vec![vec![(gpu, bytes + extra)]];
            for &(g, b) in &others {
                small.push(vec![(g, b)]);
                large.push(vec![(g, b)]);
            }
            let ts = simulate(&small, &l)[0];
            let tl = simulate(&large, &l)[0];
            prop_assert!(tl >= ts * (1.0 - 1e-9), "{} < {}", tl, ts);
            prop_assert!(ts >= bytes as f64 / l.alone() * (1.0 - 1e-9));
        }
    }
}
