//! Scripted faults: which one fires for a call.
//!
//! A fault matches a call when its `function` names the call and, if it has a `pid`, the call
//! targets that process. Every match is counted in the world state (so counts are shared by
//! all processes); a one-shot fault fires on its `nth` match, a sticky one on every match from
//! the `nth` on. When several faults fire for one call, the first in `world.toml` wins.

use super::config::FaultAction;
use super::{World, WorldError};

impl World {
    /// Counts the call against every matching fault and returns the action of the first one
    /// that fires. `functions` lists the names the call answers to (most specific last is
    /// fine: order does not matter); `target` is the target's process id, if any.
    pub fn fault_for(
        &self,
        functions: &[&str],
        target: Option<i32>,
    ) -> Result<Option<FaultAction>, WorldError> {
        let faults = &self.config().faults;
        let matching: Vec<usize> = faults
            .iter()
            .enumerate()
            .filter(|(_, f)| functions.contains(&f.function.as_str()))
            .filter(|(_, f)| f.pid.is_none() || f.pid == target)
            .map(|(i, _)| i)
            .collect();
        if matching.is_empty() {
            return Ok(None);
        }
        self.update_own(|st| {
            let mut fired = None;
            for &i in &matching {
                let n = st.fault_counts.entry(i).or_insert(0);
                *n += 1;
                let f = &faults[i];
                let fires = if f.sticky {
                    *n >= u64::from(f.nth)
                } else {
                    *n == u64::from(f.nth)
                };
                if fires && fired.is_none() {
                    fired = Some(f.action.clone());
                }
            }
            fired
        })
    }
}

impl World {
    /// Blocks until `file` (relative to the world) exists, or forever without one: what a
    /// `hang` fault does to the call it fires on.
    pub fn hang(&self, file: Option<&str>) {
        loop {
            if let Some(f) = file {
                if self.dir().join(f).exists() {
                    return;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
