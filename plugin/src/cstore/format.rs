//! The custom-storage image file `cuda-cs-<pid>-<n>.img`: one task's memory on one GPU
//! (docs/custom-storage.md, "Image files"). This module is the format alone: the blocks, their
//! encoding, and the strict rules a reader applies ([`Walker`]); the I/O is in
//! [`super::pipeline`].
//!
//! # Layout
//!
//! The file is a sequence of frames, each a whole number of [`ALIGN`] (4096) byte blocks at a
//! 4096-aligned file offset, so it can be written and read with `O_DIRECT`. Integers are
//! little-endian. Every frame starts with one 4096-byte *frame block* whose last four bytes are
//! the CRC-32C of the 4092 before them; its unused bytes are zero, and a reader refuses a block
//! whose unused bytes are not.
//!
//! ```text
//! header frame (1 block, file offset 0)
//!   0  magic        [u8; 16]  b"CRIU-CUDA-CS\n\0\0\0"
//!   16 version      u32       1
//!   20 dump id      [u8; 16]  drawn once per dump, kept in the task's plugin image
//!   36 pid          i32       the task's pid as the image names it
//!   40 GPU UUID     [u8; 16]
//!   56 GPU place    u32       the GPU's place (from 0) in the task's per-device list
//!   60 chunk size   u32       a multiple of 4096, at most MAX_CHUNK
//!   64 device bytes u64       the per-device size the driver mapped
//!   72 zero ...
//! 4092 CRC-32C      u32       of bytes 0..4092
//!
//! data frame (1 block, then the bytes padded with zeros to a multiple of 4096)
//!   0  kind         [u8; 4]   b"DATA"
//!   4  sequence     u32       the frame's number, from 0 after the header
//!   8  offset       u64       device offset, a multiple of the chunk size
//!   16 length       u64       min(chunk size, device bytes - offset): every chunk but the last is whole
//!   24 data CRC-32C u32       of the `length` bytes (not the padding)
//!   28 zero ...
//! 4092 CRC-32C      u32       of bytes 0..4092 (the frame's checksum)
//!
//! fill frame (1 block): a run of whole chunks (the last may be short) of one byte value
//!   0  kind         [u8; 4]   b"FILL"
//!   4  sequence     u32
//!   8  offset       u64       a multiple of the chunk size
//!   16 length       u64       a multiple of the chunk size, or reaching the device's end
//!   24 value        u8
//!   25 zero ...
//! 4092 CRC-32C      u32
//!
//! end frame (1 block, the file's last)
//!   0  kind         [u8; 4]   b"END\0"
//!   4  sequence     u32
//!   8  frames       u64       data and fill frames before it
//!   16 covered      u64       device bytes they cover (= device bytes)
//!   24 written      u64       data bytes in data frames (their `length`s)
//!   32 chain        u32       CRC-32C over the frame checksums (header's, then every frame's,
//!                             each as 4 little-endian bytes, in file order)
//!   36 zero ...
//! 4092 CRC-32C      u32
//! ```
//!
//! The frames after the header cover the device from offset 0 upwards, in order, with no gap or
//! overlap; the end frame's totals and chain must match what came before it, and nothing may
//! follow it. A file cut anywhere, at a frame boundary or inside a frame, has no valid end frame
//! where one is expected, and is refused as truncated.
//!
//! # Why one block per frame header
//!
//! `O_DIRECT` needs the file offset, the length and the memory address of every transfer
//! aligned to the block size. A frame header packed into the same block as the start of the
//! data would shift the data off the alignment: every chunk would have to be copied into a
//! second, shifted buffer (memory bandwidth for every byte, and a second pinned buffer), or the
//! header would have to live in a trailer block that is only there when the chunk is short. One
//! header block per chunk costs 4 KiB per 8–64 MiB chunk (0.05 % to 0.006 %), lets the data
//! bytes go from the pinned staging buffer to the file without a copy, and lets a reader check
//! the whole frame structure by reading only the header blocks and seeking over the data
//! ([`super::pipeline::verify_file`]). Fill frames, which carry no data, are one block for any
//! length, so an idle 80 GiB GPU is a few blocks.

use abi::GpuUuid;

/// Every frame's size and file offset are multiples of this (the `O_DIRECT` block).
pub const ALIGN: usize = 4096;
/// [`ALIGN`] as a file offset.
pub const ALIGN64: u64 = ALIGN as u64;
/// The header frame's first bytes.
pub const MAGIC: [u8; 16] = *b"CRIU-CUDA-CS\n\0\0\0";
/// The format version this module writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The largest chunk size a file may declare (a reader allocates buffers of this size).
pub const MAX_CHUNK: u32 = 1 << 30;
/// A data frame's kind.
pub const KIND_DATA: [u8; 4] = *b"DATA";
/// A fill frame's kind.
pub const KIND_FILL: [u8; 4] = *b"FILL";
/// The end frame's kind.
pub const KIND_END: [u8; 4] = *b"END\0";

/// Where a frame block's checksum starts.
const CRC_AT: usize = ALIGN - 4;
/// Bytes of the header frame in use (before the zeros).
const HEADER_USED: usize = 72;
const DATA_USED: usize = 28;
const FILL_USED: usize = 25;
const END_USED: usize = 36;

/// One frame block.
pub type Block = [u8; ALIGN];

/// The header frame's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub dump_id: [u8; 16],
    pub pid: i32,
    pub uuid: GpuUuid,
    pub place: u32,
    /// The chunk size: every data frame but the last holds this many bytes.
    pub chunk: u32,
    /// The device's size in bytes.
    pub size: u64,
}

/// A frame after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// `length` bytes at device `offset`, with their CRC-32C; the bytes follow the block.
    Data {
        seq: u32,
        offset: u64,
        length: u64,
        crc: u32,
    },
    /// `length` bytes at device `offset`, all `value`; nothing follows the block.
    Fill {
        seq: u32,
        offset: u64,
        length: u64,
        value: u8,
    },
    /// The end frame.
    End {
        seq: u32,
        frames: u64,
        covered: u64,
        written: u64,
        chain: u32,
    },
}

/// Why a file's bytes are not a valid custom-storage file. Offsets and sizes are in bytes; the
/// caller adds the file's name and the file offset of the block ([`super::pipeline::CsError`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("not a custom-storage image (magic {found:02x?})")]
    Magic { found: [u8; 16] },
    #[error("format version {found}; this plugin reads version {FORMAT_VERSION}")]
    Version { found: u32 },
    #[error("header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("header field {field} is invalid ({value})")]
    HeaderField { field: &'static str, value: u64 },
    #[error("frame checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    FrameCrc { stored: u32, computed: u32 },
    #[error("unknown frame kind {found:02x?}")]
    Kind { found: [u8; 4] },
    #[error("non-zero bytes in the unused part of a frame block (byte {at})")]
    Reserved { at: usize },
    #[error("frame number {found} where frame {expected} belongs (frames out of order)")]
    Sequence { expected: u32, found: u32 },
    #[error("frame at device offset {found} leaves a gap: bytes up to {expected} are covered")]
    Gap { expected: u64, found: u64 },
    #[error("frame at device offset {found} overlaps: bytes up to {expected} are covered")]
    Overlap { expected: u64, found: u64 },
    #[error(
        "frame at device offset {offset} has length {length}, not one a chunk size of {chunk} \
         on a device of {size} bytes allows"
    )]
    Length {
        offset: u64,
        length: u64,
        chunk: u32,
        size: u64,
    },
    #[error("end frame counts {stored} frames, the file has {counted}")]
    EndFrames { stored: u64, counted: u64 },
    #[error("end frame says {stored} data bytes were written, the frames hold {counted}")]
    EndWritten { stored: u64, counted: u64 },
    #[error("frames cover {covered} bytes, the device has {size}")]
    Coverage { covered: u64, size: u64 },
    #[error("frame checksum chain mismatch: end frame {stored:#010x}, frames {computed:#010x}")]
    Chain { stored: u32, computed: u32 },
    #[error(
        "truncated: the file ends at {len} bytes, inside or before a frame that needs {needed}"
    )]
    Truncated { len: u64, needed: u64 },
    #[error("{extra} trailing bytes after the end frame")]
    Trailing { extra: u64 },
    #[error(
        "data checksum mismatch for device offset {offset} ({length} bytes): stored \
         {stored:#010x}, computed {computed:#010x}"
    )]
    DataCrc {
        offset: u64,
        length: u64,
        stored: u32,
        computed: u32,
    },
    #[error("non-zero padding after the data of device offset {offset}")]
    Padding { offset: u64 },
}

/// CRC-32C of `data`.
#[must_use]
pub fn crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// `bytes` rounded up to a multiple of [`ALIGN`].
#[must_use]
pub const fn padded(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN64) * ALIGN64
}

fn seal(b: &mut Block) -> u32 {
    let c = crc(&b[..CRC_AT]);
    b[CRC_AT..].copy_from_slice(&c.to_le_bytes());
    c
}

fn stored_crc(b: &Block) -> u32 {
    u32_at(b, CRC_AT)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn bytes16(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

fn check_zero(b: &Block, from: usize) -> Result<(), FormatError> {
    match b[from..CRC_AT].iter().position(|&x| x != 0) {
        Some(i) => Err(FormatError::Reserved { at: from + i }),
        None => Ok(()),
    }
}

impl Header {
    /// The header block. Returns the block and its checksum.
    #[must_use]
    pub fn encode(&self) -> (Box<Block>, u32) {
        let mut b = Box::new([0u8; ALIGN]);
        b[0..16].copy_from_slice(&MAGIC);
        b[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[20..36].copy_from_slice(&self.dump_id);
        b[36..40].copy_from_slice(&self.pid.to_le_bytes());
        b[40..56].copy_from_slice(&self.uuid.0);
        b[56..60].copy_from_slice(&self.place.to_le_bytes());
        b[60..64].copy_from_slice(&self.chunk.to_le_bytes());
        b[64..72].copy_from_slice(&self.size.to_le_bytes());
        let c = seal(&mut b);
        (b, c)
    }

    /// Parses a header block: magic, version, checksum, zeros, a valid chunk size. Returns the
    /// header and its checksum.
    pub fn decode(b: &Block) -> Result<(Header, u32), FormatError> {
        let magic = bytes16(b, 0);
        if magic != MAGIC {
            return Err(FormatError::Magic { found: magic });
        }
        let version = u32_at(b, 16);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version { found: version });
        }
        let (stored, computed) = (stored_crc(b), crc(&b[..CRC_AT]));
        if stored != computed {
            return Err(FormatError::HeaderCrc { stored, computed });
        }
        check_zero(b, HEADER_USED)?;
        let h = Header {
            dump_id: bytes16(b, 20),
            pid: i32::from_le_bytes(b[36..40].try_into().unwrap_or_default()),
            uuid: GpuUuid(bytes16(b, 40)),
            place: u32_at(b, 56),
            chunk: u32_at(b, 60),
            size: u64_at(b, 64),
        };
        if !valid_chunk(h.chunk) {
            return Err(FormatError::HeaderField {
                field: "chunk size",
                value: h.chunk.into(),
            });
        }
        Ok((h, stored))
    }

    /// How many chunks the device has.
    #[must_use]
    pub fn chunks(&self) -> u64 {
        self.size.div_ceil(u64::from(self.chunk))
    }
}

/// Whether `chunk` is a chunk size a file may have: a non-zero multiple of [`ALIGN`], at most
/// [`MAX_CHUNK`].
#[must_use]
pub const fn valid_chunk(chunk: u32) -> bool {
    chunk != 0 && chunk.is_multiple_of(ALIGN as u32) && chunk <= MAX_CHUNK
}

impl Frame {
    /// The frame's block. Returns the block and its checksum.
    #[must_use]
    pub fn encode(&self) -> (Box<Block>, u32) {
        let mut b = Box::new([0u8; ALIGN]);
        match *self {
            Frame::Data {
                seq,
                offset,
                length,
                crc,
            } => {
                b[0..4].copy_from_slice(&KIND_DATA);
                b[4..8].copy_from_slice(&seq.to_le_bytes());
                b[8..16].copy_from_slice(&offset.to_le_bytes());
                b[16..24].copy_from_slice(&length.to_le_bytes());
                b[24..28].copy_from_slice(&crc.to_le_bytes());
            }
            Frame::Fill {
                seq,
                offset,
                length,
                value,
            } => {
                b[0..4].copy_from_slice(&KIND_FILL);
                b[4..8].copy_from_slice(&seq.to_le_bytes());
                b[8..16].copy_from_slice(&offset.to_le_bytes());
                b[16..24].copy_from_slice(&length.to_le_bytes());
                b[24] = value;
            }
            Frame::End {
                seq,
                frames,
                covered,
                written,
                chain,
            } => {
                b[0..4].copy_from_slice(&KIND_END);
                b[4..8].copy_from_slice(&seq.to_le_bytes());
                b[8..16].copy_from_slice(&frames.to_le_bytes());
                b[16..24].copy_from_slice(&covered.to_le_bytes());
                b[24..32].copy_from_slice(&written.to_le_bytes());
                b[32..36].copy_from_slice(&chain.to_le_bytes());
            }
        }
        let c = seal(&mut b);
        (b, c)
    }

    /// Parses a frame block on its own: checksum, kind, zeros. Returns the frame and its
    /// checksum. Where it belongs is [`Walker`]'s business.
    pub fn decode(b: &Block) -> Result<(Frame, u32), FormatError> {
        let (stored, computed) = (stored_crc(b), crc(&b[..CRC_AT]));
        if stored != computed {
            return Err(FormatError::FrameCrc { stored, computed });
        }
        let kind: [u8; 4] = [b[0], b[1], b[2], b[3]];
        let seq = u32_at(b, 4);
        let frame = match kind {
            KIND_DATA => {
                check_zero(b, DATA_USED)?;
                Frame::Data {
                    seq,
                    offset: u64_at(b, 8),
                    length: u64_at(b, 16),
                    crc: u32_at(b, 24),
                }
            }
            KIND_FILL => {
                check_zero(b, FILL_USED)?;
                Frame::Fill {
                    seq,
                    offset: u64_at(b, 8),
                    length: u64_at(b, 16),
                    value: b[24],
                }
            }
            KIND_END => {
                check_zero(b, END_USED)?;
                Frame::End {
                    seq,
                    frames: u64_at(b, 8),
                    covered: u64_at(b, 16),
                    written: u64_at(b, 24),
                    chain: u32_at(b, 32),
                }
            }
            found => return Err(FormatError::Kind { found }),
        };
        Ok((frame, stored))
    }

    /// The frame's size in the file: its block, and for a data frame the padded bytes.
    #[must_use]
    pub fn file_bytes(&self) -> u64 {
        match *self {
            Frame::Data { length, .. } => ALIGN64 + padded(length),
            Frame::Fill { .. } | Frame::End { .. } => ALIGN64,
        }
    }
}

/// The running state of a file being written or read: the sequence number, the device bytes
/// covered, the checksum chain. A writer asks it for the next frame ([`Walker::data`],
/// [`Walker::fill`], [`Walker::end`]); a reader hands it every frame it decodes
/// ([`Walker::accept`]), which applies the rules of the module doc.
#[derive(Debug, Clone)]
pub struct Walker {
    header: Header,
    seq: u32,
    covered: u64,
    written: u64,
    chain: u32,
    done: bool,
}

impl Walker {
    /// Starts after the header frame, whose checksum is `header_crc`.
    #[must_use]
    pub fn new(header: Header, header_crc: u32) -> Self {
        Walker {
            header,
            seq: 0,
            covered: 0,
            written: 0,
            chain: crc32c::crc32c_append(0, &header_crc.to_le_bytes()),
            done: false,
        }
    }

    /// The header.
    #[must_use]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Device bytes covered so far.
    #[must_use]
    pub fn covered(&self) -> u64 {
        self.covered
    }

    /// Data bytes in the data frames so far.
    #[must_use]
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Frames (data and fill) so far.
    #[must_use]
    pub fn frames(&self) -> u64 {
        self.seq.into()
    }

    /// Whether the end frame was accepted.
    #[must_use]
    pub fn done(&self) -> bool {
        self.done
    }

    /// The data frame for the next chunk, whose bytes have checksum `crc`.
    pub fn data(&mut self, length: u64, crc: u32) -> Result<(Frame, Box<Block>), FormatError> {
        self.make(Frame::Data {
            seq: self.seq,
            offset: self.covered,
            length,
            crc,
        })
    }

    /// The fill frame for the next `length` bytes, all `value`.
    pub fn fill(&mut self, length: u64, value: u8) -> Result<(Frame, Box<Block>), FormatError> {
        self.make(Frame::Fill {
            seq: self.seq,
            offset: self.covered,
            length,
            value,
        })
    }

    /// The end frame.
    pub fn end(&mut self) -> Result<(Frame, Box<Block>), FormatError> {
        self.make(Frame::End {
            seq: self.seq,
            frames: self.seq.into(),
            covered: self.covered,
            written: self.written,
            chain: self.chain,
        })
    }

    fn make(&mut self, f: Frame) -> Result<(Frame, Box<Block>), FormatError> {
        let (b, c) = f.encode();
        self.accept(&f, c)?;
        Ok((f, b))
    }

    /// Checks that `frame` (whose checksum is `crc`) is the one that belongs next, and
    /// advances.
    pub fn accept(&mut self, frame: &Frame, crc: u32) -> Result<(), FormatError> {
        let seq = match *frame {
            Frame::Data { seq, .. } | Frame::Fill { seq, .. } | Frame::End { seq, .. } => seq,
        };
        if seq != self.seq || self.done {
            return Err(FormatError::Sequence {
                expected: self.seq,
                found: seq,
            });
        }
        let h = self.header;
        let chunk = u64::from(h.chunk);
        match *frame {
            Frame::Data { offset, length, .. } | Frame::Fill { offset, length, .. } => {
                if offset < self.covered {
                    return Err(FormatError::Overlap {
                        expected: self.covered,
                        found: offset,
                    });
                }
                if offset > self.covered {
                    return Err(FormatError::Gap {
                        expected: self.covered,
                        found: offset,
                    });
                }
                let left = h.size - offset;
                let ok = match frame {
                    Frame::Data { .. } => length == left.min(chunk) && length > 0,
                    _ => {
                        length > 0
                            && length <= left
                            && (length.is_multiple_of(chunk) || length == left)
                    }
                };
                if !ok {
                    return Err(FormatError::Length {
                        offset,
                        length,
                        chunk: h.chunk,
                        size: h.size,
                    });
                }
                if matches!(frame, Frame::Data { .. }) {
                    self.written += length;
                }
                self.covered += length;
                self.seq = self.seq.checked_add(1).ok_or(FormatError::Sequence {
                    expected: self.seq,
                    found: seq,
                })?;
            }
            Frame::End {
                frames,
                covered,
                written,
                chain,
                ..
            } => {
                if frames != u64::from(self.seq) {
                    return Err(FormatError::EndFrames {
                        stored: frames,
                        counted: self.seq.into(),
                    });
                }
                if covered != self.covered || self.covered != h.size {
                    return Err(FormatError::Coverage {
                        covered: self.covered,
                        size: h.size,
                    });
                }
                if written != self.written {
                    return Err(FormatError::EndWritten {
                        stored: written,
                        counted: self.written,
                    });
                }
                if chain != self.chain {
                    return Err(FormatError::Chain {
                        stored: chain,
                        computed: self.chain,
                    });
                }
                self.done = true;
                return Ok(());
            }
        }
        self.chain = crc32c::crc32c_append(self.chain, &crc.to_le_bytes());
        Ok(())
    }
}

/// Checks the bytes that follow a data frame's block: `data` is the frame's padded bytes.
pub fn check_data(frame: &Frame, data: &[u8]) -> Result<(), FormatError> {
    if let Frame::Data {
        offset,
        length,
        crc: stored,
        ..
    } = *frame
    {
        let len = usize::try_from(length)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let computed = crc(&data[..len]);
        if computed != stored {
            return Err(FormatError::DataCrc {
                offset,
                length,
                stored,
                computed,
            });
        }
        if data[len..].iter().any(|&b| b != 0) {
            return Err(FormatError::Padding { offset });
        }
    }
    Ok(())
}

/// Checks a whole file held in memory (for tests and tools): header, every frame, every data
/// checksum, the end frame, nothing after it. Returns the header and the frames.
pub fn decode_all(bytes: &[u8]) -> Result<(Header, Vec<Frame>), (u64, FormatError)> {
    let len = bytes.len() as u64;
    let block = |at: u64| -> Result<&Block, (u64, FormatError)> {
        let end = at.saturating_add(ALIGN64);
        if end > len {
            return Err((at, FormatError::Truncated { len, needed: end }));
        }
        // `at` and `end` are within `bytes`, so they fit a usize.
        let s = &bytes[at as usize..end as usize];
        Ok(s.try_into().unwrap_or(&[0; ALIGN]))
    };
    let (header, hcrc) = Header::decode(block(0)?).map_err(|e| (0, e))?;
    let mut w = Walker::new(header, hcrc);
    let mut frames = Vec::new();
    let mut at = ALIGN64;
    while !w.done() {
        let (f, c) = Frame::decode(block(at)?).map_err(|e| (at, e))?;
        w.accept(&f, c).map_err(|e| (at, e))?;
        if let Frame::Data { length, .. } = f {
            let end = at + ALIGN64 + padded(length);
            if end > len {
                return Err((at, FormatError::Truncated { len, needed: end }));
            }
            check_data(&f, &bytes[(at + ALIGN64) as usize..end as usize]).map_err(|e| (at, e))?;
        }
        at += f.file_bytes();
        frames.push(f);
    }
    if at != len {
        return Err((
            at,
            FormatError::Trailing {
                extra: len.saturating_sub(at),
            },
        ));
    }
    Ok((header, frames))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(size: u64, chunk: u32) -> Header {
        Header {
            dump_id: [7; 16],
            pid: 1234,
            uuid: GpuUuid([9; 16]),
            place: 1,
            chunk,
            size,
        }
    }

    /// A file in memory: `data` chunks are `Some(byte pattern seed)`, fills `None` (zeros).
    fn build(h: Header, fill: &[bool]) -> Vec<u8> {
        let (hb, hc) = h.encode();
        let mut out = hb.to_vec();
        let mut w = Walker::new(h, hc);
        let chunk = u64::from(h.chunk);
        for (i, &is_fill) in fill.iter().enumerate() {
            let off = i as u64 * chunk;
            let len = chunk.min(h.size - off);
            if is_fill {
                let (_, b) = w.fill(len, 0).unwrap();
                out.extend_from_slice(&*b);
            } else {
                let bytes: Vec<u8> = (0..len).map(|x| (x as u8) ^ (i as u8) | 1).collect();
                let (_, b) = w.data(len, crc(&bytes)).unwrap();
                out.extend_from_slice(&*b);
                out.extend_from_slice(&bytes);
                out.resize(padded(out.len() as u64) as usize, 0);
            }
        }
        let (_, b) = w.end().unwrap();
        out.extend_from_slice(&*b);
        out
    }

    #[test]
    fn layout_is_as_documented() {
        let h = header(3 * 4096 + 5, 8192);
        let (b, c) = h.encode();
        assert_eq!(&b[..16], b"CRIU-CUDA-CS\n\0\0\0");
        assert_eq!(u32_at(&*b, 16), 1);
        assert_eq!(u32_at(&*b, 60), 8192);
        assert_eq!(u64_at(&*b, 64), 3 * 4096 + 5);
        assert_eq!(u32_at(&*b, 4092), c);
        assert_eq!(Header::decode(&b), Ok((h, c)));
        let file = build(h, &[false, true]);
        // header, data block + 8192, fill block, end block
        assert_eq!(file.len(), 4096 * 4 + 8192);
        let (h2, frames) = decode_all(&file).unwrap();
        assert_eq!(h2, h);
        assert!(matches!(
            frames[0],
            Frame::Data {
                offset: 0,
                length: 8192,
                ..
            }
        ));
        assert_eq!(
            frames[1],
            Frame::Fill {
                seq: 1,
                offset: 8192,
                length: 4096 + 5,
                value: 0
            }
        );
        assert!(matches!(
            frames[2],
            Frame::End {
                frames: 2,
                covered: 12293,
                written: 8192,
                ..
            }
        ));
    }

    #[test]
    fn walker_refuses_disorder() {
        let h = header(4 * 4096, 4096);
        let mut w = Walker::new(h, 0);
        let data = |seq, offset| Frame::Data {
            seq,
            offset,
            length: 4096,
            crc: 0,
        };
        w.accept(&data(0, 0), 1).unwrap();
        assert_eq!(
            w.clone().accept(&data(2, 4096), 1),
            Err(FormatError::Sequence {
                expected: 1,
                found: 2
            })
        );
        assert_eq!(
            w.clone().accept(&data(1, 0), 1),
            Err(FormatError::Overlap {
                expected: 4096,
                found: 0
            })
        );
        assert_eq!(
            w.clone().accept(&data(1, 8192), 1),
            Err(FormatError::Gap {
                expected: 4096,
                found: 8192
            })
        );
        let short = Frame::Data {
            seq: 1,
            offset: 4096,
            length: 100,
            crc: 0,
        };
        assert!(matches!(
            w.clone().accept(&short, 1),
            Err(FormatError::Length { .. })
        ));
        let too_long = Frame::Fill {
            seq: 1,
            offset: 4096,
            length: 4 * 4096,
            value: 0,
        };
        assert!(matches!(
            w.clone().accept(&too_long, 1),
            Err(FormatError::Length { .. })
        ));
        assert!(matches!(
            w.clone().end(),
            Err(FormatError::Coverage {
                covered: 4096,
                size: 16384
            })
        ));
        w.fill(3 * 4096, 0).unwrap();
        let (end, _) = w.clone().end().unwrap();
        let Frame::End { chain, .. } = end else {
            unreachable!()
        };
        let wrong = Frame::End {
            seq: 2,
            frames: 2,
            covered: 4 * 4096,
            written: 4096,
            chain: chain ^ 1,
        };
        assert!(matches!(
            w.accept(&wrong, 0),
            Err(FormatError::Chain { .. })
        ));
    }

    #[test]
    fn block_damage_is_named() {
        let h = header(8192, 4096);
        let (mut b, _) = h.encode();
        b[100] = 1;
        assert!(matches!(
            Header::decode(&b),
            Err(FormatError::HeaderCrc { .. })
        ));
        seal(&mut b);
        assert_eq!(Header::decode(&b), Err(FormatError::Reserved { at: 100 }));
        let (mut b, _) = h.encode();
        b[16] = 2;
        assert_eq!(Header::decode(&b), Err(FormatError::Version { found: 2 }));
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(FormatError::Magic { .. })));
        let (mut b, _) = header(8192, 4095).encode();
        seal(&mut b);
        assert!(matches!(
            Header::decode(&b),
            Err(FormatError::HeaderField { value: 4095, .. })
        ));
        let (mut f, _) = Frame::Fill {
            seq: 0,
            offset: 0,
            length: 1,
            value: 3,
        }
        .encode();
        f[0] = b'Z';
        seal(&mut f);
        assert!(matches!(Frame::decode(&f), Err(FormatError::Kind { .. })));
        f[0] = b'F';
        f[30] = 1;
        seal(&mut f);
        assert_eq!(Frame::decode(&f), Err(FormatError::Reserved { at: 30 }));
    }

    #[test]
    fn whole_file_damage_is_named() {
        let h = header(3 * 4096 + 5, 4096);
        let file = build(h, &[false, true, false, false]);
        decode_all(&file).unwrap();
        let mut extra = file.clone();
        extra.push(0);
        assert_eq!(
            decode_all(&extra),
            Err((file.len() as u64, FormatError::Trailing { extra: 1 }))
        );
        for cut in (0..file.len()).step_by(512) {
            assert!(
                matches!(
                    decode_all(&file[..cut]),
                    Err((_, FormatError::Truncated { .. }))
                ),
                "cut at {cut}"
            );
        }
        let mut flipped = file.clone();
        flipped[4096 * 2 + 10] ^= 1;
        assert!(matches!(
            decode_all(&flipped),
            Err((4096, FormatError::DataCrc { offset: 0, .. }))
        ));
        let mut pad = file.clone();
        let last_data = file.len() - 4096 - 1;
        pad[last_data] = 1;
        assert!(matches!(
            decode_all(&pad),
            Err((_, FormatError::Padding { offset: 12288 }))
        ));
    }

    proptest! {
        #[test]
        fn frames_round_trip(kind in 0u8..3, seq: u32, a: u64, b: u64, c: u64, v: u32) {
            let f = match kind {
                0 => Frame::Data { seq, offset: a, length: b, crc: v },
                1 => Frame::Fill { seq, offset: a, length: b, value: v as u8 },
                _ => Frame::End { seq, frames: a, covered: b, written: c, chain: v },
            };
            let (blk, crc) = f.encode();
            prop_assert_eq!(Frame::decode(&blk), Ok((f, crc)));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4 * ALIGN)) {
            let mut b = [0u8; ALIGN];
            let n = bytes.len().min(ALIGN);
            b[..n].copy_from_slice(&bytes[..n]);
            let _ = Header::decode(&b);
            let _ = Frame::decode(&b);
            seal(&mut b);
            let _ = Header::decode(&b);
            let _ = Frame::decode(&b);
            let _ = decode_all(&bytes);
        }

        #[test]
        fn mutated_files_never_panic(
            fills in proptest::collection::vec(any::<bool>(), 0..6),
            tail in 0u64..4096,
            at in any::<prop::sample::Index>(),
            xor in 1u8..,
            cut in any::<prop::sample::Index>(),
        ) {
            let size = (fills.len() as u64 * 4096).saturating_sub(tail);
            let fills = &fills[..size.div_ceil(4096) as usize];
            let file = build(header(size, 4096), fills);
            prop_assert!(decode_all(&file).is_ok());
            let mut m = file.clone();
            let i = at.index(m.len());
            m[i] ^= xor;
            prop_assert!(decode_all(&m).is_err(), "flipped byte {} survived", i);
            let _ = decode_all(&file[..cut.index(file.len())]);
            prop_assert!(decode_all(&file[..cut.index(file.len())]).is_err());
        }
    }
}
