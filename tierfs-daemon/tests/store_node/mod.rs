//! A node of a store-backed workspace for integration tests: its own data dir, mountpoint and
//! runtime dir (a [`Fixture`]) on a store file shared with other nodes, plus the moto
//! credentials and test passphrase every `tierfs` command needs.
//!
//! Included by the test binaries that declare `mod common;` and `use tierfs_test_support::moto;` themselves.
#![allow(dead_code)] // each test binary uses its own subset of the helpers

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{self, Fixture, Output, run};
use crate::moto::MotoServer;

pub const PASSPHRASE: &str = "reset-proof passphrase";

/// `cmd` with moto's credentials, the passphrase and fast key derivation.
pub fn env(mut cmd: Command) -> Command {
    for (k, v) in MotoServer::env() {
        cmd.env(k, v);
    }
    cmd.env("TIERFS_PASSPHRASE", PASSPHRASE).env("TIERFS_TEST_FAST_KDF", "test");
    cmd
}

pub struct Node {
    pub fx: Fixture,
    pub store_file: PathBuf,
}

impl Node {
    /// A fresh node (nothing local) on an existing store.
    pub fn new(store_file: &Path) -> Node {
        Node { fx: Fixture::new(), store_file: store_file.to_path_buf() }
    }

    /// A node that creates a store on `servers` (bucket `bucket`, prefix `prefix`).
    pub fn init(servers: &[MotoServer], bucket: &str, prefix: &str) -> Node {
        Node::init_with(servers, bucket, prefix, &[])
    }

    /// [`Node::init`] with extra `tierfs init` options.
    pub fn init_with(servers: &[MotoServer], bucket: &str, prefix: &str, extra: &[&str]) -> Node {
        let urls: Vec<String> = servers.iter().map(|s| s.url(bucket, prefix)).collect();
        Node::init_backends(&urls, extra)
    }

    /// A node that creates a store with one `file://` backend in its own temporary directory.
    pub fn init_file() -> Node {
        let fx = Fixture::new();
        let url = format!("file://{}", fx.tmp.path().join("backend").display());
        Node::init_in(fx, &[url], &[])
    }

    /// A node that creates a store on the backends `urls`, with extra `tierfs init` options.
    pub fn init_backends(urls: &[String], extra: &[&str]) -> Node {
        Node::init_in(Fixture::new(), urls, extra)
    }

    fn init_in(fx: Fixture, urls: &[String], extra: &[&str]) -> Node {
        let store_file = fx.tmp.path().join("store.toml");
        let mut cmd = env(fx.tierfs());
        cmd.args(["init", "--store"]).arg(&store_file).args(extra);
        for url in urls {
            cmd.args(["--backend", url]);
        }
        run(&mut cmd, Duration::from_secs(60)).assert_success("tierfs init");
        Node { fx, store_file }
    }

    /// `tierfs --json mount --store … MOUNTPOINT`; on success the daemon's pid is kept.
    pub fn try_mount(&mut self, extra: &[&str]) -> Output {
        let mut cmd = env(self.fx.tierfs());
        cmd.args(["--json", "mount", "--store"]).arg(&self.store_file);
        if !extra.contains(&"--cache-size") {
            cmd.args(["--cache-size", "1G"]);
        }
        cmd.arg("--data-dir").arg(&self.fx.data_dir).args(extra).arg(&self.fx.mountpoint);
        let out = run(&mut cmd, common::MOUNT_TIMEOUT);
        if out.success() {
            let json: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("mount --json");
            self.fx.daemon_pid = json["pid"].as_u64().map(|p| p as u32);
            assert!(self.fx.daemon_pid.is_some(), "no pid in {json}");
        }
        out
    }

    pub fn mount(&mut self, extra: &[&str]) {
        self.try_mount(extra).assert_success("tierfs mount --store");
    }

    /// A `tierfs --json ARGS…` command of this node, run to completion.
    pub fn tierfs_json(&self, args: &[&str]) -> (Output, serde_json::Value) {
        let mut cmd = env(self.fx.tierfs());
        cmd.arg("--json").args(args);
        let out = run(&mut cmd, Duration::from_secs(180));
        let json = serde_json::from_str(out.stdout.trim()).unwrap_or(serde_json::Value::Null);
        (out, json)
    }

    /// `tierfs sync -m MESSAGE MOUNTPOINT`.
    pub fn sync(&self, message: &str) -> Output {
        let mut cmd = env(self.fx.tierfs());
        cmd.args(["sync", "-m", message]).arg(&self.fx.mountpoint);
        run(&mut cmd, Duration::from_secs(120))
    }

    /// `kill -9` of the background daemon, then the dead mount is detached.
    pub fn kill9(&mut self) {
        let pid = self.fx.daemon_pid.take().expect("a daemon");
        // SAFETY: kill(2) with a pid we started.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) }, 0);
        for _ in 0..200 {
            if !common::process_alive(pid) {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert!(!common::process_alive(pid), "daemon {pid} survived SIGKILL");
        if common::is_mounted(&self.fx.mountpoint) {
            common::fusermount_lazy(&self.fx.mountpoint).assert_success("fusermount3 -u -z");
        }
    }

    /// The daemon's log (it lives in the data dir).
    pub fn daemon_log(&self) -> String {
        let path = self.fx.data_dir.join("daemon.log");
        fs::read_to_string(&path).unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
    }

    /// The runtime reset: every local file of tierfs is gone.
    pub fn wipe_local_state(&self) {
        fs::remove_dir_all(&self.fx.data_dir).expect("removing the data dir");
    }
}
