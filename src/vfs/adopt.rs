//! A file's whole content set from outside the POSIX calls: watch mode reads a changed file of
//! the watched directory, puts the chunks that changed in the store itself, and hands the file's
//! new chunk records here ([`Vfs::adopt_content`]). This node keeps no copy of the bytes.
//!
//! Invariants: the size, times, mode and chunk records change in one metadata batch, so the
//! workspace holds the file's old version or its new one, never a mix; the data file is
//! emptied *before* that batch, so no old local byte can show through a hole of the new
//! version (a crash in between leaves old records whose bytes are gone: they are checked
//! against their block ids and fetched again, as any unverified chunk).

use std::sync::Arc;

use super::{Vfs, VfsError, VfsResult};
use crate::block::{BlockId, BlockLoc};
use crate::meta::{ChunkRecord, MetaBatch};
use crate::tier::BlockStore;
use crate::types::{Attr, FileKind, Ino, Timestamp};

/// A file's new version for [`Vfs::adopt_content`].
#[derive(Debug, Clone)]
pub struct Content {
    pub size: u64,
    /// Every chunk with data (index, record); the others are holes.
    pub chunks: Vec<(u64, ChunkRecord)>,
    /// Blocks this version's chunks name that the workspace did not know yet, with where
    /// they are in the store (their pack was put before this call).
    pub new_blocks: Vec<(BlockId, BlockLoc)>,
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
}

impl Vfs {
    /// The store behind the cold tier, if one is attached.
    pub fn block_store(&self) -> Option<Arc<dyn BlockStore>> {
        self.cold.as_ref().map(|c| c.block_store().clone())
    }

    /// Counts a pack of `bytes` (plaintext) a front end put in the store itself.
    pub fn count_upload(&self, bytes: u64) {
        if let Some(cold) = &self.cold {
            cold.count_upload(bytes);
        }
    }

    /// Where the store holds block `id`, if the workspace has it.
    pub fn block_location(&self, id: &BlockId) -> VfsResult<Option<BlockLoc>> {
        Ok(self.meta.block(id)?)
    }

    /// The chunk records of regular file `ino` (index order; a missing index is a hole).
    pub fn chunk_records(&self, ino: Ino) -> Vec<(u64, ChunkRecord)> {
        self.cold.as_ref().map_or_else(Vec::new, |c| c.chunk_records(ino))
    }

    /// Makes `content` the whole content of regular file `ino` (see the module invariants).
    /// Needs a store: without one there is nowhere the bytes are.
    pub fn adopt_content(&self, ino: Ino, content: &Content) -> VfsResult<Attr> {
        let Some(cold) = &self.cold else { return Err(VfsError::Invalid("adopting content needs a store")) };
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        if rec.attr.kind != FileKind::File {
            return Err(VfsError::Invalid("adopting content of a non-file"));
        }
        if content.size > super::MAX_FILE_SIZE {
            return Err(VfsError::TooBig);
        }
        if let Some(file) = self.hot.open_existing(ino)? {
            let data = self.hot.data(&file, ino);
            data.set_len(0)?;
            data.set_len(content.size)?;
        }
        let mut b = MetaBatch::new();
        for (id, loc) in &content.new_blocks {
            b.put_block(id, loc);
        }
        cold.adopt(ino, &content.chunks, &mut b);
        let a = &mut rec.attr;
        a.size = content.size;
        a.blocks = content.size.div_ceil(512);
        a.perm = content.perm & 0o7777;
        a.uid = content.uid;
        a.gid = content.gid;
        a.atime = content.atime;
        a.mtime = content.mtime;
        a.ctime = Timestamp::now();
        rec.dense = false;
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(self.attr_of(rec))
    }
}
