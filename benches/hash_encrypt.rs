//! Throughput of the block write hot path on one core: keyed blake3 for the block id, AES-256-GCM
//! for the envelope, and both together: as the uploader runs them (the chunk read straight
//! into the pack, then `block_id` and `seal_staged` in place: `block_id+seal_staged`) and from
//! a separate plaintext (`block_id` then `seal_into`, one copy more), plus `open` for the read
//! path. Target: hash + encrypt ≥ 1 GB/s per core in release.
//!
//! `cargo bench --bench hash_encrypt -- --warm-up-time 1 --measurement-time 3` (`-- cache` for
//! the hot tier's cipher alone).

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tierfs::crypto::{DataKey, Keys, ObjectKind, STAGE_GAP, sealed_len};

/// A full block and a small one (small files, index segments, journals).
const SIZES: [(usize, &str); 2] = [(4 << 20, "4MiB"), (64 << 10, "64KiB")];

fn plaintext(len: usize) -> Vec<u8> {
    // Not all zeros, so nothing downstream could take a shortcut.
    (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn hash_encrypt(c: &mut Criterion) {
    let keys = Keys::new(&DataKey::from_bytes([7; 32]));
    for (len, label) in SIZES {
        let data = plaintext(len);
        let id = keys.block_id(&data);
        let mut group = c.benchmark_group("crypto");
        group.throughput(Throughput::Bytes(len as u64));

        group.bench_with_input(BenchmarkId::new("block_id", label), &data, |b, data| {
            b.iter(|| keys.block_id(black_box(data)))
        });
        group.bench_with_input(BenchmarkId::new("seal", label), &data, |b, data| {
            b.iter(|| keys.seal(ObjectKind::Block, &id, black_box(data)))
        });
        // The pack buffer is reused, as a pack builder does, so allocation is not measured.
        let mut pack = Vec::with_capacity(sealed_len(len));
        group.bench_with_input(BenchmarkId::new("block_id+seal_into", label), &data, |b, data| {
            b.iter(|| {
                pack.clear();
                let id = keys.block_id(black_box(data));
                keys.seal_into(ObjectKind::Block, &id, data, &mut pack);
                black_box(pack.len())
            })
        });
        // The uploader's path: the plaintext already lies in the pack (the chunk is read from
        // the hot tier straight into it; that read, here the untimed setup, leaves it in the
        // cache as a read from the page cache does); hashed and encrypted where it lies.
        let staged: Vec<u8> = [&[0u8; STAGE_GAP][..], &data].concat();
        group.bench_function(BenchmarkId::new("block_id+seal_staged", label), |b| {
            b.iter_batched_ref(
                || {
                    let mut pack = Vec::with_capacity(sealed_len(len));
                    pack.extend_from_slice(&staged);
                    pack
                },
                |pack| {
                    let id = keys.block_id(black_box(&pack[STAGE_GAP..]));
                    keys.seal_staged(ObjectKind::Block, &id, pack, 0);
                    black_box(pack.len())
                },
                BatchSize::LargeInput,
            )
        });
        // The read path, for comparison: authenticate and decrypt into a fresh buffer.
        let sealed = keys.seal(ObjectKind::Block, &id, &data);
        group.bench_with_input(BenchmarkId::new("open", label), &sealed, |b, sealed| {
            b.iter(|| keys.open(ObjectKind::Block, &id, black_box(sealed)))
        });
        group.finish();
    }
}

/// The hot tier's encryption at rest (`--encrypt-cache`): XEX-AES-256 in place over a FUSE
/// write's worth (128 KiB) and a page, each way. Its cost per byte beside a memcpy of the
/// same bytes (what a write or read through the hot tier does anyway, in the kernel).
fn cache_cipher(c: &mut Criterion) {
    let cipher = Keys::new(&DataKey::from_bytes([7; 32])).cache_cipher();
    for (len, label) in [(128 << 10, "128KiB"), (4 << 10, "4KiB")] {
        let mut group = c.benchmark_group("cache");
        group.throughput(Throughput::Bytes(len as u64));
        let mut buf = plaintext(len);
        let src = plaintext(len);
        group.bench_function(BenchmarkId::new("memcpy", label), |b| {
            b.iter(|| {
                buf.copy_from_slice(black_box(&src));
                black_box(buf[0])
            })
        });
        group.bench_function(BenchmarkId::new("encrypt", label), |b| {
            b.iter(|| cipher.encrypt(black_box(42), 1 << 20, &mut buf))
        });
        group.bench_function(BenchmarkId::new("decrypt", label), |b| {
            b.iter(|| cipher.decrypt(black_box(42), 1 << 20, &mut buf))
        });
        group.finish();
    }
}

criterion_group!(benches, hash_encrypt, cache_cipher);
criterion_main!(benches);
