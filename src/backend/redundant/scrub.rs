//! Scrub: every copy or shard of one object or pack is read and checked, counted in a
//! [`ScrubOutcome`], and with `repair` the bad and missing ones are rewritten.
//!
//! Invariants: copies are only rewritten from data that passed the caller's `verify`; under
//! `Erasure` the pack rebuilt from shards with valid trailers must pass `verify`, and every
//! shard must equal what encoding that pack gives, so a stale shard with a valid hash is found
//! too. A copy whose backend could not be asked is counted unreachable, never missing; with no
//! good data to repair from, the outcome says `unrepairable`.

use bytes::Bytes;
use futures::future::join_all;

use super::read::pack_limit;
use super::shards::good_shards;
use super::{BLOCKING_THRESHOLD, CopyState, RedundantStore, ScrubOutcome, Verify, maybe_blocking};
use crate::backend::limit::SizeLimit;
use crate::backend::repair::RepairSource;
use crate::backend::single::validate_key;

impl RedundantStore {
    /// Checks every copy of a small object; with `repair`, rewrites bad and missing ones. A
    /// copy over `limit` is bad (and not read).
    pub async fn scrub_object(&self, key: &str, limit: SizeLimit, verify: Verify<'_>, repair: bool) -> ScrubOutcome {
        if validate_key(key).is_err() {
            return ScrubOutcome { unrepairable: true, ..ScrubOutcome::default() };
        }
        self.scrub_replicated(key, limit, None, verify, repair).await
    }

    /// Checks every copy or shard of a pack; with `repair`, rewrites bad and missing ones.
    /// Under `Erasure` the rebuilt pack must pass `verify`, and every shard must equal what
    /// encoding that pack gives (so a stale shard with a valid hash is caught too).
    pub async fn scrub_pack(&self, key: &str, pack_len: u64, verify: Verify<'_>, repair: bool) -> ScrubOutcome {
        if validate_key(key).is_err() {
            return ScrubOutcome { unrepairable: true, ..ScrubOutcome::default() };
        }
        let Some(codec) = self.codec.clone() else {
            return self.scrub_replicated(key, pack_limit(pack_len), Some(pack_len), verify, repair).await;
        };
        let mut outcome = ScrubOutcome::default();
        let shard_len = match codec.shard_len(pack_len) {
            Ok(s) => s,
            Err(_) => {
                outcome.unrepairable = true;
                return outcome;
            }
        };
        let total = codec.total_shards();
        let mut copies: Vec<Option<CopyState>> = (0..total).map(|_| None).collect();
        let all: Vec<usize> = (0..total).collect();
        self.fetch_shards(key, shard_len, &all, &mut copies).await;
        let shards = good_shards(&copies);
        let big = pack_len as usize >= BLOCKING_THRESHOLD;
        let codec2 = codec.clone();
        let rebuilt = maybe_blocking(big, move || {
            let mut shards = shards;
            codec2.reconstruct(&mut shards, true)?;
            codec2.join(&shards, pack_len)
        })
        .await;
        let expected = match rebuilt {
            Ok(Ok(pack)) if verify(&pack) => {
                let encoded = maybe_blocking(big, move || codec.encode(&pack)).await;
                match encoded {
                    Ok(Ok(shards)) => Some(shards),
                    _ => None,
                }
            }
            _ => None,
        };
        let mut targets = Vec::new();
        for (i, copy) in copies.iter().enumerate() {
            match copy {
                Some(CopyState::Good(body)) => match &expected {
                    Some(shards) if shards[i][..shard_len] != body[..] => {
                        outcome.copies_bad += 1;
                        targets.push(i);
                    }
                    _ => outcome.copies_ok += 1,
                },
                Some(CopyState::Bad(_)) => {
                    outcome.copies_bad += 1;
                    targets.push(i);
                }
                Some(CopyState::Missing) => {
                    outcome.copies_missing += 1;
                    targets.push(i);
                }
                Some(CopyState::Unreachable(_)) | None => outcome.copies_unreachable += 1,
            }
        }
        let Some(shards) = expected else {
            outcome.unrepairable = true;
            return outcome;
        };
        if repair {
            outcome.repaired = self.rewrite_shards(key, &shards, &targets).await;
        }
        outcome
    }

    async fn scrub_replicated(
        &self,
        key: &str,
        limit: SizeLimit,
        expected_len: Option<u64>,
        verify: Verify<'_>,
        repair: bool,
    ) -> ScrubOutcome {
        let placement = self.object_placement(key);
        let copies = join_all(placement.iter().map(|&b| self.read_copy(b, key, limit, expected_len, verify))).await;
        let mut outcome = ScrubOutcome::default();
        let mut good: Option<(usize, Bytes)> = None;
        let mut targets = Vec::new();
        for (&b, copy) in placement.iter().zip(copies) {
            match copy {
                CopyState::Good(bytes) => {
                    outcome.copies_ok += 1;
                    good.get_or_insert((b, bytes));
                }
                CopyState::Bad(_) => {
                    outcome.copies_bad += 1;
                    targets.push(b);
                }
                CopyState::Missing => {
                    outcome.copies_missing += 1;
                    targets.push(b);
                }
                CopyState::Unreachable(_) => outcome.copies_unreachable += 1,
            }
        }
        match good {
            None => outcome.unrepairable = true,
            Some((source, bytes)) if repair && !targets.is_empty() => {
                outcome.repaired = self.rewrite(key, &bytes, &targets, RepairSource::CopyFrom(vec![source])).await;
            }
            Some(_) => {}
        }
        outcome
    }
}
