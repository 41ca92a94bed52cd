//! Replays the fuzz corpus (plugin/fuzz/corpus) and a bounded, seeded mutation of it through
//! the inventory decoder and the device-map parser, on stable Rust: nothing may panic, and what
//! is accepted must round-trip. `cargo +nightly fuzz run inventory|device_map` explores further
//! (see plugin/fuzz).

use cuda_plugin::{gpu_map::MapSpec, inventory};
use std::path::PathBuf;

fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "empty corpus {}", dir.display());
    out
}

/// A small deterministic generator (xorshift), so the mutations are the same on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..=(self.next() % 4) {
            match self.next() % 4 {
                0 if !v.is_empty() => {
                    let i = (self.next() as usize) % v.len();
                    v[i] ^= 1 << (self.next() % 8);
                }
                1 if !v.is_empty() => {
                    v.truncate((self.next() as usize) % v.len());
                }
                2 => v.push(self.next() as u8),
                _ => {
                    let i = (self.next() as usize) % (v.len() + 1);
                    v.insert(i, b"=,-GPU0a"[(self.next() % 8) as usize]);
                }
            }
        }
        v
    }
}

fn check_inventory(data: &[u8]) {
    if let Ok(gpus) = inventory::read(&mut &data[..]) {
        assert_eq!(
            inventory::encode(&gpus).unwrap(),
            data,
            "accepted image must re-encode to itself"
        );
    }
}

fn check_map(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(spec) = MapSpec::parse(text) {
            assert_eq!(MapSpec::parse(&spec.to_string()), Ok(spec), "{text:?}");
        }
    }
}

#[test]
fn inventory_corpus_and_mutations_never_panic() {
    let seeds = corpus("inventory");
    let accepted: Vec<&str> = seeds
        .iter()
        .filter(|(_, d)| inventory::read(&mut &d[..]).is_ok())
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(
        accepted,
        ["empty", "one", "two"],
        "the valid seeds, and only those, decode"
    );
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for (_, seed) in &seeds {
        check_inventory(seed);
        for _ in 0..2000 {
            check_inventory(&rng.mutate(seed));
        }
    }
}

#[test]
fn device_map_corpus_and_mutations_never_panic() {
    let seeds = corpus("device_map");
    let mut rng = Rng(0x5eed_1234_abcd_0002);
    for (name, seed) in &seeds {
        check_map(seed);
        let ok = MapSpec::parse(std::str::from_utf8(seed).unwrap()).is_ok();
        assert_eq!(
            ok,
            ["auto", "ordinals", "prefixes", "uuid"].contains(&name.as_str()),
            "{name}"
        );
        for _ in 0..2000 {
            check_map(&rng.mutate(seed));
        }
    }
}
