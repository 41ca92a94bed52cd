//! `--plugin-option PLUGIN.NAME[=VALUE]`: validation and the argv handed to plugins.
//!
//! As merged upstream (#3138): the first `.` separates the plugin namespace from the option name,
//! the first `=` separates the value; both names must be non-empty, the value may be empty or
//! absent. Options are kept in command-line order with repeats, and every plugin receives all of
//! them as `--PLUGIN.NAME=VALUE` (or `--PLUGIN.NAME` for a bare flag) after the synthetic
//! `argv[0]` [`ARGV0`].

use std::fmt;
use std::str::FromStr;

/// The synthetic `argv[0]` of the plugin option vector.
pub const ARGV0: &str = "criu-plugin";

/// One `--plugin-option` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginOption {
    /// The plugin namespace (the descriptor name by convention).
    pub plugin: String,
    /// The option name inside the namespace.
    pub name: String,
    /// The value, `None` for a bare flag.
    pub value: Option<String>,
}

/// A malformed `--plugin-option`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// No `.` before the first `=`.
    #[error("plugin option `{0}` has no `PLUGIN.` namespace")]
    NoNamespace(String),
    /// `.NAME`.
    #[error("plugin option `{0}` has an empty plugin name")]
    EmptyPlugin(String),
    /// `PLUGIN.` or `PLUGIN.=VALUE`.
    #[error("plugin option `{0}` has an empty option name")]
    EmptyName(String),
    /// A NUL byte cannot be passed through a C string.
    #[error("plugin option `{0}` contains a NUL byte")]
    Nul(String),
}

impl FromStr for PluginOption {
    type Err = OptionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.contains('\0') {
            return Err(OptionError::Nul(s.to_owned()));
        }
        let (key, value) = match s.split_once('=') {
            Some((k, v)) => (k, Some(v.to_owned())),
            None => (s, None),
        };
        let (plugin, name) = key
            .split_once('.')
            .ok_or_else(|| OptionError::NoNamespace(s.to_owned()))?;
        if plugin.is_empty() {
            return Err(OptionError::EmptyPlugin(s.to_owned()));
        }
        if name.is_empty() {
            return Err(OptionError::EmptyName(s.to_owned()));
        }
        Ok(Self {
            plugin: plugin.to_owned(),
            name: name.to_owned(),
            value,
        })
    }
}

impl fmt::Display for PluginOption {
    /// The argv form, `--PLUGIN.NAME[=VALUE]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{}.{}", self.plugin, self.name)?;
        if let Some(v) = &self.value {
            write!(f, "={v}")?;
        }
        Ok(())
    }
}

/// The full vector a plugin receives (without the terminating NULL).
#[must_use]
pub fn argv(options: &[PluginOption]) -> Vec<String> {
    std::iter::once(ARGV0.to_owned())
        .chain(options.iter().map(ToString::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_value_flag_and_empty_value() {
        let o: PluginOption = "cuda_plugin.backend=auto".parse().unwrap();
        assert_eq!(o.plugin, "cuda_plugin");
        assert_eq!(o.name, "backend");
        assert_eq!(o.value.as_deref(), Some("auto"));
        assert_eq!(o.to_string(), "--cuda_plugin.backend=auto");

        let o: PluginOption = "p.flag".parse().unwrap();
        assert_eq!(o.value, None);
        assert_eq!(o.to_string(), "--p.flag");

        let o: PluginOption = "p.x=".parse().unwrap();
        assert_eq!(o.to_string(), "--p.x=");

        // The first '.' and the first '=' split; later ones belong to the name and the value.
        let o: PluginOption = "p.a.b=c=d.e".parse().unwrap();
        assert_eq!((o.plugin.as_str(), o.name.as_str()), ("p", "a.b"));
        assert_eq!(o.value.as_deref(), Some("c=d.e"));
    }

    #[test]
    fn rejects_malformed() {
        assert!(matches!(
            "backend=auto".parse::<PluginOption>(),
            Err(OptionError::NoNamespace(_))
        ));
        assert!(matches!(
            "x=a.b".parse::<PluginOption>(),
            Err(OptionError::NoNamespace(_))
        ));
        assert!(matches!(
            ".x".parse::<PluginOption>(),
            Err(OptionError::EmptyPlugin(_))
        ));
        assert!(matches!(
            "p.".parse::<PluginOption>(),
            Err(OptionError::EmptyName(_))
        ));
        assert!(matches!(
            "p.=v".parse::<PluginOption>(),
            Err(OptionError::EmptyName(_))
        ));
    }

    #[test]
    fn argv_keeps_order_and_repeats() {
        let opts: Vec<PluginOption> = ["a.x=1", "b.y", "a.x=2"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(argv(&opts), ["criu-plugin", "--a.x=1", "--b.y", "--a.x=2"]);
        assert_eq!(argv(&[]), ["criu-plugin"]);
    }
}
