//! Restoring a workspace into an empty watched directory (a fresh node), through the core's
//! tree writer ([`crate::export`]): data fetched chunk by chunk, holes left as holes, hard
//! links kept, then mode, owner, times and user xattrs.
//!
//! Invariant: the mirror learns every entry written, with the ctime it has once written, so
//! the first pass after the restore reads nothing again.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{Counts, Known, LocalId, Mirror, Result};
use crate::export::{self, ExportError, Visitor};
use crate::types::Ino;

impl Mirror {
    pub(super) fn restore(&mut self) -> Result<Counts> {
        let (root, vfs) = (self.root.clone(), self.vfs.clone());
        // Privileged as before: the directory's owners and modes come back as they were. Under
        // the root node daemon that is the store's word (docs/ARCHITECTURE.md, "Trust").
        let written = export::write_tree(&vfs, &root, true, &mut Learner { mirror: self })?;
        Ok(Counts {
            created: written.files + written.dirs + written.symlinks + written.other,
            linked: written.hard_links,
            files_read: written.files,
            bytes_read: written.bytes,
            ..Counts::default()
        })
    }
}

/// Remembers each restored entry as the mirror's own.
struct Learner<'a> {
    mirror: &'a mut Mirror,
}

impl Visitor for Learner<'_> {
    fn written(&mut self, path: &Path, ino: Ino, parent: Ino, name: &[u8]) -> export::Result<()> {
        let md = std::fs::symlink_metadata(path).map_err(ExportError::io("stat", path))?;
        let ctime = (md.ctime(), md.ctime_nsec());
        let known = Known { ino, parent, name: name.to_vec(), ctime };
        self.mirror.known.insert(LocalId { dev: md.dev(), ino: md.ino() }, known);
        Ok(())
    }
}
