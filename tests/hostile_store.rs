//! A store is input: what a store that serves the wrong objects can do to a node, on a real
//! `file://` store and real RocksDB (and a real S3 server, moto, for the size a server states).
//!
//! Each test writes a workspace through a real session, then puts an oversized object where
//! the format expects a small one, at the key the format gives it (a sparse file on the
//! `file://` store, so a 2 GiB object costs no disk), and checks that opening, restoring or
//! loading fails with the public error kind `Corrupt`, that the message names the object, that
//! the body was never read (the backend's received-bytes counter), and that the process's peak
//! RSS stayed far below the object's size. One more plants a journal segment whose header
//! claims 2^32-1 batches.
//!
//! The rest plant well-formed journal batches, sealed with the store's own keys at the key of
//! the segment a reader takes next (what a buggy or hostile writer that knows the key can
//! do): names that are no path component, a symlink with an entry beneath it, a directory
//! cycle, a setuid-root file and a device node. A restore (a read-only session and the
//! export `tierfs restore` runs) refuses each with its kind or leaves the rights out, and a
//! canary directory beside the target stays empty.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tierfs::backend::{BackendSpec, Credentials};
use tierfs::crypto::{KdfParams, ObjectKind, Secret};
use tierfs::export::{self, Visitor, Written};
use tierfs::meta::codec;
use tierfs::meta::{InodeRecord, JournalBatch, JournalOp};
use tierfs::remote::{Workspace, encode_segment};
use tierfs::session::{Access, Session, SessionConfig, SessionError, StoreLocality};
use tierfs::store::{Store, StoreConfig, StoreError, WholeObject};
use tierfs::types::{Attr, FileKind};
use tierfs::vfs::{Caller, ROOT_INO};
use tierfs::{Error, ErrorKind};
use tierfs_test_support::moto::MotoServer;
use tokio::runtime::Runtime;

const SECRET: Secret<'static> = Secret::Passphrase(b"hostile store test");
/// The planted objects: far more than any limit of a small object, far more than the bound below.
const HUGE: u64 = 2 << 30;
/// The process's peak RSS must stay under this (every test of this binary shares the process).
const PEAK_RSS_BOUND: u64 = 512 << 20;

struct Fixture {
    rt: Runtime,
    dir: tempfile::TempDir,
    store_config: StoreConfig,
    /// Where the store's objects are (`file://`), or `None` on S3.
    objects: Option<PathBuf>,
}

impl Fixture {
    /// A store on `file://` with a workspace written and closed by a session on node "writer".
    fn file() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = dir.path().join("objects");
        std::fs::create_dir_all(&objects).expect("objects dir");
        let mut store_config = StoreConfig::new(vec![BackendSpec::File { path: objects.clone() }.to_url()]);
        store_config.replicas = Some(1);
        Fixture::written(dir, store_config, Some(objects))
    }

    /// A store on a new moto server's bucket `bucket` (prefix `store`), with a workspace
    /// written and closed as in [`Fixture::file`]. The server lives as long as it is held.
    fn on_moto(bucket: &str) -> (MotoServer, Fixture) {
        let server = MotoServer::start();
        server.create_bucket(bucket);
        let mut store_config = StoreConfig::new(vec![server.url(bucket, "store")]);
        store_config.replicas = Some(1);
        store_config.credentials = Credentials {
            access_key_id: Some("test".into()),
            secret_access_key: Some("test".into()),
            session_token: None,
        };
        let dir = tempfile::tempdir().expect("tempdir");
        (server, Fixture::written(dir, store_config, None))
    }

    fn written(dir: tempfile::TempDir, store_config: StoreConfig, objects: Option<PathBuf>) -> Fixture {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        rt.block_on(Store::init(&store_config, &SECRET, KdfParams::for_tests())).expect("init store");
        let fx = Fixture { rt, dir, store_config, objects };
        let session = fx.open("writer", Access::ReadWrite, fx.store()).expect("open writer");
        let vfs = session.vfs();
        let (attr, fh) = vfs.create(&Caller::ROOT, ROOT_INO, b"notes.txt", 0o644, 0o022, libc::O_RDWR).expect("create");
        vfs.write(attr.ino, fh, 0, b"what the store holds").expect("write");
        vfs.release(attr.ino, fh).expect("release");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        fx.rt.block_on(session.flush(deadline)).expect("flush");
        fx.rt.block_on(session.close(deadline)).expect("close");
        fx
    }

    fn store(&self) -> Arc<Store> {
        Arc::new(self.rt.block_on(Store::open(&self.store_config, &SECRET)).expect("open store"))
    }

    fn open(&self, data_dir: &str, access: Access, store: Arc<Store>) -> Result<Session, SessionError> {
        let mut config = SessionConfig::new(self.dir.path().join(data_dir), Some((store, StoreLocality::Remote)));
        config.access = access;
        config.holder = format!("test-{data_dir}");
        Session::open(config, self.rt.handle())
    }

    /// Every key of the store, sorted.
    fn keys(&self, store: &Store) -> Vec<String> {
        let mut keys: Vec<String> =
            self.rt.block_on(store.backend().list("")).expect("list").into_iter().map(|o| o.key).collect();
        keys.sort();
        keys
    }

    /// The workspace's directory, `ws/<w>/`, from the lease the writer left.
    fn workspace(&self, store: &Store) -> String {
        let lease =
            self.keys(store).into_iter().find(|k| k.starts_with("ws/") && k.ends_with("/lease")).expect("a lease");
        lease.trim_end_matches("lease").to_string()
    }

    /// The key of the journal segment a restore reads after the last one written: the chain
    /// is read until its first missing number.
    fn next_segment_key(&self, store: &Store) -> String {
        let ws = self.workspace(store);
        let last = self
            .keys(store)
            .iter()
            .filter_map(|k| k.strip_prefix(&format!("{ws}j/")).and_then(|n| u64::from_str_radix(n, 16).ok()))
            .max()
            .expect("the writer appended segments");
        format!("{ws}j/{:016x}", last + 1)
    }

    /// Makes the object at `key` `len` bytes: a sparse file, whatever was there before.
    fn plant_sparse(&self, key: &str, len: u64) {
        let path = self.objects.as_deref().expect("a file:// store").join(key);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        let file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path).expect("plant");
        file.set_len(len).expect("set_len");
    }

    fn plant_bytes(&self, key: &str, bytes: &[u8]) {
        let path = self.objects.as_deref().expect("a file:// store").join(key);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
        std::fs::write(path, bytes).expect("plant");
    }
}

/// Bytes the store's backends have received so far.
fn received(store: &Store) -> u64 {
    store.backend().backends().iter().map(|b| b.health().traffic.received_bytes).sum()
}

/// The process's peak resident set (VmHWM).
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmHWM in kB");
    kib * 1024
}

/// `err` is the public kind `Corrupt`, names `key`, and nothing grew past the bound.
fn assert_refused(err: Error, key: &str, sizes: &[u64]) {
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    let msg = err.to_string();
    assert!(msg.contains(key), "the message names the object {key}: {msg}");
    for size in sizes {
        assert!(msg.contains(&format!("{size} bytes")), "the message gives the size {size}: {msg}");
    }
    let peak = peak_rss();
    assert!(peak < PEAK_RSS_BOUND, "peak RSS {peak} bytes, over {PEAK_RSS_BOUND}");
}

#[test]
fn a_2_gib_lease_record_is_refused_unread() {
    let fx = Fixture::file();
    let store = fx.store();
    let lease = format!("{}lease", fx.workspace(&store));
    fx.plant_sparse(&lease, HUGE);
    let before = received(&store);
    let err = fx.open("node-b", Access::ReadWrite, store.clone()).err().expect("an oversized lease is refused");
    assert!(received(&store) - before < 1 << 20, "the lease's body was not read");
    assert_refused(Error::from(err), &lease, &[HUGE, WholeObject::Lease.max_len()]);
}

#[test]
fn a_2_gib_journal_segment_is_refused_unread() {
    let fx = Fixture::file();
    let store = fx.store();
    let segment = fx.next_segment_key(&store);
    fx.plant_sparse(&segment, HUGE);
    let before = received(&store);
    let err = fx.open("reader", Access::ReadOnly, store.clone()).err().expect("an oversized segment is refused");
    assert!(received(&store) - before < 1 << 20, "the segment's body was not read");
    assert_refused(Error::from(err), &segment, &[HUGE, WholeObject::JournalSegment.max_len()]);
}

#[test]
fn an_oversized_checkpoint_part_is_refused_unread() {
    let fx = Fixture::file();
    let store = fx.store();
    let ws = fx.workspace(&store);
    let part = fx.keys(&store).into_iter().find(|k| k.starts_with(&format!("{ws}part/"))).expect("a checkpoint part");
    // Grown in place: its real bytes, then a 2 GiB hole.
    fx.plant_sparse(&part, HUGE);
    let err = fx.open("reader", Access::ReadOnly, store.clone()).err().expect("an oversized part is refused");
    assert_refused(Error::from(err), &part, &[HUGE, WholeObject::CheckpointPart.max_len()]);
}

#[test]
fn an_index_segment_one_byte_over_its_limit_is_refused_unread() {
    let fx = Fixture::file();
    let store = fx.store();
    let index = fx.keys(&store).into_iter().find(|k| k.starts_with("index/")).expect("an index segment");
    let over = WholeObject::IndexSegment.max_len() + 1;
    fx.plant_sparse(&index, over);
    let before = received(&store);
    let err = fx.rt.block_on(store.load_index()).expect_err("an oversized index segment is refused");
    assert!(received(&store) - before < 1 << 20, "the segment's body was not read");
    assert_refused(Error::from(err), &index, &[over, WholeObject::IndexSegment.max_len()]);
}

#[test]
fn an_oversized_store_config_or_wrapped_key_is_refused_when_the_store_opens() {
    let fx = Fixture::file();
    let store = fx.store();
    let key = fx.keys(&store).into_iter().find(|k| k.starts_with("keys/")).expect("a wrapped key");
    fx.plant_sparse(&key, HUGE);
    let err = fx.rt.block_on(Store::open(&fx.store_config, &SECRET)).err().expect("an oversized key record");
    assert_refused(Error::from(err), &key, &[HUGE, WholeObject::WrappedKey.max_len()]);

    fx.plant_sparse("config", HUGE);
    let err: StoreError = fx.rt.block_on(Store::open(&fx.store_config, &SECRET)).err().expect("an oversized config");
    assert_refused(Error::from(err), "config", &[HUGE, WholeObject::Config.max_len()]);
}

#[test]
fn a_segment_claiming_u32_max_batches_is_corrupt_and_nothing_aborts() {
    let fx = Fixture::file();
    let store = fx.store();
    let key = fx.next_segment_key(&store);
    let n = u64::from_str_radix(key.rsplit('/').next().expect("a number"), 16).expect("hex");
    // A well-formed segment, sealed with the store's own keys (as a writer that knows them
    // would), whose header claims 2^32-1 batches over the bytes of two empty ones.
    let segment = |batches: u32, body: &[u8]| {
        let header = format!(
            r#"{{"format":3,"segment":{n},"session":"s","holder":"h:1","created_unix":0,"batches":{batches}}}"#
        );
        let mut plain = (header.len() as u32).to_le_bytes().to_vec();
        plain.extend_from_slice(header.as_bytes());
        plain.extend_from_slice(body);
        store.keys().seal(ObjectKind::Journal, key.as_bytes(), &plain)
    };
    let empty_batch = |seq: u64| [seq.to_le_bytes().as_slice(), &0u32.to_le_bytes()].concat();
    fx.plant_bytes(&key, &segment(u32::MAX, &[empty_batch(1_000_000), empty_batch(1_000_001)].concat()));
    let err = fx.open("reader", Access::ReadOnly, store.clone()).err().expect("the count is refused");
    let err = Error::from(err);
    assert!(err.to_string().contains(&format!("{} batches", u32::MAX)), "the message gives the claimed count: {err}");
    assert_refused(err, &key, &[]);

    // One batch claiming 2^32-1 ops over the bytes of none is refused the same way.
    let batch = [1_000_000u64.to_le_bytes().as_slice(), &u32::MAX.to_le_bytes()].concat();
    fx.plant_bytes(&key, &segment(1, &batch));
    let err = fx.open("reader-2", Access::ReadOnly, store.clone()).err().expect("the op count is refused");
    let err = Error::from(err);
    assert!(err.to_string().contains(&format!("{} ops", u32::MAX)), "the message gives the claimed count: {err}");
    assert_refused(err, &key, &[]);
}

/// On a real S3 server the size comes from the answer's Content-Length: an oversized lease is
/// refused with its body unread (16 MiB planted, less than 1 MiB received).
#[test]
fn on_s3_an_oversized_lease_is_refused_unread() {
    let bucket = "hostile";
    let (server, fx) = Fixture::on_moto(bucket);
    let store = fx.store();
    let lease = format!("{}lease", fx.workspace(&store));
    let planted = 16u64 << 20;
    server.put_raw(bucket, &format!("store/{lease}"), &vec![0u8; planted as usize]);
    let before = received(&store);
    let err = fx.open("node-b", Access::ReadWrite, store.clone()).err().expect("an oversized lease is refused");
    assert!(received(&store) - before < 1 << 20, "the lease's body was not read");
    assert_refused(Error::from(err), &lease, &[planted, WholeObject::Lease.max_len()]);
}

/// The batch number of planted batches: past anything the writer made.
const PLANTED_SEQ: u64 = 1_000_000;

/// The ops of one batch, as a writer's metadata store would journal them.
#[derive(Default)]
struct Planted(Vec<JournalOp>);

impl Planted {
    fn entry(mut self, parent: u64, name: &[u8], ino: u64, kind: FileKind) -> Planted {
        self.0.push(JournalOp::Put {
            key: codec::dentry_key(parent, name),
            value: codec::encode_dentry(ino, kind).to_vec(),
        });
        self
    }

    /// An inode: `perm` with its setid bits, owned by `uid`, device number `rdev`.
    fn inode(mut self, ino: u64, kind: FileKind, perm: u16, uid: u32, rdev: u32) -> Planted {
        let nlink = if kind == FileKind::Dir { 2 } else { 1 };
        // Empty, with times of now: what `Attr::gone` gives, and the rest as asked.
        let attr = Attr { kind, perm, nlink, uid, gid: uid, rdev, ..Attr::gone(ino) };
        let rec = InodeRecord { attr, parent: ROOT_INO, dense: true, no_xattrs: true };
        self.0.push(JournalOp::Put { key: codec::inode_key(ino), value: codec::encode_inode(&rec) });
        self
    }

    fn symlink(mut self, ino: u64, target: &[u8]) -> Planted {
        self = self.inode(ino, FileKind::Symlink, 0o777, 0, 0);
        self.0.push(JournalOp::Put { key: codec::symlink_key(ino), value: target.to_vec() });
        self
    }
}

impl Fixture {
    /// Seals `planted` as the next journal segment with the store's keys, replacing whatever
    /// was planted there before (a `file://` store).
    fn plant_batch(&self, store: &Store, planted: Planted) {
        let key = self.next_segment_key(store);
        let n = u64::from_str_radix(key.rsplit('/').next().expect("a number"), 16).expect("hex");
        let batch = JournalBatch { seq: PLANTED_SEQ, ops: planted.0, unix_ms: 1_700_000_000_000 };
        let plain = encode_segment(n, "hostile", "hostile:1", 0, &[batch]).expect("encode");
        self.plant_bytes(&key, &store.keys().seal(ObjectKind::Journal, key.as_bytes(), &plain));
    }

    /// What `tierfs restore` does: a read-only session on a new data dir, then the export
    /// into `target` (made here, empty), unprivileged unless `privileged`.
    fn restore(
        &self,
        data_dir: &str,
        store: Arc<Store>,
        target: &std::path::Path,
        privileged: bool,
    ) -> Result<Written, Error> {
        std::fs::create_dir_all(target).expect("target");
        let session = self.open(data_dir, Access::ReadOnly, store).map_err(Error::from)?;
        Ok(export::write_tree(session.vfs(), target, privileged, &mut Quiet)?)
    }

    /// An empty directory beside the restore targets, where a store's names may point.
    fn canary(&self) -> PathBuf {
        let canary = self.dir.path().join("canary");
        std::fs::create_dir_all(&canary).expect("canary");
        canary
    }
}

struct Quiet;
impl Visitor for Quiet {}

fn assert_empty(dir: &std::path::Path) {
    let names: Vec<_> = std::fs::read_dir(dir).expect("readdir").map(|e| e.expect("entry").file_name()).collect();
    assert!(names.is_empty(), "{} holds {names:?}", dir.display());
}

/// Every name that is no path component (`..`, a path, NUL, 256 bytes, …) is refused where the
/// batch is imported, before anything of the restore is written, with kind `Corrupt`.
#[test]
fn names_that_are_no_path_component_are_refused_and_nothing_is_written() {
    let fx = Fixture::file();
    let store = fx.store();
    let canary = fx.canary();
    let escape = format!("../../{}/escaped", canary.file_name().and_then(|n| n.to_str()).expect("a name"));
    let absolute = format!("{}/escaped", canary.display());
    let long = vec![b'x'; 256];
    let names: [&[u8]; 8] = [escape.as_bytes(), absolute.as_bytes(), b"a/b", b"nul\0byte", &long, b".", b"..", b""];
    for (i, name) in names.into_iter().enumerate() {
        fx.plant_batch(
            &store,
            Planted::default().inode(900, FileKind::File, 0o644, 0, 0).entry(ROOT_INO, name, 900, FileKind::File),
        );
        let target = fx.dir.path().join(format!("copies/{i}"));
        let err =
            fx.restore(&format!("reader-{i}"), store.clone(), &target, false).expect_err("a bad name was restored");
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{name:?}: {err}");
        assert!(err.to_string().contains("directory entry"), "{name:?}: {err}");
        assert_empty(&target);
        assert_empty(&canary);
    }
    assert!(peak_rss() < PEAK_RSS_BOUND);
}

/// A symlink to a directory outside the target, with an entry beneath the symlink: the entry is
/// never written through it (the restore makes the symlink and descends only into
/// directories), so the canary stays empty.
#[test]
fn an_entry_beneath_a_symlink_is_never_written_through_it() {
    let fx = Fixture::file();
    let store = fx.store();
    let canary = fx.canary();
    let planted = Planted::default()
        .symlink(900, canary.as_os_str().as_encoded_bytes())
        .entry(ROOT_INO, b"s", 900, FileKind::Symlink)
        .inode(901, FileKind::File, 0o644, 0, 0)
        .entry(900, b"x", 901, FileKind::File);
    fx.plant_batch(&store, planted);
    let target = fx.dir.path().join("copy");
    // The symlink is made; the entry beneath it belongs to no directory of the tree, so it
    // is never visited: only the writer's file and the symlink are written.
    let written = fx.restore("reader", store, &target, false).expect("restore");
    assert_eq!((written.files, written.symlinks, written.dirs), (1, 1, 0), "{written:?}");
    assert_eq!(std::fs::read_link(target.join("s")).expect("the symlink"), canary);
    assert_empty(&canary);
}

/// A directory that holds itself, and one holding the root again: the restore fails with
/// `Corrupt` (not a tree) instead of recursing, and writes nothing outside the target.
#[test]
fn a_directory_cycle_is_refused_without_recursing() {
    for (i, back_to) in [900, ROOT_INO].into_iter().enumerate() {
        let fx = Fixture::file();
        let store = fx.store();
        let canary = fx.canary();
        let planted = Planted::default()
            .inode(900, FileKind::Dir, 0o755, 0, 0)
            .entry(ROOT_INO, b"a", 900, FileKind::Dir)
            .entry(900, b"again", back_to, FileKind::Dir);
        fx.plant_batch(&store, planted);
        let target = fx.dir.path().join("copy");
        let err = fx.restore(&format!("reader-{i}"), store, &target, false).expect_err("a cycle was restored");
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("already in the tree"), "{err}");
        assert!(!target.join("a/again/a").exists(), "the cycle was followed");
        assert_empty(&canary);
    }
}

/// A setuid-root file and a device node from the store: an unprivileged restore makes the file
/// without its setuid bit and owner and leaves the device out, counting both. As root with
/// `privileged` (`--same-owner`) they are made as stored, beneath the target only.
#[test]
fn setuid_files_and_devices_from_a_store_need_same_owner() {
    let fx = Fixture::file();
    let store = fx.store();
    let null = (1 << 8) | 3; // 1:3, /dev/null's number in the kernel's old encoding
    let planted = Planted::default()
        .inode(900, FileKind::File, 0o4755, 0, 0)
        .entry(ROOT_INO, b"suid", 900, FileKind::File)
        .inode(901, FileKind::CharDev, 0o666, 0, null)
        .entry(ROOT_INO, b"dev", 901, FileKind::CharDev);
    fx.plant_batch(&store, planted);
    let target = fx.dir.path().join("copy");
    let written = fx.restore("reader", store.clone(), &target, false).expect("restore");
    assert_eq!(written.left_out.setid_bits, 1, "{written:?}");
    assert_eq!(written.left_out.devices, 1, "{written:?}");
    let mode = std::fs::metadata(target.join("suid")).expect("the file").permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7000, 0, "the setuid bit was restored");
    assert!(!target.join("dev").exists(), "a device node was made");
    if rustix::process::geteuid().is_root() {
        let target = fx.dir.path().join("copy-as-root");
        let written = fx.restore("reader-root", store, &target, true).expect("restore --same-owner");
        assert!(written.left_out.is_empty(), "{written:?}");
        let mode = std::fs::metadata(target.join("suid")).expect("the file").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777, 0o4755);
        let dev = std::fs::symlink_metadata(target.join("dev")).expect("the device");
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(&dev.file_type()));
    }
}

/// On a real S3 server: a traversal name planted at the next segment's key is refused as on
/// `file://` (the batch is appended with the library's own conditional create).
#[test]
fn on_s3_a_traversal_name_is_refused_and_nothing_is_written() {
    let bucket = "hostile-names";
    let (_server, fx) = Fixture::on_moto(bucket);
    let store = fx.store();
    let canary = fx.canary();
    let key = fx.next_segment_key(&store);
    let n = u64::from_str_radix(key.rsplit('/').next().expect("a number"), 16).expect("hex");
    let escape = format!("../{}/escaped", canary.file_name().and_then(|n| n.to_str()).expect("a name"));
    let planted = Planted::default().inode(900, FileKind::File, 0o644, 0, 0).entry(
        ROOT_INO,
        escape.as_bytes(),
        900,
        FileKind::File,
    );
    let ws = Workspace::new(store.clone(), "default");
    let appended = fx
        .rt
        .block_on(ws.append_segment(
            n,
            "hostile",
            "hostile:1",
            &[JournalBatch { seq: PLANTED_SEQ, ops: planted.0, unix_ms: 1_700_000_000_000 }],
        ))
        .expect("append");
    assert!(appended, "the planted segment was created");
    let target = fx.dir.path().join("copy");
    let err = fx.restore("reader", store, &target, false).expect_err("a traversal name was restored");
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert_empty(&target);
    assert_empty(&canary);
}
