//! # tierfs-daemon — the runtime around the core
//!
//! This crate owns everything the core library must not know about: the command line
//! (`tierfs`, `tierfs-daemon`), the tokio runtime, signals, the per-mount control socket and
//! the background daemon. The FUSE protocol itself is `tierfs-mount`'s; POSIX semantics are
//! `tierfs::vfs`'s.
//!
//! Modules, in the order a mount goes through them:
//! - [`config`]: the resolved [`config::MountConfig`], the async runtime, the lease holder name;
//! - [`cli`]: clap definitions and value parsers; resolves options into a [`config::MountConfig`];
//! - [`paths`]: data dir, runtime dir, control socket and embedded default store locations;
//! - [`store_link`]: stores seen from the binaries: unlocking, the blocking block-store
//!   adapter, the embedded store's creation, saved repairs, `init`/`key`/`scrub`/`warmup`;
//! - [`launch`]: `tierfs mount` starting `tierfs-daemon` detached and waiting for readiness;
//! - [`serve`]: one mount's life: checks, `Vfs`, control socket, FUSE session, shutdown;
//! - [`control`]: the control socket protocol, server and client;
//! - [`mounts`]: the kernel mount table and unmounting;
//! - [`commands`]: the `tierfs` subcommands and their output;
//! - [`status`]: `tierfs status` as text, and the one formatter of sizes and durations;
//! - [`history`]: `tierfs log`, `show`, `checkout`, `diff -p`, `history push|export`, asked of the
//!   serving process of a mount or watch;
//! - [`layer`]: `tierfs layer`, overlays on system directories whose upper layer is in a mount;
//! - [`restore`]: `tierfs restore`, a plain copy of a workspace state out of the store;
//! - [`trash`]: `tierfs trash list|restore`, files a live mount lost, read from the journal
//!   and written back through the mount;
//! - [`logging`]: tracing setup;
//! - [`private`]: the umask, data dir and secret-file modes of a serving process;
//! - [`admit`]: bounds on the connections one user and all users hold on a socket;
//! - [`stop`]: what ends a front end (its own signals, or the node daemon's stop);
//! - [`node`]: `tierfs-daemon node`, one process serving every mount of a node's
//!   configuration file, with [`metrics`] (Prometheus `/metrics`, `/healthz`) and
//!   [`notify`] (systemd readiness), and the mounts [`handoff`] brings it from `tierfs mount`;
//! - [`worker`]: a node mount with an owner, served by a worker process running as that owner.
//!
//! Every mount is served by exactly one process (its own, the node daemon, or the node
//! daemon's worker running as the mount's owner), which holds the data directory's lock (taken
//! by `Vfs::new`) and the mountpoint's control socket for as long as it serves.
//!
//! No function runs over the 80 lines of `clippy.toml`, as in the core and the adapter.
//! System calls go through rustix; the `unsafe` that stays is what no safe wrapper covers
//! (`pre_exec` closures, descriptors inherited by number, tierfs's own ioctl, the
//! environment before threads start), each with its `// SAFETY:` reason (clippy checks).

#![warn(clippy::too_many_lines)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod admit;
pub mod cli;
pub mod commands;
pub mod config;
pub mod control;
pub mod frontend;
pub mod handoff;
pub mod history;
pub mod launch;
pub mod layer;
pub mod logging;
pub mod metrics;
pub mod mounts;
pub mod node;
pub mod notify;
pub mod paths;
pub mod private;
pub mod restore;
pub mod serve;
pub mod status;
pub mod stop;
pub mod store_link;
pub mod trash;
pub mod watch;
pub mod worker;
