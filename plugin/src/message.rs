//! Keeping what the plugin hands to CRIU's logger short.
//!
//! CRIU formats every plugin message into a fixed 8 KiB buffer but writes the *untruncated*
//! length, so a longer message puts whatever follows the buffer in CRIU's memory (heap pointers,
//! NUL bytes, path fragments) into the log file. Two rules keep every message well under that:
//!
//! * inputs of unbounded length (an option value, a line of an image, the utility's output) are
//!   [`quote`]d: short ones verbatim, long ones as a prefix and their length;
//! * every line is [`cap`]ped at [`LINE_LIMIT`] bytes as a last resort.

use std::borrow::Cow;

/// The longest line the plugin hands to CRIU, prefix included (CRIU's buffer is 8 KiB).
pub const LINE_LIMIT: usize = 2048;
/// The longest input quoted verbatim.
pub const QUOTE_LIMIT: usize = 240;

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` itself when it is at most [`QUOTE_LIMIT`] bytes, else its first bytes and its length.
#[must_use]
pub fn quote(s: &str) -> Cow<'_, str> {
    if s.len() <= QUOTE_LIMIT {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!(
            "{}… ({} bytes in all)",
            prefix(s, QUOTE_LIMIT),
            s.len()
        ))
    }
}

/// As [`quote`], in Rust's debug quoting (quotes and escapes).
#[must_use]
pub fn quote_debug(s: &str) -> String {
    if s.len() <= QUOTE_LIMIT {
        format!("{s:?}")
    } else {
        format!("{:?}… ({} bytes in all)", prefix(s, QUOTE_LIMIT), s.len())
    }
}

/// `line` cut to at most [`LINE_LIMIT`] bytes, saying how long it was.
#[must_use]
pub fn cap(line: &str) -> Cow<'_, str> {
    if line.len() <= LINE_LIMIT {
        return Cow::Borrowed(line);
    }
    let note = format!(" … [cut: {} bytes in all]", line.len());
    Cow::Owned(format!("{}{note}", prefix(line, LINE_LIMIT - note.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_text_is_untouched_and_long_text_is_cut_with_its_length() {
        assert_eq!(quote("abc"), "abc");
        let long = "x".repeat(10_000);
        let q = quote(&long);
        assert!(q.len() < QUOTE_LIMIT + 40, "{}", q.len());
        assert!(q.ends_with("(10000 bytes in all)"), "{q}");
        assert_eq!(quote_debug("a\"b"), "\"a\\\"b\"");
        assert!(quote_debug(&long).ends_with("(10000 bytes in all)"));
        let c = cap(&long);
        assert!(c.len() <= LINE_LIMIT, "{}", c.len());
        assert!(c.ends_with("[cut: 10000 bytes in all]"), "{c}");
    }

    proptest! {
        #[test]
        fn caps_hold_for_any_text(s in "\\PC{0,3000}") {
            prop_assert!(cap(&s).len() <= LINE_LIMIT);
            prop_assert!(quote(&s).len() <= QUOTE_LIMIT + 40);
            prop_assert!(s.starts_with(prefix(&s, 100)));
        }
    }
}

/// An error that keeps its cause apart from its own message (as its
/// [`source`](std::error::Error::source)), and hands the cause's text to [`Report`].
///
/// This is the log's view of the source chain without `dyn Error`: a `dyn Error` vtable
/// carries each error type's `Debug` impl, which the plugin never prints, and those cost the
/// shipped `.so` about 19 KB (its size is capped, `scripts/check-dist.sh`). Each impl must
/// agree with the type's `source()`; `crate::error`'s tests check them against each other.
pub trait Caused: std::fmt::Display {
    /// The cause, when this error keeps one as its source; its message follows the error's.
    fn caused_by(&self) -> Option<&dyn std::fmt::Display>;
}

/// An error with its cause, as the plugin logs it: the error's message (which says where it
/// happened), then `: ` and the cause's message (which says what failed and why).
#[derive(Debug)]
pub struct Report<'a, E: ?Sized>(pub &'a E);

impl<E: Caused + ?Sized> std::fmt::Display for Report<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.caused_by() {
            Some(cause) => write!(f, "{}: {cause}", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A number shown with one decimal (as `{:.1}` would), by integer arithmetic: the plugin keeps
/// the standard library's float formatting (about 15 KB) out of its binary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tenths(pub f64);

impl std::fmt::Display for Tenths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = (self.0 * 10.0).round();
        // Beyond 2^53 tenths there is no exact tenth to show; no message needs that range.
        if !t.is_finite() || t.abs() > 9.0e15 {
            return f.write_str("?");
        }
        #[allow(clippy::cast_possible_truncation)]
        let t = t as i64;
        let sign = if t < 0 { "-" } else { "" };
        let a = t.unsigned_abs();
        write!(f, "{sign}{}.{}", a / 10, a % 10)
    }
}

/// Whole milliseconds of `d` as a `u64` (saturating): `Duration::as_millis` is a `u128`, whose
/// formatter costs the plugin's binary over 1 KB.
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A byte count in the largest binary unit that keeps it at 1 or more, to a tenth:
/// `512 B`, `1.5 KiB`, `80.0 GiB`.
#[must_use]
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    #[allow(clippy::cast_precision_loss)]
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", Tenths(v), UNITS[u])
}

/// A duration shown as `{:?}` shows it (`1.5s`, `250ms`, `12.5µs`), by integer arithmetic: the
/// standard library's `Debug` for `Duration` costs the plugin's binary about 2 KB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub std::time::Duration);

impl std::fmt::Display for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (secs, nanos) = (self.0.as_secs(), self.0.subsec_nanos());
        let (whole, mut frac, mut width, unit) = if secs > 0 {
            (secs, nanos, 9, "s")
        } else if nanos >= 1_000_000 {
            (u64::from(nanos / 1_000_000), nanos % 1_000_000, 6, "ms")
        } else if nanos >= 1_000 {
            (u64::from(nanos / 1_000), nanos % 1_000, 3, "\u{b5}s")
        } else {
            (u64::from(nanos), 0, 0, "ns")
        };
        write!(f, "{whole}")?;
        if frac != 0 {
            while frac % 10 == 0 {
                frac /= 10;
                width -= 1;
            }
            write!(f, ".{frac:0width$}")?;
        }
        f.write_str(unit)
    }
}

#[cfg(test)]
mod tenths_tests {
    use super::Tenths;

    #[test]
    fn one_decimal_like_the_float_formatter() {
        for (x, want) in [
            (0.0, "0.0"),
            (0.04, "0.0"),
            (0.06, "0.1"),
            (1.25, "1.3"),
            (79.0, "79.0"),
            (1024.0, "1024.0"),
            (-2.5, "-2.5"),
            (123_456.78, "123456.8"),
            (f64::NAN, "?"),
            (f64::INFINITY, "?"),
        ] {
            assert_eq!(Tenths(x).to_string(), want, "{x}");
        }
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_the_float_formatter_away_from_ties(x in -1.0e9f64..1.0e9) {
            let tenths = x * 10.0;
            // A tie (x.x5) may round either way; elsewhere both must agree.
            proptest::prop_assume!((tenths - tenths.floor() - 0.5).abs() > 1e-6);
            proptest::prop_assert_eq!(Tenths(x).to_string(), format!("{x:.1}"));
        }
    }
}

#[cfg(test)]
mod span_tests {
    use super::Span;
    use std::time::Duration;

    #[test]
    fn like_the_debug_formatter() {
        for (d, want) in [
            (Duration::ZERO, "0ns"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::from_nanos(12_500), "12.5\u{b5}s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_micros(1_005), "1.005ms"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_secs(90), "90s"),
            (Duration::new(3, 1), "3.000000001s"),
        ] {
            assert_eq!(Span(d).to_string(), want, "{d:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn matches_debug_for_any_duration(s in 0u64..1u64 << 40, n in 0u32..1_000_000_000) {
            let d = Duration::new(s, n);
            proptest::prop_assert_eq!(Span(d).to_string(), format!("{d:?}"));
        }

        #[test]
        fn matches_debug_below_a_second(n in 0u32..1_000_000_000) {
            let d = Duration::from_nanos(u64::from(n));
            proptest::prop_assert_eq!(Span(d).to_string(), format!("{d:?}"));
        }
    }
}
