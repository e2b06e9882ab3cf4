//! Encryption of the hot tier at rest (`--encrypt-cache`): a length-preserving tweakable
//! block cipher over the data files, so a data file keeps its layout (the file's own offsets,
//! holes as holes) and any 16-byte-aligned range can be read or rewritten alone.
//!
//! Each 16-byte block `i` of the data file of inode `ino` is enciphered with XEX
//! (Rogaway 2004) over AES-256: `C = E_d(P ^ T) ^ T` with the tweak `T = E_t(ino || i)`, both
//! little-endian `u64`. `d` and `t` are independent keys derived from the cache key (itself
//! derived from the store's data key, see [`super::Keys::cache_cipher`]). There is no
//! authentication tag: the hot tier is the node's own disk, and what it guards against is a
//! reader of that disk (another user of a shared node, a disk reused after the job), not a
//! writer. What a reader of the disk still learns: which 16-byte blocks are holes or zero
//! (as for any sparse file), and which blocks of a file changed between two copies of the disk.
//!
//! Invariant: a ciphertext block of 16 zero bytes reads as 16 zero bytes. A hole (never
//! written, punched, or past an old end) is zeros on disk and must read as zeros, and a real
//! ciphertext block is all zeros with probability 2^-128. Everything here is a pure function
//! over bytes.
//!
//! Metadata (names, xattr values, symlink targets) is sealed with a deterministic AEAD
//! instead, AES-256-GCM-SIV under a third derived key ([`CacheCipher::seal_metadata`]): a
//! name is part of a RocksDB key, so equal names must seal equally, and a key has room for
//! a tag.

use aes::Aes256;
use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes_gcm_siv::{AeadInOut, Aes256GcmSiv};

use super::KEY_LEN;

/// The unit of encryption: reads and writes of a data file are widened to multiples of it.
pub const CIPHER_BLOCK: u64 = 16;

/// Blocks whose tweaks are computed in one batch (so AES-NI pipelines them): 4 KiB.
const STRIPE: usize = 256;

const DATA_CONTEXT: &str = "tierfs 2026-12 cache data";
const TWEAK_CONTEXT: &str = "tierfs 2026-12 cache tweak";
const CHECK_CONTEXT: &str = "tierfs 2026-12 cache key check";
const METADATA_CONTEXT: &str = "tierfs 2026-12 cache metadata";

/// What [`CacheCipher::seal_metadata`] adds to a piece of metadata.
pub const METADATA_TAG_LEN: usize = 16;

/// The hot tier's cipher; cheap to share across threads.
#[derive(Clone)]
pub struct CacheCipher {
    data: Aes256,
    tweak: Aes256,
    check: [u8; 16],
    /// Deterministic AEAD of metadata at rest (names and values in RocksDB): see
    /// [`CacheCipher::seal_metadata`].
    metadata: Aes256GcmSiv,
}

impl std::fmt::Debug for CacheCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheCipher(XEX-AES-256)")
    }
}

impl CacheCipher {
    /// The cipher of `cache_key`.
    pub fn new(cache_key: &[u8; KEY_LEN]) -> CacheCipher {
        let key = |context| Aes256::new(&Array(blake3::derive_key(context, cache_key)));
        let check = blake3::derive_key(CHECK_CONTEXT, cache_key);
        let metadata = zeroize::Zeroizing::new(blake3::derive_key(METADATA_CONTEXT, cache_key));
        CacheCipher {
            data: key(DATA_CONTEXT),
            tweak: key(TWEAK_CONTEXT),
            check: check[..16].try_into().expect("16 of 32"),
            metadata: Aes256GcmSiv::new((&*metadata).into()),
        }
    }

    /// Encrypts a piece of metadata (a file name inside a RocksDB key, an xattr value, a symlink
    /// target) bound to `context` (where it is stored): the ciphertext followed by a 16-byte tag.
    /// Deterministic on purpose (AES-256-GCM-SIV, RFC 8452, under a fixed nonce): the same name
    /// in the same directory always makes the same key, so a lookup finds it. What that gives
    /// away is only whether two sealed pieces with the same context are equal, and the length.
    pub fn seal_metadata(&self, context: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(plaintext.len() + METADATA_TAG_LEN);
        out.extend_from_slice(plaintext);
        let tag = self
            .metadata
            .encrypt_inout_detached(&[0u8; 12].into(), context, out.as_mut_slice().into())
            .expect("AES-GCM-SIV refuses only inputs of 64 GiB, and metadata is far smaller");
        out.extend_from_slice(&tag);
        out
    }

    /// The plaintext [`CacheCipher::seal_metadata`] sealed with `context`, or `None` when
    /// `sealed` was not sealed by this key with this context (damaged, or another store's).
    pub fn open_metadata(&self, context: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let body_len = sealed.len().checked_sub(METADATA_TAG_LEN)?;
        let (body, tag) = sealed.split_at(body_len);
        let tag: [u8; METADATA_TAG_LEN] = tag.try_into().ok()?;
        let mut out = body.to_vec();
        self.metadata
            .decrypt_inout_detached(&[0u8; 12].into(), context, out.as_mut_slice().into(), &tag.into())
            .ok()?;
        Some(out)
    }

    /// A value that identifies the key without revealing it: a data dir records it, so a
    /// cache enciphered under another store's key is refused instead of read as garbage.
    pub fn key_check(&self) -> String {
        self.check.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Enciphers `buf`, the bytes at `offset` of the data file of `ino`, in place. `offset`
    /// and `buf.len()` are multiples of [`CIPHER_BLOCK`].
    pub fn encrypt(&self, ino: u64, offset: u64, buf: &mut [u8]) {
        self.apply(ino, offset, buf, |c, blocks| c.data.encrypt_blocks(blocks), |_| false);
    }

    /// Deciphers `buf`, read at `offset` of the data file of `ino`, in place; all-zero blocks
    /// (holes) stay zero. Same alignment as [`CacheCipher::encrypt`].
    pub fn decrypt(&self, ino: u64, offset: u64, buf: &mut [u8]) {
        self.apply(ino, offset, buf, |c, blocks| c.data.decrypt_blocks(blocks), |b| b.iter().all(|&x| x == 0));
    }

    /// XEX over `buf` a stripe at a time: tweak, `cipher`, tweak; blocks for which `keep`
    /// holds before the pass are left as they were.
    fn apply(
        &self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
        cipher: impl Fn(&CacheCipher, &mut [aes::Block]),
        keep: impl Fn(&[u8]) -> bool,
    ) {
        assert!(
            offset % CIPHER_BLOCK == 0 && buf.len() as u64 % CIPHER_BLOCK == 0,
            "unaligned cache cipher range: {} bytes at {offset}",
            buf.len()
        );
        let (blocks, _) = Array::slice_as_chunks_mut(buf);
        let mut first = offset / CIPHER_BLOCK;
        let mut tweaks = [aes::Block::default(); STRIPE];
        let mut kept = [false; STRIPE];
        for stripe in blocks.chunks_mut(STRIPE) {
            let n = stripe.len();
            for (i, t) in tweaks[..n].iter_mut().enumerate() {
                t[..8].copy_from_slice(&ino.to_le_bytes());
                t[8..].copy_from_slice(&(first + i as u64).to_le_bytes());
            }
            self.tweak.encrypt_blocks(&mut tweaks[..n]);
            for ((b, t), k) in stripe.iter_mut().zip(&tweaks).zip(&mut kept) {
                *k = keep(b);
                xor(b, t);
            }
            cipher(self, stripe);
            for ((b, t), k) in stripe.iter_mut().zip(&tweaks).zip(&kept) {
                if *k {
                    b.fill(0);
                } else {
                    xor(b, t);
                }
            }
            first += n as u64;
        }
    }
}

fn xor(b: &mut aes::Block, t: &aes::Block) {
    let v = u128::from_ne_bytes(b.0) ^ u128::from_ne_bytes(t.0);
    b.0 = v.to_ne_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher() -> CacheCipher {
        CacheCipher::new(&[7; KEY_LEN])
    }

    #[test]
    fn round_trips_and_depends_on_the_inode_and_the_offset() {
        let c = cipher();
        let plain: Vec<u8> = (0..(STRIPE as u32 * 16 * 2 + 48)).map(|i| (i * 7 + 3) as u8).collect();
        let mut buf = plain.clone();
        c.encrypt(5, 4096, &mut buf);
        assert_ne!(buf, plain);
        // Equal plaintext blocks encipher differently at different places.
        let mut same = vec![0xAB; 64];
        c.encrypt(5, 0, &mut same);
        assert_ne!(same[..16], same[16..32]);
        let mut other_ino = plain.clone();
        c.encrypt(6, 4096, &mut other_ino);
        assert_ne!(other_ino, buf);
        // A block deciphers alone, at its own offset.
        let mut one = buf[32..48].to_vec();
        c.decrypt(5, 4096 + 32, &mut one);
        assert_eq!(one, plain[32..48]);
        c.decrypt(5, 4096, &mut buf);
        assert_eq!(buf, plain);
        let mut wrong = other_ino.clone();
        CacheCipher::new(&[8; KEY_LEN]).decrypt(6, 4096, &mut wrong);
        assert_ne!(wrong, plain, "another key deciphers to something else");
    }

    #[test]
    fn zero_ciphertext_is_a_hole_and_reads_as_zeros() {
        let c = cipher();
        let mut zeros = vec![0u8; 4096 + 32];
        c.decrypt(1, 0, &mut zeros);
        assert!(zeros.iter().all(|&b| b == 0));
        // A hole among data: only the hole's blocks are zero.
        let mut buf = vec![1u8; 48];
        c.encrypt(1, 0, &mut buf);
        buf[16..32].fill(0);
        c.decrypt(1, 0, &mut buf);
        assert_eq!(buf[..16], [1; 16]);
        assert_eq!(buf[16..32], [0; 16]);
        assert_eq!(buf[32..], [1; 16]);
        // Zeros written are enciphered like any data.
        let mut written = vec![0u8; 32];
        c.encrypt(1, 0, &mut written);
        assert!(written.iter().any(|&b| b != 0));
    }

    #[test]
    #[should_panic(expected = "unaligned")]
    fn unaligned_ranges_are_a_bug() {
        cipher().encrypt(1, 3, &mut [0; 16]);
    }
}
