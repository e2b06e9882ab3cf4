//! Errors of the crypto layer.
//!
//! Every failure to decrypt is an error, never garbage: a wrong secret is [`CryptoError::WrongKey`],
//! an object that fails its AEAD tag (flipped bit, truncated, swapped for another object, sealed
//! under another key) is [`CryptoError::Authentication`]. The two are kept apart because they
//! call for different actions: the first is the user's typo, the second is damaged or tampered
//! storage that read repair or `tierfs scrub` should handle.

use super::ObjectKind;

#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    #[error("wrong passphrase or key file: it does not unlock any key of this store")]
    WrongKey,
    #[error("object failed authentication (kind {kind}): corrupt, truncated or swapped")]
    Authentication { kind: ObjectKind },
    #[error("encrypted object is truncated: {len} bytes is shorter than the envelope itself")]
    Truncated { len: usize },
    #[error(
        "encrypted object has envelope version {found} but this tierfs reads only up to \
         version {supported}: upgrade tierfs to read this store"
    )]
    UnsupportedVersion { found: u8, supported: u8 },
    #[error("bad key file: {0}")]
    BadKeyFile(String),
    #[error("key derivation failed: {0}")]
    Kdf(String),
    #[error("a passphrase cannot be empty")]
    EmptyPassphrase,
    /// A wrapped-key record read from the store that cannot be tried: a field that does not
    /// decode, or Argon2id parameters past the limits or the unlock budget.
    #[error("wrapped key {id} in the store is unusable: {reason}")]
    BadRecord { id: String, reason: String },
}

impl CryptoError {
    /// What a caller can do about this error.
    pub fn kind(&self) -> crate::types::ErrorKind {
        use crate::types::ErrorKind;
        match self {
            CryptoError::WrongKey | CryptoError::BadKeyFile(_) => ErrorKind::InvalidInput,
            CryptoError::Authentication { .. } | CryptoError::Truncated { .. } | CryptoError::BadRecord { .. } => {
                ErrorKind::Corrupt
            }
            // Parameters the user asked for when wrapping a key.
            CryptoError::UnsupportedVersion { .. } | CryptoError::Kdf(_) | CryptoError::EmptyPassphrase => {
                ErrorKind::InvalidInput
            }
        }
    }
}
