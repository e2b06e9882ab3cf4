//! Data files and their loss. A data file removed from the data directory behind tierfs's
//! back (a partly wiped scratch disk, a careless cleanup): reading the file is an error that
//! names the loss, never a file of zeros, and the file can still be deleted or truncated and
//! used again. With a store, bytes the store has are fetched back instead. The other way
//! round: the data file of a deleted or replaced file goes away (removed just after the
//! reply), and one that cannot be removed is logged without failing the delete.

mod common;

use std::fs::{self, File};
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Fixture, data_file, write_synced};

#[test]
fn a_removed_data_file_reads_as_an_error_not_as_zeros_and_the_file_can_be_reused() {
    let mut fx = Fixture::mounted();
    let data = vec![0x5au8; 300_000];
    let ino = write_synced(&fx.p("precious"), &data);
    fx.umount();
    fs::remove_file(data_file(&fx.data_dir, ino)).expect("removing the data file behind tierfs's back");

    fx.mount();
    assert_eq!(fs::metadata(fx.p("precious")).expect("stat").len(), data.len() as u64, "the size is still known");
    let err = fs::read(fx.p("precious")).expect_err("reading a file whose bytes are gone");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let log = fs::read_to_string(fx.data_dir.join("daemon.log")).expect("daemon log");
    assert!(
        log.lines().any(|l| l.contains("WARN") && l.contains("is missing from the data directory")),
        "the daemon log does not name the loss:\n{log}"
    );

    // Truncated to 0 (O_TRUNC) it is an ordinary file again.
    let mut f = File::create(fx.p("precious")).expect("O_TRUNC reopens a file whose data file is gone");
    f.write_all(b"new contents").expect("write");
    drop(f);
    assert_eq!(fs::read(fx.p("precious")).expect("read"), b"new contents");

    // Another one: deleting it works too.
    let ino = write_synced(&fx.p("other"), b"other bytes");
    fx.umount();
    fs::remove_file(data_file(&fx.data_dir, ino)).expect("remove");
    fx.mount();
    fs::remove_file(fx.p("other")).expect("unlink of a file whose data file is gone");
    assert!(!fx.p("other").exists());
}

#[test]
fn with_a_store_a_removed_data_file_is_fetched_back_from_it() {
    let mut fx = Fixture::new();
    let store = fx.tmp.path().join("store.toml");
    let mut init = fx.tierfs();
    init.args(["init", "--store"]).arg(&store).arg("--key-file").arg(fx.tmp.path().join("store.key"));
    init.arg("--backend").arg(format!("file://{}", fx.tmp.path().join("objects").display()));
    common::run(&mut init, Duration::from_secs(60)).assert_success("tierfs init");
    fx.mount_args = vec!["--store".into(), store.to_str().expect("utf-8 path").into()];
    fx.mount();

    let data: Vec<u8> = (0..9u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let ino = write_synced(&fx.p("model.bin"), &data);
    fx.umount(); // seals and uploads everything
    fs::remove_file(data_file(&fx.data_dir, ino)).expect("removing the data file behind tierfs's back");

    fx.mount();
    let mut got = Vec::new();
    File::open(fx.p("model.bin")).and_then(|mut f| f.read_to_end(&mut got)).expect("read model.bin");
    assert!(got == data, "model.bin came back different ({} bytes)", got.len());
}

/// Waits up to 10 s for `path` to be gone.
fn gone_soon(path: &std::path::Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn deleted_and_replaced_files_leave_no_data_file_behind() {
    let fx = Fixture::mounted();
    let deleted = write_synced(&fx.p("deleted"), b"to be deleted");
    let replaced = write_synced(&fx.p("replaced"), b"to be replaced");
    let kept = write_synced(&fx.p("new"), b"replaces it");
    assert!(data_file(&fx.data_dir, deleted).exists(), "a written file has a data file");

    fs::remove_file(fx.p("deleted")).expect("unlink");
    fs::rename(fx.p("new"), fx.p("replaced")).expect("rename over a file");
    assert!(gone_soon(&data_file(&fx.data_dir, deleted)), "the unlinked file's data file stayed");
    assert!(gone_soon(&data_file(&fx.data_dir, replaced)), "the replaced file's data file stayed");
    assert!(data_file(&fx.data_dir, kept).exists(), "the renamed file lost its data file");
    assert_eq!(fs::read(fx.p("replaced")).expect("read"), b"replaces it");
}

#[test]
fn a_data_file_that_cannot_be_removed_is_logged_and_the_delete_still_succeeds() {
    let fx = Fixture::mounted();
    let ino = write_synced(&fx.p("stuck"), b"bytes");
    let path = data_file(&fx.data_dir, ino);
    // The immutable flag makes unlink fail even for root (ext4, xfs, btrfs).
    match Command::new("chattr").arg("+i").arg(&path).status() {
        Ok(st) if st.success() => {}
        other => {
            eprintln!("skipped: `chattr +i` on the data dir failed ({other:?}); needs ext4/xfs/btrfs and root");
            return;
        }
    }
    // The flag stays until the daemon has tried (it removes the data file after replying),
    // and goes in the end whatever happened, so the temporary directory can be removed.
    struct Unfreeze(std::path::PathBuf);
    impl Drop for Unfreeze {
        fn drop(&mut self) {
            let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
        }
    }
    let _unfreeze = Unfreeze(path.clone());
    fs::remove_file(fx.p("stuck")).expect("the delete succeeds: the name is gone even though its data file stays");
    assert!(!fx.p("stuck").exists(), "the name is still there");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = fs::read_to_string(fx.data_dir.join("daemon.log")).expect("daemon log");
        if log.lines().any(|l| l.contains("WARN") && l.contains("op=\"unlink\"")) {
            break;
        }
        assert!(Instant::now() < deadline, "no WARN line for the data file left behind:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(path.exists(), "the data file that could not be removed is still there");
}

#[test]
fn a_data_file_left_behind_by_a_crash_is_swept_at_the_next_mount() {
    let mut fx = Fixture::mounted();
    let ino = write_synced(&fx.p("deleted"), b"old bytes");
    let live = write_synced(&fx.p("live"), b"live bytes");
    fx.umount();
    let leftover = data_file(&fx.data_dir, ino);
    let saved = fx.tmp.path().join("saved");
    fs::copy(&leftover, &saved).expect("save the data file");
    fx.mount();
    fs::remove_file(fx.p("deleted")).expect("unlink");
    fx.umount();
    // What a crash between the unlink's commit and the data file's removal leaves behind.
    fs::copy(&saved, &leftover).expect("put the data file back");

    fx.mount();
    // The sweep logs once it is done.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = fs::read_to_string(fx.data_dir.join("daemon.log")).expect("daemon log");
        if log.contains("removed 1 data files left behind by a crash") {
            break;
        }
        assert!(Instant::now() < deadline, "no sweep reported:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!leftover.exists(), "the leftover data file was not swept");
    assert!(data_file(&fx.data_dir, live).exists(), "the sweep took a live file's data file");
    assert_eq!(fs::read(fx.p("live")).expect("read"), b"live bytes");
}
