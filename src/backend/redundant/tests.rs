//! Unit tests of [`RedundantStore`] over in-memory (and a few file) backends with injected
//! faults: placement, quorum writes and stragglers, read repair, erasure round trips and the
//! property that any `m` shards may fail, conditional create, scrub, the repair queue across
//! runs, deletes and listings.

use std::time::Instant;

use super::*;
use crate::backend::erasure::{TRAILER_LEN, shard_key};
use crate::backend::faulty::{Fault, FaultSwitch, FaultyStore};
use crate::backend::repair::RepairSource;
use crate::backend::{BackendOptions, BackendSpec, Credentials, ObjectInfo, SavedRepair, SavedSource};
use object_store::memory::InMemory;
use proptest::prelude::*;

fn opts() -> BackendOptions {
    BackendOptions { max_retries: 1, ..BackendOptions::for_tests() }
}

fn store(n: usize, redundancy: Redundancy) -> Faulty {
    Faulty::over((0..n).map(|_| Arc::new(InMemory::new())).collect(), redundancy, opts())
}

/// A store whose backends each sit behind a [`FaultyStore`], with the switches of their faults.
struct Faulty {
    store: RedundantStore,
    faults: Vec<FaultSwitch>,
}

impl Faulty {
    /// Backends `mem-0`, `mem-1`, … over `objects`, with the straggler grace of the tests.
    fn over(objects: Vec<Arc<InMemory>>, redundancy: Redundancy, opts: BackendOptions) -> Faulty {
        let (backends, faults) = objects
            .into_iter()
            .enumerate()
            .map(|(i, o)| {
                let (store, faults) = FaultyStore::wrap(o);
                (Backend::from_object_store(format!("mem-{i}"), store, opts.clone()), faults)
            })
            .unzip();
        let store = RedundantStore::new(backends, redundancy).unwrap().with_straggler_grace(Duration::from_millis(20));
        Faulty { store, faults }
    }

    /// Backend `i` fails as `fault` says from now on (`None` heals it).
    fn fault(&self, i: usize, fault: Option<Fault>) {
        self.faults[i].set(fault);
    }

    fn heal_all(&self) {
        self.faults.iter().for_each(|f| f.set(None));
    }

    /// The same backends and switches, the store reconfigured.
    fn map(self, f: impl FnOnce(RedundantStore) -> RedundantStore) -> Faulty {
        Faulty { store: f(self.store), faults: self.faults }
    }
}

impl std::ops::Deref for Faulty {
    type Target = RedundantStore;

    fn deref(&self) -> &RedundantStore {
        &self.store
    }
}

fn pack(len: usize, seed: u8) -> Bytes {
    Bytes::from((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8).collect::<Vec<u8>>())
}

/// A verify callback that accepts exactly `want`.
fn exactly(want: Bytes) -> impl Fn(&[u8]) -> bool + Send + Sync {
    move |got: &[u8]| got == &want[..]
}

/// `exactly` for `get_pack_range`: the bytes themselves when they are `want`.
fn exact_range(want: Bytes) -> impl Fn(Bytes) -> Option<Bytes> + Send + Sync {
    move |got: Bytes| (got == want).then_some(got)
}

/// Room for every object these tests store whole.
const ANY: SizeLimit = SizeLimit { max_len: 16 << 20, what: "a test object" };

async fn raw(s: &RedundantStore, b: usize, key: &str) -> Option<Bytes> {
    s.backends()[b].get(key, ANY).await.ok()
}

#[test]
fn new_validates_the_policy() {
    let msg = |n, r| RedundantStore::new(mems(n), r).unwrap_err().to_string();
    assert!(msg(2, Redundancy::Replicas(3)).contains("replicas = 3 needs 3 different backends, but 2 are configured"));
    assert!(msg(2, Redundancy::Replicas(0)).contains("at least 1"));
    assert!(msg(5, Redundancy::Erasure { data: 4, parity: 2 }).contains("6 shards on different backends, but 5"));
    assert!(msg(3, Redundancy::Erasure { data: 0, parity: 1 }).contains("data >= 1"));
    assert!(msg(0, Redundancy::Replicas(1)).contains("no backends"));
    let twice = vec![
        Backend::from_object_store("same".into(), Arc::new(InMemory::new()), opts()),
        Backend::from_object_store("same".into(), Arc::new(InMemory::new()), opts()),
    ];
    assert!(RedundantStore::new(twice, Redundancy::Replicas(2)).unwrap_err().to_string().contains("listed twice"));
    assert!(RedundantStore::new(mems(3), Redundancy::Erasure { data: 2, parity: 1 }).is_ok());
    assert_eq!(Redundancy::Erasure { data: 4, parity: 2 }.to_string(), "erasure 4+2");
    assert_eq!(Redundancy::Erasure { data: 4, parity: 2 }.object_copies(), 3);
}

fn mems(n: usize) -> Vec<Backend> {
    (0..n).map(|i| Backend::from_object_store(format!("m{i}"), Arc::new(InMemory::new()), opts())).collect()
}

#[test]
fn placement_is_deterministic_and_spread() {
    let s = store(5, Redundancy::Replicas(3));
    let mut starts = [0usize; 5];
    for i in 0..500 {
        let key = format!("packs/{i:02x}/{i}");
        let p = s.object_placement(&key);
        assert_eq!(p, s.object_placement(&key));
        assert_eq!(p.len(), 3);
        assert_eq!(p[1], (p[0] + 1) % 5);
        starts[p[0]] += 1;
    }
    assert!(starts.iter().all(|&n| n > 50), "{starts:?}");
    let all = store(3, Redundancy::Replicas(3));
    let mut p = all.object_placement("config");
    p.sort_unstable();
    assert_eq!(p, vec![0, 1, 2]);
}

#[tokio::test]
async fn an_oversized_copy_is_a_bad_copy_repaired_from_a_good_one() {
    let s = store(3, Redundancy::Replicas(3));
    let data = Bytes::from_static(b"lease v1");
    s.put_object("ws/lease", data.clone()).await.unwrap();
    let first = s.object_placement("ws/lease")[0];
    s.backends()[first].put("ws/lease", Bytes::from(vec![0u8; 4096])).await.unwrap();
    let limit = SizeLimit { max_len: 64, what: "a lease record" };
    assert_eq!(s.get_object("ws/lease", limit, &exactly(data.clone())).await.unwrap(), data);
    assert_eq!(raw(&s, first, "ws/lease").await.unwrap(), data, "rewritten from the good copy");

    // Every copy oversized: corrupt, naming the key and the sizes.
    for b in s.backends() {
        b.put("ws/lease", Bytes::from(vec![0u8; 4096])).await.unwrap();
    }
    let err = s.get_object("ws/lease", limit, &|_| true).await.unwrap_err();
    assert_eq!(err.kind(), crate::types::ErrorKind::Corrupt);
    let msg = err.to_string();
    assert!(msg.contains("ws/lease") && msg.contains("4096 bytes") && msg.contains("64 bytes a lease record"), "{msg}");
}

#[tokio::test]
async fn quorum_put_with_one_backend_down_queues_a_repair() {
    let s = store(3, Redundancy::Replicas(3));
    let data = Bytes::from_static(b"config v1");
    s.fault(1, Some(Fault::Down));
    let report = s.put_object("config", data.clone()).await.unwrap();
    assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
    assert_eq!(s.pending_repairs(), 1);
    assert!(s.get_object("config", ANY, &exactly(data.clone())).await.is_ok());

    // Still down: the repair stays queued.
    assert_eq!(s.run_repairs().await, 1);
    s.fault(1, None);
    tokio::time::sleep(Duration::from_millis(30)).await; // a tripped breaker's probe is due
    assert_eq!(s.run_repairs().await, 0);
    assert_eq!(raw(&s, 1, "config").await, Some(data));
}

#[tokio::test]
async fn quorum_fails_with_two_backends_down() {
    let s = store(3, Redundancy::Replicas(3));
    s.fault(0, Some(Fault::Down));
    s.fault(2, Some(Fault::Down));
    let err = s.put_object("config", Bytes::from_static(b"x")).await.unwrap_err();
    match &err {
        BackendError::QuorumFailed { stored, needed, errors, .. } => {
            assert_eq!((*stored, *needed, errors.len()), (1, 2, 2));
            assert!(errors.iter().any(|e| e.contains("mem-0")) && errors.iter().any(|e| e.contains("mem-2")));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("1 of the 2 copies needed"), "{err}");
    assert_eq!(s.pending_repairs(), 0, "nothing acknowledged, nothing queued");
}

#[tokio::test]
async fn read_repairs_missing_and_corrupt_copies() {
    let s = store(3, Redundancy::Replicas(3));
    let data = Bytes::from_static(b"index segment");
    s.put_object("index/1", data.clone()).await.unwrap();
    let p = s.object_placement("index/1");
    s.backends()[p[0]].delete("index/1").await.unwrap();
    s.backends()[p[1]].put("index/1", Bytes::from_static(b"garbage")).await.unwrap();
    assert_eq!(s.get_object("index/1", ANY, &exactly(data.clone())).await.unwrap(), data);
    for &b in &p {
        assert_eq!(raw(&s, b, "index/1").await, Some(data.clone()), "backend {b} repaired");
    }
    assert_eq!(s.pending_repairs(), 0);

    // Corruption in transit on the first replica: served from the next one.
    s.fault(p[0], Some(Fault::CorruptReads));
    assert_eq!(s.get_object("index/1", ANY, &exactly(data.clone())).await.unwrap(), data);
}

#[tokio::test]
async fn all_copies_bad_missing_or_unreachable() {
    let s = store(3, Redundancy::Replicas(3));
    let data = Bytes::from_static(b"head");
    s.put_object("refs/ws/head", data.clone()).await.unwrap();
    let err = s.get_object("refs/ws/head", ANY, &|_| false).await.unwrap_err();
    assert!(matches!(err, BackendError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("mem-1: failed verification"), "{err}");
    assert!(s.get_object("refs/ws/none", ANY, &|_| true).await.unwrap_err().is_not_found());

    // One backend down and the others missing the object: not a false "not found".
    s.fault(0, Some(Fault::Down));
    let err = s.get_object("refs/ws/none", ANY, &|_| true).await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("mem-0"), "{err}");
    // …but the object itself is still readable.
    assert_eq!(s.get_object("refs/ws/head", ANY, &exactly(data.clone())).await.unwrap(), data);
    // Bad copies plus one unreachable: maybe the unreachable one is good, so "unavailable".
    let err = s.get_object("refs/ws/head", ANY, &|_| false).await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
}

#[tokio::test]
async fn copies_found_off_placement_are_moved_back() {
    // Two replicas over three backends; simulate a copy left on the third by an older layout.
    let s = store(3, Redundancy::Replicas(2));
    let p = s.object_placement("keys/k1");
    let other = (0..3).find(|b| !p.contains(b)).unwrap();
    let data = Bytes::from_static(b"wrapped key");
    s.backends()[other].put("keys/k1", data.clone()).await.unwrap();
    assert_eq!(s.get_object("keys/k1", ANY, &exactly(data.clone())).await.unwrap(), data);
    for &b in &p {
        assert_eq!(raw(&s, b, "keys/k1").await, Some(data.clone()));
    }
}

#[tokio::test]
async fn replicated_pack_ranges_and_repair() {
    let s = store(3, Redundancy::Replicas(2));
    let data = pack(5000, 1);
    s.put_pack("packs/aa/p1", data.clone()).await.unwrap();
    let p = s.object_placement("packs/aa/p1");
    let want = data.slice(100..4000);
    assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 100..4000, &exact_range(want.clone())).await.unwrap(), want);

    s.backends()[p[0]].put("packs/aa/p1", pack(5000, 9)).await.unwrap();
    assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 100..4000, &exact_range(want.clone())).await.unwrap(), want);
    assert_eq!(raw(&s, p[0], "packs/aa/p1").await, Some(data.clone()), "whole copy repaired");

    assert_eq!(s.get_pack("packs/aa/p1", 5000, &exactly(data.clone())).await.unwrap(), data);
    let short = s.get_pack("packs/aa/p1", 4999, &|_| true).await.unwrap_err();
    assert!(matches!(short, BackendError::Corrupt { .. }), "{short:?}");
    let bad = s.get_pack_range("packs/aa/p1", 5000, 10..5001, &Some).await.unwrap_err();
    assert!(matches!(bad, BackendError::BadRange { .. }), "{bad:?}");
    assert_eq!(s.get_pack_range("packs/aa/p1", 5000, 7..7, &Some).await.unwrap(), Bytes::new());
    let empty_refused = s.get_pack_range("packs/aa/p1", 5000, 7..7, &|_| None::<Bytes>).await.unwrap_err();
    assert!(matches!(empty_refused, BackendError::Corrupt { .. }), "{empty_refused:?}");
}

async fn check_erasure_round_trip(s: &RedundantStore, len: usize) {
    let key = format!("packs/ec/{len}");
    let data = pack(len, 3);
    let report = s.put_pack(&key, data.clone()).await.unwrap();
    let total = match s.redundancy() {
        Redundancy::Erasure { data, parity } => (data + parity) as usize,
        Redundancy::Replicas(_) => unreachable!(),
    };
    assert_eq!(report, PutReport { stored: total, wanted: total, queued_repairs: 0 });
    let n = len as u64;
    for r in [0..n, 0..1, n - 1..n, n / 3..n / 3 * 2, 1..n - 1].into_iter().filter(|r| r.start < r.end) {
        let want = data.slice(r.start as usize..r.end as usize);
        let got = s.get_pack_range(&key, n, r.clone(), &exact_range(want.clone())).await.unwrap();
        assert_eq!(got, want, "range {r:?} of {len}");
    }
    assert_eq!(s.get_pack(&key, n, &exactly(data.clone())).await.unwrap(), data);
    assert!(s.scrub_pack(&key, n, &exactly(data), false).await.is_healthy());
}

#[tokio::test]
async fn erasure_round_trips() {
    let s21 = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    let s42 = store(6, Redundancy::Erasure { data: 4, parity: 2 });
    for len in [1, 2, 3, 7, 1000, 4097] {
        check_erasure_round_trip(&s21, len).await;
        check_erasure_round_trip(&s42, len).await;
    }
    // Shards land on consecutive backends from the key's start.
    let start = s42.start("packs/ec/1000");
    for i in 0..6 {
        let object = raw(&s42, (start + i) % 6, &format!("packs/ec/1000.s{i}")).await.unwrap();
        assert_eq!(object.len(), 250 + TRAILER_LEN);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_packs_code_on_blocking_threads() {
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    let data = pack(3 << 20, 5);
    s.put_pack("packs/big/1", data.clone()).await.unwrap();
    s.backends()[s.shard_backend("packs/big/1", 0)].delete("packs/big/1.s0").await.unwrap();
    let want = data.slice(1_000_000..2_000_000);
    let got = s.get_pack_range("packs/big/1", 3 << 20, 1_000_000..2_000_000, &exact_range(want.clone())).await.unwrap();
    assert_eq!(got, want);
    assert!(raw(&s, s.shard_backend("packs/big/1", 0), "packs/big/1.s0").await.is_some(), "shard rebuilt");
}

#[tokio::test]
async fn erasure_write_quorum_and_repair_queue() {
    // 4+2 acknowledges at 5 shards: one backend down is fine.
    let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
    let data = pack(10_000, 7);
    let down = s.shard_backend("packs/q/1", 5);
    s.fault(down, Some(Fault::Down));
    let report = s.put_pack("packs/q/1", data.clone()).await.unwrap();
    assert_eq!(report, PutReport { stored: 5, wanted: 6, queued_repairs: 1 });
    s.fault(down, None);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(s.run_repairs().await, 0);
    assert!(s.scrub_pack("packs/q/1", 10_000, &exactly(data.clone()), false).await.is_healthy());

    // Two down: 4 of the needed 5.
    s.fault(0, Some(Fault::Down));
    s.fault(1, Some(Fault::Down));
    let err = s.put_pack("packs/q/2", data.clone()).await.unwrap_err();
    assert!(matches!(err, BackendError::QuorumFailed { stored: 4, needed: 5, .. }), "{err:?}");

    // 2+1 with one backend down still writes (k shards now, the third queued); two down fail.
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    s.fault(0, Some(Fault::Down));
    let report = s.put_pack("packs/q/3", data.clone()).await.unwrap();
    assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
    s.fault(1, Some(Fault::Down));
    let err = s.put_pack("packs/q/4", data).await.unwrap_err();
    assert!(matches!(err, BackendError::QuorumFailed { stored: 1, needed: 2, .. }), "{err:?}");
}

#[tokio::test]
async fn repairs_without_kept_bytes_reread_good_data() {
    for redundancy in [Redundancy::Replicas(3), Redundancy::Erasure { data: 4, parity: 2 }] {
        let n = if redundancy == Redundancy::Replicas(3) { 3 } else { 6 };
        let s = store(n, redundancy).map(|s| s.with_repair_memory_limit(0));
        let data = pack(3000, 11);
        let target = match redundancy {
            Redundancy::Replicas(_) => s.object_placement("packs/m/1")[2],
            Redundancy::Erasure { .. } => s.shard_backend("packs/m/1", 2),
        };
        s.fault(target, Some(Fault::Down));
        let report = s.put_pack("packs/m/1", data.clone()).await.unwrap();
        assert_eq!(report.queued_repairs, 1, "{redundancy}");
        assert!(s.repairs.tasks().iter().all(|t| !matches!(t.source, RepairSource::Data(_))));
        s.fault(target, None);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(s.run_repairs().await, 0, "{redundancy}");
        let outcome = s.scrub_pack("packs/m/1", 3000, &exactly(data.clone()), false).await;
        assert!(outcome.is_healthy(), "{redundancy}: {outcome:?}");
    }
}

/// Stores over the same in-memory object stores, as two runs of a daemon see them.
fn shared_stores(n: usize, redundancy: Redundancy, runs: usize) -> Vec<Faulty> {
    let objects: Vec<Arc<InMemory>> = (0..n).map(|_| Arc::new(InMemory::new())).collect();
    (0..runs).map(|_| Faulty::over(objects.clone(), redundancy, opts())).collect()
}

#[tokio::test]
async fn saved_repairs_are_done_by_the_next_run() {
    for (redundancy, n, memory) in [
        (Redundancy::Replicas(3), 3, DEFAULT_REPAIR_MEMORY), // repairs that hold their bytes
        (Redundancy::Replicas(3), 3, 0),                     // repairs that copy from a replica
        (Redundancy::Erasure { data: 2, parity: 1 }, 3, 0),  // shards rebuilt from the others
    ] {
        let mut runs = shared_stores(n, redundancy, 2).into_iter();
        let (first, second) = (runs.next().unwrap().map(|s| s.with_repair_memory_limit(memory)), runs.next().unwrap());
        let data = pack(5000, 3);
        first.fault(1, Some(Fault::Down));
        first.put_object("config", Bytes::from_static(b"config v1")).await.unwrap();
        first.put_pack("packs/r/1", data.clone()).await.unwrap();
        assert!(first.pending_repairs() >= 1, "{redundancy}");
        let saved = first.saved_repairs();
        assert!(saved.iter().all(|r| r.backend == "mem-1"), "{redundancy}: {saved:?}");
        // What a daemon writes to disk and reads back, plus an entry for a backend that is gone.
        let mut back: Vec<SavedRepair> = serde_json::from_str(&serde_json::to_string(&saved).unwrap()).unwrap();
        assert_eq!(back, saved);
        back.push(SavedRepair {
            backend: "removed".into(),
            key: "config".into(),
            from: SavedSource::Copies(vec!["mem-0".into()]),
        });
        drop(first); // the first run ends with backend 1 still down

        assert_eq!(second.restore_repairs(&back), saved.len(), "{redundancy}");
        assert_eq!(second.run_repairs().await, 0, "{redundancy}");
        assert_eq!(raw(&second, 1, "config").await, Some(Bytes::from_static(b"config v1")), "{redundancy}");
        let outcome = second.scrub_pack("packs/r/1", 5000, &exactly(data), false).await;
        assert!(outcome.is_healthy(), "{redundancy}: {outcome:?}");
    }
}

#[tokio::test]
async fn slow_backends_finish_in_the_background() {
    let s = store(3, Redundancy::Replicas(3));
    let slow = 2;
    s.fault(slow, Some(Fault::Slow(Duration::from_millis(1500))));
    let started = Instant::now();
    let report = s.put_object("journal/ws/1", Bytes::from_static(b"segment")).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(1000), "{:?}", started.elapsed());
    assert_eq!(report, PutReport { stored: 2, wanted: 3, queued_repairs: 1 });
    assert_eq!(s.pending_repairs(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.pending_repairs() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.pending_repairs(), 0, "the straggler landed and cleared its repair");
    s.fault(slow, None);
    assert_eq!(raw(&s, slow, "journal/ws/1").await, Some(Bytes::from_static(b"segment")));
}

/// Every copy of `key` in `s`'s placement, as stored.
async fn copies(s: &RedundantStore, key: &str) -> Vec<Option<Bytes>> {
    let mut out = Vec::new();
    for b in s.object_placement(key) {
        out.push(raw(s, b, key).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_creates_have_exactly_one_winner() {
    let s = Arc::new(store(3, Redundancy::Replicas(3)));
    for seq in 0..50 {
        let key = format!("refs/ws/j/{seq}");
        let (a, b) = (Bytes::from(format!("writer a, entry {seq}")), Bytes::from(format!("writer b, entry {seq}")));
        let ta = tokio::spawn({
            let (s, key, a) = (s.clone(), key.clone(), a.clone());
            async move { s.create_object(&key, a).await.unwrap() }
        });
        let tb = tokio::spawn({
            let (s, key, b) = (s.clone(), key.clone(), b.clone());
            async move { s.create_object(&key, b).await.unwrap() }
        });
        let (oa, ob) = (ta.await.unwrap(), tb.await.unwrap());
        let winner = match (oa, ob) {
            (CreateOutcome::Created, CreateOutcome::Exists) => a,
            (CreateOutcome::Exists, CreateOutcome::Created) => b,
            other => panic!("{key}: {other:?}"),
        };
        // The winner overwrote any minority copy of the loser before returning.
        assert_eq!(copies(&s, &key).await, vec![Some(winner.clone()); 3], "{key}");
        // Retrying either create changes nothing.
        assert_eq!(s.create_object(&key, winner.clone()).await.unwrap(), CreateOutcome::Created);
        let loser = Bytes::from(format!("writer c, entry {seq}"));
        assert_eq!(s.create_object(&key, loser).await.unwrap(), CreateOutcome::Exists);
    }
    assert_eq!(s.pending_repairs(), 0);
}

#[tokio::test]
async fn a_competitors_minority_copy_is_overwritten() {
    let s = store(3, Redundancy::Replicas(3));
    let key = "refs/ws/j/7";
    let p = s.object_placement(key);
    let (ours, theirs) = (Bytes::from_static(b"ours"), Bytes::from_static(b"theirs"));
    // A competitor got one copy in first, then stopped (crashed, or lost the other two).
    assert!(s.backends()[p[1]].put_if_absent(key, theirs.clone()).await.unwrap());
    assert_eq!(s.create_object(key, ours.clone()).await.unwrap(), CreateOutcome::Created);
    assert_eq!(copies(&s, key).await, vec![Some(ours.clone()); 3]);
    assert_eq!(s.pending_repairs(), 0);
    // The competitor's retry now finds the majority taken.
    assert_eq!(s.create_object(key, theirs).await.unwrap(), CreateOutcome::Exists);

    // Two competing copies: ours cannot win; our copy made on the way is left, nothing queued.
    let key = "refs/ws/j/8";
    let p = s.object_placement(key);
    for &b in &p[..2] {
        s.backends()[b].put(key, Bytes::from_static(b"theirs")).await.unwrap();
    }
    assert_eq!(s.create_object(key, ours.clone()).await.unwrap(), CreateOutcome::Exists);
    assert_eq!(raw(&s, p[0], key).await, Some(Bytes::from_static(b"theirs")));
    assert_eq!(s.pending_repairs(), 0);
}

#[tokio::test]
async fn create_with_one_backend_down_queues_a_repair() {
    let s = store(3, Redundancy::Replicas(3));
    let key = "refs/ws/j/1";
    let down = s.object_placement(key)[0];
    s.fault(down, Some(Fault::Down));
    let data = Bytes::from_static(b"entry 1");
    assert_eq!(s.create_object(key, data.clone()).await.unwrap(), CreateOutcome::Created);
    assert_eq!(s.pending_repairs(), 1);
    // The same bytes again (our retry after a lost answer): still ours.
    assert_eq!(s.create_object(key, data.clone()).await.unwrap(), CreateOutcome::Created);
    // Someone else's bytes: two copies answer "taken", which settles it without the third.
    assert_eq!(s.create_object(key, Bytes::from_static(b"other")).await.unwrap(), CreateOutcome::Exists);

    s.fault(down, None);
    tokio::time::sleep(Duration::from_millis(30)).await; // a tripped breaker's probe is due
    assert_eq!(s.run_repairs().await, 0);
    assert_eq!(copies(&s, key).await, vec![Some(data); 3]);
}

#[tokio::test]
async fn create_without_a_majority_fails() {
    let s = store(3, Redundancy::Replicas(3));
    let key = "refs/ws/j/2";
    let p = s.object_placement(key);
    s.fault(p[0], Some(Fault::Down));
    s.fault(p[2], Some(Fault::Down));
    let err = s.create_object(key, Bytes::from_static(b"entry 2")).await.unwrap_err();
    match &err {
        BackendError::QuorumFailed { stored: 1, needed: 2, errors, .. } => assert_eq!(errors.len(), 2, "{err}"),
        other => panic!("{other:?}"),
    }
    assert!(err.is_transient());
    assert_eq!(s.pending_repairs(), 0, "nothing acknowledged, nothing queued");

    // One "taken" and one unreachable: the unreachable copy could decide either way.
    s.fault(p[0], None);
    s.backends()[p[1]].put(key, Bytes::from_static(b"theirs")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let err = s.create_object(key, Bytes::from_static(b"entry 2")).await.unwrap_err();
    assert!(matches!(err, BackendError::QuorumFailed { stored: 1, needed: 2, .. }), "{err:?}");
    assert!(err.to_string().contains("another writer's object is there"), "{err}");
    assert_eq!(s.pending_repairs(), 0);

    assert!(matches!(s.create_object("a//b", Bytes::new()).await, Err(BackendError::BadKey { .. })));
}

#[tokio::test]
async fn create_on_file_backends() {
    let dir = tempfile::tempdir().unwrap();
    let backends = (0..3)
        .map(|i| {
            let spec = BackendSpec::File { path: dir.path().join(format!("b{i}")) };
            Backend::open(&spec, &Credentials::default(), &opts()).unwrap()
        })
        .collect();
    let s = RedundantStore::new(backends, Redundancy::Erasure { data: 2, parity: 1 }).unwrap();
    s.check_conditional_create().await.unwrap();
    let key = "refs/ws/j/1";
    let (a, b) = (Bytes::from_static(b"writer a"), Bytes::from_static(b"writer b"));
    let (oa, ob) = tokio::join!(s.create_object(key, a.clone()), s.create_object(key, b.clone()));
    let (oa, ob) = (oa.unwrap(), ob.unwrap());
    assert_ne!(oa, ob, "exactly one winner");
    let winner = if oa == CreateOutcome::Created { a } else { b };
    assert_eq!(copies(&s, key).await, vec![Some(winner.clone()); 3]);
    assert_eq!(s.get_object(key, ANY, &exactly(winner)).await.unwrap().len(), 8);
    assert!(s.list("").await.unwrap().iter().all(|o| !o.key.starts_with("probe")), "probes deleted");
}

#[tokio::test]
async fn conditional_create_check_names_a_backend_that_ignores_it() {
    let s = store(3, Redundancy::Replicas(3));
    s.check_conditional_create().await.unwrap();
    s.fault(1, Some(Fault::IgnoreConditional));
    let err = s.check_conditional_create().await.unwrap_err();
    match &err {
        BackendError::NotSupported { backend, operation, .. } => {
            assert_eq!((backend.as_str(), operation.as_str()), ("mem-1", "conditional create (If-None-Match: *)"));
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("mem-1 does not support") && msg.contains("Garage"), "{msg}");
    for b in s.backends() {
        assert!(b.list("").await.unwrap().is_empty(), "{}: probe deleted", b.name());
    }

    // Unreachable backends are skipped, as long as one could be probed.
    s.fault(1, Some(Fault::Down));
    s.fault(2, Some(Fault::Down));
    s.check_conditional_create().await.unwrap();
    s.fault(0, Some(Fault::Down));
    let err = s.check_conditional_create().await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("mem-0") && err.to_string().contains("mem-2"), "{err}");
}

#[tokio::test]
async fn scrub_finds_and_repairs() {
    let s = store(3, Redundancy::Replicas(3));
    let data = Bytes::from_static(b"snapshot descriptor");
    s.put_object("snapshots/1", data.clone()).await.unwrap();
    s.backends()[0].delete("snapshots/1").await.unwrap();
    s.backends()[1].put("snapshots/1", Bytes::from_static(b"rot")).await.unwrap();
    let v = exactly(data.clone());
    let found = s.scrub_object("snapshots/1", ANY, &v, false).await;
    assert_eq!(
        found,
        ScrubOutcome {
            copies_ok: 1,
            copies_bad: 1,
            copies_missing: 1,
            copies_unreachable: 0,
            repaired: 0,
            unrepairable: false
        }
    );
    let fixed = s.scrub_object("snapshots/1", ANY, &v, true).await;
    assert_eq!(fixed.repaired, 2);
    assert!(s.scrub_object("snapshots/1", ANY, &v, false).await.is_healthy());
    assert!(s.scrub_object("snapshots/1", ANY, &|_| false, true).await.unrepairable);

    // Erasure: a stale parity shard with a valid trailer is caught by re-encoding.
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    let data = pack(1001, 2);
    s.put_pack("packs/s/1", data.clone()).await.unwrap();
    let other = Codec::new(2, 1).unwrap().encode(&pack(1001, 99)).unwrap();
    s.backends()[s.shard_backend("packs/s/1", 2)].put("packs/s/1.s2", other[2].clone()).await.unwrap();
    let v = exactly(data.clone());
    let found = s.scrub_pack("packs/s/1", 1001, &v, true).await;
    assert_eq!((found.copies_ok, found.copies_bad, found.copies_missing, found.repaired), (2, 1, 0, 1), "{found:?}");
    assert!(s.scrub_pack("packs/s/1", 1001, &v, false).await.is_healthy());
    // With only k shards left and one of them stale, nothing good can be rebuilt.
    s.backends()[s.shard_backend("packs/s/1", 2)].put("packs/s/1.s2", other[2].clone()).await.unwrap();
    s.backends()[s.shard_backend("packs/s/1", 0)].delete("packs/s/1.s0").await.unwrap();
    assert!(s.scrub_pack("packs/s/1", 1001, &v, true).await.unrepairable);

    // 4+2: a missing data shard and a stale parity shard, rebuilt from the other four.
    let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
    s.put_pack("packs/s/1", data.clone()).await.unwrap();
    let other = Codec::new(4, 2).unwrap().encode(&pack(1001, 99)).unwrap();
    s.backends()[s.shard_backend("packs/s/1", 5)].put("packs/s/1.s5", other[5].clone()).await.unwrap();
    s.backends()[s.shard_backend("packs/s/1", 0)].delete("packs/s/1.s0").await.unwrap();
    let found = s.scrub_pack("packs/s/1", 1001, &v, true).await;
    assert_eq!((found.copies_ok, found.copies_bad, found.copies_missing, found.repaired), (4, 1, 1, 2), "{found:?}");
    assert!(s.scrub_pack("packs/s/1", 1001, &v, false).await.is_healthy());
    let lost = s.scrub_pack("packs/s/none", 1001, &v, true).await;
    assert!(lost.unrepairable && lost.copies_missing == 6, "{lost:?}");
}

#[tokio::test]
async fn list_folds_shards_and_tolerates_failures() {
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    s.put_pack("packs/ab/p1", pack(100, 1)).await.unwrap();
    s.put_pack("packs/cd/p2", pack(10, 1)).await.unwrap();
    s.put_object("config", Bytes::from_static(b"c")).await.unwrap();
    let packs = s.list("packs/").await.unwrap();
    assert_eq!(
        packs,
        vec![
            ObjectInfo { key: "packs/ab/p1".into(), size: 50 + TRAILER_LEN as u64 },
            ObjectInfo { key: "packs/cd/p2".into(), size: 5 + TRAILER_LEN as u64 }
        ]
    );
    assert_eq!(s.list("").await.unwrap().len(), 3);
    s.fault(0, Some(Fault::Down));
    assert_eq!(s.list("packs").await.unwrap().len(), 2, "one backend lost is tolerated");
    s.fault(1, Some(Fault::Down));
    let err = s.list("packs").await.unwrap_err();
    assert!(matches!(err, BackendError::ListIncomplete { .. }), "{err:?}");
}

#[tokio::test]
async fn deletes_remove_every_copy_and_queued_repairs() {
    let s = store(6, Redundancy::Erasure { data: 4, parity: 2 });
    s.fault(s.shard_backend("packs/d/1", 1), Some(Fault::Down));
    s.put_pack("packs/d/1", pack(100, 1)).await.unwrap();
    assert_eq!(s.pending_repairs(), 1);
    assert!(s.delete_pack("packs/d/1").await.is_err(), "one shard's backend is down");
    assert_eq!(s.pending_repairs(), 0, "no repair resurrects a deleted pack");
    s.put_object("index/d", Bytes::from_static(b"i")).await.unwrap();
    s.heal_all();
    tokio::time::sleep(Duration::from_millis(30)).await;
    s.delete_pack("packs/d/1").await.unwrap();
    s.delete_object("index/d").await.unwrap();
    assert!(s.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn health_reports_each_backend() {
    let opts = BackendOptions { breaker_probe_after: Duration::from_secs(60), ..opts() };
    let s = Faulty::over((0..3).map(|_| Arc::new(InMemory::new())).collect(), Redundancy::Replicas(3), opts);
    s.fault(2, Some(Fault::Down));
    for i in 0..5 {
        let _ = s.put_object(&format!("journal/w/{i}"), Bytes::from_static(b"j")).await;
    }
    let health = s.health();
    assert!(health[0].available && health[0].consecutive_failures == 0);
    assert!(!health[2].available && health[2].consecutive_failures == 5, "{:?}", health[2]);
    assert!(health[2].last_error.as_deref().unwrap_or_default().contains("injected fault"));
}

#[tokio::test]
async fn bad_keys_are_refused_up_front() {
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    for key in ["", "a//b", "../x", "sp ace"] {
        let err = s.put_object(key, Bytes::new()).await.unwrap_err();
        assert!(matches!(err, BackendError::BadKey { .. }), "{key:?}: {err:?}");
        assert!(matches!(s.get_pack(key, 1, &|_| true).await, Err(BackendError::BadKey { .. })));
        assert!(s.scrub_object(key, ANY, &|_| true, true).await.unrepairable);
    }
    assert!(matches!(s.list("a//b").await, Err(BackendError::BadKey { .. })));
    assert!(s.health().iter().all(|h| h.consecutive_failures == 0));
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: T) {}
    let s = store(3, Redundancy::Erasure { data: 2, parity: 1 });
    let v: Verify<'_> = &|_| true;
    send(s.put_object("k", Bytes::new()));
    send(s.put_pack("k", Bytes::new()));
    send(s.get_object("k", ANY, v));
    send(s.get_pack_range("k", 1, 0..1, &Some));
    send(s.get_pack("k", 1, v));
    send(s.scrub_object("k", ANY, v, true));
    send(s.scrub_pack("k", 1, v, true));
    send(s.run_repairs());
    send(s.list(""));
    send(s.create_object("k", Bytes::new()));
    send(s.check_conditional_create());
    fn sync<T: Send + Sync>(_: &T) {}
    sync(&s);
}

/// What happens to one shard in the erasure property test.
#[derive(Clone, Copy, Debug)]
enum Damage {
    Delete,
    Corrupt,
    Down,
    CorruptReads,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn any_m_shards_can_fail(
        four_two in any::<bool>(),
        len in 1usize..5000,
        damaged in proptest::collection::vec((any::<prop::sample::Index>(), 0u8..4), 0..3),
        range in (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
    ) {
        let (k, m) = if four_two { (4u8, 2u8) } else { (2, 1) };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let s = store((k + m) as usize, Redundancy::Erasure { data: k, parity: m });
            let data = pack(len, len as u8);
            s.put_pack("packs/pp/x", data.clone()).await.unwrap();
            let total = (k + m) as usize;
            let mut hit: Vec<(usize, Damage)> = Vec::new();
            for (idx, how) in damaged.into_iter().take(m as usize) {
                let i = idx.index(total);
                if hit.iter().any(|(j, _)| *j == i) {
                    continue;
                }
                let how = [Damage::Delete, Damage::Corrupt, Damage::Down, Damage::CorruptReads][how as usize];
                let backend = s.shard_backend("packs/pp/x", i);
                let b = &s.backends()[backend];
                let shard = shard_key("packs/pp/x", i);
                match how {
                    Damage::Delete => b.delete(&shard).await.unwrap(),
                    Damage::Corrupt => {
                        let mut bytes = b.get(&shard, ANY).await.unwrap().to_vec();
                        bytes[0] ^= 0x80;
                        b.put(&shard, Bytes::from(bytes)).await.unwrap();
                    }
                    Damage::Down => s.fault(backend, Some(Fault::Down)),
                    Damage::CorruptReads => s.fault(backend, Some(Fault::CorruptReads)),
                }
                hit.push((i, how));
            }
            let a = range.0.index(len) as u64;
            let z = a + 1 + range.1.index(len - a as usize) as u64;
            let want = data.slice(a as usize..z as usize);
            let got = s.get_pack_range("packs/pp/x", len as u64, a..z, &exact_range(want.clone())).await.unwrap();
            assert_eq!(got, want);
            assert_eq!(s.get_pack("packs/pp/x", len as u64, &exactly(data.clone())).await.unwrap(), data);

            let v = exactly(data.clone());
            let scrub = s.scrub_pack("packs/pp/x", len as u64, &v, true).await;
            assert!(!scrub.unrepairable, "{scrub:?}");
            let down = hit.iter().filter(|(_, h)| matches!(h, Damage::Down)).count();
            assert_eq!(scrub.copies_unreachable, down, "{scrub:?} {hit:?}");
            s.heal_all();
            tokio::time::sleep(Duration::from_millis(25)).await;
            let after = s.scrub_pack("packs/pp/x", len as u64, &v, true).await;
            // Shards behind a downed backend were never damaged at rest.
            assert!(after.is_healthy(), "{after:?} after {hit:?}");
        });
    }
}

/// A lagging replica: the first writer's copy on it stores late, so a second writer's create
/// lands there and loses on the other two. Its own copy is then the first one a plain read
/// finds, and believing it would give the key to both writers; the majority read says who
/// owns it, and copies that agree on nothing are `QuorumFailed`, never a guess.
#[tokio::test]
async fn after_a_lost_create_the_majority_and_not_the_losers_own_copy_says_who_owns_the_key() {
    let s = store(3, Redundancy::Replicas(3));
    let key = "refs/ws/j/9";
    let p = s.object_placement(key);
    let (a, b) = (Bytes::from_static(b"writer a"), Bytes::from_static(b"writer b"));
    s.fault(p[0], Some(Fault::Late));
    assert_eq!(s.create_object(key, a.clone()).await.unwrap(), CreateOutcome::Created);
    s.fault(p[0], None);
    assert_eq!(s.create_object(key, b.clone()).await.unwrap(), CreateOutcome::Exists);
    assert_eq!(copies(&s, key).await, vec![Some(b.clone()), Some(a.clone()), Some(a.clone())]);
    // The hazard: the first copy read is the loser's own.
    assert_eq!(s.get_object(key, ANY, &|_| true).await.unwrap(), b);
    assert_eq!(s.get_object_majority(key, ANY, &|_| true).await.unwrap(), Some(a.clone()));
    // a's late create arrives and is refused: b's copy is there.
    assert_eq!(s.faults[p[0]].deliver_late().await.unwrap(), 0);

    // Three different copies: no majority, so no answer.
    s.backends()[p[1]].put(key, Bytes::from_static(b"writer c")).await.unwrap();
    let err = s.get_object_majority(key, ANY, &|_| true).await.unwrap_err();
    assert!(matches!(err, BackendError::NoMajority { agreeing: 1, needed: 2, .. }), "{err}");
    // A copy that fails verification counts for nobody; all of them failing is damage.
    let err = s.get_object_majority(key, ANY, &|c| c != b"writer c".as_slice()).await.unwrap_err();
    assert!(matches!(err, BackendError::NoMajority { .. }), "{err}");
    let err = s.get_object_majority(key, ANY, &|_| false).await.unwrap_err();
    assert!(matches!(err, BackendError::Corrupt { .. }), "{err}");

    // Missing on a majority: absent, even with one copy left somewhere.
    let gone = "refs/ws/j/10";
    let p = s.object_placement(gone);
    s.backends()[p[2]].put(gone, a.clone()).await.unwrap();
    assert_eq!(s.get_object_majority(gone, ANY, &|_| true).await.unwrap(), None);
    // Too few copies answer to tell: the store is away.
    s.fault(p[0], Some(Fault::Down));
    s.fault(p[1], Some(Fault::Down));
    let err = s.get_object_majority(gone, ANY, &|_| true).await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err}");
    s.heal_all();
}

/// A late put on one of three replicas (a lease renewed while one replica lags): the majority
/// read gives the new record, and after the late write arrives every copy agrees.
#[tokio::test]
async fn a_majority_read_sees_past_a_replica_that_stores_late() {
    let s = store(3, Redundancy::Replicas(3));
    let key = "ws/lease";
    let (old, new) = (Bytes::from_static(b"lease, old holder"), Bytes::from_static(b"lease, new holder"));
    s.put_object(key, old.clone()).await.unwrap();
    let p = s.object_placement(key);
    s.fault(p[0], Some(Fault::Late));
    s.put_object(key, new.clone()).await.unwrap();
    s.fault(p[0], None);
    assert_eq!(raw(&s, p[0], key).await, Some(old.clone()), "the lagging replica still answers the old lease");
    assert_eq!(s.get_object_majority(key, ANY, &|_| true).await.unwrap(), Some(new.clone()));
    assert_eq!(s.faults[p[0]].deliver_late().await.unwrap(), 1);
    assert_eq!(copies(&s, key).await, vec![Some(new); 3]);
}
