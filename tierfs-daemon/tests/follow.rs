//! Read-only followers (issue 23, item 6): one node writes a workspace on moto while two
//! others mount it with `--follow`. Each follower shows every new file within a few follow
//! intervals, never a torn one (a file named by its final name always has all of its bytes),
//! drops names it had cached as missing, and a file open on a follower keeps the version it
//! opened until it is closed.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moto::MotoServer;
use store_node::Node;

const BUCKET: &str = "tierfs-follow";
/// The followers' --follow-interval.
const INTERVAL: &str = "0.5";
/// How long a follower may take to show a change: generous, so a loaded CI machine does not
/// fail the test; the measured times are printed.
const SHOW_WITHIN: Duration = Duration::from_secs(20);

/// The bytes of dataset file `i`: its length and pattern follow from `i`, some span chunks.
fn content(i: usize) -> Vec<u8> {
    let len = if i % 4 == 0 { (5 << 20) + i * 1000 } else { 10_000 + i * 777 };
    (0..len).map(|j| ((j * 31 + i * 7) % 251) as u8).collect()
}

/// Writes `rel` the way checkpoints are written: a temporary name, fsync, rename.
fn publish(root: &Path, rel: &str, data: &[u8]) {
    let tmp = root.join(format!("{rel}.tmp"));
    let mut f = fs::File::create(&tmp).expect("create");
    std::io::Write::write_all(&mut f, data).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    fs::rename(&tmp, root.join(rel)).expect("rename");
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < SHOW_WITHIN, "{what}: not seen within {SHOW_WITHIN:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

fn follower(store_file: &Path) -> Node {
    let mut node = Node::new(store_file);
    node.mount(&["--follow", "--follow-interval", INTERVAL]);
    node
}

#[test]
fn followers_show_new_files_within_the_interval_and_never_a_torn_one() {
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let mut writer = Node::init(&servers, BUCKET, "follow");
    writer.mount(&[]);
    let root = writer.fx.mountpoint.clone();
    fs::create_dir(root.join("ds")).expect("mkdir");
    writer.sync("start").assert_success("tierfs sync");

    let followers = [follower(&writer.store_file), follower(&writer.store_file)];
    // A name looked up before it exists is cached by the kernel as missing (for the entry
    // TTL, 60 s): the new head must drop that.
    for f in &followers {
        assert!(!f.fx.p("ds/late").exists());
        let status = f.fx.status();
        assert_eq!(status["read_only"], true, "{status}");
        assert!(status["follow"]["seq"].as_u64().is_some(), "{status}");
    }

    // Readers on each follower list ds/ all along and check every file they see in full.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Vec<Option<Instant>>>>> = Arc::new(Mutex::new(vec![vec![None; 12]; 2]));
    let readers: Vec<_> = followers
        .iter()
        .enumerate()
        .map(|(n, f)| {
            let (dir, stop, seen) = (f.fx.p("ds"), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for e in fs::read_dir(&dir).expect("ls ds") {
                        let name = e.expect("entry").file_name().into_string().expect("utf-8");
                        let Some(i) = name.strip_prefix("file").and_then(|s| s.parse::<usize>().ok()) else { continue };
                        let mut got = Vec::new();
                        fs::File::open(dir.join(&name)).and_then(|mut f| f.read_to_end(&mut got)).expect("read");
                        assert!(got == content(i), "follower {n} showed {name} torn: {} bytes", got.len());
                        seen.lock().expect("lock")[n][i].get_or_insert_with(Instant::now);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        })
        .collect();
    let mut written = Vec::new();
    for i in 0..12 {
        publish(&root, &format!("ds/file{i}"), &content(i));
        written.push(Instant::now());
        std::thread::sleep(Duration::from_millis(300));
    }
    let start = Instant::now();
    while seen.lock().expect("lock").iter().flatten().any(Option::is_none) {
        assert!(start.elapsed() < SHOW_WITHIN, "not every file reached every follower: {:?}", seen.lock());
        assert!(readers.iter().all(|r| !r.is_finished()), "a reader failed");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("a follower showed a torn file");
    }
    let lags: Vec<Duration> = seen
        .lock()
        .expect("lock")
        .iter()
        .flat_map(|f| f.iter().zip(&written).map(|(s, w)| s.expect("seen").saturating_duration_since(*w)))
        .collect();
    println!("follow lag with --follow-interval {INTERVAL}: max {:?}", lags.iter().max());

    fs::write(root.join("ds/late"), b"late").expect("write");
    for f in &followers {
        let took = wait_for("a name cached as missing", || fs::read(f.fx.p("ds/late")).is_ok_and(|d| d == b"late"));
        println!("ds/late shown after {took:?}");
    }

    // An open file keeps its version; a new open shows the new one.
    let model = root.join("model.bin");
    let a: Vec<u8> = (0..(6u32 << 20)).map(|i| (i % 253) as u8).collect();
    let f = fs::File::create(&model).expect("create");
    f.write_all_at(&a, 0).expect("write");
    f.sync_all().expect("fsync");
    let p = followers[0].fx.p("model.bin");
    wait_for("model.bin", || fs::read(&p).is_ok_and(|d| d == a));
    let held = fs::File::open(&p).expect("open on the follower");
    let mut first = vec![0u8; 4096];
    held.read_exact_at(&mut first, 0).expect("read");
    let b: Vec<u8> = a.iter().map(|x| !x).collect();
    f.write_all_at(&b, 0).expect("rewrite");
    f.sync_all().expect("fsync");
    drop(f);
    wait_for("the rewrite of model.bin", || fs::read(&p).is_ok_and(|d| d == b));
    let mut old = vec![0u8; a.len()];
    held.read_exact_at(&mut old, 0).expect("read the held version");
    assert!(old == a, "a file open on the follower changed version under its reader");
    drop(held);
    assert!(fs::read(&p).expect("reopen") == b);

    // Read-only: a follower refuses writes.
    let err = fs::write(followers[1].fx.p("ds/x"), b"x").expect_err("a follower is read-only");
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    let status = followers[1].fx.status();
    assert!(status["follow"]["heads"].as_u64().is_some_and(|h| h > 0), "{status}");
    assert_eq!(status["follow"]["errors"], 0, "{status}");
    for mut f in followers {
        f.fx.umount();
    }
    writer.fx.umount();
}
