//! Eviction: the evictor thread punches clean, sealed chunks out of the data files, least
//! recently used first, to keep the hot tier under its cache size and the disk above its
//! free-space floor.
//!
//! Invariants: only a chunk whose record is resident, that is not dirty, not claimed by an
//! uploader, not being fetched and has no write or read in flight is punched, so eviction
//! never loses a byte; it punches under the state lock, so no writer is mid-write in the
//! chunk. A file with a passthrough handle open (the kernel reads its data file directly) is
//! not touched at all. The free-space floor spares the chunks used within the last [`RECENT_TICKS`]; the
//! cache size and a disk about to refuse writes spare nothing.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Chunk, ColdError, ColdTier, OpenFiles, State};
use crate::block::CHUNK_SIZE;
use crate::meta::MetaBatch;
use crate::tier::HotTier;
use crate::types::Ino;

/// Chunks used within this many of the engine's ticks (one per read, write or fetch) are not
/// evicted to keep the disk's free-space floor.
const RECENT_TICKS: u64 = 256;

/// The disk's free space as eviction sees it ([`ColdTier::free_space`]).
pub(super) struct FreeSpace {
    pub free: u64,
    /// Eviction keeps this much free: `min_free_ratio` of the disk, at least `low`.
    pub floor: u64,
    /// Below this (twice the write reserve) writes are about to fail: even recent chunks go.
    pub low: u64,
}

impl ColdTier {
    pub(super) fn evict_loop(self: Arc<Self>) {
        loop {
            {
                let mut st = self.state.lock();
                if st.stopping {
                    return;
                }
                self.tick.wait_for(&mut st, Duration::from_millis(200));
                if st.stopping {
                    return;
                }
            }
            if let Err(e) = self.evict_some() {
                tracing::warn!("eviction: {e}");
            }
        }
    }

    /// Bytes to free now: `(above the cache size, below the free-space floor of the disk,
    /// below twice the write reserve)`. The last is critical: writes are about to fail with
    /// ENOSPC, so even recently used chunks go.
    fn excess(&self, resident: u64) -> (u64, u64, u64) {
        let mut cache = 0;
        if let Some(limit) = self.config.cache_size {
            if resident > limit {
                // Evict down to 90% so eviction runs in batches, not per write.
                cache = resident - limit / 10 * 9;
            }
        }
        let (mut disk, mut critical) = (0, 0);
        if let Some(f) = self.free_space() {
            if f.free < f.floor {
                disk = f.floor - f.free + CHUNK_SIZE;
            }
            if f.free < f.low {
                critical = f.low - f.free + CHUNK_SIZE;
            }
        }
        (cache, disk, critical)
    }

    /// The disk's free bytes and the floors eviction keeps them above (`None`: statvfs failed).
    pub(super) fn free_space(&self) -> Option<FreeSpace> {
        let s = self.hot.disk_stats().ok()?;
        let (total, free) = (s.f_blocks.saturating_mul(s.f_frsize), s.f_bavail.saturating_mul(s.f_frsize));
        // Never less than twice the reserve writes leave alone, or a small disk would refuse
        // writes (ENOSPC at the reserve) while evictable chunks fill it.
        let low = 2 * self.hot.reserve();
        let floor = ((total as f64 * self.config.min_free_ratio) as u64).max(low);
        Some(FreeSpace { free, floor, low })
    }

    fn evict_some(&self) -> Result<(), ColdError> {
        let resident = self.state.lock().resident_bytes;
        let (cache_need, disk_need, critical_need) = self.excess(resident);
        if cache_need == 0 && disk_need == 0 {
            return Ok(());
        }
        let mut st = self.state.lock();
        let mut candidates: Vec<(u64, Ino, u64)> = st
            .files
            .iter()
            // The kernel reads (and maybe writes) a passthrough file without asking: its
            // chunks stay.
            .filter(|(_, f)| f.passthrough == 0)
            .flat_map(|(&ino, f)| {
                f.chunks.iter().filter_map(move |(&idx, c)| {
                    let clean = c.rec.is_some_and(|r| r.resident) && !c.dirty && c.inflight == 0 && c.readers == 0;
                    (clean && !c.claimed && !c.fetching && c.local_len > 0).then_some((c.last_access, ino, idx))
                })
            })
            .collect();
        candidates.sort_unstable();
        // A disk filled by something else cannot be freed by evicting what is being read: the
        // free-space floor spares the most recently used chunks (read-ahead included), or a
        // sequential reader would fetch every chunk again and again. The cache size is a hard
        // limit and spares nothing, and neither does a disk about to refuse writes (a file
        // written bigger than the disk has only recently used chunks to give).
        let recent = st.tick.saturating_sub(RECENT_TICKS);
        let mut batch = MetaBatch::new();
        let mut files = OpenFiles::default();
        let State { files: fstate, resident_bytes, .. } = &mut *st;
        let mut freed = 0u64;
        for (last_access, ino, idx) in candidates {
            let wanted = freed < cache_need || freed < critical_need || (freed < disk_need && last_access < recent);
            if !wanted {
                if freed >= cache_need.max(disk_need) {
                    break;
                }
                continue;
            }
            let Some(c) = fstate.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { continue };
            freed += c.local_len;
            // Punched under the state lock: no writer can be mid-write in this chunk.
            punch_out(&self.hot, ino, idx, c, files.get(&self.hot, ino)?, resident_bytes, &mut batch)?;
            self.counters.evictions.fetch_add(1, Ordering::Relaxed);
        }
        self.meta.commit(batch)?;
        Ok(())
    }
}

/// Drops a sealed chunk's local bytes: punches them out of the data file and records the
/// chunk as evicted in `batch`. The caller holds the state lock and commits `batch`.
pub(super) fn punch_out(
    hot: &HotTier,
    ino: Ino,
    idx: u64,
    c: &mut Chunk,
    file: Option<&File>,
    resident_bytes: &mut u64,
    batch: &mut MetaBatch,
) -> Result<(), ColdError> {
    let Some(mut r) = c.rec else { return Ok(()) };
    if let Some(file) = file {
        // To a whole cipher block: a file's last chunk ends inside one, and an encrypted data
        // file's padding after it is zeros (past a plain data file's end, punching does nothing).
        hot.data(file, ino).fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            idx * CHUNK_SIZE,
            u64::from(r.len).next_multiple_of(crate::crypto::CIPHER_BLOCK),
        )?;
    }
    r.resident = false;
    c.rec = Some(r);
    *resident_bytes = resident_bytes.saturating_sub(c.local_len);
    c.local_len = 0;
    batch.set_chunk_residency(ino, idx, &r);
    Ok(())
}
