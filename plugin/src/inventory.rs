//! The GPU inventory image (`cuda-gpu-inventory.img`): which GPUs the dump saw.
//!
//! Written once per dump that checkpointed at least one CUDA task, read once at restore, both
//! sequentially, so it works through CRIU's image streamer (no seek, no stat). The GPUs are
//! those of CRIU's own view, enumerated with `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER`
//! ignored (every GPU, in the driver's default order), so neither the operator's nor the target's
//! settings reorder it.
//!
//! # Format (all integers little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `CUDAINV\n` |
//! | 8 | 4 | schema version, [`SCHEMA_VERSION`] |
//! | 12 | 4 | payload length in bytes, at most [`MAX_PAYLOAD`] |
//! | 16 | n | payload |
//!
//! Payload (schema 1): `u32 count`, then `count` records of `u32 ordinal`, `16 bytes UUID`,
//! `u64 memory bytes`, `u16 name length` (at most [`MAX_NAME`]) and the name in UTF-8. The
//! payload must be consumed exactly and nothing may follow it. Ordinals are `0..count` in
//! order and UUIDs are distinct.
//!
//! Everything is validated before any task is touched; each failure names what is wrong.

use abi::GpuUuid;
use std::io::{Read, Write};

/// The image's file name (flat, as the streamer needs).
pub const FILE_NAME: &str = "cuda-gpu-inventory.img";
/// The magic at the start of the image.
pub const MAGIC: [u8; 8] = *b"CUDAINV\n";
/// The schema this plugin writes and reads.
pub const SCHEMA_VERSION: u32 = 1;
/// Largest payload accepted (far above any real GPU count), checked before reading it.
pub const MAX_PAYLOAD: u32 = 64 * 1024;
/// The largest inventory image read: the header and the largest payload.
pub const MAX_IMAGE_BYTES: usize = 16 + MAX_PAYLOAD as usize;
/// Longest GPU name accepted.
pub const MAX_NAME: usize = 256;
/// Most GPUs an inventory may list.
pub const MAX_GPUS: u32 = 1024;

/// One GPU as CUDA enumerates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Device ordinal in the enumerating process's view.
    pub ordinal: u32,
    pub uuid: GpuUuid,
    /// `cuDeviceGetName`: the model.
    pub name: String,
    /// `cuDeviceTotalMem`.
    pub memory_bytes: u64,
}

/// Why an inventory image is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    #[error("GPU inventory image {FILE_NAME}: bad magic {found:02x?} (not a GPU inventory)")]
    Magic { found: Vec<u8> },
    #[error("GPU inventory image {FILE_NAME}: schema version {found} is not supported (this plugin reads {SCHEMA_VERSION})")]
    Version { found: u32 },
    #[error("GPU inventory image {FILE_NAME}: payload of {len} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    Oversized { len: u32 },
    #[error("GPU inventory image {FILE_NAME}: truncated ({what})")]
    Truncated { what: &'static str },
    #[error("GPU inventory image {FILE_NAME}: {extra} byte(s) after the payload")]
    Trailing { extra: usize },
    #[error("GPU inventory image {FILE_NAME}: malformed GPU entry {index}: {reason}")]
    Entry { index: u32, reason: String },
    #[error("GPU inventory image {FILE_NAME}: GPU {uuid} is listed twice (entries {first} and {second})")]
    Duplicate {
        uuid: GpuUuid,
        first: u32,
        second: u32,
    },
    #[error("GPU inventory image {FILE_NAME}: {0}")]
    Io(String),
}

/// Checks the invariants every inventory holds (also before writing one).
pub fn validate(gpus: &[GpuInfo]) -> Result<(), InventoryError> {
    if gpus.len() > MAX_GPUS as usize {
        return Err(InventoryError::Entry {
            index: MAX_GPUS,
            reason: format!("more than {MAX_GPUS} GPUs"),
        });
    }
    for (i, g) in gpus.iter().enumerate() {
        let index = i as u32;
        if g.ordinal != index {
            return Err(InventoryError::Entry {
                index,
                reason: format!("ordinal {} where {index} was expected", g.ordinal),
            });
        }
        if g.name.is_empty() || g.name.len() > MAX_NAME || g.name.chars().any(char::is_control) {
            return Err(InventoryError::Entry {
                index,
                reason: format!("GPU name {:?} is empty, longer than {MAX_NAME} bytes or has control characters", g.name),
            });
        }
        if let Some(first) = gpus[..i].iter().position(|o| o.uuid == g.uuid) {
            return Err(InventoryError::Duplicate {
                uuid: g.uuid,
                first: first as u32,
                second: index,
            });
        }
    }
    Ok(())
}

/// The image bytes for `gpus`.
pub fn encode(gpus: &[GpuInfo]) -> Result<Vec<u8>, InventoryError> {
    validate(gpus)?;
    let mut payload = Vec::new();
    payload.extend_from_slice(&(gpus.len() as u32).to_le_bytes());
    for g in gpus {
        payload.extend_from_slice(&g.ordinal.to_le_bytes());
        payload.extend_from_slice(&g.uuid.0);
        payload.extend_from_slice(&g.memory_bytes.to_le_bytes());
        payload.extend_from_slice(&(g.name.len() as u16).to_le_bytes());
        payload.extend_from_slice(g.name.as_bytes());
    }
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or(InventoryError::Oversized {
            len: u32::try_from(payload.len()).unwrap_or(u32::MAX),
        })?;
    let mut out = Vec::with_capacity(16 + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&SCHEMA_VERSION.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Writes the image to `w` in one sequential pass.
pub fn write(w: &mut dyn Write, gpus: &[GpuInfo]) -> Result<(), InventoryError> {
    let bytes = encode(gpus)?;
    w.write_all(&bytes)
        .and_then(|()| w.flush())
        .map_err(|e| InventoryError::Io(format!("writing: {e}")))
}

fn read_exact(r: &mut dyn Read, buf: &mut [u8], what: &'static str) -> Result<(), InventoryError> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => return Err(InventoryError::Truncated { what }),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(InventoryError::Io(format!("reading {what}: {e}"))),
        }
    }
    Ok(())
}

/// Reads and validates an image from `r` in one sequential pass (to its end).
pub fn read(r: &mut dyn Read) -> Result<Vec<GpuInfo>, InventoryError> {
    let mut head = [0u8; 16];
    read_exact(r, &mut head[..8], "magic")?;
    if head[..8] != MAGIC {
        return Err(InventoryError::Magic {
            found: head[..8].to_vec(),
        });
    }
    read_exact(r, &mut head[8..16], "header")?;
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if version != SCHEMA_VERSION {
        return Err(InventoryError::Version { found: version });
    }
    let len = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(InventoryError::Oversized { len });
    }
    let mut payload = vec![0u8; len as usize];
    read_exact(r, &mut payload, "payload")?;
    let mut extra = [0u8; 64];
    let mut trailing = 0;
    loop {
        match r.read(&mut extra) {
            Ok(0) => break,
            Ok(n) => trailing += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(InventoryError::Io(format!("reading past the payload: {e}"))),
        }
    }
    if trailing > 0 {
        return Err(InventoryError::Trailing { extra: trailing });
    }
    decode_payload(&payload)
}

/// Decodes a schema-1 payload.
pub fn decode_payload(p: &[u8]) -> Result<Vec<GpuInfo>, InventoryError> {
    let mut at = 0usize;
    let mut take = |n: usize, what: &'static str| -> Result<&[u8], InventoryError> {
        let s = p
            .get(at..at + n)
            .ok_or(InventoryError::Truncated { what })?;
        at += n;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4, "GPU count")?.try_into().expect("4 bytes"));
    if count > MAX_GPUS {
        return Err(InventoryError::Entry {
            index: 0,
            reason: format!("{count} GPUs exceed the limit of {MAX_GPUS}"),
        });
    }
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let ordinal = u32::from_le_bytes(take(4, "GPU ordinal")?.try_into().expect("4 bytes"));
        let uuid = GpuUuid(take(16, "GPU UUID")?.try_into().expect("16 bytes"));
        let memory_bytes = u64::from_le_bytes(take(8, "GPU memory")?.try_into().expect("8 bytes"));
        let name_len =
            u16::from_le_bytes(take(2, "GPU name length")?.try_into().expect("2 bytes")) as usize;
        if name_len > MAX_NAME {
            return Err(InventoryError::Entry {
                index,
                reason: format!("name of {name_len} bytes exceeds {MAX_NAME}"),
            });
        }
        let name = std::str::from_utf8(take(name_len, "GPU name")?)
            .map_err(|_| InventoryError::Entry {
                index,
                reason: "name is not UTF-8".into(),
            })?
            .to_owned();
        gpus.push(GpuInfo {
            ordinal,
            uuid,
            name,
            memory_bytes,
        });
    }
    if at != p.len() {
        return Err(InventoryError::Trailing {
            extra: p.len() - at,
        });
    }
    validate(&gpus)?;
    Ok(gpus)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn gpu(ordinal: u32, last: u8, name: &str) -> GpuInfo {
        let mut b = [0x11u8; 16];
        b[15] = last;
        GpuInfo {
            ordinal,
            uuid: GpuUuid(b),
            name: name.into(),
            memory_bytes: 80 << 30,
        }
    }

    #[test]
    fn round_trips_and_rejects_each_defect_by_name() {
        let gpus = vec![
            gpu(0, 1, "NVIDIA H100 80GB HBM3"),
            gpu(1, 2, "NVIDIA H100 80GB HBM3"),
        ];
        let bytes = encode(&gpus).unwrap();
        assert_eq!(read(&mut &bytes[..]).unwrap(), gpus);
        assert_eq!(read(&mut &encode(&[]).unwrap()[..]).unwrap(), vec![]);

        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(
            read(&mut &bad[..]),
            Err(InventoryError::Magic { .. })
        ));
        let mut bad = bytes.clone();
        bad[8] = 2;
        assert_eq!(
            read(&mut &bad[..]),
            Err(InventoryError::Version { found: 2 })
        );
        let mut bad = bytes.clone();
        bad[12..16].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert_eq!(
            read(&mut &bad[..]),
            Err(InventoryError::Oversized {
                len: MAX_PAYLOAD + 1
            })
        );
        assert!(matches!(
            read(&mut &bytes[..bytes.len() - 3]),
            Err(InventoryError::Truncated { what: "payload" })
        ));
        let mut bad = bytes.clone();
        bad.push(0);
        assert_eq!(
            read(&mut &bad[..]),
            Err(InventoryError::Trailing { extra: 1 })
        );
        let dup = vec![gpu(0, 1, "A"), gpu(1, 1, "A")];
        assert!(matches!(
            encode(&dup),
            Err(InventoryError::Duplicate {
                first: 0,
                second: 1,
                ..
            })
        ));
        let gap = vec![gpu(0, 1, "A"), gpu(2, 2, "A")];
        let e = encode(&gap).unwrap_err().to_string();
        assert!(e.contains("entry 1") && e.contains("ordinal 2"), "{e}");
        // A duplicate smuggled past the encoder is still caught on read.
        let mut raw = encode(&[gpu(0, 1, "A"), gpu(1, 2, "A")]).unwrap();
        let second_uuid = 16 + 4 + (4 + 16 + 8 + 2 + 1) + 4;
        raw[second_uuid + 15] = 1;
        assert!(matches!(
            read(&mut &raw[..]),
            Err(InventoryError::Duplicate { .. })
        ));
    }

    fn any_inventory() -> impl Strategy<Value = Vec<GpuInfo>> {
        proptest::collection::vec(
            (any::<[u8; 16]>(), "[A-Za-z0-9 ]{1,40}", any::<u64>()),
            0..8,
        )
        .prop_map(|v| {
            let mut seen = std::collections::HashSet::new();
            v.into_iter()
                .filter(|(u, _, _)| seen.insert(*u))
                .enumerate()
                .map(|(i, (u, n, m))| GpuInfo {
                    ordinal: i as u32,
                    uuid: GpuUuid(u),
                    name: n,
                    memory_bytes: m,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn decode_of_encode_is_identity(gpus in any_inventory()) {
            let bytes = encode(&gpus).unwrap();
            prop_assert_eq!(read(&mut &bytes[..]).unwrap(), gpus);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = read(&mut &bytes[..]);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&SCHEMA_VERSION.to_le_bytes());
            framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            framed.extend_from_slice(&bytes);
            if let Ok(g) = read(&mut &framed[..]) {
                prop_assert!(validate(&g).is_ok());
            }
        }
    }
}
