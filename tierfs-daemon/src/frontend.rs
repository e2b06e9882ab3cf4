//! Which front end serves a resolved configuration: a FUSE mount (`serve`) or a watched
//! directory (`watch`). The one entry point `tierfs mount --foreground`, `tierfs watch
//! --foreground` and `tierfs-daemon` call, so that neither front end needs the other.

use anyhow::Result;
use tokio::runtime::Runtime;

use crate::config::MountConfig;
use crate::launch::Readiness;

/// Serves `config` until it is unmounted or unwatched (see `serve::run` and `watch::run`).
pub fn run(rt: &Runtime, config: &MountConfig, readiness: &mut Readiness) -> Result<()> {
    if config.watch { crate::watch::run(rt, config, readiness) } else { crate::serve::run(rt, config, readiness) }
}
