//! How many hook slots the descriptor declares to the host (`max_hooks`).
//!
//! CRIU refuses a plugin whose `max_hooks` exceeds its own hook count (12 on 4.0/4.1, 13 on 4.2,
//! 16 upstream, 17 on the #3076 line), and ignores slots at or above `max_hooks`. The descriptor
//! is built with [`abi::criu::HOOK_COUNT_BUILD`] slots; a constructor that runs inside `dlopen`,
//! before CRIU reads the descriptor, lowers `max_hooks` with [`choose`]. `init` logs the choice.

use abi::criu::{host_hook_count_from_ctl_size, Hook, HOOK_COUNT_BUILD};

/// The count assumed when the host's cannot be read: CRIU 4.1, the oldest supported.
pub const FALLBACK_HOOKS: u32 = abi::criu::host_hooks::CRIU_4_1;

/// The decision and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxHooks {
    pub count: u32,
    pub reason: String,
}

impl MaxHooks {
    /// Whether the host will call DUMP_FINISH (hook 16).
    #[must_use]
    pub fn has_dump_finish(&self) -> bool {
        self.count as usize > Hook::DUMP_FINISH.0
    }
}

/// Chooses `max_hooks` from the environment override and the ELF size of the host's
/// `cr_plugin_ctl` (`None` when the symbol or its size cannot be read).
#[must_use]
pub fn choose(env_override: Option<&str>, ctl_size: Option<usize>) -> MaxHooks {
    let build = HOOK_COUNT_BUILD as u32;
    let mut note = String::new();
    if let Some(v) = env_override {
        match v.trim().parse::<u32>() {
            Ok(n) if (1..=build).contains(&n) => {
                return MaxHooks {
                    count: n,
                    reason: format!("{}={n}", crate::env::MAX_HOOKS),
                };
            }
            _ => {
                note = format!(
                    " (ignored {}={v:?}: not 1..={build})",
                    crate::env::MAX_HOOKS
                )
            }
        }
    }
    match ctl_size.map(|s| (s, host_hook_count_from_ctl_size(s))) {
        Some((s, Some(host))) => MaxHooks {
            count: host.min(build),
            reason: format!("host has {host} hooks (cr_plugin_ctl is {s} bytes){note}"),
        },
        Some((s, None)) => MaxHooks {
            count: FALLBACK_HOOKS,
            reason: format!("cr_plugin_ctl has an odd size {s}; assuming CRIU 4.1{note}"),
        },
        None => MaxHooks {
            count: FALLBACK_HOOKS,
            reason: format!("cr_plugin_ctl not found; assuming CRIU 4.1{note}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use abi::criu::ctl_size_for_hooks;

    #[test]
    fn clamps_to_the_host_and_honours_the_override() {
        assert_eq!(choose(None, Some(0xd0)).count, 12, "Debian 4.1.1");
        assert_eq!(choose(None, Some(ctl_size_for_hooks(13))).count, 13);
        assert_eq!(choose(None, Some(ctl_size_for_hooks(17))).count, 17);
        assert_eq!(
            choose(None, Some(ctl_size_for_hooks(40))).count,
            17,
            "never above the build count"
        );
        assert_eq!(choose(None, None).count, 12);
        assert_eq!(choose(None, Some(0xd8)).count, 12);
        let m = choose(Some("13"), Some(0xd0));
        assert_eq!(m.count, 13);
        assert!(
            m.reason.contains(criu_cuda_env::PLUGIN_MAX_HOOKS),
            "{}",
            m.reason
        );
        let m = choose(Some("99"), Some(ctl_size_for_hooks(16)));
        assert_eq!(m.count, 16);
        assert!(m.reason.contains("ignored"), "{}", m.reason);
        assert!(!choose(None, Some(ctl_size_for_hooks(16))).has_dump_finish());
        assert!(choose(None, Some(ctl_size_for_hooks(17))).has_dump_finish());
    }
}
