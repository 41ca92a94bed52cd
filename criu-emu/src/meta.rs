//! Declarative plugin option metadata: the `CR_PLUGIN_OPTIONS_META` symbol.
//!
//! A plugin may export, next to `CR_PLUGIN_DESC`, a description of the `--plugin-option`s it
//! understands, so tools (`harness plugins`, a future `criu --help`) can list them without calling
//! `init`. The layout (x86_64, all pointers to NUL-terminated static strings):
//!
//! ```c
//! struct cr_plugin_option_meta {          /* 32 bytes */
//!         const char *name;               /* +0  "backend" (without "PLUGIN.") */
//!         const char *value_syntax;       /* +8  "auto|driver-api|cuda-checkpoint"; NULL: bare flag */
//!         const char *default_value;      /* +16 NULL: no default */
//!         const char *help;               /* +24 one line; may be NULL */
//! };
//! struct cr_plugin_options_meta {         /* 16 bytes */
//!         unsigned int version;           /* +0  CR_PLUGIN_OPTIONS_META_VERSION (1) */
//!         unsigned int count;             /* +4  entries in options[] */
//!         const struct cr_plugin_option_meta *options; /* +8 */
//! };
//! extern const struct cr_plugin_options_meta CR_PLUGIN_OPTIONS_META;
//! ```
//!
//! A reader must ignore (with a warning) a version it does not know; a later version may only
//! append fields to `cr_plugin_option_meta` if it also adds an entry-size field, which is why the
//! version is checked before anything else is read.

pub use abi::criu::options_meta::{
    CrPluginOptionMeta, CrPluginOptionsMeta, MAX_COUNT, SYMBOL, VERSION,
};

/// One option as read from a plugin.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OptionMeta {
    /// Option name without the plugin prefix.
    pub name: String,
    /// Value syntax; `None` for a bare flag.
    pub value_syntax: Option<String>,
    /// Default value.
    pub default_value: Option<String>,
    /// Help text.
    pub help: Option<String>,
}

/// Why a plugin's metadata could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// A version this harness does not know.
    #[error("unsupported option metadata version {0}")]
    Version(u32),
    /// `count` above [`MAX_COUNT`], or a NULL array or name.
    #[error("malformed option metadata: {0}")]
    Malformed(&'static str),
}
