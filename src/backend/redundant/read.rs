//! Verified reads: small objects ([`RedundantStore::get_object`]), pack ranges
//! ([`RedundantStore::get_pack_range`]) and whole packs ([`RedundantStore::get_pack`]), with
//! read repair.
//!
//! Invariants: no copy is read whole past its [`SizeLimit`] (a pack's: the length its index
//! records; a small object's: its kind's, given by the caller); nothing is returned that did not pass the caller's `verify` or `open` (and, for
//! whole shards, their blake3 trailers); a missing or bad copy seen before the good one is
//! rewritten from it at once (`rewrite`, failures queued). "Not found" is only reported when
//! every copy that should exist said so: if one could not be asked, the answer is
//! `Unavailable`, since that copy may be good. Replicas are tried in placement order with
//! healthy backends first; under `Erasure` a range is read from the data shards that hold it,
//! and only when that fails is the pack rebuilt from whole shards (`shards.rs`).

use std::ops::Range;

use bytes::Bytes;
use futures::future::join_all;

use super::{CopyState, Open, RedundantStore, Verify};
use crate::backend::erasure::shard_key;
use crate::backend::error::BackendError;
use crate::backend::limit::SizeLimit;
use crate::backend::repair::RepairSource;
use crate::backend::single::validate_key;

impl RedundantStore {
    /// Reads a copy from the first backend (placement order, healthy ones first) whose bytes
    /// pass `verify`; missing or bad copies seen before it are repaired from it. A copy larger
    /// than `limit` is a bad copy, refused before its body is read.
    pub async fn get_object(&self, key: &str, limit: SizeLimit, verify: Verify<'_>) -> Result<Bytes, BackendError> {
        validate_key(key)?;
        self.get_replicated(key, limit, None, verify).await
    }

    /// Reads what a majority of the object's copies hold: every copy of its placement is
    /// read (at once, each answer awaited), and the bytes that pass `verify` on at least
    /// `copies / 2 + 1` of them are returned, or `None` when that many copies are missing.
    /// Where correctness needs it: after a conditional create lost ([`Self::create_object`]
    /// answered `Exists`), the loser's own minority copy may be where [`Self::get_object`]
    /// reads first, and a lagging replica may hold a lease as it was.
    ///
    /// Timing: this read starts after the caller's create or put had every copy's answer, so a
    /// majority that took the winner's bytes holds them now (a backend's create is atomic and
    /// only the winner overwrites). A replica that stores late can keep any bytes from a
    /// majority for a while: then the answer is [`BackendError::NoMajority`], retry, never a
    /// guess; copies that are all bad are [`BackendError::Corrupt`]. Nothing is repaired here: the winner overwrites minority copies, and
    /// [`Self::get_object`] repairs what it reads.
    pub async fn get_object_majority(
        &self,
        key: &str,
        limit: SizeLimit,
        verify: Verify<'_>,
    ) -> Result<Option<Bytes>, BackendError> {
        validate_key(key)?;
        let placement = self.object_placement(key);
        let needed = placement.len() / 2 + 1;
        let states = join_all(placement.iter().map(|&b| self.read_copy(b, key, limit, None, verify))).await;
        let mut held: Vec<(Bytes, usize)> = Vec::new();
        let mut missing = 0;
        let mut errors = Vec::new();
        let mut unreachable = Vec::new();
        for (&b, state) in placement.iter().zip(states) {
            match state {
                CopyState::Good(bytes) => match held.iter_mut().find(|(h, _)| *h == bytes) {
                    Some((_, n)) => *n += 1,
                    None => held.push((bytes, 1)),
                },
                CopyState::Missing => missing += 1,
                CopyState::Bad(reason) => errors.push(format!("{}: {reason}", self.backends[b].name())),
                CopyState::Unreachable(reason) => unreachable.push((b, reason)),
            }
        }
        if let Some((bytes, _)) = held.iter().find(|(_, n)| *n >= needed) {
            return Ok(Some(bytes.clone()));
        }
        if missing >= needed {
            return Ok(None);
        }
        if placement.len() - unreachable.len() < needed {
            // Too few copies answered to tell: the store is away, as for any read.
            return Err(BackendError::Unavailable {
                backend: unreachable.iter().map(|(b, _)| self.backends[*b].name()).collect::<Vec<_>>().join(", "),
                reason: format!("no majority of the copies of {key} answered ({})", join_errors(&unreachable)),
            });
        }
        errors.extend(unreachable.iter().map(|(b, reason)| format!("{}: {reason}", self.backends[*b].name())));
        if held.is_empty() && missing == 0 && errors.len() >= needed {
            // Every copy that answered is bad, as many as a majority: damaged, not undecided.
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("no copy passed verification ({})", errors.join("; ")),
            });
        }
        let agreeing = held.iter().map(|(_, n)| *n).max().unwrap_or(0);
        errors.extend(held.iter().map(|(_, n)| format!("{n} copies agree")));
        if missing > 0 {
            errors.push(format!("{missing} copies missing"));
        }
        Err(BackendError::NoMajority { key: key.to_string(), agreeing, needed, errors })
    }

    async fn get_replicated(
        &self,
        key: &str,
        limit: SizeLimit,
        expected_len: Option<u64>,
        verify: Verify<'_>,
    ) -> Result<Bytes, BackendError> {
        let placement = self.object_placement(key);
        let mut damaged = Vec::new();
        let mut bad = Vec::new();
        let mut unreachable = Vec::new();
        // Placement first; then the other backends, in case the backend list changed (a copy
        // found there is put back where it belongs).
        let others: Vec<usize> = (0..self.backends.len()).filter(|b| !placement.contains(b)).collect();
        for (pass, order) in [self.read_order(&placement), others].into_iter().enumerate() {
            for b in order {
                match self.read_copy(b, key, limit, expected_len, verify).await {
                    CopyState::Good(bytes) => {
                        if !damaged.is_empty() {
                            self.rewrite(key, &bytes, &damaged, RepairSource::CopyFrom(vec![b])).await;
                        }
                        return Ok(bytes);
                    }
                    CopyState::Bad(reason) => {
                        bad.push(format!("{}: {reason}", self.backends[b].name()));
                        if pass == 0 {
                            damaged.push(b);
                        }
                    }
                    CopyState::Missing => {
                        if pass == 0 {
                            damaged.push(b);
                        }
                    }
                    CopyState::Unreachable(e) => unreachable.push((b, e)),
                }
            }
        }
        // A copy that could not be asked may be good: that is "try again", never "lost".
        let placement_unreachable: Vec<(usize, String)> =
            unreachable.iter().filter(|(b, _)| placement.contains(b)).cloned().collect();
        if !placement_unreachable.is_empty() {
            let mut reason =
                format!("no copy of {key} could be read and verified ({}", join_errors(&placement_unreachable));
            if !bad.is_empty() {
                reason.push_str(&format!("; {}", bad.join("; ")));
            }
            reason.push(')');
            return Err(BackendError::Unavailable {
                backend: placement_unreachable
                    .iter()
                    .map(|(b, _)| self.backends[*b].name())
                    .collect::<Vec<_>>()
                    .join(", "),
                reason,
            });
        }
        if !bad.is_empty() {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("no copy passed verification ({})", bad.join("; ")),
            });
        }
        Err(BackendError::NotFound { key: key.to_string() })
    }

    /// Reads and checks one whole copy.
    pub(super) async fn read_copy(
        &self,
        b: usize,
        key: &str,
        limit: SizeLimit,
        expected_len: Option<u64>,
        verify: Verify<'_>,
    ) -> CopyState {
        match self.backends[b].get(key, limit).await {
            Ok(bytes) => match expected_len {
                Some(len) if bytes.len() as u64 != len => {
                    CopyState::Bad(format!("{} bytes, the index says {len}", bytes.len()))
                }
                _ if verify(&bytes) => CopyState::Good(bytes),
                _ => CopyState::Bad("failed verification".into()),
            },
            Err(e) if e.is_not_found() => CopyState::Missing,
            Err(BackendError::Corrupt { reason, .. }) => CopyState::Bad(reason),
            Err(e) => CopyState::Unreachable(e.to_string()),
        }
    }

    /// Reads `range` of a pack of `pack_len` bytes (the length this layer stored) and returns
    /// what `open` makes of it.
    ///
    /// `open` gets each candidate's bytes by value, so it can decrypt them where they lie (a
    /// body read from one GET is held by nothing else). Replicas: a range GET from the first
    /// available replica whose bytes pass `open`; earlier
    /// bad or missing replicas are rewritten from a whole copy of the good one. Erasure: range
    /// GETs of the data shard(s) holding the range; if one fails or `open` rejects the result,
    /// whole shards are fetched, checked by their trailers, the pack rebuilt from any `k` good
    /// ones, the range served and the bad or missing shards rewritten.
    pub async fn get_pack_range<T>(
        &self,
        key: &str,
        pack_len: u64,
        range: Range<u64>,
        open: Open<'_, T>,
    ) -> Result<T, BackendError> {
        validate_key(key)?;
        if range.start > range.end || range.end > pack_len {
            return Err(BackendError::BadRange { key: key.to_string(), range, len: pack_len });
        }
        if range.is_empty() {
            return open(Bytes::new()).ok_or_else(|| BackendError::Corrupt {
                key: key.to_string(),
                reason: "an empty range failed verification".into(),
            });
        }
        let Some(codec) = self.codec.clone() else {
            return self.get_replicated_range(key, pack_len, range, open).await;
        };

        // Fast path: only the data shards holding the range, no decoding.
        let pieces = codec.locate(pack_len, range.clone())?;
        let reads = join_all(pieces.iter().map(|(i, r)| {
            let b = self.shard_backend(key, *i);
            let shard = shard_key(key, *i);
            async move { self.backends[b].get_range(&shard, r.clone()).await }
        }))
        .await;
        let mut fast_error = None;
        if reads.iter().all(Result::is_ok) {
            let parts: Vec<Bytes> = reads.into_iter().flatten().collect();
            let bytes = if parts.len() == 1 {
                parts.into_iter().next().unwrap_or_default()
            } else {
                Bytes::from(parts.concat())
            };
            if let Some(opened) = open(bytes) {
                return Ok(opened);
            }
            fast_error = Some("range failed verification".to_string());
        } else if let Some(Err(e)) = reads.into_iter().find(Result::is_err) {
            fast_error = Some(e.to_string());
        }
        tracing::info!(key, error = fast_error.as_deref().unwrap_or(""), "degraded pack read; rebuilding from shards");

        // Degraded path: all shards at once (latency over bandwidth: this is a user's read).
        let (pack, copies) = self.read_erasure(key, pack_len, true).await?;
        let start = usize::try_from(range.start).map_err(|_| BackendError::Internal("range too large".into()))?;
        let end = usize::try_from(range.end).map_err(|_| BackendError::Internal("range too large".into()))?;
        let Some(opened) = open(Bytes::copy_from_slice(&pack[start..end])) else {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: "the range rebuilt from shards with valid hashes fails verification; the pack was stored \
                         damaged"
                    .into(),
            });
        };
        self.repair_shards(key, pack, &copies).await;
        Ok(opened)
    }

    /// The whole pack (used by scrub and repacking); `verify` is called on the whole pack.
    pub async fn get_pack(&self, key: &str, pack_len: u64, verify: Verify<'_>) -> Result<Bytes, BackendError> {
        validate_key(key)?;
        if self.codec.is_none() {
            return self.get_replicated(key, pack_limit(pack_len), Some(pack_len), verify).await;
        }
        let (pack, copies) = self.read_erasure(key, pack_len, false).await?;
        if !verify(&pack) {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: "the pack read from shards with valid hashes fails verification".into(),
            });
        }
        if needs_repair(&copies) {
            self.repair_shards(key, pack.clone(), &copies).await;
        }
        Ok(Bytes::from(pack))
    }

    async fn get_replicated_range<T>(
        &self,
        key: &str,
        pack_len: u64,
        range: Range<u64>,
        open: Open<'_, T>,
    ) -> Result<T, BackendError> {
        let placement = self.object_placement(key);
        let mut damaged = Vec::new();
        let mut bad = Vec::new();
        let mut unreachable = Vec::new();
        for b in self.read_order(&placement) {
            match self.backends[b].get_range(key, range.clone()).await.map(open) {
                Ok(Some(opened)) => {
                    if !damaged.is_empty() {
                        self.repair_from(b, key, pack_len, &damaged).await;
                    }
                    return Ok(opened);
                }
                Ok(None) => {
                    bad.push(format!("{}: range failed verification", self.backends[b].name()));
                    damaged.push(b);
                }
                Err(e) if e.is_not_found() => damaged.push(b),
                Err(BackendError::Corrupt { reason, .. }) => {
                    bad.push(format!("{}: {reason}", self.backends[b].name()));
                    damaged.push(b);
                }
                Err(e) => unreachable.push((b, e.to_string())),
            }
        }
        if !unreachable.is_empty() {
            let mut reason = format!("no replica of {key} served the range verified ({}", join_errors(&unreachable));
            if !bad.is_empty() {
                reason.push_str(&format!("; {}", bad.join("; ")));
            }
            reason.push(')');
            return Err(BackendError::Unavailable {
                backend: unreachable.iter().map(|(b, _)| self.backends[*b].name()).collect::<Vec<_>>().join(", "),
                reason,
            });
        }
        if !bad.is_empty() {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("no replica served the range verified ({})", bad.join("; ")),
            });
        }
        // Missing everywhere it should be: maybe stored before the backend list changed.
        let whole = self.get_replicated(key, pack_limit(pack_len), Some(pack_len), &|_| true).await?;
        let part = whole.slice(range.start as usize..range.end as usize);
        open(part)
            .ok_or_else(|| BackendError::Corrupt { key: key.to_string(), reason: "range failed verification".into() })
    }

    /// Copies the whole object from backend `source` to `targets` (read repair after a range read).
    async fn repair_from(&self, source: usize, key: &str, pack_len: u64, targets: &[usize]) {
        match self.backends[source].get(key, pack_limit(pack_len)).await {
            Ok(whole) if whole.len() as u64 == pack_len => {
                self.rewrite(key, &whole, targets, RepairSource::CopyFrom(vec![source])).await;
            }
            Ok(whole) => {
                tracing::warn!(key, len = whole.len(), pack_len, "not repairing from a copy of the wrong length")
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "could not fetch a good copy for read repair; queued");
                for &t in targets {
                    self.repairs.enqueue_source(t, key, RepairSource::CopyFrom(vec![source]));
                }
            }
        }
    }
}

/// A whole pack is read only up to the length its index records.
pub(super) fn pack_limit(pack_len: u64) -> SizeLimit {
    SizeLimit::exactly(pack_len, "this pack (its length in the index)")
}

/// Some shard was found bad or missing (not merely unreachable).
fn needs_repair(copies: &[Option<CopyState>]) -> bool {
    copies.iter().any(|c| matches!(c, Some(CopyState::Bad(_) | CopyState::Missing)))
}

fn join_errors(errors: &[(usize, String)]) -> String {
    errors.iter().map(|(_, e)| e.as_str()).collect::<Vec<_>>().join("; ")
}
