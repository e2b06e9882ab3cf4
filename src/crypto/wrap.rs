//! Wrapping the data key: a store's data key is kept only encrypted ("wrapped") under keys derived
//! from what users hold, a passphrase or a key file. The store layer keeps each [`WrappedKey`] as
//! JSON at `<prefix>/keys/<id>`.
//!
//! Invariants and why:
//! - Several wrapped copies of one data key can coexist (a passphrase per person, a key file for
//!   CI); rotating a passphrase adds one and deletes another, the data is never re-encrypted.
//! - Passphrases are stretched with Argon2id and a random 16-byte salt, because they are guessable.
//!   Key files hold 32 random bytes, so they need no stretching: `blake3::derive_key` suffices and
//!   unlocking with one is instant.
//! - The wrap is AES-256-GCM with AAD `"tierfs-key-v1" | 0 | id | 0 | method`; the KDF parameters
//!   and salt are bound implicitly, since changing them changes the wrapping key. Any mismatch,
//!   wrong secret or tampered record yields [`CryptoError::WrongKey`], never a garbage key.
//! - A record comes from the store and may be hostile: its KDF parameters are capped
//!   ([`KdfParams::MAX_M_COST_KIB`] …) so a forged record cannot make `unlock` allocate terabytes.

use std::time::{SystemTime, UNIX_EPOCH};

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::{self, AeadInOut, KeyInit};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize, Zeroizing};

use super::data_key::{fast_random, os_random};
use super::{CryptoError, DataKey, KEY_LEN};

const METHOD_ARGON2ID: &str = "argon2id";
const METHOD_KEYFILE: &str = "keyfile";
const KEY_FILE_CONTEXT: &str = "tierfs 2026-11 key file";
const AAD_PREFIX: &[u8] = b"tierfs-key-v1";
const SALT_LEN: usize = 16;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const ID_LEN: usize = 16;
/// Hex digits in a key file: 32 random bytes.
const KEY_FILE_HEX_LEN: usize = 2 * KEY_LEN;

/// Argon2id cost parameters, stored with each passphrase-wrapped key so they can be raised for
/// new keys without breaking old ones.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    pub m_cost_kib: u32,
    pub t_cost: u32,
    pub p_cost: u32,
}

impl KdfParams {
    /// Upper bounds accepted from a stored record (1 GiB of memory, 16 passes, 16 lanes): 16
    /// times the memory and 5 times the passes of [`KdfParams::recommended`], and memory a
    /// small notebook runtime still has.
    pub const MAX_M_COST_KIB: u32 = 1024 * 1024;
    pub const MAX_T_COST: u32 = 16;
    pub const MAX_P_COST: u32 = 16;

    /// What one unlock may spend on Argon2id over every record it tries, in KiB × passes: 16
    /// records of [`KdfParams::recommended`]'s cost. A store's own records fit; records someone
    /// who can write the bucket adds cannot make an unlock run for minutes (each is tried only
    /// while the budget covers it, the cheapest first).
    pub const UNLOCK_BUDGET: u64 = 16 * 64 * 1024 * 3;

    /// This record's cost against [`KdfParams::UNLOCK_BUDGET`].
    pub fn cost(self) -> u64 {
        u64::from(self.m_cost_kib) * u64::from(self.t_cost)
    }

    /// Argon2id with 64 MiB, t=3, p=1: about a third of a second on one core, the RFC 9106
    /// "second recommended option" shape, affordable on small notebook runtimes.
    pub fn recommended() -> KdfParams {
        KdfParams { m_cost_kib: 64 * 1024, t_cost: 3, p_cost: 1 }
    }

    /// The cheapest parameters argon2 accepts: for unit and integration tests only.
    pub fn for_tests() -> KdfParams {
        KdfParams { m_cost_kib: argon2::Params::MIN_M_COST, t_cost: 1, p_cost: 1 }
    }

    fn argon2(self) -> Result<argon2::Argon2<'static>, CryptoError> {
        if self.m_cost_kib > Self::MAX_M_COST_KIB || self.t_cost > Self::MAX_T_COST || self.p_cost > Self::MAX_P_COST {
            return Err(CryptoError::Kdf(format!(
                "Argon2id parameters {self:?} exceed the limits (m_cost_kib ≤ {}, t_cost ≤ {}, \
                 p_cost ≤ {})",
                Self::MAX_M_COST_KIB,
                Self::MAX_T_COST,
                Self::MAX_P_COST
            )));
        }
        let params = argon2::Params::new(self.m_cost_kib, self.t_cost, self.p_cost, Some(KEY_LEN))
            .map_err(|e| CryptoError::Kdf(format!("Argon2id parameters {self:?}: {e}")))?;
        Ok(argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params))
    }
}

/// What unlocks a wrapped key.
#[derive(Clone, Copy)]
pub enum Secret<'a> {
    /// A passphrase → Argon2id(params, random 16-byte salt) → wrapping key.
    Passphrase(&'a [u8]),
    /// A key file: either its contents as read or the bytes [`parse_key_file`] returns (both
    /// unlock alike) → `blake3::derive_key("tierfs 2026-11 key file", bytes)`, no KDF cost.
    KeyFile(&'a [u8]),
}

impl Secret<'_> {
    /// The [`WrappedKey::method`] this secret makes and opens.
    pub fn method(&self) -> &'static str {
        match self {
            Secret::Passphrase(_) => METHOD_ARGON2ID,
            Secret::KeyFile(_) => METHOD_KEYFILE,
        }
    }
}

impl std::fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Passphrase(_) => f.write_str("Passphrase(..)"),
            Secret::KeyFile(_) => f.write_str("KeyFile(..)"),
        }
    }
}

/// A data key wrapped by one passphrase or key file. Stored as JSON at `<prefix>/keys/<id>` by the
/// store layer. Holds nothing secret: the data key only in encrypted form.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct WrappedKey {
    /// 16 random bytes, hex.
    pub id: String,
    /// A human label ("passphrase", "keyfile", user-given).
    pub label: String,
    pub created_unix: u64,
    /// "argon2id" or "keyfile".
    pub method: String,
    /// Argon2id parameters; `None` for key files.
    pub kdf: Option<KdfParams>,
    /// Hex; empty for key files.
    pub salt: String,
    /// Hex, 12 bytes.
    pub nonce: String,
    /// Hex of AES-256-GCM(wrapping key, data key): ciphertext then tag, 48 bytes.
    pub wrapped: String,
}

/// Wraps `data_key` under `secret`. `params` applies to passphrases only.
///
/// Errors: [`CryptoError::Kdf`] for an empty passphrase or unusable parameters,
/// [`CryptoError::BadKeyFile`] for a key file shorter than 32 bytes.
pub fn wrap_key(
    data_key: &DataKey,
    secret: &Secret<'_>,
    params: KdfParams,
    label: &str,
) -> Result<WrappedKey, CryptoError> {
    let mut id = [0u8; ID_LEN];
    fast_random(&mut id);
    let id = hex::encode(id);

    let (kdf, salt) = match secret {
        Secret::Passphrase(passphrase) => {
            if passphrase.is_empty() {
                return Err(CryptoError::EmptyPassphrase);
            }
            let mut salt = [0u8; SALT_LEN];
            os_random(&mut salt);
            (Some(params), salt.to_vec())
        }
        Secret::KeyFile(contents) => {
            let material = key_file_material(contents);
            if material.len() < KEY_LEN {
                return Err(CryptoError::BadKeyFile(format!(
                    "it holds {} bytes of key material; at least {KEY_LEN} are needed",
                    material.len()
                )));
            }
            (None, Vec::new())
        }
    };
    let wrapping_key = wrapping_key(secret, kdf, &salt)?;

    let mut nonce = [0u8; NONCE_LEN];
    fast_random(&mut nonce);
    let mut sealed = Zeroizing::new([0u8; KEY_LEN + TAG_LEN]);
    let (body, tag_out) = sealed.split_at_mut(KEY_LEN);
    body.copy_from_slice(data_key.as_bytes());
    let aad = aad(&id, secret.method());
    let tag = Aes256Gcm::new((&*wrapping_key).into())
        .encrypt_inout_detached(&nonce.into(), &aad, body.into())
        // Only reachable for inputs of 64 GiB; mapped rather than unwrapped all the same.
        .map_err(|aead::Error| CryptoError::Kdf("AES-GCM refused to wrap the key".into()))?;
    tag_out.copy_from_slice(&tag);

    Ok(WrappedKey {
        id,
        label: label.to_owned(),
        created_unix: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        method: secret.method().to_owned(),
        kdf,
        salt: hex::encode(salt),
        nonce: hex::encode(nonce),
        wrapped: hex::encode(&sealed[..]),
    })
}

/// Unwraps the data key with `secret`.
///
/// [`CryptoError::WrongKey`] if the secret does not open it (never garbage), including a secret
/// of the other method; [`CryptoError::BadRecord`] (corrupt) if the record itself is malformed
/// or its KDF parameters are out of bounds.
pub fn unwrap_key(wrapped: &WrappedKey, secret: &Secret<'_>) -> Result<DataKey, CryptoError> {
    if wrapped.method != secret.method() {
        return Err(CryptoError::WrongKey);
    }
    let malformed = |what: &str| CryptoError::BadRecord { id: wrapped.id.clone(), reason: what.to_string() };
    let salt = hex::decode(&wrapped.salt).map_err(|_| malformed("salt is not hex"))?;
    if let Secret::Passphrase(_) = secret {
        if wrapped.kdf.is_none() {
            return Err(malformed("no Argon2id parameters"));
        }
        if salt.len() < argon2::MIN_SALT_LEN {
            return Err(malformed("salt is too short"));
        }
    }
    let nonce: [u8; NONCE_LEN] = decode_hex_array(&wrapped.nonce).ok_or_else(|| malformed("bad nonce"))?;
    let sealed: Zeroizing<[u8; KEY_LEN + TAG_LEN]> =
        Zeroizing::new(decode_hex_array(&wrapped.wrapped).ok_or_else(|| malformed("bad wrapped key length"))?);

    let wrapping_key = wrapping_key(secret, wrapped.kdf, &salt).map_err(|e| match e {
        CryptoError::Kdf(reason) => CryptoError::BadRecord { id: wrapped.id.clone(), reason },
        e => e,
    })?;
    let (body, tag) = sealed.split_at(KEY_LEN);
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    let buf = aead::inout::InOutBuf::new(body, &mut key[..]).map_err(|_| malformed("bad length"))?;
    let tag: [u8; TAG_LEN] = tag.try_into().map_err(|_| malformed("bad tag length"))?;
    Aes256Gcm::new((&*wrapping_key).into())
        .decrypt_inout_detached(&nonce.into(), &aad(&wrapped.id, &wrapped.method), buf, &tag.into())
        .map_err(|aead::Error| CryptoError::WrongKey)?;
    Ok(DataKey::from_bytes(*key))
}

/// Tries the wrapped keys whose method matches the secret's kind, the cheapest to derive
/// first, while [`KdfParams::UNLOCK_BUDGET`] covers them; `Ok((key, index))` for the first
/// that opens, else [`CryptoError::WrongKey`].
///
/// A malformed record, or one the budget no longer covers, is skipped; its error is returned
/// only if no well-formed record of the right method was rejected, since then it is the most
/// useful thing to tell the user.
pub fn unwrap_any(wrapped: &[WrappedKey], secret: &Secret<'_>) -> Result<(DataKey, usize), CryptoError> {
    let mut malformed = None;
    let mut rejected = false;
    let mut candidates: Vec<(usize, &WrappedKey)> =
        wrapped.iter().enumerate().filter(|(_, w)| w.method == secret.method()).collect();
    let cost = |w: &WrappedKey| w.kdf.map_or(0, KdfParams::cost);
    candidates.sort_by_key(|(_, w)| cost(w));
    let mut budget = KdfParams::UNLOCK_BUDGET;
    for (index, candidate) in candidates {
        let Some(left) = budget.checked_sub(cost(candidate)) else {
            malformed = malformed.or(Some(CryptoError::BadRecord {
                id: candidate.id.clone(),
                reason: format!("it asks for more Argon2id work ({:?}) than an unlock spends", candidate.kdf),
            }));
            continue;
        };
        budget = left;
        match unwrap_key(candidate, secret) {
            Ok(key) => return Ok((key, index)),
            Err(CryptoError::WrongKey) => rejected = true,
            Err(e) => malformed = malformed.or(Some(e)),
        }
    }
    match malformed {
        Some(e) if !rejected => Err(e),
        _ => Err(CryptoError::WrongKey),
    }
}

/// A new key file's contents: 32 random bytes as 64 lowercase hex chars + "\n".
pub fn generate_key_file() -> String {
    let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
    os_random(&mut bytes[..]);
    let mut contents = hex::encode(&bytes[..]);
    contents.push('\n');
    contents
}

/// Validates a key file's contents (64 hex chars, surrounding whitespace ignored) and returns the
/// bytes to use as [`Secret::KeyFile`].
///
/// Error messages never quote the contents: a near-miss key file is still mostly a secret.
pub fn parse_key_file(contents: &[u8]) -> Result<Vec<u8>, CryptoError> {
    let text = contents.trim_ascii();
    if text.len() != KEY_FILE_HEX_LEN {
        return Err(CryptoError::BadKeyFile(format!(
            "expected {KEY_FILE_HEX_LEN} hex characters (a key file holds {KEY_LEN} random \
             bytes), found {} bytes",
            text.len()
        )));
    }
    if let Some(at) = text.iter().position(|b| !b.is_ascii_hexdigit()) {
        return Err(CryptoError::BadKeyFile(format!(
            "character {} is not a hex digit (a key file holds {KEY_FILE_HEX_LEN} hex characters)",
            at + 1
        )));
    }
    hex::decode(text).map_err(|e| CryptoError::BadKeyFile(e.to_string()))
}

/// The bytes a key-file secret stands for: a well-formed key file's decoded bytes, so that its
/// raw contents and [`parse_key_file`]'s output unlock alike; anything else as given.
fn key_file_material(secret: &[u8]) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(parse_key_file(secret).unwrap_or_else(|_| secret.to_vec()))
}

/// The key that wraps the data key, from the secret and the record's KDF inputs.
fn wrapping_key(
    secret: &Secret<'_>,
    kdf: Option<KdfParams>,
    salt: &[u8],
) -> Result<Zeroizing<[u8; KEY_LEN]>, CryptoError> {
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    match (secret, kdf) {
        (Secret::Passphrase(passphrase), Some(params)) => {
            params
                .argon2()?
                .hash_password_into(passphrase, salt, &mut key[..])
                .map_err(|e| CryptoError::Kdf(format!("Argon2id: {e}")))?;
        }
        (Secret::Passphrase(_), None) => {
            return Err(CryptoError::Kdf("a passphrase needs Argon2id parameters".into()));
        }
        (Secret::KeyFile(contents), _) => {
            let mut derived = blake3::derive_key(KEY_FILE_CONTEXT, &key_file_material(contents));
            key.copy_from_slice(&derived);
            derived.zeroize();
        }
    }
    Ok(key)
}

/// AAD of a wrapped key: binds the ciphertext to its record's id and method. The zero bytes
/// separate the fields (neither ever contains one) so no two records share an AAD.
fn aad(id: &str, method: &str) -> Vec<u8> {
    [AAD_PREFIX, b"\0", id.as_bytes(), b"\0", method.as_bytes()].concat()
}

fn decode_hex_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    let mut out = [0u8; N];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn data_key() -> DataKey {
        DataKey::from_bytes([0x5a; KEY_LEN])
    }

    #[test]
    fn passphrase_round_trip_and_wrong_passphrase() {
        let key = data_key();
        let secret = Secret::Passphrase(b"correct horse battery staple");
        let wrapped = wrap_key(&key, &secret, KdfParams::for_tests(), "passphrase").unwrap();
        assert_eq!(wrapped.method, "argon2id");
        assert_eq!(wrapped.kdf, Some(KdfParams::for_tests()));
        assert_eq!(wrapped.id.len(), 32);
        assert_eq!(wrapped.salt.len(), 32);
        assert_eq!(wrapped.label, "passphrase");
        assert!(wrapped.created_unix > 1_700_000_000);
        // The data key never appears in the record.
        let json = serde_json::to_string(&wrapped).unwrap();
        assert!(!json.contains(&hex::encode(key.as_bytes())));

        let back: WrappedKey = serde_json::from_str(&json).unwrap();
        assert_eq!(unwrap_key(&back, &secret).unwrap().as_bytes(), key.as_bytes());

        let wrong = Secret::Passphrase(b"correct horse battery stapler");
        assert!(matches!(unwrap_key(&back, &wrong), Err(CryptoError::WrongKey)));
        let err = unwrap_key(&back, &wrong).unwrap_err().to_string();
        assert!(err.contains("wrong passphrase or key file"), "{err}");
    }

    #[test]
    fn two_wraps_differ() {
        let secret = Secret::Passphrase(b"pw");
        let a = wrap_key(&data_key(), &secret, KdfParams::for_tests(), "a").unwrap();
        let b = wrap_key(&data_key(), &secret, KdfParams::for_tests(), "b").unwrap();
        assert_ne!(a.id, b.id);
        assert_ne!(a.salt, b.salt);
        assert_ne!(a.wrapped, b.wrapped);
    }

    #[test]
    fn key_file_round_trip_raw_contents_and_parsed_bytes_alike() {
        let key = data_key();
        let file = generate_key_file();
        assert_eq!(file.len(), 65);
        assert!(file.ends_with('\n'));
        assert!(file[..64].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let parsed = parse_key_file(file.as_bytes()).unwrap();
        assert_eq!(parsed.len(), KEY_LEN);

        let wrapped = wrap_key(&key, &Secret::KeyFile(&parsed), KdfParams::recommended(), "ci").unwrap();
        assert_eq!(wrapped.method, "keyfile");
        assert_eq!(wrapped.kdf, None);
        assert_eq!(wrapped.salt, "");
        for secret in [Secret::KeyFile(&parsed), Secret::KeyFile(file.as_bytes())] {
            assert_eq!(unwrap_key(&wrapped, &secret).unwrap().as_bytes(), key.as_bytes());
        }
        let other = parse_key_file(generate_key_file().as_bytes()).unwrap();
        assert!(matches!(unwrap_key(&wrapped, &Secret::KeyFile(&other)), Err(CryptoError::WrongKey)));
        // The same bytes as a passphrase are another method: wrong key, not a crash.
        assert!(matches!(unwrap_key(&wrapped, &Secret::Passphrase(&parsed)), Err(CryptoError::WrongKey)));
    }

    #[test]
    fn tampered_records_never_yield_a_key() {
        let secret = Secret::Passphrase(b"pw");
        let good = wrap_key(&data_key(), &secret, KdfParams::for_tests(), "p").unwrap();
        let tamper: [fn(&mut WrappedKey); 6] = [
            |w| w.id.replace_range(0..1, if w.id.starts_with('0') { "1" } else { "0" }),
            |w| w.method = "keyfile".into(),
            |w| w.kdf = Some(KdfParams { t_cost: 2, ..KdfParams::for_tests() }),
            |w| w.salt = "00".repeat(16),
            |w| w.nonce = "00".repeat(12),
            |w| w.wrapped.replace_range(0..2, if w.wrapped.starts_with("00") { "01" } else { "00" }),
        ];
        for (i, tamper) in tamper.iter().enumerate() {
            let mut bad = good.clone();
            tamper(&mut bad);
            assert!(matches!(unwrap_key(&bad, &secret), Err(CryptoError::WrongKey)), "case {i}");
        }
        let malformed: [fn(&mut WrappedKey); 5] = [
            |w| w.kdf = None,
            |w| w.salt = "zz".into(),
            |w| w.salt = "00".into(),
            |w| w.nonce = "00".into(),
            |w| w.wrapped.truncate(10),
        ];
        for (i, tamper) in malformed.iter().enumerate() {
            let mut bad = good.clone();
            tamper(&mut bad);
            let err = unwrap_key(&bad, &secret).err();
            assert!(matches!(err, Some(CryptoError::BadRecord { .. })), "case {i}: {err:?}");
            assert_eq!(err.map(|e| e.kind()), Some(crate::types::ErrorKind::Corrupt), "case {i}");
        }
    }

    #[test]
    fn hostile_kdf_parameters_are_refused_before_allocating() {
        let secret = Secret::Passphrase(b"pw");
        let mut bad = wrap_key(&data_key(), &secret, KdfParams::for_tests(), "p").unwrap();
        bad.kdf = Some(KdfParams { m_cost_kib: u32::MAX, t_cost: 1, p_cost: 1 });
        let err = unwrap_key(&bad, &secret).err();
        assert!(matches!(err, Some(CryptoError::BadRecord { .. })), "{err:?}");
        assert_eq!(err.map(|e| e.kind()), Some(crate::types::ErrorKind::Corrupt), "a store's record");
        let too_little = KdfParams { m_cost_kib: 1, t_cost: 1, p_cost: 1 };
        let err = wrap_key(&data_key(), &secret, too_little, "p").err();
        assert!(matches!(err, Some(CryptoError::Kdf(_))), "{err:?}");
        assert_eq!(err.map(|e| e.kind()), Some(crate::types::ErrorKind::InvalidInput), "the user's parameters");
        assert!(matches!(
            wrap_key(&data_key(), &Secret::Passphrase(b""), KdfParams::for_tests(), "p"),
            Err(CryptoError::EmptyPassphrase)
        ));
    }

    /// Records someone who can write the bucket added, each asking for the most work a record
    /// may (1 GiB, 16 passes: 16 GiB·passes, past the whole budget), are never run: the store's
    /// own cheap record opens, and when it is absent the answer names the budget. (Were they
    /// run, each would allocate 1 GiB and take about a minute.)
    #[test]
    fn records_that_ask_for_more_work_than_an_unlock_spends_are_never_run() {
        let secret = Secret::Passphrase(b"pw");
        let key = data_key();
        let good = wrap_key(&key, &secret, KdfParams::for_tests(), "mine").unwrap();
        let max = KdfParams { m_cost_kib: KdfParams::MAX_M_COST_KIB, t_cost: KdfParams::MAX_T_COST, p_cost: 1 };
        assert!(
            max.cost() > KdfParams::UNLOCK_BUDGET && KdfParams::recommended().cost() * 16 <= KdfParams::UNLOCK_BUDGET
        );
        let hostile: Vec<WrappedKey> =
            (0..20).map(|i| WrappedKey { id: format!("hostile{i}"), kdf: Some(max), ..good.clone() }).collect();
        let mut records = hostile.clone();
        records.push(good.clone());
        let (got, index) = unwrap_any(&records, &secret).unwrap();
        assert_eq!((got.as_bytes(), index), (key.as_bytes(), 20));
        let err = unwrap_any(&hostile, &secret).unwrap_err();
        assert!(err.to_string().contains("more Argon2id work"), "{err}");
        // Past the per-record limits: refused outright.
        let over = KdfParams { t_cost: KdfParams::MAX_T_COST + 1, ..KdfParams::for_tests() };
        let bad = WrappedKey { kdf: Some(over), ..good.clone() };
        assert!(matches!(unwrap_key(&bad, &secret), Err(CryptoError::BadRecord { .. })));
    }

    #[test]
    fn unwrap_any_picks_the_right_one() {
        let key = data_key();
        let file = generate_key_file();
        let records = vec![
            wrap_key(&key, &Secret::Passphrase(b"alice"), KdfParams::for_tests(), "alice").unwrap(),
            wrap_key(&key, &Secret::KeyFile(file.as_bytes()), KdfParams::for_tests(), "ci").unwrap(),
            wrap_key(&key, &Secret::Passphrase(b"bob"), KdfParams::for_tests(), "bob").unwrap(),
        ];
        let (got, index) = unwrap_any(&records, &Secret::Passphrase(b"bob")).unwrap();
        assert_eq!((got.as_bytes(), index), (key.as_bytes(), 2));
        let (_, index) = unwrap_any(&records, &Secret::Passphrase(b"alice")).unwrap();
        assert_eq!(index, 0);
        let (_, index) = unwrap_any(&records, &Secret::KeyFile(file.as_bytes())).unwrap();
        assert_eq!(index, 1);
        assert!(matches!(unwrap_any(&records, &Secret::Passphrase(b"eve")), Err(CryptoError::WrongKey)));
        assert!(matches!(unwrap_any(&[], &Secret::Passphrase(b"eve")), Err(CryptoError::WrongKey)));

        // A malformed record does not hide a good one, nor a plain wrong passphrase.
        let mut broken = records[0].clone();
        broken.salt = "zz".into();
        let with_broken = [broken.clone(), records[2].clone()];
        assert_eq!(unwrap_any(&with_broken, &Secret::Passphrase(b"bob")).unwrap().1, 1);
        assert!(matches!(unwrap_any(&with_broken, &Secret::Passphrase(b"eve")), Err(CryptoError::WrongKey)));
        assert!(matches!(unwrap_any(&[broken], &Secret::Passphrase(b"eve")), Err(CryptoError::BadRecord { .. })));
    }

    #[test]
    fn parse_key_file_accepts_whitespace_and_rejects_junk() {
        let hex64 = "0123456789abcdef".repeat(4);
        let want = hex::decode(&hex64).unwrap();
        assert_eq!(parse_key_file(hex64.as_bytes()).unwrap(), want);
        assert_eq!(parse_key_file(format!("  {hex64}\r\n\n").as_bytes()).unwrap(), want);
        assert_eq!(parse_key_file(hex64.to_uppercase().as_bytes()).unwrap(), want);

        let junk: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"\n".to_vec(),
            hex64.as_bytes()[..63].to_vec(),
            format!("{hex64}0").into_bytes(),
            format!("{}g", &hex64[..63]).into_bytes(),
            format!("{} {}", &hex64[..32], &hex64[32..63]).into_bytes(),
        ];
        for contents in &junk {
            let err = parse_key_file(contents).unwrap_err();
            assert!(matches!(err, CryptoError::BadKeyFile(_)), "{err}");
            assert!(err.to_string().starts_with("bad key file: "), "{err}");
        }
        assert!(matches!(
            wrap_key(&data_key(), &Secret::KeyFile(b"short"), KdfParams::for_tests(), "k"),
            Err(CryptoError::BadKeyFile(_))
        ));
    }

    #[test]
    fn kdf_params_are_valid_and_secrets_do_not_print() {
        assert!(KdfParams::recommended().argon2().is_ok());
        assert!(KdfParams::for_tests().argon2().is_ok());
        assert_eq!(KdfParams::recommended().m_cost_kib, 65536);
        assert_eq!(format!("{:?}", Secret::Passphrase(b"hunter2")), "Passphrase(..)");
    }
}
