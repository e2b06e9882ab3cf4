//! Key and value encodings of the metadata store (docs/FORMAT.md, "Local metadata").
//!
//! Keys start with a one-byte table tag so each table is a contiguous, ordered key range;
//! integers in keys are big-endian so RocksDB's byte order is numeric order and a directory's
//! entries form one prefix range. Values are fixed little-endian layouts with a leading
//! version byte, so a record written by a newer layout is detected instead of misread.

use crate::types::{Attr, FileKind, Ino, Timestamp};

use super::MetaError;

/// `S` → schema version (u32 LE).
pub const SCHEMA_KEY: &[u8] = b"S";
/// `C` + counter name → u64 LE.
pub const NEXT_INO_KEY: &[u8] = b"Cnext_ino";
/// `R` + name → local bookkeeping that is never journaled. The number of the last journaled
/// batch this store holds (u64 LE).
pub const JOURNAL_SEQ_KEY: &[u8] = b"Rjournal_seq";
/// The last journaled batch this node knows is in the store (u64 LE).
pub const DURABLE_SEQ_KEY: &[u8] = b"Rdurable_seq";
/// Local: present when names and values are sealed at rest (`--encrypt-cache`), holding the
/// cache key's check value (`CacheCipher::key_check`).
pub const SEALED_KEY: &[u8] = b"Rsealed";

/// Whether a key belongs to the workspace's shared state (journaled and checkpointed), as
/// opposed to this node's bookkeeping (schema, dirty markers, journal position).
pub fn is_shared(key: &[u8]) -> bool {
    matches!(key.first(), Some(b'I' | b'D' | b'X' | b'L' | b'O' | b'C' | b'K' | b'U' | b'B'))
}

const TAG_INODE: u8 = b'I';
const TAG_DENTRY: u8 = b'D';
const TAG_XATTR: u8 = b'X';
const TAG_SYMLINK: u8 = b'L';
const TAG_ORPHAN: u8 = b'O';

/// Layout versions of an inode record: version 2 adds a flags byte at the end (read: both).
const INODE_RECORD_V1: u8 = 1;
const INODE_RECORD_V2: u8 = 2;
/// Encoded size of a version 1 inode record, version byte included.
const INODE_RECORD_V1_LEN: usize = 1 + 1 + 2 + 4 * 4 + 8 + 8 + 4 * 12;
/// Encoded size of a version 2 inode record (version 1 plus the flags byte).
const INODE_RECORD_LEN: usize = INODE_RECORD_V1_LEN + 1;
/// Inode flag: the file has no holes (see [`InodeRecord::dense`]).
const INODE_FLAG_DENSE: u8 = 1;
/// Inode flag: no xattr was ever set on it (see [`InodeRecord::no_xattrs`]).
const INODE_FLAG_NO_XATTRS: u8 = 2;

fn tagged(tag: u8, ino: Ino, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + rest.len());
    k.push(tag);
    k.extend_from_slice(&ino.to_be_bytes());
    k.extend_from_slice(rest);
    k
}

pub fn inode_key(ino: Ino) -> Vec<u8> {
    tagged(TAG_INODE, ino, &[])
}

/// The first byte of every inode key: the inode table is `[b"I", b"J")`.
pub const INODE_TABLE: [u8; 1] = [TAG_INODE];

/// The first byte of every directory entry key: the entry table is `[b"D", b"E")`.
pub const DENTRY_TABLE: [u8; 1] = [TAG_DENTRY];

pub fn dentry_key(parent: Ino, name: &[u8]) -> Vec<u8> {
    tagged(TAG_DENTRY, parent, name)
}

/// Prefix shared by all entries of directory `parent`.
pub fn dentry_prefix(parent: Ino) -> Vec<u8> {
    tagged(TAG_DENTRY, parent, &[])
}

pub fn xattr_key(ino: Ino, name: &[u8]) -> Vec<u8> {
    tagged(TAG_XATTR, ino, name)
}

pub fn xattr_prefix(ino: Ino) -> Vec<u8> {
    tagged(TAG_XATTR, ino, &[])
}

pub fn symlink_key(ino: Ino) -> Vec<u8> {
    tagged(TAG_SYMLINK, ino, &[])
}

pub fn orphan_key(ino: Ino) -> Vec<u8> {
    tagged(TAG_ORPHAN, ino, &[])
}

/// Prefix of all orphan markers (inodes unlinked while open, `O_TMPFILE` files not named yet).
pub const ORPHAN_TABLE: [u8; 1] = [TAG_ORPHAN];

/// The first byte of every symlink target's key.
pub const SYMLINK_TABLE: [u8; 1] = [TAG_SYMLINK];

/// The first byte of every xattr's key.
pub const XATTR_TABLE: [u8; 1] = [TAG_XATTR];

/// Decodes the inode number that follows the tag byte of a key.
pub fn key_ino(key: &[u8]) -> Result<Ino, MetaError> {
    key.get(1..9)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| MetaError::Corrupt(format!("short key {key:?}")))
}

/// An inode as stored: its attributes plus the parent of a directory (for `..`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InodeRecord {
    pub attr: Attr,
    /// For directories, the directory that holds it; for other kinds, the directory it was
    /// created in (informational only: hard links have several).
    pub parent: Ino,
    /// A regular file that has never had a hole (written from its start without gaps, never
    /// grown by truncate, fallocate or a copy): its allocation follows from its size, so
    /// `st_blocks` needs no look at its data file. False when unsure (records of version 1).
    pub dense: bool,
    /// No xattr was ever set on this inode, so removing it needs no scan for them (each scan
    /// is a RocksDB iterator seek, a fifth of an unlink's metadata work). Cleared by the first
    /// `setxattr`, never set again. False when unsure (records of version 1).
    pub no_xattrs: bool,
}

fn put_ts(out: &mut Vec<u8>, t: Timestamp) {
    out.extend_from_slice(&t.secs.to_le_bytes());
    out.extend_from_slice(&t.nanos.to_le_bytes());
}

pub fn encode_inode(rec: &InodeRecord) -> Vec<u8> {
    let a = &rec.attr;
    let mut v = Vec::with_capacity(INODE_RECORD_LEN);
    v.push(INODE_RECORD_V2);
    v.push(a.kind.code());
    v.extend_from_slice(&a.perm.to_le_bytes());
    v.extend_from_slice(&a.nlink.to_le_bytes());
    v.extend_from_slice(&a.uid.to_le_bytes());
    v.extend_from_slice(&a.gid.to_le_bytes());
    v.extend_from_slice(&a.rdev.to_le_bytes());
    v.extend_from_slice(&a.size.to_le_bytes());
    v.extend_from_slice(&rec.parent.to_le_bytes());
    for t in [a.atime, a.mtime, a.ctime, a.crtime] {
        put_ts(&mut v, t);
    }
    let mut flags = 0;
    if rec.dense {
        flags |= INODE_FLAG_DENSE;
    }
    if rec.no_xattrs {
        flags |= INODE_FLAG_NO_XATTRS;
    }
    v.push(flags);
    v
}

/// A little-endian reader over a record that has already been length-checked.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.0[..N]);
        self.0 = &self.0[N..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn ts(&mut self) -> Timestamp {
        let secs = i64::from_le_bytes(self.take());
        Timestamp { secs, nanos: self.u32() }
    }
}

pub fn decode_inode(ino: Ino, bytes: &[u8]) -> Result<InodeRecord, MetaError> {
    let known = matches!(
        (bytes.first(), bytes.len()),
        (Some(&INODE_RECORD_V1), INODE_RECORD_V1_LEN) | (Some(&INODE_RECORD_V2), INODE_RECORD_LEN)
    );
    if !known {
        return Err(MetaError::Corrupt(format!(
            "inode {ino}: record of {} bytes, layout version {:?}",
            bytes.len(),
            bytes.first()
        )));
    }
    let mut r = Reader(&bytes[1..]);
    let code = r.u8();
    let kind =
        FileKind::from_code(code).ok_or_else(|| MetaError::Corrupt(format!("inode {ino}: unknown kind {code}")))?;
    let perm = r.u16();
    let nlink = r.u32();
    let uid = r.u32();
    let gid = r.u32();
    let rdev = r.u32();
    let size = r.u64();
    let parent = r.u64();
    let (atime, mtime, ctime, crtime) = (r.ts(), r.ts(), r.ts(), r.ts());
    let flags = if bytes[0] == INODE_RECORD_V2 { r.u8() } else { 0 };
    let dense = flags & INODE_FLAG_DENSE != 0;
    let no_xattrs = flags & INODE_FLAG_NO_XATTRS != 0;
    let blocks = size.div_ceil(512);
    Ok(InodeRecord {
        attr: Attr { ino, kind, perm, nlink, uid, gid, rdev, size, blocks, atime, mtime, ctime, crtime },
        parent,
        dense,
        no_xattrs,
    })
}

pub fn encode_dentry(ino: Ino, kind: FileKind) -> [u8; 9] {
    let mut v = [0u8; 9];
    v[..8].copy_from_slice(&ino.to_le_bytes());
    v[8] = kind.code();
    v
}

pub fn decode_dentry(bytes: &[u8]) -> Result<(Ino, FileKind), MetaError> {
    if bytes.len() != 9 {
        return Err(MetaError::Corrupt(format!("directory entry of {} bytes", bytes.len())));
    }
    let mut ino = [0u8; 8];
    ino.copy_from_slice(&bytes[..8]);
    let kind = FileKind::from_code(bytes[8])
        .ok_or_else(|| MetaError::Corrupt(format!("directory entry kind {}", bytes[8])))?;
    Ok((u64::from_le_bytes(ino), kind))
}

pub fn decode_u64(bytes: &[u8]) -> Result<u64, MetaError> {
    bytes
        .try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| MetaError::Corrupt(format!("counter of {} bytes", bytes.len())))
}

/// A regular file's record, for tests.
#[cfg(test)]
pub(crate) fn test_file_record(ino: Ino, size: u64) -> InodeRecord {
    let t = Timestamp { secs: 1, nanos: 0 };
    InodeRecord {
        attr: Attr {
            ino,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            size,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        },
        parent: 1,
        dense: false,
        no_xattrs: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_ts() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..1_000_000_000).prop_map(|(secs, nanos)| Timestamp { secs, nanos })
    }

    proptest! {
        #[test]
        fn inode_round_trips(ino in 1u64.., code in 1u8..=7, perm in 0u16..0o10000, nlink: u32, uid: u32,
                             gid: u32, rdev: u32, size: u64, parent: u64, dense: bool, no_xattrs: bool,
                             t in proptest::array::uniform4(arb_ts())) {
            let kind = FileKind::from_code(code).expect("valid code");
            let rec = InodeRecord {
                attr: Attr { ino, kind, perm, nlink, uid, gid, rdev, size, blocks: size.div_ceil(512),
                             atime: t[0], mtime: t[1], ctime: t[2], crtime: t[3] },
                parent,
                dense,
                no_xattrs,
            };
            let bytes = encode_inode(&rec);
            prop_assert_eq!(decode_inode(ino, &bytes).expect("decodes"), rec.clone());
            // A version 1 record (written before the flags byte existed) reads as not dense and
            // as maybe having xattrs.
            let mut v1 = bytes[..INODE_RECORD_V1_LEN].to_vec();
            v1[0] = INODE_RECORD_V1;
            prop_assert_eq!(decode_inode(ino, &v1).expect("decodes v1"), InodeRecord { dense: false, no_xattrs: false, ..rec });
        }

        #[test]
        fn dentry_round_trips(ino: u64, code in 1u8..=7) {
            let kind = FileKind::from_code(code).expect("valid code");
            prop_assert_eq!(decode_dentry(&encode_dentry(ino, kind)).expect("decodes"), (ino, kind));
        }

        #[test]
        fn dentry_keys_sort_by_parent_then_name(a: u64, b: u64, na in ".{0,8}", nb in ".{0,8}") {
            let (ka, kb) = (dentry_key(a, na.as_bytes()), dentry_key(b, nb.as_bytes()));
            prop_assert_eq!(ka.cmp(&kb), (a, na.as_bytes()).cmp(&(b, nb.as_bytes())));
        }
    }

    proptest! {
        #[test]
        fn chunk_records_round_trip_and_v1_reads_as_dense(block: [u8; 32], len: u32, data: u32, resident: bool) {
            let rec = ChunkRecord { block, len, data, resident };
            let bytes = encode_chunk(&rec);
            prop_assert_eq!(decode_chunk(&bytes).expect("decodes"), rec);
            prop_assert_eq!(decode_chunk(&not_resident(&bytes)).expect("decodes"), ChunkRecord { resident: false, ..rec });
            // A version 1 record (before the data length): all of the chunk counts as data.
            let mut v1 = vec![CHUNK_RECORD_V1];
            v1.extend_from_slice(&block);
            v1.extend_from_slice(&len.to_le_bytes());
            v1.push(u8::from(resident));
            prop_assert_eq!(decode_chunk(&v1).expect("decodes v1"), ChunkRecord { data: len, ..rec });
            prop_assert_eq!(decode_chunk(&not_resident(&v1)).expect("decodes v1"), ChunkRecord { data: len, resident: false, ..rec });
            prop_assert!(decode_chunk(&bytes[..bytes.len() - 1]).is_err());
        }
    }

    #[test]
    fn truncated_record_is_corrupt_not_garbage() {
        let err = decode_inode(5, &[1, 2, 3]).expect_err("must fail");
        assert!(err.to_string().contains("inode 5"), "{err}");
    }
}

// ---- cold tier tables ----------------------------------------------------------------------

const TAG_CHUNK: u8 = b'K';
const TAG_DIRTY: u8 = b'Y';
const TAG_UNSEALED: u8 = b'U';
const TAG_BLOCK: u8 = b'B';

/// Prefix of the chunk table: `K` ino chunk-index → [`ChunkRecord`].
pub const CHUNK_TABLE: [u8; 1] = [TAG_CHUNK];
/// Prefix of the dirty-inode markers: `Y` ino → empty.
pub const DIRTY_TABLE: [u8; 1] = [TAG_DIRTY];

pub fn chunk_key(ino: Ino, index: u64) -> Vec<u8> {
    tagged(TAG_CHUNK, ino, &index.to_be_bytes())
}

/// All chunk keys of `ino` are in `[chunk_prefix(ino), chunk_prefix(ino + 1))`.
pub fn chunk_prefix(ino: Ino) -> Vec<u8> {
    tagged(TAG_CHUNK, ino, &[])
}

pub fn dirty_key(ino: Ino) -> Vec<u8> {
    tagged(TAG_DIRTY, ino, &[])
}

/// Prefix of the unsealed-chunk marks: `U` ino chunk-index → empty. Shared state: a chunk
/// written since it was last sealed, so a node that restores the workspace can tell a chunk
/// whose data never reached the store from a hole (which has neither a record nor a mark).
pub const UNSEALED_TABLE: [u8; 1] = [TAG_UNSEALED];

pub fn unsealed_key(ino: Ino, index: u64) -> Vec<u8> {
    tagged(TAG_UNSEALED, ino, &index.to_be_bytes())
}

pub fn block_key(id: &[u8; 32]) -> Vec<u8> {
    let mut k = Vec::with_capacity(33);
    k.push(TAG_BLOCK);
    k.extend_from_slice(id);
    k
}

/// Layout versions of a chunk record: 2 adds the bytes of data (v1 records read as dense).
const CHUNK_RECORD_V1: u8 = 1;
const CHUNK_RECORD_V2: u8 = 2;
const CHUNK_RECORD_V1_LEN: usize = 1 + 32 + 4 + 1;
const CHUNK_RECORD_LEN: usize = 1 + 32 + 4 + 4 + 1;

/// The last sealed (and stored) content of one chunk of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord {
    /// Block id of the chunk's bytes ([`crate::block::ZERO_BLOCK`] for all zeros).
    pub block: [u8; 32],
    /// Bytes in the chunk (the last chunk of a file is short).
    pub len: u32,
    /// Bytes of it that are data: its pages that are not all zeros ([`crate::block::data_runs`]),
    /// what a resident copy holds on disk at most; its zero pages are holes.
    pub data: u32,
    /// Whether the local data file still holds the bytes (false once evicted).
    pub resident: bool,
}

pub fn encode_chunk(c: &ChunkRecord) -> [u8; CHUNK_RECORD_LEN] {
    let mut out = [0u8; CHUNK_RECORD_LEN];
    out[0] = CHUNK_RECORD_V2;
    out[1..33].copy_from_slice(&c.block);
    out[33..37].copy_from_slice(&c.len.to_le_bytes());
    out[37..41].copy_from_slice(&c.data.to_le_bytes());
    out[41] = u8::from(c.resident);
    out
}

pub fn decode_chunk(v: &[u8]) -> Result<ChunkRecord, MetaError> {
    let corrupt = || MetaError::Corrupt(format!("chunk record of {} bytes, version {:?}", v.len(), v.first()));
    let u32_at = |at: usize| v.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    let (data, resident) = match (v.first(), v.len()) {
        (Some(&CHUNK_RECORD_V1), CHUNK_RECORD_V1_LEN) => (None, v[37]),
        (Some(&CHUNK_RECORD_V2), CHUNK_RECORD_LEN) => (Some(u32_at(37).ok_or_else(corrupt)?), v[41]),
        _ => return Err(corrupt()),
    };
    let len = u32_at(33).ok_or_else(corrupt)?;
    Ok(ChunkRecord {
        block: v[1..33].try_into().map_err(|_| corrupt())?,
        len,
        data: data.unwrap_or(len),
        resident: resident != 0,
    })
}

pub fn is_chunk_key(key: &[u8]) -> bool {
    key.first() == Some(&TAG_CHUNK)
}

/// A chunk record value as other nodes see it: not resident.
pub fn not_resident(v: &[u8]) -> Vec<u8> {
    let mut out = v.to_vec();
    if let (Some(&version), Some(last)) = (v.first(), out.last_mut()) {
        if (version, v.len()) == (CHUNK_RECORD_V1, CHUNK_RECORD_V1_LEN)
            || (version, v.len()) == (CHUNK_RECORD_V2, CHUNK_RECORD_LEN)
        {
            *last = 0;
        }
    }
    out
}

/// Decodes `(ino, chunk index)` from a chunk key (or an unsealed-chunk mark's key).
pub fn decode_chunk_key(key: &[u8]) -> Result<(Ino, u64), MetaError> {
    let ino = key_ino(key)?;
    let idx = key
        .get(9..17)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| MetaError::Corrupt(format!("short chunk key {key:?}")))?;
    Ok((ino, idx))
}
