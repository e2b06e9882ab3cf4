//! Quorum writes: every copy or shard of a key goes out in parallel, and the write is
//! acknowledged once `needed` of them are in (a majority of an object's copies; `k + m - 1`
//! shards of a pack, at least `k`, so losing one backend never stops writes).
//!
//! Invariants: short of the quorum nothing is queued, and the error names every copy that was
//! not written; at the quorum, every copy that did not land is in the repair queue (with its
//! bytes, or a source to find them again) before the call returns, and one that did land drops
//! any older repair of the key there. Stragglers get a grace period (the time the quorum took,
//! at least `straggler_grace`), then finish in the background, each completing only the repair
//! generation queued for it. `rewrite` is how the other files put a copy back at once, with
//! failures queued.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;
use futures::future::{BoxFuture, join_all};
use futures::stream::{FuturesUnordered, StreamExt};

use super::{BLOCKING_THRESHOLD, PutReport, RedundantStore, describe, maybe_blocking};
use crate::backend::erasure::shard_key;
use crate::backend::error::BackendError;
use crate::backend::repair::RepairSource;
use crate::backend::single::validate_key;

/// One write of a copy or shard.
struct Write {
    backend: usize,
    key: String,
    data: Bytes,
    fallback: RepairSource,
}

type WriteFuture = BoxFuture<'static, (usize, Result<(), BackendError>)>;

impl RedundantStore {
    /// Small objects: replicated, acknowledged at a majority of the copies.
    pub async fn put_object(&self, key: &str, data: Bytes) -> Result<PutReport, BackendError> {
        validate_key(key)?;
        let placement = self.object_placement(key);
        let needed = placement.len() / 2 + 1;
        let writes = placement
            .iter()
            .map(|&b| Write {
                backend: b,
                key: key.to_string(),
                data: data.clone(),
                fallback: RepairSource::CopyFrom(placement.iter().copied().filter(|&o| o != b).collect()),
            })
            .collect();
        self.write_quorum(key, writes, needed).await
    }

    /// Packs: like `put_object` under `Replicas`; Reed-Solomon shards under `Erasure`,
    /// acknowledged at `k + m - 1` shards (at least `k`).
    pub async fn put_pack(&self, key: &str, data: Bytes) -> Result<PutReport, BackendError> {
        validate_key(key)?;
        let Some(codec) = self.codec.clone() else {
            return self.put_object(key, data).await;
        };
        let big = data.len() >= BLOCKING_THRESHOLD;
        let shards = maybe_blocking(big, move || codec.encode(&data)).await??;
        let k = self.codec.as_ref().map_or(1, |c| c.data_shards());
        // k + m - 1: a write survives losing any one backend (losing one never stops writes: docs/SEMANTICS.md,
        // "With a store"); the missing shard is queued for repair.
        let needed = (shards.len().saturating_sub(1)).max(k);
        let writes = shards
            .into_iter()
            .enumerate()
            .map(|(i, shard)| Write {
                backend: self.shard_backend(key, i),
                key: shard_key(key, i),
                data: shard,
                fallback: RepairSource::RebuildShard { pack_key: key.to_string(), index: i },
            })
            .collect();
        self.write_quorum(key, writes, needed).await
    }

    async fn write_quorum(&self, key: &str, writes: Vec<Write>, needed: usize) -> Result<PutReport, BackendError> {
        let wanted = writes.len();
        let mut pending: FuturesUnordered<WriteFuture> = writes
            .iter()
            .enumerate()
            .map(|(slot, w)| {
                let (backend, key, data) = (self.backends[w.backend].clone(), w.key.clone(), w.data.clone());
                let fut: WriteFuture = Box::pin(async move { (slot, backend.put(&key, data).await) });
                fut
            })
            .collect();
        let started = Instant::now();
        let mut results: Vec<Option<Result<(), BackendError>>> = (0..wanted).map(|_| None).collect();
        let (mut acks, mut failures) = (0, 0);
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let next = match deadline {
                None => pending.next().await,
                Some(at) => tokio::time::timeout_at(at, pending.next()).await.unwrap_or_default(),
            };
            let Some((slot, result)) = next else { break };
            if result.is_ok() {
                acks += 1;
            } else {
                failures += 1;
            }
            results[slot] = Some(result);
            if acks >= needed && deadline.is_none() {
                let grace = started.elapsed().max(self.straggler_grace);
                deadline = Some(tokio::time::Instant::now() + grace);
            }
            if wanted - failures < needed {
                break;
            }
        }

        if acks < needed {
            let errors = writes
                .iter()
                .zip(&results)
                .filter_map(|(w, r)| {
                    let backend = &self.backends[w.backend];
                    match r {
                        Some(Ok(())) => None,
                        Some(Err(e)) => Some(describe(backend, e)),
                        None => Some(format!("{}: abandoned, the quorum was already out of reach", backend.name())),
                    }
                })
                .collect();
            return Err(BackendError::QuorumFailed { key: key.to_string(), stored: acks, needed, errors });
        }

        let mut queued = 0;
        let mut stragglers = HashMap::new();
        for (slot, (w, r)) in writes.iter().zip(&results).enumerate() {
            match r {
                Some(Ok(())) => self.repairs.forget(w.backend, &w.key),
                Some(Err(e)) => {
                    tracing::warn!(key = %w.key, backend = %self.backends[w.backend].name(), error = %e,
                        "copy not written; queued for repair");
                    self.repairs.enqueue(w.backend, &w.key, w.data.clone(), w.fallback.clone());
                    queued += 1;
                }
                None => {
                    let generation = self.repairs.enqueue(w.backend, &w.key, w.data.clone(), w.fallback.clone());
                    stragglers.insert(slot, (w.backend, w.key.clone(), generation));
                    queued += 1;
                }
            }
        }
        if !stragglers.is_empty() {
            self.finish_in_background(pending, stragglers);
        }
        Ok(PutReport { stored: acks, wanted, queued_repairs: queued })
    }

    /// Lets straggling writes finish on their own; each completes its repair entry on success.
    fn finish_in_background(
        &self,
        mut pending: FuturesUnordered<WriteFuture>,
        stragglers: HashMap<usize, (usize, String, u64)>,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // No runtime to finish them on; the repair queue has them.
        };
        let repairs = self.repairs.clone();
        runtime.spawn(async move {
            while let Some((slot, result)) = pending.next().await {
                if let (Ok(()), Some((backend, key, generation))) = (result, stragglers.get(&slot)) {
                    repairs.complete(*backend, key, *generation);
                }
            }
        });
    }

    /// Rewrites `data` at `key` on `targets` now; failures go to the repair queue. Returns how
    /// many were rewritten.
    pub(super) async fn rewrite(&self, key: &str, data: &Bytes, targets: &[usize], fallback: RepairSource) -> usize {
        let results =
            join_all(targets.iter().map(|&b| async move { (b, self.backends[b].put(key, data.clone()).await) })).await;
        let mut done = 0;
        for (b, result) in results {
            match result {
                Ok(()) => {
                    tracing::info!(key, backend = %self.backends[b].name(), "repaired copy");
                    self.repairs.forget(b, key);
                    done += 1;
                }
                Err(e) => {
                    tracing::warn!(key, backend = %self.backends[b].name(), error = %e, "repair failed; queued");
                    self.repairs.enqueue(b, key, data.clone(), fallback.clone());
                }
            }
        }
        done
    }
}
