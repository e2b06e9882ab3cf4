//! Reference-model test of [`tierfs::vfs::Vfs`] (no FUSE involved).
//!
//! # What it proves
//!
//! A small in-memory model of a POSIX filesystem, written from the POSIX/Linux rules and not
//! from the implementation, is driven in lockstep with a real `Vfs` on a temporary data
//! directory. Proptest generates random sequences of up to 40 operations over a tiny name space
//! (`a`, `b`, `c`, `d1`, `d2`, nested a few levels), so name collisions, kind mismatches and
//! non-empty directories are frequent; about half of the paths are *selectors* (`?f2`: "the
//! third regular file that exists now") resolved against the model when the op runs, so most
//! operations hit something that exists. The operations are: create (with and without
//! `O_EXCL`, `O_TRUNC`, keeping the handle open or not), mkdir, mknod (regular files, FIFOs,
//! sockets, devices), unlink, rmdir, rename (plain, `RENAME_NOREPLACE`, `RENAME_EXCHANGE`,
//! across directories, directories into their own subtree), link, symlink, write at an offset
//! (sparse gaps past EOF included, zero-length writes, writes past the largest offset),
//! truncate up and down (`setattr` size, by path and through a handle), chmod, utimens (times
//! before 1970 and after 9999 included), setxattr (`XATTR_CREATE` / `XATTR_REPLACE`; `user.`,
//! `trusted.` and unknown namespaces) and removexattr, fallocate (plain, `KEEP_SIZE`,
//! `PUNCH_HOLE|KEEP_SIZE`, `PUNCH_HOLE` alone, `ZERO_RANGE` with and without `KEEP_SIZE`),
//! open + unlink while open followed by reads/writes/truncates through the orphaned handle,
//! `copy_file_range` between handles (one file included), `lseek` SEEK_DATA/SEEK_HOLE,
//! release, and *reopen*: drop the `Vfs` (optionally without releasing open handles, as when
//! the daemon dies) and open a new one on the same data directory. Names of 255 and 256 bytes
//! appear among the short ones.
//!
//! The harness plays the kernel's part: it resolves paths with `lookup` (failing with ENOTDIR
//! itself when a parent is not a directory, as the path walk does), and skips operations the
//! kernel would turn into something else (`open`, `truncate`, `chmod` of a symlink follow it;
//! FIFOs and devices are opened by the kernel itself).
//!
//! After every operation the test checks that:
//! - the result matches: both succeed with the same output (bytes read, bytes written, times
//!   set), or both fail, the implementation with one of the errnos the model allows (one exact
//!   errno wherever POSIX/Linux defines it; a set only where several checks fail at once and
//!   Linux's order of checks is not the contract, e.g. `link` of a directory onto an existing
//!   name may say EPERM or EEXIST);
//! - the whole observable tree is identical: for every path its kind, perm bits, nlink, uid,
//!   gid, size, file contents, symlink target, xattrs (sorted) and which paths are hard links
//!   of one inode; for every directory its readdir listing (names, with `.` and `..`), where
//!   `.`/`..` carry the right inode numbers, entry inode/kind agree with `lookup`, every cookie
//!   resumes the listing after its entry, and `readdirplus` agrees with `getattr`;
//! - every open handle (orphaned ones included) still reads the contents the model predicts and
//!   reports the model's nlink (0 once unlinked);
//! - `stats()` counts the same live inodes (orphans until their last release) and open files;
//! - inode numbers are stable for the life of an inode (also across reopen) and never reused;
//! - the hot tier holds no more data files than there are live regular files (no leaks);
//! - mtime and ctime change exactly where POSIX says the op changes them (the parent
//!   directories of namespace ops, the inode of link/unlink/chmod/xattr ops, a written file),
//!   and nowhere else; failed ops change no timestamp; birth times never change;
//! - on reopen every attribute of every path, timestamps included, survives exactly.
//!
//! # Reproducing a failure
//!
//! `CARGO_TARGET_DIR=/var/tmp/tierfs-target cargo test --test model` runs 64 random cases;
//! `PROPTEST_CASES=2000` runs more, `PROPTEST_RNG_SEED=<n>` fixes the seed. A failure prints
//! the first divergence (the step, the model's expectation and the implementation's result,
//! or a per-path diff of the two trees) and the shrunk sequence of ops that led to it, with
//! selectors already resolved, as pretty-printed Rust: paste it into a new `#[test]` calling
//! [`check_ops`] with `use Op::*;` (and `How::*`, `Falloc::*`, `XFlags::*`, `NodeKind::*`) in
//! scope, as the `regression_*` tests at the bottom do.
//!
//! `MODEL_STATS=1 cargo test --test model -- --nocapture model_matches_vfs` prints how often
//! each kind of op succeeded, failed or was skipped: check it after changing the generator.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use proptest::test_runner::{Config, TestError, TestRunner};
use tempfile::TempDir;
use tierfs::tier::ColdConfig;
use tierfs::vfs::AttachedStore;
use tierfs::vfs::{
    Attr, Caller, DirEntry, FileKind, Ino, ROOT_INO, RenameFlags, SetAttr, TimeSet, Timestamp, Vfs, VfsConfig, VfsError,
};
use tierfs_test_support::mem_store::MemStore;

const ME: &Caller = &Caller::ROOT;
const UMASK: u32 = 0o022;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

mod ops;
mod real;
mod reference;
mod runner;
mod scenarios;
mod snapshots;
mod strategies;

use ops::*;
use real::*;
use reference::*;
use runner::*;
use snapshots::*;
use strategies::*;

#[test]
fn model_matches_vfs() {
    run_random_cases(64, Tier::Hot);
}

#[test]
fn model_matches_vfs_with_a_cold_tier_that_evicts_everything() {
    run_random_cases(48, Tier::Cached);
}

#[test]
fn model_matches_vfs_with_a_cold_tier_that_streams_every_read() {
    run_random_cases(48, Tier::Streamed);
}
