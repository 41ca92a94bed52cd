#![no_main]
//! The inventory decoder must never panic, and whatever it accepts re-encodes to itself.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(gpus) = cuda_plugin::inventory::read(&mut &data[..]) {
        let again = cuda_plugin::inventory::encode(&gpus).expect("a decoded inventory encodes");
        assert_eq!(again, data);
    }
});
