//! Which front end serves a resolved configuration: a FUSE mount (`serve`) or a watched
//! directory (`watch`); and [`serve_main`], a background daemon's whole life (the
//! configuration read from stdin). The one entry point `tierfs mount --foreground`, `tierfs watch
//! --foreground`, `tierfs-daemon` and the node daemon call, so that neither front end needs
//! the other.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use tokio::runtime::Runtime;

use crate::config::MountConfig;
use crate::launch::Readiness;
use crate::serve::Supplied;
use crate::stop::Stop;

/// Serves `config` until it is unmounted or unwatched, or until SIGTERM or SIGINT (see
/// `serve::run` and `watch::run`).
pub fn run(rt: &Runtime, config: &MountConfig, readiness: &mut Readiness) -> Result<()> {
    let stop = {
        let _rt_context = rt.enter();
        Stop::signals()?
    };
    run_until(rt, config, readiness, stop, None)
}

/// [`run`] with the stop given, for the node daemon, which owns the signals, and with what it
/// `supplied` to a worker (`crate::worker`).
pub(crate) fn run_until(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    stop: Stop,
    supplied: Option<Supplied>,
) -> Result<()> {
    crate::private::private_umask();
    crate::private::tighten_data_dir(&config.data_dir)?;
    if config.watch {
        crate::watch::run(rt, config, readiness, stop, supplied)
    } else {
        crate::serve::run(rt, config, readiness, stop, supplied)
    }
}

/// `tierfs-daemon serve` (and `tierfs serve`, how `tierfs mount` starts its daemon), its
/// arguments parsed by the binary (`cli::ServeCli`): serves the `MountConfig` on stdin
/// until it is unmounted, reporting readiness on `ready_fd`. The caller's `main` first takes
/// the passphrase out of the environment and sets the private umask, before any thread starts.
pub fn serve_main(ready_fd: Option<i32>, mountpoint: Option<&Path>) -> std::process::ExitCode {
    crate::logging::init("info,fuser=error");
    let mut readiness = match ready_fd.map(Readiness::from_fd).transpose() {
        Ok(readiness) => readiness.unwrap_or(Readiness::Quiet),
        Err(err) => {
            tracing::error!("{}", crate::logging::error_message(&err));
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = crate::launch::read_serve_config(std::io::stdin().lock(), mountpoint).and_then(|config| {
        let rt = crate::config::build_runtime()?;
        let result = run(&rt, &config, &mut readiness);
        rt.shutdown_timeout(Duration::from_secs(1));
        result
    });
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{}", crate::logging::error_message(&err));
            readiness.failed(&err);
            std::process::ExitCode::FAILURE
        }
    }
}
