//! The image inventory: the harness's `inventory.json` and the in-memory required-plugin list.
//!
//! On dump, `add_inventory_plugin(name)` prepends to the list (CRIU's `list_add`, no
//! de-duplication) and the list is written to the image's inventory. On restore the names are read
//! back before any plugin loads; `check_and_remove_inventory_plugin` consumes one entry and, after
//! every plugin's `init`, any entry left fails the restore ("Missing required plugin").
//!
//! Matching follows the rule set: CRIU 4.1 compares `strncmp(name, entry, n)` (so a name is also
//! found as a prefix of a longer entry); the newer rules compare exactly. An image whose inventory
//! has no plugin list at all (`plugins` absent) is in compatibility mode: every query succeeds.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::profile::Rules;

/// The file name of the harness's inventory inside an image directory.
pub const FILE_NAME: &str = "inventory.json";
/// The `format` tag of [`InventoryFile`].
pub const FORMAT: &str = "criu-cuda-harness-inventory";
/// The current version of [`InventoryFile`].
pub const VERSION: u32 = 1;

/// One task of the dumped tree, in pstree (DFS pre-) order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskEntry {
    /// The pid (the harness resumes the same task on restore).
    pub pid: i32,
    /// Index of the parent in the task list; `None` for the root.
    pub parent: Option<usize>,
    /// Start time in clock ticks (`/proc/PID/stat` field 22), to detect pid reuse.
    pub start_time: u64,
    /// A zombie is collected but gets no CHECKPOINT_DEVICES / RESUME_DEVICES_LATE.
    pub zombie: bool,
}

/// `inventory.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`] when written by this harness.
    pub version: u32,
    /// The host profile that wrote it.
    pub host: String,
    /// `dump` or `pre-dump`.
    pub stage: String,
    /// Whether plugin images went through the emulated image streamer.
    pub stream: bool,
    /// `opts.final_state` of the dump (1 alive, 2 dead, 3 stopped).
    pub final_state: i32,
    /// The dumped tree.
    pub tasks: Vec<TaskEntry>,
    /// Required plugins, in the order CRIU writes them (reverse order of addition). `None`
    /// emulates an image from before the plugin list existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins: Option<Vec<String>>,
}

/// Reading or writing `inventory.json` failed.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// I/O.
    #[error("failed to access {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Malformed JSON or unknown keys.
    #[error("failed to parse {path}")]
    Parse {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Written by something else.
    #[error("{path} is not a harness inventory (format `{format}`, version {version})")]
    Format {
        /// The file.
        path: String,
        /// The format found.
        format: String,
        /// The version found.
        version: u32,
    },
}

impl InventoryFile {
    /// Reads and validates `dir/inventory.json`.
    ///
    /// # Errors
    /// When the file is missing, malformed or of another format or version.
    pub fn read(dir: &Path) -> Result<Self, InventoryError> {
        let path = dir.join(FILE_NAME);
        let p = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| InventoryError::Io {
            path: p.clone(),
            source,
        })?;
        let inv: Self = serde_json::from_str(&text).map_err(|source| InventoryError::Parse {
            path: p.clone(),
            source,
        })?;
        if inv.format != FORMAT || inv.version != VERSION {
            return Err(InventoryError::Format {
                path: p,
                format: inv.format,
                version: inv.version,
            });
        }
        Ok(inv)
    }

    /// Writes `dir/inventory.json`.
    ///
    /// # Errors
    /// On I/O failure.
    pub fn write(&self, dir: &Path) -> Result<(), InventoryError> {
        let path = dir.join(FILE_NAME);
        let text = serde_json::to_string_pretty(self).expect("an inventory always serialises");
        std::fs::write(&path, text + "\n").map_err(|source| InventoryError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}

/// The in-memory plugin list (`inventory_plugins_list` and `n_inventory_plugins`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginList {
    /// `None`: compatibility mode (CRIU's count of -1).
    entries: Option<Vec<String>>,
}

impl PluginList {
    /// An empty list (dump side, or a restore image that lists no plugin).
    #[must_use]
    pub const fn new() -> Self {
        Self {
            entries: Some(Vec::new()),
        }
    }

    /// The restore-side list loaded from an inventory's `plugins` (as CRIU re-adds each name with
    /// `add_inventory_plugin`, which prepends, the in-memory order is the file order reversed).
    #[must_use]
    pub fn from_image(plugins: Option<&[String]>) -> Self {
        Self {
            entries: plugins.map(|p| p.iter().rev().cloned().collect()),
        }
    }

    /// `add_inventory_plugin`: prepends, without de-duplication.
    pub fn add(&mut self, name: &str) {
        self.entries
            .get_or_insert_with(Vec::new)
            .insert(0, name.to_owned());
    }

    /// The names in list order (what CRIU writes to the image).
    #[must_use]
    pub fn names(&self) -> Option<&[String]> {
        self.entries.as_deref()
    }

    /// `check_and_remove_inventory_plugin(name, n)` under `rules`. Under CRIU 4.1 rules `name` is
    /// compared with `strncmp(name, entry, n)`; under the newer rules `n` is ignored and the match
    /// is exact. The first matching entry is consumed.
    pub fn check_and_remove(&mut self, rules: Rules, name: &[u8], n: usize) -> bool {
        let Some(entries) = self.entries.as_mut() else {
            return true;
        };
        let pos = entries.iter().position(|e| match rules {
            Rules::Criu41 => strncmp_eq(name, e.as_bytes(), n),
            Rules::Newer => e.as_bytes() == name,
        });
        match pos {
            Some(i) => {
                entries.remove(i);
                true
            }
            None => false,
        }
    }

    /// `has_inventory_plugin(name)`: exact and non-destructive.
    #[must_use]
    pub fn has(&self, name: &[u8]) -> bool {
        match &self.entries {
            None => true,
            Some(e) => e.iter().any(|e| e.as_bytes() == name),
        }
    }

    /// The entries no plugin claimed (empty in compatibility mode).
    #[must_use]
    pub fn unclaimed(&self) -> &[String] {
        self.entries.as_deref().unwrap_or(&[])
    }
}

/// `strncmp(a, b, n) == 0` for NUL-free byte strings (a string's end compares as NUL).
fn strncmp_eq(a: &[u8], b: &[u8], n: usize) -> bool {
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        if x != y {
            return false;
        }
        if x == 0 {
            return true;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strncmp_semantics() {
        assert!(strncmp_eq(b"cuda_plugin", b"cuda_plugin_v2", 11));
        assert!(!strncmp_eq(b"cuda_plugin", b"cuda_plugin_v2", 12));
        assert!(strncmp_eq(b"cuda_plugin", b"cuda_plugin", 12));
        assert!(strncmp_eq(b"cu", b"cuda", 2));
        assert!(strncmp_eq(b"abc", b"xyz", 0));
        assert!(!strncmp_eq(b"cuda", b"cu", 4));
    }

    #[test]
    fn prefix_match_under_41_rules_consumes_longer_entry() {
        let mut l = PluginList::from_image(Some(&["cuda_plugin_v2".to_owned()]));
        assert!(l.check_and_remove(Rules::Criu41, b"cuda_plugin", 11));
        assert!(l.unclaimed().is_empty());
    }

    #[test]
    fn exact_match_under_newer_rules() {
        let mut l = PluginList::from_image(Some(&["cuda_plugin_v2".to_owned()]));
        assert!(!l.check_and_remove(Rules::Newer, b"cuda_plugin", 11));
        assert!(!l.has(b"cuda_plugin"));
        assert!(l.has(b"cuda_plugin_v2"));
        assert!(l.check_and_remove(Rules::Newer, b"cuda_plugin_v2", 0));
        assert!(l.unclaimed().is_empty());
    }

    #[test]
    fn compat_mode_allows_everything() {
        let mut l = PluginList::from_image(None);
        assert!(l.has(b"x"));
        assert!(l.check_and_remove(Rules::Newer, b"x", 1));
        assert!(l.unclaimed().is_empty());
    }

    #[test]
    fn add_prepends_without_dedup() {
        let mut l = PluginList::new();
        l.add("a");
        l.add("b");
        l.add("a");
        assert_eq!(l.names().unwrap(), ["a", "b", "a"]);
        let back = PluginList::from_image(l.names());
        assert_eq!(back.names().unwrap(), ["a", "b", "a"]);
        let mut back = back;
        assert!(back.check_and_remove(Rules::Newer, b"a", 0));
        assert_eq!(back.unclaimed(), ["b", "a"]);
    }

    #[test]
    fn file_round_trip_and_strictness() {
        let dir = tempfile::tempdir().unwrap();
        let inv = InventoryFile {
            format: FORMAT.to_owned(),
            version: VERSION,
            host: "4.1".to_owned(),
            stage: "dump".to_owned(),
            stream: false,
            final_state: 2,
            tasks: vec![TaskEntry {
                pid: 1,
                parent: None,
                start_time: 5,
                zombie: false,
            }],
            plugins: Some(vec!["a".to_owned()]),
        };
        inv.write(dir.path()).unwrap();
        assert_eq!(InventoryFile::read(dir.path()).unwrap(), inv);
        std::fs::write(dir.path().join(FILE_NAME), r#"{"format":"x","bogus":1}"#).unwrap();
        assert!(matches!(
            InventoryFile::read(dir.path()),
            Err(InventoryError::Parse { .. })
        ));
    }
}
