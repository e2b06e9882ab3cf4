//! The namespace: making nodes, hard links, unlinks and renames. Each is one metadata batch
//! taken under the namespace lock, so its checks and its changes see one tree; the data
//! file an unlink or rename frees is removed after the batch ([`DataFileRemoval`]), outside
//! every lock.

use super::*;

impl Vfs {
    /// Creates a new inode named `name` in `parent` (one batch: inode, entry, parent times).
    pub(super) fn create_node(&self, caller: &Caller, parent: Ino, name: &[u8], node: NewNode<'_>) -> VfsResult<Attr> {
        check_name(name)?;
        let _ns = self.namespace.lock();
        let _g = self.lock_inodes(&[parent]);
        let mut dir = self.dir_record(parent)?;
        if name == b"." || name == b".." || self.meta.dentry(parent, name)?.is_some() {
            return Err(VfsError::Exists);
        }
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        let rec = self.new_node(&mut b, caller, &dir, &node, now);
        b.put_inode(&rec);
        b.put_dentry(parent, name, rec.attr.ino, node.kind);
        if node.passthrough_marker {
            b.put_dirty_passthrough(rec.attr.ino);
        }
        if node.kind == FileKind::Dir {
            dir.attr.nlink += 1;
        }
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        self.commit_new_inodes(b)?;
        self.inode_count.fetch_add(1, Ordering::Relaxed);
        Ok(rec.attr)
    }

    /// A new file of `perm` in no directory (`O_TMPFILE`): an inode as [`Self::create_node`]
    /// makes one in `parent` (the caller's owner, a setgid directory's group) but with no
    /// entry and no link, marked orphan in the same batch, so that a crash before a
    /// [`Vfs::link`] gives it a name reclaims it at the next start, as it does a file
    /// unlinked while open. `parent` is not changed (as on ext4). The caller opens it at once.
    pub(super) fn create_unnamed(&self, caller: &Caller, parent: Ino, perm: u32) -> VfsResult<InodeRecord> {
        let _ns = self.namespace.lock();
        let _g = self.lock_inodes(&[parent]);
        let dir = self.dir_record(parent)?;
        let mut b = MetaBatch::new();
        let node = NewNode { kind: FileKind::File, perm, rdev: 0, symlink: None, passthrough_marker: false };
        let mut rec = self.new_node(&mut b, caller, &dir, &node, Timestamp::now());
        rec.attr.nlink = 0;
        b.put_inode(&rec);
        b.put_orphan(rec.attr.ino);
        self.commit_new_inodes(b)?;
        self.inode_count.fetch_add(1, Ordering::Relaxed);
        Ok(rec)
    }

    /// A new inode of `node`'s kind in directory `dir`, owned by the caller, for the caller
    /// to put in `b` with its entry (a symlink's target is put here).
    fn new_node(
        &self,
        b: &mut MetaBatch,
        caller: &Caller,
        dir: &InodeRecord,
        node: &NewNode<'_>,
        now: Timestamp,
    ) -> InodeRecord {
        let mut perm = node.perm & 0o7777;
        let mut gid = caller.gid;
        if dir.attr.perm & libc::S_ISGID as u16 != 0 {
            // setgid directory: new entries take its group, new directories its setgid bit.
            gid = dir.attr.gid;
            if node.kind == FileKind::Dir {
                perm |= libc::S_ISGID;
            }
        }
        let ino = self.alloc_ino(b);
        let size = node.symlink.map_or(0, |t| t.len() as u64);
        let rec = InodeRecord {
            attr: Attr {
                ino,
                kind: node.kind,
                perm: perm as u16,
                nlink: if node.kind == FileKind::Dir { 2 } else { 1 },
                uid: caller.uid,
                gid,
                rdev: node.rdev,
                size,
                blocks: size.div_ceil(512),
                atime: now,
                mtime: now,
                ctime: now,
                crtime: now,
            },
            parent: dir.attr.ino,
            // A new file is empty: no holes yet.
            dense: node.kind == FileKind::File,
            no_xattrs: true,
        };
        if let Some(target) = node.symlink {
            b.put_symlink(ino, target);
        }
        rec
    }

    pub fn mknod(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> VfsResult<Attr> {
        let kind = FileKind::from_mode(mode).unwrap_or(FileKind::File);
        if matches!(kind, FileKind::Dir | FileKind::Symlink) {
            return Err(VfsError::Invalid("mknod of a directory or symlink"));
        }
        let rdev = if matches!(kind, FileKind::CharDev | FileKind::BlockDev) { rdev } else { 0 };
        self.create_node(
            caller,
            parent,
            name,
            NewNode { kind, perm: mode & !umask, rdev, symlink: None, passthrough_marker: false },
        )
    }

    pub fn mkdir(&self, caller: &Caller, parent: Ino, name: &[u8], mode: u32, umask: u32) -> VfsResult<Attr> {
        self.create_node(
            caller,
            parent,
            name,
            NewNode { kind: FileKind::Dir, perm: mode & !umask, rdev: 0, symlink: None, passthrough_marker: false },
        )
    }

    pub fn symlink(&self, caller: &Caller, parent: Ino, name: &[u8], target: &[u8]) -> VfsResult<Attr> {
        if target.is_empty() {
            return Err(VfsError::NotFound);
        }
        if target.len() > crate::types::SYMLINK_MAX {
            return Err(VfsError::NameTooLong);
        }
        self.create_node(
            caller,
            parent,
            name,
            NewNode { kind: FileKind::Symlink, perm: 0o777, rdev: 0, symlink: Some(target), passthrough_marker: false },
        )
    }

    pub fn link(&self, _caller: &Caller, ino: Ino, new_parent: Ino, new_name: &[u8]) -> VfsResult<Attr> {
        check_name(new_name)?;
        let _ns = self.namespace.lock();
        let _g = self.lock_inodes(&[ino, new_parent]);
        let mut dir = self.dir_record(new_parent)?;
        let mut rec = self.record(ino)?;
        if rec.attr.kind == FileKind::Dir {
            return Err(VfsError::NotPermitted);
        }
        // A file with no link may get one only if it is an open `O_TMPFILE` file that was
        // not opened with `O_EXCL` (as the kernel's I_LINKABLE).
        let adopted = match rec.attr.nlink {
            0 => Some(
                self.open
                    .read()
                    .get(&ino)
                    .filter(|oi| oi.linkable.load(Ordering::Relaxed))
                    .cloned()
                    .ok_or(VfsError::NotFound)?,
            ),
            u32::MAX => return Err(VfsError::TooManyLinks),
            _ => None,
        };
        if self.meta.dentry(new_parent, new_name)?.is_some() {
            return Err(VfsError::Exists);
        }
        let now = Timestamp::now();
        rec.attr.nlink += 1;
        rec.attr.ctime = now;
        let mut b = MetaBatch::new();
        b.put_dentry(new_parent, new_name, ino, rec.attr.kind);
        if adopted.is_some() {
            // Its first name: no longer an orphan, in the batch that names it.
            rec.parent = new_parent;
            b.delete_orphan(ino);
        }
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        if let Some(oi) = adopted {
            oi.orphaned.store(false, Ordering::Relaxed);
            // Once named, it is a file like any other (linked again only while it has a name).
            oi.linkable.store(false, Ordering::Relaxed);
        }
        Ok(self.attr_of(rec))
    }

    /// Drops one link of `rec` (already removed from its directory in `b`): the inode is
    /// deleted when no link and no open handle remains, or marked orphan while still open.
    fn drop_link(&self, b: &mut MetaBatch, rec: &mut InodeRecord, now: Timestamp) -> VfsResult<bool> {
        rec.attr.nlink = if rec.attr.kind == FileKind::Dir { 0 } else { rec.attr.nlink.saturating_sub(1) };
        rec.attr.ctime = now;
        if rec.attr.nlink > 0 {
            b.put_inode(rec);
            return Ok(false);
        }
        if let Some(oi) = self.open.read().get(&rec.attr.ino) {
            oi.orphaned.store(true, Ordering::Relaxed);
            b.put_inode(rec);
            b.put_orphan(rec.attr.ino);
            return Ok(false);
        }
        // It had a link until now, so it is no orphan.
        self.delete_inode_records(b, rec.attr.ino, Some(&*rec), false)?;
        Ok(true)
    }

    /// Deletes the records of an inode that is gone. Keys it cannot have (the symlink target
    /// of a file, xattrs of an inode that never had one, the orphan marker of one that was
    /// never an orphan) are not deleted: every delete leaves a tombstone that later reads skip
    /// over. `rec` is `None` when the inode record is missing: everything is deleted then.
    fn delete_inode_records(
        &self,
        b: &mut MetaBatch,
        ino: Ino,
        rec: Option<&InodeRecord>,
        orphan: bool,
    ) -> VfsResult<()> {
        b.delete_inode(ino);
        if rec.is_none_or(|r| r.attr.kind == FileKind::Symlink) {
            b.delete_symlink(ino);
        }
        if orphan {
            b.delete_orphan(ino);
        }
        if let Some(cold) = &self.cold {
            cold.forget(ino, b);
        }
        if rec.is_none_or(|r| !r.no_xattrs) {
            for name in self.meta.xattr_names(ino)? {
                b.delete_xattr(ino, &name);
            }
        }
        Ok(())
    }

    /// Frees an orphan (no links, no handles): records first, then its data file.
    pub(super) fn reclaim(&self, ino: Ino) -> VfsResult<()> {
        let mut b = MetaBatch::new();
        let rec = self.meta.inode(ino)?;
        self.delete_inode_records(&mut b, ino, rec.as_ref(), true)?;
        self.meta.commit(b)?;
        self.hot.remove(ino)?;
        Ok(())
    }

    /// Removes the data files of inodes that no longer exist: what a crash between an
    /// unlink's commit and the removal of its data file left behind (see [`DataFileRemoval`]).
    /// Looks only at inode numbers handed out before the call: those are never reused, so one
    /// without a record is gone for good. Returns how many files it removed. The daemon runs
    /// it on a background thread after each mount; `stop` set ends it after the file at hand.
    pub fn sweep_leftover_data_files(&self, stop: &std::sync::atomic::AtomicBool) -> VfsResult<u64> {
        let below = self.next_ino.load(Ordering::Relaxed);
        let mut removed = 0;
        for ino in self.hot.data_file_inos()? {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if ino < below && !self.meta.inode_exists(ino)? {
                self.hot.remove(ino)?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The removal of the data file of a freed inode (ino, size), counted as pending until
    /// it finishes.
    pub(super) fn removal(&self, freed: Option<(Ino, u64)>) -> DataFileRemoval {
        if freed.is_some() {
            self.pending_removals.fetch_add(1, Ordering::Relaxed);
        }
        DataFileRemoval { freed }
    }

    fn remove_entry(&self, parent: Ino, name: &[u8], want_dir: bool) -> VfsResult<DataFileRemoval> {
        if name.len() > NAME_MAX {
            return Err(VfsError::NameTooLong);
        }
        if want_dir && name == b"." {
            return Err(VfsError::Invalid("rmdir of ."));
        }
        if want_dir && name == b".." {
            return Err(VfsError::NotEmpty);
        }
        let _ns = self.namespace.lock();
        self.dir_record(parent)?;
        let (ino, kind) = self.meta.dentry(parent, name)?.ok_or(VfsError::NotFound)?;
        let _g = self.lock_inodes(&[parent, ino]);
        let mut dir = self.dir_record(parent)?;
        let mut rec = self.record(ino)?;
        match (want_dir, kind == FileKind::Dir) {
            (true, false) => return Err(VfsError::NotDir),
            (false, true) => return Err(VfsError::IsDir),
            (true, true) if !self.meta.dir_is_empty(ino)? => return Err(VfsError::NotEmpty),
            _ => {}
        }
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        b.delete_dentry(parent, name);
        if want_dir {
            dir.attr.nlink -= 1;
        }
        Self::touch_dir(&mut dir, now);
        b.put_inode(&dir);
        let freed = self.drop_link(&mut b, &mut rec, now)?;
        self.meta.commit(b)?;
        if freed {
            self.inode_count.fetch_sub(1, Ordering::Relaxed);
        }
        // A directory has no data file.
        Ok(self.removal((freed && !want_dir).then_some((ino, rec.attr.size))))
    }

    pub fn unlink(&self, caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<()> {
        self.unlink_deferred(caller, parent, name)?.finish(self)
    }

    /// `unlink`, leaving the removal of a freed inode's data file to the caller (see
    /// [`DataFileRemoval`]): the mount replies first and removes the file after.
    pub fn unlink_deferred(&self, _caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<DataFileRemoval> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, _caller: &Caller, parent: Ino, name: &[u8]) -> VfsResult<()> {
        self.remove_entry(parent, name, true)?.finish(self)
    }

    /// True if directory `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&self, ancestor: Ino, mut dir: Ino) -> VfsResult<bool> {
        loop {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.record(dir)?.parent;
        }
    }

    pub fn rename(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> VfsResult<()> {
        self.rename_deferred(caller, parent, name, new_parent, new_name, flags)?.finish(self)
    }

    /// `rename`, leaving the removal of a replaced inode's data file to the caller (see
    /// [`DataFileRemoval`]).
    pub fn rename_deferred(
        &self,
        caller: &Caller,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> VfsResult<DataFileRemoval> {
        check_rename(name, new_name, flags)?;
        let _ns = self.namespace.lock();
        // A parent that is not a directory is ENOTDIR before any name is looked up.
        self.dir_record(parent)?;
        self.dir_record(new_parent)?;
        let (src, src_kind) = self.meta.dentry(parent, name)?.ok_or(VfsError::NotFound)?;
        let dst = self.meta.dentry(new_parent, new_name)?;
        let mut locked = vec![parent, new_parent, src];
        if let Some((d, _)) = dst {
            locked.push(d);
        }
        let _g = self.lock_inodes(&locked);
        self.dir_record(parent)?;
        self.dir_record(new_parent)?;
        let now = Timestamp::now();
        let mut b = MetaBatch::new();
        // Records touched by this rename, keyed by inode so a directory that is both a parent
        // and a moved entry is updated once, consistently.
        let mut recs: HashMap<Ino, InodeRecord> = HashMap::new();
        for ino in [parent, new_parent, src] {
            self.load_record(ino, &mut recs)?;
        }
        let src_is_dir = src_kind == FileKind::Dir;
        if src_is_dir && new_parent != parent && self.is_ancestor(src, new_parent)? {
            return Err(VfsError::Invalid("cannot move a directory into itself"));
        }
        let mut freed = None;
        let mut whiteout = false;
        if flags.exchange {
            let (dst_ino, dst_kind) = dst.ok_or(VfsError::NotFound)?;
            if dst_ino == src {
                return Ok(self.removal(None));
            }
            self.load_record(dst_ino, &mut recs)?;
            let dst_is_dir = dst_kind == FileKind::Dir;
            if dst_is_dir && parent != new_parent && self.is_ancestor(dst_ino, parent)? {
                return Err(VfsError::Invalid("cannot move a directory into itself"));
            }
            b.put_dentry(parent, name, dst_ino, dst_kind);
            b.put_dentry(new_parent, new_name, src, src_kind);
            if parent != new_parent && src_is_dir != dst_is_dir {
                let (gains, loses) = if src_is_dir { (new_parent, parent) } else { (parent, new_parent) };
                move_dir_link(&mut recs, loses, gains);
            }
            reparent(&mut recs, src, new_parent, now);
            reparent(&mut recs, dst_ino, parent, now);
        } else {
            if let Some((dst_ino, dst_kind)) = dst {
                if dst_ino == src && !flags.noreplace {
                    // Two names of one inode: POSIX says do nothing.
                    return Ok(self.removal(None));
                }
                self.check_replace(src_is_dir, (dst_ino, dst_kind), flags)?;
                freed = self.replace_entry(&mut b, &mut recs, (dst_ino, dst_kind), new_parent, now)?;
            }
            b.put_dentry(new_parent, new_name, src, src_kind);
            if src_is_dir && parent != new_parent {
                move_dir_link(&mut recs, parent, new_parent);
            }
            reparent(&mut recs, src, new_parent, now);
            whiteout = self.leave_behind(&mut b, caller, &recs, (parent, name), flags, now)?;
        }
        self.commit_rename(b, recs, [parent, new_parent], now, freed.is_some(), whiteout)?;
        Ok(self.removal(freed.filter(|_| !src_is_dir)))
    }
}

impl Vfs {
    /// Adds the record of `ino` to a rename's `recs` unless it is there already.
    fn load_record(&self, ino: Ino, recs: &mut HashMap<Ino, InodeRecord>) -> VfsResult<()> {
        if let std::collections::hash_map::Entry::Vacant(slot) = recs.entry(ino) {
            slot.insert(self.record(ino)?);
        }
        Ok(())
    }

    /// Drops the entry `dst` that a rename replaces in `new_parent` (already checked by
    /// [`Self::check_replace`]): a directory's `..` link from `new_parent`, and the victim's
    /// link in `b`. Its record leaves `recs`. Returns the inode and size freed when that was
    /// its last link.
    fn replace_entry(
        &self,
        b: &mut MetaBatch,
        recs: &mut HashMap<Ino, InodeRecord>,
        dst: (Ino, FileKind),
        new_parent: Ino,
        now: Timestamp,
    ) -> VfsResult<Option<(Ino, u64)>> {
        let (dst_ino, dst_kind) = dst;
        let dst_is_dir = dst_kind == FileKind::Dir;
        self.load_record(dst_ino, recs)?;
        if dst_is_dir {
            if let Some(r) = recs.get_mut(&new_parent) {
                r.attr.nlink -= 1;
            }
        }
        let mut victim = recs.remove(&dst_ino).ok_or(VfsError::NotFound)?;
        if self.drop_link(b, &mut victim, now)? {
            return Ok(Some((dst_ino, victim.attr.size)));
        }
        Ok(None)
    }

    /// Ends a rename: touches both parent directories, writes every record it changed in
    /// its one batch `b`, commits, and moves the inode count by what it freed and made.
    fn commit_rename(
        &self,
        mut b: MetaBatch,
        mut recs: HashMap<Ino, InodeRecord>,
        parents: [Ino; 2],
        now: Timestamp,
        freed: bool,
        whiteout: bool,
    ) -> VfsResult<()> {
        for p in parents {
            if let Some(r) = recs.get_mut(&p) {
                Self::touch_dir(r, now);
            }
        }
        for r in recs.values() {
            b.put_inode(r);
        }
        // A whiteout is a new inode.
        self.commit_new_inodes(b)?;
        if freed {
            self.inode_count.fetch_sub(1, Ordering::Relaxed);
        }
        if whiteout {
            self.inode_count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether a rename may replace the existing entry `dst` (an inode other than the
    /// source's): not with `RENAME_NOREPLACE`, a directory only by a directory and only
    /// when it is empty, a non-directory only by a non-directory.
    fn check_replace(&self, src_is_dir: bool, dst: (Ino, FileKind), flags: RenameFlags) -> VfsResult<()> {
        let (dst_ino, dst_kind) = dst;
        let dst_is_dir = dst_kind == FileKind::Dir;
        if flags.noreplace {
            Err(VfsError::Exists)
        } else if src_is_dir && !dst_is_dir {
            Err(VfsError::NotDir)
        } else if !src_is_dir && dst_is_dir {
            Err(VfsError::IsDir)
        } else if dst_is_dir && !self.meta.dir_is_empty(dst_ino)? {
            Err(VfsError::NotEmpty)
        } else {
            Ok(())
        }
    }

    /// What a (non-exchanging) rename leaves at the source name `from`: nothing, or with
    /// `RENAME_WHITEOUT` a whiteout (a character device 0:0 with no permission bits, owned
    /// by the caller, as overlayfs and ext4 make it), in the rename's own batch so that no
    /// crash shows the name empty. Whether it made one.
    fn leave_behind(
        &self,
        b: &mut MetaBatch,
        caller: &Caller,
        recs: &HashMap<Ino, InodeRecord>,
        from: (Ino, &[u8]),
        flags: RenameFlags,
        now: Timestamp,
    ) -> VfsResult<bool> {
        let (parent, name) = from;
        if !flags.whiteout {
            b.delete_dentry(parent, name);
            return Ok(false);
        }
        let dir = recs.get(&parent).ok_or(VfsError::NotFound)?;
        let node = NewNode { kind: FileKind::CharDev, perm: 0, rdev: 0, symlink: None, passthrough_marker: false };
        let rec = self.new_node(b, caller, dir, &node, now);
        b.put_inode(&rec);
        b.put_dentry(parent, name, rec.attr.ino, FileKind::CharDev);
        Ok(true)
    }
}

/// What `create_node` makes.
pub(super) struct NewNode<'a> {
    pub(super) kind: FileKind,
    pub(super) perm: u32,
    pub(super) rdev: u32,
    pub(super) symlink: Option<&'a [u8]>,
    /// Commit the new file's passthrough writer marker in its own batch (see
    /// [`Vfs::create_open`]).
    pub(super) passthrough_marker: bool,
}

/// The arguments of a rename that no state can make valid.
fn check_rename(name: &[u8], new_name: &[u8], flags: RenameFlags) -> VfsResult<()> {
    check_name(new_name)?;
    if name.len() > NAME_MAX {
        return Err(VfsError::NameTooLong);
    }
    if flags.exchange && flags.noreplace {
        return Err(VfsError::Invalid("RENAME_EXCHANGE with RENAME_NOREPLACE"));
    }
    if flags.exchange && flags.whiteout {
        return Err(VfsError::Invalid("RENAME_EXCHANGE with RENAME_WHITEOUT"));
    }
    Ok(())
}

/// A directory moved from `from` to `to` takes its `..` link along.
fn move_dir_link(recs: &mut HashMap<Ino, InodeRecord>, from: Ino, to: Ino) {
    if let Some(r) = recs.get_mut(&to) {
        r.attr.nlink += 1;
    }
    if let Some(r) = recs.get_mut(&from) {
        r.attr.nlink -= 1;
    }
}

/// An entry renamed into `parent` at `now`.
fn reparent(recs: &mut HashMap<Ino, InodeRecord>, ino: Ino, parent: Ino, now: Timestamp) {
    if let Some(r) = recs.get_mut(&ino) {
        r.parent = parent;
        r.attr.ctime = now;
    }
}
