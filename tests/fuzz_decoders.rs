//! Fuzz targets for every decoder of store content, on stable Rust, in bounded time.
//!
//! Everything tierfs reads from a store is hostile input. For each decoder (object envelopes,
//! packs and their trailers, index segments, sparse-block tables, journal segments and
//! batches, checkpoint parts and the records inside them, manifests, leases, hot sets, wrapped
//! keys, the store config, history objects and the git packs inside them) this file feeds it arbitrary byte strings and
//! mutations of valid encodings made with the real encoders (flipped, set, inserted and
//! removed bytes, truncation, extension, and count or length fields overwritten with 0, 1, 2,
//! 2^31, 2^32-1 and u64::MAX), and checks the rule every decoder keeps:
//!
//! - it returns a value or an error (of kind `Corrupt`, or `InvalidInput` for a format newer
//!   than this tierfs, or its module's own error where it has no kind); it never panics (the
//!   runner turns a panic into a failure) and never aborts;
//! - the bytes it allocates at peak while decoding one input are at most
//!   64 × the input's length + 1 MiB (plus, where a format is run-length coded by design, the
//!   bound that format states: one chunk for a sparse block, `MAX_HOT_CHUNKS` entries for a hot
//!   set). A counting global allocator measures this per thread, so targets can run in
//!   parallel;
//! - valid encodings, including every file of the seed corpus (`tests/fuzz-corpus/`), decode.
//!
//! Decoders behind an envelope are fuzzed on their plaintext, sealed with a test key before
//! the decoder opens it: a store without the key cannot get past the envelope (the `envelope`
//! target fuzzes that), so what the plaintext decoders face is a writer that holds the key, or
//! a bug in one. Each target runs `TIERFS_FUZZ_CASES` cases (256 by default); the corpus is
//! rewritten by `cargo test -p tierfs --test fuzz_decoders -- --ignored regenerate_fuzz_corpus`.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;
use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};

use tierfs::ErrorKind;
use tierfs::backend::Redundancy;
use tierfs::block::{self, BlockLoc, PackBuilder};
use tierfs::crypto::{DataKey, Hash, KdfParams, Keys, ObjectKind, Secret, WrappedKey};
use tierfs::meta::codec;
use tierfs::meta::journal::Decoder;
use tierfs::meta::{ChunkRecord, InodeRecord, JournalBatch, JournalOp};
use tierfs::remote::{self, LeaseRecord, Manifest};
use tierfs::store::{self, StoreInfo};
use tierfs::tier::{HotSet, MAX_HOT_CHUNKS};
use tierfs::types::{Attr, FileKind, Timestamp};

// ---- allocation accounting ------------------------------------------------------------

/// Counts the bytes each thread holds allocated and the most it held since the last reset.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grow(by: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + by as isize;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrink(by: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get() - by as isize));
}

// SAFETY: every call is forwarded to `System` unchanged; only thread-local counters are kept
// (const-initialized, without destructors, so reading them never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grow(new_size - layout.size());
            } else {
                shrink(layout.size() - new_size);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` and returns its result with the most bytes this thread held allocated during it,
/// beyond what it held before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - base).max(0) as usize)
}

/// What a decoder may allocate for `len` bytes of input, beyond what its format bounds by design.
fn allowance(len: usize) -> usize {
    64 * len + (1 << 20)
}

// ---- targets ------------------------------------------------------------------------------

/// How a decoder refused its input: the public kind, or `None` for a module error without one.
type Refusal = Option<ErrorKind>;

/// One decoder under test.
struct Target {
    /// Its directory under `tests/fuzz-corpus/`.
    name: &'static str,
    /// Valid encodings made with the real encoder.
    seeds: fn() -> Vec<Vec<u8>>,
    /// Offsets of count and length fields in a valid encoding (mutations aim at them).
    fields: fn(&[u8]) -> Vec<usize>,
    /// Turns an input into what the decoder reads (sealing a plaintext, say): not measured.
    prepare: fn(&[u8]) -> Vec<u8>,
    /// Runs the decoder on prepared bytes.
    decode: fn(&[u8]) -> Result<(), Refusal>,
    /// The kinds of error it may return.
    kinds: &'static [ErrorKind],
    /// Bytes its format lets a decode allocate beyond [`allowance`], whatever the input's length.
    extra: usize,
}

const CORRUPT: &[ErrorKind] = &[ErrorKind::Corrupt, ErrorKind::InvalidInput];

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(|| Keys::new(&DataKey::from_bytes([7; 32])))
}

/// The pack every pack-level target uses: a few dense blocks and a sparse one.
struct FixedPack {
    id: Hash,
    bytes: Vec<u8>,
    blocks: Vec<(Hash, BlockLoc)>,
    /// The sparse block's id, plaintext length and stored bytes (runs then their table).
    sparse: (Hash, u32, Vec<u8>),
}

fn sparse_plaintext() -> Vec<u8> {
    let mut plain = vec![0u8; 5 * block::PAGE];
    plain[10..200].fill(0xab);
    plain[3 * block::PAGE..3 * block::PAGE + 17].fill(0x5c);
    plain
}

fn fixed_pack() -> &'static FixedPack {
    static PACK: OnceLock<FixedPack> = OnceLock::new();
    PACK.get_or_init(|| {
        let k = keys();
        let mut b = PackBuilder::new(1 << 16);
        for data in [b"hello".to_vec(), vec![1u8; 1000], (0..=255u8).collect()] {
            b.add(k, &k.block_id(&data), &data);
        }
        let plain = sparse_plaintext();
        let id = k.block_id(&plain);
        b.stage(plain.len()).copy_from_slice(&plain);
        let stored = b.seal_staged_runs(k, &id, &block::data_runs(&plain));
        assert!(stored < plain.len(), "the sparse block is stored sparse");
        let pack = b.finish(k);
        let loc = pack.blocks.iter().find(|(b, _)| *b == id).unwrap().1;
        let r = loc.range();
        let stored = k.open(ObjectKind::Block, &id, &pack.bytes[r.start as usize..r.end as usize]).unwrap();
        FixedPack {
            id: pack.id,
            bytes: pack.bytes.to_vec(),
            blocks: pack.blocks,
            sparse: (id, plain.len() as u32, stored),
        }
    })
}

fn trailer_plaintext(pack: &FixedPack) -> Vec<u8> {
    let span = block::trailer_span(&pack.id, &pack.bytes, pack.bytes.len() as u64).unwrap() as usize;
    let (len, footer) = (pack.bytes.len(), block::PACK_FOOTER);
    keys().open(ObjectKind::PackTrailer, &pack.id, &pack.bytes[len - span..len - footer]).unwrap()
}

fn kind_of_block(e: &block::BlockError) -> Refusal {
    Some(e.kind())
}

const SEGMENT_ID: Hash = [9; 32];

fn no_fields(_: &[u8]) -> Vec<usize> {
    Vec::new()
}

fn unchanged(b: &[u8]) -> Vec<u8> {
    b.to_vec()
}

fn sample_batches() -> Vec<JournalBatch> {
    vec![
        JournalBatch { seq: 7, ops: vec![], unix_ms: 1_700_000_000_000 },
        JournalBatch {
            seq: 8,
            unix_ms: 1_700_000_000_250,
            ops: vec![
                JournalOp::Put { key: codec::inode_key(2), value: codec::encode_inode(&sample_inode()) },
                JournalOp::Delete { key: codec::dentry_key(1, b"gone") },
                JournalOp::DeleteRange { from: codec::xattr_prefix(2), to: codec::xattr_prefix(3) },
            ],
        },
    ]
}

fn sample_inode() -> InodeRecord {
    let t = Timestamp { secs: 1_700_000_000, nanos: 5 };
    InodeRecord {
        attr: Attr {
            ino: 2,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 1000,
            gid: 1000,
            rdev: 0,
            size: 12345,
            blocks: 25,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
        },
        parent: 1,
        dense: true,
        no_xattrs: true,
    }
}

/// The entries of a checkpoint part, one of each table a part holds.
fn sample_part_ops() -> Vec<JournalOp> {
    let pack = fixed_pack();
    let (block, loc) = pack.blocks[0];
    let chunk = ChunkRecord { block, len: 5, data: 5, resident: false };
    let mut loc_bytes = Vec::new();
    loc.encode(&mut loc_bytes);
    vec![
        JournalOp::Put { key: codec::NEXT_INO_KEY.to_vec(), value: 3u64.to_le_bytes().to_vec() },
        JournalOp::Put { key: codec::inode_key(2), value: codec::encode_inode(&sample_inode()) },
        JournalOp::Put { key: codec::dentry_key(1, b"a.txt"), value: codec::encode_dentry(2, FileKind::File).to_vec() },
        JournalOp::Put { key: codec::chunk_key(2, 0), value: codec::encode_chunk(&chunk).to_vec() },
        JournalOp::Put { key: codec::block_key(&block), value: loc_bytes },
        JournalOp::Put { key: codec::symlink_key(4), value: b"a.txt".to_vec() },
    ]
}

/// Decodes the value of a metadata entry as a restore reads it: by the table its key names.
fn decode_record(key: &[u8], value: &[u8]) {
    let _ = match key.first() {
        Some(b'I') => codec::key_ino(key).and_then(|ino| codec::decode_inode(ino, value)).map(drop),
        Some(b'D') => codec::key_ino(key).and_then(|_| codec::decode_dentry(value)).map(drop),
        Some(b'K') => codec::decode_chunk_key(key).and_then(|_| codec::decode_chunk(value)).map(drop),
        Some(b'C') => codec::decode_u64(value).map(drop),
        Some(b'B') => {
            let _ = BlockLoc::decode(value);
            Ok(())
        }
        _ => Ok(()),
    };
}

fn sample_manifest() -> Manifest {
    Manifest {
        format: remote::REMOTE_FORMAT,
        seq: 42,
        next_segment: 9,
        parts: vec![hex::encode([1u8; 32]), hex::encode([2u8; 32])],
        entries: 2048,
        created_unix: 1_700_000_000,
        id: Some("20261201T000000Z-42".into()),
        message: Some("nightly".into()),
        compacted_below: 3,
        state_unix_ms: Some(1_700_000_000_250),
    }
}

fn wrapped_key_file() -> &'static [u8] {
    b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"
}

/// The history object's git pack is imported by libgit2 (C, outside this allocator's view):
/// what is fuzzed here is the object's framing and header, which tierfs decodes itself.
const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

/// A history object as a writer makes it: two commits of a small tree (the second file a
/// near copy of the first, so the pack holds a delta), packed by libgit2.
fn real_history_object() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init_bare(dir.path()).unwrap();
    let sig = git2::Signature::new("t", "t@example.org", &git2::Time::new(1_700_000_000, 0)).unwrap();
    let text = "print('hello, world')\n".repeat(64);
    let mut parent = None;
    for (i, body) in [text.clone(), format!("{text}# one more line\n")].iter().enumerate() {
        let blob = repo.blob(body.as_bytes()).unwrap();
        let mut tree = repo.treebuilder(None).unwrap();
        tree.insert(format!("file-{i}.py"), blob, 0o100644).unwrap();
        tree.insert("train.py", blob, 0o100644).unwrap();
        let tree = repo.find_tree(tree.write().unwrap()).unwrap();
        let parents: Vec<git2::Commit<'_>> = parent.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
        let refs: Vec<&git2::Commit<'_>> = parents.iter().collect();
        parent = Some(repo.commit(None, &sig, &sig, &format!("commit {i}"), &tree, &refs).unwrap());
    }
    let head = parent.unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push(head).unwrap();
    let mut builder = repo.packbuilder().unwrap();
    builder.insert_walk(&mut walk).unwrap();
    let mut pack = git2::Buf::new();
    builder.write_buf(&mut pack).unwrap();
    tierfs::history::encode_history_object(1, &head.to_string(), None, "snap-1", &pack)
}

fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "envelope",
            seeds: || {
                let k = keys();
                vec![
                    k.seal(ObjectKind::Metadata, b"part/x", b""),
                    k.seal(ObjectKind::Metadata, b"part/x", b"some metadata entries"),
                    k.seal(ObjectKind::Metadata, b"part/x", &[0x42; 3000]),
                ]
            },
            fields: |_| vec![4, 5],
            prepare: unchanged,
            decode: |b| keys().open(ObjectKind::Metadata, b"part/x", b).map(drop).map_err(|e| Some(e.kind())),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "pack",
            seeds: || {
                let p = fixed_pack();
                vec![[&p.id[..], &p.bytes[..]].concat()]
            },
            fields: |b| {
                let n = b.len();
                vec![32, n.saturating_sub(8), n.saturating_sub(4)]
            },
            prepare: unchanged,
            decode: |b| {
                let (id, pack) = b.split_at_checked(32).ok_or(Some(ErrorKind::Corrupt))?;
                let id: Hash = id.try_into().unwrap();
                block::trailer_span(&id, pack, pack.len() as u64).map_err(|e| kind_of_block(&e))?;
                block::open_pack(keys(), &id, pack).map(drop).map_err(|e| kind_of_block(&e))
            },
            kinds: CORRUPT,
            extra: block::CHUNK_SIZE as usize,
        },
        Target {
            name: "pack_trailer",
            seeds: || vec![trailer_plaintext(fixed_pack())],
            // version u8 | count u32 | entries of id, offset u64, sealed u32, plain u32
            fields: |b| {
                let mut f = vec![1];
                for e in 0..b.len().saturating_sub(5) / block::TRAILER_ENTRY {
                    let at = 5 + e * block::TRAILER_ENTRY;
                    f.extend([at + 32, at + 40, at + 44]);
                }
                f
            },
            prepare: |trailer| {
                // The fixed pack's blocks, then this trailer sealed under its id, then the footer.
                let p = fixed_pack();
                let span = block::trailer_span(&p.id, &p.bytes, p.bytes.len() as u64).unwrap() as usize;
                let mut pack = p.bytes[..p.bytes.len() - span].to_vec();
                let start = pack.len();
                keys().seal_into(ObjectKind::PackTrailer, &p.id, trailer, &mut pack);
                let len = (pack.len() - start) as u32;
                pack.extend_from_slice(&len.to_le_bytes());
                pack.extend_from_slice(b"TFP1");
                pack
            },
            decode: |pack| {
                let p = fixed_pack();
                block::open_trailer(keys(), &p.id, pack, pack.len() as u64).map_err(|e| kind_of_block(&e))?;
                block::open_pack(keys(), &p.id, pack).map(drop).map_err(|e| kind_of_block(&e))
            },
            kinds: CORRUPT,
            extra: block::CHUNK_SIZE as usize,
        },
        Target {
            name: "index_segment",
            seeds: || {
                let p = fixed_pack();
                let sealed = block::seal_index(keys(), &SEGMENT_ID, &p.blocks);
                let one = block::seal_index(keys(), &SEGMENT_ID, &p.blocks[..1]);
                [sealed, one].iter().map(|s| keys().open(ObjectKind::IndexSegment, &SEGMENT_ID, s).unwrap()).collect()
            },
            fields: |b| {
                let mut f = vec![1];
                for e in 0..b.len().saturating_sub(5) / block::INDEX_ENTRY {
                    let at = 5 + e * block::INDEX_ENTRY;
                    f.extend([at + 64, at + 72, at + 76, at + 80]);
                }
                f
            },
            prepare: |plain| keys().seal(ObjectKind::IndexSegment, &SEGMENT_ID, plain),
            decode: |sealed| block::open_index(keys(), &SEGMENT_ID, sealed).map(drop).map_err(|e| kind_of_block(&e)),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "sparse_block",
            // plain_len u32 LE | block id [32] | stored bytes (runs, then the run table)
            seeds: || {
                let (id, plain_len, stored) = &fixed_pack().sparse;
                vec![[&plain_len.to_le_bytes()[..], &id[..], &stored[..]].concat()]
            },
            fields: |b| vec![0, b.len().saturating_sub(4), b.len().saturating_sub(8), b.len().saturating_sub(12)],
            prepare: |b| {
                let Some((head, stored)) = b.split_at_checked(36) else { return b.to_vec() };
                [head, &keys().seal(ObjectKind::Block, &head[4..], stored)[..]].concat()
            },
            decode: |b| {
                let (head, sealed) = b.split_at_checked(36).ok_or(Some(ErrorKind::Corrupt))?;
                let plain_len = u32::from_le_bytes(head[..4].try_into().unwrap());
                let id: Hash = head[4..].try_into().unwrap();
                block::open_block(keys(), &id, plain_len, sealed).map(drop).map_err(|e| kind_of_block(&e))
            },
            kinds: CORRUPT,
            // A sparse block expands to its plaintext: one chunk at most.
            extra: block::CHUNK_SIZE as usize,
        },
        Target {
            name: "journal_segment",
            seeds: || {
                vec![
                    remote::encode_segment(1, "session-1", "host:1", 1_700_000_000, &sample_batches()).unwrap(),
                    remote::encode_segment(2, "s", "h:2", 0, &[]).unwrap(),
                ]
            },
            fields: |b| {
                let hlen = b.get(..4).map_or(0, |l| u32::from_le_bytes(l.try_into().unwrap()) as usize);
                vec![0, 4 + hlen + 8, 4 + hlen + 12 + 1]
            },
            prepare: unchanged,
            decode: |b| remote::decode_segment(1, "j/1", b).map(drop).map_err(|e| Some(e.kind())),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "journal_batch",
            seeds: || {
                sample_batches()
                    .iter()
                    .map(|batch| {
                        let mut out = Vec::new();
                        batch.encode(&mut out);
                        out
                    })
                    .collect()
            },
            fields: |_| vec![8, 12, 13, 17],
            prepare: unchanged,
            decode: |b| {
                let mut d = Decoder::new(b);
                JournalBatch::decode(&mut d).map(drop).map_err(|e| Some(e.kind()))
            },
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "checkpoint_part",
            seeds: || {
                let mut out = Vec::new();
                for op in sample_part_ops() {
                    op.encode(&mut out);
                }
                vec![out]
            },
            fields: |_| vec![1, 5, 14, 18],
            prepare: unchanged,
            decode: |b| {
                let ops = remote::decode_part(1, b).map_err(|e| Some(e.kind()))?;
                for op in &ops {
                    if let JournalOp::Put { key, value } = op {
                        decode_record(key, value);
                    }
                }
                Ok(())
            },
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "manifest",
            seeds: || vec![serde_json::to_vec(&sample_manifest()).unwrap()],
            fields: no_fields,
            prepare: unchanged,
            decode: |b| remote::decode_manifest("checkpoint 42", b).map(drop).map_err(|e| Some(e.kind())),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "lease",
            seeds: || {
                let rec = LeaseRecord {
                    format: remote::REMOTE_FORMAT,
                    session: "session-1".into(),
                    holder: "host:1".into(),
                    acquired_unix: 1_700_000_000,
                    expires_unix: 1_700_000_060,
                    released: false,
                    seen_seq: 42,
                    process: "boot/pid:[4026531836]/1".into(),
                };
                vec![serde_json::to_vec(&rec).unwrap()]
            },
            fields: no_fields,
            prepare: unchanged,
            decode: |b| LeaseRecord::decode(b).map(drop).map_err(|e| Some(e.kind())),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "hot_set",
            seeds: || {
                let mut chunks: Vec<(u64, u64)> = (0..40).map(|i| (5, i)).collect();
                chunks.extend([(9, 0), (2, 100), (2, 101), (7, 3)]);
                vec![
                    HotSet { chunks: chunks.clone(), ordered: 0 }.encode(),
                    HotSet { chunks, ordered: 41 }.encode(),
                    HotSet::default().encode(),
                ]
            },
            // The prefix's and the set's run counts, then each run's count.
            fields: |b| {
                let mut f = vec![4, 8];
                f.extend((0..b.len().saturating_sub(12) / 20).map(|r| 12 + r * 20 + 16));
                f
            },
            prepare: unchanged,
            decode: |b| HotSet::decode(b).map(drop).map_err(|_| None),
            kinds: &[],
            // Runs of chunks by design: at most MAX_HOT_CHUNKS entries of 16 bytes, whose
            // vector may double once past what it holds.
            extra: 2 * MAX_HOT_CHUNKS * 16,
        },
        Target {
            name: "wrapped_key",
            seeds: || {
                let key = DataKey::from_bytes([3; 32]);
                let by_file = tierfs::crypto::wrap_key(
                    &key,
                    &Secret::KeyFile(wrapped_key_file()),
                    KdfParams::for_tests(),
                    "keyfile",
                )
                .unwrap();
                let by_pass =
                    tierfs::crypto::wrap_key(&key, &Secret::Passphrase(b"pass"), KdfParams::for_tests(), "passphrase")
                        .unwrap();
                vec![serde_json::to_vec(&by_file).unwrap(), serde_json::to_vec(&by_pass).unwrap()]
            },
            fields: no_fields,
            prepare: unchanged,
            decode: |b| {
                let w: WrappedKey = store::decode_wrapped_key("keys/x", b).map_err(|e| Some(e.kind()))?;
                // A passphrase's Argon2id costs are the record's word (bounded by KdfParams'
                // limits, up to 4 GiB): only the cheapest are run here.
                let cheap = w.kdf.is_none_or(|p| p.m_cost_kib <= 64 && p.t_cost <= 2 && p.p_cost <= 2);
                let secret = if w.method == "keyfile" {
                    Secret::KeyFile(wrapped_key_file())
                } else {
                    Secret::Passphrase(b"pass")
                };
                if w.method == "keyfile" || cheap {
                    tierfs::crypto::unwrap_key(&w, &secret).map(drop).map_err(|e| Some(e.kind()))?;
                }
                Ok(())
            },
            // A record that does not decode, or whose fields do not, is `Corrupt`; one that
            // decodes and does not open is the secret's fault (`InvalidInput`: wrong key).
            kinds: &[ErrorKind::InvalidInput, ErrorKind::Corrupt],
            extra: 0,
        },
        Target {
            name: "store_config",
            seeds: || {
                let info = StoreInfo {
                    format: store::STORE_FORMAT,
                    store_id: hex::encode([5u8; 16]),
                    redundancy: Redundancy::Erasure { data: 4, parity: 2 },
                    created_unix: 1_700_000_000,
                    conditional_create: store::ConditionalCreate::Honoured(vec!["ab".repeat(32)]),
                };
                let three = StoreInfo { redundancy: Redundancy::Replicas(3), ..info.clone() };
                vec![serde_json::to_vec(&info).unwrap(), serde_json::to_vec(&three).unwrap()]
            },
            fields: no_fields,
            prepare: unchanged,
            decode: |b| StoreInfo::decode(b).map(drop).map_err(|e| Some(e.kind())),
            // A store config that does not parse is `Corrupt`; a newer format `InvalidInput`.
            kinds: &[ErrorKind::InvalidInput, ErrorKind::Corrupt],
            extra: 0,
        },
        Target {
            name: "history_object",
            seeds: || {
                vec![
                    tierfs::history::encode_history_object(1, HEAD, None, "snap-1", b"PACK\0\0\0\x02\0\0\0\0"),
                    tierfs::history::encode_history_object(1, HEAD, Some(HEAD), "", b""),
                ]
            },
            fields: |_| vec![0],
            prepare: unchanged,
            decode: |b| tierfs::history::decode_history_object(1, b).map(drop).map_err(|e| Some(e.kind())),
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "history_pack",
            // A whole history object as a fresh node imports it: the header, then the git pack
            // indexed by libgit2 into a new repository, then its head looked up.
            seeds: || vec![real_history_object()],
            fields: |b| {
                // The pack's object count (big-endian, after "PACK" and the version) and the
                // header's length.
                let pack = b.windows(4).position(|w| w == b"PACK").map_or(0, |at| at + 8);
                vec![0, pack]
            },
            prepare: unchanged,
            decode: |b| {
                let dir = tempfile::tempdir().unwrap();
                tierfs::history::import_into_new_repository(dir.path(), 1, b).map_err(|e| Some(e.kind()))
            },
            kinds: CORRUPT,
            extra: 0,
        },
        Target {
            name: "records",
            // table tag | value: the record decoders a restore runs on checkpoint entries
            seeds: || {
                let p = fixed_pack();
                let (block, loc) = p.blocks[1];
                let mut loc_bytes = vec![b'B'];
                loc.encode(&mut loc_bytes);
                let chunk = ChunkRecord { block, len: 1000, data: 1000, resident: true };
                vec![
                    [&b"I"[..], &codec::encode_inode(&sample_inode())[..]].concat(),
                    [&b"D"[..], &codec::encode_dentry(9, FileKind::Dir)[..]].concat(),
                    [&b"K"[..], &codec::encode_chunk(&chunk)[..]].concat(),
                    [&b"C"[..], &7u64.to_le_bytes()[..]].concat(),
                    loc_bytes,
                ]
            },
            fields: no_fields,
            prepare: unchanged,
            decode: |b| {
                let (&tag, v) = b.split_first().ok_or(Some(ErrorKind::Corrupt))?;
                let kind = |e: tierfs::meta::MetaError| Some(e.kind());
                match tag {
                    b'I' => codec::decode_inode(2, v).map(drop).map_err(kind),
                    b'D' => codec::decode_dentry(v).map(drop).map_err(kind),
                    b'K' => codec::decode_chunk(v).map(drop).map_err(kind),
                    b'C' => codec::decode_u64(v).map(drop).map_err(kind),
                    b'B' => BlockLoc::decode(v).map(drop).ok_or(Some(ErrorKind::Corrupt)),
                    _ => codec::decode_chunk_key(v).map(drop).map_err(kind),
                }
            },
            kinds: CORRUPT,
            extra: 0,
        },
    ]
}

fn target(name: &str) -> Target {
    targets().into_iter().find(|t| t.name == name).unwrap()
}

// ---- mutations ------------------------------------------------------------------------------

/// Values a count or length field is overwritten with.
const EXTREMES: [u64; 6] = [0, 1, 2, 1 << 31, u32::MAX as u64, u64::MAX];

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Set {
        at: usize,
        byte: u8,
    },
    Truncate {
        at: usize,
    },
    Extend(Vec<u8>),
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        len: usize,
    },
    /// Overwrites a little-endian field of `width` bytes with an extreme value, at a known
    /// count or length field when `aimed` (and the target names any).
    Field {
        at: usize,
        aimed: bool,
        width: u8,
        value: u64,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => (any::<usize>(), 0..8u8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        1 => any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        1 => proptest::collection::vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (any::<usize>(), 1..16usize).prop_map(|(at, len)| Mutation::Remove { at, len }),
        3 => (any::<usize>(), any::<bool>(), prop_oneof![Just(4u8), Just(8u8)], proptest::sample::select(EXTREMES.to_vec()))
            .prop_map(|(at, aimed, width, value)| Mutation::Field { at, aimed, width, value }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation, fields: &[usize]) {
    let n = bytes.len();
    match m {
        Mutation::Flip { at, bit } if n > 0 => bytes[*at % n] ^= 1u8 << *bit,
        Mutation::Set { at, byte } if n > 0 => bytes[*at % n] = *byte,
        Mutation::Truncate { at } => bytes.truncate(*at % (n + 1)),
        Mutation::Extend(more) => bytes.extend_from_slice(more),
        Mutation::Insert { at, bytes: more } => {
            let tail = bytes.split_off(*at % (n + 1));
            bytes.extend_from_slice(more);
            bytes.extend_from_slice(&tail);
        }
        Mutation::Remove { at, len } if n > 0 => {
            let at = *at % n;
            let tail = bytes.split_off((at + *len).min(n));
            bytes.truncate(at);
            bytes.extend_from_slice(&tail);
        }
        Mutation::Field { at, aimed, width, value } => {
            let at = match (*aimed, fields.is_empty()) {
                (true, false) => fields[*at % fields.len()],
                _ => *at % (n + 1),
            };
            let le = value.to_le_bytes();
            for (i, b) in le[..usize::from(*width)].iter().enumerate() {
                if let Some(slot) = bytes.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        _ => {}
    }
}

// ---- running ---------------------------------------------------------------------------------

fn cases() -> u32 {
    std::env::var("TIERFS_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus").join(name)
}

/// The corpus files of target `name`: `(is a seed, bytes)`. Seeds (`seed-*.bin`) are valid
/// encodings; other `.bin` files are inputs that once broke a decoder.
fn corpus(name: &str) -> Vec<(bool, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir(corpus_dir(name)) else { return Vec::new() };
    let mut files: Vec<PathBuf> =
        dir.map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "bin")).collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let seed = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-"));
            (seed, std::fs::read(p).unwrap())
        })
        .collect()
}

/// Decodes one input and checks the rule: no panic (the runner catches one), a bounded peak
/// of allocation, and only the target's kinds of error.
fn check(t: &Target, input: &[u8]) -> Result<Result<(), Refusal>, TestCaseError> {
    let prepared = (t.prepare)(input);
    let (out, peak) = peak_during(|| (t.decode)(&prepared));
    let bound = allowance(prepared.len()) + t.extra;
    prop_assert!(
        peak <= bound,
        "{}: decoding {} bytes allocated {peak} bytes at peak (bound {bound})",
        t.name,
        prepared.len()
    );
    if let Err(Some(kind)) = &out {
        prop_assert!(t.kinds.contains(kind), "{}: refused with kind {kind:?}, expected one of {:?}", t.name, t.kinds);
    }
    Ok(out)
}

/// Runs target `name`: its seeds and corpus decode, then arbitrary bytes and mutations of them.
fn fuzz(name: &str) {
    let t = target(name);
    let from_corpus = corpus(name);
    assert!(from_corpus.iter().any(|(seed, _)| *seed), "{name}: no seed corpus in {}", corpus_dir(name).display());
    let fresh = (t.seeds)().into_iter().map(|s| (true, s));
    let mut seeds = Vec::new();
    for (i, (valid, s)) in fresh.chain(from_corpus).enumerate() {
        let out = check(&t, &s).unwrap_or_else(|e| panic!("{name}: seed {i}: {e}"));
        assert!(!valid || out.is_ok(), "{name}: seed {i} (a valid encoding) does not decode: {out:?}");
        seeds.push(s);
    }
    let fields_of = t.fields;
    let inputs = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..4096),
        (proptest::sample::select(seeds), proptest::collection::vec(mutation(), 1..5)).prop_map(
            move |(mut bytes, ms)| {
                let fields = fields_of(&bytes);
                for m in &ms {
                    apply(&mut bytes, m, &fields);
                }
                bytes
            }
        ),
    ];
    let mut runner = TestRunner::new(ProptestConfig { cases: cases(), ..ProptestConfig::default() });
    runner.run(&inputs, |input| check(&t, &input).map(drop)).unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn envelope() {
    fuzz("envelope");
}

#[test]
fn pack() {
    fuzz("pack");
}

#[test]
fn pack_trailer() {
    fuzz("pack_trailer");
}

#[test]
fn index_segment() {
    fuzz("index_segment");
}

#[test]
fn sparse_block() {
    fuzz("sparse_block");
}

#[test]
fn journal_segment() {
    fuzz("journal_segment");
}

#[test]
fn journal_batch() {
    fuzz("journal_batch");
}

#[test]
fn checkpoint_part() {
    fuzz("checkpoint_part");
}

#[test]
fn manifest() {
    fuzz("manifest");
}

#[test]
fn lease() {
    fuzz("lease");
}

#[test]
fn hot_set() {
    fuzz("hot_set");
}

/// Hot sets saved before the ordered prefix (`"TFH1"`) still decode, with no prefix.
#[test]
fn an_old_hot_set_still_decodes() {
    for i in 0..2 {
        let path = corpus_dir("hot_set").join(format!("format1-seed-{i}.bin"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.starts_with(b"TFH1"), "{} is not of the old format", path.display());
        let set = HotSet::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(set.ordered, 0);
    }
}

#[test]
fn wrapped_key() {
    fuzz("wrapped_key");
}

#[test]
fn store_config() {
    fuzz("store_config");
}

#[test]
fn history_object() {
    fuzz("history_object");
}

#[test]
fn records() {
    fuzz("records");
}

/// libgit2's own allocations (C) are outside the counting allocator: the process's peak RSS
/// bounds them instead (every target of this binary shares the process).
#[test]
fn history_pack() {
    fuzz("history_pack");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap();
    assert!(kib < 1 << 20, "peak RSS {kib} KiB while packs were imported");
}

/// Every target has a test above (a new target without one would never run).
#[test]
fn every_target_runs() {
    let source = include_str!("fuzz_decoders.rs");
    for t in targets() {
        assert!(
            source.contains(&format!("fn {}() {{\n    fuzz(\"{}\");", t.name, t.name)),
            "no test runs target {}",
            t.name
        );
    }
}

// ---- regressions ---------------------------------------------------------------------------

/// A sparse block's table of no runs, claiming a plaintext of 4 GiB: before the fix, four
/// stored bytes made the reader allocate (and hash) 4 GiB of zeros.
#[test]
fn a_sparse_block_longer_than_a_chunk_is_refused_without_allocating_it() {
    let t = target("sparse_block");
    let (_, _, stored) = &fixed_pack().sparse;
    for plain_len in [u32::MAX, block::CHUNK_SIZE as u32 + 1] {
        let input = [&plain_len.to_le_bytes()[..], &[1; 32][..], &0u32.to_le_bytes()[..]].concat();
        let out = check(&t, &input).unwrap();
        assert_eq!(out, Err(Some(ErrorKind::Corrupt)), "plain_len {plain_len}");
        let input = [&plain_len.to_le_bytes()[..], &[1; 32][..], &stored[..]].concat();
        assert_eq!(check(&t, &input).unwrap(), Err(Some(ErrorKind::Corrupt)), "plain_len {plain_len}");
    }
}

/// Count fields claiming 2^32-1 entries are refused, with nothing reserved for them.
#[test]
fn counts_of_u32_max_are_refused() {
    // Where each format keeps its count.
    let cases = [("pack_trailer", 1), ("index_segment", 1), ("hot_set", 4), ("journal_batch", 8)];
    for (name, at) in cases {
        let t = target(name);
        for seed in (t.seeds)() {
            let mut bytes = seed.clone();
            bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
            let out = check(&t, &bytes).unwrap();
            assert!(out.is_err(), "{name}: a count of 2^32-1 decodes");
        }
    }
}

/// Rewrites the seed corpus from the real encoders: `cargo test -p tierfs --test
/// fuzz_decoders -- --ignored regenerate_fuzz_corpus`.
#[test]
#[ignore]
fn regenerate_fuzz_corpus() {
    for t in targets() {
        let dir = corpus_dir(t.name);
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-") && n.ends_with(".bin")) {
                std::fs::remove_file(p).unwrap();
            }
        }
        for (i, seed) in (t.seeds)().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}.bin")), seed).unwrap();
        }
    }
}
