//! The `device-map=` option, resolved into GPU pairs for restore.
//!
//! **Provisional.** The device-map issue defines the option's full grammar; until then this module
//! accepts the form `cuda-checkpoint --device-map` takes: comma-separated `OLD=NEW` pairs of full
//! GPU UUIDs (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), and an empty value meaning "no map".
//! The rest of the plugin only sees the resolved `&[(GpuUuid, GpuUuid)]`.

use crate::backend::GpuPair;
use abi::{GpuUuid, UuidParseError};

/// Why a device map is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceMapError {
    #[error(
        "invalid value {value:?} for option cuda_plugin.device-map: entry {entry:?} is not OLD=NEW"
    )]
    Entry { value: String, entry: String },
    #[error("invalid value {value:?} for option cuda_plugin.device-map: {cause}")]
    Uuid {
        value: String,
        cause: UuidParseError,
    },
    #[error("invalid value {value:?} for option cuda_plugin.device-map: {uuid} is mapped twice")]
    Duplicate { value: String, uuid: GpuUuid },
}

/// Resolves the raw option value into pairs.
pub fn resolve(value: &str) -> Result<Vec<GpuPair>, DeviceMapError> {
    let mut pairs: Vec<GpuPair> = Vec::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (old, new) = entry.split_once('=').ok_or_else(|| DeviceMapError::Entry {
            value: value.to_owned(),
            entry: entry.to_owned(),
        })?;
        let parse = |s: &str| {
            GpuUuid::parse(s.trim()).map_err(|cause| DeviceMapError::Uuid {
                value: value.to_owned(),
                cause,
            })
        };
        let (old, new) = (parse(old)?, parse(new)?);
        if pairs.iter().any(|(o, _)| *o == old) {
            return Err(DeviceMapError::Duplicate {
                value: value.to_owned(),
                uuid: old,
            });
        }
        pairs.push((old, new));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_pairs_and_rejects_malformed_entries() {
        let a = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";
        let b = "GPU-00000000-0000-0000-0000-000000000001";
        let p = resolve(&format!("{a}={b},{b}={a}")).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].0.to_string(), a);
        assert_eq!(resolve("").unwrap(), vec![]);
        assert!(matches!(resolve(a), Err(DeviceMapError::Entry { .. })));
        assert!(matches!(
            resolve(&format!("{a}=GPU-1")),
            Err(DeviceMapError::Uuid { .. })
        ));
        assert!(matches!(
            resolve(&format!("{a}={b},{a}={a}")),
            Err(DeviceMapError::Duplicate { .. })
        ));
    }
}
