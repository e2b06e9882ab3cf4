//! The workspace session of the core, driven as a front end drives it, on a real `file://`
//! store and real RocksDB: write, snapshot, close; reopen on a fresh node (an empty data dir);
//! an outdated copy dropped and restored (keeping the front end's files); read-only and
//! snapshot sessions; the lease refusing a second writer; errors a caller can tell apart.

use std::time::Duration;

use tierfs::remote::RemoteError;
use tierfs::session::{Access, Session, SessionConfig, SessionError};
use tierfs::vfs::{Caller, PageCache, ROOT_INO, SetAttr, Vfs};
use tierfs_test_support::file_store::FileStore as Fixture;

const PASSPHRASE: &[u8] = b"session test";

fn write_file(vfs: &Vfs, name: &str, at: u64, data: &[u8]) {
    let (attr, fh) = vfs.create(&Caller::ROOT, ROOT_INO, name.as_bytes(), 0o644, 0o022, libc::O_RDWR).expect("create");
    vfs.write(attr.ino, fh, at, data).expect("write");
    vfs.release(attr.ino, fh).expect("release");
}

fn read_file(vfs: &Vfs, name: &str) -> Vec<u8> {
    let attr = vfs.lookup(ROOT_INO, name.as_bytes()).expect("lookup");
    let fh = vfs.open(&Caller::ROOT, attr.ino, libc::O_RDONLY).expect("open");
    let mut out = Vec::new();
    while (out.len() as u64) < attr.size {
        let chunk = vfs.read(attr.ino, fh, out.len() as u64, 1 << 20).expect("read");
        assert!(!chunk.is_empty(), "{name}: short read at {}", out.len());
        out.extend_from_slice(&chunk);
    }
    vfs.release(attr.ino, fh).expect("release");
    out
}

fn exists(vfs: &Vfs, name: &str) -> bool {
    vfs.lookup(ROOT_INO, name.as_bytes()).is_ok()
}

#[test]
fn a_session_syncs_closes_and_comes_back_on_a_fresh_node() {
    let fx = Fixture::new(PASSPHRASE);
    let first = fx.open("node-a", Access::ReadWrite).expect("open on node a");
    assert!(first.is_synced());
    write_file(first.vfs(), "notes.txt", 0, b"kept across resets");
    // A hole of two whole chunks before the data.
    write_file(first.vfs(), "sparse.bin", 9 << 20, b"end");
    let synced = first.sync(Some("first".into()), Duration::from_secs(30)).expect("sync");
    assert!(!synced.snapshot.is_empty(), "a sync names its snapshot");
    assert!(synced.data_bytes > 0, "the sync uploaded the file data");
    let status = first.status();
    assert_eq!(status.vfs.cold.as_ref().map(|c| c.dirty_bytes), Some(0), "nothing is pending after a sync");
    let remote = status.remote.expect("a synced session reports its journal");
    assert_eq!((remote.durable_seq, remote.last_snapshot), (remote.last_seq, Some(synced.snapshot.clone())));
    write_file(first.vfs(), "after.txt", 0, b"written after the snapshot");
    fx.close(first);

    // A fresh node: an empty data dir gets the latest state, holes and all.
    let second = fx.open("node-b", Access::ReadWrite).expect("open on node b");
    assert_eq!(read_file(second.vfs(), "notes.txt"), b"kept across resets");
    assert_eq!(read_file(second.vfs(), "after.txt"), b"written after the snapshot");
    let sparse = read_file(second.vfs(), "sparse.bin");
    assert_eq!(sparse.len(), (9 << 20) + 3, "the sparse file keeps its size");
    assert!(sparse[..9 << 20].iter().all(|&b| b == 0) && sparse.ends_with(b"end"));
    write_file(second.vfs(), "from-b.txt", 0, b"node b wrote this");
    fx.close(second);

    // Node a again: its copy is outdated (node b wrote since), so it is dropped and restored;
    // the front end's own file in the data dir stays.
    let keep = fx.dir.path().join("node-a").join("front-end.log");
    std::fs::write(&keep, b"log").expect("front end file");
    let mut config = fx.config("node-a", Access::ReadWrite);
    config.keep_files = vec!["front-end.log".into()];
    let again = Session::open(config, fx.rt.handle()).expect("reopen on node a");
    assert_eq!(read_file(again.vfs(), "from-b.txt"), b"node b wrote this");
    assert_eq!(std::fs::read(&keep).expect("kept file"), b"log", "clearing kept the front end's file");
    fx.close(again);
}

#[test]
fn read_only_and_snapshot_sessions_show_the_store_and_write_nothing() {
    let fx = Fixture::new(PASSPHRASE);
    let writer = fx.open("writer", Access::ReadWrite).expect("open writer");
    write_file(writer.vfs(), "v.txt", 0, b"version one");
    let snapshot = writer.sync(Some("v1".into()), Duration::from_secs(30)).expect("sync").snapshot;
    let attr = writer.vfs().lookup(ROOT_INO, b"v.txt").expect("lookup");
    let fh = writer.vfs().open(&Caller::ROOT, attr.ino, libc::O_RDWR).expect("open");
    writer.vfs().write(attr.ino, fh, 0, b"VERSION TWO").expect("rewrite");
    writer.vfs().release(attr.ino, fh).expect("release");
    fx.close(writer);

    let latest = fx.open("reader", Access::ReadOnly).expect("open read-only");
    assert!(!latest.is_synced(), "a read-only session takes no lease");
    assert_eq!(read_file(latest.vfs(), "v.txt"), b"VERSION TWO");
    assert!(matches!(latest.sync(None, Duration::from_secs(5)), Err(SessionError::ReadOnly)));
    drop(latest);

    let old = fx.open("snap", Access::Snapshot(snapshot.clone())).expect("open snapshot");
    assert_eq!(read_file(old.vfs(), "v.txt"), b"version one");
    drop(old);
    // The snapshot cache is rebuilt at every open; a data dir that is not one is refused.
    fx.open("snap", Access::Snapshot(snapshot.clone())).expect("reopen snapshot");
    let foreign = fx.dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).expect("dir");
    std::fs::write(foreign.join("mine.txt"), b"user data").expect("user file");
    let refused = fx.open("foreign", Access::Snapshot(snapshot)).err().expect("a foreign dir is refused");
    assert!(matches!(refused, SessionError::NotSnapshotCache(_)), "{refused}");
    assert_eq!(std::fs::read(foreign.join("mine.txt")).expect("still there"), b"user data");
    let missing = fx.open("nosuch", Access::Snapshot("no-such-id".into())).err().expect("unknown snapshot");
    assert!(matches!(missing, SessionError::Remote(RemoteError::NoSnapshot(_))), "{missing}");
}

#[test]
fn a_second_writer_is_refused_and_a_session_without_store_has_nothing_to_sync() {
    let fx = Fixture::new(PASSPHRASE);
    let first = fx.open("one", Access::ReadWrite).expect("open first");
    let second = fx.open("two", Access::ReadWrite).err().expect("the lease refuses a second writer");
    assert!(matches!(second, SessionError::Remote(RemoteError::Held { .. })), "{second}");
    fx.close(first);
    // Once the first closed (and released its lease), the other node may write.
    let two = fx.open("two", Access::ReadWrite).expect("open after the release");
    fx.close(two);

    let local = Session::open(SessionConfig::new(fx.dir.path().join("local"), None), fx.rt.handle())
        .expect("open without store");
    assert!(matches!(local.sync(None, Duration::from_secs(5)), Err(SessionError::NoStore)));
    write_file(local.vfs(), "a.txt", 0, b"local only");
    fx.close(local);
    let snapshot_without_store = {
        let mut config = SessionConfig::new(fx.dir.path().join("x"), None);
        config.access = Access::Snapshot("s".into());
        Session::open(config, fx.rt.handle()).err().expect("a snapshot needs a store")
    };
    assert!(matches!(snapshot_without_store, SessionError::NoStore));
    let reopened = Session::open(SessionConfig::new(fx.dir.path().join("local"), None), fx.rt.handle())
        .expect("reopen without store");
    assert!(exists(reopened.vfs(), "a.txt"));
}

/// A data dir is the copy of one workspace: opened for another (a reused `--data-dir` with a
/// new `--workspace`), it is refused, and neither workspace gets the other's files.
#[test]
fn a_data_dir_of_one_workspace_is_refused_for_another_and_nothing_is_copied() {
    let fx = Fixture::new(PASSPHRASE);
    let a = fx.open("node", Access::ReadWrite).expect("open workspace default");
    write_file(a.vfs(), "only-in-default.txt", 0, b"default's");
    a.sync(None, Duration::from_secs(30)).expect("sync");
    fx.close(a);

    let mut other = fx.config("node", Access::ReadWrite);
    other.workspace = "other".into();
    let err = Session::open(other, fx.rt.handle()).err().expect("a data dir of another workspace");
    assert!(matches!(err, SessionError::OtherWorkspace { .. }), "{err}");
    assert_eq!(tierfs::Error::from(err).kind(), tierfs::ErrorKind::Conflict);

    // Workspace "other" is still empty: opened on a data dir of its own, it has nothing.
    let mut fresh = fx.config("fresh", Access::ReadWrite);
    fresh.workspace = "other".into();
    let s = Session::open(fresh, fx.rt.handle()).expect("open other on its own data dir");
    assert!(!exists(s.vfs(), "only-in-default.txt"), "the other workspace got default's files");
    fx.close(s);
    // And the first data dir still opens as default's.
    let again = fx.open("node", Access::ReadWrite).expect("reopen default");
    assert!(exists(again.vfs(), "only-in-default.txt"));
    fx.close(again);
}

/// A session whose store went away ends promptly once its final flush gave up: what it could
/// not upload stays in its data dir, and the next session there stores it. (Its upload workers
/// used to retry for as long as the store was away, and ending the session joins them.)
#[test]
fn a_session_whose_store_is_away_ends_promptly_and_keeps_what_it_could_not_upload() {
    let fx = Fixture::new(PASSPHRASE);
    // A short lease: the session cannot give it back, so the next one waits for it to expire.
    let mut config = fx.config("node-a", Access::ReadWrite);
    config.lease_ttl = Duration::from_secs(3);
    let session = Session::open(config, fx.rt.handle()).expect("open");
    // The store goes away: its directory is replaced by a file, so every request fails.
    let (objects, away) = (fx.dir.path().join("objects"), fx.dir.path().join("objects.away"));
    std::fs::rename(&objects, &away).expect("moving the store away");
    std::fs::write(&objects, b"not a directory").expect("a file in the store's place");
    write_file(session.vfs(), "kept.txt", 0, b"written while the store was away");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    assert!(fx.rt.block_on(session.flush(deadline)).is_err(), "a flush to a store that is away succeeded");
    let _ = fx.rt.block_on(session.close(deadline));
    let (ended, end) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(session);
        let _ = ended.send(());
    });
    end.recv_timeout(Duration::from_secs(30)).expect("the session did not end within 30 s of its final flush");

    std::fs::remove_file(&objects).expect("removing the file");
    std::fs::rename(&away, &objects).expect("the store is back");
    // The data dir opens again at once (nothing of the first session holds its RocksDB), once
    // the lease it could not give back has expired.
    let since = std::time::Instant::now();
    let again = loop {
        match fx.open("node-a", Access::ReadWrite) {
            Ok(s) => break s,
            Err(SessionError::Remote(RemoteError::Held { .. })) if since.elapsed() < Duration::from_secs(30) => {
                std::thread::sleep(Duration::from_millis(250))
            }
            Err(e) => panic!("reopening the data dir after {:?}: {e}", since.elapsed()),
        }
    };
    assert_eq!(read_file(again.vfs(), "kept.txt"), b"written while the store was away");
    again.sync(None, Duration::from_secs(30)).expect("sync once the store is back");
    fx.close(again);
    let fresh = fx.open("node-b", Access::ReadWrite).expect("a fresh node");
    assert_eq!(read_file(fresh.vfs(), "kept.txt"), b"written while the store was away");
    fx.close(fresh);
}

/// A handle's whole content, read through it at once (not reopened).
fn read_handle(vfs: &Vfs, ino: u64, fh: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while (out.len() as u64) < len {
        let chunk = vfs.read(ino, fh, out.len() as u64, 1 << 20).expect("read");
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    out
}

fn size_of(vfs: &Vfs, name: &str) -> u64 {
    vfs.lookup(ROOT_INO, name.as_bytes()).expect("lookup").size
}

#[test]
fn a_follower_switches_to_each_new_head_whole_and_open_files_keep_their_version() {
    let fx = Fixture::new(PASSPHRASE);
    let mut wconfig = fx.config("writer", Access::ReadWrite);
    // Data is stored only when the test says so (flush_to_store), so the follower can be
    // shown a head whose data is not all in the store yet.
    wconfig.dirty_age = Duration::from_secs(3600);
    // No point-in-time window: each checkpoint compacts the journal before the previous one,
    // which the follower must be taken past below.
    wconfig.retention = Duration::ZERO;
    let writer = Session::open(wconfig, fx.rt.handle()).expect("open writer");
    let w = writer.vfs();
    let big_a: Vec<u8> = (0..6u32 << 20).map(|i| (i % 251) as u8).collect();
    write_file(w, "model.bin", 0, &big_a);
    write_file(w, "old.txt", 0, b"removed later");
    writer.flush_to_store(Duration::from_secs(30)).expect("flush");

    let mut fconfig = fx.config("follower", Access::ReadOnly);
    fconfig.follow = Some(Duration::from_secs(3600)); // driven by follow_now below
    let follower = Session::open(fconfig, fx.rt.handle()).expect("open follower");
    let f = follower.vfs();
    assert_eq!(read_file(f, "model.bin"), big_a);
    assert!(follower.follow_now().expect("follow").is_none(), "nothing new yet");
    // Handles opened on the first head.
    let model = f.lookup(ROOT_INO, b"model.bin").expect("lookup");
    let model_fh = f.open(&Caller::ROOT, model.ino, libc::O_RDONLY).expect("open");
    assert_eq!(f.read(model.ino, model_fh, 0, 4096).expect("read"), &big_a[..4096]);
    let old = f.lookup(ROOT_INO, b"old.txt").expect("lookup");
    let old_fh = f.open(&Caller::ROOT, old.ino, libc::O_RDONLY).expect("open");

    // The writer rewrites the second chunk of model.bin in place, adds a file, removes one.
    let big_b: Vec<u8> = big_a.iter().enumerate().map(|(i, &b)| if i >= 4 << 20 { !b } else { b }).collect();
    let wfh = w.open(&Caller::ROOT, model.ino, libc::O_RDWR).expect("open for writing");
    w.write(model.ino, wfh, 4 << 20, &big_b[4 << 20..]).expect("rewrite");
    w.release(model.ino, wfh).expect("release");
    write_file(w, "new.txt", 0, b"a new file");
    w.unlink(&Caller::ROOT, ROOT_INO, b"old.txt").expect("unlink");
    writer.flush_to_store(Duration::from_secs(30)).expect("flush");
    assert!(!exists(f, "new.txt"), "a follower shows its head until it switches");

    let change = follower.follow_now().expect("follow").expect("a new head");
    assert!(!change.whole, "the journal is there: {change:?}");
    assert!(change.inodes.contains(&model.ino), "{change:?}");
    assert_eq!(change.kept, vec![model.ino, old.ino], "pages read by the open handles stay");
    assert!(change.entries.contains(&(ROOT_INO, b"new.txt".to_vec())), "{change:?}");
    assert!(change.entries.contains(&(ROOT_INO, b"old.txt".to_vec())), "{change:?}");
    assert_eq!(read_file(f, "new.txt"), b"a new file");
    assert!(!exists(f, "old.txt"));
    let fresh = f.open(&Caller::ROOT, model.ino, libc::O_RDONLY).expect("open");
    assert_eq!(f.page_cache(fresh), PageCache::Bypass, "the old version's pages are in use");
    assert!(read_handle(f, model.ino, fresh, big_b.len() as u64) == big_b, "a new open reads the new head");
    f.release(model.ino, fresh).expect("release");
    // The handles opened before keep their version: the old second chunk from the store,
    // the unchanged first one from the cache, and the removed file.
    assert!(read_handle(f, model.ino, model_fh, big_a.len() as u64) == big_a, "the open handle changed version");
    assert_eq!(read_handle(f, old.ino, old_fh, 13), b"removed later");
    f.release(model.ino, model_fh).expect("release");
    f.release(old.ino, old_fh).expect("release");
    let fresh = f.open(&Caller::ROOT, model.ino, libc::O_RDONLY).expect("open");
    assert_eq!(f.page_cache(fresh), PageCache::Drop, "the old version's pages are no longer read");
    f.release(model.ino, fresh).expect("release");
    let fresh = f.open(&Caller::ROOT, model.ino, libc::O_RDONLY).expect("open");
    assert_eq!(f.page_cache(fresh), PageCache::Keep);
    // A change of attributes alone leaves the pages an open handle reads valid.
    let chmod = SetAttr { mode: Some(0o600), ..SetAttr::default() };
    w.setattr(&Caller::ROOT, model.ino, &chmod, None).expect("chmod");
    writer.flush_to_store(Duration::from_secs(30)).expect("flush");
    let change = follower.follow_now().expect("follow").expect("a new head");
    assert!(change.inodes.contains(&model.ino) && change.kept.is_empty(), "{change:?}");
    let other = f.open(&Caller::ROOT, model.ino, libc::O_RDONLY).expect("open");
    assert_eq!(f.page_cache(other), PageCache::Keep, "only attributes changed");
    f.release(model.ino, other).expect("release");
    f.release(model.ino, fresh).expect("release");

    // Data the writer has not stored: its size is journaled (and its chunk marked unsealed),
    // its bytes are not; the follower shows the file cut where its stored data ends.
    // Kept open: a closed file is sealed at once.
    let (partial, pfh) = w.create(&Caller::ROOT, ROOT_INO, b"partial.bin", 0o644, 0o022, libc::O_RDWR).expect("create");
    w.write(partial.ino, pfh, 0, &[7u8; 100]).expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !exists(f, "partial.bin") {
        assert!(std::time::Instant::now() < deadline, "the journal never brought partial.bin");
        std::thread::sleep(Duration::from_millis(100));
        follower.follow_now().expect("follow");
    }
    assert_eq!(size_of(f, "partial.bin"), 0, "bytes that are not in the store are shown");
    writer.flush_to_store(Duration::from_secs(30)).expect("flush");
    follower.follow_now().expect("follow").expect("the stored data is a new head");
    assert_eq!(read_file(f, "partial.bin"), vec![7u8; 100]);
    w.release(partial.ino, pfh).expect("release");

    // Three snapshots, each after a segment, compact the journal past the follower's place:
    // it switches through the newest checkpoint, whole.
    let behind = follower.status().follow.expect("a follower's status");
    for i in 0..3 {
        write_file(w, &format!("snap{i}.txt"), 0, format!("snapshot {i}").as_bytes());
        writer.flush_to_store(Duration::from_secs(30)).expect("flush"); // a segment each
        writer.sync(Some(format!("s{i}")), Duration::from_secs(30)).expect("sync");
    }
    w.unlink(&Caller::ROOT, ROOT_INO, b"new.txt").expect("unlink");
    writer.flush_to_store(Duration::from_secs(30)).expect("flush");
    let ws = tierfs::remote::Workspace::new(fx.store(), "default");
    let at = tierfs::remote::ChainPoint { next_segment: behind.next_segment, seq: behind.seq };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !fx.rt.block_on(ws.head_after(at)).expect("head").is_some_and(|h| h.whole) {
        assert!(std::time::Instant::now() < deadline, "no checkpoint ever took the follower past {at:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let change = follower.follow_now().expect("follow").expect("a new head");
    assert!(change.whole, "{change:?}");
    for i in 0..3 {
        assert_eq!(read_file(f, &format!("snap{i}.txt")), format!("snapshot {i}").as_bytes());
    }
    assert!(!exists(f, "new.txt"), "a removal after the checkpoint");
    assert_eq!(read_file(f, "model.bin"), big_b);
    let status = follower.status().follow.expect("status");
    assert_eq!((status.errors, status.seq), (0, writer.status().remote.expect("remote").last_seq));
    drop(follower);
    fx.close(writer);

    // Only a read-only session follows.
    let mut bad = fx.config("bad", Access::ReadWrite);
    bad.follow = Some(Duration::from_secs(1));
    let err = Session::open(bad, fx.rt.handle()).err().expect("a writer cannot follow");
    assert!(matches!(err, SessionError::FollowNotReadOnly), "{err}");
}
