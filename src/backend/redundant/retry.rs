//! Working off the repair queue (`backend/repair.rs`): [`RedundantStore::run_repairs`] retries
//! queued repairs, and the queue is saved for a later run and restored by it.
//!
//! Invariants: a repair's bytes are the ones it holds, a copy from the first source backend that
//! has one, or a shard rebuilt from the pack's other shards; a repair completes only the
//! generation it started from, so a newer write queued meanwhile is never dropped; a repair
//! whose object is gone everywhere is done, not failed; backends whose breaker is open are
//! skipped until a probe is due. A saved repair names backends, never holds bytes, so restoring
//! it works with the backend list reordered and skips backends no longer configured.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::future::join_all;
use futures::stream::StreamExt;

use super::{BLOCKING_THRESHOLD, RedundantStore, maybe_blocking};
use crate::backend::erasure::{TRAILER_LEN, open_shard, shard_key};
use crate::backend::error::BackendError;
use crate::backend::repair::{RepairSource, RepairTask, SavedRepair, SavedSource};
use crate::backend::single::validate_key;

/// Repairs run concurrently by `run_repairs`.
const REPAIR_CONCURRENCY: usize = 8;

impl RedundantStore {
    /// The queued repairs in the form a later run can queue again ([`Self::restore_repairs`]),
    /// sorted. A repair that holds its bytes is saved as a copy from any other backend.
    pub fn saved_repairs(&self) -> Vec<SavedRepair> {
        let name = |b: usize| self.backends[b].name().to_string();
        let mut saved: Vec<SavedRepair> = self
            .repairs
            .tasks()
            .into_iter()
            .map(|t| {
                let from = match t.source {
                    RepairSource::Data(_) => {
                        SavedSource::Copies((0..self.backends.len()).filter(|&b| b != t.backend).map(name).collect())
                    }
                    RepairSource::CopyFrom(sources) => SavedSource::Copies(sources.into_iter().map(name).collect()),
                    RepairSource::RebuildShard { pack_key, index } => SavedSource::Shard { pack_key, index },
                };
                SavedRepair { backend: name(t.backend), key: t.key, from }
            })
            .collect();
        saved.sort();
        saved
    }

    /// Queues repairs an earlier run saved; those for a backend this store no longer has (or
    /// with an invalid key) are skipped. Returns how many were queued.
    pub fn restore_repairs(&self, saved: &[SavedRepair]) -> usize {
        let index = |name: &str| self.backends.iter().position(|b| b.name() == name);
        let mut queued = 0;
        for r in saved {
            let Some(b) = index(&r.backend) else { continue };
            if validate_key(&r.key).is_err() {
                continue;
            }
            let source = match &r.from {
                SavedSource::Copies(names) => {
                    RepairSource::CopyFrom(names.iter().filter_map(|n| index(n)).filter(|&s| s != b).collect())
                }
                SavedSource::Shard { pack_key, index } => {
                    RepairSource::RebuildShard { pack_key: pack_key.clone(), index: *index }
                }
            };
            self.repairs.enqueue_source(b, &r.key, source);
            queued += 1;
        }
        queued
    }

    /// Retries queued repairs (call periodically and before shutdown); returns how many are
    /// still pending. Backends whose breaker is open are skipped until a probe is due.
    pub async fn run_repairs(&self) -> usize {
        let tasks = self.repairs.tasks();
        futures::stream::iter(tasks).for_each_concurrent(REPAIR_CONCURRENCY, |t| self.run_repair(t)).await;
        self.repairs.len()
    }

    async fn run_repair(&self, task: RepairTask) {
        let backend = &self.backends[task.backend];
        if !backend.is_available() {
            return;
        }
        let data = match &task.source {
            RepairSource::Data(data) => Ok(data.clone()),
            RepairSource::CopyFrom(sources) => self.copy_source(&task.key, sources).await,
            RepairSource::RebuildShard { pack_key, index } => self.rebuild_shard(pack_key, *index).await,
        };
        let data = match data {
            Ok(data) => data,
            Err(e) if e.is_not_found() => {
                // Deleted meanwhile: nothing to repair.
                self.repairs.complete(task.backend, &task.key, task.generation);
                return;
            }
            Err(e) => {
                self.repairs.failed(task.backend, &task.key, task.generation, e.to_string());
                return;
            }
        };
        match backend.put(&task.key, data).await {
            Ok(()) => {
                tracing::info!(key = %task.key, backend = %backend.name(), "repaired");
                self.repairs.complete(task.backend, &task.key, task.generation);
            }
            Err(e) => self.repairs.failed(task.backend, &task.key, task.generation, e.to_string()),
        }
    }

    /// The object from the first source backend that has it.
    async fn copy_source(&self, key: &str, sources: &[usize]) -> Result<Bytes, BackendError> {
        let mut last = BackendError::NotFound { key: key.to_string() };
        let mut any_unreachable = false;
        for &s in sources {
            match self.backends[s].get(key, self.largest_object).await {
                Ok(bytes) => return Ok(bytes),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    any_unreachable = true;
                    last = e;
                }
            }
        }
        if any_unreachable { Err(last) } else { Err(BackendError::NotFound { key: key.to_string() }) }
    }

    /// Rebuilds shard `index` of a pack from its other shards (shard length taken from them).
    async fn rebuild_shard(&self, pack_key: &str, index: usize) -> Result<Bytes, BackendError> {
        let codec = self.codec.clone().ok_or_else(|| BackendError::Internal("not an erasure store".into()))?;
        let total = codec.total_shards();
        let objects = join_all((0..total).filter(|&i| i != index).map(|i| {
            let b = self.shard_backend(pack_key, i);
            let shard = shard_key(pack_key, i);
            async move { (i, self.backends[b].get(&shard, self.largest_object).await) }
        }))
        .await;
        // The shard length is the one most objects agree on.
        let mut lengths: BTreeMap<usize, usize> = BTreeMap::new();
        for (_, r) in &objects {
            if let Ok(o) = r {
                *lengths.entry(o.len()).or_default() += 1;
            }
        }
        let Some(object_len) = lengths.iter().max_by_key(|(_, n)| **n).map(|(len, _)| *len) else {
            let all_missing = objects.iter().all(|(_, r)| r.as_ref().is_err_and(BackendError::is_not_found));
            return Err(if all_missing {
                BackendError::NotFound { key: pack_key.to_string() }
            } else {
                BackendError::Unavailable {
                    backend: "shard backends".into(),
                    reason: format!("no shard of {pack_key} readable"),
                }
            });
        };
        let shard_len = object_len.saturating_sub(TRAILER_LEN);
        let mut shards: Vec<Option<Vec<u8>>> = (0..total).map(|_| None).collect();
        for (i, r) in objects {
            if let Ok(object) = r {
                if let Ok(body) = open_shard(&object, shard_len) {
                    shards[i] = Some(body.to_vec());
                }
            }
        }
        let big = shard_len * codec.data_shards() >= BLOCKING_THRESHOLD;
        let rebuilt = maybe_blocking(big, move || {
            let mut shards = shards;
            codec.reconstruct(&mut shards, false)?;
            shards.into_iter().nth(index).flatten().ok_or_else(|| "shard not rebuilt".to_string())
        })
        .await?
        .map_err(|reason| BackendError::Corrupt { key: shard_key(pack_key, index), reason })?;
        let mut sealed = rebuilt;
        sealed.reserve_exact(TRAILER_LEN);
        Ok(crate::backend::erasure::seal(sealed))
    }
}
