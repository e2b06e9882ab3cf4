//! A read-only follower: the workspace as another node writes it, switched to each newer
//! head the session reads from the store ([`Vfs::apply_head`]).
//!
//! Invariants:
//! - a head is switched in whole: its changes are one RocksDB batch, and the switch holds
//!   [`Follow::switch`] exclusively while opens and reads hold it shared, so no open or read
//!   sees part of a head;
//! - a handle reads the version its file had when it was opened (its [`Pin`]): chunks whose
//!   block did not change since are read through the cache, the others from the store by
//!   block id ([`ColdTier::read_version`]), whatever later heads did to the file;
//! - data the writer has not stored yet is never shown: its unsealed marks stay in memory
//!   here (never in the local metadata, where the cold tier would take them for local dirty
//!   data), and a file is shown cut where its first chunk that is marked and not covered by a
//!   record starts, as a restore after a reset would cut it (`MetaStore::cut_to_stored_data`);
//! - the kernel's page cache is one per inode, so while a handle that reads through it
//!   holds an older version of a file, new opens of that file bypass it ([`PageCache::Bypass`])
//!   and the new head leaves its pages alone ([`HeadChange::kept`]); the first open after
//!   the last such handle closed drops them ([`PageCache::Drop`]);
//! - nothing is written to the store.
//!
//! [`ColdTier::read_version`]: crate::tier::ColdTier::read_version

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use super::{Vfs, VfsError, VfsResult};
use crate::block::CHUNK_SIZE;
use crate::meta::{ChunkRecord, JournalOp, codec};
use crate::types::{FileKind, Ino};

/// What a new head changed, for the front end to drop from its caches (the kernel's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeadChange {
    /// Inodes whose attributes, data, xattrs or link target may have changed.
    pub inodes: Vec<Ino>,
    /// Of `inodes`, those whose cached pages stay: a handle open on an older version reads
    /// them (only their attributes are to be dropped).
    pub kept: Vec<Ino>,
    /// Directory entries `(parent, name)` that were added, removed or replaced.
    pub entries: Vec<(Ino, Vec<u8>)>,
    /// The switch went through a checkpoint: the journal after the last head served had
    /// been compacted away (what changed was found by comparing the two states).
    pub whole: bool,
}

/// What an open does with the kernel's cached pages of its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCache {
    /// They are the file's current data: keep them.
    Keep,
    /// They may hold an older version nobody has open any more: drop them at this open.
    Drop,
    /// They hold an older version that an open handle reads: read around them (direct I/O).
    Bypass,
}

/// The version of a file a handle opened.
struct Pin {
    ino: Ino,
    size: u64,
    chunks: BTreeMap<u64, ChunkRecord>,
    page_cache: PageCache,
    /// A later head changed the file: the handle reads a version the file no longer has.
    outdated: AtomicBool,
}

impl Pin {
    /// Reads through the kernel's page cache (which then holds this version's pages).
    fn cached(&self) -> bool {
        self.page_cache != PageCache::Bypass
    }
}

/// A follower's state (see the module documentation).
#[derive(Default)]
pub(super) struct Follow {
    switch: RwLock<()>,
    pins: Mutex<HashMap<u64, Arc<Pin>>>,
    /// The writer's unsealed marks: chunks whose data may not be in the store yet.
    unsealed: Mutex<HashMap<Ino, BTreeSet<u64>>>,
    /// Sizes shown for files cut at their stored data.
    cuts: RwLock<HashMap<Ino, u64>>,
    /// Per file, the open handles that read an older version through the page cache.
    held_old: Mutex<HashMap<Ino, usize>>,
    /// Files whose cached pages may hold an older version (dropped at the next open that
    /// finds no such handle).
    stale_pages: Mutex<HashSet<Ino>>,
}

impl Follow {
    /// A new head changed `touched`: the handles open on them now read older versions.
    /// Returns the files whose cached pages such handles read (to be kept).
    /// `bytes_changed` tells whether the file a handle pinned reads differently in the new
    /// head; a change of its attributes alone leaves its pages valid.
    fn outdate(&self, touched: &BTreeSet<Ino>, bytes_changed: impl Fn(&Pin) -> bool) -> Vec<Ino> {
        let pins = self.pins.lock();
        let mut held = self.held_old.lock();
        for pin in pins.values() {
            if pin.cached() && touched.contains(&pin.ino) && !pin.outdated.load(Ordering::Relaxed) && bytes_changed(pin)
            {
                pin.outdated.store(true, Ordering::Relaxed);
                *held.entry(pin.ino).or_default() += 1;
                self.stale_pages.lock().insert(pin.ino);
            }
        }
        touched.iter().copied().filter(|ino| held.contains_key(ino)).collect()
    }

    /// The size a file of `size` bytes is shown with.
    pub(super) fn shown_size(&self, ino: Ino, size: u64) -> u64 {
        self.cuts.read().get(&ino).map_or(size, |&cut| cut.min(size))
    }
}

impl Vfs {
    /// A follower's start: moves the restored unsealed marks out of the local metadata into
    /// memory and cuts the files they leave without stored data.
    pub(super) fn start_following(&self) -> VfsResult<()> {
        let Some(follow) = &self.follow else { return Ok(()) };
        let marks = self.meta.unsealed_chunks()?;
        let deletes: Vec<JournalOp> = marks
            .iter()
            .flat_map(|(&ino, idxs)| {
                idxs.iter().map(move |&idx| JournalOp::Delete { key: codec::unsealed_key(ino, idx) })
            })
            .collect();
        if !deletes.is_empty() {
            self.meta.import(&deletes, self.meta.local_seq()?)?;
        }
        let mut unsealed = follow.unsealed.lock();
        unsealed.extend(marks.into_iter().map(|(ino, idxs)| (ino, idxs.into_iter().collect())));
        let inos: Vec<Ino> = unsealed.keys().copied().collect();
        self.recut(follow, &unsealed, &inos)
    }

    /// Each changed file's chunk records in the new head: its records now, then its chunk ops.
    #[allow(clippy::type_complexity)]
    fn chunks_in_new_head(
        &self,
        chunk_ops: BTreeMap<Ino, Vec<(u64, Option<ChunkRecord>)>>,
    ) -> VfsResult<BTreeMap<Ino, Vec<(u64, ChunkRecord)>>> {
        let mut files = BTreeMap::new();
        for (ino, changes) in chunk_ops {
            let mut records: BTreeMap<u64, ChunkRecord> = self.meta.file_chunks(ino)?.into_iter().collect();
            for (idx, rec) in changes {
                match rec {
                    Some(r) => records.insert(idx, r),
                    None => records.remove(&idx),
                };
            }
            files.insert(ino, records.into_iter().collect::<Vec<_>>());
        }
        Ok(files)
    }

    /// Switches a follower to a newer head of the workspace: `ops` are the head's changes
    /// since the last one, or (`whole`) its entire state; `seq` its last batch. Returns what
    /// changed. Blocking: waits for reads in progress, and fetches in progress of the files
    /// it changes.
    pub fn apply_head(&self, ops: Vec<JournalOp>, seq: u64, whole: bool) -> VfsResult<HeadChange> {
        let Some(follow) = &self.follow else {
            return Err(VfsError::NotSupported("following on a mount that does not follow"));
        };
        let _switch = follow.switch.write();
        let ops = if whole { self.meta.diff_to_state(ops)? } else { self.meta.expand_ranges(ops)? };
        let mut unsealed = follow.unsealed.lock();
        if whole {
            unsealed.clear();
        }
        let HeadOps { touched, entries, chunk_ops, rest } = sort_head_ops(ops, &mut unsealed)?;
        let files = self.chunks_in_new_head(chunk_ops)?;
        // Inodes the head creates or deletes, for the inode count (no scan of the table).
        let existed = self.inodes_existing(&rest)?;
        let import = || self.meta.import(&rest, seq).map_err(VfsError::from);
        match &self.cold {
            Some(cold) => cold.follow_files(&files, import)?,
            None => import()?,
        }
        for ino in files.keys() {
            if self.meta.inode(*ino)?.is_none() {
                // Gone in the new head: its cached bytes with it (a handle that still has it
                // open reads its version from the store).
                if let Err(e) = self.hot.remove(*ino) {
                    tracing::warn!("removing the cached data of inode {ino}, gone in the new head: {e}");
                }
            }
        }
        let inos: Vec<Ino> = touched.iter().copied().collect();
        self.recut(follow, &unsealed, &inos)?;
        // A handle's bytes differ when the file's chunk records changed, it is gone, or the
        // size it is shown with changed (an error reading it counts as a change).
        let kept = follow.outdate(&touched, |pin| {
            files.contains_key(&pin.ino)
                || self
                    .meta
                    .inode(pin.ino)
                    .ok()
                    .flatten()
                    .is_none_or(|r| follow.shown_size(pin.ino, r.attr.size) != pin.size)
        });
        self.count_inodes(existed)?;
        Ok(HeadChange { inodes: inos, kept, entries, whole })
    }

    /// Whether each inode that `ops` put or delete exists before they apply.
    fn inodes_existing(&self, ops: &[JournalOp]) -> VfsResult<Vec<(Ino, bool)>> {
        let mut existed = Vec::new();
        for op in ops {
            if let JournalOp::Put { key, .. } | JournalOp::Delete { key } = op {
                if key.len() == 9 && key[0] == b'I' {
                    let ino = codec::key_ino(key)?;
                    existed.push((ino, self.meta.inode(ino)?.is_some()));
                }
            }
        }
        Ok(existed)
    }

    /// Moves the inode count by the inodes that came or went since [`Self::inodes_existing`].
    fn count_inodes(&self, mut existed: Vec<(Ino, bool)>) -> VfsResult<()> {
        existed.sort_unstable();
        existed.dedup_by_key(|(ino, _)| *ino);
        for (ino, before) in existed {
            match (before, self.meta.inode(ino)?.is_some()) {
                (false, true) => self.inode_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                (true, false) => self.inode_count.fetch_sub(1, std::sync::atomic::Ordering::Relaxed),
                _ => 0,
            };
        }
        Ok(())
    }

    /// Recomputes the shown size of `inos` from their marks and records.
    fn recut(&self, follow: &Follow, unsealed: &HashMap<Ino, BTreeSet<u64>>, inos: &[Ino]) -> VfsResult<()> {
        let mut cuts = follow.cuts.write();
        for &ino in inos {
            cuts.remove(&ino);
            let Some(marks) = unsealed.get(&ino) else { continue };
            let Some(rec) = self.meta.inode(ino)? else { continue };
            if rec.attr.kind != FileKind::File {
                continue;
            }
            let size = rec.attr.size;
            let records: HashMap<u64, ChunkRecord> = self.meta.file_chunks(ino)?.into_iter().collect();
            for &idx in marks {
                let start = idx.saturating_mul(CHUNK_SIZE);
                if start >= size {
                    break;
                }
                let want = (size - start).min(CHUNK_SIZE);
                let have = records.get(&idx).map_or(0, |r| u64::from(r.len));
                if have < want {
                    cuts.insert(ino, start + have);
                    break;
                }
            }
        }
        Ok(())
    }

    /// A follower's open: pins the version the file has now to handle `fh`.
    pub(super) fn pin_version(&self, ino: Ino, fh: u64, size: u64) {
        let (Some(follow), Some(cold)) = (&self.follow, &self.cold) else { return };
        let end = size.div_ceil(CHUNK_SIZE);
        let chunks = cold.chunk_records(ino).into_iter().filter(|(idx, _)| *idx < end).collect();
        let mut pins = follow.pins.lock();
        let page_cache = if follow.held_old.lock().contains_key(&ino) {
            PageCache::Bypass
        } else if follow.stale_pages.lock().remove(&ino) {
            PageCache::Drop
        } else {
            PageCache::Keep
        };
        let pin = Pin { ino, size, chunks, page_cache, outdated: AtomicBool::new(false) };
        pins.insert(fh, Arc::new(pin));
    }

    pub(super) fn unpin_version(&self, fh: u64) {
        let Some(follow) = &self.follow else { return };
        let mut pins = follow.pins.lock();
        let Some(pin) = pins.remove(&fh) else { return };
        if pin.cached() && pin.outdated.load(Ordering::Relaxed) {
            let mut held = follow.held_old.lock();
            if let Some(n) = held.get_mut(&pin.ino) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&pin.ino);
                }
            }
        }
    }

    /// What the open that returned handle `fh` does with the kernel's cached pages of its
    /// file. [`PageCache::Keep`] on a mount that does not follow.
    pub fn page_cache(&self, fh: u64) -> PageCache {
        let Some(follow) = &self.follow else { return PageCache::Keep };
        follow.pins.lock().get(&fh).map_or(PageCache::Keep, |pin| pin.page_cache)
    }

    /// Held shared by a follower's opens, so a head switches before or after one.
    pub(super) fn follow_guard(&self) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        self.follow.as_ref().map(|f| f.switch.read())
    }

    /// A follower's read: the version handle `fh` opened.
    pub(super) fn read_followed(&self, follow: &Follow, ino: Ino, fh: u64, range: Range<u64>) -> VfsResult<Bytes> {
        let _switch = follow.switch.read();
        let pin = follow.pins.lock().get(&fh).cloned().ok_or(VfsError::BadHandle)?;
        let range = range.start..range.end.min(pin.size);
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let Some(cold) = &self.cold else { return Err(VfsError::BadHandle) };
        let chunks: Vec<(u64, Option<ChunkRecord>)> = (range.start / CHUNK_SIZE..range.end.div_ceil(CHUNK_SIZE))
            .map(|i| (i, pin.chunks.get(&i).copied()))
            .collect();
        let current = chunks.iter().all(|&(idx, rec)| {
            let now = cold.chunk_record(ino, idx);
            match (rec, now) {
                (Some(a), Some(b)) => a.block == b.block && a.len == b.len,
                (None, None) => true,
                _ => false,
            }
        });
        if !current {
            return Ok(cold.read_version(ino, &chunks, range)?);
        }
        if let Some(data) = cold.read_streamed(ino, range.clone(), pin.size)? {
            return Ok(data);
        }
        let file = self.open_file(ino)?;
        let _pinned = cold.begin_read(ino, &file, range.clone())?;
        // Past the data file's end (a file that grew since it was opened): zeros.
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        self.hot.data(&file, ino).read_into(range.start, &mut buf)?;
        Ok(Bytes::from(buf))
    }
}

/// A new head's operations, sorted by what applying them needs.
struct HeadOps {
    /// Inodes whose attributes, chunks, xattrs or unsealed marks change.
    touched: BTreeSet<Ino>,
    /// Directory entries put or deleted: the parent and the name.
    entries: Vec<(Ino, Vec<u8>)>,
    /// Per file whose chunk records change: its chunk ops, in order.
    chunk_ops: BTreeMap<Ino, Vec<(u64, Option<ChunkRecord>)>>,
    /// What goes into the local metadata (chunk records not resident here, no marks).
    rest: Vec<JournalOp>,
}

/// Sorts a head's operations (with no ranges left): unsealed marks go into `unsealed` only,
/// chunk records are kept per file and stored as not resident here, and every inode and
/// directory entry they touch is noted.
fn sort_head_ops(ops: Vec<JournalOp>, unsealed: &mut HashMap<Ino, BTreeSet<u64>>) -> VfsResult<HeadOps> {
    let mut touched = BTreeSet::new();
    let mut entries = Vec::new();
    // Per file whose chunk records change: its chunk ops, in order.
    let mut chunk_ops: BTreeMap<Ino, Vec<(u64, Option<ChunkRecord>)>> = BTreeMap::new();
    let mut rest = Vec::with_capacity(ops.len());
    for op in ops {
        let (key, value) = match &op {
            JournalOp::Put { key, value } => (key.as_slice(), Some(value.as_slice())),
            JournalOp::Delete { key } => (key.as_slice(), None),
            JournalOp::DeleteRange { .. } => unreachable!("expand_ranges and diff_to_state leave no ranges"),
        };
        match key.first() {
            Some(b'U') => {
                let (ino, idx) = codec::decode_chunk_key(key)?;
                let marks = unsealed.entry(ino).or_default();
                if value.is_some() {
                    marks.insert(idx);
                } else {
                    marks.remove(&idx);
                    if marks.is_empty() {
                        unsealed.remove(&ino);
                    }
                }
                touched.insert(ino);
                continue; // never in the local metadata (see the module invariants)
            }
            Some(b'K') => {
                let (ino, idx) = codec::decode_chunk_key(key)?;
                let rec = value.map(codec::decode_chunk).transpose()?;
                chunk_ops.entry(ino).or_default().push((idx, rec));
                touched.insert(ino);
                if let Some(v) = value {
                    // Another node's cache is not this one's.
                    rest.push(JournalOp::Put { key: key.to_vec(), value: codec::not_resident(v) });
                    continue;
                }
            }
            Some(b'I' | b'X' | b'L' | b'O') => {
                touched.insert(codec::key_ino(key)?);
            }
            Some(b'D') => entries.push((codec::key_ino(key)?, key[9..].to_vec())),
            _ => {}
        }
        rest.push(op);
    }
    Ok(HeadOps { touched, entries, chunk_ops, rest })
}
