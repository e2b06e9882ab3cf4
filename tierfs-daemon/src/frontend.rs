//! Which front end serves a resolved configuration: a FUSE mount (`serve`) or a watched
//! directory (`watch`). The one entry point `tierfs mount --foreground`, `tierfs watch
//! --foreground`, `tierfs-daemon` and the node daemon call, so that neither front end needs
//! the other.

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
    run_until(rt, config, readiness, stop)
}

/// [`run`] with the stop given, for the node daemon, which owns the signals.
pub fn run_until(rt: &Runtime, config: &MountConfig, readiness: &mut Readiness, stop: Stop) -> Result<()> {
    run_supplied(rt, config, readiness, stop, None)
}

/// [`run_until`], with what the node daemon `supplied` to a worker (`crate::worker`).
pub(crate) fn run_supplied(
    rt: &Runtime,
    config: &MountConfig,
    readiness: &mut Readiness,
    stop: Stop,
    supplied: Option<Supplied>,
) -> Result<()> {
    crate::private::private_umask();
    crate::private::tighten_data_dir(&config.data_dir)?;
    if config.watch {
        crate::watch::run_with(rt, config, readiness, stop, supplied)
    } else {
        crate::serve::run_with(rt, config, readiness, stop, supplied)
    }
}
