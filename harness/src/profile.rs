//! Emulated CRIU hosts: what each one exports and which engine rules it applies.
//!
//! A [`HostProfile`] fixes everything that is decided at link time in a real CRIU (its hook count,
//! the ELF size of `cr_plugin_ctl`, which host functions exist, where `opts.stream` lives). Each
//! profile is its own engine executable (`harness-engine-<tag>`). The [`Rules`] are the dispatch
//! and failure rules; each profile has a default rule set, which `--rules` may override.

use std::fmt;
use std::str::FromStr;

use abi::criu::host_hooks;

/// A CRIU host the harness can impersonate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostProfile {
    /// CRIU 4.0/4.1 (Debian's 4.1.1): 12 hooks, prefix inventory match, no options API.
    Criu41,
    /// CRIU 4.2: adds POST_FORKING (13 hooks); `opts.stream` moved to +0x198.
    Criu42,
    /// The development line after 4.2: RESTORE_INIT, DUMP_DEVICES_LATE, UPDATE_INETSK (16 hooks),
    /// `criu_plugin_get_options` (#3138) and, as proposed, `has_inventory_plugin`.
    Upstream,
    /// The #3076 series: adds DUMP_FINISH (17 hooks).
    Pr3076,
}

impl HostProfile {
    /// Every profile, oldest first.
    pub const ALL: [HostProfile; 4] = [Self::Criu41, Self::Criu42, Self::Upstream, Self::Pr3076];

    /// The profile used when none is requested: the line the CUDA plugin is developed against.
    pub const DEFAULT: HostProfile = Self::Pr3076;

    /// The name used on the command line and in the engine executable's name.
    #[must_use]
    pub const fn tag(self) -> &'static str {
        match self {
            Self::Criu41 => "4.1",
            Self::Criu42 => "4.2",
            Self::Upstream => "upstream",
            Self::Pr3076 => "pr3076",
        }
    }

    /// The engine executable implementing this profile (a sibling of the `harness` front-end).
    #[must_use]
    pub const fn engine_bin(self) -> &'static str {
        match self {
            Self::Criu41 => "harness-engine-41",
            Self::Criu42 => "harness-engine-42",
            Self::Upstream => "harness-engine-upstream",
            Self::Pr3076 => "harness-engine-pr3076",
        }
    }

    /// `CR_PLUGIN_HOOK__MAX` of the host.
    #[must_use]
    pub const fn hooks(self) -> u32 {
        match self {
            Self::Criu41 => host_hooks::CRIU_4_1,
            Self::Criu42 => host_hooks::CRIU_4_2,
            Self::Upstream => host_hooks::UPSTREAM,
            Self::Pr3076 => host_hooks::PR_3076,
        }
    }

    /// Whether the host exports `has_inventory_plugin`.
    #[must_use]
    pub const fn has_inventory_query(self) -> bool {
        matches!(self, Self::Upstream | Self::Pr3076)
    }

    /// Whether the host exports `criu_plugin_get_options` (and accepts `--plugin-option`).
    #[must_use]
    pub const fn has_plugin_options(self) -> bool {
        matches!(self, Self::Upstream | Self::Pr3076)
    }

    /// Offset of `opts.stream` in `struct cr_options` on x86_64.
    #[must_use]
    pub const fn stream_offset(self) -> usize {
        match self {
            Self::Criu41 => 0x194,
            _ => 0x198,
        }
    }

    /// `sizeof(struct cr_options)` on x86_64, the ELF size of the exported `opts`: 0x1f8 in
    /// Debian's 4.1.1, 0x200 from 4.2 on (`allow_uprobes` was added; `stream` moved).
    #[must_use]
    pub const fn opts_size(self) -> usize {
        match self {
            Self::Criu41 => 0x1f8,
            _ => 0x200,
        }
    }

    /// The rule set this host applies unless overridden.
    #[must_use]
    pub const fn default_rules(self) -> Rules {
        match self {
            Self::Criu41 | Self::Criu42 => Rules::Criu41,
            Self::Upstream | Self::Pr3076 => Rules::Newer,
        }
    }
}

impl fmt::Display for HostProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tag())
    }
}

/// An unknown profile or rule-set name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{name}` (expected one of: {expected})")]
pub struct UnknownName {
    what: &'static str,
    name: String,
    expected: &'static str,
}

impl FromStr for HostProfile {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "4.1" | "4.0" | "41" => Ok(Self::Criu41),
            "4.2" | "42" => Ok(Self::Criu42),
            "upstream" | "criu-dev" => Ok(Self::Upstream),
            "pr3076" => Ok(Self::Pr3076),
            _ => Err(UnknownName {
                what: "host profile",
                name: s.to_owned(),
                expected: "4.1, 4.2, upstream, pr3076",
            }),
        }
    }
}

/// The engine's dispatch and failure rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rules {
    /// CRIU 4.1/4.2: every hook is chained (stop at the first result other than `-ENOTSUP`),
    /// RESUME_DEVICES_LATE errors are only logged, inventory names match by `strncmp` prefix.
    Criu41,
    /// The newer line (#3076 series): DUMP_DEVICES_LATE, DUMP_FINISH, RESTORE_INIT and
    /// POST_FORKING are broadcast; RESUME_DEVICES_LATE results other than 0 and `-ENOTSUP` abort
    /// the restore; inventory names match exactly.
    Newer,
}

impl Rules {
    /// The name used on the command line.
    #[must_use]
    pub const fn tag(self) -> &'static str {
        match self {
            Self::Criu41 => "4.1",
            Self::Newer => "newer",
        }
    }
}

impl fmt::Display for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tag())
    }
}

impl FromStr for Rules {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "4.1" | "legacy" => Ok(Self::Criu41),
            "newer" => Ok(Self::Newer),
            _ => Err(UnknownName {
                what: "rule set",
                name: s.to_owned(),
                expected: "4.1, newer",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip() {
        for p in HostProfile::ALL {
            assert_eq!(p.tag().parse::<HostProfile>(), Ok(p));
        }
        for r in [Rules::Criu41, Rules::Newer] {
            assert_eq!(r.tag().parse::<Rules>(), Ok(r));
        }
        assert!("4.3".parse::<HostProfile>().is_err());
    }

    #[test]
    fn hook_counts_match_abi() {
        assert_eq!(HostProfile::Criu41.hooks(), 12);
        assert_eq!(HostProfile::Criu42.hooks(), 13);
        assert_eq!(HostProfile::Upstream.hooks(), 16);
        assert_eq!(HostProfile::Pr3076.hooks(), 17);
    }
}
