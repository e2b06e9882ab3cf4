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
