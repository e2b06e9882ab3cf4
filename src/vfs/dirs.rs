//! Directory handles: a listing is taken whole at `opendir` and served in batches by cookie,
//! so a listing changed while it is read never returns an entry twice.

use super::*;

impl Vfs {
    pub fn opendir(&self, ino: Ino) -> VfsResult<u64> {
        let rec = self.record(ino)?;
        if rec.attr.kind != FileKind::Dir {
            return Err(VfsError::NotDir);
        }
        // A snapshot of the listing: cookies are positions in it, stable for this handle
        // whatever happens to the directory meanwhile.
        let mut entries = vec![
            DirEntry { ino, kind: FileKind::Dir, name: b".".to_vec(), offset: 1 },
            DirEntry { ino: rec.parent, kind: FileKind::Dir, name: b"..".to_vec(), offset: 2 },
        ];
        for (name, child, kind) in self.meta.list_dir(ino)? {
            let offset = entries.len() as u64 + 1;
            entries.push(DirEntry { ino: child, kind, name, offset });
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.dir_handles.lock().insert(fh, Arc::new(entries));
        Ok(fh)
    }

    fn dir_listing(&self, fh: u64) -> VfsResult<Arc<Vec<DirEntry>>> {
        self.dir_handles.lock().get(&fh).cloned().ok_or(VfsError::BadHandle)
    }

    pub fn readdir(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<DirEntry>> {
        let list = self.dir_listing(fh)?;
        Ok(list.iter().skip(offset as usize).take(READDIR_BATCH).cloned().collect())
    }

    pub fn readdirplus(&self, _ino: Ino, fh: u64, offset: u64) -> VfsResult<Vec<(DirEntry, Attr)>> {
        let list = self.dir_listing(fh)?;
        let mut out = Vec::new();
        for e in list.iter().skip(offset as usize) {
            if out.len() == READDIRPLUS_BATCH {
                break;
            }
            // Entries removed since opendir are skipped, not reported with stale attributes.
            match self.getattr(e.ino) {
                Ok(attr) => out.push((e.clone(), attr)),
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
