//! Metadata at rest under `--encrypt-cache`: what RocksDB holds of a name, an xattr value or
//! a symlink target is sealed with the cache's key ([`CacheCipher::seal_metadata`]), so no
//! file of the data dir (tables, write-ahead log, manifest) holds one in the clear.
//!
//! What is sealed: the name part of a directory entry's key and of an xattr's key (the tag and
//! inode number before it stay, so a directory's entries stay together and a prefix scan
//! lists them), the value of an xattr and the target of a symlink. Everything else is
//! numbers: inode records (sizes, modes, owners, times), the entries' inode numbers, chunk
//! and block records (keyed block ids, pack positions), and this node's bookkeeping.
//!
//! Invariants:
//! - [`MetaStore`](super::MetaStore) is the only user, and it seals at the one place each
//!   write reaches RocksDB and opens at the one place each read leaves it: above it every key
//!   and value is plaintext (the caches, the journal, checkpoints, imports).
//! - Sealing is deterministic, so equal plaintext keys make equal keys on disk, and a seek to
//!   a sealed key finds it. Order is not kept: a directory's entries come out in the order of
//!   their sealed names, which is stable.
//! - A name is sealed with its key's tag and inode number as context and a value with its
//!   whole plaintext key: a sealed piece moved to another key does not open.

use std::borrow::Cow;

use crate::crypto::CacheCipher;

use super::MetaError;

/// How many bytes of a key come before the name: its tag and inode number.
const PREFIX: usize = 9;

/// The sealing of one metadata store: none, or the cache's cipher.
#[derive(Clone, Default)]
pub struct Sealing(Option<CacheCipher>);

impl Sealing {
    pub fn new(cipher: Option<CacheCipher>) -> Sealing {
        Sealing(cipher)
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Whether the name part of `key` is sealed (an entry's or an xattr's).
    fn seals_name(key: &[u8]) -> bool {
        key.len() > PREFIX && matches!(key[0], b'D' | b'X')
    }

    /// Whether the value under `key` is sealed (an xattr's value, a symlink's target).
    fn seals_value(key: &[u8]) -> bool {
        match key.first() {
            Some(b'X') => key.len() > PREFIX,
            Some(b'L') => true,
            _ => false,
        }
    }

    /// The key RocksDB holds for the plaintext `key`.
    pub fn key<'a>(&self, key: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.0 {
            Some(c) if Sealing::seals_name(key) => {
                let (prefix, name) = key.split_at(PREFIX);
                let mut sealed = prefix.to_vec();
                sealed.extend_from_slice(&c.seal_metadata(prefix, name));
                Cow::Owned(sealed)
            }
            _ => Cow::Borrowed(key),
        }
    }

    /// The plaintext key of the key `disk` RocksDB holds.
    pub fn open_key<'a>(&self, disk: &'a [u8]) -> Result<Cow<'a, [u8]>, MetaError> {
        match &self.0 {
            Some(c) if Sealing::seals_name(disk) => {
                let (prefix, sealed) = disk.split_at(PREFIX);
                let name = c.open_metadata(prefix, sealed).ok_or_else(|| {
                    MetaError::Corrupt(format!("a sealed name under {prefix:02x?} does not open with this cache's key"))
                })?;
                Ok(Cow::Owned([prefix, &name].concat()))
            }
            _ => Ok(Cow::Borrowed(disk)),
        }
    }

    /// The value RocksDB holds for `value` under the plaintext `key`.
    pub fn value<'a>(&self, key: &[u8], value: &'a [u8]) -> Cow<'a, [u8]> {
        match &self.0 {
            Some(c) if Sealing::seals_value(key) => Cow::Owned(c.seal_metadata(key, value)),
            _ => Cow::Borrowed(value),
        }
    }

    /// The plaintext of the value `disk` RocksDB holds under the plaintext `key`.
    pub fn open_value<'a>(&self, key: &[u8], disk: &'a [u8]) -> Result<Cow<'a, [u8]>, MetaError> {
        match &self.0 {
            Some(c) if Sealing::seals_value(key) => c.open_metadata(key, disk).map(Cow::Owned).ok_or_else(|| {
                MetaError::Corrupt(format!("the sealed value of {key:02x?} does not open with this cache's key"))
            }),
            _ => Ok(Cow::Borrowed(disk)),
        }
    }

    /// A bound of a range over plaintext keys as a bound over keys on disk: only a bound
    /// without a name part has one (a range inside a directory's entries has none, as sealed
    /// names do not keep their order).
    pub fn bound<'a>(&self, bound: &'a [u8]) -> Result<Cow<'a, [u8]>, MetaError> {
        if self.is_on() && Sealing::seals_name(bound) {
            return Err(MetaError::Corrupt(format!("a range bound inside a sealed table: {bound:02x?}")));
        }
        Ok(Cow::Borrowed(bound))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::meta::codec;

    fn cipher(byte: u8) -> CacheCipher {
        CacheCipher::new(&[byte; 32])
    }

    #[test]
    fn names_and_values_round_trip_and_nothing_else_changes() {
        let s = Sealing::new(Some(cipher(7)));
        let key = codec::dentry_key(42, b"secret-name.py");
        let disk = s.key(&key);
        assert_ne!(&*disk, key.as_slice());
        assert_eq!(&disk[..PREFIX], &key[..PREFIX], "the tag and inode stay: a prefix scan lists the directory");
        assert!(!disk.windows(6).any(|w| w == b"secret"), "the name is in the clear");
        assert_eq!(s.key(&key), disk, "sealing is deterministic: a lookup finds the entry");
        assert_eq!(&*s.open_key(&disk).unwrap(), key.as_slice());
        // The same name in another directory seals differently.
        assert_ne!(s.key(&codec::dentry_key(43, b"secret-name.py"))[PREFIX..], disk[PREFIX..]);
        // Values: xattrs and symlink targets.
        for key in [codec::xattr_key(5, b"user.k"), codec::symlink_key(5)] {
            let sealed = s.value(&key, b"target-marker");
            assert!(!sealed.windows(6).any(|w| w == b"target"));
            assert_eq!(&*s.open_value(&key, &sealed).unwrap(), b"target-marker");
            // Moved to another key, it does not open.
            assert!(s.open_value(&codec::symlink_key(6), &sealed).is_err());
        }
        // Inode records, prefixes and bookkeeping are left as they are.
        for key in [codec::inode_key(5), codec::dentry_prefix(42), codec::JOURNAL_SEQ_KEY.to_vec()] {
            assert_eq!(s.key(&key), key.as_slice());
            assert_eq!(s.value(&key, b"v"), b"v".as_slice());
        }
        // Another key opens nothing.
        let other = Sealing::new(Some(cipher(8)));
        assert!(other.open_key(&disk).is_err());
        // Off: everything is as it was.
        let off = Sealing::default();
        assert_eq!(off.key(&key), key.as_slice());
        assert!(off.bound(&key).is_ok() && s.bound(&key).is_err() && s.bound(&codec::dentry_prefix(1)).is_ok());
    }
}
