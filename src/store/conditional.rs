//! The store's record of which backends honour conditional creates (`conditional_create` in
//! the `config` object), so that a fresh node's mount need not probe them again.
//!
//! A writer's mount on a conditionally fenced store must know that every backend honours
//! If-None-Match (`RedundantStore::check_conditional_create`): three requests in sequence per
//! backend, which a reset pays before it serves. The first writer that probed records the
//! backends that passed, as keyed hashes of their URLs (domain [`DOMAIN`]: the plaintext
//! config names no backend, and a record is only good for a store whose key made it); a mount
//! whose every backend is recorded skips the probe, one with a backend not recorded (added,
//! or reached through another URL) probes again and records the union.
//!
//! Invariants:
//! - the record is input: it is checked once, where the config decodes
//!   ([`ConditionalCreate::lenient`]); one that does not check is [`ConditionalCreate::Unreadable`],
//!   which a mount reports in one line and treats as no record (it probes), never an error
//!   that keeps the store shut;
//! - recording rewrites `config` with the field set and every other field kept as it was
//!   (fields a newer tierfs added included); it is best effort and only ever adds what a
//!   probe showed.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{CONFIG_KEY, Store, StoreError, StoreInfo, WholeObject};

/// The field of the `config` object that holds the record.
pub const FIELD: &str = "conditional_create";
/// The domain of the keyed hash of a backend's URL in the record.
pub const DOMAIN: &str = "conditional-create backend";
/// A record names at most this many backends (a store has a handful; the config object is
/// bounded at 64 KiB).
pub const MAX_RECORDED: usize = 64;

/// What the store's config says about its backends and conditional creates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ConditionalCreate {
    /// Nothing recorded: a store from before the record, or no writer probed it yet.
    #[default]
    Unrecorded,
    /// These backends (keyed hashes of their URLs, 64 lowercase hex each) refused a second
    /// create of an object when a writer probed them.
    Honoured(Vec<String>),
    /// A record that does not check (why): treated as [`ConditionalCreate::Unrecorded`].
    Unreadable(String),
}

impl ConditionalCreate {
    /// Only a record worth writing is serialized.
    pub fn is_unrecorded(&self) -> bool {
        !matches!(self, ConditionalCreate::Honoured(_))
    }

    /// Decodes the field, never failing: a value that is not a list of at most
    /// [`MAX_RECORDED`] keyed hashes is [`ConditionalCreate::Unreadable`].
    pub fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<ConditionalCreate, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(ConditionalCreate::check(&value))
    }

    fn check(value: &serde_json::Value) -> ConditionalCreate {
        let unreadable = |why: &str| ConditionalCreate::Unreadable(why.to_string());
        let Some(list) = value.as_array() else {
            return unreadable("not a list");
        };
        if list.len() > MAX_RECORDED {
            return unreadable("more backends than a record may name");
        }
        let mut tags = Vec::with_capacity(list.len());
        for tag in list {
            match tag.as_str() {
                Some(t) if t.len() == 64 && t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
                    tags.push(t.to_string())
                }
                _ => return unreadable("an entry is not 64 lowercase hex digits"),
            }
        }
        ConditionalCreate::Honoured(tags)
    }
}

impl Serialize for ConditionalCreate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ConditionalCreate::Honoured(tags) => tags.serialize(s),
            ConditionalCreate::Unrecorded | ConditionalCreate::Unreadable(_) => s.serialize_none(),
        }
    }
}

impl Store {
    /// The record's tag of backend `name` (its URL): a keyed hash, so the config names no
    /// backend and a record made with another store's key matches nothing.
    fn backend_tag(&self, name: &str) -> String {
        hex::encode(self.keys().name_hash(DOMAIN, name.as_bytes()))
    }

    /// Whether the config records every backend of this store as honouring conditional
    /// creates (the writer's mount then skips the probe).
    pub fn conditional_create_recorded(&self) -> bool {
        match &self.info().conditional_create {
            ConditionalCreate::Honoured(tags) => {
                self.backend().backends().iter().all(|b| tags.contains(&self.backend_tag(b.name())))
            }
            ConditionalCreate::Unrecorded | ConditionalCreate::Unreadable(_) => false,
        }
    }

    /// Records in the config that the backends `honoured` (indices into the store's backends)
    /// refused a second create when probed, beside any the record names already: rewrites the
    /// `config` object with every other field as it is in the store.
    pub async fn record_conditional_create(&self, honoured: &[usize]) -> Result<(), StoreError> {
        let backends = self.backend().backends();
        let mut tags = match &self.info().conditional_create {
            ConditionalCreate::Honoured(tags) => tags.clone(),
            ConditionalCreate::Unrecorded | ConditionalCreate::Unreadable(_) => Vec::new(),
        };
        for b in honoured.iter().filter_map(|&i| backends.get(i)) {
            let tag = self.backend_tag(b.name());
            if !tags.contains(&tag) {
                tags.push(tag);
            }
        }
        tags.truncate(MAX_RECORDED);
        let current = self.backend().get_object(CONFIG_KEY, WholeObject::Config.limit(), &json_object).await?;
        let undecodable =
            |e: serde_json::Error| StoreError::Undecodable { what: "the config object".into(), reason: e.to_string() };
        let mut fields: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&current).map_err(undecodable)?;
        // The same store (its id and format) as this node opened, or nothing is written.
        let now = StoreInfo::decode(&current)?;
        if now.store_id != self.info().store_id || now.format != self.info().format {
            return Err(StoreError::Undecodable {
                what: "the config object".into(),
                reason: "it changed since this node opened the store".into(),
            });
        }
        fields.insert(FIELD.into(), serde_json::json!(tags));
        let body = serde_json::to_vec_pretty(&fields).map_err(undecodable)?;
        WholeObject::Config.check(CONFIG_KEY, body.len())?;
        self.backend().put_object(CONFIG_KEY, Bytes::from(body)).await?;
        Ok(())
    }
}

fn json_object(b: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(b).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_a_short_list_of_keyed_hashes_or_unreadable() {
        let tag = "ab".repeat(32);
        let ok = ConditionalCreate::check(&serde_json::json!([tag]));
        assert_eq!(ok, ConditionalCreate::Honoured(vec![tag.clone()]));
        for bad in [
            serde_json::json!("yes"),
            serde_json::json!(true),
            serde_json::json!([1]),
            serde_json::json!(["AB".repeat(32)]),
            serde_json::json!(["ab"]),
            serde_json::json!(vec![tag.clone(); MAX_RECORDED + 1]),
        ] {
            assert!(matches!(ConditionalCreate::check(&bad), ConditionalCreate::Unreadable(_)), "{bad} was taken");
        }
        assert!(ConditionalCreate::Unreadable("x".into()).is_unrecorded());
        assert!(!ok.is_unrecorded());
    }
}
