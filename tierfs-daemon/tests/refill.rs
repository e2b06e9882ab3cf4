//! The cache after a reset (issue 24, item 1): a node saves its hot set in the store, and a
//! fresh node refills its cache from it in the background. These tests assert *what* is
//! fetched (which files come back local, in which order, within which bounds), never how fast:
//! node A writes old data that its small cache evicts, then files it reads; after a reset, a
//! fresh node holds the files A used without reading them, never A's evicted data, stops at
//! its own cache size keeping what A read first (in the order A first read it), and
//! `--no-refill` fetches nothing.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Rng, data_file};
use moto::MotoServer;
use store_node::Node;

const MIB: u64 = 1 << 20;
/// The bytes a walk fetches ahead of the file opened: a quarter of the cache
/// (`tierfs::vfs::walk::Window`), with the cache these tests give the node that walks.
fn window(cache_mib: u64, file_len: u64) -> usize {
    (cache_mib * MIB / 4 / file_len) as usize
}
const BUCKET: &str = "tierfs-refill";

/// The files of the workspace with their bytes: `old/` (written first, 40 MiB: node A's
/// 32 MiB cache cannot hold it), then `hot/` (big files and small ones), read after.
struct Tree {
    old: Vec<(String, Vec<u8>)>,
    big: Vec<(String, Vec<u8>)>,
    small: Vec<(String, Vec<u8>)>,
}

impl Tree {
    fn new() -> Tree {
        let mut rng = Rng::new(24);
        let mut files = |prefix: &str, n: usize, len: u64| -> Vec<(String, Vec<u8>)> {
            (0..n).map(|i| (format!("{prefix}{i:03}"), rng.bytes(len as usize))).collect()
        };
        Tree { old: files("old/o", 10, 4 * MIB), big: files("hot/big", 4, 4 * MIB), small: files("hot/s/f", 200, 8192) }
    }

    fn hot(&self) -> impl Iterator<Item = &(String, Vec<u8>)> {
        self.big.iter().chain(&self.small)
    }
}

/// Bytes the data file of `rel` holds on `node` (looked up through the mount by `stat`, which
/// fetches nothing; the data file itself is read behind tierfs's back).
fn cached(node: &Node, rel: &str) -> u64 {
    let ino = fs::metadata(node.fx.p(rel)).unwrap_or_else(|e| panic!("stat {rel}: {e}")).ino();
    fs::metadata(data_file(&node.fx.data_dir, ino)).map_or(0, |m| m.blocks() * 512)
}

/// Waits until the refill ended and returns `cold.refill` of the status.
fn refill_end(node: &Node) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let refill = node.fx.status()["cold"]["refill"].clone();
        if refill["state"] != "running" && !refill.is_null() {
            return refill;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "the refill did not end: {refill}\n{}", node.daemon_log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn read_all(root: &Path, files: &[(String, Vec<u8>)]) {
    for (rel, want) in files {
        let got = fs::read(root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
        assert!(got == *want, "{rel} has the wrong bytes");
    }
}

fn cold_u64(node: &Node, field: &str) -> u64 {
    node.fx.status()["cold"][field].as_u64().unwrap_or_else(|| panic!("no cold.{field}"))
}

#[test]
fn a_fresh_node_refills_what_the_last_node_used_and_nothing_else() {
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let tree = Tree::new();
    let mut a = Node::init(&servers, BUCKET, "refill");
    a.mount(&["--cache-size", "32M"]);
    let root = a.fx.mountpoint.clone();
    for dir in ["old", "hot/s"] {
        fs::create_dir_all(root.join(dir)).expect("mkdir");
    }
    for (rel, data) in tree.old.iter().chain(tree.hot()) {
        fs::write(root.join(rel), data).expect("write");
    }
    a.sync("written").assert_success("tierfs sync");
    // Read first, so first in the hot set (its ordered prefix): the small files, then the big
    // ones, which are then the most recently used. A fresh mount first, so that every read
    // reaches tierfs: the kernel keeps the pages of what this mount wrote, and reads it serves
    // from them leave the recency of the writes (reclaim under load made that depend on the
    // machine).
    a.fx.umount();
    a.mount(&["--cache-size", "32M"]);
    read_all(&root, &tree.small);
    read_all(&root, &tree.big);
    a.sync("read").assert_success("tierfs sync");
    a.fx.umount();
    a.wipe_local_state();
    let hot_bytes: u64 = tree.hot().map(|(_, d)| d.len() as u64).sum();

    // --no-refill: nothing is fetched, and this node, which held nothing, leaves A's set alone.
    let mut none = Node::new(&a.store_file);
    none.mount(&["--no-refill"]);
    std::thread::sleep(Duration::from_millis(1500));
    let status = none.fx.status();
    assert!(status["cold"]["refill"].is_null(), "a refill ran with --no-refill: {status}");
    assert_eq!(status["cold"]["fetched_bytes"], 0, "--no-refill fetched: {status}");
    none.fx.umount();

    // A small cache: the refill stops at 90% of it, what A read first back first.
    let mut small = Node::new(&a.store_file);
    small.mount(&["--read-only", "--cache-size", "8M"]);
    let refill = refill_end(&small);
    assert_eq!(refill["state"], "stopped", "{refill}");
    assert!(refill["stopped"].as_str().is_some_and(|s| s.contains("cache is full")), "{refill}");
    let resident = cold_u64(&small, "resident_bytes");
    assert!(resident <= 8 * MIB / 10 * 9, "the refill went past 90% of the cache: {resident} bytes");
    for (rel, data) in &tree.small {
        assert!(
            cached(&small, rel) >= data.len() as u64,
            "{rel}, read first on A, was not refilled first: {refill}\n{}",
            small.daemon_log()
        );
    }
    small.fx.umount();

    // A cache that holds the hot set: every file A used is local, none of what A had evicted.
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let refill = refill_end(&b);
    assert_eq!(refill["state"], "done", "{refill}\n{}", b.daemon_log());
    assert_eq!(refill["failed_chunks"], 0, "{refill}");
    let fetched = refill["fetched_bytes"].as_u64().expect("fetched_bytes");
    // A's hot set is capped at 90% of its 32 MiB cache: its hot files and what was left of old/.
    assert!(
        fetched >= hot_bytes && fetched <= 32 * MIB / 10 * 9,
        "refilled {fetched} bytes for {hot_bytes} hot: {refill}"
    );
    for (rel, data) in tree.hot() {
        assert!(cached(&b, rel) >= data.len() as u64, "{rel} was not refilled: {refill}");
    }
    let old_cached: u64 = tree.old.iter().map(|(rel, _)| cached(&b, rel)).sum();
    assert!(old_cached <= fetched - hot_bytes + MIB, "old/ came back beyond A's hot set: {old_cached} bytes");
    assert!(old_cached < 40 * MIB, "all of old/ came back, though A's cache could not hold it");
    // Reads after the refill wait for nothing.
    let misses = cold_u64(&b, "read_misses");
    read_all(&b.fx.mountpoint, &tree.big);
    read_all(&b.fx.mountpoint, &tree.small);
    assert_eq!(cold_u64(&b, "read_misses"), misses, "reads of refilled files went to the store");
    b.fx.umount();
    // The hot set is an object of the workspace like any other: scrub checks it (and the rest).
    let (out, scrub) = b.tierfs_json(&["scrub", "--store", &a.store_file.display().to_string()]);
    out.assert_success("tierfs scrub");
    assert_eq!(scrub["copies_bad"], 0, "{scrub}");
    assert!(scrub["unrepaired"].as_array().is_some_and(|u| u.is_empty()), "{scrub}");
}

/// Issue 47, item 2: the refill brings back first what the last session read first, in the
/// order it read it (an environment's imports are a notebook's first reads), not the most
/// recently used first. Six one-chunk files are read in a known order on a second session;
/// a fresh node whose cache holds two of them refills exactly the first two read, though
/// the last two read were the most recently used.
#[test]
fn a_fresh_node_refills_in_the_order_the_last_session_first_read() {
    common::require_fuse();
    let mut rng = Rng::new(47);
    let files: Vec<(String, Vec<u8>)> = (0..6).map(|i| (format!("env/f{i}"), rng.bytes(4 * MIB as usize))).collect();
    let order = [3, 1, 4, 0, 2, 5];
    let mut a = Node::init_file();
    a.mount(&[]);
    fs::create_dir_all(a.fx.p("env")).expect("mkdir");
    for (rel, data) in &files {
        fs::write(a.fx.p(rel), data).expect("write");
    }
    a.sync("written").assert_success("tierfs sync");
    // A second session on the same node (its cache warm), so that the reads reach tierfs.
    a.fx.umount();
    a.mount(&[]);
    for &i in &order {
        read_all(&a.fx.mountpoint, &files[i..=i]);
    }
    // Unmounting saves the hot set.
    a.fx.umount();
    a.wipe_local_state();

    // Room for two of the files: 90% of 12 MiB is 10.8 MiB.
    let mut b = Node::new(&a.store_file);
    b.mount(&["--read-only", "--cache-size", "12M"]);
    let refill = refill_end(&b);
    assert_eq!(refill["state"], "stopped", "{refill}\n{}", b.daemon_log());
    assert_eq!(refill["ordered_chunks"], 6, "every file read is in the ordered prefix: {refill}");
    for (n, &i) in order.iter().enumerate() {
        let (rel, data) = &files[i];
        let have = cached(&b, rel);
        if n < 2 {
            assert!(have >= data.len() as u64, "{rel}, read {} of 6, was not refilled: {refill}", n + 1);
        } else {
            assert_eq!(have, 0, "{rel}, read {} of 6, was refilled before the first two: {refill}", n + 1);
        }
    }
    b.fx.umount();
}

/// Writes `files` (their directories made) through a mount of `a`, syncs and unmounts.
fn written(a: &mut Node, files: &[(String, Vec<u8>)]) {
    a.mount(&[]);
    for (rel, data) in files {
        if let Some((dir, _)) = rel.rsplit_once('/') {
            fs::create_dir_all(a.fx.p(dir)).expect("mkdir");
        }
        fs::write(a.fx.p(rel), data).expect("write");
    }
    a.sync("tree").assert_success("tierfs sync");
    a.fx.umount();
}

/// [`written`], then resets `a` (local state wiped) and returns a fresh node mounted with
/// `--no-refill`.
fn written_then_reset(a: &mut Node, files: &[(String, Vec<u8>)], cache: &str) -> Node {
    written(a, files);
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    b.mount(&["--no-refill", "--cache-size", cache]);
    b
}

/// Waits until the node's fetched bytes stop moving (the read-ahead threads are idle).
fn fetches_settle(node: &Node) -> u64 {
    let mut last = cold_u64(node, "fetched_bytes");
    loop {
        std::thread::sleep(Duration::from_millis(400));
        let now = cold_u64(node, "fetched_bytes");
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Issue 24, item 2: a walk (a listing, then opens in its order) of cold small files gets the
/// next files' first chunks fetched ahead, a window at a time, and nothing past the window.
#[test]
fn a_walk_of_a_cold_directory_fetches_the_next_files_ahead_and_no_further() {
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let mut rng = Rng::new(7);
    let files: Vec<(String, Vec<u8>)> = (0..600).map(|i| (format!("d/f{i:03}"), rng.bytes(8192))).collect();
    let mut a = Node::init(&servers, BUCKET, "walk");
    // Without the refill, so that only the walk fetches anything.
    // A 16 MiB cache: a window of 4 MiB, 512 of these files.
    let mut b = written_then_reset(&mut a, &files, "16M");
    let window = window(16, 8192);
    assert_eq!(window, 512);
    let listed: Vec<String> = fs::read_dir(b.fx.p("d"))
        .expect("ls")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    assert_eq!(listed.len(), files.len());
    assert_eq!(fetches_settle(&b), 0, "a listing alone fetched file data");
    read_all(&b.fx.mountpoint, &files[..1]);
    fetches_settle(&b);
    for (i, (rel, data)) in files.iter().enumerate().skip(1) {
        let have = cached(&b, rel);
        if i <= window {
            assert!(have >= data.len() as u64, "{rel}, within the window after f000, was not fetched ahead");
        } else {
            assert_eq!(have, 0, "{rel}, past the window, was fetched");
        }
    }
    // The whole walk reads every file right, the window moving with it.
    read_all(&b.fx.mountpoint, &files);
    for (rel, data) in &files {
        assert!(cached(&b, rel) >= data.len() as u64, "{rel} is not cached after being read");
    }
    b.fx.umount();
}

/// Ranged GETs the node has sent to its store so far.
fn range_gets(node: &Node) -> u64 {
    let status = node.fx.status();
    let backends = status["backends"].as_array().expect("backends");
    backends
        .iter()
        .flat_map(|b| b["traffic"]["requests"].as_array().cloned().unwrap_or_default())
        .filter(|r| r["op"] == "get_range")
        .map(|r| r["calls"].as_u64().expect("calls"))
        .sum()
}

/// Object bytes the node's backends have sent it so far (ranged GETs and whole ones).
fn received_bytes(node: &Node) -> u64 {
    let status = node.fx.status();
    let backends = status["backends"].as_array().expect("backends");
    backends.iter().map(|b| b["traffic"]["received_bytes"].as_u64().expect("received_bytes")).sum()
}

/// `per_dir` files of `len` random bytes (seeded) in each of `dirs` directories `t/dNN`, in the
/// order they are made: round-robin, f000 of every directory, then f001 of every one, and so on.
fn round_robin(seed: u64, dirs: usize, per_dir: usize, len: usize) -> Vec<(String, Vec<u8>)> {
    let mut rng = Rng::new(seed);
    let mut made = Vec::new();
    for i in 0..per_dir {
        for d in 0..dirs {
            made.push((format!("t/d{d:02}/f{i:03}"), rng.bytes(len)));
        }
    }
    made
}

/// Issue 48, item 4: a tree made round-robin across directories (parallel downloaders, sharded
/// writers) lies in its packs in an order no walk takes. A walk of it (every directory listed
/// first, as `cat t/*/*` does, then the files opened in listing order) still gets the next
/// files fetched ahead of the reader, on from one directory into the next, whatever their
/// packs; and it fetches little more than it reads (pack neighbours, which belong to the other
/// directories here, stop once they go unread).
#[test]
fn a_walk_of_a_tree_made_round_robin_fetches_ahead_and_little_more_than_it_reads() {
    const DIRS: usize = 8;
    const PER_DIR: usize = 80;
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    // 48 KiB files: a file's neighbours in its directory lie 7 files apart in the pack, too
    // far for one ranged GET to span them.
    let made = round_robin(48, DIRS, PER_DIR, 48 << 10);
    let mut a = Node::init(&servers, BUCKET, "roundrobin");
    // A 64 MiB cache: a window of 16 MiB, 341 of these files (4 directories and a bit).
    let mut b = written_then_reset(&mut a, &made, "64M");
    let window = window(64, 48 << 10);
    let mut walk = made.clone();
    walk.sort_by(|x, y| x.0.cmp(&y.0));
    for d in 0..DIRS {
        assert_eq!(fs::read_dir(b.fx.p(&format!("t/d{d:02}"))).expect("ls").count(), PER_DIR);
    }
    assert_eq!(fetches_settle(&b), 0, "listings alone fetched file data");
    let (gets, received) = (range_gets(&b), received_bytes(&b));
    read_all(&b.fx.mountpoint, &walk[..1]);
    // Ahead of the reader: the next files in the walk's order (the rest of d0, then d1, d2...),
    // whatever their packs; nothing past them. A batch's blocks land together once all its
    // GETs are back, so this waits for the window (or two minutes) before it looks.
    let start = Instant::now();
    while !walk[1..=window].iter().all(|(rel, data)| cached(&b, rel) >= data.len() as u64)
        && start.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    fetches_settle(&b);
    for (i, (rel, data)) in walk.iter().enumerate().skip(1) {
        let have = cached(&b, rel);
        if i <= window {
            assert!(have >= data.len() as u64, "{rel}, within the window after d0/f000, was not fetched ahead");
        } else {
            assert_eq!(have, 0, "{rel}, past the window, was fetched");
        }
    }
    read_all(&b.fx.mountpoint, &walk);
    let read: u64 = walk.iter().map(|(_, d)| d.len() as u64).sum();
    let (gets, received) = (range_gets(&b) - gets, received_bytes(&b) - received);
    let cold = b.fx.status()["cold"].clone();
    assert!(
        received * 10 <= read * 12,
        "the walk received {received} bytes from the store in {gets} ranged GETs to read {read}: {cold}"
    );
    for (rel, data) in &walk {
        assert!(cached(&b, rel) >= data.len() as u64, "{rel} is not cached after being read");
    }
    b.fx.umount();
}

/// Issue 48, item 4, as a shell walks: `cat t/*/*` over a tree made round-robin across 20
/// directories. bash's glob lists every directory (the last first) before `cat` opens the
/// first file, then the files are opened in name order, each directory's files lying 20
/// blocks apart in the packs.
/// The walk's read-ahead takes what it queued pack by pack, so each pack comes in a few ranged
/// GETs, not one GET per file, and the store sends little more than `cat` reads.
#[test]
fn a_cat_of_a_glob_over_a_tree_made_round_robin_reads_its_packs_whole() {
    const DIRS: usize = 20;
    const PER_DIR: usize = 50;
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let made = round_robin(4804, DIRS, PER_DIR, 32 << 10);
    let mut a = Node::init(&servers, BUCKET, "glob");
    // The default cache (256 MiB): a window of 64 MiB spans the whole tree.
    let mut b = written_then_reset(&mut a, &made, "256M");
    let (gets, received) = (range_gets(&b), received_bytes(&b));
    // bash, as a user types it: it lists the directories last to first, then sorts.
    let out = std::process::Command::new("bash")
        .args(["-c", "cat t/*/*"])
        .current_dir(&b.fx.mountpoint)
        .output()
        .expect("running cat");
    assert!(out.status.success(), "cat failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut walk = made.clone();
    walk.sort_by(|x, y| x.0.cmp(&y.0));
    let want: Vec<u8> = walk.iter().flat_map(|(_, d)| d.iter().copied()).collect();
    assert!(out.stdout == want, "cat t/*/* read the wrong bytes");
    let read = want.len() as u64;
    let (gets, received) = (range_gets(&b) - gets, received_bytes(&b) - received);
    let cold = b.fx.status()["cold"].clone();
    // One GET per file is what a walk costs when every file is fetched on its own.
    assert!(gets * 20 <= made.len() as u64, "{gets} ranged GETs for {} files: {cold}", made.len());
    assert!(received * 10 <= read * 12, "the store sent {received} bytes for {read} read: {cold}");
    b.fx.umount();
}

/// Issue 24, item 2: files written together share a pack, so a miss on one brings the ones
/// after it in the same request. A tree of one small file per directory (directory-order
/// read-ahead has nothing to go on there) then costs a few ranged GETs, not one per file.
#[test]
fn a_miss_brings_its_pack_neighbours_so_one_file_directories_cost_few_requests() {
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let mut rng = Rng::new(11);
    let files: Vec<(String, Vec<u8>)> = (0..100).map(|i| (format!("d{i:03}/f"), rng.bytes(6000))).collect();
    let mut a = Node::init(&servers, BUCKET, "near");
    // Without the refill, so that only the reads fetch anything.
    let mut b = written_then_reset(&mut a, &files, "256M");
    let before = range_gets(&b);
    read_all(&b.fx.mountpoint, &files);
    let gets = range_gets(&b) - before;
    let cold = b.fx.status()["cold"].clone();
    let hits = cold["neighbour_hits"].as_u64().expect("neighbour_hits");
    // The first miss learns the pack's block list, the second brings the rest (6 KB files, a
    // 1 MiB window): a handful of requests, and most files come from the neighbours.
    assert!(gets <= 10, "{gets} ranged GETs for 100 files: {cold}");
    assert!(hits >= 90, "only {hits} of 100 files came from a miss's neighbours: {cold}");
    for (rel, data) in &files {
        assert!(cached(&b, rel) >= data.len() as u64, "{rel} is not cached after being read");
    }
    b.fx.umount();
}

/// Issue 47: the refill reads each pack in a few large ranged GETs, not one per gap between
/// the chunks it wants first. Small files made round-robin across directories lie interleaved
/// in few packs; the last session read them directory by directory (its ordered prefix), so
/// the refill's first chunks lie one in eight along every pack. A fresh node refills them all
/// in a few GETs per pack, and the store sends at most twice what it refilled.
#[test]
fn a_refill_of_small_files_interleaved_in_few_packs_reads_each_pack_in_few_requests() {
    const DIRS: usize = 8;
    const PER_DIR: usize = 100;
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let made = round_robin(4747, DIRS, PER_DIR, 24 << 10);
    let mut a = Node::init(&servers, BUCKET, "interleaved");
    written(&mut a, &made);
    // A second session reads the tree in a walk's order, so that the reads reach tierfs.
    a.mount(&[]);
    let mut walk = made.clone();
    walk.sort_by(|x, y| x.0.cmp(&y.0));
    read_all(&a.fx.mountpoint, &walk);
    a.fx.umount();
    a.wipe_local_state();
    let packs = servers[0].list_keys(BUCKET).iter().filter(|k| k.starts_with("interleaved/packs/")).count() as u64;
    assert!(packs >= 2, "the tree fits in one pack: {packs}");

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let refill = refill_end(&b);
    let (gets, received) = (range_gets(&b), received_bytes(&b));
    assert_eq!(refill["state"], "done", "{refill}\n{}", b.daemon_log());
    assert_eq!(refill["fetched_chunks"], made.len() as u64, "{refill}");
    assert_eq!(refill["ordered_chunks"], made.len() as u64, "every file read is in the ordered prefix: {refill}");
    let fetched = refill["fetched_bytes"].as_u64().expect("fetched_bytes");
    // One GET per stretch of a pack (at most two chunks' worth): a handful per 16 MiB pack,
    // where cutting the pack at every gap between the chunks read first costs hundreds.
    assert!(gets <= 3 * packs, "{gets} ranged GETs to refill {} files from {packs} packs: {refill}", made.len());
    assert!(received <= 2 * fetched + MIB, "the store sent {received} bytes to refill {fetched}: {refill}");
    let misses = cold_u64(&b, "read_misses");
    read_all(&b.fx.mountpoint, &walk);
    assert_eq!(cold_u64(&b, "read_misses"), misses, "reads of refilled files went to the store");
    b.fx.umount();
}
