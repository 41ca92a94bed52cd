//! `cuda_plugin.device-map`: which current GPU each checkpointed GPU is restored onto.
//!
//! # Grammar
//!
//! * `auto`: checkpointed GPUs go to the current GPU with the same UUID where it exists, else
//!   to the current GPU with the same ordinal; the result must be a complete one-to-one map of
//!   same-model GPUs. This is also what happens when the option is absent and the image has an
//!   inventory.
//! * A UUID map `GPU-old=GPU-new,...`: every checkpointed GPU exactly once. Unique prefixes
//!   (`GPU-8932f937`) are accepted on either side, as the driver accepts them in
//!   `CUDA_VISIBLE_DEVICES`: the old side is resolved against the image's inventory, the new
//!   side against the current GPUs. Without an inventory (an image from before it existed)
//!   only full UUIDs are accepted on the old side and the map is taken as complete.
//! * An ordinal map `0=1,1=0`: checkpoint ordinal = current ordinal. Needs an inventory.
//!
//! The resolution is done once, into backend-neutral UUID pairs in checkpoint order
//! ([`Resolved`]); the driver API receives them as `CUcheckpointRestoreArgs` GPU pairs and
//! `cuda-checkpoint` as one canonical `--device-map` value ([`Resolved::cli_value`]), so both
//! backends get the identical map. Every rejection names the offending entry.

use crate::inventory::GpuInfo;
use abi::GpuUuid;
use std::fmt;

/// A parsed `device-map` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapSpec {
    Auto,
    /// (old, new) UUIDs or unique prefixes, as written.
    Uuids(Vec<(String, String)>),
    /// (checkpoint ordinal, current ordinal).
    Ordinals(Vec<(u32, u32)>),
}

/// Why a device map is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("cuda_plugin.device-map: {0}")]
    Syntax(String),
    #[error("cuda_plugin.device-map entry {entry:?}: {reason}")]
    Entry { entry: String, reason: String },
    #[error(
        "cuda_plugin.device-map: checkpointed GPU {uuid} (ordinal {ordinal}, {name}) is not mapped"
    )]
    Uncovered {
        uuid: GpuUuid,
        ordinal: u32,
        name: String,
    },
    #[error("cuda_plugin.device-map: the image has no GPU inventory (dumped by an older plugin): only a complete map of full GPU UUIDs can be used, not {what}")]
    NoInventory { what: &'static str },
    #[error("cuda_plugin.device-map: automatic mapping failed: {0}")]
    Auto(String),
}

fn entry_err(entry: &str, reason: impl Into<String>) -> MapError {
    MapError::Entry {
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

fn is_uuidish(s: &str) -> bool {
    s.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-"))
}

impl MapSpec {
    /// Parses the option value.
    pub fn parse(value: &str) -> Result<MapSpec, MapError> {
        let v = value.trim();
        if v.eq_ignore_ascii_case("auto") {
            return Ok(MapSpec::Auto);
        }
        if v.is_empty() {
            return Err(MapError::Syntax(
                "empty value (use auto, GPU-old=GPU-new,... or old=new ordinals)".into(),
            ));
        }
        let mut uuids = Vec::new();
        let mut ordinals = Vec::new();
        for entry in v.split(',') {
            let e = entry.trim();
            let (a, b) = e
                .split_once('=')
                .map(|(a, b)| (a.trim(), b.trim()))
                .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains('='))
                .ok_or_else(|| entry_err(e, "expected OLD=NEW"))?;
            match (is_uuidish(a), is_uuidish(b)) {
                (true, true) => {
                    for side in [a, b] {
                        if side.len() <= 4
                            || !side[4..].chars().all(|c| c.is_ascii_hexdigit() || c == '-')
                            || side.len() > abi::uuid::TEXT_LEN
                        {
                            return Err(entry_err(
                                e,
                                format!("{side:?} is not a GPU UUID or a prefix of one"),
                            ));
                        }
                    }
                    uuids.push((
                        a.to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
                        b.to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
                    ));
                }
                (false, false) => {
                    let n = |s: &str| {
                        s.parse::<u32>().map_err(|_| {
                            entry_err(e, format!("{s:?} is neither an ordinal nor a GPU UUID"))
                        })
                    };
                    ordinals.push((n(a)?, n(b)?));
                }
                _ => return Err(entry_err(e, "mixes an ordinal and a UUID")),
            }
        }
        match (uuids.is_empty(), ordinals.is_empty()) {
            (false, true) => Ok(MapSpec::Uuids(uuids)),
            (true, false) => Ok(MapSpec::Ordinals(ordinals)),
            _ => Err(MapError::Syntax(format!(
                "{v:?} mixes UUID and ordinal entries"
            ))),
        }
    }
}

impl fmt::Display for MapSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapSpec::Auto => f.write_str("auto"),
            MapSpec::Uuids(v) => {
                let parts: Vec<String> = v.iter().map(|(a, b)| format!("{a}={b}")).collect();
                f.write_str(&parts.join(","))
            }
            MapSpec::Ordinals(v) => {
                let parts: Vec<String> = v.iter().map(|(a, b)| format!("{a}={b}")).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

/// A resolved map: (checkpointed GPU, current GPU) pairs in checkpoint order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    pub pairs: Vec<(GpuUuid, GpuUuid)>,
}

impl Resolved {
    /// True when every GPU maps to itself (nothing to pass to the driver).
    #[must_use]
    pub fn is_identity(&self) -> bool {
        self.pairs.iter().all(|(a, b)| a == b)
    }

    /// The canonical `--device-map` value: full lowercase UUIDs, checkpoint order.
    #[must_use]
    pub fn cli_value(&self) -> String {
        let parts: Vec<String> = self.pairs.iter().map(|(a, b)| format!("{a}={b}")).collect();
        parts.join(",")
    }
}

/// Resolves `text` (a full UUID or a unique prefix) among `gpus`.
fn find_uuid<'a>(
    entry: &str,
    text: &str,
    gpus: &'a [GpuInfo],
    side: &str,
) -> Result<&'a GpuInfo, MapError> {
    let hits: Vec<&GpuInfo> = gpus
        .iter()
        .filter(|g| g.uuid.has_text_prefix(text))
        .collect();
    match hits.as_slice() {
        [one] => Ok(one),
        [] => Err(entry_err(entry, format!("no {side} GPU matches {text}"))),
        many => Err(entry_err(
            entry,
            format!("{text} is ambiguous among {} {side} GPUs", many.len()),
        )),
    }
}

fn find_ordinal<'a>(
    entry: &str,
    n: u32,
    gpus: &'a [GpuInfo],
    side: &str,
) -> Result<&'a GpuInfo, MapError> {
    gpus.iter().find(|g| g.ordinal == n).ok_or_else(|| {
        entry_err(
            entry,
            format!(
                "there is no {side} GPU with ordinal {n} ({} {side} GPU(s))",
                gpus.len()
            ),
        )
    })
}

/// Checks one pair for model agreement and repeats, and records it.
fn add_pair(
    out: &mut Vec<(GpuUuid, GpuUuid)>,
    entry: &str,
    old: &GpuInfo,
    new: &GpuInfo,
) -> Result<(), MapError> {
    if old.name != new.name {
        return Err(entry_err(
            entry,
            format!(
                "model mismatch: checkpointed {} is {:?}, current {} is {:?}",
                old.uuid, old.name, new.uuid, new.name
            ),
        ));
    }
    if out.iter().any(|(o, _)| *o == old.uuid) {
        return Err(entry_err(
            entry,
            format!("checkpointed GPU {} is mapped twice", old.uuid),
        ));
    }
    if let Some((o, _)) = out.iter().find(|(_, n)| *n == new.uuid) {
        return Err(entry_err(
            entry,
            format!("current GPU {} is already the target of {o}", new.uuid),
        ));
    }
    out.push((old.uuid, new.uuid));
    Ok(())
}

/// Puts pairs into checkpoint order and checks every checkpointed GPU is covered.
fn complete(inventory: &[GpuInfo], pairs: Vec<(GpuUuid, GpuUuid)>) -> Result<Resolved, MapError> {
    let mut ordered = Vec::with_capacity(inventory.len());
    for g in inventory {
        match pairs.iter().find(|(o, _)| *o == g.uuid) {
            Some(p) => ordered.push(*p),
            None => {
                return Err(MapError::Uncovered {
                    uuid: g.uuid,
                    ordinal: g.ordinal,
                    name: g.name.clone(),
                })
            }
        }
    }
    Ok(Resolved { pairs: ordered })
}

/// Resolves a map against the image's inventory (`None` for images from before it) and the
/// current GPUs. `spec` `None` means the option was not given.
pub fn resolve(
    spec: Option<&MapSpec>,
    inventory: Option<&[GpuInfo]>,
    current: &[GpuInfo],
) -> Result<Resolved, MapError> {
    let auto = MapSpec::Auto;
    let spec = match (spec, inventory) {
        (None, None) => return Ok(Resolved::default()),
        (None, Some(_)) => &auto,
        (Some(s), _) => s,
    };
    match spec {
        MapSpec::Auto => {
            let inv = inventory.ok_or(MapError::NoInventory { what: "auto" })?;
            let mut pairs = Vec::new();
            for g in inv {
                let new = current
                    .iter()
                    .find(|c| c.uuid == g.uuid)
                    .or_else(|| current.iter().find(|c| c.ordinal == g.ordinal && !inv.iter().any(|i| i.uuid == c.uuid)))
                    .ok_or_else(|| MapError::Auto(format!("checkpointed GPU {} (ordinal {}, {}) has no counterpart among the {} current GPU(s)", g.uuid, g.ordinal, g.name, current.len())))?;
                add_pair(&mut pairs, &format!("{}=auto", g.uuid), g, new)
                    .map_err(|e| MapError::Auto(e.to_string()))?;
            }
            complete(inv, pairs)
        }
        MapSpec::Ordinals(v) => {
            let inv = inventory.ok_or(MapError::NoInventory {
                what: "an ordinal map",
            })?;
            let mut pairs = Vec::new();
            for (a, b) in v {
                let e = format!("{a}={b}");
                let old = find_ordinal(&e, *a, inv, "checkpointed")?;
                let new = find_ordinal(&e, *b, current, "current")?;
                add_pair(&mut pairs, &e, old, new)?;
            }
            complete(inv, pairs)
        }
        MapSpec::Uuids(v) => {
            let mut pairs = Vec::new();
            for (a, b) in v {
                let e = format!("{a}={b}");
                let new = find_uuid(&e, b, current, "current")?;
                match inventory {
                    Some(inv) => {
                        let old = find_uuid(&e, a, inv, "checkpointed")?;
                        add_pair(&mut pairs, &e, old, new)?;
                    }
                    None => {
                        let old = GpuUuid::parse(a).map_err(|_| MapError::NoInventory {
                            what: "a UUID prefix on the checkpoint side",
                        })?;
                        // No inventory: the model cannot be checked, only repeats.
                        let stand_in = GpuInfo {
                            ordinal: 0,
                            uuid: old,
                            name: new.name.clone(),
                            memory_bytes: 0,
                        };
                        add_pair(&mut pairs, &e, &stand_in, new)?;
                    }
                }
            }
            match inventory {
                Some(inv) => complete(inv, pairs),
                None => Ok(Resolved { pairs }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::tests::gpu;
    use proptest::prelude::*;

    const H100: &str = "NVIDIA H100 80GB HBM3";
    const A100: &str = "NVIDIA A100-SXM4-80GB";

    fn two(first: u8, name: &str) -> Vec<GpuInfo> {
        vec![gpu(0, first, name), gpu(1, first + 1, name)]
    }

    #[test]
    fn parses_each_form_and_names_bad_entries() {
        assert_eq!(MapSpec::parse(" auto "), Ok(MapSpec::Auto));
        assert_eq!(
            MapSpec::parse("0=1,1=0"),
            Ok(MapSpec::Ordinals(vec![(0, 1), (1, 0)]))
        );
        assert_eq!(
            MapSpec::parse("gpu-AB=GPU-cd"),
            Ok(MapSpec::Uuids(vec![("GPU-ab".into(), "GPU-cd".into())]))
        );
        for (bad, needle) in [
            ("", "empty"),
            ("0=1,GPU-ab=GPU-cd", "mixes UUID and ordinal"),
            ("0=GPU-ab", "mixes an ordinal and a UUID"),
            ("0", "expected OLD=NEW"),
            ("0=1=2", "expected OLD=NEW"),
            ("x=1", "neither an ordinal"),
            ("GPU-zz=GPU-ab", "not a GPU UUID"),
            ("GPU-=GPU-ab", "not a GPU UUID"),
        ] {
            let e = MapSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn uuid_ordinal_and_auto_maps_resolve_to_the_same_pairs() {
        let inv = two(1, H100);
        let cur = two(7, H100);
        let swapped = Resolved {
            pairs: vec![(inv[0].uuid, cur[1].uuid), (inv[1].uuid, cur[0].uuid)],
        };
        let by_uuid = MapSpec::parse(&format!(
            "{}={},{}={}",
            inv[1].uuid, cur[0].uuid, inv[0].uuid, cur[1].uuid
        ))
        .unwrap();
        assert_eq!(
            resolve(Some(&by_uuid), Some(&inv), &cur),
            Ok(swapped.clone()),
            "checkpoint order, whatever the written order"
        );
        let by_ord = MapSpec::parse("0=1,1=0").unwrap();
        assert_eq!(
            resolve(Some(&by_ord), Some(&inv), &cur),
            Ok(swapped.clone())
        );
        // Unique prefixes on both sides.
        let distinct = |ordinal: u32, byte: u8| GpuInfo {
            ordinal,
            uuid: GpuUuid([byte; 16]),
            name: H100.into(),
            memory_bytes: 1,
        };
        let (pinv, pcur) = (
            vec![distinct(0, 0xaa), distinct(1, 0xab)],
            vec![distinct(0, 0xba), distinct(1, 0xbb)],
        );
        let prefixes = MapSpec::parse("GPU-aaaa=GPU-BBBB,GPU-abab=gpu-ba").unwrap();
        assert_eq!(
            resolve(Some(&prefixes), Some(&pinv), &pcur).unwrap().pairs,
            vec![(pinv[0].uuid, pcur[1].uuid), (pinv[1].uuid, pcur[0].uuid)]
        );
        assert_eq!(
            swapped.cli_value(),
            format!(
                "{}={},{}={}",
                inv[0].uuid, cur[1].uuid, inv[1].uuid, cur[0].uuid
            )
        );
        // Another host: auto maps by ordinal.
        let auto = resolve(None, Some(&inv), &cur).unwrap();
        assert_eq!(
            auto.pairs,
            vec![(inv[0].uuid, cur[0].uuid), (inv[1].uuid, cur[1].uuid)]
        );
        // Same host, other order: auto maps by UUID.
        let reordered = vec![gpu(0, 2, H100), gpu(1, 1, H100)];
        let auto = resolve(Some(&MapSpec::Auto), Some(&inv), &reordered).unwrap();
        assert!(auto.is_identity());
        // No inventory and no option: nothing to map.
        assert_eq!(resolve(None, None, &cur), Ok(Resolved::default()));
    }

    #[test]
    fn every_invalid_map_is_refused_with_the_entry() {
        let inv = two(1, H100);
        let cur = vec![gpu(0, 7, H100), gpu(1, 8, A100), gpu(2, 9, H100)];
        let u = |g: &GpuInfo| g.uuid.to_string();
        let cases = [
            (format!("{}={}", u(&inv[0]), u(&cur[0])), "is not mapped"),
            (
                format!(
                    "{}={},{}={}",
                    u(&inv[0]),
                    u(&cur[0]),
                    u(&inv[1]),
                    u(&cur[0])
                ),
                "already the target",
            ),
            (
                format!(
                    "{}={},{}={}",
                    u(&inv[0]),
                    u(&cur[0]),
                    u(&inv[0]),
                    u(&cur[2])
                ),
                "mapped twice",
            ),
            (
                format!(
                    "{}={},{}={}",
                    u(&inv[0]),
                    u(&cur[1]),
                    u(&inv[1]),
                    u(&cur[0])
                ),
                "model mismatch",
            ),
            (
                format!("{}=GPU-99,{}={}", u(&inv[0]), u(&inv[1]), u(&cur[0])),
                "no current GPU matches GPU-99",
            ),
            (format!("GPU-1111={}", u(&cur[0])), "ambiguous"),
            ("0=5,1=0".to_owned(), "no current GPU with ordinal 5"),
            ("0=0,2=2".to_owned(), "no checkpointed GPU with ordinal 2"),
        ];
        for (text, needle) in cases {
            let e = resolve(Some(&MapSpec::parse(&text).unwrap()), Some(&inv), &cur)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
        // Fewer GPUs on this host: auto fails and says which GPU is left over.
        let e = resolve(None, Some(&inv), &cur[..1])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no counterpart"), "{e}");
    }

    #[test]
    fn images_without_inventory_accept_only_complete_uuid_maps() {
        let cur = two(7, H100);
        for (spec, what) in [("auto", "auto"), ("0=1,1=0", "an ordinal map")] {
            let e = resolve(Some(&MapSpec::parse(spec).unwrap()), None, &cur).unwrap_err();
            assert_eq!(e, MapError::NoInventory { what });
            assert!(e
                .to_string()
                .contains("only a complete map of full GPU UUIDs"));
        }
        let old = "GPU-00000000-0000-0000-0000-000000000001";
        let r = resolve(
            Some(&MapSpec::parse(&format!("{old}={}", cur[1].uuid)).unwrap()),
            None,
            &cur,
        )
        .unwrap();
        assert_eq!(r.pairs, vec![(GpuUuid::parse(old).unwrap(), cur[1].uuid)]);
        let e = resolve(
            Some(&MapSpec::parse(&format!("GPU-0000={}", cur[1].uuid)).unwrap()),
            None,
            &cur,
        )
        .unwrap_err();
        assert_eq!(
            e,
            MapError::NoInventory {
                what: "a UUID prefix on the checkpoint side"
            }
        );
    }

    fn host(n: usize, seed: u8) -> Vec<GpuInfo> {
        (0..n)
            .map(|i| gpu(i as u32, seed.wrapping_add(i as u8), H100))
            .collect()
    }

    proptest! {
        #[test]
        fn parse_of_display_is_identity(ords in proptest::collection::vec((0u32..64, 0u32..64), 1..8)) {
            let spec = MapSpec::Ordinals(ords);
            prop_assert_eq!(MapSpec::parse(&spec.to_string()), Ok(spec));
        }

        #[test]
        fn canonical_form_is_unique_and_reparses(perm in Just((0..6u32).collect::<Vec<_>>()).prop_shuffle(), n in 1usize..6) {
            let inv = host(n, 10);
            let cur = host(n, 100);
            let entries: Vec<(u32, u32)> = (0..n as u32).map(|i| (i, perm.iter().copied().filter(|&p| (p as usize) < n).nth(i as usize).unwrap())).collect();
            let by_ord = resolve(Some(&MapSpec::Ordinals(entries.clone())), Some(&inv), &cur).unwrap();
            // The same map written as UUIDs in reverse order resolves to the same canonical text.
            let uuids: Vec<(String, String)> = by_ord.pairs.iter().rev().map(|(a, b)| (a.to_string(), b.to_string())).collect();
            let by_uuid = resolve(Some(&MapSpec::Uuids(uuids)), Some(&inv), &cur).unwrap();
            prop_assert_eq!(by_ord.cli_value(), by_uuid.cli_value());
            let again = resolve(Some(&MapSpec::parse(&by_ord.cli_value()).unwrap()), Some(&inv), &cur).unwrap();
            prop_assert_eq!(again, by_ord);
        }

        #[test]
        fn resolution_is_a_bijection_or_an_error(entries in proptest::collection::vec((0u32..5, 0u32..5), 0..7), n in 1usize..5, m in 1usize..5) {
            let inv = host(n, 10);
            let cur = host(m, 100);
            if let Ok(r) = resolve(Some(&MapSpec::Ordinals(entries)), Some(&inv), &cur) {
                prop_assert_eq!(r.pairs.len(), n);
                let olds: std::collections::HashSet<_> = r.pairs.iter().map(|p| p.0).collect();
                let news: std::collections::HashSet<_> = r.pairs.iter().map(|p| p.1).collect();
                prop_assert_eq!(olds.len(), n);
                prop_assert_eq!(news.len(), n);
                for (i, (o, _)) in r.pairs.iter().enumerate() {
                    prop_assert_eq!(*o, inv[i].uuid);
                }
            }
        }
    }
}
