//! FUSE passthrough: which opens the kernel may serve from the hot tier's data file itself,
//! without a round trip through this process for each read (kernel 6.9+, `FOPEN_PASSTHROUGH`).
//!
//! The front end asks [`Vfs::open_for`]; the answer names the data file to hand the kernel as
//! the backing file, or none (a normal open). The decisions all live here:
//! - An open of a regular file whose chunks are all local and checked (none evicted, none
//!   from an earlier run still unverified), with no other handle open, is served through
//!   passthrough: a read-only one always, one that may write (`create` too) while the hot
//!   tier has [`PASSTHROUGH_WRITE_ROOM`] (on the disk past the reserve, under the cache size)
//!   and the file no setuid or setgid bit a write must clear (`setid`). Not with an encrypted hot tier (the data file holds
//!   ciphertext), not on a follower (a handle reads the version it opened, maybe the store's
//!   only), and not once the front end reported the kernel or the privilege missing.
//! - The kernel refuses to mix the two kinds of open on one inode (a cached open while a
//!   passthrough one is open fails with EIO, and the other way round with ETXTBSY; every
//!   passthrough open of an inode must name the same backing file). So the first open of an
//!   inode decides for all that overlap it: while a normal handle is open every new one is
//!   normal, and while a passthrough handle is open every new one, a writer too, is
//!   passthrough.
//! - A passthrough handle pins the file against eviction ([`ColdTier::passthrough_open`]).
//! - A writer through passthrough (the first handle, or one that joins) writes behind this
//!   process's back. Its inode's
//!   dirty marker is committed before the open is answered and kept while it is open, so a
//!   crash re-seals the file; its fsync and its release take the data file's size and mark
//!   every chunk that holds data dirty (the uploader re-hashes them; unchanged ones are deduplicated), and
//!   until then `getattr` reports the data file's size, which the kernel's writes moved.
//!   After such a writer closed, the next normal open drops the kernel's cached pages of the
//!   file: they were filled before the passthrough writes.

use std::collections::HashSet;

use super::*;

/// How often the session takes in what passthrough writers that stay open wrote
/// ([`Vfs::take_in_passthrough_writers`]). Each take-in marks every chunk with data of a written file
/// dirty and the uploader re-hashes them all (the kernel does not say which bytes changed), so
/// the dirty age of normal writes (half a second) would re-hash a large file being written
/// over and over. 30 s, the dirty age of a store on the same disk, bounds how long an open
/// writer's bytes wait for the store at one re-hash of the file per round.
pub const PASSTHROUGH_TAKE_IN: std::time::Duration = std::time::Duration::from_secs(30);

/// The most a file may hold for a writer to open it through passthrough first (one that joins a
/// passthrough inode has no choice). Each take-in re-hashes every chunk with data (see
/// [`PASSTHROUGH_TAKE_IN`]), so a small change in place to a large file (a database's page and
/// its fsync, an append to a long log) would cost a re-hash of the whole file per fsync, where
/// the daemon's path marks only the chunks written. 64 MiB re-hashes in a few tens of
/// milliseconds; a file created new goes through passthrough whatever it grows to. An open
/// with `O_TRUNC` counts what the file held before: the kernel sends the truncate after the
/// open (this mount does not ask for atomic `O_TRUNC`), so a large file rewritten whole keeps
/// the daemon's path.
pub const PASSTHROUGH_REWRITE_MAX: u64 = 64 << 20;

/// Room the hot tier must have for a writer to open through passthrough (a first open; one
/// that joins a passthrough inode has no choice): free on the data disk past the reserve, and
/// under `--cache-size` when it is set. The kernel's writes skip the hot tier's space checks:
/// nothing keeps them out of the reserve RocksDB needs or under the cache size, and the file
/// is pinned while open, so eviction cannot make room for it either.
/// 4 GiB: a checkpoint or a dataset shard fits, and a small or nearly full disk, where a
/// writer filling it is likely, keeps the daemon's path, which waits for eviction and stops at
/// the reserve with ENOSPC. Nothing stops one writer from writing past the room once open
/// (docs/SEMANTICS.md, Deviations).
pub const PASSTHROUGH_WRITE_ROOM: u64 = 4 << 30;

/// What `status` shows of passthrough.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PassthroughStats {
    /// Whether opens may be served through passthrough on this mount.
    pub on: bool,
    /// Why not, when `on` is false.
    pub off_reason: Option<String>,
    /// Opens served through passthrough since the mount started.
    pub opens: u64,
    /// Passthrough handles open now.
    pub open_now: u64,
    /// Of `opens`, those that may write (the kernel writes the data file; the file is sealed
    /// again at their fsync and release).
    #[serde(default)]
    pub write_opens: u64,
    /// Passthrough handles that may write, open now.
    #[serde(default)]
    pub writers_now: u64,
    /// Opens served normally although passthrough is on: another handle of the file was open
    /// normally, part of the file was not local, or a writer found no room
    /// ([`PASSTHROUGH_WRITE_ROOM`]).
    pub fallbacks: u64,
    /// The filesystem stack depth the mount declared to the kernel with passthrough (`None`:
    /// none declared, passthrough was never asked for). The kernel stacks at most 2: at 2 no
    /// overlayfs can sit on the mount (`tierfs layer add` refuses up front).
    #[serde(default)]
    pub stack_depth: Option<u32>,
}

/// The answer to [`Vfs::open_for`].
#[derive(Debug)]
pub struct Opened {
    pub fh: u64,
    /// The data file the kernel serves this handle from (passthrough), or `None` for a
    /// normal open. Every passthrough handle of one inode names the same file.
    pub backing: Option<Arc<File>>,
    /// What a normal open does with the kernel's cached pages of the file.
    pub page_cache: PageCache,
}

/// The passthrough state of a mount.
#[derive(Default)]
pub(super) struct Passthrough {
    /// Why passthrough is off (`None`: on).
    off: Mutex<Option<String>>,
    opens: AtomicU64,
    open_now: AtomicU64,
    write_opens: AtomicU64,
    fallbacks: AtomicU64,
    /// The stack depth declared to the kernel (0: none, see [`Vfs::passthrough_declared`]).
    stack_depth: std::sync::atomic::AtomicU32,
    /// Passthrough handles that may write, open now (`getattr` looks at the data file only
    /// while this is not 0).
    writers: AtomicU64,
    /// Inodes a passthrough writer changed since their last normal open (see the module).
    stale_pages: Mutex<HashSet<Ino>>,
}

impl Passthrough {
    /// The state for a mount with `config`: off with the reason when it cannot work.
    pub(super) fn new(config: &VfsConfig) -> Passthrough {
        let off = if !config.passthrough {
            Some("turned off (--no-passthrough)")
        } else if config.cache_cipher.is_some() {
            Some("the hot tier is encrypted (--encrypt-cache): its data files hold ciphertext")
        } else if config.follow {
            Some("a follower reads the version each handle opened")
        } else {
            None
        };
        Passthrough { off: Mutex::new(off.map(str::to_owned)), ..Passthrough::default() }
    }
}

/// How the handles of one open inode are served (see the module).
#[derive(Debug, Default)]
pub(super) struct Modes {
    /// Normal handles the front end opened (not those the core opens for itself: history,
    /// export, which the kernel never sees).
    cached: HashSet<u64>,
    /// Passthrough handles, each with whether it may write.
    passthrough: HashMap<u64, bool>,
    /// While passthrough writers are open: the data file as last taken in (`None`: unknown,
    /// taken as changed).
    seen: Option<Seen>,
}

impl Modes {
    /// Whether a passthrough handle that may write is open.
    fn has_writer(&self) -> bool {
        self.passthrough.values().any(|&w| w)
    }
}

/// What of a data file tells that the kernel wrote it: a write moves its mtime (and its
/// size, when it extends it). The kernel stamps a file whose times were looked at since its
/// last change with a fresh fine-grained time (multigrain timestamps, Linux 6.13+), so a
/// write after a look differs; on older kernels two writes in one clock tick may look the
/// same, which only leaves the reported mtime a tick old: the bytes are taken in anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    mtime: Timestamp,
    size: u64,
}

impl Seen {
    fn of(file: &File) -> Option<Seen> {
        let m = file.metadata().ok()?;
        Some(Seen { mtime: Timestamp::from(m.modified().ok()?), size: m.len() })
    }
}

/// Whether an open with `flags` may change the file (`O_TRUNC` does, even read-only).
fn writes(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

impl Vfs {
    /// [`Vfs::open`], deciding whether the kernel serves the new handle through passthrough.
    pub fn open_for(&self, caller: &Caller, ino: Ino, flags: i32) -> VfsResult<Opened> {
        let fh = self.open(caller, ino, flags)?;
        let opened = self.choose_mode(ino, fh, flags, false).and_then(|o| self.joined_writer(caller, ino, flags, o));
        opened.inspect_err(|_| {
            let _ = self.release(ino, fh);
        })
    }

    /// A writer other than root that joined a passthrough inode clears setuid and setgid now:
    /// the kernel's writes through passthrough cannot, and a file with such a bit is never
    /// opened for writing through passthrough first, so the inode was a reader's (see `setid`).
    pub(super) fn joined_writer(&self, caller: &Caller, ino: Ino, flags: i32, opened: Opened) -> VfsResult<Opened> {
        if opened.backing.is_some() && writes(flags) {
            self.drop_setid_for(caller, ino)?;
        }
        Ok(opened)
    }

    /// `marked`: the create of this new inode committed its passthrough writer marker
    /// ([`Vfs::create_open`]), having just found room for a writer, which is not asked again;
    /// a normal open takes the marker back.
    pub(super) fn choose_mode(&self, ino: Ino, fh: u64, flags: i32, marked: bool) -> VfsResult<Opened> {
        let oi = self.open_inode(ino)?;
        let mut modes = oi.modes.lock();
        let writes = writes(flags);
        let joins = !modes.passthrough.is_empty();
        let backing = if joins {
            let file = self.file_of(&oi, ino)?;
            if let Some(cold) = &self.cold {
                cold.passthrough_open(ino, false, writes, false)?;
            }
            Some(file)
        } else if modes.cached.is_empty()
            && self.passthrough_wanted()
            && (!writes || ((marked || self.room_for_a_writer()) && self.writer_may_pass(ino)?))
        {
            self.first_passthrough(&oi, ino, writes, marked)
        } else {
            None
        };
        let Some(file) = backing else {
            if marked {
                let mut b = MetaBatch::new();
                b.delete_dirty(ino);
                self.meta.commit(b)?;
            }
            if self.passthrough_wanted() {
                self.passthrough.fallbacks.fetch_add(1, Ordering::Relaxed);
            }
            modes.cached.insert(fh);
            let stale = self.passthrough.stale_pages.lock().remove(&ino);
            let page_cache = if stale { PageCache::Drop } else { self.page_cache(fh) };
            return Ok(Opened { fh, backing: None, page_cache });
        };
        modes.passthrough.insert(fh, writes);
        self.passthrough.opens.fetch_add(1, Ordering::Relaxed);
        self.passthrough.open_now.fetch_add(1, Ordering::Relaxed);
        if writes {
            self.passthrough.writers.fetch_add(1, Ordering::Relaxed);
            self.passthrough.write_opens.fetch_add(1, Ordering::Relaxed);
            if modes.seen.is_none() {
                // What the data file looked like before this writer could move it: `getattr`
                // and the take-in tell the kernel's writes by a change from this.
                modes.seen = Seen::of(&file);
            }
        }
        Ok(Opened { fh, backing: Some(file), page_cache: PageCache::Keep })
    }

    /// After a crash with writers through passthrough open (their inodes' dirty markers say
    /// so): each such file keeps what its data file holds past the recorded size, since every
    /// byte there is a write the kernel acknowledged (a normal write commits its size first,
    /// so this is never an interrupted one), with the data file's mtime. The marker becomes a
    /// plain one with a store (the cold tier then re-seals every chunk of the file) and goes
    /// without. Called at open, before the cold tier starts.
    pub(super) fn recover_passthrough_writes(&self) -> VfsResult<()> {
        for ino in self.meta.passthrough_dirty_inodes()? {
            let mut b = MetaBatch::new();
            if let Some(mut rec) = self.meta.inode(ino)?.filter(|r| r.attr.kind == FileKind::File) {
                let data = std::fs::metadata(self.hot.path(ino)).ok();
                let len = data.as_ref().map_or(0, |m| m.len()).min(MAX_FILE_SIZE);
                if len > rec.attr.size {
                    tracing::info!(
                        ino,
                        len,
                        recorded = rec.attr.size,
                        "a passthrough writer's bytes kept after a crash"
                    );
                    let mtime = data.and_then(|m| m.modified().ok()).map_or_else(Timestamp::now, Timestamp::from);
                    (rec.attr.size, rec.attr.blocks, rec.dense) = (len, len.div_ceil(512), false);
                    (rec.attr.mtime, rec.attr.ctime) = (mtime, mtime);
                    b.put_inode(&rec);
                }
            }
            if self.config.store.is_some() {
                b.put_dirty(ino);
            } else {
                b.delete_dirty(ino);
            }
            self.meta.commit(b)?;
        }
        Ok(())
    }

    /// Whether a first writer of `ino` may go through passthrough by what the file holds
    /// ([`PASSTHROUGH_REWRITE_MAX`]) and its mode: not with a setuid or setgid bit that a
    /// write must clear, which the kernel's writes through passthrough cannot (see `setid`).
    fn writer_may_pass(&self, ino: Ino) -> VfsResult<bool> {
        Ok(self
            .meta
            .inode(ino)?
            .is_some_and(|rec| rec.attr.size <= PASSTHROUGH_REWRITE_MAX && !setid::has_setid_to_drop(&rec)))
    }

    /// Whether the hot tier has [`PASSTHROUGH_WRITE_ROOM`] for a writer to open through
    /// passthrough: on the data disk past the reserve, and under `--cache-size`.
    pub(super) fn room_for_a_writer(&self) -> bool {
        let disk = self.hot.has_room(PASSTHROUGH_WRITE_ROOM).unwrap_or(false);
        let cache = match (self.config.cache_size, &self.cold) {
            (Some(limit), Some(cold)) => limit.saturating_sub(cold.resident_bytes()) >= PASSTHROUGH_WRITE_ROOM,
            _ => true,
        };
        disk && cache
    }

    /// The data file of `ino` for its first passthrough handle, pinned, if the file is wholly
    /// local; `None` (a normal open, which reports its own errors when it reads) otherwise.
    /// With `writes`, the inode's dirty marker is committed first ([`ColdTier::passthrough_open`]):
    /// a marker that cannot be committed makes the open a normal one.
    /// `marked`: the marker is committed already ([`Vfs::create_open`]).
    fn first_passthrough(&self, oi: &OpenInode, ino: Ino, writes: bool, marked: bool) -> Option<Arc<File>> {
        let file = self.file_of(oi, ino).ok()?;
        match &self.cold {
            Some(cold) => cold.passthrough_open(ino, true, writes, marked).ok()?.then_some(file),
            None if writes && !marked => {
                // Without a store only the marker's crash rule applies (see above).
                let mut b = MetaBatch::new();
                b.put_dirty_passthrough(ino);
                self.meta.commit(b).ok().map(|()| file)
            }
            None => Some(file),
        }
    }

    /// The front end could not serve handle `fh` of `ino` through passthrough, which
    /// [`Vfs::open_for`] chose, because the kernel or the privilege is missing: the handle
    /// becomes a normal one and passthrough is off from now on, for `reason`. Only for the
    /// first passthrough handle of an inode (the one that registers the backing file).
    pub fn passthrough_failed(&self, ino: Ino, fh: u64, reason: &str) -> VfsResult<()> {
        self.passthrough_unavailable(reason);
        let oi = self.open_inode(ino)?;
        let mut modes = oi.modes.lock();
        let Some(writes) = modes.passthrough.remove(&fh) else { return Err(VfsError::BadHandle) };
        self.passthrough_closed(ino, writes);
        modes.cached.insert(fh);
        Ok(())
    }

    /// Turns passthrough off for this mount, for `reason` (the front end found the kernel
    /// feature or the privilege missing). The first reason stays.
    pub fn passthrough_unavailable(&self, reason: &str) {
        let mut off = self.passthrough.off.lock();
        if off.is_none() {
            tracing::info!("FUSE passthrough off: {reason}; files are served through this process");
            *off = Some(reason.to_owned());
        }
    }

    /// The stack depth to declare with passthrough: one more than the data dir's own
    /// filesystem has. On a plain disk that is 1, which leaves room for an overlayfs on top
    /// of the mount (`tierfs layer`: the kernel allows two levels); on a data dir that is
    /// itself stacked (overlayfs, a container's root; ecryptfs) it is 2, the kernel's limit,
    /// and then no overlayfs can sit on the mount.
    pub fn passthrough_stack_depth(&self) -> u32 {
        // statfs(2) magic numbers of the stacking filesystems Linux has.
        const OVERLAYFS_SUPER_MAGIC: u64 = 0x794c_7630;
        const ECRYPTFS_SUPER_MAGIC: u64 = 0xf15f;
        let stacked = rustix::fs::statfs(&self.config.data_dir)
            .is_ok_and(|s| matches!(s.f_type as u64, OVERLAYFS_SUPER_MAGIC | ECRYPTFS_SUPER_MAGIC));
        if stacked { 2 } else { 1 }
    }

    /// The front end declared `depth` as the mount's stack depth when it asked the kernel for
    /// passthrough (for `status`, and `tierfs layer add`, which needs room for one more level).
    pub fn passthrough_declared(&self, depth: u32) {
        self.passthrough.stack_depth.store(depth, Ordering::Relaxed);
    }

    /// Whether passthrough may still be used (the front end asks the kernel for it only then).
    pub fn passthrough_wanted(&self) -> bool {
        self.passthrough.off.lock().is_none()
    }

    pub fn passthrough_stats(&self) -> PassthroughStats {
        let off_reason = self.passthrough.off.lock().clone();
        PassthroughStats {
            on: off_reason.is_none(),
            off_reason,
            opens: self.passthrough.opens.load(Ordering::Relaxed),
            open_now: self.passthrough.open_now.load(Ordering::Relaxed),
            write_opens: self.passthrough.write_opens.load(Ordering::Relaxed),
            writers_now: self.passthrough.writers.load(Ordering::Relaxed),
            fallbacks: self.passthrough.fallbacks.load(Ordering::Relaxed),
            stack_depth: Some(self.passthrough.stack_depth.load(Ordering::Relaxed)).filter(|&d| d > 0),
        }
    }

    /// Handle `fh` of `ino` closes (from [`Vfs::release`]): a passthrough writer's changes are
    /// taken in first. Returns after the handle left its inode's modes.
    pub(super) fn release_mode(&self, ino: Ino, fh: u64) -> VfsResult<()> {
        let Some(oi) = self.open.read().get(&ino).cloned() else { return Ok(()) };
        let writes = {
            let mut modes = oi.modes.lock();
            match modes.passthrough.remove(&fh) {
                Some(writes) => writes,
                None => {
                    modes.cached.remove(&fh);
                    return Ok(());
                }
            }
        };
        let taken = if writes { self.take_passthrough_writes(ino) } else { Ok(()) };
        self.passthrough_closed(ino, writes);
        let mut last = Ok(());
        if writes {
            let mut modes = oi.modes.lock();
            if !modes.has_writer() {
                // That take-in was the last until a writer opens again, which looks afresh.
                modes.seen = None;
                if self.cold.is_none() && taken.is_ok() {
                    let mut b = MetaBatch::new();
                    b.delete_dirty(ino);
                    last = self.meta.commit(b).map_err(VfsError::from);
                }
            }
            self.passthrough.stale_pages.lock().insert(ino);
        }
        taken.and(last)
    }

    fn passthrough_closed(&self, ino: Ino, writes: bool) {
        if let Some(cold) = &self.cold {
            cold.passthrough_release(ino, writes);
        }
        self.passthrough.open_now.fetch_sub(1, Ordering::Relaxed);
        if writes {
            self.passthrough.writers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether `ino` has a passthrough handle that may write open now.
    pub(super) fn passthrough_writing(&self, ino: Ino) -> bool {
        if self.passthrough.writers.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Some(oi) = self.open.read().get(&ino).cloned() else { return false };
        oi.modes.lock().has_writer()
    }

    /// Takes in what passthrough writers of `ino` wrote behind this process's back (at their
    /// fsync and release, and before any other change of the file): the data file's size
    /// becomes the file's, its mtime and ctime become the data file's mtime if the kernel
    /// wrote since the last take-in, and every chunk that holds data is marked dirty, so the
    /// uploader seals what changed. Every such chunk, not only those that look written: a write through a shared
    /// mapping to a page already dirty moves no time, so nothing here can tell it apart.
    pub(super) fn take_passthrough_writes(&self, ino: Ino) -> VfsResult<()> {
        let oi = self.open_inode(ino)?;
        let file = self.file_of(&oi, ino)?;
        let now = Seen::of(&file);
        // One stat gives both: a passthrough data file holds plaintext (never with
        // `--encrypt-cache`), so its length is the file's size.
        let size = match now {
            Some(seen) => seen.size,
            None => self.hot.data(&file, ino).plain_len()?,
        };
        let written = {
            let mut modes = oi.modes.lock();
            let before = std::mem::replace(&mut modes.seen, now);
            now.is_none() || before != now
        };
        if !written && size == 0 && self.record(ino)?.attr.size == 0 {
            // An empty data file the kernel did not touch (a file created and closed
            // unwritten): there is nothing to take in, and no commit to make.
            return Ok(());
        }
        let mut cold_write = match &self.cold {
            Some(cold) => Some(cold.begin_rewrite(ino, &file, size)?),
            None => None,
        };
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        // The kernel's writes may have left holes past the old end (a write past it); an
        // append leaves none.
        if size > rec.attr.size && rec.dense {
            let hole = self.hot.data(&file, ino).seek(rec.attr.size as i64, libc::SEEK_HOLE);
            rec.dense = hole.is_ok_and(|h| h as u64 >= size);
        }
        (rec.attr.size, rec.attr.blocks) = (size, size.div_ceil(512));
        if written {
            let mtime = now.map_or_else(Timestamp::now, |s| s.mtime);
            (rec.attr.mtime, rec.attr.ctime) = (mtime, mtime);
        }
        // The bytes landed already: the inode's dirty marker, committed at the writer's open,
        // covered them until now; the chunks' marks go in the same batch as the size.
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        self.commit_change(cold_write.as_mut(), b)
    }

    /// Takes in what every open passthrough writer wrote (see
    /// [`Vfs::take_passthrough_writes`]): before `tierfs sync` and the flush at unmount
    /// (`changed_only` false), and in the session's periodic round (every
    /// [`PASSTHROUGH_TAKE_IN`], `changed_only`: only files whose data file moved since their
    /// last take-in), so a writer that stays open does not keep its bytes from the store until
    /// it closes. An error is logged: the writer's own fsync or close reports it.
    pub fn take_in_passthrough_writers(&self, changed_only: bool) {
        if self.passthrough.writers.load(Ordering::Relaxed) == 0 {
            return;
        }
        let open: Vec<(Ino, Arc<OpenInode>)> = self.open.read().iter().map(|(i, o)| (*i, o.clone())).collect();
        for (ino, oi) in open {
            let seen = {
                let modes = oi.modes.lock();
                if !modes.has_writer() {
                    continue;
                }
                modes.seen
            };
            let moved = || oi.file.lock().as_deref().and_then(Seen::of) != seen;
            if changed_only && !moved() {
                continue;
            }
            if let Err(e) = self.take_passthrough_writes(ino) {
                tracing::warn!(ino, "taking in what a passthrough writer wrote: {e}");
            }
        }
    }

    /// Before a change of `ino` through this process (truncate, fallocate, a copy into it):
    /// what passthrough writers wrote is taken in first, so the change starts from the size
    /// the kernel's writes left.
    pub(super) fn catch_up_passthrough(&self, ino: Ino) -> VfsResult<()> {
        if self.passthrough_writing(ino) {
            self.take_passthrough_writes(ino)?;
        }
        Ok(())
    }

    /// `attr` as the kernel's writes left it while a passthrough writer may be moving the data
    /// file: its size and, once it was written since the last take-in, its mtime and ctime.
    pub(super) fn passthrough_attr(&self, ino: Ino, attr: &mut Attr) {
        if !self.passthrough_writing(ino) {
            return;
        }
        let Some(oi) = self.open.read().get(&ino).cloned() else { return };
        let Ok(file) = self.file_of(&oi, ino) else { return };
        let Some(now) = Seen::of(&file) else { return };
        (attr.size, attr.blocks) = (now.size, now.size.div_ceil(512));
        if oi.modes.lock().seen != Some(now) {
            (attr.mtime, attr.ctime) = (now.mtime, now.mtime);
        }
    }
}
