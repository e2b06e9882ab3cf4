//! The size limit of every kind of object tierfs reads from a store whole, and why each is
//! what it is.
//!
//! A store is input (docs/SEMANTICS.md, "What a store can do to you"): whatever was written,
//! an object may come back of any size. Each kind of object that is fetched whole has a
//! maximum derived from its own format's limits, defined here once. Readers pass
//! [`WholeObject::limit`] to the backend layer, which learns the object's size before reading
//! its body and refuses a larger one as `Corrupt`, naming the object and both sizes
//! ([`crate::backend::SizeLimit`]); writers check the same maximum before they store
//! ([`WholeObject::check`]), so nothing a writer stores is refused by a reader. Packs and their
//! shards are not here: they are read by range, or whole at exactly the length their
//! (authenticated) index segment records.

use crate::backend::SizeLimit;
use crate::block::{CHUNK_SIZE, INDEX_ENTRY, PACK_FOOTER, TRAILER_ENTRY};
use crate::crypto::ENVELOPE_OVERHEAD;

use super::StoreError;

/// The largest `pack_size` a store may be configured with (`StoreConfig::validate`).
pub const MAX_PACK_SIZE: u64 = 1 << 30;

/// Largest journal segment a writer gathers (bytes of encoded batches); one batch larger than
/// this is written alone, up to [`WholeObject::JournalSegment`]'s maximum.
pub const MAX_SEGMENT_BYTES: usize = 8 << 20;

/// A checkpoint part is cut at the first entry that takes it to this size (or earlier, where
/// a key's hash says so).
pub const MAX_PART_BYTES: usize = 4 << 20;

/// A hot set names at most this many chunks (4 TiB of full chunks).
pub const MAX_HOT_CHUNKS: usize = 1 << 20;

/// Of those, at most this many form its ordered prefix: the chunks a session read first, in
/// the order it first read them (an environment's imports). A small file is one chunk, so
/// this is 65 536 files, far more than the few thousand that `import torch` opens.
pub const MAX_HOT_ORDERED: usize = 1 << 16;

const ENVELOPE: u64 = ENVELOPE_OVERHEAD as u64;

/// The envelopes of one pack: a pack is closed once its blocks reach `pack_size`, so the last
/// block (a whole chunk at most, sealed) may take it one chunk past.
const MAX_PACK_BLOCK_BYTES: u64 = MAX_PACK_SIZE + CHUNK_SIZE + ENVELOPE;

/// Blocks one pack can hold: every stored block holds at least one byte (the zero block is
/// never stored), so its envelope is at least one byte over the envelope's overhead.
const MAX_PACK_BLOCKS: u64 = MAX_PACK_BLOCK_BYTES / (ENVELOPE + 1);

/// The largest pack: its blocks, then the sealed trailer (`version u8 | n u32 | n entries`),
/// then the footer.
pub const LARGEST_PACK: u64 =
    MAX_PACK_BLOCK_BYTES + ENVELOPE + 5 + MAX_PACK_BLOCKS * TRAILER_ENTRY as u64 + PACK_FOOTER as u64;

/// The largest key and value of one metadata entry, with room to spare: values are fixed
/// layouts of a few dozen bytes except an xattr's (at most 64 KiB, Linux's XATTR_SIZE_MAX) and a
/// symlink's target (at most 4 KiB, PATH_MAX); keys are a table tag, inode numbers and at
/// most one name of 255 bytes.
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// The largest journal segment object. Batches are gathered up to [`MAX_SEGMENT_BYTES`], but
/// one batch is never split, and a batch holds every change of one operation: the largest are
/// a file's whole content adopted by watch mode, one chunk record (under 100 bytes) per 4 MiB
/// chunk, so 256 MiB is a batch for a file of some 10 TiB. A writer refuses to store more.
const MAX_SEGMENT_OBJECT: u64 = 256 << 20;

/// The largest checkpoint or snapshot manifest: JSON listing one 66-byte part hash per part,
/// a part holding about 1024 entries, plus a snapshot's message. 64 MiB is a million parts,
/// some billion metadata entries. A writer refuses to store more.
const MAX_MANIFEST: u64 = 64 << 20;

/// The largest history object: a git pack of one commit's new objects. Files over the
/// history's size limit (1 MiB by default, settable) are committed as pointers, but the
/// number of files is not bounded by the format; 1 GiB of new code and configs in one commit
/// is taken as the most. A writer refuses to store more.
const MAX_HISTORY: u64 = 1 << 30;

/// An object tierfs reads from a store whole, by what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WholeObject {
    /// `config`: the store's JSON (format, id, redundancy, time).
    Config,
    /// `keys/<id>`: the data key wrapped by one secret, JSON.
    WrappedKey,
    /// `index/<id>`: the locations of one pack's blocks.
    IndexSegment,
    /// `ws/<w>/j/<n>`: a journal segment.
    JournalSegment,
    /// `ws/<w>/cp/<seq>`: a checkpoint manifest.
    Checkpoint,
    /// `ws/<w>/part/<hash>`: a checkpoint part.
    CheckpointPart,
    /// `ws/<w>/snap/<id>`: a snapshot manifest.
    Snapshot,
    /// `ws/<w>/lease`: the writer lease.
    Lease,
    /// `ws/<w>/hist/<n>`: a history object.
    History,
    /// `ws/<w>/hot`: the hot set.
    HotSet,
}

impl WholeObject {
    pub const ALL: [WholeObject; 10] = [
        WholeObject::Config,
        WholeObject::WrappedKey,
        WholeObject::IndexSegment,
        WholeObject::JournalSegment,
        WholeObject::Checkpoint,
        WholeObject::CheckpointPart,
        WholeObject::Snapshot,
        WholeObject::Lease,
        WholeObject::History,
        WholeObject::HotSet,
    ];

    /// The most bytes an object of this kind may have, as stored (sealed, where it is sealed).
    pub const fn max_len(self) -> u64 {
        match self {
            // Four short fields, under 200 bytes; the rest is room for fields to come.
            WholeObject::Config => 64 << 10,
            // Fixed-length hex fields and Argon2 parameters (some 400 bytes) and a label a
            // user gives.
            WholeObject::WrappedKey => 64 << 10,
            // `version u8 | n u32 | n entries`, one entry per block of one pack.
            WholeObject::IndexSegment => ENVELOPE + 5 + MAX_PACK_BLOCKS * INDEX_ENTRY as u64,
            WholeObject::JournalSegment => MAX_SEGMENT_OBJECT,
            WholeObject::Checkpoint | WholeObject::Snapshot => MAX_MANIFEST,
            // A part is cut at the entry that takes it to MAX_PART_BYTES: one entry more.
            WholeObject::CheckpointPart => ENVELOPE + MAX_PART_BYTES as u64 + MAX_ENTRY_BYTES,
            // JSON of a few short fields (session, host:pid, boot id, times), some 300 bytes.
            WholeObject::Lease => 64 << 10,
            WholeObject::History => MAX_HISTORY,
            // `"TFH2" | p u32 | n u32 | n × 20 bytes`, at worst one run per chunk.
            WholeObject::HotSet => ENVELOPE + 12 + 20 * MAX_HOT_CHUNKS as u64,
        }
    }

    /// Whether objects of this kind live under a workspace's prefix (`ws/<w>/…`).
    pub const fn in_workspace(self) -> bool {
        match self {
            WholeObject::Config | WholeObject::WrappedKey | WholeObject::IndexSegment => false,
            WholeObject::JournalSegment
            | WholeObject::Checkpoint
            | WholeObject::CheckpointPart
            | WholeObject::Snapshot
            | WholeObject::Lease
            | WholeObject::History
            | WholeObject::HotSet => true,
        }
    }

    /// What it is, for messages ("more than the 65536 bytes a lease record can be").
    pub const fn what(self) -> &'static str {
        match self {
            WholeObject::Config => "a store config",
            WholeObject::WrappedKey => "a wrapped key record",
            WholeObject::IndexSegment => "an index segment",
            WholeObject::JournalSegment => "a journal segment",
            WholeObject::Checkpoint => "a checkpoint manifest",
            WholeObject::CheckpointPart => "a checkpoint part",
            WholeObject::Snapshot => "a snapshot manifest",
            WholeObject::Lease => "a lease record",
            WholeObject::History => "a history object",
            WholeObject::HotSet => "a hot set",
        }
    }

    /// The bound a read of this kind passes to the backend layer.
    pub const fn limit(self) -> SizeLimit {
        SizeLimit { max_len: self.max_len(), what: self.what() }
    }

    /// A writer's check: `len` bytes stored at `key` would be refused by every reader.
    pub fn check(self, key: &str, len: usize) -> Result<(), StoreError> {
        if len as u64 > self.max_len() {
            return Err(StoreError::TooLarge { key: key.to_string(), len: len as u64, limit: self.limit() });
        }
        Ok(())
    }
}

/// The largest object of any kind: the bound of reads that copy objects whatever they are
/// (repairs).
pub const LARGEST_OBJECT: u64 = largest(false, LARGEST_PACK);

/// The largest object of a workspace (`ws/<w>/…`): the bound of a scrub's read of one, which
/// does not tell their kinds apart by key.
pub const LARGEST_WORKSPACE_OBJECT: u64 = largest(true, 0);

/// The largest limit of [`WholeObject::ALL`] (of the workspace's kinds only, with
/// `workspace_only`), or `max` if that is larger.
const fn largest(workspace_only: bool, mut max: u64) -> u64 {
    let kinds = WholeObject::ALL;
    let mut i = 0;
    while i < kinds.len() {
        if (!workspace_only || kinds[i].in_workspace()) && kinds[i].max_len() > max {
            max = kinds[i].max_len();
        }
        i += 1;
    }
    max
}

// Every limit admits what its writers produce, checked when the crate is built: a full segment
// of batches with its header; an index segment of the most blocks a pack holds; and a 2 GiB
// object where a small one is expected is over its limit.
const _: () = {
    assert!(MAX_SEGMENT_BYTES as u64 + (64 << 10) <= WholeObject::JournalSegment.max_len());
    assert!(WholeObject::IndexSegment.max_len() >= MAX_PACK_BLOCKS * INDEX_ENTRY as u64);
    assert!(WholeObject::Lease.max_len() < 2 << 30 && WholeObject::JournalSegment.max_len() < 2 << 30);
    assert!(WholeObject::Config.max_len() < 2 << 30 && WholeObject::HotSet.max_len() < 2 << 30);
    assert!(LARGEST_OBJECT >= LARGEST_PACK && LARGEST_WORKSPACE_OBJECT <= LARGEST_OBJECT);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_refuse_what_readers_would() {
        let max = WholeObject::Lease.max_len() as usize;
        assert!(WholeObject::Lease.check("ws/x/lease", max).is_ok());
        let err = WholeObject::Lease.check("ws/x/lease", max + 1).expect_err("one byte over");
        assert!(err.to_string().contains("ws/x/lease") && err.to_string().contains("a lease record"), "{err}");
        assert!(WholeObject::ALL.iter().all(|k| k.max_len() <= LARGEST_OBJECT));
    }
}
