//! Reading a changed file of the watched directory into chunk records: only its data is read
//! (`SEEK_DATA`/`SEEK_HOLE`), each chunk is hashed, and only chunks whose block the workspace
//! does not have are staged in a pack. Packs are shared by the files of a pass (one PUT for
//! many small files) and put before any file that names their blocks is recorded.
//!
//! Invariants: a file's records are handed to the workspace only after the pack with its new
//! blocks returned from the store; a read that a change raced is discarded before its records
//! are kept (its staged blocks may still be uploaded, unreferenced, and `gc` frees them).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use super::{Counts, Result, WatchError};
use crate::block::{self, BlockId, BlockLoc, CHUNK_SIZE, PackBuilder, ZERO_BLOCK};
use crate::meta::ChunkRecord;
use crate::tier::{BlockStore, DataFile, HotTierError};
use crate::types::{Ino, Timestamp};
use crate::vfs::{Content, Vfs};

/// A file read whole, waiting for its pack.
pub(super) struct Pending {
    pub ino: Ino,
    pub path: std::path::PathBuf,
    pub content: Content,
    /// Blocks of this file staged in the current pack (their locations come with the put).
    pub staged: Vec<BlockId>,
}

/// How a read of a file ended.
pub(super) enum Read {
    /// Read whole, not raced: its content (records pending the current pack).
    Done(Box<Pending>),
    /// It changed while it was read.
    Torn,
}

/// The pack being filled and the files waiting for it.
pub(super) struct Packer {
    blocks: Arc<dyn BlockStore>,
    pack: PackBuilder,
    /// Blocks staged in `pack`.
    in_pack: HashSet<BlockId>,
    /// Blocks put by this mirror whose records may not be committed yet.
    put: HashMap<BlockId, BlockLoc>,
    pending: Vec<Pending>,
}

impl Packer {
    pub fn new(blocks: Arc<dyn BlockStore>) -> Packer {
        let pack = PackBuilder::new(blocks.pack_size() + CHUNK_SIZE as usize);
        Packer { blocks, pack, in_pack: HashSet::new(), put: HashMap::new(), pending: Vec::new() }
    }

    /// Reads `file` (opened from `path`, whose `lstat` is `before`, and looked at again after
    /// the read by `lstat_again`) into chunk records.
    /// `verify`: `file` is the file itself, which may change meanwhile, so the read counts only
    /// if `before` still holds after it (see [`unchanged`]); a clone ([`clone_of`]) needs no
    /// check.
    #[allow(clippy::too_many_arguments)]
    pub fn read(
        &mut self,
        vfs: &Vfs,
        ino: Ino,
        path: &Path,
        file: &File,
        before: &std::fs::Metadata,
        verify: bool,
        lstat_again: &dyn Fn() -> std::io::Result<std::fs::Metadata>,
        counts: &mut Counts,
    ) -> Result<Read> {
        let size = before.len();
        let old: HashMap<u64, ChunkRecord> = vfs.chunk_records(ino).into_iter().collect();
        let data_file = DataFile::plain(file, ino);
        let runs = data_file.data_extents(0..size).map_err(hot_error("seek", path))?;
        let mut idxs = BTreeSet::new();
        for r in &runs {
            idxs.extend(r.start / CHUNK_SIZE..(r.end - 1) / CHUNK_SIZE + 1);
        }
        let blocks = self.blocks.clone();
        let keys = blocks.keys();
        let mut chunks = Vec::new();
        let mut staged = Vec::new();
        let mut new_blocks = Vec::new();
        for idx in idxs {
            let start = idx * CHUNK_SIZE;
            let len = (size - start).min(CHUNK_SIZE);
            self.stage_chunk(&data_file, &runs, start..start + len, path, counts)?;
            let data = self.pack.staged();
            let data_runs = block::data_runs(data);
            if data_runs.is_empty() {
                self.pack.drop_staged();
                continue; // a hole: no record
            }
            let id = keys.block_id(data);
            let held = data_runs.iter().map(|r| r.len() as u32).sum();
            let rec = ChunkRecord { block: id, len: len as u32, data: held, resident: false };
            chunks.push((idx, rec));
            let known = old.get(&idx).is_some_and(|r| r.block == id)
                || id == ZERO_BLOCK
                || self.in_pack.contains(&id)
                || vfs.block_location(&id).map_err(WatchError::vfs(path))?.is_some();
            if known {
                self.pack.drop_staged();
                if self.in_pack.contains(&id) {
                    staged.push(id);
                } else if let Some(loc) = self.put.get(&id) {
                    new_blocks.push((id, *loc));
                }
            } else {
                let stored = self.pack.seal_staged_runs(keys, &id, &data_runs);
                self.in_pack.insert(id);
                staged.push(id);
                counts.chunks_uploaded += 1;
                counts.bytes_uploaded += stored as u64;
                if self.pack.len() >= self.blocks.pack_size() {
                    // Put now; this file's records wait until it is read whole. The locations
                    // come from the put itself: `put_pack` forgets them once the files waiting
                    // for the pack are recorded, and this one is not among them yet.
                    let locs = self.put_pack(vfs)?;
                    for id in std::mem::take(&mut staged) {
                        if let Some(loc) = locs.get(&id) {
                            new_blocks.push((id, *loc));
                        }
                    }
                }
            }
        }
        let content = content_of(before, chunks, new_blocks);
        if verify {
            let after = file.metadata().map_err(WatchError::io("stat", path))?;
            let again = lstat_again();
            if !unchanged(before, &after) || !again.is_ok_and(|m| unchanged(before, &m)) {
                counts.torn_reads += 1;
                return Ok(Read::Torn);
            }
        } else {
            counts.cloned_reads += 1;
        }
        Ok(Read::Done(Box::new(Pending { ino, path: path.to_path_buf(), content, staged })))
    }

    /// Stages the chunk at `range` of `data_file` in the pack: only its data `runs` are read,
    /// the rest stays zeros.
    fn stage_chunk(
        &mut self,
        data_file: &DataFile<'_>,
        runs: &[Range<u64>],
        range: Range<u64>,
        path: &Path,
        counts: &mut Counts,
    ) -> Result<()> {
        let (start, end) = (range.start, range.end);
        let data = self.pack.stage((end - start) as usize);
        for r in runs.iter().filter(|r| r.end > start && r.start < end) {
            let (from, to) = (r.start.max(start), r.end.min(end));
            // Cut meanwhile: the short read leaves zeros, and the check after the read sees it.
            data_file
                .read_into(from, &mut data[(from - start) as usize..(to - start) as usize])
                .map_err(hot_error("read", path))?;
            counts.bytes_read += to - from;
        }
        Ok(())
    }

    /// Queues a file read whole; puts the pack when it is full.
    pub fn push(&mut self, vfs: &Vfs, p: Pending) -> Result<()> {
        self.pending.push(p);
        if self.pack.len() >= self.blocks.pack_size() / 2 || self.pending.len() >= 4096 {
            self.put_pack(vfs)?;
        }
        Ok(())
    }

    /// Puts the pack (if it holds anything) and records every file waiting for it. Returns
    /// where the pack's blocks went, for a file being read that has blocks in it.
    pub fn put_pack(&mut self, vfs: &Vfs) -> Result<HashMap<BlockId, BlockLoc>> {
        let mut locs = HashMap::new();
        if !self.pack.is_empty() {
            let full =
                std::mem::replace(&mut self.pack, PackBuilder::new(self.blocks.pack_size() + CHUNK_SIZE as usize));
            locs.extend(self.blocks.put_pack(full)?);
            vfs.count_upload(locs.values().map(|loc| u64::from(loc.plain_len)).sum());
            self.put.extend(locs.iter().map(|(id, loc)| (*id, *loc)));
            self.in_pack.clear();
        }
        for mut p in std::mem::take(&mut self.pending) {
            for id in std::mem::take(&mut p.staged) {
                if let Some(loc) = self.put.get(&id) {
                    p.content.new_blocks.push((id, *loc));
                }
            }
            vfs.adopt_content(p.ino, &p.content).map_err(WatchError::vfs(&p.path))?;
        }
        // Every block put so far is recorded in the workspace now.
        self.put.clear();
        Ok(locs)
    }
}

/// A file's content as read: its chunk records and new blocks, with the size, permission
/// bits, owner and times of its `lstat` before the read.
fn content_of(
    before: &std::fs::Metadata,
    chunks: Vec<(u64, ChunkRecord)>,
    new_blocks: Vec<(BlockId, BlockLoc)>,
) -> Content {
    Content {
        size: before.len(),
        chunks,
        new_blocks,
        perm: (before.mode() & 0o7777) as u16,
        uid: before.uid(),
        gid: before.gid(),
        atime: Timestamp { secs: before.atime(), nanos: before.atime_nsec() as u32 },
        mtime: Timestamp { secs: before.mtime(), nanos: before.mtime_nsec() as u32 },
    }
}

/// Whether `a` and `b` are the same version of a file: inode, size, mtime and ctime.
pub(super) fn unchanged(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    (a.dev(), a.ino(), a.len(), a.mtime(), a.mtime_nsec(), a.ctime(), a.ctime_nsec())
        == (b.dev(), b.ino(), b.len(), b.mtime(), b.mtime_nsec(), b.ctime(), b.ctime_nsec())
}

/// A copy of `file` taken in one step, where the filesystem shares extents (xfs, btrfs):
/// `FICLONE` into `tmp`, an unnamed `O_TMPFILE` in the file's own directory (so the same
/// filesystem; `Beneath::tmpfile_in`), which shares the file's blocks, costs no data on disk
/// and is gone when closed. `None` where the filesystem cannot (ext4, tmpfs: then the caller
/// reads the file itself and verifies). The clone is one version of the file if the file's metadata did not
/// move between the caller's `fstat` before it and one after it.
pub(super) fn clone_of(file: &File, tmp: File) -> Option<File> {
    rustix::fs::ioctl_ficlone(&tmp, file).ok().map(|()| tmp)
}

/// A read or seek of a file of the watched directory failed (named by its path, not as a data
/// file).
fn hot_error<'p>(op: &'static str, path: &'p Path) -> impl FnOnce(HotTierError) -> WatchError + 'p {
    move |e| {
        let source = match e {
            HotTierError::Io { source, .. } => source,
            other => std::io::Error::other(other),
        };
        WatchError::Io { op, path: path.to_path_buf(), source }
    }
}
