//! CRIU's own phase times, from the `stats-dump` and `stats-restore` images it writes into the
//! image directory: `stats_entry` of CRIU's `images/stats.proto` (the same in 4.1 and 4.2),
//! decoded with `prost`.

use std::path::Path;

/// CRIU's own phase times (µs → ms) from `stats-dump` / `stats-restore`.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CriuStats {
    pub(crate) freezing: f64,
    pub(crate) frozen: f64,
    pub(crate) memdump: f64,
    pub(crate) memwrite: f64,
    /// Pages written to the images (`pages_written`).
    pub(crate) pages: f64,
    pub(crate) forking: f64,
    pub(crate) restore: f64,
}

impl CriuStats {
    /// The times in the image directory `img`; 0 for what is missing or cannot be read.
    pub(crate) fn of_images(img: &Path) -> CriuStats {
        let mut stats = CriuStats::default();
        let ms = |us: u32| f64::from(us) / 1000.0;
        if let Some(d) = read_stats(&img.join("stats-dump")).and_then(|e| e.dump) {
            stats.freezing = ms(d.freezing_time);
            stats.frozen = ms(d.frozen_time);
            stats.memdump = ms(d.memdump_time);
            stats.memwrite = ms(d.memwrite_time);
            stats.pages = d.pages_written as f64;
        }
        if let Some(r) = read_stats(&img.join("stats-restore")).and_then(|e| e.restore) {
            stats.forking = ms(r.forking_time);
            stats.restore = ms(r.restore_time);
        }
        stats
    }
}

/// `stats_entry` of CRIU's `images/stats.proto`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatsEntry {
    #[prost(message, optional, tag = "1")]
    pub(crate) dump: Option<DumpStatsEntry>,
    #[prost(message, optional, tag = "2")]
    pub(crate) restore: Option<RestoreStatsEntry>,
}

/// `dump_stats_entry`: times in µs.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct DumpStatsEntry {
    #[prost(uint32, required, tag = "1")]
    pub(crate) freezing_time: u32,
    #[prost(uint32, required, tag = "2")]
    pub(crate) frozen_time: u32,
    #[prost(uint32, required, tag = "3")]
    pub(crate) memdump_time: u32,
    #[prost(uint32, required, tag = "4")]
    pub(crate) memwrite_time: u32,
    #[prost(uint64, required, tag = "5")]
    pub(crate) pages_scanned: u64,
    #[prost(uint64, required, tag = "6")]
    pub(crate) pages_skipped_parent: u64,
    #[prost(uint64, required, tag = "7")]
    pub(crate) pages_written: u64,
    #[prost(uint32, optional, tag = "8")]
    pub(crate) irmap_resolve: Option<u32>,
    #[prost(uint64, required, tag = "9")]
    pub(crate) pages_lazy: u64,
    #[prost(uint64, optional, tag = "10")]
    pub(crate) page_pipes: Option<u64>,
    #[prost(uint64, optional, tag = "11")]
    pub(crate) page_pipe_bufs: Option<u64>,
    #[prost(uint64, optional, tag = "12")]
    pub(crate) shpages_scanned: Option<u64>,
    #[prost(uint64, optional, tag = "13")]
    pub(crate) shpages_skipped_parent: Option<u64>,
    #[prost(uint64, optional, tag = "14")]
    pub(crate) shpages_written: Option<u64>,
}

/// `restore_stats_entry`: times in µs.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RestoreStatsEntry {
    #[prost(uint64, required, tag = "1")]
    pub(crate) pages_compared: u64,
    #[prost(uint64, required, tag = "2")]
    pub(crate) pages_skipped_cow: u64,
    #[prost(uint32, required, tag = "3")]
    pub(crate) forking_time: u32,
    #[prost(uint32, required, tag = "4")]
    pub(crate) restore_time: u32,
    #[prost(uint64, optional, tag = "5")]
    pub(crate) pages_restored: Option<u64>,
}

/// The magic of a stats image (`STATS_MAGIC` in CRIU's `criu/include/magic.h`).
pub(crate) const STATS_MAGIC: u32 = 0x5709_3306;

/// The `stats_entry` of a CRIU stats image at `p`, if it can be read.
pub(crate) fn read_stats(p: &Path) -> Option<StatsEntry> {
    decode_stats(&std::fs::read(p).ok()?)
}

/// A stats image: `STATS_MAGIC` (after CRIU's image magic, or alone), the message's length
/// (`u32`, little-endian) and the message.
pub(crate) fn decode_stats(b: &[u8]) -> Option<StatsEntry> {
    let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
    let start = if u32_at(0)? == STATS_MAGIC {
        4
    } else if u32_at(4)? == STATS_MAGIC {
        8
    } else {
        return None;
    };
    let len = u32_at(start)? as usize;
    prost::Message::decode(b.get(start + 4..start + 4 + len)?).ok()
}
