//! The one panic guard of the C entry points outside the plugin: the exports of the mock driver
//! (`mock-libcuda`) and of the NVML stand-in (`mock-nvml`), and the harness's host callbacks.
//! A panic there is a bug; it must never unwind into the C caller. [`guard`] catches it,
//! reports it on stderr with its message, and returns the entry point's fallback.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The text a panic carried: `panic!` payloads are a `&str` or a `String`.
pub fn message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs `f`, the body of the entry point `entry` of `component`. A panic in it is caught and
/// reported on stderr (`<component>: <entry> panicked: <message>; failing the call`), and
/// `fallback` is returned.
pub fn guard<T>(component: &str, entry: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            eprintln!(
                "{component}: {entry} panicked: {}; failing the call",
                message(&*payload)
            );
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_or_the_fallback() {
        assert_eq!(guard("test", "ok", -1, || 7), 7);
        assert_eq!(guard("test", "static", -1, || panic!("boom")), -1);
        let n = 3;
        assert_eq!(guard("test", "formatted", -1, || panic!("boom {n}")), -1);
    }

    #[test]
    fn message_of_each_payload() {
        assert_eq!(message(&"text"), "text");
        assert_eq!(message(&String::from("owned")), "owned");
        assert_eq!(message(&42_u32), "non-string panic payload");
    }
}
