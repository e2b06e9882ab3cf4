//! Conditional create ([`RedundantStore::create_object`]) for fenced, append-only chains such as
//! journal entries `…/j/<seq>`, and the probe that the backends honour it.
//!
//! Invariants: the key is ours only when a majority of its copies took our bytes (or already
//! held exactly them). Two majorities share a backend and a backend's create is atomic, so two
//! writers can never both win; the winner overwrites a loser's minority copies and queues the
//! unreachable ones for repair, and a loser changes nothing. When neither side can be told,
//! the answer is `QuorumFailed` (retry with the same bytes), never a guess. All of this rests on
//! every backend honouring If-None-Match, which `check_conditional_create` probes.

use bytes::Bytes;
use futures::future::join_all;

use super::{CreateOutcome, RedundantStore, describe};
use crate::backend::error::BackendError;
use crate::backend::repair::RepairSource;
use crate::backend::single::{Backend, validate_key};

impl RedundantStore {
    /// Creates a small object only if it is absent (If-None-Match: *), decided by majority: the
    /// building block of fenced, append-only chains (journal entries `…/j/<seq>`) where two
    /// writers must never both own a key.
    ///
    /// One conditional create per copy of the object's placement (that of [`Self::put_object`]),
    /// in parallel, every answer awaited. [`CreateOutcome::Created`] when a majority of the
    /// copies took our bytes (or already held exactly them, so retrying with the same bytes is
    /// safe); a competitor's minority copies are then overwritten with ours and copies that could
    /// not be written are queued for repair. [`CreateOutcome::Exists`] when other objects hold so
    /// many copies that ours cannot reach a majority; nothing is overwritten or queued (a copy of
    /// ours made on the way is the winner's to overwrite). Otherwise too many backends could not
    /// be asked to tell: [`BackendError::QuorumFailed`], retry with the same bytes.
    ///
    /// Writers must create different bytes (e.g. carry a writer id): identical bytes from two
    /// writers both count as `Created`. [`Self::get_object`] serves the first copy that passes
    /// `verify`, which can be a loser's minority copy until the winner's overwrite lands.
    pub async fn create_object(&self, key: &str, data: Bytes) -> Result<CreateOutcome, BackendError> {
        validate_key(key)?;
        let placement = self.object_placement(key);
        let needed = placement.len() / 2 + 1;
        let answers = join_all(placement.iter().map(|&b| self.backends[b].put_if_absent(key, data.clone()))).await;
        let holding = |created: bool| -> Vec<usize> {
            placement
                .iter()
                .zip(&answers)
                .filter(|(_, a)| matches!(a, Ok(c) if *c == created))
                .map(|(&b, _)| b)
                .collect()
        };
        let (ours, theirs) = (holding(true), holding(false));

        if ours.len() >= needed {
            let fallback = RepairSource::CopyFrom(ours.clone());
            for (&b, answer) in placement.iter().zip(&answers) {
                match answer {
                    Ok(true) => self.repairs.forget(b, key),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(key, backend = %self.backends[b].name(), error = %e,
                            "copy not created; queued for repair");
                        self.repairs.enqueue(b, key, data.clone(), fallback.clone());
                    }
                }
            }
            if !theirs.is_empty() {
                // The majority decided: a competitor's minority copy is stale, and left in place
                // it could be served to readers.
                tracing::info!(key, copies = theirs.len(), "overwriting a competing writer's minority copies");
                self.rewrite(key, &data, &theirs, fallback).await;
            }
            return Ok(CreateOutcome::Created);
        }
        if !theirs.is_empty() && placement.len() - theirs.len() < needed {
            tracing::debug!(key, ours = ours.len(), theirs = theirs.len(), "conditional create lost");
            return Ok(CreateOutcome::Exists);
        }
        let errors = placement
            .iter()
            .zip(&answers)
            .filter_map(|(&b, answer)| {
                let backend = &self.backends[b];
                match answer {
                    Ok(true) => None,
                    Ok(false) => Some(format!("{}: another writer's object is there", backend.name())),
                    Err(e) => Some(describe(backend, e)),
                }
            })
            .collect();
        Err(BackendError::QuorumFailed { key: key.to_string(), stored: ours.len(), needed, errors })
    }

    /// Checks that the backends honour conditional creates, which [`Self::create_object`] (and
    /// so the fencing of writers) relies on: on each backend, creates a probe object
    /// `probe/cc-<random hex>` twice with different bytes, expects the second create to be
    /// refused, and deletes the probe (best effort). A backend that lets the second create
    /// through ignores If-None-Match: [`BackendError::NotSupported`] naming it. Unreachable
    /// backends are skipped (check again once they are back), but at least one backend must
    /// have been probed; other errors (access denied, …) are returned as they are. Returns the
    /// indices of the backends that were probed and passed.
    pub async fn check_conditional_create(&self) -> Result<Vec<usize>, BackendError> {
        let key = format!("probe/cc-{}", hex::encode(rand::random::<[u8; 8]>()));
        let probes = join_all(self.backends.iter().map(|b| probe_conditional_create(b, &key))).await;
        let (mut unreachable, mut honoured) = (Vec::new(), Vec::new());
        for (i, (b, probe)) in self.backends.iter().zip(probes).enumerate() {
            match probe {
                Ok(()) => honoured.push(i),
                Err(e) if e.is_transient() => {
                    tracing::warn!(backend = %b.name(), error = %e, "conditional create not checked: unreachable");
                    unreachable.push((b, e));
                }
                Err(e) => return Err(e),
            }
        }
        if unreachable.len() < self.backends.len() {
            return Ok(honoured);
        }
        if unreachable.len() == 1 {
            if let Some((_, e)) = unreachable.pop() {
                return Err(e);
            }
        }
        Err(BackendError::Unavailable {
            backend: unreachable.iter().map(|(b, _)| b.name()).collect::<Vec<_>>().join(", "),
            reason: format!(
                "no backend could be checked for conditional create ({})",
                unreachable.iter().map(|(b, e)| describe(b, e)).collect::<Vec<_>>().join("; ")
            ),
        })
    }
}

/// One backend's conditional-create probe (see `check_conditional_create`).
async fn probe_conditional_create(backend: &Backend, key: &str) -> Result<(), BackendError> {
    let nonce = hex::encode(rand::random::<[u8; 8]>());
    let first = Bytes::from(format!("tierfs conditional-create probe {nonce}: first"));
    let second = Bytes::from(format!("tierfs conditional-create probe {nonce}: second"));
    let outcome = match backend.put_if_absent(key, first).await {
        Ok(_) => backend.put_if_absent(key, second).await,
        Err(e) => return Err(e),
    };
    if let Err(e) = backend.delete(key).await {
        tracing::debug!(backend = %backend.name(), key, error = %e, "probe object not deleted");
    }
    match outcome {
        Ok(false) => Ok(()),
        Ok(true) => Err(BackendError::NotSupported {
            backend: backend.name().to_string(),
            operation: "conditional create (If-None-Match: *)".into(),
            reason: "a second create of an existing object succeeded and replaced it: the server ignores the \
                     header (Garage 2.x does), so two writers could both think they own the workspace; use AWS S3, \
                     MinIO or another server that honours conditional writes"
                .into(),
        }),
        Err(e) => Err(e),
    }
}
