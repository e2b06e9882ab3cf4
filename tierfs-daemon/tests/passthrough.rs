//! FUSE passthrough for hot files (issue 48 item 1) on real mounts with a real store (moto):
//! a wholly local file opened read-only is read by the kernel from its data file (the
//! daemon's read counter does not move, and does without passthrough) with the right bytes,
//! mmap included; eviction under pressure spares a file a passthrough handle holds while it
//! punches its twin, a writer's too; a write open beside a passthrough one works, and what it
//! wrote is sized right, reaches the store and survives a reset. Opens for writing with nothing
//! else open are passthrough too (create, read-write, O_APPEND): the daemon serves none of
//! their writes, `stat` sees their size and mtime while they are open and after, what they
//! wrote survives `kill -9` (fsynced or not) and is uploaded after, and a writer beside a normal handle falls
//! back without an error. `--encrypt-cache` and `--no-passthrough` fall back and say why in
//! `status`.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::Rng;
use moto::MotoServer;
use store_node::Node;

const BUCKET: &str = "tierfs-passthrough";

/// A cache size with room for a writer to open through passthrough (`Node` mounts with 1G
/// unless told; a first writer needs 4 GiB of room, `PASSTHROUGH_WRITE_ROOM`).
const ROOM_FOR_WRITERS: [&str; 2] = ["--cache-size", "64G"];

/// A node on a moto server of its own, mounted with [`ROOM_FOR_WRITERS`] (keep the servers
/// while the node is used).
fn mounted_with_room_for_writers() -> (Vec<MotoServer>, Node) {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    n.mount(&ROOM_FOR_WRITERS);
    (servers, n)
}

fn node(servers: &[MotoServer]) -> Node {
    Node::init(servers, BUCKET, "ws")
}

fn status(n: &Node) -> serde_json::Value {
    n.fx.status()
}

/// The cold tier's count of reads the daemon served from local chunks.
fn read_hits(n: &Node) -> u64 {
    status(n)["cold"]["read_hits"].as_u64().expect("cold.read_hits in status")
}

fn passthrough_opens(n: &Node) -> u64 {
    status(n)["passthrough"]["opens"].as_u64().expect("passthrough.opens in status")
}

/// Waits (up to `limit`; the test then fails) until `done` holds. Never a pass/fail timing:
/// the limit only ends a test that would otherwise hang.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads the whole of `f` from its start.
fn read_all(f: &mut fs::File) -> Vec<u8> {
    let mut out = Vec::new();
    f.seek(SeekFrom::Start(0)).expect("seek");
    f.read_to_end(&mut out).expect("read");
    out
}

#[test]
fn a_hot_file_opened_read_only_is_read_by_the_kernel_with_the_right_bytes_and_mmap_works() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    n.mount(&[]);
    assert_eq!(status(&n)["passthrough"]["on"], true, "{}", status(&n));
    let data = Rng::new(48).bytes(9 << 20);
    fs::write(n.fx.p("hot"), &data).expect("write");

    let (hits, opens) = (read_hits(&n), passthrough_opens(&n));
    let mut f = fs::File::open(n.fx.p("hot")).expect("open");
    assert!(read_all(&mut f) == data, "passthrough read the wrong bytes");
    assert_eq!(passthrough_opens(&n), opens + 1, "the open was not served through passthrough");
    assert_eq!(read_hits(&n), hits, "the daemon served reads of a passthrough handle");

    // mmap of a passthrough handle maps the data file.
    let len = data.len();
    // SAFETY: a private read-only mapping of an open file, unmapped below, read in bounds.
    let mapped = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, fd(&f), 0);
        assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        let copy = std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec();
        libc::munmap(p, len);
        copy
    };
    assert!(mapped == data, "mmap of a passthrough handle showed the wrong bytes");
    drop(f);

    // The same reads without passthrough reach the daemon: the counter above can move.
    n.fx.umount();
    n.mount(&["--no-passthrough"]);
    let s = status(&n);
    assert_eq!(s["passthrough"]["on"], false, "{s}");
    assert!(s["passthrough"]["off_reason"].as_str().unwrap_or("").contains("--no-passthrough"), "{s}");
    let hits = read_hits(&n);
    assert!(fs::read(n.fx.p("hot")).expect("read") == data);
    assert!(read_hits(&n) > hits, "reads without passthrough did not count");
}

fn fd(f: &fs::File) -> i32 {
    use std::os::fd::AsRawFd;
    f.as_raw_fd()
}

/// Whether the data file of `path` (a file of the mount) holds all of its `len` bytes.
fn resident(n: &Node, path: &Path, len: u64) -> bool {
    let ino = fs::metadata(path).expect("stat").ino();
    let m = fs::metadata(common::data_file(&n.fx.data_dir, ino)).expect("stat data file");
    m.blocks() * 512 >= len
}

#[test]
fn eviction_under_pressure_spares_a_file_a_passthrough_handle_holds() {
    eviction_spares_a_held_file(false);
}

#[test]
fn eviction_under_pressure_spares_a_file_a_passthrough_writer_holds() {
    eviction_spares_a_held_file(true);
}

/// Eviction under pressure punches an unopened twin but not a file open through passthrough
/// (read-only, or for writing with a write before the pressure).
fn eviction_spares_a_held_file(write: bool) {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    n.mount(&["--cache-size", "24M"]);
    let mut held = Rng::new(1).bytes(8 << 20);
    let twin = Rng::new(2).bytes(8 << 20);
    fs::write(n.fx.p("held"), &held).expect("write");
    fs::write(n.fx.p("twin"), &twin).expect("write");
    n.sync("both stored").assert_success("tierfs sync");
    let opens = passthrough_opens(&n);
    let mut f = fs::File::open(n.fx.p("held")).expect("open");
    assert_eq!(passthrough_opens(&n), opens + 1, "held is not open through passthrough");
    // A writer: one that joins the reader (a cache this small has no room for a first one).
    let writer = write.then(|| fs::OpenOptions::new().write(true).open(n.fx.p("held")).expect("open for writing"));
    if let Some(w) = &writer {
        assert_eq!(status(&n)["passthrough"]["writers_now"], 1, "the writer is not passthrough");
        w.write_all_at(b"written while held", 1 << 20).expect("write");
        held[1 << 20..(1 << 20) + 18].copy_from_slice(b"written while held");
    }

    // Pressure: 48 MiB more into a 24 MiB cache, stored, until the twin (as old as the held
    // file, and not open) is punched.
    for i in 0..6 {
        fs::write(n.fx.p(&format!("filler{i}")), Rng::new(10 + i).bytes(8 << 20)).expect("write");
    }
    n.sync("fillers stored").assert_success("tierfs sync");
    let twin_path = n.fx.p("twin");
    wait_until("eviction of the twin", Duration::from_secs(120), || !resident(&n, &twin_path, 8 << 20));
    assert!(resident(&n, &n.fx.p("held"), 8 << 20), "eviction punched a file a passthrough handle holds");
    assert!(read_all(&mut f) == held, "the held file reads wrong under eviction");
    drop((f, writer));
    assert!(fs::read(n.fx.p("twin")).expect("read twin") == twin, "the evicted twin reads back wrong");
}

#[test]
fn a_write_open_beside_a_passthrough_one_works_and_its_writes_reach_the_store() {
    let (_servers, mut n) = mounted_with_room_for_writers();
    let mut want = Rng::new(3).bytes(5 << 20);
    fs::write(n.fx.p("f"), &want).expect("write");
    let opens = passthrough_opens(&n);
    let mut reader = fs::File::open(n.fx.p("f")).expect("open read-only");
    assert_eq!(passthrough_opens(&n), opens + 1, "the reader is not a passthrough handle");

    // A writer while the reader is open: an overwrite inside, and an append past the end.
    let mut writer = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("f")).expect("open for writing");
    writer.write_all_at(b"overwritten", 4096).expect("pwrite");
    want[4096..4096 + 11].copy_from_slice(b"overwritten");
    writer.seek(SeekFrom::End(0)).expect("seek");
    writer.write_all(b"appended tail").expect("append");
    want.extend_from_slice(b"appended tail");
    assert_eq!(fs::metadata(n.fx.p("f")).expect("stat").len(), want.len() as u64, "stat after the writes");
    assert!(read_all(&mut reader) == want, "the reader does not see the writer's bytes");
    writer.sync_all().expect("fsync");
    drop(writer);
    drop(reader);

    // A write-first open (passthrough itself now) with a read-only one beside it, which joins.
    let opens = passthrough_opens(&n);
    let w = fs::OpenOptions::new().write(true).open(n.fx.p("f")).expect("open for writing");
    let mut r = fs::File::open(n.fx.p("f")).expect("open read-only beside a writer");
    assert_eq!(passthrough_opens(&n), opens + 2, "the writer and the reader are not both passthrough");
    w.write_all_at(b"X", 0).expect("write");
    want[0] = b'X';
    assert!(read_all(&mut r) == want, "a reader beside a writer reads wrong");
    drop((w, r));

    // Everything reaches the store: a fresh node restores it.
    n.sync("after passthrough writes").assert_success("tierfs sync");
    n.fx.umount();
    n.wipe_local_state();
    n.mount(&[]);
    assert!(fs::read(n.fx.p("f")).expect("read after reset") == want, "passthrough writes did not survive a reset");
}

#[test]
fn encrypt_cache_falls_back_and_status_says_why() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    n.mount(&["--encrypt-cache"]);
    let data = Rng::new(4).bytes(1 << 20);
    fs::write(n.fx.p("secret"), &data).expect("write");
    assert!(fs::read(n.fx.p("secret")).expect("read") == data);
    let s = status(&n);
    assert_eq!(s["passthrough"]["on"], false, "{s}");
    assert_eq!(s["passthrough"]["opens"], 0, "{s}");
    assert!(s["passthrough"]["off_reason"].as_str().unwrap_or("").contains("encrypt"), "{s}");
    let mut cmd = store_node::env(n.fx.tierfs());
    cmd.arg("status").arg(&n.fx.mountpoint);
    let out = common::run(&mut cmd, Duration::from_secs(30));
    out.assert_success("tierfs status");
    assert!(out.stdout.contains("passthrough") && out.stdout.contains("off: "), "{}", out.stdout);
}

fn write_opens(n: &Node) -> u64 {
    status(n)["passthrough"]["write_opens"].as_u64().expect("passthrough.write_opens in status")
}

/// A time long before any test ran, to tell a moved mtime without waiting.
fn long_ago() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs(946_684_800) // 2000-01-01
}

fn mtime(path: &Path) -> std::time::SystemTime {
    fs::metadata(path).expect("stat").modified().expect("mtime")
}

#[test]
fn writes_through_passthrough_reach_the_store_survive_a_reset_and_stat_sees_them() {
    let (_servers, mut n) = mounted_with_room_for_writers();
    let opens = write_opens(&n);

    // A new file: created through passthrough, written past a chunk boundary (4 MiB).
    let mut want = Rng::new(5).bytes(6 << 20);
    let mut f = fs::File::create(n.fx.p("new")).expect("create");
    f.write_all(&want).expect("write");
    assert_eq!(write_opens(&n), opens + 1, "the create was not served through passthrough");
    assert_eq!(status(&n)["passthrough"]["writers_now"], 1, "{}", status(&n));
    assert_eq!(fs::metadata(n.fx.p("new")).expect("stat").len(), want.len() as u64, "stat during the writes");
    f.sync_all().expect("fsync");
    drop(f);

    // An existing file opened read-write with nothing else open: an overwrite inside and an
    // extension into a new chunk. stat sees the size and a moved mtime while it is open and
    // after it closed.
    f_set_mtime(&n.fx.p("new"), long_ago());
    let opens = write_opens(&n);
    let mut f = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("new")).expect("open read-write");
    assert_eq!(write_opens(&n), opens + 1, "the read-write open was not served through passthrough");
    f.write_all_at(b"overwritten", (4 << 20) - 5).expect("pwrite across a chunk boundary");
    want[(4 << 20) - 5..(4 << 20) + 6].copy_from_slice(b"overwritten");
    let tail = Rng::new(6).bytes(3 << 20);
    f.write_all_at(&tail, want.len() as u64).expect("extend");
    want.extend_from_slice(&tail);
    let during = fs::metadata(n.fx.p("new")).expect("stat");
    assert_eq!(during.len(), want.len() as u64, "stat size while the writer is open");
    assert!(during.modified().expect("mtime") > long_ago(), "mtime did not move while the writer is open");
    assert!(read_all(&mut f) == want, "the writer reads back the wrong bytes");
    drop(f);
    let after = fs::metadata(n.fx.p("new")).expect("stat");
    assert_eq!(after.len(), want.len() as u64, "stat size after close");
    assert_eq!(after.modified().ok(), during.modified().ok(), "mtime after close is not the one stat saw before");
    assert_eq!(status(&n)["passthrough"]["writers_now"], 0, "{}", status(&n));

    // A writer that writes nothing moves no time.
    f_set_mtime(&n.fx.p("new"), long_ago());
    let mut f = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("new")).expect("open read-write");
    assert!(read_all(&mut f) == want);
    drop(f);
    assert_eq!(mtime(&n.fx.p("new")), long_ago(), "a read-write open that wrote nothing moved mtime");

    n.sync("after passthrough writes").assert_success("tierfs sync");
    n.fx.umount();
    n.wipe_local_state();
    n.mount(&[]);
    assert!(fs::read(n.fx.p("new")).expect("read after reset") == want, "passthrough writes did not survive a reset");
}

/// A file past `PASSTHROUGH_REWRITE_MAX` (64 MiB) opened to change in place keeps the daemon's
/// path: each take-in would re-hash all of it.
#[test]
fn a_large_file_changed_in_place_keeps_the_daemons_path() {
    let (_servers, n) = mounted_with_room_for_writers();
    let mut want = Rng::new(8).bytes(65 << 20);
    fs::write(n.fx.p("big"), &want).expect("write a 65 MiB file");
    let opens = write_opens(&n);
    let f = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("big")).expect("open read-write");
    assert_eq!(write_opens(&n), opens, "a 65 MiB file opened to change in place went through passthrough");
    assert_eq!(status(&n)["passthrough"]["writers_now"], 0, "{}", status(&n));
    f.write_all_at(b"page", 40 << 20).expect("pwrite");
    want[40 << 20..(40 << 20) + 4].copy_from_slice(b"page");
    f.sync_all().expect("fsync");
    drop(f);
    assert!(fs::read(n.fx.p("big")).expect("read") == want, "the in-place write was lost");
}

fn f_set_mtime(path: &Path, t: std::time::SystemTime) {
    let f = fs::File::options().write(true).open(path).expect("open to set mtime");
    f.set_modified(t).expect("set mtime");
}

#[test]
fn o_append_through_passthrough_appends_at_the_data_files_end() {
    let (_servers, n) = mounted_with_room_for_writers();
    let mut want = Rng::new(7).bytes(1 << 20);
    fs::write(n.fx.p("log"), &want).expect("write");
    let opens = write_opens(&n);
    let mut f = fs::OpenOptions::new().append(true).open(n.fx.p("log")).expect("open O_APPEND");
    assert_eq!(write_opens(&n), opens + 1, "the O_APPEND open was not served through passthrough");
    for line in [&b"first line\n"[..], b"second line\n"] {
        f.write_all(line).expect("append");
        want.extend_from_slice(line);
        assert_eq!(fs::metadata(n.fx.p("log")).expect("stat").len(), want.len() as u64, "stat after an append");
    }
    // A second appender (joins the passthrough inode) lands after both.
    let mut g = fs::OpenOptions::new().append(true).open(n.fx.p("log")).expect("second O_APPEND");
    g.write_all(b"third\n").expect("append");
    want.extend_from_slice(b"third\n");
    f.sync_all().expect("fsync");
    drop((f, g));
    assert!(fs::read(n.fx.p("log")).expect("read") == want, "O_APPEND through passthrough wrote the wrong bytes");
}

#[test]
fn a_writer_beside_a_normal_handle_falls_back_without_an_error() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    n.mount(&[]);
    let mut want = Rng::new(8).bytes(5 << 20);
    fs::write(n.fx.p("cold"), &want).expect("write");
    n.sync("stored").assert_success("tierfs sync");
    n.fx.umount();
    n.wipe_local_state();
    n.mount(&["--no-refill"]);

    // Nothing of it is local after the reset: the reader is a normal handle, and so must be a
    // writer beside it (the kernel refuses to mix the two).
    let (opens, fallbacks) =
        (passthrough_opens(&n), status(&n)["passthrough"]["fallbacks"].as_u64().expect("fallbacks"));
    let mut reader = fs::File::open(n.fx.p("cold")).expect("open the cold file");
    let mut buf = [0u8; 4096];
    reader.read_exact(&mut buf).expect("read");
    let writer = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("cold")).expect("writer beside it");
    writer.write_all_at(b"beside", 100).expect("write beside a normal handle");
    want[100..106].copy_from_slice(b"beside");
    writer.sync_all().expect("fsync");
    assert_eq!(passthrough_opens(&n), opens, "a handle beside a normal one was passthrough");
    let now = status(&n)["passthrough"]["fallbacks"].as_u64().expect("fallbacks");
    assert!(now >= fallbacks + 2, "the two opens were not counted as fallbacks: {fallbacks} -> {now}");
    assert!(read_all(&mut reader) == want, "the normal reader reads wrong beside the writer");
    drop((reader, writer));
    assert!(fs::read(n.fx.p("cold")).expect("read") == want);
}

#[test]
fn kill9_with_a_passthrough_writer_open_keeps_what_it_wrote_and_uploads_it_after() {
    let servers = MotoServer::start_many(1, BUCKET);
    let mut n = node(&servers);
    // Local fsync: the bytes are only on this disk when the daemon dies.
    n.mount(&["--fsync", "local", ROOM_FOR_WRITERS[0], ROOM_FOR_WRITERS[1]]);
    let mut want = Rng::new(9).bytes(6 << 20);
    fs::write(n.fx.p("f"), &want).expect("write");
    n.sync("first version stored").assert_success("tierfs sync");

    let opens = write_opens(&n);
    let f = fs::OpenOptions::new().read(true).write(true).open(n.fx.p("f")).expect("open read-write");
    assert_eq!(write_opens(&n), opens + 1, "the writer is not a passthrough handle");
    // Inside the stored version (its chunks were sealed) and past its end, then fsync.
    let patch = Rng::new(10).bytes(1 << 20);
    f.write_all_at(&patch, 3 << 20).expect("overwrite");
    want[3 << 20..4 << 20].copy_from_slice(&patch);
    let tail = Rng::new(11).bytes(2 << 20);
    f.write_all_at(&tail, want.len() as u64).expect("extend");
    want.extend_from_slice(&tail);
    f.sync_all().expect("fsync");
    // And after the fsync, acknowledged but not synced: an overwrite and an extension. The
    // daemon never saw them; the restart finds them in the data file.
    f.write_all_at(b"after the fsync", 100).expect("overwrite after the fsync");
    want[100..115].copy_from_slice(b"after the fsync");
    let more = Rng::new(12).bytes(3 << 20);
    f.write_all_at(&more, want.len() as u64).expect("extend after the fsync");
    want.extend_from_slice(&more);
    n.kill9();
    drop(f);

    n.mount(&[]);
    let got = fs::read(n.fx.p("f")).expect("read after kill -9");
    assert_eq!(got.len(), want.len(), "size after kill -9 with a passthrough writer open");
    assert!(got == want, "acknowledged passthrough writes lost by kill -9");
    n.sync("after the crash").assert_success("tierfs sync");
    n.fx.umount();
    n.wipe_local_state();
    n.mount(&[]);
    assert!(fs::read(n.fx.p("f")).expect("read after reset") == want, "the recovered writes were not uploaded");
}
