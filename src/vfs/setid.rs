//! Clearing setuid and setgid when a regular file's bytes or owner change, as Linux's VFS
//! does (`file_remove_privs`, `chown`), done here because the mount asks the kernel to leave
//! it to the filesystem (`FUSE_HANDLE_KILLPRIV_V2`).
//!
//! Why: without that flag the kernel checks, before *every* write to a FUSE file (through
//! passthrough too), whether the file has a `security.capability` attribute, and a FUSE
//! filesystem cannot let it cache the answer: one `GETXATTR` round trip through the daemon
//! per `write(2)`, which made a 4k write through passthrough three times a local one
//! (benches/README.md, "Passthrough writes and `security.capability`"). With the flag the
//! kernel marks an inode it found clean (`S_NOSEC`) and asks again only after its attributes
//! were refreshed; in exchange the filesystem clears the bits:
//! - a write by a caller without `CAP_FSETID` (the kernel says so: `FUSE_WRITE_KILL_SUIDGID`),
//!   and a truncate, `fallocate` or `copy_file_range` into the file by a caller other than
//!   root (FUSE does not pass those on to this layer, so root stands for `CAP_FSETID`), clear
//!   setuid, and setgid when group execute is set;
//! - a change of owner or group clears them the same way, whoever makes it, unless it sets the
//!   mode too (see [`drops_setid`]);
//! - a writer through passthrough writes behind this process, so the kernel's writes can
//!   clear nothing: a file with a bit to clear is never opened for writing through
//!   passthrough first, and a writer other than root that must join a passthrough inode
//!   (the kernel's rule) clears the bits at its open instead of at its first write.
//!
//! The `security.capability` attribute stays the kernel's: it still looks it up once while the
//! inode is not marked clean and removes it through `removexattr`.

use super::*;

/// `perm` with setuid cleared, and setgid when group execute is set (without it, setgid
/// marks mandatory locking, which a write leaves alone).
pub(super) fn without_setid(perm: u16) -> u16 {
    let mut perm = perm & !(libc::S_ISUID as u16);
    if perm & libc::S_IXGRP as u16 != 0 {
        perm &= !(libc::S_ISGID as u16);
    }
    perm
}

/// Whether a change of `rec`'s bytes by an unprivileged caller clears a bit of it.
pub(super) fn has_setid_to_drop(rec: &InodeRecord) -> bool {
    rec.attr.kind == FileKind::File && without_setid(rec.attr.perm) != rec.attr.perm
}

/// Whether the change `ch` by `caller` clears setuid and setgid (see the module). Not when it
/// sets the mode too: the kernel drops the mode from a change that clears the bits, so a
/// change with a mode states the mode wanted (watch mode copying a file's owner and mode, or
/// a kernel that clears the bits itself and sends the mode it computed).
pub(super) fn drops_setid(caller: &Caller, ch: &SetAttr) -> bool {
    ch.mode.is_none() && (ch.uid.is_some() || ch.gid.is_some() || (ch.size.is_some() && caller.uid != 0))
}

impl Vfs {
    /// Before a change of `ino`'s bytes by a caller without `CAP_FSETID`: clears setuid, and
    /// setgid when group execute is set, in a commit of its own before the bytes move (a
    /// crash in between leaves the bits cleared and the bytes unchanged, never the other way
    /// round). A file with no such bit (nearly all) costs one cached record read.
    pub fn drop_setid(&self, ino: Ino) -> VfsResult<()> {
        if !has_setid_to_drop(&self.record(ino)?) {
            return Ok(());
        }
        self.catch_up_passthrough(ino)?;
        let _g = self.lock_inodes(&[ino]);
        let mut rec = self.record(ino)?;
        if !has_setid_to_drop(&rec) {
            return Ok(());
        }
        rec.attr.perm = without_setid(rec.attr.perm);
        rec.attr.ctime = Timestamp::now();
        let mut b = MetaBatch::new();
        b.put_inode(&rec);
        Ok(self.meta.commit(b)?)
    }

    /// [`Vfs::drop_setid`] for a change by `caller` that FUSE does not flag (`fallocate`,
    /// `copy_file_range`): root stands for `CAP_FSETID`.
    pub fn drop_setid_for(&self, caller: &Caller, ino: Ino) -> VfsResult<()> {
        if caller.uid == 0 { Ok(()) } else { self.drop_setid(ino) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_goes_and_setgid_only_with_group_execute() {
        assert_eq!(without_setid(0o4755), 0o755);
        assert_eq!(without_setid(0o2755), 0o755);
        assert_eq!(without_setid(0o6755), 0o755);
        assert_eq!(without_setid(0o2745), 0o2745, "setgid without group execute is a locking mark");
        assert_eq!(without_setid(0o6745), 0o2745);
        assert_eq!(without_setid(0o1777), 0o1777, "sticky stays");
    }

    #[test]
    fn an_owner_change_clears_the_bits_unless_it_states_the_mode() {
        let (root, user) = (Caller::ROOT, Caller { uid: 1000, gid: 1000, pid: 1 });
        let chown = SetAttr { uid: Some(7), ..SetAttr::default() };
        assert!(drops_setid(&root, &chown), "a chown clears them, even root's");
        let watch = SetAttr { mode: Some(0o4755), uid: Some(7), ..SetAttr::default() };
        assert!(!drops_setid(&root, &watch), "a change that states the mode keeps it");
        let trunc = SetAttr { size: Some(0), ..SetAttr::default() };
        assert!(drops_setid(&user, &trunc) && !drops_setid(&root, &trunc), "a truncate: only a caller other than root");
    }
}
