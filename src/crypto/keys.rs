//! [`Keys`]: the subkeys derived from a store's data key, and the object envelope they seal.
//!
//! Envelope (version 1), all objects alike:
//!
//! ```text
//! b"TFE1" | version u8 = 1 | kind u8 | nonce [12] | ciphertext | tag [16]
//! AAD = b"tierfs-object-v1" | kind u8 | name bytes
//! ```
//!
//! Invariants and why:
//! - The magic, version and kind are in clear so a reader can tell a foreign file, a newer format
//!   (a clear "upgrade tierfs" error instead of an authentication failure) and a mislabelled
//!   object apart before decrypting. The kind and the object's name are also bound into the AAD,
//!   so a backend cannot swap two objects or serve an old object under a new name: the tag fails.
//! - Nonces are 96 random bits from the thread CSPRNG. NIST SP 800-38D allows 2^32 random-nonce
//!   messages per key: 4 billion objects, 16 PiB of 4 MiB blocks, far beyond one store. A counter
//!   would need persistent state shared by every writer for no practical gain.
//! - Block ids and name hashes are *keyed* blake3, so equal contents dedup within a store while
//!   the store reveals nothing about them (no confirmation of a guessed file by its hash).
//! - Opening never returns unauthenticated bytes: a failed open wipes its buffer.
//! - AES-256-GCM is ring's (assembly, ~8 GiB/s per core here against ~1.8 for the pure-Rust
//!   `aes-gcm`, which only wraps data keys now): every stored byte passes through it twice.
//!   ring does not wipe its key schedule on drop; the data key and subkeys are wiped.

use std::ops::Range;
use std::sync::Arc;

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::data_key::fast_random;
use super::{CacheCipher, CryptoError, DataKey, Hash, KEY_LEN, ObjectKind};

const MAGIC: &[u8; 4] = b"TFE1";
/// The envelope version this code writes and the newest it reads.
pub const ENVELOPE_VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
/// Magic, version, kind and nonce: everything before the ciphertext.
const HEADER_LEN: usize = MAGIC.len() + 1 + 1 + NONCE_LEN;
const AAD_PREFIX: &[u8] = b"tierfs-object-v1";

/// Bytes [`Keys::seal_staged`] needs kept free before a plaintext: the envelope's header.
pub const STAGE_GAP: usize = HEADER_LEN;

/// Bytes a sealed object adds to its plaintext.
pub const ENVELOPE_OVERHEAD: usize = 4 + 1 + 1 + 12 + 16;
const _: () = assert!(ENVELOPE_OVERHEAD == HEADER_LEN + TAG_LEN);

/// The largest plaintext one envelope may hold: AES-GCM's limit (2^36 - 32 bytes, where its
/// 32-bit block counter would wrap). Blocks and packs are far smaller.
pub const MAX_PLAINTEXT_LEN: u64 = (1 << 36) - 32;

// The context strings are on-store format: changing one orphans every existing store.
const BLOCK_ID_CONTEXT: &str = "tierfs 2026-11 block id";
const OBJECT_NAME_CONTEXT: &str = "tierfs 2026-11 object name";
const OBJECT_ENCRYPTION_CONTEXT: &str = "tierfs 2026-11 object encryption";
const CACHE_CONTEXT: &str = "tierfs 2026-12 hot-tier cache";

/// Length of the envelope that seals `plaintext_len` bytes.
pub const fn sealed_len(plaintext_len: usize) -> usize {
    plaintext_len + ENVELOPE_OVERHEAD
}

/// A 32-byte subkey, zeroized on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
struct Subkey([u8; KEY_LEN]);

impl Subkey {
    fn derive(context: &str, data_key: &DataKey) -> Subkey {
        Subkey(blake3::derive_key(context, data_key.as_bytes()))
    }
}

/// Subkeys derived from the data key with `blake3::derive_key` and distinct context strings
/// ("tierfs 2026-11 block id", "tierfs 2026-11 object name", "tierfs 2026-11 object encryption").
///
/// Cheap to clone and share across threads; built once per mounted store.
#[derive(Clone)]
pub struct Keys {
    block_id: Subkey,
    object_name: Subkey,
    /// The key of the hot tier's encryption at rest ([`CacheCipher`]).
    cache: Subkey,
    /// AES-256-GCM with the object-encryption subkey.
    aead: Arc<LessSafeKey>,
}

impl Keys {
    pub fn new(data_key: &DataKey) -> Keys {
        let encryption = Subkey::derive(OBJECT_ENCRYPTION_CONTEXT, data_key);
        Keys {
            block_id: Subkey::derive(BLOCK_ID_CONTEXT, data_key),
            object_name: Subkey::derive(OBJECT_NAME_CONTEXT, data_key),
            cache: Subkey::derive(CACHE_CONTEXT, data_key),
            aead: Arc::new(LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, &encryption.0).expect("a 32-byte key is an AES-256 key"),
            )),
        }
    }

    /// Keyed blake3 of a block's plaintext: the block's id (dedup key).
    pub fn block_id(&self, plaintext: &[u8]) -> Hash {
        *blake3::keyed_hash(&self.block_id.0, plaintext).as_bytes()
    }

    /// The cipher of this store's hot tiers at rest (`--encrypt-cache`).
    pub fn cache_cipher(&self) -> CacheCipher {
        CacheCipher::new(&self.cache.0)
    }

    /// Keyed blake3 of `input`, domain-separated by `domain` (e.g. "workspace"): used for object
    /// names such as workspace directories, so no name reaches a backend.
    pub fn name_hash(&self, domain: &str, input: &[u8]) -> Hash {
        // The domain's length goes first so ("ab", "c") and ("a", "bc") hash differently.
        let mut hasher = blake3::Hasher::new_keyed(&self.object_name.0);
        hasher.update(&(domain.len() as u64).to_le_bytes());
        hasher.update(domain.as_bytes());
        hasher.update(input);
        *hasher.finalize().as_bytes()
    }

    /// Encrypts `plaintext` into a new envelope (see the module docs for its layout).
    ///
    /// # Panics
    /// If `plaintext` is longer than [`MAX_PLAINTEXT_LEN`] (64 GiB).
    pub fn seal(&self, kind: ObjectKind, name: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(sealed_len(plaintext.len()));
        self.seal_into(kind, name, plaintext, &mut out);
        out
    }

    /// Like [`Keys::seal`], appending the envelope to `out`: packs concatenate many envelopes.
    /// The plaintext is copied once, into `out`, and encrypted there in place.
    ///
    /// # Panics
    /// If `plaintext` is longer than [`MAX_PLAINTEXT_LEN`] (64 GiB).
    pub fn seal_into(&self, kind: ObjectKind, name: &[u8], plaintext: &[u8], out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(sealed_len(plaintext.len()));
        out.resize(start + HEADER_LEN, 0);
        out.extend_from_slice(plaintext);
        self.seal_staged(kind, name, out, start);
    }

    /// Seals a plaintext that already lies at the end of `out`, after [`STAGE_GAP`] bytes kept
    /// free for the header at `start`: writes the header there, encrypts `out[start +
    /// STAGE_GAP..]` in place and appends the tag, so `out[start..]` is the envelope. A caller
    /// that reads the plaintext straight into its place saves [`Keys::seal_into`]'s copy.
    ///
    /// # Panics
    /// If `out` is shorter than `start + STAGE_GAP`, or the plaintext is longer than
    /// [`MAX_PLAINTEXT_LEN`] (64 GiB).
    pub fn seal_staged(&self, kind: ObjectKind, name: &[u8], out: &mut Vec<u8>, start: usize) {
        assert!(out.len() >= start + HEADER_LEN, "tierfs: no room for an envelope header at {start}");
        let plaintext_len = out.len() - start - HEADER_LEN;
        assert!(
            plaintext_len as u64 <= MAX_PLAINTEXT_LEN,
            "tierfs: a {plaintext_len}-byte object exceeds AES-GCM's limit of {MAX_PLAINTEXT_LEN} bytes"
        );
        let mut nonce = [0u8; NONCE_LEN];
        fast_random(&mut nonce);
        let header = &mut out[start..start + HEADER_LEN];
        header[..MAGIC.len()].copy_from_slice(MAGIC);
        header[MAGIC.len()] = ENVELOPE_VERSION;
        header[MAGIC.len() + 1] = kind.as_u8();
        header[MAGIC.len() + 2..].copy_from_slice(&nonce);

        let body = &mut out[start + HEADER_LEN..];
        let sealed =
            self.aead.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad(kind, name)), body);
        match sealed {
            Ok(tag) => out.extend_from_slice(tag.as_ref()),
            Err(ring::error::Unspecified) => {
                // Unreachable after the length check (the AAD limit is 2^61 bytes). Never leave
                // plaintext behind in `out` for a caller that catches the panic.
                out[start..].zeroize();
                out.truncate(start);
                panic!("tierfs: AES-GCM refused a {plaintext_len}-byte object");
            }
        }
    }

    /// Decrypts and authenticates an envelope sealed as `kind` under `name` with these keys.
    ///
    /// A wrong key, another kind, another name, a flipped bit or a cut-off envelope is an error,
    /// never garbage: [`CryptoError::Truncated`] if it is too short to be an envelope,
    /// [`CryptoError::UnsupportedVersion`] if a newer tierfs wrote it,
    /// [`CryptoError::Authentication`] for everything else.
    pub fn open(&self, kind: ObjectKind, name: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let Envelope { nonce, body, tag } = split_envelope(kind, sealed)?;
        // One copy (ciphertext and tag), decrypted in place.
        let mut buf = Vec::with_capacity(body.len() + TAG_LEN);
        buf.extend_from_slice(body);
        buf.extend_from_slice(tag);
        match self.aead.open_in_place(Nonce::assume_unique_for_key(*nonce), Aad::from(aad(kind, name)), &mut buf) {
            Ok(_) => {
                buf.truncate(body.len());
                Ok(buf)
            }
            Err(ring::error::Unspecified) => {
                // Whatever ring left in the buffer is never handed out.
                buf.zeroize();
                Err(CryptoError::Authentication { kind })
            }
        }
    }

    /// Like [`Keys::open`], decrypting the envelope where it lies instead of in a copy: on
    /// success the plaintext is `sealed[range]` for the returned range; on failure nothing of
    /// what AES-GCM left after the header is kept (it is zeroed). Same errors as `open`.
    pub fn open_in_place(&self, kind: ObjectKind, name: &[u8], sealed: &mut [u8]) -> Result<Range<usize>, CryptoError> {
        let Envelope { nonce, body, .. } = split_envelope(kind, sealed)?;
        let (nonce, plain) = (*nonce, HEADER_LEN..HEADER_LEN + body.len());
        // Ciphertext and tag follow the header back to back, as ring wants them.
        let body_and_tag = &mut sealed[HEADER_LEN..];
        match self.aead.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad(kind, name)), body_and_tag) {
            Ok(_) => Ok(plain),
            Err(ring::error::Unspecified) => {
                body_and_tag.zeroize();
                Err(CryptoError::Authentication { kind })
            }
        }
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys { .. }")
    }
}

/// The associated data that binds an envelope to its kind and name.
fn aad(kind: ObjectKind, name: &[u8]) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_PREFIX.len() + 1 + name.len());
    aad.extend_from_slice(AAD_PREFIX);
    aad.push(kind.as_u8());
    aad.extend_from_slice(name);
    aad
}

/// The parts of a sealed object, borrowed from it.
struct Envelope<'a> {
    nonce: &'a [u8; NONCE_LEN],
    body: &'a [u8],
    tag: &'a [u8; TAG_LEN],
}

/// Checks an envelope's header against the expected kind and splits it into nonce, ciphertext
/// and tag.
fn split_envelope(kind: ObjectKind, sealed: &[u8]) -> Result<Envelope<'_>, CryptoError> {
    // A newer version may lay out the rest differently, so it is recognised before any length
    // check: the user must learn to upgrade, not that the object is "truncated".
    if sealed.len() > MAGIC.len() && sealed[..4] == *MAGIC && sealed[4] > ENVELOPE_VERSION {
        return Err(CryptoError::UnsupportedVersion { found: sealed[4], supported: ENVELOPE_VERSION });
    }
    let truncated = || CryptoError::Truncated { len: sealed.len() };
    let (header, rest) = sealed.split_first_chunk::<HEADER_LEN>().ok_or_else(truncated)?;
    let (body, tag) = rest.split_last_chunk::<TAG_LEN>().ok_or_else(truncated)?;
    let [m0, m1, m2, m3, version, kind_byte, ref nonce @ ..] = *header;
    if [m0, m1, m2, m3] != *MAGIC || version != ENVELOPE_VERSION || kind_byte != kind.as_u8() {
        return Err(CryptoError::Authentication { kind });
    }
    Ok(Envelope { nonce, body, tag })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    // The pure-Rust implementation, to check ring's envelopes against an independent one.
    use aes_gcm::Aes256Gcm;
    use aes_gcm::aead::{AeadInOut, KeyInit};
    use proptest::prelude::*;

    fn keys(byte: u8) -> Keys {
        Keys::new(&DataKey::from_bytes([byte; KEY_LEN]))
    }

    #[test]
    fn keys_are_send_sync_clone() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<Keys>();
        assert_eq!(format!("{:?}", keys(1)), "Keys { .. }");
    }

    #[test]
    fn opening_in_place_matches_open_and_refuses_what_open_refuses() {
        let k = keys(1);
        for len in [0, 1, 17, 4096, 1 << 20] {
            let plaintext: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let sealed = k.seal(ObjectKind::Block, b"name", &plaintext);
            let mut buf = sealed.clone();
            let range = k.open_in_place(ObjectKind::Block, b"name", &mut buf).unwrap();
            assert_eq!(&buf[range], &plaintext[..]);

            // Another name, a flipped bit, another key: refused, and no plaintext is left.
            for (key, name, flip) in
                [(&k, &b"other"[..], None), (&k, &b"name"[..], Some(sealed.len() / 2)), (&keys(2), &b"name"[..], None)]
            {
                let mut buf = sealed.clone();
                if let Some(at) = flip {
                    buf[at] ^= 1;
                }
                let err = key.open_in_place(ObjectKind::Block, name, &mut buf).unwrap_err();
                assert!(matches!(err, CryptoError::Authentication { .. }), "{err:?}");
                assert!(buf[HEADER_LEN..].iter().all(|&b| b == 0), "the failed body is zeroed");
            }
        }
        let mut short = vec![0u8; HEADER_LEN + TAG_LEN - 1];
        assert!(matches!(k.open_in_place(ObjectKind::Block, b"n", &mut short), Err(CryptoError::Truncated { .. })));
    }

    #[test]
    fn round_trips_empty_small_and_large() {
        let k = keys(1);
        for len in [0, 1, 15, 16, 17, 4096, 1 << 20] {
            let plaintext: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            let sealed = k.seal(ObjectKind::Block, b"name", &plaintext);
            assert_eq!(sealed.len(), sealed_len(len));
            assert_eq!(&sealed[..4], b"TFE1");
            assert_eq!(sealed[4], 1);
            assert_eq!(sealed[5], ObjectKind::Block as u8);
            if len >= 16 {
                // Nothing of the plaintext shows through.
                assert!(!sealed.windows(16).any(|w| w == &plaintext[..16]));
            }
            assert_eq!(k.open(ObjectKind::Block, b"name", &sealed).unwrap(), plaintext);
        }
    }

    #[test]
    fn seal_into_appends_and_concatenated_envelopes_open_one_by_one() {
        let k = keys(2);
        let mut pack = b"prefix".to_vec();
        let parts: [&[u8]; 3] = [b"first", b"", b"third part"];
        let mut offsets = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let start = pack.len();
            k.seal_into(ObjectKind::Block, &[i as u8], part, &mut pack);
            offsets.push((start, pack.len()));
        }
        assert_eq!(&pack[..6], b"prefix");
        for (i, (part, (start, end))) in parts.iter().zip(offsets).enumerate() {
            assert_eq!(end - start, sealed_len(part.len()));
            assert_eq!(k.open(ObjectKind::Block, &[i as u8], &pack[start..end]).unwrap(), *part);
        }
    }

    #[test]
    fn a_staged_plaintext_seals_in_place_into_the_same_envelope_format() {
        let k = keys(2);
        let mut out = b"prefix".to_vec();
        let start = out.len();
        out.extend_from_slice(&[0xAA; STAGE_GAP]); // whatever is there is overwritten
        out.extend_from_slice(b"staged plaintext");
        k.seal_staged(ObjectKind::Block, b"name", &mut out, start);
        assert_eq!(&out[..start], b"prefix");
        assert_eq!(out.len() - start, sealed_len(b"staged plaintext".len()));
        assert_eq!(k.open(ObjectKind::Block, b"name", &out[start..]).expect("open"), b"staged plaintext");
        assert!(k.open(ObjectKind::Block, b"other", &out[start..]).is_err(), "the name is bound");
        // Nothing staged: an empty plaintext.
        let mut empty = vec![0; STAGE_GAP];
        k.seal_staged(ObjectKind::Head, b"n", &mut empty, 0);
        assert_eq!(k.open(ObjectKind::Head, b"n", &empty).expect("open"), b"");
    }

    #[test]
    fn two_seals_of_the_same_plaintext_differ() {
        let k = keys(3);
        let a = k.seal(ObjectKind::Head, b"n", b"same");
        let b = k.seal(ObjectKind::Head, b"n", b"same");
        assert_ne!(a, b);
        assert_ne!(a[6..18], b[6..18], "nonces must differ");
    }

    #[test]
    fn every_bit_flip_is_an_error() {
        let k = keys(4);
        let sealed = k.seal(ObjectKind::Journal, b"j/0001", b"some journal entry bytes");
        for byte in 0..sealed.len() {
            for bit in 0..8 {
                let mut bad = sealed.clone();
                bad[byte] ^= 1 << bit;
                let err = k.open(ObjectKind::Journal, b"j/0001", &bad).unwrap_err();
                if byte == 4 && bad[4] > ENVELOPE_VERSION {
                    assert!(matches!(err, CryptoError::UnsupportedVersion { .. }), "{err}");
                } else {
                    assert!(
                        matches!(err, CryptoError::Authentication { kind: ObjectKind::Journal }),
                        "byte {byte} bit {bit}: {err}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_truncation_is_an_error() {
        let k = keys(5);
        let sealed = k.seal(ObjectKind::Snapshot, b"s", b"snapshot body");
        for len in 0..sealed.len() {
            match k.open(ObjectKind::Snapshot, b"s", &sealed[..len]) {
                Err(CryptoError::Truncated { len: l }) => assert!(l == len && len < ENVELOPE_OVERHEAD),
                Err(CryptoError::Authentication { .. }) => assert!(len >= ENVELOPE_OVERHEAD),
                other => panic!("length {len}: {other:?}"),
            }
        }
        // Extra bytes at the end are caught too.
        let mut longer = sealed.clone();
        longer.push(0);
        assert!(k.open(ObjectKind::Snapshot, b"s", &longer).is_err());
    }

    #[test]
    fn wrong_kind_name_or_key_fails_authentication() {
        let k = keys(6);
        let sealed = k.seal(ObjectKind::Head, b"workspace/head", b"generation 7");
        let auth = |r: Result<Vec<u8>, CryptoError>| matches!(r, Err(CryptoError::Authentication { .. }));
        assert!(auth(k.open(ObjectKind::Lease, b"workspace/head", &sealed)));
        assert!(auth(k.open(ObjectKind::Head, b"workspace/head2", &sealed)));
        assert!(auth(k.open(ObjectKind::Head, b"", &sealed)));
        assert!(auth(keys(7).open(ObjectKind::Head, b"workspace/head", &sealed)));

        // Relabelling the clear kind byte does not help: the kind is also in the AAD.
        let mut relabelled = sealed.clone();
        relabelled[5] = ObjectKind::Lease as u8;
        assert!(auth(k.open(ObjectKind::Lease, b"workspace/head", &relabelled)));

        // Not an envelope at all.
        assert!(auth(k.open(ObjectKind::Head, b"workspace/head", &[0u8; 64])));
    }

    #[test]
    fn newer_version_is_unsupported_not_corrupt() {
        let k = keys(8);
        let mut sealed = k.seal(ObjectKind::Metadata, b"m", b"meta");
        sealed[4] = 2;
        let err = k.open(ObjectKind::Metadata, b"m", &sealed).unwrap_err();
        assert!(matches!(err, CryptoError::UnsupportedVersion { found: 2, supported: 1 }));
        assert!(err.to_string().contains("upgrade tierfs"), "{err}");
        // Even when the rest of a newer envelope is shorter than ours.
        let err = k.open(ObjectKind::Metadata, b"m", b"TFE1\x07").unwrap_err();
        assert!(matches!(err, CryptoError::UnsupportedVersion { found: 7, .. }));
        // Version 0 was never written: corrupt.
        sealed[4] = 0;
        assert!(matches!(k.open(ObjectKind::Metadata, b"m", &sealed), Err(CryptoError::Authentication { .. })));
    }

    /// Pins the on-store format: an envelope built by hand from the documented layout, subkey
    /// context and AAD opens.
    #[test]
    fn format_matches_the_documentation() {
        let data_key = DataKey::from_bytes([9; KEY_LEN]);
        let aes_key = blake3::derive_key("tierfs 2026-11 object encryption", data_key.as_bytes());
        let cipher = Aes256Gcm::new((&aes_key).into());
        let nonce = [0x42u8; 12];
        let mut aad = b"tierfs-object-v1".to_vec();
        aad.push(3);
        aad.extend_from_slice(b"idx/1");
        let mut body = b"index segment".to_vec();
        let tag = cipher.encrypt_inout_detached(&nonce.into(), &aad, body.as_mut_slice().into()).unwrap();
        let mut sealed = b"TFE1\x01\x03".to_vec();
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&body);
        sealed.extend_from_slice(&tag);

        let k = Keys::new(&data_key);
        assert_eq!(k.open(ObjectKind::IndexSegment, b"idx/1", &sealed).unwrap(), b"index segment");
        // And what this build seals, the independent implementation opens.
        let resealed = k.seal(ObjectKind::IndexSegment, b"idx/1", b"index segment");
        let (n, rest) = resealed[6..].split_at(12);
        let (ct, t) = rest.split_at(rest.len() - 16);
        let mut plain = ct.to_vec();
        let nonce: [u8; 12] = n.try_into().unwrap();
        let tag: [u8; 16] = t.try_into().unwrap();
        cipher.decrypt_inout_detached(&nonce.into(), &aad, plain.as_mut_slice().into(), &tag.into()).unwrap();
        assert_eq!(plain, b"index segment");

        let id_key = blake3::derive_key("tierfs 2026-11 block id", data_key.as_bytes());
        assert_eq!(k.block_id(b"x"), *blake3::keyed_hash(&id_key, b"x").as_bytes());
    }

    #[test]
    fn block_id_is_keyed_and_stable() {
        let (a, b) = (keys(10), keys(11));
        let data = b"block contents";
        assert_eq!(a.block_id(data), a.block_id(data));
        assert_eq!(a.block_id(data), a.clone().block_id(data));
        assert_ne!(a.block_id(data), b.block_id(data));
        assert_ne!(a.block_id(data), *blake3::hash(data).as_bytes());
        assert_ne!(a.block_id(data), a.block_id(b"block contentS"));
    }

    #[test]
    fn name_hash_is_keyed_and_domain_separated() {
        let (a, b) = (keys(12), keys(13));
        assert_eq!(a.name_hash("workspace", b"proj"), a.name_hash("workspace", b"proj"));
        assert_ne!(a.name_hash("workspace", b"proj"), b.name_hash("workspace", b"proj"));
        assert_ne!(a.name_hash("workspace", b"proj"), a.name_hash("snapshot", b"proj"));
        assert_ne!(a.name_hash("ab", b"c"), a.name_hash("a", b"bc"));
        assert_ne!(a.name_hash("", b"proj"), a.block_id(b"proj"));
    }

    fn any_kind() -> impl Strategy<Value = ObjectKind> {
        proptest::sample::select(ObjectKind::ALL.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn prop_round_trip(
            key in any::<[u8; KEY_LEN]>(),
            kind in any_kind(),
            name in proptest::collection::vec(any::<u8>(), 0..64),
            plaintext in proptest::collection::vec(any::<u8>(), 0..4096),
        ) {
            let k = Keys::new(&DataKey::from_bytes(key));
            let sealed = k.seal(kind, &name, &plaintext);
            prop_assert_eq!(sealed.len(), sealed_len(plaintext.len()));
            prop_assert_eq!(k.open(kind, &name, &sealed).unwrap(), plaintext);
        }

        #[test]
        fn prop_tampering_is_detected(
            kind in any_kind(),
            name in proptest::collection::vec(any::<u8>(), 0..16),
            plaintext in proptest::collection::vec(any::<u8>(), 0..256),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
        ) {
            let k = keys(14);
            let mut sealed = k.seal(kind, &name, &plaintext);
            let at = flip.index(sealed.len());
            sealed[at] ^= 1 << bit;
            prop_assert!(k.open(kind, &name, &sealed).is_err());
        }
    }
}
