//! Deletes: every copy of a small object, or every copy or shard of a pack, on the backends
//! placement puts them on.
//!
//! Invariants: the key's queued repairs are forgotten first, so no repair puts a deleted object
//! back; a delete that did not reach every copy is an error, and the copies left behind show up
//! in listings for a later retry.

use futures::future::join_all;

use super::{RedundantStore, describe};
use crate::backend::erasure::shard_key;
use crate::backend::error::BackendError;
use crate::backend::single::validate_key;

impl RedundantStore {
    /// Deletes every copy of a small object (and forgets its queued repairs). Errors if some
    /// copy could not be deleted; the remaining copies show up in listings for a later retry.
    pub async fn delete_object(&self, key: &str) -> Result<(), BackendError> {
        validate_key(key)?;
        let keys = vec![key.to_string()];
        self.repairs.forget_keys(&keys);
        let targets: Vec<(usize, String)> =
            self.object_placement(key).into_iter().map(|b| (b, key.to_string())).collect();
        self.delete_all(key, targets).await
    }

    /// Deletes every copy or shard of a pack (and forgets its queued repairs).
    pub async fn delete_pack(&self, key: &str) -> Result<(), BackendError> {
        validate_key(key)?;
        let Some(codec) = &self.codec else {
            return self.delete_object(key).await;
        };
        let targets: Vec<(usize, String)> =
            (0..codec.total_shards()).map(|i| (self.shard_backend(key, i), shard_key(key, i))).collect();
        let keys: Vec<String> = targets.iter().map(|(_, k)| k.clone()).collect();
        self.repairs.forget_keys(&keys);
        self.delete_all(key, targets).await
    }

    async fn delete_all(&self, key: &str, targets: Vec<(usize, String)>) -> Result<(), BackendError> {
        let results = join_all(targets.iter().map(|(b, k)| self.backends[*b].delete(k))).await;
        let errors: Vec<String> = targets
            .iter()
            .zip(results)
            .filter_map(|((b, _), r)| r.err().map(|e| describe(&self.backends[*b], &e)))
            .collect();
        if errors.is_empty() {
            return Ok(());
        }
        Err(BackendError::Unavailable {
            backend: format!("{} of {} backends", errors.len(), targets.len()),
            reason: format!("{key} was not deleted everywhere ({})", errors.join("; ")),
        })
    }
}
