#![no_main]
//! The device-map parser must never panic, and its display form parses back to itself.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(spec) = cuda_plugin::gpu_map::MapSpec::parse(text) {
            assert_eq!(cuda_plugin::gpu_map::MapSpec::parse(&spec.to_string()), Ok(spec));
        }
    }
});
