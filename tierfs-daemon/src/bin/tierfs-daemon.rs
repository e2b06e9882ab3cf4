//! `tierfs-daemon`: serve one tierfs mount in the foreground until it is unmounted, or with
//! `node`, every mount of a node's configuration file (see `tierfs-daemon --help`).
//! Service managers run it directly; `tierfs mount` serves its background mounts from its
//! own executable under this name (`launch::daemon_executable`), or from this binary when
//! `TIERFS_DAEMON` names it.
//!
//! Exit status: 0 after a clean unmount with a complete flush, 1 on any failure (including a
//! flush that did not finish within --flush-timeout), 2 on a usage error.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use tierfs_daemon::cli::{DaemonCli, NodeCli};
use tierfs_daemon::launch::{self, Readiness};
use tierfs_daemon::node::NodeConfig;
use tierfs_daemon::notify::Notifier;
use tierfs_daemon::{frontend, logging, node, store_link};
use tracing::error;

fn main() -> ExitCode {
    // Before any thread: a long-lived process keeps no secret in its environment, and what it
    // creates is private to its user (tierfs_daemon::private).
    store_link::take_passphrase_env();
    tierfs_daemon::private::private_umask();
    if std::env::args_os().nth(1).is_some_and(|a| a == tierfs_daemon::worker::WORKER_COMMAND) {
        // A node daemon's worker, started by the node daemon (tierfs_daemon::worker).
        logging::init("info,fuser=error");
        return match tierfs_daemon::worker::run_worker() {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                error!("{}", logging::error_message(&err));
                ExitCode::FAILURE
            }
        };
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == launch::SERVE_COMMAND) {
        // `tierfs mount`'s daemon (when TIERFS_DAEMON names this binary): the configuration
        // comes as data on stdin.
        let cli = tierfs_daemon::cli::ServeCli::parse_from(std::env::args_os().skip(1));
        return tierfs_daemon::frontend::serve_main(cli.ready_fd, cli.mountpoint.as_deref());
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "node") {
        let cli = NodeCli::parse_from(std::env::args_os().skip(1));
        logging::init("info,fuser=error");
        return match run_node(&cli) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                error!("{}", logging::error_message(&err));
                ExitCode::FAILURE
            }
        };
    }
    let cli = DaemonCli::parse();
    logging::init("info,fuser=error");
    let mut readiness = match cli.ready_fd {
        Some(fd) => match Readiness::from_fd(fd) {
            Ok(readiness) => readiness,
            Err(err) => {
                error!("{}", logging::error_message(&err));
                return ExitCode::FAILURE;
            }
        },
        None => Readiness::Quiet,
    };
    match run(&cli, &mut readiness) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{}", logging::error_message(&err));
            readiness.failed(&err);
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &DaemonCli, readiness: &mut Readiness) -> Result<()> {
    // Run directly with neither --store nor --data-dir, it makes the embedded store as
    // `tierfs mount` would (started by `tierfs mount`, it always gets one of them).
    store_link::prepare_mount_store(&cli.mount)?;
    let config = cli.mount.resolve(cli.runtime_dir.as_deref())?;
    let rt = tierfs_daemon::config::build_runtime()?;
    let result = frontend::run(&rt, &config, readiness);
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

fn run_node(args: &NodeCli) -> Result<()> {
    let config = NodeConfig::load(&args.config)?;
    if args.check {
        println!("{}: {} mounts", config.file.display(), config.mounts.len());
        for m in &config.mounts {
            let store = m.store.as_ref().map_or("no store".into(), |s| format!("store {}", s.display()));
            println!(
                "  {} (workspace {}, {store}, data dir {})",
                m.mountpoint.display(),
                m.workspace,
                m.data_dir.display()
            );
        }
        return Ok(());
    }
    let notifier = Notifier::from_env().map_err(|e| anyhow::anyhow!("NOTIFY_SOCKET: {e}"))?;
    let rt = tierfs_daemon::config::build_runtime()?;
    let result = node::run(&rt, &config, &notifier);
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}
