//! Listing: the union over every backend of the keys under a prefix, with shard objects folded
//! into their pack's key under `Erasure`.
//!
//! Invariant: a listing is only returned when no more backends failed than the policy
//! tolerates (and at least one answered), since otherwise an object could be missing from the
//! union and a caller could take it for gone.

use std::collections::BTreeMap;

use futures::future::join_all;

use super::{RedundantStore, describe};
use crate::backend::erasure::split_shard_key;
use crate::backend::error::BackendError;
use crate::backend::single::{ObjectInfo, validate_key};

impl RedundantStore {
    /// Union of keys under `prefix` (a key path, see [`Backend::list`]) across backends, shard
    /// suffixes `.sN` folded into the pack key, with the largest size seen (for a pack under
    /// `Erasure` that is a shard object's size). Fails only if more backends failed than the
    /// policy tolerates, since then an object could be missing from the union.
    ///
    /// [`Backend::list`]: crate::backend::Backend::list
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.list_after(prefix, None).await
    }

    /// Like [`RedundantStore::list`], only keys sorting after `after` (see `Backend::list_after`).
    pub async fn list_after(&self, prefix: &str, after: Option<&str>) -> Result<Vec<ObjectInfo>, BackendError> {
        let trimmed = prefix.trim_end_matches('/');
        if !trimmed.is_empty() {
            validate_key(trimmed)?;
        }
        let results = join_all(self.backends.iter().map(|b| b.list_after(prefix, after))).await;
        let mut union: BTreeMap<String, u64> = BTreeMap::new();
        let mut failed = Vec::new();
        for (b, result) in self.backends.iter().zip(results) {
            match result {
                Ok(objects) => {
                    for o in objects {
                        let key = match split_shard_key(&o.key) {
                            Some((base, _)) if self.codec.is_some() => base.to_string(),
                            _ => o.key,
                        };
                        let size = union.entry(key).or_default();
                        *size = (*size).max(o.size);
                    }
                }
                Err(e) => failed.push(describe(b, &e)),
            }
        }
        if failed.len() > self.redundancy.fault_tolerance() || failed.len() == self.backends.len() {
            return Err(BackendError::ListIncomplete { prefix: prefix.to_string(), failed });
        }
        Ok(union.into_iter().map(|(key, size)| ObjectInfo { key, size }).collect())
    }
}
