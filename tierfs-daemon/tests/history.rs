//! The history of code and configs, on a real mount with a real S3 server (moto on
//! loopback): three syncs record what changed (a notebook's outputs-only edit records
//! nothing), `log`, `diff -p` and `show` read it, `checkout` puts an old version back through
//! the mount and the next sync records it, bad input is refused with nothing changed, `history
//! push` reaches a `file://` remote that `git` clones, a remote that has other commits refuses
//! the push, and after a runtime reset a fresh node shows the same history.

mod common;
use tierfs_test_support::moto;
mod store_node;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Output, run};
use moto::MotoServer;
use store_node::Node;

const BUCKET: &str = "tierfs-history";

fn notebook(source: &str, output: &str, count: u32) -> String {
    format!(
        r#"{{
 "cells": [
  {{
   "cell_type": "code",
   "execution_count": {count},
   "id": "c1",
   "metadata": {{"scrolled": true}},
   "outputs": [{{"name": "stdout", "output_type": "stream", "text": ["{output}\n"]}}],
   "source": ["{source}"]
  }}
 ],
 "metadata": {{"kernelspec": {{"display_name": "Python 3", "name": "python3"}}}},
 "nbformat": 4,
 "nbformat_minor": 5
}}
"#
    )
}

/// `tierfs --json ARGS` of `node`, run in `cwd`.
fn json_in(node: &Node, cwd: &Path, args: &[&str]) -> (Output, serde_json::Value) {
    let mut cmd = store_node::env(node.fx.tierfs());
    cmd.current_dir(cwd).arg("--json").args(args);
    let out = run(&mut cmd, Duration::from_secs(180));
    let json = serde_json::from_str(out.stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out, json)
}

fn tierfs_in(node: &Node, cwd: &Path, args: &[&str]) -> Output {
    let mut cmd = store_node::env(node.fx.tierfs());
    cmd.current_dir(cwd).args(args);
    run(&mut cmd, Duration::from_secs(180))
}

/// `tierfs --json sync -m MESSAGE`: the snapshot id and the history commit (`None`: no change).
fn sync(node: &Node, message: &str) -> (String, Option<String>) {
    let (out, json) = node.tierfs_json(&["sync", "-m", message, node.fx.mountpoint.to_str().expect("utf-8 path")]);
    out.assert_success("tierfs sync");
    assert!(json["history_error"].is_null(), "{json}");
    let commit = json["history"]["commit"].as_str().map(str::to_string);
    (json["snapshot"].as_str().expect("a snapshot id").to_string(), commit)
}

/// The `(summary, change)` of each entry of `tierfs log PATH`.
fn log_of(node: &Node, path: &str) -> Vec<(String, String)> {
    let (out, json) = json_in(node, &node.fx.mountpoint, &["log", path]);
    out.assert_success("tierfs log");
    json.as_array()
        .expect("a list")
        .iter()
        .map(|e| (e["summary"].as_str().expect("a string").to_string(), e["change"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn assert_failure(out: &Output, json: &serde_json::Value, kind: &str, words: &str) {
    assert!(!out.success(), "should fail: {}", out.stdout);
    assert_eq!(json["kind"], kind, "{json}");
    let error = json["error"].as_str().unwrap_or_default();
    assert!(error.contains(words), "{words:?} not in {error:?}");
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().expect("running git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn git_subjects(repo: &Path) -> Vec<String> {
    git(repo, &["log", "--format=%s", "main"]).lines().map(str::to_string).collect()
}

#[test]
fn history_records_reads_checks_out_pushes_and_survives_a_reset() {
    common::require_fuse();
    let servers = MotoServer::start_many(1, BUCKET);
    let mut a = Node::init(&servers, BUCKET, "hist");
    a.mount(&[]);
    let m = a.fx.mountpoint.clone();
    fs::create_dir_all(m.join("conf")).expect("mkdir");
    fs::create_dir_all(m.join("proj/.git")).expect("mkdir");
    fs::write(m.join("train.py"), "lr = 0.1\nprint(lr)\n").expect("write");
    fs::write(m.join("conf/model.yaml"), "layers: 4\nlr: 0.1\n").expect("write");
    fs::write(m.join("nb.ipynb"), notebook("print(1)", "1", 1)).expect("write");
    fs::write(m.join("weights.bin"), vec![7u8; 4096]).expect("write");
    fs::write(m.join("big.json"), vec![b' '; 2 << 20]).expect("write");
    fs::write(m.join(".gitignore"), "scratch.py\n").expect("write");
    fs::write(m.join("scratch.py"), "tmp\n").expect("write");
    fs::write(m.join("proj/.git/description.txt"), "a user's own repository\n").expect("write");

    // 1. Three syncs: a .py and the notebook's source, then the .yaml and the notebook's
    // outputs only.
    let (snap1, c1) = sync(&a, "first");
    assert!(c1.is_some(), "the first sync records the files");
    fs::write(m.join("train.py"), "lr = 0.01\nprint(lr)\n").expect("write");
    fs::write(m.join("nb.ipynb"), notebook("print(2)", "2", 2)).expect("write");
    let (_, c2) = sync(&a, "second");
    assert!(c2.is_some());
    fs::write(m.join("conf/model.yaml"), "layers: 4\nlr: 0.01\n").expect("write");
    fs::write(m.join("nb.ipynb"), notebook("print(2)", "two, rerun", 9)).expect("write");
    let (_, c3) = sync(&a, "third");
    assert!(c3.is_some());
    let (_, c4) = sync(&a, "nothing changed");
    assert_eq!(c4, None, "a sync with the same tree makes no commit");

    assert_eq!(log_of(&a, "train.py"), [("second".into(), "modified".into()), ("first".into(), "added".into())]);
    assert_eq!(log_of(&a, "nb.ipynb"), [("second".into(), "modified".into()), ("first".into(), "added".into())]);
    assert_eq!(log_of(&a, "conf/model.yaml"), [("third".into(), "modified".into()), ("first".into(), "added".into())]);
    // A path through the mount names the same file, from anywhere.
    let (out, json) = json_in(&a, a.fx.tmp.path(), &["log", m.join("conf/model.yaml").to_str().expect("utf-8 path")]);
    out.assert_success("tierfs log MOUNT/PATH");
    assert_eq!(json.as_array().expect("an array").len(), 2, "{json}");

    let diff = tierfs_in(&a, &m, &["diff", "-p", "HEAD~1", "HEAD", "--", "conf/model.yaml"]);
    diff.assert_success("tierfs diff -p");
    assert!(diff.stdout.contains("-lr: 0.1\n") && diff.stdout.contains("+lr: 0.01\n"), "{}", diff.stdout);
    assert!(!diff.stdout.contains("nb.ipynb"), "only the path asked for: {}", diff.stdout);
    let whole = tierfs_in(&a, &m, &["diff", "-p", &snap1, "HEAD"]);
    whole.assert_success("tierfs diff -p SNAPSHOT HEAD");
    assert!(whole.stdout.contains("+lr = 0.01") && whole.stdout.contains("print(2)"), "{}", whole.stdout);
    assert!(!whole.stdout.contains("rerun"), "outputs are not in the history: {}", whole.stdout);

    let old = tierfs_in(&a, &m, &["show", &format!("{snap1}:train.py")]);
    old.assert_success("tierfs show SNAPSHOT:PATH");
    assert_eq!(old.stdout, "lr = 0.1\nprint(lr)\n");
    let pointer = tierfs_in(&a, &m, &["show", "HEAD:big.json"]);
    pointer.assert_success("tierfs show of a pointer");
    assert!(pointer.stdout.starts_with("tierfs pointer v1\nsize 2097152\n"), "{}", pointer.stdout);

    // What the history leaves out.
    for path in ["weights.bin", "scratch.py", "proj/.git/description.txt"] {
        let (out, json) = json_in(&a, &m, &["show", &format!("HEAD:{path}")]);
        assert_failure(&out, &json, "not_found", "is not in the history");
    }

    // 2. Bad input changes nothing.
    let (out, json) = json_in(&a, &m, &["show", "no-such-rev:train.py"]);
    assert_failure(&out, &json, "not_found", "unknown revision");
    let (out, json) = json_in(&a, &m, &["log", "missing.py"]);
    assert_failure(&out, &json, "not_found", "missing.py");
    let (out, json) = json_in(&a, &m, &["checkout", "no-such-rev", "--", "train.py"]);
    assert_failure(&out, &json, "not_found", "unknown revision");
    let (out, json) = json_in(&a, &m, &["checkout", "HEAD", "--", "train.py", "weights.bin"]);
    assert_failure(&out, &json, "not_found", "weights.bin");
    assert_eq!(fs::read_to_string(m.join("train.py")).expect("read"), "lr = 0.01\nprint(lr)\n", "nothing was written");
    let nowhere = a.fx.tmp.path().join("no-such-dir/remote.git");
    let (out, json) = json_in(&a, &m, &["history", "push", nowhere.to_str().expect("utf-8 path")]);
    assert!(!out.success() && json["error"].as_str().unwrap_or_default().contains("pushing the history"), "{json}");

    // 3. Checkout puts the old version back through the mount; the next sync records it.
    tierfs_in(&a, &m, &["checkout", "HEAD~2", "--", "train.py"]).assert_success("tierfs checkout");
    assert_eq!(fs::read_to_string(m.join("train.py")).expect("read"), "lr = 0.1\nprint(lr)\n");
    let (_, c5) = sync(&a, "back to 0.1");
    assert!(c5.is_some());
    assert_eq!(log_of(&a, "train.py")[0], ("back to 0.1".into(), "modified".into()));

    // 4. Push to a file:// remote; `git` clones it and sees the same commits.
    let remote = a.fx.tmp.path().join("remote.git");
    git(a.fx.tmp.path(), &["init", "--bare", "-q", "-b", "main", remote.to_str().expect("utf-8 path")]);
    let url = format!("file://{}", remote.display());
    let (out, json) = json_in(&a, &m, &["history", "push", &url]);
    out.assert_success("tierfs history push");
    assert_eq!(json["commits"], 4, "{json}");
    let clone = a.fx.tmp.path().join("clone");
    git(a.fx.tmp.path(), &["clone", "-q", remote.to_str().expect("utf-8 path"), clone.to_str().expect("utf-8 path")]);
    assert_eq!(git_subjects(&clone), ["back to 0.1", "third", "second", "first"]);
    assert_eq!(fs::read_to_string(clone.join("conf/model.yaml")).expect("read"), "layers: 4\nlr: 0.01\n");
    let stripped = fs::read_to_string(clone.join("nb.ipynb")).expect("read");
    assert!(
        stripped.contains("print(2)") && !stripped.contains("rerun") && !stripped.contains("scrolled"),
        "{stripped}"
    );

    // A remote whose main has other commits refuses, and keeps them.
    let other = a.fx.tmp.path().join("other.git");
    git(a.fx.tmp.path(), &["init", "--bare", "-q", "-b", "main", other.to_str().expect("utf-8 path")]);
    let work = a.fx.tmp.path().join("work");
    git(a.fx.tmp.path(), &["init", "-q", "-b", "main", work.to_str().expect("utf-8 path")]);
    fs::write(work.join("README.md"), "someone else's\n").expect("write");
    git(&work, &["add", "README.md"]);
    git(&work, &["-c", "user.name=x", "-c", "user.email=x@example.org", "commit", "-q", "-m", "theirs"]);
    git(&work, &["push", "-q", other.to_str().expect("utf-8 path"), "main"]);
    let (out, json) = json_in(&a, &m, &["history", "push", other.to_str().expect("utf-8 path")]);
    assert_failure(&out, &json, "conflict", "refused");
    assert_eq!(git_subjects(&other), ["theirs"]);

    // 5. The reset: a fresh node on the same store shows the same history.
    let (_, before) = json_in(&a, &m, &["log"]);
    a.fx.umount();
    a.wipe_local_state();
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    let (out, after) = json_in(&b, &b.fx.mountpoint, &["log"]);
    out.assert_success("tierfs log after the reset");
    assert_eq!(after, before, "the same commits come back");
    let exported = b.fx.tmp.path().join("exported");
    let (out, _) = json_in(&b, &b.fx.mountpoint, &["history", "export", exported.to_str().expect("utf-8 path")]);
    out.assert_success("tierfs history export");
    assert_eq!(git_subjects(&exported), ["back to 0.1", "third", "second", "first"]);
    assert_eq!(fs::read_to_string(exported.join("train.py")).expect("read"), "lr = 0.1\nprint(lr)\n");
    // The next sync on the new node extends the same history.
    fs::write(b.fx.mountpoint.join("train.py"), "lr = 0.05\n").expect("write");
    let (_, c6) = sync(&b, "after the reset");
    assert!(c6.is_some());
    assert_eq!(log_of(&b, "train.py").len(), 4);
    b.fx.umount();
}
