//! The backing files registered with the kernel for passthrough handles ([`Backings`]).
//!
//! The kernel requires every passthrough open of one inode to name the same backing file (a
//! second one fails the open), and the registration (`FUSE_DEV_IOC_BACKING_OPEN`) must live
//! until the last handle that uses it is released. So one registration per inode is kept
//! here, counted by its handles. Which handles are passthrough is decided by the core
//! (`Vfs::open_for`); this only holds the kernel's ids.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use fuser::BackingId;
use parking_lot::Mutex;

/// The registered backing file of each inode with passthrough handles open.
#[derive(Debug, Default)]
pub(crate) struct Backings(Mutex<State>);

#[derive(Debug, Default)]
struct State {
    /// Per inode: its registration and how many handles use it.
    by_ino: HashMap<u64, (Arc<BackingId>, u32)>,
    /// Per passthrough handle: its inode.
    by_fh: HashMap<u64, u64>,
}

impl Backings {
    /// The backing id handle `fh` of `ino` is answered with: the inode's registration, or the
    /// one `register` makes for the first.
    pub(crate) fn acquire(
        &self,
        ino: u64,
        fh: u64,
        register: impl FnOnce() -> io::Result<BackingId>,
    ) -> io::Result<Arc<BackingId>> {
        let mut st = self.0.lock();
        let id = match st.by_ino.get_mut(&ino) {
            Some((id, handles)) => {
                *handles += 1;
                Arc::clone(id)
            }
            None => {
                let id = Arc::new(register()?);
                st.by_ino.insert(ino, (Arc::clone(&id), 1));
                id
            }
        };
        st.by_fh.insert(fh, ino);
        Ok(id)
    }

    /// Handle `fh` was released: the inode's registration goes with its last handle.
    pub(crate) fn release(&self, fh: u64) {
        let mut st = self.0.lock();
        let Some(ino) = st.by_fh.remove(&fh) else { return };
        if let Some((_, handles)) = st.by_ino.get_mut(&ino) {
            *handles -= 1;
            if *handles == 0 {
                st.by_ino.remove(&ino);
            }
        }
    }
}
