//! Extended attributes: the namespaces a filesystem must check itself (`user.`, `trusted.`,
//! `security.`, `system.`), value and list limits, and create/replace flags.

use super::*;

impl Vfs {
    fn check_xattr_access(&self, caller: &Caller, rec: &InodeRecord, name: &[u8], writing: bool) -> VfsResult<()> {
        if name.is_empty() {
            return Err(VfsError::Invalid("empty xattr name"));
        }
        if name.len() > NAME_MAX {
            return Err(VfsError::Range);
        }
        if name.starts_with(b"user.") {
            // Linux: user xattrs only on regular files and directories.
            if !matches!(rec.attr.kind, FileKind::File | FileKind::Dir) {
                return Err(if writing { VfsError::NotPermitted } else { VfsError::NoXattr });
            }
        } else if name.starts_with(b"trusted.") {
            if caller.uid != 0 {
                return Err(if writing { VfsError::NotPermitted } else { VfsError::NoXattr });
            }
        } else if !name.starts_with(b"security.") {
            return Err(VfsError::NotSupported("xattr namespace"));
        }
        Ok(())
    }

    pub fn setxattr(&self, caller: &Caller, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> VfsResult<()> {
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        self.check_xattr_access(caller, &rec, name, true)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(VfsError::Invalid("xattr value larger than 64 KiB"));
        }
        let exists = self.meta.xattr(ino, name)?.is_some();
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(VfsError::Exists);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(VfsError::NoXattr);
        }
        rec.attr.ctime = Timestamp::now();
        rec.no_xattrs = false;
        let mut b = MetaBatch::new();
        b.put_xattr(ino, name, value);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> VfsResult<Vec<u8>> {
        // The kernel asks for `security.capability` before every write and chown; an inode
        // that never had an xattr answers from its (cached) record.
        if self.record(ino)?.no_xattrs {
            return Err(VfsError::NoXattr);
        }
        self.meta.xattr(ino, name)?.ok_or(VfsError::NoXattr)
    }

    pub fn listxattr(&self, ino: Ino) -> VfsResult<Vec<u8>> {
        self.record(ino)?;
        let mut out = Vec::new();
        for name in self.meta.xattr_names(ino)? {
            out.extend_from_slice(&name);
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, caller: &Caller, ino: Ino, name: &[u8]) -> VfsResult<()> {
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        self.check_xattr_access(caller, &rec, name, true)?;
        if self.meta.xattr(ino, name)?.is_none() {
            return Err(VfsError::NoXattr);
        }
        rec.attr.ctime = Timestamp::now();
        let mut b = MetaBatch::new();
        b.delete_xattr(ino, name);
        b.put_inode(&rec);
        self.meta.commit(b)?;
        Ok(())
    }
}
