//! The shards of an erasure-coded pack: fetching whole shards and checking them by their
//! trailers, rebuilding the pack from any `k` good ones, saying why when fewer are good, and
//! rewriting bad or missing shards from a pack known to be good.
//!
//! Invariants: a shard counts as good only when its blake3 trailer matches and it has the length
//! the pack's length implies; data shards are fetched first, the parity shards only when a data
//! shard is not good (unless asked for all at once); fewer than `k` good shards is `NotFound`
//! only when every one said missing, `Unavailable` when some could not be asked, and `Corrupt`
//! otherwise. Coding a pack of at least `BLOCKING_THRESHOLD` bytes runs on a blocking thread.

use bytes::Bytes;
use futures::future::join_all;

use super::{BLOCKING_THRESHOLD, CopyState, RedundantStore, maybe_blocking};
use crate::backend::erasure::TRAILER_LEN;
use crate::backend::erasure::{open_shard, shard_key};
use crate::backend::error::BackendError;
use crate::backend::limit::SizeLimit;
use crate::backend::repair::RepairSource;

impl RedundantStore {
    /// Fetches whole shards (data shards first, or all at once) and returns the pack and what
    /// each shard looked like (`None`: not fetched).
    pub(super) async fn read_erasure(
        &self,
        key: &str,
        pack_len: u64,
        all_at_once: bool,
    ) -> Result<(Vec<u8>, Vec<Option<CopyState>>), BackendError> {
        let codec = self.codec.clone().ok_or_else(|| BackendError::Internal("not an erasure store".into()))?;
        let (k, total) = (codec.data_shards(), codec.total_shards());
        let shard_len = codec.shard_len(pack_len)?;
        let mut copies: Vec<Option<CopyState>> = (0..total).map(|_| None).collect();
        let first: Vec<usize> = if all_at_once { (0..total).collect() } else { (0..k).collect() };
        self.fetch_shards(key, shard_len, &first, &mut copies).await;
        let good =
            |copies: &[Option<CopyState>]| copies.iter().filter(|c| matches!(c, Some(CopyState::Good(_)))).count();
        let data_complete = copies[..k].iter().all(|c| matches!(c, Some(CopyState::Good(_))));
        if !data_complete {
            let rest: Vec<usize> = (0..total).filter(|&i| copies[i].is_none()).collect();
            self.fetch_shards(key, shard_len, &rest, &mut copies).await;
        }
        if good(&copies) < k {
            return Err(self.shards_error(key, k, &copies));
        }
        let shards = good_shards(&copies);
        let big = pack_len as usize >= BLOCKING_THRESHOLD;
        let pack = maybe_blocking(big, move || {
            let mut shards = shards;
            codec.reconstruct(&mut shards, true)?;
            codec.join(&shards, pack_len)
        })
        .await?
        .map_err(|reason| BackendError::Corrupt { key: key.to_string(), reason })?;
        Ok((pack, copies))
    }

    /// Fetches and checks whole shards `indices` into `copies`.
    pub(super) async fn fetch_shards(
        &self,
        key: &str,
        shard_len: usize,
        indices: &[usize],
        copies: &mut [Option<CopyState>],
    ) {
        let fetched = join_all(indices.iter().map(|&i| {
            let b = self.shard_backend(key, i);
            let shard = shard_key(key, i);
            async move {
                let limit = SizeLimit::exactly((shard_len + TRAILER_LEN) as u64, "a shard of this pack");
                let copy = match self.backends[b].get(&shard, limit).await {
                    Ok(object) => match open_shard(&object, shard_len) {
                        Ok(body) => CopyState::Good(body),
                        Err(reason) => CopyState::Bad(reason),
                    },
                    Err(e) if e.is_not_found() => CopyState::Missing,
                    Err(BackendError::Corrupt { reason, .. }) => CopyState::Bad(reason),
                    Err(e) => CopyState::Unreachable(e.to_string()),
                };
                (i, copy)
            }
        }))
        .await;
        for (i, copy) in fetched {
            copies[i] = Some(copy);
        }
    }

    /// The error when fewer than `k` shards are good.
    fn shards_error(&self, key: &str, k: usize, copies: &[Option<CopyState>]) -> BackendError {
        let mut details = Vec::new();
        let (mut good, mut missing, mut bad, mut unreachable) = (0, 0, 0, Vec::new());
        for (i, c) in copies.iter().enumerate() {
            let b = &self.backends[self.shard_backend(key, i)];
            match c {
                Some(CopyState::Good(_)) => good += 1,
                Some(CopyState::Missing) => {
                    missing += 1;
                    details.push(format!("shard {i} on {}: missing", b.name()));
                }
                Some(CopyState::Bad(r)) => {
                    bad += 1;
                    details.push(format!("shard {i} on {}: {r}", b.name()));
                }
                Some(CopyState::Unreachable(e)) => {
                    unreachable.push(b.name().to_string());
                    details.push(format!("shard {i}: {e}"));
                }
                None => {}
            }
        }
        let summary = format!("only {good} of {} shards of {key} are good, {k} needed", copies.len());
        if !unreachable.is_empty() {
            BackendError::Unavailable {
                backend: unreachable.join(", "),
                reason: format!("{summary} ({})", details.join("; ")),
            }
        } else if good == 0 && bad == 0 && missing > 0 {
            BackendError::NotFound { key: key.to_string() }
        } else {
            BackendError::Corrupt { key: key.to_string(), reason: format!("{summary} ({})", details.join("; ")) }
        }
    }

    /// Rewrites the bad and missing shards of a pack whose bytes are known good.
    pub(super) async fn repair_shards(&self, key: &str, pack: Vec<u8>, copies: &[Option<CopyState>]) -> usize {
        let targets: Vec<usize> =
            (0..copies.len()).filter(|&i| matches!(copies[i], Some(CopyState::Bad(_) | CopyState::Missing))).collect();
        if targets.is_empty() {
            return 0;
        }
        let Some(codec) = self.codec.clone() else { return 0 };
        let big = pack.len() >= BLOCKING_THRESHOLD;
        let shards = match maybe_blocking(big, move || codec.encode(&pack)).await {
            Ok(Ok(shards)) => shards,
            Ok(Err(e)) | Err(e) => {
                tracing::warn!(key, error = %e, "cannot re-encode pack for repair");
                return 0;
            }
        };
        self.rewrite_shards(key, &shards, &targets).await
    }

    /// Writes shard objects `targets` of a pack to their backends, in parallel.
    pub(super) async fn rewrite_shards(&self, key: &str, shards: &[Bytes], targets: &[usize]) -> usize {
        let writes = targets.iter().map(|&i| async move {
            let b = self.shard_backend(key, i);
            let fallback = RepairSource::RebuildShard { pack_key: key.to_string(), index: i };
            self.rewrite(&shard_key(key, i), &shards[i], &[b], fallback).await
        });
        join_all(writes).await.into_iter().sum()
    }
}

/// The verified shards, `None` where a shard is missing or bad (the decoder's input).
pub(super) fn good_shards(copies: &[Option<CopyState>]) -> Vec<Option<Vec<u8>>> {
    copies
        .iter()
        .map(|c| match c {
            Some(CopyState::Good(b)) => Some(b.to_vec()),
            _ => None,
        })
        .collect()
}
