//! The worker pool the corpus runner and the sweep share: runs a job per item, `jobs` at a
//! time, and returns the results in item order.

use std::sync::Mutex;

/// Runs `work` on every item of `items`, `jobs` threads at a time (at least one), taking items
/// in order; `done` is called with each result as it completes (from the worker that produced
/// it). Returns the results in item order.
pub fn run<T, R, W, D>(items: Vec<T>, jobs: usize, work: W, done: D) -> Vec<R>
where
    T: Send,
    R: Send,
    W: Fn(T) -> R + Sync,
    D: Fn(&R) + Sync,
{
    let queue: Mutex<Vec<(usize, T)>> = Mutex::new(items.into_iter().enumerate().rev().collect());
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..jobs.max(1) {
            sc.spawn(|| loop {
                let next = queue.lock().map(|mut q| q.pop()).ok().flatten();
                let Some((i, item)) = next else { break };
                let r = work(item);
                done(&r);
                if let Ok(mut v) = results.lock() {
                    v.push((i, r));
                }
            });
        }
    });
    let mut v = results.into_inner().unwrap_or_default();
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_item_runs_once_and_results_keep_item_order() {
        let seen = AtomicUsize::new(0);
        let got = run(
            (0..50).collect(),
            4,
            |i: u32| i * 2,
            |_| {
                seen.fetch_add(1, Ordering::Relaxed);
            },
        );
        assert_eq!(got, (0..50).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(seen.load(Ordering::Relaxed), 50);
        assert!(run(Vec::<u32>::new(), 0, |i| i, |_| {}).is_empty());
    }
}
