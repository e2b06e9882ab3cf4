//! Blocks, packs and the pack index: how sealed file data is laid out in the store.
//!
//! A *block* is an immutable run of file bytes (one chunk of a file, at most
//! [`CHUNK_SIZE`]) named by the keyed blake3 hash of its plaintext ([`BlockId`]), so equal
//! chunks of any file, snapshot or workspace of a store are stored once. Blocks travel in
//! *packs*: one object holding many individually encrypted blocks, so ten thousand small files
//! cost a handful of PUTs, and any one block can still be fetched with a range GET of its
//! pack. Where each block lives is the *index*: [`BlockLoc`] entries, kept locally in the
//! metadata store and uploaded with every pack as an encrypted index segment.
//!
//! Pack layout (docs/FORMAT.md, "Packs"):
//!
//! ```text
//! envelope(block 1) | envelope(block 2) | … | envelope(trailer) | trailer_len u32 LE | "TFP1"
//! ```
//!
//! Each block envelope is `Keys::seal(Block, block id, stored)`, so a block read checks the
//! AEAD tag (bound to the block's id) and then the id itself (blake3 of the plaintext). The
//! stored bytes are the plaintext itself, or, for a chunk with holes, its *sparse* encoding:
//! only the data runs, then a table of where they go ([`PackBuilder::seal_staged_runs`]). A
//! block is sparse exactly when its envelope holds fewer bytes than its plaintext length
//! (which the trailer and the index record), so the zeros of a hole inside a chunk are never
//! uploaded, and blocks written before the encoding existed read as they always did. The
//! trailer lists the pack's blocks; it makes a pack self-describing, so the index can be
//! rebuilt from the packs alone and scrub can check every block of a pack.
//!
//! Invariants: a pack and its index segment are written before any metadata refers to their
//! blocks; packs are never modified after upload (only deleted by garbage collection).

use bytes::{Bytes, BytesMut};

use std::ops::Range;

use crate::crypto::{CryptoError, ENVELOPE_OVERHEAD, Hash, Keys, ObjectKind, STAGE_GAP, sealed_len};
use crate::types::ErrorKind;

/// Size of a file chunk and thus the largest block: big enough that per-block overhead
/// (an index entry, a RocksDB record, a range GET) is negligible next to the data, small
/// enough that a random read of a cold file fetches little more than it needs.
pub const CHUNK_SIZE: u64 = 4 << 20;

/// Format version of packs and index segments (docs/FORMAT.md). 2: blocks may be sparse;
/// version 1 packs (all blocks dense) read the same way.
pub const PACK_FORMAT: u8 = 2;

const PACK_MAGIC: &[u8; 4] = b"TFP1";
/// `trailer_len` + magic after the trailer envelope.
pub const PACK_FOOTER: usize = 8;
/// Bytes per entry in a pack trailer: id, offset, sealed length, plaintext length.
pub const TRAILER_ENTRY: usize = 32 + 8 + 4 + 4;
/// Bytes per entry in an index segment: id, pack id, offset, sealed and plain length, pack length.
pub const INDEX_ENTRY: usize = 32 + 32 + 8 + 4 + 4 + 8;
/// Bytes per run in a sparse block's table: offset u32 LE, length u32 LE.
const RUN_ENTRY: usize = 8;

/// The unit holes are found in inside a block: a page of zeros is a hole, neither stored in a
/// sparse block nor written back into a data file.
pub const PAGE: usize = 4096;

/// The runs of `bytes` that hold data: its pages (of [`PAGE`] bytes, the last one maybe
/// short) that are not all zeros, adjacent ones merged, in order.
pub fn data_runs(bytes: &[u8]) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, page) in bytes.chunks(PAGE).enumerate() {
        // An OR over the page vectorizes; `any` would stop early but compare byte by byte.
        if page.iter().fold(0u8, |acc, &b| acc | b) != 0 {
            let (start, end) = (i * PAGE, i * PAGE + page.len());
            match out.last_mut() {
                Some(r) if r.end == start => r.end = end,
                _ => out.push(start..end),
            }
        }
    }
    out
}

/// The name of a block: keyed blake3 of its plaintext.
pub type BlockId = Hash;

/// The id of a block of zeros is never uploaded: sparse regions cost nothing in the store.
pub const ZERO_BLOCK: BlockId = [0; 32];

/// Why a pack or index segment could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("pack {pack}: {reason}")]
    BadPack { pack: String, reason: String },
    #[error("index segment {segment}: {reason}")]
    BadIndex { segment: String, reason: String },
    #[error(
        "{what} was written in format {found}, newer than this tierfs understands ({supported}): \
         upgrade tierfs"
    )]
    TooNew { what: String, found: u8, supported: u8 },
    #[error("block {block}: {reason}")]
    BadBlock { block: String, reason: String },
    #[error(transparent)]
    Crypto(#[from] CryptoError),
}

impl BlockError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BlockError::BadPack { .. } | BlockError::BadIndex { .. } | BlockError::BadBlock { .. } => {
                ErrorKind::Corrupt
            }
            BlockError::TooNew { .. } => ErrorKind::InvalidInput,
            BlockError::Crypto(e) => e.kind(),
        }
    }
}

type Result<T> = std::result::Result<T, BlockError>;

/// Where one block lives in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLoc {
    /// The pack holding it.
    pub pack: Hash,
    /// Byte offset of the block's envelope in the pack.
    pub offset: u64,
    /// Length of the envelope (plaintext + [`crate::crypto::ENVELOPE_OVERHEAD`]).
    pub sealed_len: u32,
    /// Length of the plaintext.
    pub plain_len: u32,
    /// Total length of the pack (erasure-coded reads need it to find shards).
    pub pack_len: u64,
}

impl BlockLoc {
    /// Encoded length of [`BlockLoc::encode`].
    pub const ENCODED_LEN: usize = INDEX_ENTRY - 32;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pack);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.sealed_len.to_le_bytes());
        out.extend_from_slice(&self.plain_len.to_le_bytes());
        out.extend_from_slice(&self.pack_len.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Option<BlockLoc> {
        if b.len() != Self::ENCODED_LEN {
            return None;
        }
        Some(BlockLoc {
            pack: b[0..32].try_into().ok()?,
            offset: u64::from_le_bytes(b[32..40].try_into().ok()?),
            sealed_len: u32::from_le_bytes(b[40..44].try_into().ok()?),
            plain_len: u32::from_le_bytes(b[44..48].try_into().ok()?),
            pack_len: u64::from_le_bytes(b[48..56].try_into().ok()?),
        })
    }

    /// The byte range of the block's envelope in its pack.
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + u64::from(self.sealed_len)
    }

    /// Bytes the envelope holds: the plaintext length, or less for a sparse block.
    pub fn stored_len(&self) -> u64 {
        u64::from(self.sealed_len).saturating_sub(ENVELOPE_OVERHEAD as u64)
    }
}

/// Store key of a pack: `packs/<first byte hex>/<id hex>` (fan-out keeps listings short).
pub fn pack_key(pack: &Hash) -> String {
    let h = hex::encode(pack);
    format!("packs/{}/{h}", &h[..2])
}

/// Store key of an index segment.
pub fn index_key(segment: &Hash) -> String {
    format!("index/{}", hex::encode(segment))
}

/// A fresh random id for a pack or index segment (names reveal nothing about contents).
pub fn random_id() -> Hash {
    rand::random()
}

/// Builds one pack from blocks, encrypting each into its envelope as it is added. A block can
/// be added from a slice ([`PackBuilder::add`], one copy) or staged: its plaintext read
/// straight into the pack ([`PackBuilder::stage`]), hashed there, then sealed in place
/// ([`PackBuilder::seal_staged`]) or dropped ([`PackBuilder::drop_staged`]).
pub struct PackBuilder {
    id: Hash,
    buf: Vec<u8>,
    entries: Vec<(BlockId, u64, u32, u32)>,
    /// Where the staged block's envelope starts, if one is staged.
    staged: Option<usize>,
}

/// A finished pack: its id, bytes and where each block landed.
pub struct Pack {
    pub id: Hash,
    pub bytes: Bytes,
    pub blocks: Vec<(BlockId, BlockLoc)>,
}

impl PackBuilder {
    pub fn new(capacity: usize) -> PackBuilder {
        PackBuilder { id: random_id(), buf: Vec::with_capacity(capacity + 4096), entries: Vec::new(), staged: None }
    }

    /// Bytes in the pack so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Seals `plaintext` (whose id the caller computed with [`Keys::block_id`]) into the pack.
    pub fn add(&mut self, keys: &Keys, id: &BlockId, plaintext: &[u8]) {
        self.drop_staged();
        let offset = self.buf.len() as u64;
        keys.seal_into(ObjectKind::Block, id, plaintext, &mut self.buf);
        let sealed = (self.buf.len() as u64 - offset) as u32;
        self.entries.push((*id, offset, sealed, plaintext.len() as u32));
    }

    /// Room for the plaintext of the next block, `len` zero bytes at the end of the pack, for
    /// the caller to fill in place. A block staged before and not sealed is dropped.
    pub fn stage(&mut self, len: usize) -> &mut [u8] {
        self.drop_staged();
        let start = self.buf.len();
        self.buf.reserve(sealed_len(len));
        self.buf.resize(start + STAGE_GAP + len, 0);
        self.staged = Some(start);
        &mut self.buf[start + STAGE_GAP..]
    }

    /// The staged plaintext (empty if nothing is staged).
    pub fn staged(&self) -> &[u8] {
        self.staged.map_or(&[], |start| &self.buf[start + STAGE_GAP..])
    }

    /// Seals the staged plaintext in place as block `id` (the caller hashed [`Self::staged`]).
    ///
    /// # Panics
    /// If nothing is staged.
    pub fn seal_staged(&mut self, keys: &Keys, id: &BlockId) {
        let start = self.staged.expect("tierfs: seal_staged without a staged block");
        let plain_len = self.buf.len() - start - STAGE_GAP;
        self.seal_staged_as(keys, id, plain_len);
    }

    /// Seals the staged plaintext as block `id`, storing only `runs` (the parts of it that
    /// hold data, in order and apart; the rest is zeros, a hole of the file) when that is
    /// shorter: the runs' bytes move to the front in place, followed by their table
    /// (docs/FORMAT.md, "Sparse blocks"). Returns the bytes stored.
    ///
    /// # Panics
    /// If nothing is staged, or a run is out of order or past the staged plaintext.
    pub fn seal_staged_runs(&mut self, keys: &Keys, id: &BlockId, runs: &[Range<usize>]) -> usize {
        let start = self.staged.expect("tierfs: seal_staged_runs without a staged block");
        let base = start + STAGE_GAP;
        let plain_len = self.buf.len() - base;
        let data: usize = runs.iter().map(|r| r.len()).sum();
        let encoded = data + RUN_ENTRY * runs.len() + 4;
        if encoded < plain_len {
            let mut at = base;
            let mut prev_end = 0;
            for r in runs {
                assert!(r.start >= prev_end && r.end <= plain_len, "tierfs: bad run {r:?} of a staged block");
                prev_end = r.end;
                self.buf.copy_within(base + r.start..base + r.end, at);
                at += r.len();
            }
            self.buf.truncate(at);
            for r in runs {
                self.buf.extend_from_slice(&(r.start as u32).to_le_bytes());
                self.buf.extend_from_slice(&(r.len() as u32).to_le_bytes());
            }
            self.buf.extend_from_slice(&(runs.len() as u32).to_le_bytes());
        }
        let stored = self.buf.len() - base;
        self.seal_staged_as(keys, id, plain_len);
        stored
    }

    fn seal_staged_as(&mut self, keys: &Keys, id: &BlockId, plain_len: usize) {
        let start = self.staged.take().expect("tierfs: seal_staged without a staged block");
        keys.seal_staged(ObjectKind::Block, id, &mut self.buf, start);
        let sealed = (self.buf.len() - start) as u32;
        self.entries.push((*id, start as u64, sealed, plain_len as u32));
    }

    /// Forgets the staged plaintext (a block the store already has); nothing if none is staged.
    pub fn drop_staged(&mut self) {
        if let Some(start) = self.staged.take() {
            self.buf.truncate(start);
        }
    }

    /// Appends the sealed trailer and footer (a staged block not sealed is dropped).
    pub fn finish(mut self, keys: &Keys) -> Pack {
        self.drop_staged();
        let mut trailer = Vec::with_capacity(5 + self.entries.len() * TRAILER_ENTRY);
        trailer.push(PACK_FORMAT);
        trailer.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (id, offset, sealed, plain) in &self.entries {
            trailer.extend_from_slice(id);
            trailer.extend_from_slice(&offset.to_le_bytes());
            trailer.extend_from_slice(&sealed.to_le_bytes());
            trailer.extend_from_slice(&plain.to_le_bytes());
        }
        let start = self.buf.len();
        keys.seal_into(ObjectKind::PackTrailer, &self.id, &trailer, &mut self.buf);
        let trailer_len = (self.buf.len() - start) as u32;
        self.buf.extend_from_slice(&trailer_len.to_le_bytes());
        self.buf.extend_from_slice(PACK_MAGIC);
        let pack_len = self.buf.len() as u64;
        let blocks = self
            .entries
            .iter()
            .map(|&(id, offset, sealed_len, plain_len)| {
                (id, BlockLoc { pack: self.id, offset, sealed_len, plain_len, pack_len })
            })
            .collect();
        Pack { id: self.id, bytes: Bytes::from(self.buf), blocks }
    }
}

/// Decrypts and verifies one block envelope: the AEAD tag binds it to `id`, a sparse block is
/// expanded to its `plain_len` bytes, and the plaintext must hash to `id` under this store's key.
pub fn open_block(keys: &Keys, id: &BlockId, plain_len: u32, sealed: &[u8]) -> Result<Vec<u8>> {
    let stored = keys.open(ObjectKind::Block, id, sealed)?;
    let plain = if stored.len() == plain_len as usize { stored } else { expand(id, plain_len, &stored)?.to_vec() };
    check_id(keys, id, &plain)?;
    Ok(plain)
}

/// The plaintext of a block must hash to its id under this store's key.
fn check_id(keys: &Keys, id: &BlockId, plain: &[u8]) -> Result<()> {
    if &keys.block_id(plain) != id {
        return Err(BlockError::BadBlock { block: hex::encode(id), reason: "content does not match its id".into() });
    }
    Ok(())
}

/// The plaintext of a sparse block (`stored` shorter than `plain_len`): its runs, placed by
/// their table, and zeros between them. The block is at most [`CHUNK_SIZE`] long, every run
/// must lie inside it, in order and apart, and the runs must hold exactly the stored data.
fn expand(id: &BlockId, plain_len: u32, stored: &[u8]) -> Result<Bytes> {
    let bad = |reason: String| BlockError::BadBlock { block: hex::encode(id), reason };
    if stored.len() > plain_len as usize {
        return Err(bad(format!("{} bytes stored for a block of {plain_len}", stored.len())));
    }
    // A block is one chunk at most: without this bound, a table of no runs (four stored bytes)
    // under a plaintext length of 2^32-1 would have the reader allocate and hash 4 GiB of zeros.
    if u64::from(plain_len) > CHUNK_SIZE {
        return Err(bad(format!("sparse block of {plain_len} bytes, more than a chunk ({CHUNK_SIZE})")));
    }
    let u32_at = |at: usize| u32::from_le_bytes(stored[at..at + 4].try_into().expect("4 bytes")) as usize;
    if stored.len() < 4 {
        return Err(bad("sparse block without its run count".into()));
    }
    let n = u32_at(stored.len() - 4);
    let table = n.checked_mul(RUN_ENTRY).and_then(|t| t.checked_add(4)).filter(|&t| t <= stored.len());
    let Some(table) = table else {
        return Err(bad(format!("sparse block: a table of {n} runs does not fit in {} bytes", stored.len())));
    };
    let data_len = stored.len() - table;
    let mut plain = BytesMut::zeroed(plain_len as usize);
    let (mut from, mut prev_end) = (0usize, 0usize);
    for k in 0..n {
        let at = data_len + k * RUN_ENTRY;
        let (offset, len) = (u32_at(at), u32_at(at + 4));
        if offset < prev_end || offset + len > plain_len as usize || from + len > data_len {
            return Err(bad(format!("sparse block: run {k} ({len} bytes at {offset}) out of place")));
        }
        plain[offset..offset + len].copy_from_slice(&stored[from..from + len]);
        (from, prev_end) = (from + len, offset + len);
    }
    if from != data_len {
        return Err(bad(format!("sparse block: its runs hold {from} of its {data_len} data bytes")));
    }
    Ok(plain.freeze())
}

/// Like [`open_block`], but decrypting where the bytes lie when nothing else holds them (a
/// body just read from a backend), and in a copy only when they are shared. The plaintext is
/// a view of that buffer (a sparse block's, a buffer of its own).
pub fn open_block_bytes(keys: &Keys, id: &BlockId, plain_len: u32, sealed: Bytes) -> Result<Bytes> {
    open_block_in(keys, id, plain_len, into_owned(sealed))
}

/// The bytes as a buffer of their own, to decrypt in place: the same memory when nothing else
/// holds it (a body just read from a backend), a copy when it is shared.
pub fn into_owned(bytes: Bytes) -> BytesMut {
    bytes.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]))
}

/// [`open_block`] on a buffer of its own: decrypted in place, checked against `id`, and the
/// plaintext returned as a view of the same memory (a sparse block is expanded into a new one).
pub fn open_block_in(keys: &Keys, id: &BlockId, plain_len: u32, mut sealed: BytesMut) -> Result<Bytes> {
    let stored = keys.open_in_place(ObjectKind::Block, id, &mut sealed)?;
    let stored = sealed.freeze().slice(stored);
    let plain = if stored.len() == plain_len as usize { stored } else { expand(id, plain_len, &stored)? };
    check_id(keys, id, &plain)?;
    Ok(plain)
}

/// Reads a whole pack back: every block is decrypted and verified against its id.
pub fn open_pack(keys: &Keys, id: &Hash, bytes: &[u8]) -> Result<Vec<(BlockId, BlockLoc)>> {
    let entries = open_trailer(keys, id, bytes, bytes.len() as u64)?;
    for (block, loc) in &entries {
        let r = loc.range();
        open_block(keys, block, loc.plain_len, &bytes[r.start as usize..r.end as usize])?;
    }
    Ok(entries)
}

/// How many bytes from a pack's end hold its trailer and footer, read from `tail` (at least the
/// pack's last [`PACK_FOOTER`] bytes); unauthenticated until [`open_trailer`] opens them.
pub fn trailer_span(id: &Hash, tail: &[u8], pack_len: u64) -> Result<u64> {
    let bad = |reason: &str| BlockError::BadPack { pack: hex::encode(id), reason: reason.into() };
    if tail.len() < PACK_FOOTER || &tail[tail.len() - 4..] != PACK_MAGIC {
        return Err(bad("missing pack footer (truncated or not a pack)"));
    }
    let tl_at = tail.len() - PACK_FOOTER;
    let trailer_len = u32::from_le_bytes(tail[tl_at..tl_at + 4].try_into().map_err(|_| bad("footer"))?);
    let span = u64::from(trailer_len) + PACK_FOOTER as u64;
    if span > pack_len {
        return Err(bad("trailer length past the start"));
    }
    Ok(span)
}

/// The blocks a pack's trailer lists, in pack order, from `tail`: the pack's last bytes (of
/// `pack_len` in all), at least [`trailer_span`] of them. The trailer is authenticated (sealed
/// under the pack's id); the blocks themselves are not read.
pub fn open_trailer(keys: &Keys, id: &Hash, tail: &[u8], pack_len: u64) -> Result<Vec<(BlockId, BlockLoc)>> {
    let bad = |reason: &str| BlockError::BadPack { pack: hex::encode(id), reason: reason.into() };
    let span = trailer_span(id, tail, pack_len)?;
    let span_usize = usize::try_from(span).map_err(|_| bad("trailer length"))?;
    if span_usize > tail.len() {
        return Err(bad("the bytes read hold only part of the trailer"));
    }
    let tl_at = tail.len() - PACK_FOOTER;
    let start = tail.len() - span_usize;
    // Where the trailer starts in the pack: every block lies before it.
    let body_end = pack_len - span;
    let trailer = keys.open(ObjectKind::PackTrailer, id, &tail[start..tl_at])?;
    let (&version, rest) = trailer.split_first().ok_or_else(|| bad("empty trailer"))?;
    if version > PACK_FORMAT {
        return Err(BlockError::TooNew {
            what: format!("pack {}", hex::encode(id)),
            found: version,
            supported: PACK_FORMAT,
        });
    }
    let count = u32::from_le_bytes(rest.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("count"))?) as usize;
    let body = &rest[4..];
    if body.len() != count * TRAILER_ENTRY {
        return Err(bad("trailer length does not match its block count"));
    }
    let mut out = Vec::with_capacity(count);
    for e in body.chunks_exact(TRAILER_ENTRY) {
        let block: BlockId = e[0..32].try_into().map_err(|_| bad("entry"))?;
        let loc = BlockLoc {
            pack: *id,
            offset: u64::from_le_bytes(e[32..40].try_into().map_err(|_| bad("entry"))?),
            sealed_len: u32::from_le_bytes(e[40..44].try_into().map_err(|_| bad("entry"))?),
            plain_len: u32::from_le_bytes(e[44..48].try_into().map_err(|_| bad("entry"))?),
            pack_len,
        };
        // A sparse block's envelope is shorter than a plain seal of its plaintext, never longer.
        if loc.offset.saturating_add(u64::from(loc.sealed_len)) > body_end
            || u64::from(loc.sealed_len) > sealed_len(loc.plain_len as usize) as u64
        {
            return Err(bad("block entry outside the pack body"));
        }
        out.push((block, loc));
    }
    Ok(out)
}

/// Encodes and seals an index segment listing `entries`.
pub fn seal_index(keys: &Keys, segment: &Hash, entries: &[(BlockId, BlockLoc)]) -> Vec<u8> {
    let mut plain = Vec::with_capacity(5 + entries.len() * INDEX_ENTRY);
    plain.push(PACK_FORMAT);
    plain.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (id, loc) in entries {
        plain.extend_from_slice(id);
        loc.encode(&mut plain);
    }
    keys.seal(ObjectKind::IndexSegment, segment, &plain)
}

/// Opens an index segment.
pub fn open_index(keys: &Keys, segment: &Hash, sealed: &[u8]) -> Result<Vec<(BlockId, BlockLoc)>> {
    let bad = |reason: &str| BlockError::BadIndex { segment: hex::encode(segment), reason: reason.into() };
    let plain = keys.open(ObjectKind::IndexSegment, segment, sealed)?;
    let (&version, rest) = plain.split_first().ok_or_else(|| bad("empty"))?;
    if version > PACK_FORMAT {
        return Err(BlockError::TooNew {
            what: format!("index segment {}", hex::encode(segment)),
            found: version,
            supported: PACK_FORMAT,
        });
    }
    let count = u32::from_le_bytes(rest.get(..4).and_then(|b| b.try_into().ok()).ok_or_else(|| bad("count"))?) as usize;
    let body = &rest[4..];
    if body.len() != count * INDEX_ENTRY {
        return Err(bad("length does not match the entry count"));
    }
    body.chunks_exact(INDEX_ENTRY)
        .map(|e| {
            let id: BlockId = e[0..32].try_into().map_err(|_| bad("entry"))?;
            let loc = BlockLoc::decode(&e[32..]).ok_or_else(|| bad("entry"))?;
            Ok((id, loc))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::DataKey;
    use proptest::prelude::*;

    fn keys() -> Keys {
        Keys::new(&DataKey::from_bytes([7; 32]))
    }

    fn build(keys: &Keys, blocks: &[Vec<u8>]) -> Pack {
        let mut b = PackBuilder::new(1024);
        for data in blocks {
            b.add(keys, &keys.block_id(data), data);
        }
        b.finish(keys)
    }

    proptest! {
        #[test]
        fn pack_round_trip(blocks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..3000), 1..8)) {
            let k = keys();
            let pack = build(&k, &blocks);
            let listed = open_pack(&k, &pack.id, &pack.bytes).expect("open");
            prop_assert_eq!(&listed, &pack.blocks);
            for ((id, loc), data) in pack.blocks.iter().zip(&blocks) {
                let r = loc.range();
                let plain = open_block(&k, id, loc.plain_len, &pack.bytes[r.start as usize..r.end as usize]).expect("block");
                prop_assert_eq!(&plain, data);
            }
            let seg = random_id();
            let sealed = seal_index(&k, &seg, &pack.blocks);
            prop_assert_eq!(open_index(&k, &seg, &sealed).expect("index"), pack.blocks.clone());
        }

        /// Blocks added, staged and sealed, or staged and dropped, in any order (the last one
        /// possibly staged and never sealed): the pack holds exactly the kept blocks, in order,
        /// and no byte of a dropped plaintext.
        #[test]
        fn staged_blocks_are_sealed_in_place_or_leave_no_trace(
            blocks in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 16..3000), 0..3u8), 1..8),
            unsealed_last in any::<bool>(),
        ) {
            let k = keys();
            let mut b = PackBuilder::new(64);
            let mut kept = Vec::new();
            let mut dropped = Vec::new();
            for (data, how) in &blocks {
                let id = k.block_id(data);
                match how {
                    0 => {
                        b.add(&k, &id, data);
                        kept.push(data);
                    }
                    1 => {
                        b.stage(data.len()).copy_from_slice(data);
                        prop_assert_eq!(k.block_id(b.staged()), id);
                        b.seal_staged(&k, &id);
                        kept.push(data);
                    }
                    _ => {
                        b.stage(data.len()).copy_from_slice(data);
                        b.drop_staged();
                        dropped.push(data);
                    }
                }
            }
            if unsealed_last {
                let data = &blocks[0].0;
                b.stage(data.len()).copy_from_slice(data);
                dropped.push(data);
            }
            prop_assert!(b.staged().is_empty() || unsealed_last);
            let pack = b.finish(&k);
            let listed = open_pack(&k, &pack.id, &pack.bytes).expect("open");
            prop_assert_eq!(&listed, &pack.blocks);
            prop_assert_eq!(pack.blocks.len(), kept.len());
            for ((id, loc), data) in pack.blocks.iter().zip(&kept) {
                let r = loc.range();
                let plain = open_block(&k, id, loc.plain_len, &pack.bytes[r.start as usize..r.end as usize]).expect("block");
                prop_assert_eq!(&plain, *data);
                prop_assert_eq!(loc.plain_len as usize, data.len());
            }
            for data in dropped {
                prop_assert!(!pack.bytes.windows(data.len()).any(|w| w == &data[..]), "a dropped plaintext is in the pack");
            }
        }
    }

    /// A chunk made of data runs at random places in zeros: stored sparse when that is
    /// shorter, and read back as the same bytes.
    fn sparse_chunk(runs: &[(usize, usize)], len: usize) -> (Vec<u8>, Vec<Range<usize>>) {
        let mut data = vec![0u8; len];
        let mut out: Vec<Range<usize>> = Vec::new();
        let mut at = 0;
        for &(gap, run) in runs {
            let start = (at + gap).min(len);
            let end = (start + run).min(len);
            for (i, b) in data[start..end].iter_mut().enumerate() {
                *b = (i % 253) as u8 + 1;
            }
            if end > start {
                out.push(start..end);
            }
            at = end;
        }
        (data, out)
    }

    proptest! {
        #[test]
        fn sparse_blocks_store_only_their_runs_and_read_back_whole(
            runs in proptest::collection::vec((0..5000usize, 0..3000usize), 0..6),
            len in 1..20_000usize,
        ) {
            let k = keys();
            let (data, runs) = sparse_chunk(&runs, len);
            let id = k.block_id(&data);
            let mut b = PackBuilder::new(64);
            b.stage(len).copy_from_slice(&data);
            let stored = b.seal_staged_runs(&k, &id, &runs);
            let held: usize = runs.iter().map(|r| r.len()).sum();
            prop_assert!(stored <= len && (stored == len || stored == held + 8 * runs.len() + 4));
            let pack = b.finish(&k);
            prop_assert_eq!(open_pack(&k, &pack.id, &pack.bytes).expect("open"), pack.blocks.clone());
            let (_, loc) = pack.blocks[0];
            prop_assert_eq!(loc.plain_len as usize, len);
            prop_assert_eq!(loc.stored_len() as usize, stored);
            let r = loc.range();
            let sealed = &pack.bytes[r.start as usize..r.end as usize];
            prop_assert_eq!(&open_block(&k, &id, loc.plain_len, sealed).expect("block"), &data);
            let opened = open_block_bytes(&k, &id, loc.plain_len, Bytes::copy_from_slice(sealed)).expect("block");
            prop_assert_eq!(&opened[..], &data[..]);
        }
    }

    /// A sparse block whose table was altered (and sealed again, so the AEAD passes) is
    /// refused by its table check or its id, never expanded into other bytes.
    #[test]
    fn a_sparse_block_with_a_bad_table_is_refused() {
        let k = keys();
        let (data, runs) = sparse_chunk(&[(100, 50), (4000, 10)], 8192);
        let id = k.block_id(&data);
        let mut b = PackBuilder::new(64);
        b.stage(data.len()).copy_from_slice(&data);
        let stored_len = b.seal_staged_runs(&k, &id, &runs);
        assert_eq!(stored_len, 60 + 2 * 8 + 4, "two runs of 60 bytes in 8 KiB are stored sparse");
        let pack = b.finish(&k);
        let (_, loc) = pack.blocks[0];
        let r = loc.range();
        let stored = k.open(ObjectKind::Block, &id, &pack.bytes[r.start as usize..r.end as usize]).expect("open");
        let table = stored.len() - 4 - 16;
        let cases: [(&str, usize, u32); 5] = [
            ("a run past the block", table + 8, 8190),
            ("runs out of order", table + 8, 120),
            ("a run longer than the data", table + 4, 70),
            ("more runs than the table", stored.len() - 4, 9),
            ("fewer bytes in the runs than stored", table + 12, 1),
        ];
        for (what, at, value) in cases {
            let mut bad = stored.clone();
            bad[at..at + 4].copy_from_slice(&value.to_le_bytes());
            let sealed = k.seal(ObjectKind::Block, &id, &bad);
            let err = open_block(&k, &id, loc.plain_len, &sealed).expect_err(what);
            assert!(matches!(err, BlockError::BadBlock { .. }), "{what}: {err}");
        }
        let longer = k.seal(ObjectKind::Block, &id, &vec![1u8; 8193]);
        assert!(open_block(&k, &id, loc.plain_len, &longer).is_err(), "more bytes stored than the block holds");
    }

    #[test]
    fn a_flipped_byte_anywhere_in_a_pack_is_detected() {
        let k = keys();
        let pack = build(&k, &[b"alpha".to_vec(), b"beta".to_vec()]);
        for i in 0..pack.bytes.len() {
            let mut bad = pack.bytes.to_vec();
            bad[i] ^= 0x40;
            assert!(open_pack(&k, &pack.id, &bad).is_err(), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn a_block_read_under_another_id_fails() {
        let k = keys();
        let pack = build(&k, &[b"alpha".to_vec(), b"beta".to_vec()]);
        let (_, loc) = pack.blocks[0];
        let (other, _) = pack.blocks[1];
        let r = loc.range();
        assert!(open_block(&k, &other, loc.plain_len, &pack.bytes[r.start as usize..r.end as usize]).is_err());
    }

    #[test]
    fn a_newer_index_format_is_refused_with_a_clear_message() {
        let k = keys();
        let seg = random_id();
        let sealed = k.seal(ObjectKind::IndexSegment, &seg, &[PACK_FORMAT + 1, 0, 0, 0, 0]);
        let err = open_index(&k, &seg, &sealed).expect_err("newer format");
        assert!(err.to_string().contains("upgrade tierfs"), "{err}");
    }
}
