//! Checking the cached chunks left by an earlier run: their bytes sat on the local disk while
//! no tierfs process watched them, so each is compared with its record's block id before it is
//! served, on first use or by a background pass that starts with the tier.
//!
//! Invariants: a clean resident chunk from an earlier run is served only once it is
//! `verified`; one that does not match is punched out and fetched again from the store, never
//! served. A check that raced with a write (the epoch moved) decides nothing: the caller looks
//! again.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::evict::punch_out;
use super::{ColdError, ColdTier, OpenFiles, State, read_full};
use crate::block::CHUNK_SIZE;
use crate::meta::MetaBatch;
use crate::types::Ino;

impl ColdTier {
    /// Checks a cached chunk from an earlier run against its block id. A chunk that does not
    /// match (the local disk corrupted it) is dropped from the cache, so it is fetched again.
    pub(super) fn verify(&self, ino: Ino, file: &File, idx: u64) -> Result<(), ColdError> {
        let (epoch, rec) = {
            let st = self.state.lock();
            match st.files.get(&ino).and_then(|f| f.chunks.get(&idx)) {
                Some(c) if c.unverified() => match c.rec {
                    Some(r) => (c.epoch, r),
                    None => return Ok(()),
                },
                _ => return Ok(()),
            }
        };
        let mut data = vec![0u8; rec.len as usize];
        read_full(&self.hot, file, ino, idx * CHUNK_SIZE, &mut data)?;
        let id = self.content_id(&data);
        let mut st = self.state.lock();
        let State { files, resident_bytes, .. } = &mut *st;
        let Some(c) = files.get_mut(&ino).and_then(|f| f.chunks.get_mut(&idx)) else { return Ok(()) };
        if c.epoch != epoch || !c.unverified() {
            return Ok(()); // changed meanwhile: the caller looks again
        }
        if id == rec.block {
            c.verified = true;
            return Ok(());
        }
        tracing::warn!(
            "cached chunk {idx} of inode {ino} does not match its stored block (local disk corruption?); \
             fetching it again from the store"
        );
        self.counters.verify_failures.fetch_add(1, Ordering::Relaxed);
        let mut b = MetaBatch::new();
        punch_out(&self.hot, ino, idx, c, Some(file), resident_bytes, &mut b)?;
        self.meta.commit(b)?;
        Ok(())
    }

    /// Checks every cached chunk left by an earlier run, in the background, so that reads
    /// rarely have to wait for the check.
    pub(super) fn verify_loop(self: Arc<Self>) {
        let todo: Vec<(Ino, u64)> = {
            let st = self.state.lock();
            st.files
                .iter()
                .flat_map(|(&ino, f)| f.chunks.iter().filter(|(_, c)| c.unverified()).map(move |(&i, _)| (ino, i)))
                .collect()
        };
        let mut files = OpenFiles::default();
        for (ino, idx) in todo {
            if self.state.lock().stopping {
                return;
            }
            let file = match files.get(&self.hot, ino) {
                Ok(f) => f,
                Err(err) => {
                    tracing::warn!("verifying the cache: {err}");
                    continue;
                }
            };
            if let Some(file) = file {
                if let Err(err) = self.verify(ino, file, idx) {
                    tracing::warn!("verifying chunk {idx} of inode {ino}: {err}");
                }
            }
        }
    }
}
