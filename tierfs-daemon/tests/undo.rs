//! Undo to the second, through the `tierfs` binary, a real FUSE mount and a `file://` store
//! (and the same on moto):
//! three phases of writes a little over a second apart, then `rm -rf` and an overwrite;
//! `tierfs restore --at` each phase boundary gives exactly that phase's tree, a time whose data
//! never reached the store lists the file as incomplete, times the store cannot rebuild are
//! refused with their kind and change nothing, and `tierfs snapshots --timeline` shows the
//! points (docs/SEMANTICS.md, "Point-in-time restore").

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::time::{Duration, Instant};

use common::{manifest, run};
use store_node::{Node, env};

fn bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The time of day now, RFC 3339 with milliseconds, taken between two pauses so that no
/// change of the phases on either side is stamped within a second of it.
fn boundary() -> String {
    std::thread::sleep(Duration::from_millis(1100));
    let t = tierfs::remote::rfc3339_ms(tierfs::meta::system_unix_ms());
    std::thread::sleep(Duration::from_millis(1100));
    t
}

fn flush(node: &Node) {
    let mut cmd = env(node.fx.tierfs());
    cmd.arg("flush").arg(&node.fx.mountpoint);
    run(&mut cmd, Duration::from_secs(120)).assert_success("tierfs flush");
}

/// Waits until every metadata change of the mount is in the store (its data need not be).
fn metadata_in_store(node: &Node) {
    let started = Instant::now();
    loop {
        let status = node.fx.status();
        let r = &status["remote"];
        if r["pending_batches"] == 0 && r["durable_seq"] == r["last_seq"] {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the journal did not reach the store: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn restore_at_each_phase_boundary_gives_that_phase_and_names_what_never_reached_the_store() {
    undo_to_the_second(Node::init_file());
}

#[test]
fn restore_at_each_phase_boundary_on_moto() {
    let servers = moto::MotoServer::start_many(1, "tierfs-undo");
    undo_to_the_second(Node::init(&servers, "tierfs-undo", "undo"));
}

/// The phases, the restores, the refusals, the timeline and gc's window on `a`'s store.
fn undo_to_the_second(mut a: Node) {
    let store = a.store_file.display().to_string();
    // Data is uploaded when flushed, synced or unmounted: the last phase leaves some behind.
    a.mount(&["--dirty-age", "3600"]);
    let m = a.fx.mountpoint.clone();
    let mut phases: Vec<(String, BTreeMap<String, String>)> = Vec::new();

    // Phase 1.
    fs::create_dir(m.join("outputs")).expect("mkdir");
    fs::write(m.join("outputs/a.txt"), b"first output").expect("write");
    fs::write(m.join("outputs/model.bin"), bytes(1, (5 << 20) + 17)).expect("write");
    fs::write(m.join("notes.txt"), b"notes, version one").expect("write");
    flush(&a);
    phases.push((boundary(), manifest(&m)));

    // Phase 2, ending in a sync.
    fs::write(m.join("outputs/b.txt"), b"second output").expect("write");
    fs::write(m.join("notes.txt"), b"notes, version two is longer").expect("write");
    fs::write(m.join("checkpoint.pt"), bytes(3, 300_000)).expect("write");
    a.sync("phase 2").assert_success("tierfs sync");
    phases.push((boundary(), manifest(&m)));

    // Phase 3: `rm -rf outputs` and last night's checkpoint overwritten.
    fs::remove_dir_all(m.join("outputs")).expect("rm -rf");
    fs::write(m.join("checkpoint.pt"), bytes(4, 100_000)).expect("overwrite");
    flush(&a);
    phases.push((boundary(), manifest(&m)));

    // A file whose metadata reaches the store but whose data does not before `late`: it
    // stays open (a close uploads at once; an open file waits for --dirty-age).
    let mut open_file = fs::File::create(m.join("late.bin")).expect("create");
    open_file.write_all(&bytes(5, 200_000)).expect("write");
    metadata_in_store(&a);
    let late = boundary();
    drop(open_file);
    a.fx.umount();

    assert!(phases[0].1.contains_key("outputs/model.bin") && !phases[2].1.contains_key("outputs"));
    for (i, (at, want)) in phases.iter().enumerate() {
        let dir = a.fx.tmp.path().join(format!("at-{i}"));
        let (out, report) = a.tierfs_json(&["restore", "--store", &store, "--at", at, dir.to_str().expect("utf-8")]);
        out.assert_success(&format!("tierfs restore --at {at}"));
        assert_eq!(&manifest(&dir), want, "restore --at {at} (boundary {i}) differs: {report}");
        assert_eq!(report["at"]["incomplete"], serde_json::json!([]), "{report}");
    }

    // At `late`, late.bin's data had not reached the store: restored as the store had it
    // (nothing), and listed.
    let dir = a.fx.tmp.path().join("at-late");
    let (out, report) = a.tierfs_json(&["restore", "--store", &store, "--at", &late, dir.to_str().expect("utf-8")]);
    out.assert_success("tierfs restore --at late");
    assert_eq!(report["at"]["incomplete"], serde_json::json!(["late.bin"]), "{report}");
    let mut want = phases[2].1.clone();
    want.insert("late.bin".into(), manifest_of_empty_file(&a));
    assert_eq!(manifest(&dir), want);
    // And the text summary names it too.
    let dir = a.fx.tmp.path().join("at-late-text");
    let mut cmd = env(a.fx.tierfs());
    cmd.args(["restore", "--store", &store, "--at", &late]).arg(&dir);
    let out = run(&mut cmd, Duration::from_secs(120));
    out.assert_success("tierfs restore --at late (text)");
    assert!(out.stdout.contains("incomplete: 1 files") && out.stdout.contains("  late.bin"), "{}", out.stdout);

    // Times the store cannot rebuild: one line, a kind, and no target made.
    for (at, kind) in [("2001-01-01T00:00:00Z", "not_found"), ("2999-01-01T00:00:00Z", "invalid_input")] {
        let dir = a.fx.tmp.path().join("refused");
        let (out, json) = a.tierfs_json(&["restore", "--store", &store, "--at", at, dir.to_str().expect("utf-8")]);
        assert!(!out.success(), "restore --at {at} succeeded");
        assert_eq!(json["kind"], kind, "{json}");
        assert!(!dir.exists(), "a refused restore made its target");
    }

    // The timeline: the start of the journal, the sync, and the journal's span.
    let (out, t) = a.tierfs_json(&["snapshots", "--timeline", "--store", &store]);
    out.assert_success("tierfs snapshots --timeline");
    let points = t["points"].as_array().expect("points");
    assert_eq!(points.first().map(|p| p["kind"].clone()), Some(serde_json::json!("start")), "{t}");
    assert!(points.iter().any(|p| p["kind"] == "sync" && p["message"] == "phase 2"), "{t}");
    assert!(t["journal"]["to_unix_ms"].as_u64() >= t["journal"]["from_unix_ms"].as_u64(), "{t}");
    let mut cmd = env(a.fx.tierfs());
    cmd.args(["snapshots", "--timeline", "--store", &store]);
    let out = run(&mut cmd, Duration::from_secs(60));
    out.assert_success("tierfs snapshots --timeline (text)");
    assert!(out.stdout.contains("phase 2") && out.stdout.contains("restorable from"), "{}", out.stdout);

    // forget --keep-within keeps the sync of a moment ago.
    let (out, forgot) = a.tierfs_json(&["forget", "--store", &store, "--keep-within", "1h", "--dry-run"]);
    out.assert_success("tierfs forget --keep-within");
    assert_eq!(
        (forgot["kept"].as_array().map(Vec::len), forgot["removed"].as_array().map(Vec::len)),
        (Some(1), Some(0))
    );

    // gc with its default window keeps what the first phase needs, data included; without a
    // window it frees it, and that time is refused.
    let (out, report) = a.tierfs_json(&["gc", "--store", &store]);
    out.assert_success("tierfs gc");
    assert!(report["journal_segments_kept"].as_u64() > Some(0), "{report}");
    let dir = a.fx.tmp.path().join("after-gc");
    let (out, _) = a.tierfs_json(&["restore", "--store", &store, "--at", &phases[0].0, dir.to_str().expect("utf-8")]);
    out.assert_success("tierfs restore --at phase 1 after gc");
    assert_eq!(manifest(&dir), phases[0].1, "gc lost what a restore inside the window reads");
    let (out, report) = a.tierfs_json(&["gc", "--store", &store, "--keep-within", "0"]);
    out.assert_success("tierfs gc --keep-within 0");
    assert!(report["journal_segments_deleted"].as_u64() > Some(0), "{report}");
    let dir = a.fx.tmp.path().join("after-gc-0");
    let (out, json) =
        a.tierfs_json(&["restore", "--store", &store, "--at", &phases[0].0, dir.to_str().expect("utf-8")]);
    assert!(!out.success() && json["kind"] == "not_found", "{json}");
}

/// How [`manifest`] shows an empty regular file.
fn manifest_of_empty_file(node: &Node) -> String {
    let p = node.fx.tmp.path().join("empty-probe");
    fs::write(&p, b"").expect("write");
    let m = fs::metadata(&p).expect("stat");
    let (kind, body) = common::kind_and_body(&p, &m);
    format!("{kind} {body}")
}
