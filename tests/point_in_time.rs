//! Point-in-time restore through the core, on a real `file://` store and real RocksDB, with
//! the journal's clock injected (no sleeping): three phases of writes, then `rm -rf` and an
//! overwrite; a read-only session at each phase boundary shows exactly that phase's tree;
//! data that never reached the store by a time is named; times the store cannot rebuild are
//! refused with their kind (docs/SEMANTICS.md, "Point-in-time restore").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tierfs::ErrorKind;
use tierfs::meta::system_unix_ms;
use tierfs::remote::{PointKind, RemoteError, Workspace};
use tierfs::session::{Access, Session, SessionError};
use tierfs::vfs::{Caller, FileKind, Ino, ROOT_INO, SetAttr, Vfs};
use tierfs_test_support::file_store::FileStore as Fixture;

const PASSPHRASE: &[u8] = b"point in time test";

/// The fixture's sessions at a point in time.
trait AtSessions {
    fn at(&self, data_dir: &str, at_ms: u64) -> Result<Session, SessionError>;
}

impl AtSessions for Fixture {
    fn at(&self, data_dir: &str, at_ms: u64) -> Result<Session, SessionError> {
        Session::open(self.config(data_dir, Access::At(at_ms)), self.rt.handle())
    }
}

/// Every entry under the root: path → kind and contents (a directory's is empty).
fn tree(vfs: &Vfs) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(vfs, ROOT_INO, "", &mut out);
    out
}

fn walk(vfs: &Vfs, dir: Ino, prefix: &str, out: &mut BTreeMap<String, String>) {
    for e in tierfs::export::entries(vfs, dir).expect("list") {
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
        match e.kind {
            FileKind::Dir => {
                out.insert(path.clone(), "dir".into());
                walk(vfs, e.ino, &path, out);
            }
            FileKind::File => {
                let body = read_ino(vfs, e.ino);
                out.insert(path, format!("file {} {}", body.len(), blake3::hash(&body).to_hex()));
            }
            kind => {
                out.insert(path, format!("{kind:?}"));
            }
        }
    }
}

fn read_ino(vfs: &Vfs, ino: Ino) -> Vec<u8> {
    let size = vfs.getattr(ino).expect("getattr").size;
    let fh = vfs.open(&Caller::ROOT, ino, libc::O_RDONLY).expect("open");
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let chunk = vfs.read(ino, fh, out.len() as u64, 1 << 20).expect("read");
        assert!(!chunk.is_empty(), "short read of {ino} at {}", out.len());
        out.extend_from_slice(&chunk);
    }
    vfs.release(ino, fh).expect("release");
    out
}

fn lookup(vfs: &Vfs, path: &str) -> Ino {
    path.split('/').filter(|c| !c.is_empty()).fold(ROOT_INO, |dir, c| vfs.lookup(dir, c.as_bytes()).expect(path).ino)
}

/// Writes `data` as the whole of `name` in `dir` (created, or truncated first).
fn put(vfs: &Vfs, dir: Ino, name: &str, data: &[u8]) -> Ino {
    let ino = match vfs.lookup(dir, name.as_bytes()) {
        Ok(attr) => {
            let truncate = SetAttr { size: Some(0), ..SetAttr::default() };
            vfs.setattr(&Caller::ROOT, attr.ino, &truncate, None).expect("truncate");
            attr.ino
        }
        Err(_) => {
            let (attr, fh) =
                vfs.create(&Caller::ROOT, dir, name.as_bytes(), 0o644, 0o022, libc::O_RDWR).expect("create");
            vfs.release(attr.ino, fh).expect("release");
            attr.ino
        }
    };
    let fh = vfs.open(&Caller::ROOT, ino, libc::O_RDWR).expect("open");
    vfs.write(ino, fh, 0, data).expect("write");
    vfs.release(ino, fh).expect("release");
    ino
}

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn kind_of(err: &SessionError) -> ErrorKind {
    tierfs::error::kind_of(err).expect("a core error has a kind")
}

#[test]
fn restore_at_each_phase_boundary_gives_that_phase_and_names_data_that_never_reached_the_store() {
    let fx = Fixture::new(PASSPHRASE);
    // The writer's journal clock, an hour in the past, moved by hand between phases.
    let start = system_unix_ms() - 3_600_000;
    let now = Arc::new(AtomicU64::new(start));
    let clock = now.clone();
    let mut config = fx.config("writer", Access::ReadWrite);
    config.clock = Some(Arc::new(move || clock.load(Ordering::SeqCst)));
    // Data is uploaded only when asked (flush, sync, close): phase 4 leaves some behind.
    config.dirty_age = Duration::from_secs(3600);
    let w = Session::open(config, fx.rt.handle()).expect("open the writer");
    let vfs = w.vfs().clone();
    let flush = || w.flush_to_store(Duration::from_secs(60)).expect("flush to the store");
    let mut boundaries: Vec<(u64, BTreeMap<String, String>)> = Vec::new();
    let next_phase = |boundaries: &mut Vec<(u64, BTreeMap<String, String>)>| {
        boundaries.push((now.load(Ordering::SeqCst), tree(&vfs)));
        now.fetch_add(5_000, Ordering::SeqCst);
    };

    // Phase 1: a directory of outputs, notes, a file of two chunks.
    let out = vfs.mkdir(&Caller::ROOT, ROOT_INO, b"outputs", 0o755, 0o022).expect("mkdir").ino;
    put(&vfs, out, "a.txt", b"first output");
    put(&vfs, out, "model.bin", &bytes(1, (5 << 20) + 17));
    put(&vfs, ROOT_INO, "notes.txt", b"notes, version one");
    flush();
    next_phase(&mut boundaries);

    // Phase 2: more outputs and an overwrite, ending in a sync (a snapshot and a checkpoint).
    put(&vfs, out, "b.txt", b"second output");
    put(&vfs, ROOT_INO, "notes.txt", b"notes, version two is longer");
    w.sync(Some("phase 2".into()), Duration::from_secs(60)).expect("sync");
    next_phase(&mut boundaries);

    // Phase 3: `rm -rf outputs` and an overwrite of last night's checkpoint.
    put(&vfs, ROOT_INO, "checkpoint.pt", &bytes(3, 300_000));
    flush();
    next_phase(&mut boundaries);
    for name in ["a.txt", "model.bin", "b.txt"] {
        vfs.unlink(&Caller::ROOT, out, name.as_bytes()).expect("unlink");
    }
    vfs.rmdir(&Caller::ROOT, ROOT_INO, b"outputs").expect("rmdir");
    put(&vfs, ROOT_INO, "checkpoint.pt", &bytes(4, 100_000));
    flush();
    next_phase(&mut boundaries);

    // Phase 4: a file whose metadata reaches the store but whose data does not (yet).
    let late = put(&vfs, ROOT_INO, "late.bin", &bytes(5, 200_000));
    let journal = vfs.meta().journal();
    journal.wait_durable(journal.last_seq(), Duration::from_secs(60)).expect("metadata in the store");
    let late_at = now.load(Ordering::SeqCst);
    now.fetch_add(5_000, Ordering::SeqCst);
    // Closing uploads it: after `late_at`.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    fx.rt.block_on(w.flush(deadline)).expect("flush");
    fx.rt.block_on(w.close(deadline)).expect("close");

    assert!(boundaries[0].1.contains_key("/outputs/model.bin"));
    assert!(!boundaries[3].1.contains_key("/outputs"), "rm -rf happened");
    for (i, (at, want)) in boundaries.iter().enumerate() {
        let s = fx.at(&format!("at-{i}"), *at).unwrap_or_else(|e| panic!("restore at boundary {i}: {e}"));
        assert_eq!(&tree(s.vfs()), want, "the tree at boundary {i} differs");
        let report = s.restored_at().expect("a point-in-time session reports");
        assert!(report.incomplete.is_empty(), "boundary {i}: nothing was left behind: {report:?}");
        assert!(report.state_unix_ms <= *at);
        if i >= 1 {
            // The sync of phase 2 is the newest base not younger than these times.
            assert_eq!(report.base.kind, PointKind::Sync, "boundary {i}: {report:?}");
        } else {
            assert_eq!(report.base.kind, PointKind::Start, "boundary {i}: {report:?}");
        }
    }

    // Just before a boundary's clock tick, the phase before it.
    let s = fx.at("just-before-2", boundaries[2].0 - 1).expect("restore");
    assert_eq!(tree(s.vfs()), boundaries[1].1);
    drop(s);

    // At `late_at`, late.bin's data had not reached the store: named, and restored as the
    // store had it then (no data: cut back to nothing).
    let s = fx.at("late", late_at).expect("restore at late");
    let report = s.restored_at().expect("report").clone();
    assert_eq!(report.incomplete, vec![late], "{report:?}");
    let mut want = boundaries[3].1.clone();
    want.insert("/late.bin".into(), format!("file 0 {}", blake3::hash(b"").to_hex()));
    assert_eq!(tree(s.vfs()), want);
    drop(s);
    // Later, it had.
    let s = fx.at("later", late_at + 5_000).expect("restore later");
    assert!(s.restored_at().expect("report").incomplete.is_empty());
    assert_eq!(read_ino(s.vfs(), lookup(s.vfs(), "/late.bin")), bytes(5, 200_000));
    drop(s);

    // Times the store cannot rebuild: refused, with their kind.
    let err = fx.at("too-early", start - 60_000).err().expect("before the first change");
    assert!(matches!(&err, SessionError::Remote(RemoteError::AtUnavailable { .. })), "{err}");
    assert_eq!(kind_of(&err), ErrorKind::NotFound);
    let err = fx.at("future", system_unix_ms() + 3_600_000).err().expect("in the future");
    assert!(matches!(&err, SessionError::Remote(RemoteError::AtInFuture { .. })), "{err}");
    assert_eq!(kind_of(&err), ErrorKind::InvalidInput);

    // The timeline: the start, the sync (and its checkpoint), and the journal's span.
    let ws = Workspace::new(fx.store(), "default");
    let t = fx.rt.block_on(ws.timeline()).expect("timeline");
    assert_eq!(t.points.first().map(|p| p.kind), Some(PointKind::Start), "{t:?}");
    assert!(t.points.iter().any(|p| p.kind == PointKind::Sync && p.message.as_deref() == Some("phase 2")));
    assert_eq!(t.oldest_unix_ms, Some(start), "{t:?}");
    let span = t.journal.expect("a journal");
    assert_eq!(span.from_unix_ms, start);
    assert!(span.to_unix_ms >= late_at, "{span:?}");

    // gc with the retention window keeps what a restore inside it reads: every phase comes
    // back whole, data included, though `rm -rf` and the overwrites left the files of the
    // first phases referenced by the journal alone.
    let gc = |keep_within: Duration, scratch: &str| {
        let scratch = fx.dir.path().join(scratch);
        std::fs::create_dir_all(&scratch).expect("scratch");
        fx.rt.block_on(tierfs::remote::gc(fx.store(), &scratch, "test gc", false, keep_within, &|_| {})).expect("gc")
    };
    let kept = gc(tierfs::remote::DEFAULT_RETENTION, "gc-1");
    assert!(kept.journal_segments_kept > 0, "{kept:?}");
    for (i, (at, want)) in boundaries.iter().enumerate() {
        let s = fx.at(&format!("after-gc-{i}"), *at).unwrap_or_else(|e| panic!("restore at {i} after gc: {e}"));
        assert_eq!(&tree(s.vfs()), want, "the tree at boundary {i} differs after gc");
    }
    // Without a window, gc frees what only the journal referenced, and those times go.
    let freed = gc(Duration::ZERO, "gc-2");
    assert!(freed.packs_deleted > 0 && freed.journal_segments_deleted > 0, "{freed:?}");
    let err = fx.at("after-gc-0", boundaries[0].0).err().expect("the journal of phase 1 is gone");
    assert_eq!(kind_of(&err), ErrorKind::NotFound, "{err}");
    let latest = Session::open(fx.config("latest", Access::ReadOnly), fx.rt.handle()).expect("latest");
    assert_eq!(read_ino(latest.vfs(), lookup(latest.vfs(), "/late.bin")), bytes(5, 200_000));
}
