//! The store against real S3 servers (moto on loopback, one process per backend): replicated
//! reads survive a corrupted and a deleted copy and scrub repairs them; erasure-coded packs
//! survive the loss of M servers; a wrong passphrase fails clearly and changes nothing; no
//! plaintext reaches a server.
//!
//! Each test starts its own servers ([`moto::MotoServer`]); nothing here is faked.

use tierfs_test_support::moto;

use moto::MotoServer;
use tierfs::backend::Credentials;
use tierfs::block::BlockId;
use tierfs::crypto::{KdfParams, Secret};
use tierfs::store::{Store, StoreConfig, StoreError};

const BUCKET: &str = "tierfs-test";

fn servers(n: usize) -> Vec<MotoServer> {
    MotoServer::start_many(n, BUCKET)
}

fn config(servers: &[MotoServer]) -> StoreConfig {
    let mut c = StoreConfig::new(servers.iter().map(|s| s.url(BUCKET, "store")).collect());
    c.credentials =
        Credentials { access_key_id: Some("test".into()), secret_access_key: Some("test".into()), session_token: None };
    c
}

/// Blocks with a recognizable plaintext marker in them.
fn blocks(store: &Store, n: usize, len: usize) -> Vec<(BlockId, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let mut data = format!("PLAINTEXT-MARKER-{i:04}-").into_bytes().repeat(len / 24 + 1);
            data.truncate(len);
            (store.keys().block_id(&data), data)
        })
        .collect()
}

async fn put(store: &Store, blocks: &[(BlockId, Vec<u8>)]) -> Vec<(BlockId, tierfs::block::BlockLoc)> {
    let refs: Vec<(BlockId, &[u8])> = blocks.iter().map(|(id, d)| (*id, d.as_slice())).collect();
    store.put_blocks(&refs).await.expect("put_blocks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_and_deleted_copies_are_detected_served_and_repaired() {
    let servers = servers(3);
    let cfg = config(&servers);
    let secret = Secret::Passphrase(b"pass");
    let store = Store::init(&cfg, &secret, KdfParams::for_tests()).await.expect("init");
    let data = blocks(&store, 20, 50_000);
    let locs = put(&store, &data).await;
    let pack_key = tierfs::block::pack_key(&locs[0].1.pack);

    // No plaintext anywhere: not the marker, not in any object of any server.
    for s in &servers {
        for (key, bytes) in s.dump_bucket(BUCKET) {
            assert!(!contains(&bytes, b"PLAINTEXT-MARKER"), "plaintext in {key}");
        }
    }

    // Replica 0: garbage; replica 1: gone. Replica 2 is intact.
    let full = format!("store/{pack_key}");
    servers[0].put_raw(BUCKET, &full, b"garbage, not a pack");
    servers[1].delete_raw(BUCKET, &full);
    // Detected: a scrub without --repair sees both (and changes nothing).
    let before = store.scrub(false, &|_| {}).await.expect("scrub");
    assert_eq!((before.copies_bad, before.copies_missing), (1, 1), "{before:?}");
    assert_eq!(before.unrepaired, vec![pack_key.clone()], "{before:?}");
    // Served: every block reads back right (from the good copy; read repair may start here).
    for ((id, loc), (_, d)) in locs.iter().zip(&data) {
        assert_eq!(&store.get_block(id, loc).await.expect("served from the good copy"), d);
    }
    let repaired = store.scrub(true, &|_| {}).await.expect("scrub --repair");
    assert!(repaired.unrepaired.is_empty(), "{repaired:?}");
    let after = store.scrub(false, &|_| {}).await.expect("scrub");
    assert_eq!((after.copies_bad, after.copies_missing), (0, 0), "{after:?}");
    assert!(after.unrepaired.is_empty(), "{after:?}");
    for s in &servers[..2] {
        let copy = s.get_raw(BUCKET, &full).expect("copy restored");
        assert_eq!(copy, servers[2].get_raw(BUCKET, &full).expect("good copy"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_two_plus_one_survives_losing_a_server() {
    let mut servers = servers(3);
    let mut cfg = config(&servers);
    cfg.replicas = None;
    cfg.erasure = Some("2+1".into());
    let secret = Secret::Passphrase(b"pass");
    let store = Store::init(&cfg, &secret, KdfParams::for_tests()).await.expect("init");
    let data = blocks(&store, 8, 300_000);
    let locs = put(&store, &data).await;
    // Each server holds one shard of the pack, about half its size: not a full copy.
    for s in &servers {
        let packs: Vec<_> = s.list_keys(BUCKET).into_iter().filter(|k| k.contains("/packs/")).collect();
        assert_eq!(packs.len(), 1, "{packs:?}");
    }
    #[allow(clippy::needless_range_loop)] // each server is killed and restarted in place
    for victim in 0..3 {
        servers[victim].kill();
        let store = Store::open(&cfg, &secret).await.expect("open with one server down");
        for ((id, loc), (_, d)) in locs.iter().zip(&data) {
            assert_eq!(&store.get_block(id, loc).await.expect("rebuilt from 2 of 3 shards"), d);
        }
        servers[victim].restart();
        servers[victim].create_bucket(BUCKET);
        // Bring the restarted (empty) server back to full health before losing the next one.
        let store = Store::open(&cfg, &secret).await.expect("open");
        let report = store.scrub(true, &|_| {}).await.expect("scrub --repair");
        assert!(report.unrepaired.is_empty(), "{report:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_passphrase_is_a_clear_error_and_changes_nothing() {
    let servers = servers(1);
    let cfg = config(&servers);
    Store::init(&cfg, &Secret::Passphrase(b"right"), KdfParams::for_tests()).await.expect("init");
    let before = servers[0].dump_bucket(BUCKET);
    let err = Store::open(&cfg, &Secret::Passphrase(b"wrong")).await.err().expect("must fail");
    assert!(matches!(err, StoreError::Crypto(_)), "{err:?}");
    assert!(err.to_string().contains("wrong passphrase"), "message: {err}");
    assert_eq!(servers[0].dump_bucket(BUCKET), before, "a failed unlock changed the store");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
