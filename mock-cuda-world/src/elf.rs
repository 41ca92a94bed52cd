//! Hiding dynamic symbols in a copy of the mock library, so that `dlsym` does not find them,
//! as with a driver that predates them.
//!
//! The name of each hidden symbol in `.dynstr` is renamed in place (its first byte becomes
//! `X`, keeping its length), which is enough for the dynamic loader: lookups compare names, so
//! the old name is no longer found. Only ELF64 little-endian images (x86-64, aarch64) are
//! handled; anything else is a clear error. The image is read with the `object` crate's ELF
//! reader, so a truncated or malformed image is an error too, never a panic.

use object::elf;
use object::read::elf::{Dyn as _, FileHeader as _, SectionHeader as _, SectionTable, Sym as _};
use object::LittleEndian;

/// Why an image could not be patched.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ElfError {
    #[error("not an ELF64 little-endian image")]
    NotElf64,
    #[error("truncated or malformed ELF image ({0})")]
    Malformed(&'static str),
    #[error("no dynamic symbol table")]
    NoDynsym,
    #[error("symbol {0} to hide is not exported by the library")]
    Missing(String),
}

type Header = elf::FileHeader64<LittleEndian>;

/// The header and section table of an ELF64 little-endian image (read by `object`, which checks
/// every offset and size against the image).
fn sections(image: &[u8]) -> Result<(LittleEndian, SectionTable<'_, Header>), ElfError> {
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let header = Header::parse(image).map_err(|_| ElfError::Malformed("ELF header"))?;
    let endian = header
        .endian()
        .map_err(|_| ElfError::Malformed("ELF header"))?;
    let sections = header
        .sections(endian, image)
        .map_err(|_| ElfError::Malformed("section headers"))?;
    Ok((endian, sections))
}

/// The defined dynamic symbols of an image and the file offset of each name (in `.dynstr`).
fn dynamic_symbols(image: &[u8]) -> Result<Vec<(String, usize)>, ElfError> {
    let (endian, sections) = sections(image)?;
    if !sections
        .iter()
        .any(|s| s.sh_type(endian) == elf::SHT_DYNSYM)
    {
        return Err(ElfError::NoDynsym);
    }
    let symbols = sections
        .symbols(endian, image, elf::SHT_DYNSYM)
        .map_err(|_| ElfError::Malformed("dynamic symbol table bounds"))?;
    let dynstr = sections
        .section(symbols.string_section())
        .map_err(|_| ElfError::Malformed("dynamic symbol table bounds"))?;
    // Both are within the image: `object` checked the string table's bounds.
    let str_off = usize::try_from(dynstr.sh_offset(endian))
        .map_err(|_| ElfError::Malformed("offset out of range"))?;
    let str_size = dynstr.sh_size(endian);
    let strings = symbols.strings();
    let mut out = Vec::new();
    for sym in symbols.iter() {
        let name = sym.st_name(endian);
        if name == 0 || sym.st_shndx(endian) == elf::SHN_UNDEF || u64::from(name) >= str_size {
            continue;
        }
        let text = strings
            .get(name)
            .map_err(|()| ElfError::Malformed("unterminated name"))?;
        let at = usize::try_from(name)
            .ok()
            .and_then(|n| str_off.checked_add(n))
            .ok_or(ElfError::Malformed("offset out of range"))?;
        out.push((String::from_utf8_lossy(text).into_owned(), at));
    }
    Ok(out)
}

/// Names of the defined dynamic symbols of an image.
pub fn exported_names(image: &[u8]) -> Result<Vec<String>, ElfError> {
    Ok(dynamic_symbols(image)?
        .into_iter()
        .map(|(n, _)| n)
        .collect())
}

/// The `DT_SONAME` of an image (the name the dynamic loader knows it by), if it has one.
pub fn soname(image: &[u8]) -> Result<Option<String>, ElfError> {
    let (endian, sections) = sections(image)?;
    let Some((entries, link)) = sections
        .dynamic(endian, image)
        .map_err(|_| ElfError::Malformed("dynamic section bounds"))?
    else {
        return Ok(None);
    };
    let strings = sections
        .strings(endian, image, link)
        .map_err(|_| ElfError::Malformed("dynamic string table"))?;
    for entry in entries {
        match entry.d_tag(endian) {
            elf::DT_NULL => break,
            elf::DT_SONAME => {
                let name = entry
                    .string(endian, strings)
                    .map_err(|_| ElfError::Malformed("SONAME outside .dynstr"))?;
                return Ok(Some(String::from_utf8_lossy(name).into_owned()));
            }
            _ => {}
        }
    }
    Ok(None)
}

/// A copy of `image` in which the dynamic symbols `hidden` can no longer be found.
pub fn hide_dynamic_symbols(image: &[u8], hidden: &[&str]) -> Result<Vec<u8>, ElfError> {
    let syms = dynamic_symbols(image)?;
    let mut out = image.to_vec();
    for h in hidden {
        let (_, at) = syms
            .iter()
            .find(|(n, _)| n == h)
            .ok_or_else(|| ElfError::Missing((*h).to_owned()))?;
        out[*at] = b'X';
    }
    let after = exported_names(&out)?;
    for h in hidden {
        if after.iter().any(|n| n == h) {
            return Err(ElfError::Malformed(
                "a hidden name is shared with another symbol",
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_elf_input() {
        assert_eq!(
            hide_dynamic_symbols(b"not an elf", &[]),
            Err(ElfError::NotElf64)
        );
        let mut fake = vec![0u8; 64];
        fake[..4].copy_from_slice(b"\x7fELF");
        fake[4] = 2;
        fake[5] = 1;
        assert!(hide_dynamic_symbols(&fake, &["cuInit"]).is_err());
    }

    /// The test executable itself: a dynamically linked ELF64 little-endian image.
    fn this_executable() -> Vec<u8> {
        std::fs::read("/proc/self/exe").expect("reading /proc/self/exe")
    }

    #[test]
    fn reads_a_real_image() {
        let image = this_executable();
        let names = exported_names(&image).expect("the test executable has a .dynsym");
        let hidden = hide_dynamic_symbols(&image, &[]).expect("nothing to hide");
        assert_eq!(exported_names(&hidden).unwrap(), names);
        assert!(soname(&image).is_ok());
    }

    #[test]
    fn a_truncated_image_is_an_error() {
        let image = this_executable();
        // The section headers are at the end of the file: every cut loses some of them.
        for len in [64, 65, 200, 4096, image.len() / 2, image.len() - 1] {
            let cut = &image[..len];
            assert!(
                matches!(exported_names(cut), Err(ElfError::Malformed(_))),
                "{len} bytes"
            );
            assert!(
                matches!(soname(cut), Err(ElfError::Malformed(_))),
                "{len} bytes"
            );
            assert!(hide_dynamic_symbols(cut, &[]).is_err(), "{len} bytes");
        }
    }

    /// A header whose section table lies past the end of the address space (the hand-written
    /// reader computed `shoff + i * shentsize` unchecked).
    #[test]
    fn offsets_past_the_end_are_an_error() {
        let mut header = this_executable()[..64].to_vec();
        header[0x28..0x30].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        header[0x3c..0x3e].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(exported_names(&header).is_err());
        assert!(soname(&header).is_err());
    }

    proptest::proptest! {
        /// Garbage after a valid ELF64 little-endian identification is an error or a result,
        /// never a panic.
        #[test]
        fn garbage_never_panics(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut image = b"\x7fELF\x02\x01\x01\x00".to_vec();
            image.extend_from_slice(&body);
            let _ = exported_names(&image);
            let _ = soname(&image);
            let _ = hide_dynamic_symbols(&image, &["cuInit"]);
        }
    }
}
