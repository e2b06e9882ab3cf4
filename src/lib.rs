//! # tierfs — the core library
//!
//! tierfs gives ephemeral GPU and notebook runtimes a workspace that behaves like a local disk
//! and survives runtime resets. This crate is the core: it knows nothing of FUSE, file
//! watchers, command lines or signals (those live in `tierfs-mount` and `tierfs-daemon`).
//!
//! Layers, each calling only downward:
//! - [`watch`]: a plain directory kept equal to the workspace (the front end without FUSE);
//! - [`session`]: one workspace opened, served by a front end and closed safely (restore,
//!   lease, committer, repairs, drain);
//! - [`history`]: code and configs committed with libgit2 at every snapshot, kept in the
//!   store (`tierfs log`, `diff`, `show`, `checkout`);
//! - [`export`]: a workspace written out as a plain directory tree (`tierfs restore`, and
//!   watch mode on a fresh node);
//! - [`vfs`]: POSIX semantics over inode numbers; the single place errors become errno;
//! - [`meta`]: the RocksDB metadata store (one atomic batch per operation);
//! - [`tier`]: the hot tier and the cold tier (file contents on local disk, sealed into
//!   blocks in the store);
//! - [`remote`]: the workspace's metadata in the store (journal, checkpoints, snapshots,
//!   writer lease);
//! - [`store`], [`block`], [`crypto`], [`backend`]: the encrypted, redundant object store;
//! - [`types`]: the value types every layer shares (inode numbers, attributes, [`ErrorKind`]),
//!   and [`telemetry`]: lock-free counters and latency histograms (behind the node's metrics).
//!
//! ```
//! use tierfs::vfs::{Caller, Vfs, VfsConfig, ROOT_INO};
//!
//! let dir = tempfile::tempdir()?;
//! let fs = Vfs::new(VfsConfig::new(dir.path()))?;
//! let me = Caller::ROOT;
//! let (file, fh) = fs.create(&me, ROOT_INO, b"hello.txt", 0o644, 0o022, libc::O_RDWR)?;
//! fs.write(file.ino, fh, 0, b"hello")?;
//! assert_eq!(fs.read(file.ino, fh, 0, 100)?, b"hello");
//! fs.release(file.ino, fh)?;
//! assert_eq!(fs.lookup(ROOT_INO, b"hello.txt")?.size, 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! No `unsafe` here: system calls go through rustix, whose wrappers are safe.

#![forbid(unsafe_code)]
// No function over the length clippy.toml sets (clippy checks it in CI).
#![warn(clippy::too_many_lines)]

pub mod backend;
pub mod block;
pub mod crypto;
pub mod error;
pub mod export;
pub mod history;
pub mod meta;
pub mod remote;
pub mod session;
pub mod store;
pub mod telemetry;
pub mod tier;
pub mod types;
pub mod vfs;
pub mod watch;

pub use error::{Error, ErrorKind};
pub use vfs::{Vfs, VfsConfig, VfsError, VfsResult, VfsStats};
