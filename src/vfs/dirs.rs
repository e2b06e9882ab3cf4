//! Directory handles: a listing is read from the metadata store in pieces as it is consumed,
//! never built whole at `opendir`, so a directory costs what of it has been read.
//!
//! Cookies: 1 resumes after `.`, 2 after `..`, and the entries get 3, 4, … in the order they
//! are handed out (by name, the metadata store's key order). A handle keeps the names it has
//! handed out, back to back in one buffer (the names' bytes and 8 bytes each, nothing else),
//! so a call resuming at any cookie (the kernel resumes after the last entry that fit in its
//! buffer; `seekdir` goes back to a `telldir` position) continues after that entry's name:
//! an entry that stays is listed exactly once, and whatever is created or removed meanwhile
//! may or may not show, as POSIX allows.

use super::*;

/// An open directory.
pub(super) struct DirHandle {
    ino: Ino,
    parent: Ino,
    /// The names handed out since the listing (re)started, back to back: entry `k` (cookie
    /// `k + 3`) is `names[ends[k - 1]..ends[k]]`.
    names: Vec<u8>,
    ends: Vec<usize>,
}

impl DirHandle {
    /// The name with cookie `cookie` (≥ 3), if one was handed out.
    fn name(&self, cookie: u64) -> Option<&[u8]> {
        let k = usize::try_from(cookie.checked_sub(3)?).ok()?;
        let end = *self.ends.get(k)?;
        let start = if k == 0 { 0 } else { self.ends[k - 1] };
        Some(&self.names[start..end])
    }

    /// Forgets the names after the first `entries`: the listing goes on from there.
    fn truncate(&mut self, entries: usize) {
        self.ends.truncate(entries);
        self.names.truncate(self.ends.last().copied().unwrap_or(0));
    }
}

impl Vfs {
    pub fn opendir(&self, ino: Ino) -> VfsResult<u64> {
        let rec = self.record(ino)?;
        if rec.attr.kind != FileKind::Dir {
            return Err(VfsError::NotDir);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let handle = DirHandle { ino, parent: rec.parent, names: Vec::new(), ends: Vec::new() };
        self.dir_handles.lock().insert(fh, Arc::new(Mutex::new(handle)));
        Ok(fh)
    }

    fn dir_handle(&self, fh: u64) -> VfsResult<Arc<Mutex<DirHandle>>> {
        self.dir_handles.lock().get(&fh).cloned().ok_or(VfsError::BadHandle)
    }

    /// Up to `limit` entries after cookie `offset`.
    fn dir_batch(&self, fh: u64, offset: u64, limit: usize) -> VfsResult<Vec<DirEntry>> {
        let handle = self.dir_handle(fh)?;
        let mut h = handle.lock();
        let mut out = Vec::with_capacity(limit.min(64));
        if offset == 0 {
            out.push(DirEntry { ino: h.ino, kind: FileKind::Dir, name: b".".to_vec(), offset: 1 });
        }
        if offset <= 1 && limit > out.len() {
            out.push(DirEntry { ino: h.parent, kind: FileKind::Dir, name: b"..".to_vec(), offset: 2 });
        }
        let after = if offset <= 2 {
            None
        } else {
            // A cookie never handed out (past the end, or forgotten by a seek back): the end.
            let Some(name) = h.name(offset) else { return Ok(out) };
            Some(name.to_vec())
        };
        h.truncate(offset.saturating_sub(2) as usize);
        let want = limit - out.len().min(limit);
        let listed = self.meta.list_dir_after(h.ino, after.as_deref(), want)?;
        // The order files are listed in is the order a walk opens them, and the order of
        // directories the order it goes through their listings (walk.rs).
        let mut walks = self.cold.as_ref().map(|_| self.walks.lock());
        if let Some(w) = walks.as_mut().filter(|_| after.is_none()) {
            w.restart(h.ino);
        }
        for (cookie, (name, child, kind)) in (offset.max(2) + 1..).zip(listed) {
            match (walks.as_mut(), kind) {
                (Some(w), FileKind::File) => w.listed(h.ino, child),
                (Some(w), FileKind::Dir) => w.listed_dir(child),
                _ => {}
            }
            h.names.extend_from_slice(&name);
            let end = h.names.len();
            h.ends.push(end);
            out.push(DirEntry { ino: child, kind, name, offset: cookie });
        }
        Ok(out)
    }

    pub fn readdir(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<DirEntry>> {
        self.dir_batch(fh, offset, READDIR_BATCH)
    }

    pub fn readdirplus(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<(DirEntry, Attr)>> {
        let mut out = Vec::new();
        for e in self.dir_batch(fh, offset, READDIRPLUS_BATCH)? {
            // An entry removed since it was listed is skipped, not reported with stale attributes.
            match self.getattr(e.ino) {
                Ok(attr) => out.push((e, attr)),
                Err(VfsError::NotFound) => continue,
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    pub fn releasedir(&self, _ino: Ino, fh: u64) -> VfsResult<()> {
        self.dir_handles.lock().remove(&fh);
        Ok(())
    }

    pub fn fsyncdir(&self, _ino: Ino) -> VfsResult<()> {
        self.meta.sync()?;
        self.wait_remote(None)
    }
}
