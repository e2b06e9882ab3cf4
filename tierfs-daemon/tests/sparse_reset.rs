//! Sparse files survive a runtime reset with their size, their bytes and their holes, on a
//! `file://` store and on a real S3 server (moto on loopback), whether the last writer synced
//! (`tierfs sync`, then a clean unmount) or only fsynced each file and was killed (`kill -9`,
//! the RPO path). A chunk that was never written is a hole, not data that never reached the
//! store: before the fix, a file with a whole-chunk hole ahead of its data came back cut.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use moto::MotoServer;
use store_node::Node;

const MIB: u64 = 1 << 20;
const BUCKET: &str = "tierfs-sparse";

/// One file of the table: what is written, in order, and what it must read as afterwards.
struct Case {
    name: &'static str,
    /// `(offset, bytes)` written in order; a `None` body is a truncate to that offset.
    ops: Vec<(u64, Option<Vec<u8>>)>,
}

impl Case {
    /// The bytes that are data (everything else up to the size reads as zeros), and the size.
    fn expected(&self) -> (Vec<(u64, Vec<u8>)>, u64) {
        let mut size = 0;
        let mut data: Vec<(u64, Vec<u8>)> = Vec::new();
        for (off, body) in &self.ops {
            match body {
                Some(b) => {
                    data.push((*off, b.clone()));
                    size = size.max(off + b.len() as u64);
                }
                None => {
                    size = *off;
                    data.retain(|(o, _)| *o < size);
                    for (o, b) in &mut data {
                        b.truncate((size - *o).min(b.len() as u64) as usize);
                    }
                }
            }
        }
        (data, size)
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// The table of the issue, plus a file with data on both sides of holes and a hole at its end.
fn cases() -> Vec<Case> {
    vec![
        Case { name: "at-1g", ops: vec![(1 << 30, Some(b"end".to_vec()))] },
        Case { name: "at-8m", ops: vec![(8 * MIB, Some(b"end".to_vec()))] },
        Case { name: "at-5m", ops: vec![(5 * MIB, Some(b"end".to_vec()))] },
        Case { name: "at-1m", ops: vec![(MIB, Some(b"end".to_vec()))] },
        Case { name: "head-and-z", ops: vec![(0, Some(pattern(1, 100))), (9 * MIB, Some(b"z".to_vec()))] },
        Case { name: "head-truncated-up", ops: vec![(0, Some(pattern(2, 100))), (9 * MIB, None)] },
        Case {
            name: "islands",
            ops: vec![
                (0, Some(pattern(3, (5 * MIB) as usize))),
                (20 * MIB + 7, Some(pattern(4, MIB as usize))),
                (40 * MIB, None),
            ],
        },
    ]
}

fn write_case(root: &Path, case: &Case, fsync: bool) {
    let f = fs::File::create(root.join(case.name)).expect("create");
    for (off, body) in &case.ops {
        match body {
            Some(b) => f.write_all_at(b, *off).expect("pwrite"),
            None => f.set_len(*off).expect("truncate"),
        }
    }
    if fsync {
        f.sync_all().expect("fsync");
    }
}

/// Size, bytes and zeros of every case under `root`; `sparse` also checks that the holes are
/// holes (few allocated blocks, SEEK_DATA skips them).
fn check_cases(root: &Path, sparse: bool, when: &str) {
    for case in cases() {
        let path = root.join(case.name);
        let (data, size) = case.expected();
        let m = fs::metadata(&path).unwrap_or_else(|e| panic!("{when}: {}: {e}", case.name));
        assert_eq!(m.len(), size, "{when}: {} has the wrong size", case.name);
        let data_bytes: u64 = data.iter().map(|(_, b)| b.len() as u64).sum();
        if sparse {
            // Each piece of data comes back as its pages (and the file system's own slack);
            // holes, even inside its chunks, bring nothing.
            let ceiling = data.len() as u64 * 64 * 1024 + data_bytes;
            assert!(
                m.blocks() * 512 <= ceiling,
                "{when}: {} allocates {} bytes for {data_bytes} bytes of data: its holes came back filled",
                case.name,
                m.blocks() * 512
            );
        }
        let f = fs::File::open(&path).expect("open");
        for (off, want) in &data {
            let mut got = vec![0u8; want.len()];
            f.read_exact_at(&mut got, *off).unwrap_or_else(|e| panic!("{when}: {} at {off}: {e}", case.name));
            assert!(got == *want, "{when}: {} differs at {off}", case.name);
        }
        // Zeros: just before and after each piece, in the middle of each gap, and at the end.
        let mut probes = vec![size.saturating_sub(1)];
        let mut end_prev = 0;
        for (off, b) in &data {
            if *off > end_prev {
                probes.extend([end_prev, (end_prev + off) / 2, off - 1]);
            }
            end_prev = off + b.len() as u64;
        }
        if end_prev < size {
            probes.extend([end_prev, (end_prev + size) / 2]);
        }
        for p in probes {
            if data.iter().any(|(o, b)| p >= *o && p < o + b.len() as u64) {
                continue;
            }
            let mut byte = [0xffu8];
            f.read_exact_at(&mut byte, p).unwrap_or_else(|e| panic!("{when}: {} at {p}: {e}", case.name));
            assert_eq!(byte[0], 0, "{when}: {} has a non-zero byte at {p}, a hole", case.name);
        }
        if sparse && data.first().is_some_and(|(o, _)| *o >= 4 * MIB) {
            // SAFETY: lseek(2) on an open descriptor.
            let at = unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_DATA) };
            assert!(at as u64 >= data[0].0 - 4 * MIB, "{when}: {} has data at {at}, in its leading hole", case.name);
        }
    }
}

/// Writes the cases on a new node of `a`'s store, makes them durable the way `how` says,
/// loses the node, and checks them on a fresh one (and in a `tierfs restore` copy).
fn survives_a_reset(mut a: Node, how: &str) {
    a.mount(&[]);
    let fsync = how == "fsync";
    for case in cases() {
        write_case(&a.fx.mountpoint, &case, fsync);
    }
    check_cases(&a.fx.mountpoint, false, "before the reset");
    if fsync {
        // The RPO path: fsync returned, then the node died with its disk.
        a.kill9();
    } else {
        a.sync("sparse").assert_success("tierfs sync");
        a.fx.umount();
    }
    a.wipe_local_state();

    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let log = b.daemon_log();
    assert!(!log.contains("cut back"), "the restore cut files back:\n{log}");
    check_cases(&b.fx.mountpoint, true, &format!("after a reset ({how})"));
    // Read once, the data is cached: written back as its pages, the zeros left holes.
    check_cases(&b.fx.mountpoint, true, &format!("read again after a reset ({how})"));
    b.fx.umount();

    let copy = b.fx.tmp.path().join("copy");
    let (out, _) =
        b.tierfs_json(&["restore", "--store", &a.store_file.display().to_string(), &copy.display().to_string()]);
    out.assert_success("tierfs restore");
    check_cases(&copy, true, &format!("in a restored copy ({how})"));
}

#[test]
fn sparse_files_survive_a_reset_after_sync_on_a_file_store() {
    survives_a_reset(Node::init_file(), "sync");
}

#[test]
fn sparse_files_survive_a_reset_after_fsync_on_a_file_store() {
    survives_a_reset(Node::init_file(), "fsync");
}

#[test]
fn sparse_files_survive_a_reset_after_sync_on_s3() {
    let servers = MotoServer::start_many(1, BUCKET);
    survives_a_reset(Node::init(&servers, BUCKET, "sync"), "sync");
}

#[test]
fn sparse_files_survive_a_reset_after_fsync_on_s3() {
    let servers = MotoServer::start_many(1, BUCKET);
    survives_a_reset(Node::init(&servers, BUCKET, "fsync"), "fsync");
}
