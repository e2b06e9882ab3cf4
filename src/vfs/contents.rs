//! File contents: opening, reading, writing, syncing and the calls that shape a file's
//! bytes (fallocate, lseek over holes, copy_file_range). Reads and writes take no lock on the
//! data: positional I/O on the data file, then a size update under the inode's stripe when a
//! write extends the file; space is claimed before a write lands, never after.

use super::namespace::NewNode;
use super::*;

impl Vfs {
    /// Takes `len` bytes of free disk space for a write (see [`HotTier::claim_space`]). With a
    /// store, a full disk is a throttle, not an error, while it can still make room: the
    /// write waits as long as uploads or evictions keep completing (dirty data becomes
    /// evictable once uploaded; the evictor runs every 200 ms and keeps twice the reserve
    /// free), and fails with ENOSPC only after 3 s without either.
    ///
    /// Data files that unlinks and renames freed but the mount is still removing (see
    /// [`DataFileRemoval`]) are waited for first, up to 5 s: a program that deletes a file to
    /// make room gets the room for its next write.
    pub(super) fn claim_space(&self, len: u64) -> VfsResult<()> {
        const STALL: std::time::Duration = std::time::Duration::from_secs(3);
        const REMOVALS: std::time::Duration = std::time::Duration::from_secs(5);
        let mut last = self.cold.as_ref().map(|c| (c.progress(), std::time::Instant::now()));
        let started = std::time::Instant::now();
        loop {
            let full = match self.hot.claim_space(len) {
                Ok(()) => return Ok(()),
                Err(e @ HotTierError::NoSpace { .. }) => e,
                Err(e) => return Err(e.into()),
            };
            if self.pending_removals.load(Ordering::Acquire) > 0 && started.elapsed() < REMOVALS {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            let (Some(cold), Some((seen, since))) = (&self.cold, &mut last) else { return Err(full.into()) };
            let now = cold.progress();
            if now != *seen {
                (*seen, *since) = (now, std::time::Instant::now());
            } else if since.elapsed() > STALL {
                return Err(full.into());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The data file of `ino`: the shared open one, or (for a file nobody has open, e.g.
    /// `truncate(2)` by path) a temporary one. `keep`: the caller needs the bytes (false for
    /// a truncate to 0, which may recreate a lost data file).
    pub(super) fn file_for(&self, ino: Ino, keep: bool) -> VfsResult<Arc<File>> {
        if let Some(oi) = self.open.read().get(&ino).cloned() {
            return self.file_of_for(&oi, ino, keep);
        }
        Ok(Arc::new(self.open_data_file(ino, keep)?))
    }

    /// Opens the data file of `ino`, sized to its record. A missing one is created, except
    /// when bytes of the file can only have lived there (`keep`, not empty, never had a hole,
    /// and not every chunk is in the store): then it is an error, never a file of zeros.
    fn open_data_file(&self, ino: Ino, keep: bool) -> VfsResult<File> {
        let rec = self.record(ino)?;
        let size = rec.attr.size;
        let only_here = keep && size > 0 && rec.dense && self.cold.as_ref().is_none_or(|c| !c.all_sealed(ino, size));
        Ok(self.hot.open_file(ino, size, !only_here)?)
    }

    pub(super) fn open_inode(&self, ino: Ino) -> VfsResult<Arc<OpenInode>> {
        self.open.read().get(&ino).cloned().ok_or(VfsError::BadHandle)
    }

    /// The data file of an open inode, opened (and sized to the record) on first use.
    pub(super) fn file_of(&self, oi: &OpenInode, ino: Ino) -> VfsResult<Arc<File>> {
        self.file_of_for(oi, ino, true)
    }

    fn file_of_for(&self, oi: &OpenInode, ino: Ino, keep: bool) -> VfsResult<Arc<File>> {
        let mut slot = oi.file.lock();
        if let Some(f) = slot.as_ref() {
            return Ok(f.clone());
        }
        let f = Arc::new(self.open_data_file(ino, keep)?);
        *slot = Some(f.clone());
        Ok(f)
    }

    /// The data file of `ino`, which must be open.
    pub(super) fn open_file(&self, ino: Ino) -> VfsResult<Arc<File>> {
        let oi = self.open_inode(ino)?;
        self.file_of(&oi, ino)
    }

    /// Registers one more handle on `ino`'s data file, opening it if it is the first.
    fn acquire_handle(&self, rec: &InodeRecord) -> VfsResult<u64> {
        let ino = rec.attr.ino;
        let mut open = self.open.write();
        if let Some(oi) = open.get(&ino) {
            oi.handles.fetch_add(1, Ordering::Relaxed);
        } else {
            if let Some(cold) = &self.cold {
                cold.set_open(ino, true);
            }
            open.insert(
                ino,
                Arc::new(OpenInode {
                    file: Mutex::new(None),
                    handles: AtomicU64::new(1),
                    dir_synced: AtomicBool::new(false),
                    orphaned: AtomicBool::new(rec.attr.nlink == 0),
                    linkable: AtomicBool::new(false),
                    modes: Mutex::new(passthrough::Modes::default()),
                }),
            );
        }
        Ok(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    pub fn open(&self, caller: &Caller, ino: Ino, flags: i32) -> VfsResult<u64> {
        // A follower's head switches before or after the open, never during it.
        let _switch = self.follow_guard();
        let rec = self.record(ino)?;
        match rec.attr.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(VfsError::IsDir),
            _ => return Err(VfsError::NotSupported("open of a special file through tierfs")),
        }
        let fh = self.acquire_handle(&rec)?;
        self.pin_version(ino, fh, rec.attr.size);
        if let Some(cold) = &self.cold {
            // A walk reaching a cold file: the next files of its directory are fetched ahead.
            if flags & libc::O_TRUNC == 0 && cold.first_chunk_evicted(ino) {
                let window = walk::Window::for_cache(cold.cache_size());
                // A file that streams is left to its reader (it would push the rest out).
                let bytes = |i| {
                    let rec = self.record(i).ok().filter(|r| !cold.streams(i, r.attr.size));
                    rec.map(|r| walk::Window::first_chunk(r.attr.size))
                };
                let ahead = self.walks.lock().ahead(ino, window, bytes);
                if let Some((dir, next)) = ahead {
                    cold.walk_ahead(ino, dir, next);
                }
            }
        }
        if flags & libc::O_TRUNC != 0 {
            let trunc = SetAttr { size: Some(0), ..SetAttr::default() };
            if let Err(e) = self.setattr(caller, ino, &trunc, Some(fh)) {
                self.release(ino, fh)?;
                return Err(e);
            }
        }
        Ok(fh)
    }

    pub fn create(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> VfsResult<(Attr, u64)> {
        let (attr, fh, _) = self.create_handle(caller, parent, name, (mode, umask, flags), false)?;
        Ok((attr, fh))
    }

    /// [`Vfs::create`] and [`Vfs::open_for`]'s choice for its handle, for a front end that
    /// serves passthrough: the handle is decided as a writer's open. A new file's writer goes
    /// through passthrough when it can, and its dirty marker then commits in the create's own
    /// batch (one commit, not two). On an error the handle is released.
    pub fn create_open(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: (u32, u32),
        flags: i32,
    ) -> VfsResult<(Attr, Opened)> {
        let marker = self.passthrough_wanted() && self.room_for_a_writer();
        let (attr, fh, made) = self.create_handle(caller, parent, name, (mode.0, mode.1, flags), marker)?;
        let opened = self
            .choose_mode(attr.ino, fh, libc::O_WRONLY, made && marker)
            .and_then(|o| self.joined_writer(caller, attr.ino, libc::O_WRONLY, o))
            .inspect_err(|_| {
                let _ = self.release(attr.ino, fh);
            })?;
        Ok((attr, opened))
    }

    /// [`Vfs::create`], with the passthrough marker in the batch when `marker` (see
    /// [`Vfs::create_open`]), and whether it made the file (else it opened an existing one).
    fn create_handle(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        (mode, umask, flags): (u32, u32, i32),
        marker: bool,
    ) -> VfsResult<(Attr, u64, bool)> {
        let node =
            NewNode { kind: FileKind::File, perm: mode & !umask, rdev: 0, symlink: None, passthrough_marker: marker };
        match self.create_node(caller, parent, name, node) {
            Ok(attr) => {
                let fh =
                    self.acquire_handle(&InodeRecord { attr: attr.clone(), parent, dense: true, no_xattrs: true })?;
                Ok((attr, fh, true))
            }
            Err(VfsError::Exists) if flags & libc::O_EXCL == 0 => {
                let attr = self.lookup(parent, name)?;
                let fh = self.open(caller, attr.ino, flags)?;
                Ok((self.getattr(attr.ino)?, fh, false))
            }
            Err(e) => Err(e),
        }
    }

    /// `open(parent, O_TMPFILE)`: a new regular file in no directory, open (a handle, as
    /// [`Vfs::create`] gives), whose last release reclaims it unless [`Vfs::link`] named it
    /// first; an orphan from its first batch on (`create_unnamed`). With
    /// `O_EXCL` in `flags` it can never be named (the kernel refuses that `linkat` itself).
    /// Its handle is chosen as [`Vfs::create_open`] chooses a new file's.
    pub fn tmpfile(
        &self,
        caller: &Caller,
        parent: Ino,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> VfsResult<(Attr, Opened)> {
        let rec = self.create_unnamed(caller, parent, mode & !umask)?;
        let fh = self.acquire_handle(&rec)?;
        if flags & libc::O_EXCL == 0 {
            self.open_inode(rec.attr.ino)?.linkable.store(true, Ordering::Relaxed);
        }
        // Decided as a writer's open, as a create's handle is (its marker in a batch of its own).
        let opened = self.choose_mode(rec.attr.ino, fh, libc::O_WRONLY, false).inspect_err(|_| {
            let _ = self.release(rec.attr.ino, fh);
        })?;
        Ok((rec.attr, opened))
    }

    /// Whether a read of `len` bytes at `offset` (or a write, with `write`) may wait for more
    /// than the local disk: a fetch from the store, the dirty bound, or free space in the hot
    /// tier. A hint for callers that serve many requests on few threads (the FUSE adapter
    /// runs such calls off its request thread); it may be stale as soon as it is given.
    pub fn may_wait(&self, ino: Ino, offset: u64, len: u64, write: bool) -> bool {
        let Some(cold) = &self.cold else { return false };
        if self.follow.is_some() {
            // The version a handle reads may be the store's only (see `follow`).
            return true;
        }
        let range = offset..offset.saturating_add(len);
        cold.may_wait(ino, range, write) || (write && self.hot.may_be_full(len))
    }

    pub fn read(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> VfsResult<Vec<u8>> {
        self.read_bytes(ino, fh, offset, size).map(Vec::from)
    }

    /// [`Vfs::read`] without a copy where the bytes are in memory already (a streamed read
    /// inside one block is a view of that block).
    pub fn read_bytes(&self, ino: Ino, fh: u64, offset: u64, size: u32) -> VfsResult<Bytes> {
        let range = offset..offset.saturating_add(u64::from(size));
        if let Some(follow) = &self.follow {
            return self.read_followed(follow, ino, fh, range);
        }
        let mut size = size as usize;
        if self.cold.is_some() || self.hot.encrypted() {
            let file_size = self.record(ino)?.attr.size;
            // A file too large to stay cached is read from the store's blocks in memory.
            if let Some(data) =
                self.cold.as_ref().map(|c| c.read_streamed(ino, range.clone(), file_size)).transpose()?.flatten()
            {
                return Ok(data);
            }
            if self.hot.encrypted() {
                // An encrypted data file ends on a cipher block: never show its padding.
                size = size.min(file_size.saturating_sub(offset) as usize);
            }
        }
        let file = self.open_file(ino)?;
        let _pinned = match &self.cold {
            Some(cold) => Some(cold.begin_read(ino, &file, range)?),
            None => None,
        };
        Ok(Bytes::from(self.hot.data(&file, ino).read_at(offset, size)?))
    }

    pub fn write(&self, ino: Ino, _fh: u64, offset: u64, data: &[u8]) -> VfsResult<u32> {
        if data.is_empty() {
            // A zero-length write changes nothing, not even the size when past the end.
            return Ok(0);
        }
        // As ext4 does at its size limit: a write that starts below it is cut short there
        // (the caller sees a short count), one that starts at or past it is EFBIG.
        if offset >= MAX_FILE_SIZE {
            return Err(VfsError::TooBig);
        }
        let data = &data[..data.len().min((MAX_FILE_SIZE - offset) as usize)];
        let end = offset + data.len() as u64;
        self.claim_space(data.len() as u64)?;
        let file = self.open_file(ino)?;
        // Held until the new size is committed, so the chunk is not sealed in between.
        let mut cold_write = match &self.cold {
            Some(cold) => Some(cold.begin_write(ino, &file, offset..end, u64::MAX, true)?),
            None => None,
        };
        let out = self.hot.data(&file, ino);
        if cold_write.as_ref().is_some_and(WriteGuard::has_marks) {
            // A chunk turned dirty: its mark, the size and the times commit first, in one
            // batch, then the bytes land (docs/ARCHITECTURE.md, "One commit per change").
            let _g = self.lock_inodes(&[ino]);
            let old = self.record(ino)?;
            let rec = self.written(old.clone(), offset, end).0;
            return self.commit_then_land(cold_write.as_mut(), MetaBatch::new(), &old, &rec, || {
                out.write_at(offset, data)?;
                Ok(data.len() as u32)
            });
        }
        out.write_at(offset, data)?;
        let _g = self.lock_inodes(&[ino]);
        let (rec, changed) = self.written(self.record(ino)?, offset, end);
        // Setuid and setgid were cleared before this, when the writer lacks CAP_FSETID
        // (`Vfs::drop_setid`, called by the front end, which the kernel tells).
        if changed {
            let mut b = MetaBatch::new();
            b.put_inode(&rec);
            self.commit_change(cold_write.as_mut(), b)?;
        }
        Ok(data.len() as u32)
    }

    /// `rec` after a write of `offset..end`: the size it reaches and the times it sets, and
    /// whether anything changed.
    fn written(&self, mut rec: InodeRecord, offset: u64, end: u64) -> (InodeRecord, bool) {
        let mut changed = false;
        if offset > rec.attr.size {
            rec.dense = false; // the bytes between the old end and `offset` are a hole
        }
        if end > rec.attr.size {
            rec.attr.size = end;
            rec.attr.blocks = end.div_ceil(512);
            changed = true;
        }
        if !self.config.kernel_owns_times {
            let now = Timestamp::now();
            rec.attr.mtime = now;
            rec.attr.ctime = now;
            changed = true;
        }
        (rec, changed)
    }

    /// Commits `b` with the marks of the change `guard` holds (if any), as one batch.
    pub(super) fn commit_change(&self, guard: Option<&mut WriteGuard<'_>>, b: MetaBatch) -> VfsResult<()> {
        match guard {
            Some(guard) => Ok(guard.commit(b)?),
            None => Ok(self.meta.commit(b)?),
        }
    }

    /// The order of a change that marks chunks dirty (docs/ARCHITECTURE.md, "One commit per
    /// change"): `b`, the new record `rec` and the change's marks commit as one batch, then
    /// `land` changes the bytes. If that fails, `old` is put back (a second commit, on the
    /// error path only): a failed change leaves no size that claims bytes that did not land,
    /// and no times of a change that did not happen. A shrink keeps its smaller size: `b`
    /// dropped the records past it.
    /// The caller holds the inode's stripe throughout, so no other change of the record comes
    /// between.
    pub(super) fn commit_then_land<T>(
        &self,
        guard: Option<&mut WriteGuard<'_>>,
        mut b: MetaBatch,
        old: &InodeRecord,
        rec: &InodeRecord,
        land: impl FnOnce() -> VfsResult<T>,
    ) -> VfsResult<T> {
        b.put_inode(rec);
        self.commit_change(guard, b)?;
        land().or_else(|e| {
            // A shrink dropped the records past its new end in `b`: its smaller size stays (a
            // crash trims, never resurrects), and the rest of `old` comes back.
            let mut back = old.clone();
            if rec.attr.size < old.attr.size {
                (back.attr.size, back.attr.blocks, back.dense) = (rec.attr.size, rec.attr.blocks, rec.dense);
            }
            if back != *rec {
                let mut b = MetaBatch::new();
                b.put_inode(&back);
                self.meta.commit(b)?;
            }
            Err(e)
        })
    }

    /// Takes back a size `rec` committed past `landed` (but never below `old`'s): the bytes
    /// up to `rec`'s size did not all land.
    fn cut_back(&self, old: &InodeRecord, rec: &InodeRecord, landed: u64) -> VfsResult<()> {
        let size = landed.max(old.attr.size);
        if rec.attr.size <= size {
            return Ok(());
        }
        let mut back = rec.clone();
        back.attr.size = size;
        back.attr.blocks = size.div_ceil(512);
        if size == old.attr.size {
            back.dense = old.dense;
        }
        let mut b = MetaBatch::new();
        b.put_inode(&back);
        Ok(self.meta.commit(b)?)
    }

    pub fn flush(&self, _ino: Ino, _fh: u64) -> VfsResult<()> {
        // close() promises nothing beyond what write() already did (docs/SEMANTICS.md, "Durability").
        Ok(())
    }

    pub fn release(&self, ino: Ino, fh: u64) -> VfsResult<()> {
        self.unpin_version(fh);
        // A passthrough writer's changes are taken in before the handle goes (an error is
        // reported after it went: the kernel closes the file whatever this returns).
        let taken = self.release_mode(ino, fh);
        let reclaim = {
            let mut open = self.open.write();
            let Some(oi) = open.get(&ino) else { return Err(VfsError::BadHandle) };
            if oi.handles.fetch_sub(1, Ordering::Relaxed) == 1 {
                let orphaned = oi.orphaned.load(Ordering::Relaxed);
                open.remove(&ino);
                if let Some(cold) = &self.cold {
                    cold.set_open(ino, false);
                }
                orphaned
            } else {
                false
            }
        };
        if reclaim {
            let _ns = self.namespace.lock();
            if let Some(rec) = self.meta.inode(ino)? {
                if rec.attr.nlink == 0 && !self.open.read().contains_key(&ino) {
                    self.reclaim(ino)?;
                    self.inode_count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        taken
    }

    pub fn fsync(&self, ino: Ino, _fh: u64, _datasync: bool) -> VfsResult<()> {
        let oi = self.open.read().get(&ino).cloned();
        if let Some(oi) = oi {
            let file = oi.file.lock().clone();
            let Some(file) = file else {
                // No data file yet: nothing but metadata to make durable.
                self.meta.sync()?;
                return self.wait_remote(Some(ino));
            };
            self.hot.data(&file, ino).sync_data()?;
            if !oi.dir_synced.swap(true, Ordering::Relaxed) {
                self.hot.sync_dir_of(ino)?;
            }
        }
        // A passthrough writer's bytes are taken in after the data file is synced: the sync
        // cleaned its pages, so a write from now on moves its mtime again (a write through a
        // mapping faults anew), and everything before is in the take-in's marks.
        self.catch_up_passthrough(ino)?;
        self.meta.sync()?;
        self.wait_remote(Some(ino))
    }

    pub fn fallocate(&self, ino: Ino, _fh: u64, offset: u64, length: u64, mode: i32) -> VfsResult<()> {
        const SUPPORTED: i32 = libc::FALLOC_FL_KEEP_SIZE
            | libc::FALLOC_FL_PUNCH_HOLE
            | libc::FALLOC_FL_ZERO_RANGE
            | libc::FALLOC_FL_COLLAPSE_RANGE
            | libc::FALLOC_FL_INSERT_RANGE;
        if mode & !SUPPORTED != 0 {
            return Err(VfsError::NotSupported("fallocate mode"));
        }
        self.catch_up_passthrough(ino)?;
        let end = offset.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?;
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_COLLAPSE_RANGE) == 0 {
            self.claim_space(length)?; // allocates (or zeroes, which may allocate)
        }
        let file = self.open_file(ino)?;
        let data = self.hot.data(&file, ino);
        let _g = self.lock_inodes(&[ino]);
        let old = self.record(ino)?;
        let mut rec = old.clone();
        // Every mode may leave a hole or allocate past the end: st_blocks comes from the data file.
        rec.dense = false;
        let new_size = fallocated_size(mode, old.attr.size, length, end)?;
        let mut cold_write = self.begin_fallocate(ino, &file, mode, offset..end, old.attr.size)?;
        let now = Timestamp::now();
        rec.attr.size = new_size;
        rec.attr.blocks = new_size.div_ceil(512);
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 || new_size != old.attr.size {
            rec.attr.mtime = now;
        }
        rec.attr.ctime = now;
        let mut b = MetaBatch::new();
        let shrinks = new_size < old.attr.size;
        if let Some(cold) = self.cold.as_ref().filter(|_| shrinks) {
            cold.truncate(ino, new_size, &mut b);
        }
        if shrinks || cold_write.as_ref().is_some_and(WriteGuard::has_marks) {
            // Marks, and a smaller size (a crash then trims, never resurrects), before the
            // bytes change: one batch with the rest (docs/ARCHITECTURE.md, "One commit per change").
            return self
                .commit_then_land(cold_write.as_mut(), b, &old, &rec, || Ok(data.fallocate(mode, offset, length)?));
        }
        data.fallocate(mode, offset, length)?;
        b.put_inode(&rec);
        self.commit_change(cold_write.as_mut(), b)
    }

    /// Marks what a fallocate of `range` with `mode` changes in a file of `size` bytes: collapse
    /// and insert move every byte after the range's start (all of it must be local), punch
    /// hole and zero range zero the range; allocating keeps every byte as it was (zeros where
    /// there were holes) and marks nothing.
    fn begin_fallocate<'a>(
        &'a self,
        ino: Ino,
        file: &File,
        mode: i32,
        range: std::ops::Range<u64>,
        size: u64,
    ) -> VfsResult<Option<WriteGuard<'a>>> {
        let Some(cold) = &self.cold else { return Ok(None) };
        let len = range.end - range.start;
        if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
            let insert = mode & libc::FALLOC_FL_INSERT_RANGE != 0;
            return Ok(Some(cold.begin_shift(ino, file, range.start, len, insert, size)?));
        }
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
            return Ok(Some(cold.begin_zero(ino, file, range, size)?));
        }
        Ok(None)
    }

    /// Reads of `ino` are cached from now on, whatever its size ([`IOCTL_KEEP_CACHED`]).
    pub fn keep_cached(&self, ino: Ino) -> VfsResult<()> {
        if self.record(ino)?.attr.kind != FileKind::File {
            return Err(VfsError::Invalid("only regular files are cached"));
        }
        if let Some(cold) = &self.cold {
            cold.keep_cached(ino);
        }
        Ok(())
    }

    pub fn lseek(&self, ino: Ino, _fh: u64, offset: i64, whence: i32) -> VfsResult<i64> {
        let file = self.open_file(ino)?;
        // `getattr`'s size: a passthrough writer's too.
        let size = self.getattr(ino)?.size as i64;
        if offset < 0 {
            return Err(VfsError::Invalid("negative offset"));
        }
        match whence {
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                if offset >= size {
                    return Err(VfsError::NoDataAfter);
                }
                // Evicted chunks are holes in the data file but data to the program.
                let _pinned = match &self.cold {
                    Some(cold) => Some(cold.begin_read_all(ino, &file)?),
                    None => None,
                };
                Ok(self.hot.data(&file, ino).seek(offset, whence)?.min(size))
            }
            libc::SEEK_SET => Ok(offset),
            libc::SEEK_END => Ok(size + offset),
            _ => Err(VfsError::Invalid("lseek whence")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: Ino,
        _fh_in: u64,
        off_in: u64,
        ino_out: Ino,
        _fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> VfsResult<u64> {
        self.catch_up_passthrough(ino_in)?;
        self.catch_up_passthrough(ino_out)?;
        let src = self.open_file(ino_in)?;
        let dst = self.open_file(ino_out)?;
        let in_size = self.record(ino_in)?.attr.size;
        let len = len.min(in_size.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        let end = off_out.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?;
        self.claim_space(len)?;
        let (_pinned, mut cold_write) = match &self.cold {
            Some(cold) => {
                let pinned = cold.begin_read(ino_in, &src, off_in..off_in + len)?;
                (Some(pinned), Some(cold.begin_write(ino_out, &dst, off_out..end, u64::MAX, true)?))
            }
            None => (None, None),
        };
        let copy = || Ok(self.hot.data(&src, ino_in).copy_to(off_in, &self.hot.data(&dst, ino_out), off_out, len)?);
        let copied_rec = |mut rec: InodeRecord, copied: u64| {
            let now = Timestamp::now();
            rec.dense = false; // the copy keeps the source's holes, and may start past the end
            rec.attr.size = rec.attr.size.max(end.min(off_out + copied));
            rec.attr.blocks = rec.attr.size.div_ceil(512);
            rec.attr.mtime = now;
            rec.attr.ctime = now;
            rec
        };
        if cold_write.as_ref().is_some_and(WriteGuard::has_marks) {
            // Marks, size and times first, in one batch (docs/ARCHITECTURE.md, "One commit per
            // change"); a copy cut short takes back the size it did not reach.
            let _g = self.lock_inodes(&[ino_out]);
            let old = self.record(ino_out)?;
            let rec = copied_rec(old.clone(), len);
            let copied = self.commit_then_land(cold_write.as_mut(), MetaBatch::new(), &old, &rec, copy)?;
            self.cut_back(&old, &rec, off_out + copied)?;
            return Ok(copied);
        }
        let copied = copy()?;
        let _g = self.lock_inodes(&[ino_out]);
        let rec = copied_rec(self.record(ino_out)?, copied);
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        self.commit_change(cold_write.as_mut(), b)?;
        Ok(copied)
    }
}

/// A file's size after a fallocate of `length` bytes ending at `end` with `mode`, from `old`.
fn fallocated_size(mode: i32, old: u64, length: u64, end: u64) -> VfsResult<u64> {
    Ok(if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 {
        old.saturating_sub(length)
    } else if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
        old.checked_add(length).filter(|&e| e <= MAX_FILE_SIZE).ok_or(VfsError::TooBig)?
    } else if mode & libc::FALLOC_FL_KEEP_SIZE != 0 {
        old
    } else {
        old.max(end)
    })
}
