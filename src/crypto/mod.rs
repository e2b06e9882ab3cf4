//! Cryptography of everything that leaves the node: AEAD seal/open of objects, keyed hashes for
//! block ids and object names, and wrapping of the store's data key by passphrases or key files.
//!
//! Key hierarchy (docs/FORMAT.md, "Keys"):
//! - one random [`DataKey`] per store; it never changes, so rotating a passphrase rewraps only it
//!   ([`wrap`]), never the data;
//! - [`Keys`] derives independent subkeys from it with `blake3::derive_key` and fixed context
//!   strings: one keys the block-id hash, one the object-name hash, one AES-256-GCM. Separate
//!   subkeys mean a hash output can never be confused with, or leak anything about, a cipher key.
//!
//! Objects are sealed into a self-describing envelope (see [`Keys::seal`]) whose associated data
//! binds the object's [`ObjectKind`] and name, so a backend that swaps, renames or replays objects
//! is detected on open. Everything here is a pure function over bytes: no I/O, no clock except
//! the creation time recorded in a [`WrappedKey`], randomness only from the OS-seeded CSPRNG.

pub mod cache;
mod data_key;
pub mod error;
mod keys;
mod object_kind;
pub mod wrap;

pub use cache::{CIPHER_BLOCK, CacheCipher};
pub use data_key::DataKey;
pub use error::CryptoError;
pub use keys::{ENVELOPE_OVERHEAD, ENVELOPE_VERSION, Keys, MAX_PLAINTEXT_LEN, STAGE_GAP, sealed_len};
pub use object_kind::ObjectKind;
pub use wrap::{KdfParams, Secret, WrappedKey, generate_key_file, parse_key_file, unwrap_any, unwrap_key, wrap_key};

/// Length in bytes of every symmetric key here (data key, subkeys, wrapping keys): AES-256 and
/// keyed blake3 both take 32 bytes.
pub const KEY_LEN: usize = 32;

/// A blake3 output: block ids and object-name hashes.
pub type Hash = [u8; 32];
