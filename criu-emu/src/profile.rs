//! Emulated CRIU hosts: what each one exports and which engine rules it applies.
//!
//! A [`HostProfile`] fixes everything that is decided at link time in a real CRIU (its hook count,
//! the ELF size of `cr_plugin_ctl`, which host functions exist, where `opts.stream` lives). Each
//! profile is its own engine executable (`harness-engine-<tag>`). The [`Rules`] are the dispatch
//! and failure rules; each profile has a default rule set, which `--rules` may override.

use std::fmt;
use std::str::FromStr;

use crate::profiles_table::{ProfileFacts, PROFILES};

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

    /// This profile's row of the facts table ([`crate::profiles_table`]).
    #[must_use]
    pub const fn facts(self) -> &'static ProfileFacts {
        &PROFILES[self as usize]
    }

    /// The name used on the command line and in the engine executable's name.
    #[must_use]
    pub const fn tag(self) -> &'static str {
        self.facts().tag
    }

    /// The engine executable implementing this profile (a sibling of the `harness` front-end).
    #[must_use]
    pub const fn engine_bin(self) -> &'static str {
        self.facts().bin
    }

    /// `CR_PLUGIN_HOOK__MAX` of the host.
    #[must_use]
    pub const fn hooks(self) -> u32 {
        self.facts().hooks
    }

    /// Whether the host exports `has_inventory_plugin`.
    #[must_use]
    pub const fn has_inventory_query(self) -> bool {
        self.facts().inventory_query
    }

    /// Whether the host exports `criu_plugin_get_options` (and accepts `--plugin-option`).
    #[must_use]
    pub const fn has_plugin_options(self) -> bool {
        self.facts().plugin_options
    }

    /// Offset of `opts.stream` in `struct cr_options` on x86_64.
    #[must_use]
    pub const fn stream_offset(self) -> usize {
        self.facts().stream_offset
    }

    /// `sizeof(struct cr_options)` on x86_64, the ELF size of the exported `opts`: 0x1f8 in
    /// Debian's 4.1.1, 0x200 from 4.2 on (`allow_uprobes` was added; `stream` moved).
    #[must_use]
    pub const fn opts_size(self) -> usize {
        self.facts().opts_size
    }

    /// Every host symbol this profile's engine exports (its dynamic list, see `build.rs`).
    #[must_use]
    pub fn exported_symbols(self) -> Vec<&'static str> {
        self.facts().exported_symbols()
    }

    /// The rule set this host applies unless overridden.
    #[must_use]
    pub const fn default_rules(self) -> Rules {
        if self.facts().newer_rules {
            Rules::Newer
        } else {
            Rules::Criu41
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
        use abi::criu::host_hooks;
        assert_eq!(HostProfile::Criu41.hooks(), host_hooks::CRIU_4_1);
        assert_eq!(HostProfile::Criu42.hooks(), host_hooks::CRIU_4_2);
        assert_eq!(HostProfile::Upstream.hooks(), host_hooks::UPSTREAM);
        assert_eq!(HostProfile::Pr3076.hooks(), host_hooks::PR_3076);
        assert_eq!(HostProfile::Criu41.hooks(), 12);
        assert_eq!(HostProfile::Criu42.hooks(), 13);
        assert_eq!(HostProfile::Upstream.hooks(), 16);
        assert_eq!(HostProfile::Pr3076.hooks(), 17);
    }

    #[test]
    fn table_rows_follow_all() {
        assert_eq!(PROFILES.len(), HostProfile::ALL.len());
        for (i, p) in HostProfile::ALL.into_iter().enumerate() {
            assert_eq!(p as usize, i);
            assert_eq!(p.facts(), &PROFILES[i]);
            assert_eq!(p.engine_bin().parse::<HostProfile>().ok(), None);
            assert_eq!(p.tag().parse::<HostProfile>(), Ok(p));
            let symbols = p.exported_symbols();
            assert_eq!(
                symbols.contains(&"has_inventory_plugin"),
                p.has_inventory_query()
            );
            assert_eq!(
                symbols.contains(&"criu_plugin_get_options"),
                p.has_plugin_options()
            );
            assert!(symbols.contains(&"cr_plugin_ctl") && symbols.contains(&"opts"));
        }
        // The values the engines were written against, unchanged by the move into the table.
        let sizes: Vec<_> = HostProfile::ALL
            .iter()
            .map(|p| (p.opts_size(), p.stream_offset(), p.default_rules()))
            .collect();
        assert_eq!(
            sizes,
            [
                (0x1f8, 0x194, Rules::Criu41),
                (0x200, 0x198, Rules::Criu41),
                (0x200, 0x198, Rules::Newer),
                (0x200, 0x198, Rules::Newer),
            ]
        );
    }

    /// `harness/Cargo.toml` lists one `[[bin]]` per profile; it must name the table's executables.
    #[test]
    fn cargo_toml_bins_match_table() {
        let manifest: toml::Table = toml::from_str(include_str!("../Cargo.toml")).unwrap();
        let mut engines: Vec<(String, String)> = manifest["bin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b["name"].as_str().unwrap().to_owned(),
                    b["path"].as_str().unwrap().to_owned(),
                )
            })
            .filter(|(name, _)| name.starts_with("harness-engine-"))
            .collect();
        engines.sort();
        let mut expected: Vec<(String, String)> = PROFILES
            .iter()
            .map(|f| {
                let tag = f.bin.trim_start_matches("harness-engine-");
                (f.bin.to_owned(), format!("src/bin/engine_{tag}.rs"))
            })
            .collect();
        expected.sort();
        assert_eq!(engines, expected);
    }
}
