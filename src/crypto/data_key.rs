//! The store's data key and the randomness it and every nonce come from.
//!
//! The data key is the root of all object keys; it lives only in memory (and wrapped, in
//! `keys/`). It is zeroized on drop and its `Debug` prints nothing, so it cannot leak through a
//! log line or a panic message.

use rand::{Rng, TryRng};
use zeroize::{Zeroize, ZeroizeOnDrop};

use super::KEY_LEN;

/// The store's random data key. Zeroized on drop; `Debug` prints nothing secret.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct DataKey([u8; KEY_LEN]);

impl DataKey {
    /// A new key from the operating system's random source.
    pub fn generate() -> DataKey {
        let mut bytes = [0u8; KEY_LEN];
        os_random(&mut bytes);
        let key = DataKey(bytes);
        bytes.zeroize();
        key
    }

    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> DataKey {
        DataKey(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// Fills `dest` straight from the OS (getrandom): for long-lived secrets, where a syscall per
/// call costs nothing. If the OS source fails (it does not on Linux once booted), falls back to
/// the thread CSPRNG, which was itself seeded from the OS and panics if it never could be.
pub(crate) fn os_random(dest: &mut [u8]) {
    if rand::rngs::SysRng.try_fill_bytes(dest).is_err() {
        rand::rng().fill_bytes(dest);
    }
}

/// Fills `dest` from the thread-local CSPRNG (ChaCha, reseeded from the OS): for nonces, salts and
/// ids, which are drawn once per sealed object, so a syscall each would show on small objects.
pub(crate) fn fast_random(dest: &mut [u8]) {
    rand::rng().fill_bytes(dest);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_is_random_and_debug_hides_the_key() {
        let (a, b) = (DataKey::generate(), DataKey::generate());
        assert_ne!(a.as_bytes(), b.as_bytes());
        assert_ne!(a.as_bytes(), &[0u8; KEY_LEN]);
        let shown = format!("{a:?}");
        assert_eq!(shown, "DataKey(..)");
        assert!(!shown.contains(&hex::encode(a.as_bytes())));
    }

    #[test]
    fn from_bytes_round_trips() {
        assert_eq!(DataKey::from_bytes([7; KEY_LEN]).as_bytes(), &[7; KEY_LEN]);
    }
}
