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
//! Each block envelope is `Keys::seal(Block, block id, plaintext)`, so a block read checks the
//! AEAD tag (bound to the block's id) and then the id itself (blake3 of the plaintext). The
//! trailer lists the pack's blocks; it makes a pack self-describing, so the index can be
//! rebuilt from the packs alone and scrub can check every block of a pack.
//!
//! Invariants: a pack and its index segment are written before any metadata refers to their
//! blocks; packs are never modified after upload (only deleted by garbage collection).

use bytes::{Bytes, BytesMut};

use crate::crypto::{CryptoError, Hash, Keys, ObjectKind, STAGE_GAP, sealed_len};
use crate::types::ErrorKind;

/// Size of a file chunk and thus the largest block: big enough that per-block overhead
/// (an index entry, a RocksDB record, a range GET) is negligible next to the data, small
/// enough that a random read of a cold file fetches little more than it needs.
pub const CHUNK_SIZE: u64 = 4 << 20;

/// Format version of packs and index segments (docs/FORMAT.md).
pub const PACK_FORMAT: u8 = 1;

const PACK_MAGIC: &[u8; 4] = b"TFP1";
/// `trailer_len` + magic after the trailer envelope.
const PACK_FOOTER: usize = 8;
/// Bytes per entry in a pack trailer: id, offset, sealed length, plaintext length.
const TRAILER_ENTRY: usize = 32 + 8 + 4 + 4;
/// Bytes per entry in an index segment: id, pack id, offset, sealed and plain length, pack length.
const INDEX_ENTRY: usize = 32 + 32 + 8 + 4 + 4 + 8;

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
        let start = self.staged.take().expect("tierfs: seal_staged without a staged block");
        let plain_len = (self.buf.len() - start - STAGE_GAP) as u32;
        keys.seal_staged(ObjectKind::Block, id, &mut self.buf, start);
        let sealed = (self.buf.len() - start) as u32;
        self.entries.push((*id, start as u64, sealed, plain_len));
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

/// Decrypts and verifies one block envelope: the AEAD tag binds it to `id`, and the
/// plaintext must hash to `id` under this store's key.
pub fn open_block(keys: &Keys, id: &BlockId, sealed: &[u8]) -> Result<Vec<u8>> {
    let plain = keys.open(ObjectKind::Block, id, sealed)?;
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

/// Like [`open_block`], but decrypting where the bytes lie when nothing else holds them (a
/// body just read from a backend), and in a copy only when they are shared. The plaintext is
/// a view of that buffer.
pub fn open_block_bytes(keys: &Keys, id: &BlockId, sealed: Bytes) -> Result<Bytes> {
    open_block_in(keys, id, into_owned(sealed))
}

/// The bytes as a buffer of their own, to decrypt in place: the same memory when nothing else
/// holds it (a body just read from a backend), a copy when it is shared.
pub fn into_owned(bytes: Bytes) -> BytesMut {
    bytes.try_into_mut().unwrap_or_else(|shared| BytesMut::from(&shared[..]))
}

/// [`open_block`] on a buffer of its own: decrypted in place, checked against `id`, and the
/// plaintext returned as a view of the same memory.
pub fn open_block_in(keys: &Keys, id: &BlockId, mut sealed: BytesMut) -> Result<Bytes> {
    let plain = keys.open_in_place(ObjectKind::Block, id, &mut sealed)?;
    let plain = sealed.freeze().slice(plain);
    check_id(keys, id, &plain)?;
    Ok(plain)
}

/// Reads a whole pack back: every block is decrypted and verified against its id.
pub fn open_pack(keys: &Keys, id: &Hash, bytes: &[u8]) -> Result<Vec<(BlockId, BlockLoc)>> {
    let bad = |reason: &str| BlockError::BadPack { pack: hex::encode(id), reason: reason.into() };
    if bytes.len() < PACK_FOOTER || &bytes[bytes.len() - 4..] != PACK_MAGIC {
        return Err(bad("missing pack footer (truncated or not a pack)"));
    }
    let tl_at = bytes.len() - PACK_FOOTER;
    let trailer_len = u32::from_le_bytes(bytes[tl_at..tl_at + 4].try_into().map_err(|_| bad("footer"))?) as usize;
    let start = tl_at.checked_sub(trailer_len).ok_or_else(|| bad("trailer length past the start"))?;
    let trailer = keys.open(ObjectKind::PackTrailer, id, &bytes[start..tl_at])?;
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
    let pack_len = bytes.len() as u64;
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
        let r = loc.range();
        if r.end > start as u64 || u64::from(loc.sealed_len) != sealed_len(loc.plain_len as usize) as u64 {
            return Err(bad("block entry outside the pack body"));
        }
        open_block(keys, &block, &bytes[r.start as usize..r.end as usize])?;
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
                let plain = open_block(&k, id, &pack.bytes[r.start as usize..r.end as usize]).expect("block");
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
                let plain = open_block(&k, id, &pack.bytes[r.start as usize..r.end as usize]).expect("block");
                prop_assert_eq!(&plain, *data);
                prop_assert_eq!(loc.plain_len as usize, data.len());
            }
            for data in dropped {
                prop_assert!(!pack.bytes.windows(data.len()).any(|w| w == &data[..]), "a dropped plaintext is in the pack");
            }
        }
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
        assert!(open_block(&k, &other, &pack.bytes[r.start as usize..r.end as usize]).is_err());
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
