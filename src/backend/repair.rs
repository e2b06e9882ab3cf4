//! The repair queue: copies and shards that a write or a read found missing or bad and that
//! could not be rewritten at once, keyed by (backend, object key).
//!
//! Invariants and why:
//! - one entry per (backend, key): a newer write of the same key replaces the entry, and a
//!   successful newer write removes it, so a repair never puts back an older version;
//! - every entry has a generation; a repair (or a background straggler write) completes only the
//!   generation it started from, so it never removes an entry that was replaced meanwhile;
//! - the bytes kept in memory are bounded (`limit`): past it an entry keeps only where good data
//!   can be found again (the replicas that acknowledged the write, or the other shards of the
//!   pack), so a long backend outage costs bounded memory, not an unbounded copy of every write;
//! - the queue can be saved and queued again by a later run ([`SavedRepair`]): backends by
//!   name, never bytes (a repair that held the bytes copies from the other backends instead).

use std::collections::HashMap;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Default bound of the bytes held in the queue.
pub(crate) const DEFAULT_REPAIR_MEMORY: usize = 256 << 20;

/// Where the bytes of a repair come from.
#[derive(Clone, Debug)]
pub(crate) enum RepairSource {
    /// The bytes themselves.
    Data(Bytes),
    /// Copy the object from the first of these backends that has it (replicas that acknowledged).
    CopyFrom(Vec<usize>),
    /// Rebuild erasure shard `index` of the pack `pack_key` from its other shards.
    RebuildShard { pack_key: String, index: usize },
}

/// A queued repair as a later run reads it back: the backend it is for and where its bytes
/// come from, by backend name (the order of a store's backends may change between runs).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SavedRepair {
    pub backend: String,
    pub key: String,
    pub from: SavedSource,
}

/// Where a [`SavedRepair`] finds its bytes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SavedSource {
    /// A copy of the object on the first of these backends that has one.
    Copies(Vec<String>),
    /// Erasure shard `index` of `pack_key`, rebuilt from the pack's other shards.
    Shard { pack_key: String, index: usize },
}

/// One repair to attempt.
#[derive(Clone, Debug)]
pub(crate) struct RepairTask {
    pub backend: usize,
    pub key: String,
    pub generation: u64,
    pub source: RepairSource,
}

struct Entry {
    generation: u64,
    source: RepairSource,
    attempts: u32,
    last_error: Option<String>,
}

struct Inner {
    entries: HashMap<(usize, String), Entry>,
    next_generation: u64,
    held_bytes: usize,
    limit: usize,
}

pub(crate) struct RepairQueue {
    inner: Mutex<Inner>,
}

fn held(source: &RepairSource) -> usize {
    match source {
        RepairSource::Data(b) => b.len(),
        _ => 0,
    }
}

impl RepairQueue {
    pub(crate) fn new(limit: usize) -> RepairQueue {
        RepairQueue { inner: Mutex::new(Inner { entries: HashMap::new(), next_generation: 0, held_bytes: 0, limit }) }
    }

    pub(crate) fn set_limit(&self, limit: usize) {
        self.inner.lock().limit = limit;
    }

    /// Queues `key` for `backend`, keeping `data` if it fits the memory bound and `fallback`
    /// otherwise; replaces any older entry. Returns the entry's generation.
    pub(crate) fn enqueue(&self, backend: usize, key: &str, data: Bytes, fallback: RepairSource) -> u64 {
        let mut inner = self.inner.lock();
        let generation = inner.next_generation;
        inner.next_generation += 1;
        if let Some(old) = inner.entries.remove(&(backend, key.to_string())) {
            inner.held_bytes -= held(&old.source);
        }
        let source = if inner.held_bytes + data.len() <= inner.limit { RepairSource::Data(data) } else { fallback };
        inner.held_bytes += held(&source);
        inner.entries.insert((backend, key.to_string()), Entry { generation, source, attempts: 0, last_error: None });
        generation
    }

    /// Queues `key` for `backend` with a data-less source; replaces any older entry.
    pub(crate) fn enqueue_source(&self, backend: usize, key: &str, source: RepairSource) -> u64 {
        let mut inner = self.inner.lock();
        let generation = inner.next_generation;
        inner.next_generation += 1;
        if let Some(old) = inner.entries.remove(&(backend, key.to_string())) {
            inner.held_bytes -= held(&old.source);
        }
        inner.held_bytes += held(&source);
        inner.entries.insert((backend, key.to_string()), Entry { generation, source, attempts: 0, last_error: None });
        generation
    }

    /// A newer write of `key` reached `backend`: nothing is left to repair there.
    pub(crate) fn forget(&self, backend: usize, key: &str) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.entries.remove(&(backend, key.to_string())) {
            inner.held_bytes -= held(&old.source);
        }
    }

    /// Forgets every entry for these keys on any backend (the objects were deleted).
    pub(crate) fn forget_keys(&self, keys: &[String]) {
        let mut inner = self.inner.lock();
        let doomed: Vec<(usize, String)> = inner.entries.keys().filter(|(_, k)| keys.contains(k)).cloned().collect();
        for id in doomed {
            if let Some(old) = inner.entries.remove(&id) {
                inner.held_bytes -= held(&old.source);
            }
        }
    }

    /// The repair of this generation is done (or moot); a newer entry is left alone.
    pub(crate) fn complete(&self, backend: usize, key: &str, generation: u64) {
        let mut inner = self.inner.lock();
        let id = (backend, key.to_string());
        if inner.entries.get(&id).is_some_and(|e| e.generation == generation) {
            if let Some(old) = inner.entries.remove(&id) {
                inner.held_bytes -= held(&old.source);
            }
        }
    }

    pub(crate) fn failed(&self, backend: usize, key: &str, generation: u64, error: String) {
        let mut inner = self.inner.lock();
        if let Some(e) = inner.entries.get_mut(&(backend, key.to_string())) {
            if e.generation == generation {
                e.attempts = e.attempts.saturating_add(1);
                e.last_error = Some(error);
            }
        }
    }

    /// A snapshot of the queued repairs.
    pub(crate) fn tasks(&self) -> Vec<RepairTask> {
        let inner = self.inner.lock();
        inner
            .entries
            .iter()
            .map(|((backend, key), e)| RepairTask {
                backend: *backend,
                key: key.clone(),
                generation: e.generation,
                source: e.source.clone(),
            })
            .collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    #[cfg(test)]
    pub(crate) fn held_bytes(&self) -> usize {
        self.inner.lock().held_bytes
    }

    #[cfg(test)]
    pub(crate) fn last_error(&self, backend: usize, key: &str) -> Option<(u32, Option<String>)> {
        let inner = self.inner.lock();
        inner.entries.get(&(backend, key.to_string())).map(|e| (e.attempts, e.last_error.clone()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn newer_entries_replace_older_ones() {
        let q = RepairQueue::new(1000);
        let g1 = q.enqueue(0, "k", Bytes::from_static(b"old"), RepairSource::CopyFrom(vec![1]));
        let g2 = q.enqueue(0, "k", Bytes::from_static(b"newer"), RepairSource::CopyFrom(vec![1]));
        assert_eq!(q.len(), 1);
        assert_eq!(q.held_bytes(), 5);
        q.complete(0, "k", g1);
        assert_eq!(q.len(), 1, "an old generation does not complete a newer entry");
        q.failed(0, "k", g2, "down".into());
        assert_eq!(q.last_error(0, "k"), Some((1, Some("down".into()))));
        q.complete(0, "k", g2);
        assert_eq!(q.len(), 0);
        assert_eq!(q.held_bytes(), 0);
    }

    #[test]
    fn memory_is_bounded() {
        let q = RepairQueue::new(8);
        q.enqueue(0, "a", Bytes::from_static(b"12345"), RepairSource::CopyFrom(vec![1]));
        q.enqueue(1, "a", Bytes::from_static(b"12345"), RepairSource::CopyFrom(vec![2]));
        assert_eq!(q.held_bytes(), 5);
        let tasks = q.tasks();
        assert!(tasks.iter().any(|t| matches!(t.source, RepairSource::CopyFrom(_))));
        q.forget(0, "a");
        assert_eq!(q.held_bytes(), 0);
        q.forget_keys(&["a".to_string()]);
        assert_eq!(q.len(), 0);
    }
}
