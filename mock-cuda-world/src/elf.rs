//! Hiding dynamic symbols in a copy of the mock library, so that `dlsym` does not find them,
//! as with a driver that predates them.
//!
//! The name of each hidden symbol in `.dynstr` is renamed in place (its first byte becomes
//! `X`, keeping its length), which is enough for the dynamic loader: lookups compare names, so
//! the old name is no longer found. Only ELF64 little-endian images (x86-64, aarch64) are
//! handled; anything else is a clear error.

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

fn u16_at(b: &[u8], o: usize) -> Result<u16, ElfError> {
    b.get(o..o + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or(ElfError::Malformed("short read"))
}
fn u32_at(b: &[u8], o: usize) -> Result<u32, ElfError> {
    b.get(o..o + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or(ElfError::Malformed("short read"))
}
fn u64_at(b: &[u8], o: usize) -> Result<u64, ElfError> {
    b.get(o..o + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or(ElfError::Malformed("short read"))
}
fn usize_of(v: u64) -> Result<usize, ElfError> {
    usize::try_from(v).map_err(|_| ElfError::Malformed("offset out of range"))
}

/// The defined dynamic symbols of an image and the `.dynstr` offset of each name.
fn dynamic_symbols(image: &[u8]) -> Result<Vec<(String, usize)>, ElfError> {
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let shoff = usize_of(u64_at(image, 0x28)?)?;
    let shentsize = usize::from(u16_at(image, 0x3a)?);
    let shnum = usize::from(u16_at(image, 0x3c)?);
    if shentsize < 64 {
        return Err(ElfError::Malformed("section header size"));
    }
    let section = |i: usize| -> Result<(u32, usize, usize, u32, usize), ElfError> {
        let h = shoff + i * shentsize;
        Ok((
            u32_at(image, h + 4)?,
            usize_of(u64_at(image, h + 0x18)?)?,
            usize_of(u64_at(image, h + 0x20)?)?,
            u32_at(image, h + 0x28)?,
            usize_of(u64_at(image, h + 0x38)?)?,
        ))
    };
    const SHT_DYNSYM: u32 = 11;
    let (_, off, size, link, entsize) = (0..shnum)
        .map(section)
        .find(|s| matches!(s, Ok((SHT_DYNSYM, ..))))
        .ok_or(ElfError::NoDynsym)??;
    let (_, str_off, str_size, _, _) = section(link as usize)?;
    if entsize < 24
        || off.checked_add(size).is_none_or(|e| e > image.len())
        || str_off
            .checked_add(str_size)
            .is_none_or(|e| e > image.len())
    {
        return Err(ElfError::Malformed("dynamic symbol table bounds"));
    }
    let mut out = Vec::new();
    for i in 0..size / entsize {
        let sym = off + i * entsize;
        let name = u32_at(image, sym)? as usize;
        let shndx = u16_at(image, sym + 6)?;
        if name == 0 || shndx == 0 || name >= str_size {
            continue;
        }
        let start = str_off + name;
        let end = image[start..str_off + str_size]
            .iter()
            .position(|&b| b == 0)
            .ok_or(ElfError::Malformed("unterminated name"))?;
        out.push((
            String::from_utf8_lossy(&image[start..start + end]).into_owned(),
            start,
        ));
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
    if image.len() < 64 || &image[..4] != b"\x7fELF" || image[4] != 2 || image[5] != 1 {
        return Err(ElfError::NotElf64);
    }
    let shoff = usize_of(u64_at(image, 0x28)?)?;
    let shentsize = usize::from(u16_at(image, 0x3a)?);
    let shnum = usize::from(u16_at(image, 0x3c)?);
    const SHT_DYNAMIC: u32 = 6;
    const DT_NULL: u64 = 0;
    const DT_SONAME: u64 = 14;
    let header = |i: usize| -> Result<(u32, usize, usize, u32), ElfError> {
        let h = shoff + i * shentsize;
        Ok((
            u32_at(image, h + 4)?,
            usize_of(u64_at(image, h + 0x18)?)?,
            usize_of(u64_at(image, h + 0x20)?)?,
            u32_at(image, h + 0x28)?,
        ))
    };
    let Some((_, off, size, link)) = (0..shnum)
        .map(header)
        .find(|s| matches!(s, Ok((SHT_DYNAMIC, ..))))
        .transpose()?
    else {
        return Ok(None);
    };
    let (_, str_off, str_size, _) = header(link as usize)?;
    for e in (off..off + size).step_by(16) {
        match u64_at(image, e)? {
            DT_NULL => break,
            DT_SONAME => {
                let name = usize_of(u64_at(image, e + 8)?)?;
                let start = str_off + name;
                let text = image
                    .get(start..str_off + str_size)
                    .ok_or(ElfError::Malformed("SONAME outside .dynstr"))?;
                let end = text
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or(ElfError::Malformed("unterminated name"))?;
                return Ok(Some(String::from_utf8_lossy(&text[..end]).into_owned()));
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
}
