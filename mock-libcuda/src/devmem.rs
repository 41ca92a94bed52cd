//! Virtual device memory: an allocation accounted at its full size (tens of GiB) that stores
//! only what its workload wrote, by offset, up to a bound.
//!
//! An allocation larger than the world's `memory.real_mib` is *virtual*. Its content is a set
//! of non-overlapping extents over `0..size`:
//! * **data** extents hold the bytes a copy wrote (`cuMemcpyHtoD`, `cuMemcpyDtoD`); their total
//!   is bounded by `memory.sample_kib`, and a write that would exceed the bound is refused
//!   (the caller gets `CUDA_ERROR_NOT_SUPPORTED`) instead of being stored partly;
//! * **fill** extents record a `cuMemsetD8` of any length as (length, value), storing nothing;
//! * everything else reads as zero.
//!
//! So a workload that sets a whole 80 GiB allocation with one memset and writes a pattern into
//! a few KiB of windows reads back exactly what it wrote, everywhere, while the world stores a
//! few KiB. Checkpoint and restore move that stored form (see [`Sparse::encode`]) through the
//! process's memory; the time model and the host-memory accounting use the full size.
//!
//! Stored form (`devmem/<pid>-<id>.bin` of a virtual allocation), little-endian:
//!
//! ```text
//! "mock-cuda-devmem\n"  magic (17 bytes)
//! u32 version (1)       u64 size        u32 extent count
//! per extent, in increasing offset:  u8 kind (0 fill, 1 data)  u64 offset  u64 length
//!                                    then the fill byte (kind 0) or `length` bytes (kind 1)
//! ```
//!
//! Decoding is strict: a wrong magic or version, extents out of order, overlapping, empty or
//! beyond the size, and trailing bytes are errors.

use std::collections::BTreeMap;

/// Magic bytes of the stored form.
pub const MAGIC: &[u8] = b"mock-cuda-devmem\n";
/// Version of the stored form.
pub const VERSION: u32 = 1;

/// Why a virtual allocation cannot be read, written or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DevmemError {
    /// A write would store more real bytes than the allocation may hold.
    #[error("the write would store {would} bytes, more than the {limit}-byte sample a virtual allocation holds")]
    SampleFull { would: u64, limit: u64 },
    /// An access beyond the allocation.
    #[error("bytes {off}..{end} are outside the {size}-byte allocation")]
    OutOfRange { off: u64, end: u64, size: u64 },
    /// A stored form that is not valid.
    #[error("malformed stored device memory: {0}")]
    Malformed(String),
}

/// One piece of a range: bytes, or a run of one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// `len` bytes of `value` (holes are fills of zero).
    Fill { len: u64, value: u8 },
    /// Stored bytes.
    Data(Vec<u8>),
}

impl Piece {
    fn len(&self) -> u64 {
        match self {
            Piece::Fill { len, .. } => *len,
            Piece::Data(d) => d.len() as u64,
        }
    }

    /// The part `from..to` (relative to the piece's start).
    fn slice(&self, from: u64, to: u64) -> Piece {
        match self {
            Piece::Fill { value, .. } => Piece::Fill {
                len: to - from,
                value: *value,
            },
            Piece::Data(d) => Piece::Data(d[from as usize..to as usize].to_vec()),
        }
    }
}

/// The content of a virtual allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sparse {
    size: u64,
    /// Extents by start offset; never empty, never overlapping.
    extents: BTreeMap<u64, Piece>,
}

impl Sparse {
    /// An allocation of `size` bytes that reads as zero.
    #[must_use]
    pub fn new(size: u64) -> Sparse {
        Sparse {
            size,
            extents: BTreeMap::new(),
        }
    }

    /// The allocation's (logical) size.
    #[must_use]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Real bytes stored (the data extents).
    #[must_use]
    pub fn data_bytes(&self) -> u64 {
        self.extents
            .values()
            .filter(|p| matches!(p, Piece::Data(_)))
            .map(Piece::len)
            .sum()
    }

    fn check(&self, off: u64, len: u64) -> Result<u64, DevmemError> {
        off.checked_add(len)
            .filter(|&end| end <= self.size)
            .ok_or(DevmemError::OutOfRange {
                off,
                end: off.saturating_add(len),
                size: self.size,
            })
    }

    /// The extents overlapping `off..end`, each clipped to it: (absolute start, piece).
    fn overlapping(&self, off: u64, end: u64) -> Vec<(u64, Piece)> {
        let first = self
            .extents
            .range(..off)
            .next_back()
            .filter(|(s, p)| **s + p.len() > off)
            .map(|(s, _)| *s)
            .unwrap_or(off);
        self.extents
            .range(first..end)
            .map(|(&s, p)| {
                let from = off.max(s);
                let to = end.min(s + p.len());
                (from, p.slice(from - s, to - s))
            })
            .collect()
    }

    /// Removes `off..end` from every extent, keeping what lies outside it.
    fn carve(&mut self, off: u64, end: u64) {
        let hit: Vec<(u64, Piece)> = {
            let first = self
                .extents
                .range(..off)
                .next_back()
                .filter(|(s, p)| **s + p.len() > off)
                .map(|(s, _)| *s)
                .unwrap_or(off);
            self.extents
                .range(first..end)
                .map(|(&s, p)| (s, p.clone()))
                .collect()
        };
        for (s, p) in hit {
            self.extents.remove(&s);
            let e = s + p.len();
            if s < off {
                self.extents.insert(s, p.slice(0, off - s));
            }
            if e > end {
                self.extents.insert(end, p.slice(end - s, e - s));
            }
        }
    }

    /// The content of `off..off + len` as pieces in order (holes as fills of zero).
    ///
    /// # Errors
    /// [`DevmemError::OutOfRange`].
    pub fn pieces(&self, off: u64, len: u64) -> Result<Vec<Piece>, DevmemError> {
        let end = self.check(off, len)?;
        let mut out = Vec::new();
        if len == 0 {
            return Ok(out);
        }
        let mut at = off;
        for (s, p) in self.overlapping(off, end) {
            if s > at {
                out.push(Piece::Fill {
                    len: s - at,
                    value: 0,
                });
            }
            at = s + p.len();
            out.push(p);
        }
        if at < end {
            out.push(Piece::Fill {
                len: end - at,
                value: 0,
            });
        }
        Ok(out)
    }

    /// Reads `buf.len()` bytes from `off`.
    ///
    /// # Errors
    /// [`DevmemError::OutOfRange`].
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), DevmemError> {
        let mut at = 0usize;
        for p in self.pieces(off, buf.len() as u64)? {
            let n = p.len() as usize;
            match p {
                Piece::Fill { value, .. } => buf[at..at + n].fill(value),
                Piece::Data(d) => buf[at..at + n].copy_from_slice(&d),
            }
            at += n;
        }
        Ok(())
    }

    /// Writes `pieces` from `off` on; data pieces count against `limit` (the stored bytes after
    /// the write). Nothing changes when it fails.
    ///
    /// # Errors
    /// [`DevmemError::OutOfRange`], [`DevmemError::SampleFull`].
    pub fn write_pieces(
        &mut self,
        off: u64,
        pieces: &[Piece],
        limit: u64,
    ) -> Result<(), DevmemError> {
        let len: u64 = pieces.iter().map(Piece::len).sum();
        let end = self.check(off, len)?;
        if len == 0 {
            return Ok(());
        }
        let replaced: u64 = self
            .overlapping(off, end)
            .iter()
            .filter(|(_, p)| matches!(p, Piece::Data(_)))
            .map(|(_, p)| p.len())
            .sum();
        let added: u64 = pieces
            .iter()
            .filter(|p| matches!(p, Piece::Data(_)))
            .map(Piece::len)
            .sum();
        let would = self.data_bytes() - replaced + added;
        if added > 0 && would > limit {
            return Err(DevmemError::SampleFull { would, limit });
        }
        self.carve(off, end);
        let mut at = off;
        for p in pieces {
            let n = p.len();
            if n > 0 {
                self.extents.insert(at, p.clone());
            }
            at += n;
        }
        Ok(())
    }

    /// Writes `data` at `off`.
    ///
    /// # Errors
    /// As [`Sparse::write_pieces`].
    pub fn write(&mut self, off: u64, data: &[u8], limit: u64) -> Result<(), DevmemError> {
        self.write_pieces(off, &[Piece::Data(data.to_vec())], limit)
    }

    /// Sets `len` bytes from `off` to `value` (stores nothing but the run).
    ///
    /// # Errors
    /// [`DevmemError::OutOfRange`].
    pub fn fill(&mut self, off: u64, len: u64, value: u8) -> Result<(), DevmemError> {
        self.write_pieces(off, &[Piece::Fill { len, value }], 0)
    }

    /// The stored form (module documentation).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.data_bytes() as usize);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        for (&s, p) in &self.extents {
            match p {
                Piece::Fill { len, value } => {
                    out.push(0);
                    out.extend_from_slice(&s.to_le_bytes());
                    out.extend_from_slice(&len.to_le_bytes());
                    out.push(*value);
                }
                Piece::Data(d) => {
                    out.push(1);
                    out.extend_from_slice(&s.to_le_bytes());
                    out.extend_from_slice(&(d.len() as u64).to_le_bytes());
                    out.extend_from_slice(d);
                }
            }
        }
        out
    }

    /// Reads the stored form back.
    ///
    /// # Errors
    /// [`DevmemError::Malformed`], saying what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Sparse, DevmemError> {
        let bad = |s: &str| DevmemError::Malformed(s.to_owned());
        let mut r = Reader { bytes, at: 0 };
        if r.take(MAGIC.len()).ok_or_else(|| bad("too short"))? != MAGIC {
            return Err(bad("not mock device memory (wrong magic)"));
        }
        let version = r.u32().ok_or_else(|| bad("no version"))?;
        if version != VERSION {
            return Err(DevmemError::Malformed(format!(
                "version {version} is not supported (expected {VERSION})"
            )));
        }
        let size = r.u64().ok_or_else(|| bad("no size"))?;
        let count = r.u32().ok_or_else(|| bad("no extent count"))?;
        let mut sparse = Sparse::new(size);
        let mut end_of_last = 0u64;
        for i in 0..count {
            let at = |what: &str| DevmemError::Malformed(format!("extent {i}: {what}"));
            let kind = r.u8().ok_or_else(|| at("truncated"))?;
            let start = r.u64().ok_or_else(|| at("truncated"))?;
            let len = r.u64().ok_or_else(|| at("truncated"))?;
            if len == 0 {
                return Err(at("empty"));
            }
            if i > 0 && start < end_of_last {
                return Err(at("overlaps or precedes the one before"));
            }
            let end = start
                .checked_add(len)
                .filter(|&e| e <= size)
                .ok_or_else(|| at("beyond the allocation"))?;
            let piece = match kind {
                0 => Piece::Fill {
                    len,
                    value: r.u8().ok_or_else(|| at("truncated"))?,
                },
                1 => Piece::Data(
                    r.take(usize::try_from(len).map_err(|_| at("too long"))?)
                        .ok_or_else(|| at("truncated"))?
                        .to_vec(),
                ),
                k => return Err(at(&format!("unknown kind {k}"))),
            };
            sparse.extents.insert(start, piece);
            end_of_last = end;
        }
        if r.at != bytes.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(sparse)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_huge_allocation_stores_only_what_was_written() {
        let size = 141 << 30;
        let mut m = Sparse::new(size);
        m.fill(0, size, 0xA5).unwrap();
        m.write(size / 2, b"pattern", 4096).unwrap();
        m.write(size - 3, b"end", 4096).unwrap();
        assert_eq!(m.data_bytes(), 10);
        let mut buf = [0u8; 11];
        m.read(size / 2 - 2, &mut buf).unwrap();
        assert_eq!(&buf, b"\xA5\xA5pattern\xA5\xA5");
        assert!(m.encode().len() < 200, "the stored form stays small");
        assert_eq!(
            m.write(size - 2, b"end", 4096),
            Err(DevmemError::OutOfRange {
                off: size - 2,
                end: size + 1,
                size
            })
        );
    }

    #[test]
    fn a_write_beyond_the_sample_is_refused_whole() {
        let mut m = Sparse::new(1 << 20);
        m.write(0, &[1; 600], 1000).unwrap();
        let before = m.clone();
        assert_eq!(
            m.write(4096, &[2; 500], 1000),
            Err(DevmemError::SampleFull {
                would: 1100,
                limit: 1000
            })
        );
        assert_eq!(m, before, "a refused write changes nothing");
        // Overwriting stored bytes does not grow the sample.
        m.write(100, &[3; 500], 1000).unwrap();
        assert_eq!(m.data_bytes(), 600);
    }

    #[test]
    fn decoding_is_strict() {
        let mut m = Sparse::new(100);
        m.write(10, b"ab", 100).unwrap();
        let good = m.encode();
        assert_eq!(Sparse::decode(&good).unwrap(), m);
        let mut trailing = good.clone();
        trailing.push(0);
        for (bytes, why) in [
            (b"nope".to_vec(), "too short"),
            (
                [b"mock-cuda-devmem?".as_slice(), &good[17..]].concat(),
                "wrong magic",
            ),
            (
                [&good[..17], &2u32.to_le_bytes(), &good[21..]].concat(),
                "version 2",
            ),
            (trailing, "trailing bytes"),
            (good[..good.len() - 1].to_vec(), "truncated"),
        ] {
            let e = Sparse::decode(&bytes).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, Vec<u8>),
        Fill(u64, u64, u8),
    }

    fn op(size: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..size, proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(o, d)| Op::Write(o, d)),
            (0..size, 0..size, any::<u8>()).prop_map(|(o, l, v)| Op::Fill(o, l, v)),
        ]
    }

    proptest! {
        /// Any sequence of writes and fills reads back as it would from plain memory, and the
        /// stored form round-trips; refused operations change nothing.
        #[test]
        fn behaves_like_plain_memory(
            ops in proptest::collection::vec(op(512), 0..40),
            limit in 0u64..300,
        ) {
            let size = 512u64;
            let mut m = Sparse::new(size);
            let mut model = vec![0u8; size as usize];
            for o in &ops {
                let before = m.clone();
                let r = match o {
                    Op::Write(off, d) => m.write(*off, d, limit),
                    Op::Fill(off, len, v) => m.fill(*off, *len, *v),
                };
                match (r, o) {
                    (Ok(()), Op::Write(off, d)) => {
                        model[*off as usize..*off as usize + d.len()].copy_from_slice(d);
                    }
                    (Ok(()), Op::Fill(off, len, v)) => {
                        model[*off as usize..(*off + *len) as usize].fill(*v);
                    }
                    (Err(_), _) => prop_assert_eq!(&m, &before),
                }
                prop_assert!(m.data_bytes() <= limit.max(before.data_bytes()));
            }
            let mut all = vec![0xEEu8; size as usize];
            m.read(0, &mut all).unwrap();
            prop_assert_eq!(&all, &model);
            let pieces = m.pieces(0, size).unwrap();
            prop_assert_eq!(pieces.iter().map(Piece::len).sum::<u64>(), size);
            prop_assert_eq!(Sparse::decode(&m.encode()).unwrap(), m);
        }

        /// Copying a range piecewise into another allocation gives the same bytes.
        #[test]
        fn pieces_copy_a_range(
            ops in proptest::collection::vec(op(256), 0..20),
            from in 0u64..256, to in 0u64..256, len in 0u64..256,
        ) {
            let mut src = Sparse::new(256);
            for o in &ops {
                let _ = match o {
                    Op::Write(off, d) => src.write(*off, d, u64::MAX),
                    Op::Fill(off, l, v) => src.fill(*off, *l, *v),
                };
            }
            let len = len.min(256 - from).min(256 - to);
            let mut dst = Sparse::new(256);
            dst.write_pieces(to, &src.pieces(from, len).unwrap(), u64::MAX).unwrap();
            let mut a = vec![0u8; len as usize];
            let mut b = vec![0u8; len as usize];
            src.read(from, &mut a).unwrap();
            dst.read(to, &mut b).unwrap();
            prop_assert_eq!(a, b);
        }

        /// Arbitrary bytes never make the decoder panic.
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Sparse::decode(&bytes);
            let mut framed = MAGIC.to_vec();
            framed.extend_from_slice(&bytes);
            let _ = Sparse::decode(&framed);
        }
    }
}
