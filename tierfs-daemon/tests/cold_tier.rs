//! The cold tier through a real mount and real S3 servers (moto on loopback): a workspace
//! eight times the cache size round-trips byte for byte with no plaintext on the server; a
//! server killed during writes costs the application nothing and its copies are repaired
//! once it is back; a wrong passphrase is refused before anything is mounted.

mod common;
use tierfs_test_support::moto;

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{Fixture, Output, Rng, run};
use moto::MotoServer;

const BUCKET: &str = "tierfs-it";
const PASSPHRASE: &str = "correct horse battery staple";

/// A fixture plus a store over `servers`.
struct Cold {
    fx: Fixture,
    store_file: PathBuf,
}

impl Cold {
    fn new(servers: &[MotoServer], extra_init: &[&str]) -> Cold {
        let fx = Fixture::new();
        let store_file = fx.tmp.path().join("store.toml");
        let mut cmd = env(fx.tierfs());
        cmd.args(["init", "--store"]).arg(&store_file);
        for s in servers {
            cmd.args(["--backend", &s.url(BUCKET, "ws")]);
        }
        cmd.args(extra_init);
        run(&mut cmd, Duration::from_secs(60)).assert_success("tierfs init");
        Cold { fx, store_file }
    }

    fn try_mount(&self, cache: &str, passphrase: &str, extra: &[&str]) -> Output {
        let mut cmd = env(self.fx.tierfs());
        cmd.env("TIERFS_PASSPHRASE", passphrase)
            .args(["--json", "mount", "--store"])
            .arg(&self.store_file)
            .args(extra)
            .args(["--cache-size", cache, "--data-dir"])
            .arg(&self.fx.data_dir)
            .arg(&self.fx.mountpoint);
        run(&mut cmd, common::MOUNT_TIMEOUT)
    }

    fn mount(&mut self, cache: &str) {
        self.mount_with(cache, &[]);
    }

    /// [`Cold::mount`] with more `tierfs mount` options.
    fn mount_with(&mut self, cache: &str, extra: &[&str]) {
        let out = self.try_mount(cache, PASSPHRASE, extra);
        out.assert_success("tierfs mount --store");
        let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("mount --json");
        self.fx.daemon_pid = json["pid"].as_u64().map(|p| p as u32);
    }

    fn scrub(&self, repair: bool) -> Output {
        let mut cmd = env(self.fx.tierfs());
        cmd.args(["--json", "scrub", "--store"]).arg(&self.store_file);
        if repair {
            cmd.arg("--repair");
        }
        run(&mut cmd, Duration::from_secs(300))
    }
}

/// moto's credentials and the test passphrase (fast key derivation for tests).
fn env(mut cmd: Command) -> Command {
    for (k, v) in MotoServer::env() {
        cmd.env(k, v);
    }
    cmd.env("TIERFS_PASSPHRASE", PASSPHRASE).env("TIERFS_TEST_FAST_KDF", "test");
    cmd
}

fn servers(n: usize) -> Vec<MotoServer> {
    MotoServer::start_many(n, BUCKET)
}

/// Deterministic file contents that start with a plaintext marker.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut data = Vec::with_capacity(len + 8);
    data.extend_from_slice(format!("SECRET-MARKER-{seed}-").as_bytes());
    while data.len() < len {
        data.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    data.truncate(len);
    data
}

fn write_file(path: &Path, data: &[u8]) {
    let mut f = fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.write_all(data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read_file(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut out))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    out
}

#[test]
fn a_workspace_eight_times_the_cache_round_trips_with_no_plaintext_on_the_server() {
    let servers = servers(1);
    let mut c = Cold::new(&servers, &[]);
    c.mount("16M");
    // 128 MiB in eight 12 MiB files and 400 small ones: 8x the 16 MiB cache.
    let big: Vec<(PathBuf, Vec<u8>)> =
        (0..8).map(|i| (c.fx.p(&format!("big-SECRET-NAME-{i}.bin")), content(i, 12 << 20))).collect();
    let small: Vec<(PathBuf, Vec<u8>)> =
        (0..400).map(|i| (c.fx.p(&format!("small-{i}.txt")), content(1000 + i, 80 << 10))).collect();
    for (p, d) in big.iter().chain(&small) {
        write_file(p, d);
    }
    for (p, d) in big.iter().chain(&small) {
        assert!(read_file(p) == *d, "{} differs right after writing", p.display());
    }
    let status = c.fx.status();
    let cold = &status["cold"];
    assert!(cold["evicted_bytes"].as_u64().unwrap_or(0) > 0, "nothing was evicted: {status}");
    // Far fewer PUTs than files: small files share packs.
    let packs = cold["uploaded_packs"].as_u64().unwrap_or(u64::MAX);
    assert!(packs < 200, "{packs} packs for 408 files: {status}");

    // After a remount (cache state from disk, kernel page cache gone) everything still reads
    // back, most of it fetched from the server.
    c.fx.umount();
    c.mount("16M");
    // Evicted data is still the file's: `du` counts it wherever it is.
    for (p, d) in &big {
        let blocks = fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::blocks(&m)).expect("stat");
        assert_eq!(blocks * 512, (d.len() as u64).div_ceil(4096) * 4096, "st_blocks of {}", p.display());
    }
    for (p, d) in big.iter().chain(&small) {
        assert!(read_file(p) == *d, "{} differs after remount", p.display());
    }
    let status = c.fx.status();
    let fetched = status["cold"]["fetched_bytes"].as_u64().unwrap_or(0);
    assert!(fetched > 64 << 20, "only {fetched} bytes were fetched back: {status}");
    c.fx.umount();

    let objects = servers[0].dump_bucket(BUCKET);
    assert!(objects.len() > 5, "store is nearly empty: {} objects", objects.len());
    for (key, bytes) in &objects {
        for marker in [&b"SECRET-MARKER"[..], b"SECRET-NAME", b"small-1"] {
            assert!(!bytes.windows(marker.len()).any(|w| w == marker), "plaintext {marker:?} in {key}");
            assert!(!key.as_bytes().windows(marker.len()).any(|w| w == marker), "plaintext in the name {key}");
        }
    }
}

#[test]
fn a_server_killed_during_writes_costs_nothing_and_is_repaired() {
    let mut servers = servers(3);
    let mut c = Cold::new(&servers, &[]);
    c.mount("1G");
    let files: Vec<(PathBuf, Vec<u8>)> =
        (0..24).map(|i| (c.fx.p(&format!("f{i}")), content(50 + i, 3 << 20))).collect();
    for (n, (p, d)) in files.iter().enumerate() {
        if n == 8 {
            servers[1].kill();
        }
        write_file(p, d);
    }
    // Every write succeeded (write_file panics otherwise); the unmount flush must succeed too:
    // two of three copies are a quorum.
    c.fx.umount();
    let status_log = fs::read_to_string(c.fx.data_dir.join("daemon.log")).unwrap_or_default();

    servers[1].restart();
    servers[1].create_bucket(BUCKET);
    let damaged = c.scrub(false);
    assert!(!damaged.success(), "scrub must report the lost copies\n{}", damaged.stdout);
    c.scrub(true).assert_success("tierfs scrub --repair");
    let clean = c.scrub(false);
    clean.assert_success("tierfs scrub after repair");
    let report: serde_json::Value = serde_json::from_str(clean.stdout.trim()).expect("scrub --json");
    assert_eq!(report["copies_bad"], 0, "{report}");
    assert_eq!(report["copies_missing"], 0, "{report}");
    assert!(report["packs"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(!servers[1].list_keys(BUCKET).is_empty(), "nothing was repaired onto the restarted server");

    c.mount("1G");
    for (p, d) in &files {
        assert!(read_file(p) == *d, "{} differs (daemon log:\n{status_log})", p.display());
    }
    c.fx.umount();
}

/// An fsync waiting for an unanswering server (it uploads first) holds up nothing else: the
/// mount reads requests on one thread and runs what may wait on its pool. With everything on
/// the request thread (`--io-threads 0`) this test fails: the create below would wait too.
#[test]
fn an_fsync_waiting_for_the_store_holds_up_no_other_operation() {
    use std::sync::mpsc::channel;
    let servers = servers(1);
    let mut c = Cold::new(&servers, &[]);
    c.mount_with("1G", &["--threads", "1"]);
    let slow = c.fx.p("slow");
    let data = content(70, 1 << 20);
    servers[0].pause();
    // The write is local and succeeds; its upload now waits for the paused server.
    write_file(&slow, &data);
    let (synced_tx, synced) = channel();
    let file = fs::OpenOptions::new().write(true).open(&slow).expect("open slow");
    std::thread::spawn(move || synced_tx.send(file.sync_all()));
    assert!(synced.recv_timeout(Duration::from_secs(1)).is_err(), "fsync returned while the only server was paused");

    let (root, other) = (c.fx.mountpoint.clone(), c.fx.p("other"));
    let (done_tx, done) = channel();
    std::thread::spawn(move || {
        write_file(&other, b"not waiting");
        let len = fs::metadata(&other).map(|m| m.len()).ok();
        done_tx.send((len, read_file(&other), fs::read_dir(&root).map(|d| d.count()).ok()))
    });
    let got = done.recv_timeout(Duration::from_secs(20));
    servers[0].resume();
    let (len, back, entries) = got.expect("create, write, stat, read and readdir waited for the fsync");
    assert_eq!((len, back.as_slice(), entries), (Some(11), &b"not waiting"[..], Some(2)));
    synced
        .recv_timeout(Duration::from_secs(120))
        .expect("fsync returned once the server was back")
        .expect("fsync succeeded once the server was back");
    assert!(read_file(&slow) == data, "the fsynced file reads back");
    c.fx.umount();
}

#[test]
fn a_wrong_passphrase_is_refused_before_mounting() {
    let servers = servers(1);
    let c = Cold::new(&servers, &[]);
    let before = servers[0].dump_bucket(BUCKET);
    let out = c.try_mount("64M", "not the passphrase", &[]);
    assert!(!out.success(), "mounted with a wrong passphrase");
    assert!(out.stderr.contains("wrong passphrase"), "unclear error: {}", out.stderr);
    assert!(!common::is_mounted(&c.fx.mountpoint), "left a mount behind");
    assert_eq!(servers[0].dump_bucket(BUCKET), before, "the failed mount changed the store");
}

#[test]
fn keys_can_be_added_listed_changed_and_removed() {
    let fx = Fixture::new();
    let backend = format!("file://{}", fx.tmp.path().join("backend").display());
    let store_file = fx.tmp.path().join("store.toml");
    let tierfs = |pass: &str| {
        let mut cmd = fx.tierfs();
        cmd.env("TIERFS_PASSPHRASE", pass).env("TIERFS_TEST_FAST_KDF", "test");
        cmd
    };
    let mut init = tierfs("first");
    init.args(["init", "--store"]).arg(&store_file).args(["--backend", &backend]);
    run(&mut init, Duration::from_secs(60)).assert_success("tierfs init");

    let list = |pass: &str| -> Output {
        let mut cmd = tierfs(pass);
        cmd.args(["--json", "key", "list", "--store"]).arg(&store_file);
        run(&mut cmd, Duration::from_secs(60))
    };
    let keys: serde_json::Value =
        serde_json::from_str(list("first").assert_success("key list").stdout.trim()).expect("json");
    assert_eq!(keys.as_array().map(Vec::len), Some(1), "{keys}");
    let wrong = list("nope");
    assert!(!wrong.success() && wrong.stderr.contains("wrong passphrase"), "{}", wrong.stderr);

    // A second passphrase opens it too.
    let mut add = tierfs("first");
    add.env("TIERFS_NEW_PASSPHRASE", "second").args(["--json", "key", "add", "--store"]).arg(&store_file);
    run(&mut add, Duration::from_secs(60)).assert_success("key add");
    list("second").assert_success("second passphrase");

    // passwd replaces the passphrase that was used: "first" stops working, "third" works.
    let mut passwd = tierfs("first");
    passwd.env("TIERFS_NEW_PASSPHRASE", "third").args(["key", "passwd", "--store"]).arg(&store_file);
    run(&mut passwd, Duration::from_secs(60)).assert_success("key passwd");
    assert!(!list("first").success(), "the old passphrase still works");
    let keys: serde_json::Value =
        serde_json::from_str(list("third").assert_success("third").stdout.trim()).expect("json");
    let ids: Vec<String> =
        keys.as_array().expect("array").iter().map(|k| k["id"].as_str().unwrap_or("").to_string()).collect();
    assert_eq!(ids.len(), 2, "{keys}");

    // Remove one; the last one cannot be removed.
    let remove = |pass: &str, id: &str| {
        let mut cmd = tierfs(pass);
        cmd.args(["key", "remove", "--store"]).arg(&store_file).arg(id);
        run(&mut cmd, Duration::from_secs(60))
    };
    let keys: serde_json::Value = serde_json::from_str(list("second").stdout.trim()).expect("json");
    let second_id = keys
        .as_array()
        .expect("array")
        .iter()
        .find(|k| k["label"] == "added")
        .and_then(|k| k["id"].as_str())
        .expect("the added key")
        .to_string();
    remove("third", &second_id).assert_success("key remove");
    assert!(!list("second").success(), "a removed passphrase still works");
    let last: String = serde_json::from_str::<serde_json::Value>(list("third").stdout.trim()).expect("json")[0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let refused = remove("third", &last);
    assert!(!refused.success() && refused.stderr.contains("last key"), "{}", refused.stderr);
}

#[test]
fn a_cached_chunk_corrupted_on_local_disk_is_detected_and_fetched_again() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let fx = Fixture::new();
    let backend = format!("file://{}", fx.tmp.path().join("backend").display());
    let store_file = fx.tmp.path().join("store.toml");
    let mut init = env(fx.tierfs());
    init.args(["init", "--store"]).arg(&store_file).args(["--backend", &backend]);
    run(&mut init, Duration::from_secs(60)).assert_success("tierfs init");
    let mut c = Cold { fx, store_file };
    c.mount("1G");
    let data = content(7, 6 << 20);
    let path = c.fx.p("precious");
    write_file(&path, &data);
    let ino = fs::metadata(&path).expect("stat").ino();
    c.fx.umount(); // uploads everything; the chunks stay cached

    // Flip bytes in both chunks of the cached copy, behind tierfs's back.
    let data_file = common::data_file(&c.fx.data_dir, ino);
    let f = fs::OpenOptions::new().write(true).open(&data_file).expect("open the cached data file");
    f.write_all_at(b"bitrot", 100).expect("corrupt chunk 0");
    f.write_all_at(b"bitrot", (4 << 20) + 100).expect("corrupt chunk 1");
    drop(f);

    c.mount("1G");
    assert!(read_file(&path) == data, "served corrupted cache bytes");
    let status = c.fx.status();
    assert_eq!(status["cold"]["verify_failures"], 2, "{status}");
    c.fx.umount();
}

#[test]
fn an_erasure_coded_workspace_keeps_working_with_a_server_down() {
    let mut servers = servers(3);
    let mut c = Cold::new(&servers, &["--erasure", "2+1"]);
    c.mount("16M");
    let before: Vec<(PathBuf, Vec<u8>)> =
        (0..6).map(|i| (c.fx.p(&format!("before-{i}")), content(300 + i, 5 << 20))).collect();
    for (p, d) in &before {
        write_file(p, d);
    }
    c.fx.umount();

    // One of the three servers is lost: every shard and copy on it is gone.
    servers[2].kill();
    c.mount("16M");
    let after: Vec<(PathBuf, Vec<u8>)> =
        (0..6).map(|i| (c.fx.p(&format!("after-{i}")), content(400 + i, 5 << 20))).collect();
    for (p, d) in &after {
        write_file(p, d); // writes go on: 2 of 3 shards is the write quorum of 2+1
    }
    c.fx.umount();
    // Everything reads back, mostly fetched (16 MiB cache, 60 MiB of files), rebuilt from the
    // two remaining shards.
    c.mount("16M");
    for (p, d) in before.iter().chain(&after) {
        assert!(read_file(p) == *d, "{} differs with a server down", p.display());
    }
    let status = c.fx.status();
    assert!(status["cold"]["fetched_bytes"].as_u64().unwrap_or(0) > 32 << 20, "{status}");
    c.fx.umount();
}

#[test]
fn copies_a_down_server_missed_are_repaired_while_mounted() {
    let mut servers = servers(3);
    let mut c = Cold::new(&servers, &[]);
    c.mount("1G");
    servers[1].kill();
    let files: Vec<(PathBuf, Vec<u8>)> =
        (0..4).map(|i| (c.fx.p(&format!("p{i}")), content(700 + i, 2 << 20))).collect();
    for (p, d) in &files {
        write_file(p, d);
    }
    // Uploaded at a quorum of two; server 1's copies wait in the repair queue.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while c.fx.status()["cold"]["dirty_bytes"] != 0 {
        assert!(std::time::Instant::now() < deadline, "uploads did not finish with one server down");
        std::thread::sleep(Duration::from_millis(200));
    }
    let packs = |s: &MotoServer| -> Vec<String> {
        let mut keys: Vec<String> = s.list_keys(BUCKET).into_iter().filter(|k| k.contains("/packs/")).collect();
        keys.sort();
        keys
    };
    let want = packs(&servers[0]);
    assert!(!want.is_empty(), "nothing was uploaded");
    servers[1].restart();
    servers[1].create_bucket(BUCKET);
    // No scrub: the mount itself must put the missed copies on server 1 once it is back.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while packs(&servers[1]) != want {
        assert!(std::time::Instant::now() < deadline, "copies were not repaired while mounted");
        std::thread::sleep(Duration::from_millis(500));
    }
    c.fx.umount();
}

#[test]
fn copies_still_missing_at_unmount_are_repaired_by_the_next_mount() {
    let mut servers = servers(3);
    let mut c = Cold::new(&servers, &[]);
    c.mount("1G");
    let packs = |s: &MotoServer| -> BTreeSet<String> {
        s.list_keys(BUCKET).into_iter().filter(|k| k.contains("/packs/")).collect()
    };
    let before = packs(&servers[0]);
    servers[1].kill();
    let files: Vec<(PathBuf, Vec<u8>)> =
        (0..4).map(|i| (c.fx.p(&format!("q{i}")), content(900 + i, 2 << 20))).collect();
    for (p, d) in &files {
        write_file(p, d);
    }
    // Uploaded at a quorum of two; server 1 is still down at unmount, so its copies stay
    // missing and are saved with the data dir.
    c.fx.umount();
    let saved = c.fx.data_dir.join("pending-repairs.json");
    assert!(saved.exists(), "no repairs saved at unmount");
    let missed: BTreeSet<String> = packs(&servers[0]).difference(&before).cloned().collect();
    assert!(!missed.is_empty(), "nothing was uploaded while server 1 was down");

    servers[1].restart();
    servers[1].create_bucket(BUCKET);
    // No scrub: the next mount queues what the last one saved and puts the copies back.
    c.mount("1G");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !packs(&servers[1]).is_superset(&missed) {
        assert!(std::time::Instant::now() < deadline, "the saved repairs were not done by the next mount");
        std::thread::sleep(Duration::from_millis(500));
    }
    while saved.exists() {
        assert!(std::time::Instant::now() < deadline, "the saved repair list outlived its repairs");
        std::thread::sleep(Duration::from_millis(500));
    }
    for (p, d) in &files {
        assert!(read_file(p) == *d, "{} differs", p.display());
    }
    c.fx.umount();
}

/// A file larger than half the cache streams: a node with nothing local reads it from the
/// store without filling its cache. `tierfs warmup` caches it all the same, and a read after
/// that fetches nothing.
#[test]
fn a_file_larger_than_half_the_cache_streams_and_warmup_caches_it() {
    let servers = servers(1);
    let mut c = Cold::new(&servers, &[]);
    c.mount("32M");
    let big = c.fx.p("big.bin");
    let data = content(7, 20 << 20);
    write_file(&big, &data);
    c.fx.umount();
    // A fresh node: everything is in the store, nothing local.
    c.fx.data_dir = c.fx.tmp.path().join("fresh-node");
    c.mount("32M");
    let cold =
        |c: &Cold, field: &str| c.fx.status()["cold"][field].as_u64().unwrap_or_else(|| panic!("no cold.{field}"));

    assert!(read_file(&big) == data, "streamed read differs");
    let streamed = cold(&c, "streamed_bytes");
    assert!(streamed >= data.len() as u64, "only {streamed} bytes streamed: {}", c.fx.status());
    let resident = cold(&c, "resident_bytes");
    assert!(resident < (data.len() / 2) as u64, "a streamed read filled the cache ({resident} bytes)");

    let mut cmd = env(c.fx.tierfs());
    cmd.arg("warmup").arg(&big);
    let out = run(&mut cmd, Duration::from_secs(120));
    out.assert_success("tierfs warmup");
    assert!(!out.stderr.contains("warning"), "warmup warned: {}", out.stderr);
    let resident = cold(&c, "resident_bytes");
    assert!(resident >= data.len() as u64, "warmup left {resident} bytes cached: {}", c.fx.status());
    assert_eq!(cold(&c, "streamed_bytes"), streamed, "warmup streamed");

    let fetched = cold(&c, "fetched_bytes");
    assert!(read_file(&big) == data, "cached read differs");
    assert_eq!(cold(&c, "fetched_bytes"), fetched, "a warmed-up file was fetched again");
    c.fx.umount();

    // `--stream-above off`: on another fresh node the same read fills the cache.
    c.fx.data_dir = c.fx.tmp.path().join("caching-node");
    c.mount_with("32M", &["--stream-above", "off"]);
    assert!(read_file(&big) == data, "cached read differs");
    assert_eq!(cold(&c, "streamed_bytes"), 0, "streamed with --stream-above off: {}", c.fx.status());
    let fetched = cold(&c, "fetched_bytes");
    assert!(fetched >= data.len() as u64, "only {fetched} bytes fetched: {}", c.fx.status());
    c.fx.umount();
}
