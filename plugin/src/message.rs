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
