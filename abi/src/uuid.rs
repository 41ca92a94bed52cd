//! Text form of a GPU UUID: `GPU-` followed by the 16 bytes in lowercase hex, grouped 4-2-2-2-6
//! (`GPU-8932f937-d72c-4106-c12f-20bd9faed9f6`, 40 characters), as `nvidia-smi -L`, the driver's
//! `CUDA_VISIBLE_DEVICES` parser and `cuda-checkpoint --device-map` spell it.

use crate::cuda::CUuuid;
use std::fmt;
use std::str::FromStr;

/// Length of the text form.
pub const TEXT_LEN: usize = 40;
const PREFIX: &str = "GPU-";
/// Byte offsets (within the text) of the four dashes after the prefix.
const DASHES: [usize; 4] = [12, 17, 22, 27];

/// A GPU UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct GpuUuid(pub [u8; 16]);

/// Why a string is not a GPU UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UuidParseError {
    #[error("GPU UUID {text:?} has {len} characters, expected {TEXT_LEN} (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    Length { text: String, len: usize },
    #[error("GPU UUID {text:?} does not start with \"GPU-\"")]
    Prefix { text: String },
    #[error("GPU UUID {text:?} has {found:?} at position {pos}, expected '-'")]
    Dash {
        text: String,
        pos: usize,
        found: char,
    },
    #[error("GPU UUID {text:?} has {found:?} at position {pos}, expected a lowercase hex digit")]
    Digit {
        text: String,
        pos: usize,
        found: char,
    },
}

impl GpuUuid {
    /// Parses the strict text form (lowercase hex, dashes in place, 40 characters).
    pub fn parse(text: &str) -> Result<GpuUuid, UuidParseError> {
        let owned = || text.to_owned();
        let chars: Vec<char> = text.chars().collect();
        if chars.len() != TEXT_LEN {
            return Err(UuidParseError::Length {
                text: owned(),
                len: chars.len(),
            });
        }
        if !text.starts_with(PREFIX) {
            return Err(UuidParseError::Prefix { text: owned() });
        }
        let mut bytes = [0u8; 16];
        let mut nibbles = 0usize;
        for (pos, &c) in chars.iter().enumerate().skip(PREFIX.len()) {
            if DASHES.contains(&pos) {
                if c != '-' {
                    return Err(UuidParseError::Dash {
                        text: owned(),
                        pos,
                        found: c,
                    });
                }
                continue;
            }
            let v = match c {
                '0'..='9' => c as u8 - b'0',
                'a'..='f' => c as u8 - b'a' + 10,
                _ => {
                    return Err(UuidParseError::Digit {
                        text: owned(),
                        pos,
                        found: c,
                    })
                }
            };
            bytes[nibbles / 2] |= if nibbles.is_multiple_of(2) { v << 4 } else { v };
            nibbles += 1;
        }
        debug_assert_eq!(nibbles, 32);
        Ok(GpuUuid(bytes))
    }

    /// The driver's `CUuuid` form.
    #[must_use]
    pub const fn to_cu(self) -> CUuuid {
        CUuuid { bytes: self.0 }
    }

    /// From the driver's `CUuuid`.
    #[must_use]
    pub const fn from_cu(u: CUuuid) -> GpuUuid {
        GpuUuid(u.bytes)
    }

    /// True when `prefix` is a prefix of this UUID's text form, compared case-insensitively
    /// (the driver's `CUDA_VISIBLE_DEVICES` rule for UUID entries). An empty prefix or the bare
    /// `GPU-` matches nothing.
    #[must_use]
    pub fn has_text_prefix(&self, prefix: &str) -> bool {
        let text = self.to_string();
        prefix.len() > PREFIX.len()
            && prefix.len() <= text.len()
            && text.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for GpuUuid {
    type Err = UuidParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GpuUuid::parse(s)
    }
}

impl From<CUuuid> for GpuUuid {
    fn from(u: CUuuid) -> Self {
        GpuUuid::from_cu(u)
    }
}

impl From<GpuUuid> for CUuuid {
    fn from(u: GpuUuid) -> Self {
        u.to_cu()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAMPLE: &str = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6";

    #[test]
    fn parses_and_formats_the_nvidia_smi_form() {
        let u = GpuUuid::parse(SAMPLE).unwrap();
        assert_eq!(u.0[0], 0x89);
        assert_eq!(u.0[15], 0xf6);
        assert_eq!(u.to_string(), SAMPLE);
        assert_eq!(u.to_string().len(), TEXT_LEN);
    }

    #[test]
    fn rejects_each_malformation_with_its_reason() {
        assert!(matches!(
            GpuUuid::parse("GPU-1234"),
            Err(UuidParseError::Length { len: 8, .. })
        ));
        assert!(matches!(
            GpuUuid::parse("MIG-8932f937-d72c-4106-c12f-20bd9faed9f6"),
            Err(UuidParseError::Prefix { .. })
        ));
        assert!(matches!(
            GpuUuid::parse("GPU-8932f937xd72c-4106-c12f-20bd9faed9f6"),
            Err(UuidParseError::Dash {
                pos: 12,
                found: 'x',
                ..
            })
        ));
        assert!(matches!(
            GpuUuid::parse("GPU-8932F937-d72c-4106-c12f-20bd9faed9f6"),
            Err(UuidParseError::Digit {
                pos: 8,
                found: 'F',
                ..
            })
        ));
        let e = GpuUuid::parse("GPU-8932f937-d72c-4106-c12f-20bd9faed9fé").unwrap_err();
        assert!(e.to_string().contains("lowercase hex"), "{e}");
    }

    #[test]
    fn prefix_matching_follows_the_visible_devices_rule() {
        let u = GpuUuid::parse(SAMPLE).unwrap();
        assert!(u.has_text_prefix("GPU-8932f937"));
        assert!(u.has_text_prefix("gpu-8932F937"));
        assert!(u.has_text_prefix(SAMPLE));
        assert!(!u.has_text_prefix("GPU-"));
        assert!(!u.has_text_prefix("GPU-8932f938"));
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(bytes in any::<[u8; 16]>()) {
            let u = GpuUuid(bytes);
            prop_assert_eq!(GpuUuid::parse(&u.to_string()), Ok(u));
            prop_assert_eq!(GpuUuid::from_cu(u.to_cu()), u);
        }

        #[test]
        fn parse_never_panics_and_accepts_only_canonical_text(s in "\\PC{0,48}") {
            if let Ok(u) = GpuUuid::parse(&s) {
                prop_assert_eq!(u.to_string(), s);
            }
        }

        #[test]
        fn near_miss_text_is_rejected(bytes in any::<[u8; 16]>(), pos in 4usize..40, c in "[G-Zg-z_ ]") {
            let mut text: Vec<char> = GpuUuid(bytes).to_string().chars().collect();
            text[pos] = c.chars().next().unwrap();
            let s: String = text.into_iter().collect();
            prop_assert!(GpuUuid::parse(&s).is_err());
        }
    }
}
