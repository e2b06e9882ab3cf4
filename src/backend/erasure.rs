//! The erasure layout of a pack: Reed-Solomon (GF(2^8)) over `k` data and `m` parity shards.
//!
//! A pack of `len` bytes is cut into `k` data shards of `S = max(1, ceil(len / k))` bytes (the
//! last one zero-padded), `m` parity shards of `S` bytes are computed from them, and shard `i`
//! is stored as its own object `"{key}.s{i}"` = the `S` shard bytes followed by the 32-byte
//! blake3 hash of those bytes. Why:
//! - data shards are plain slices of the pack, so a range read touches only the data shard(s)
//!   holding the range, with no decoding while everything is healthy;
//! - the trailer lets a whole-shard read be checked on its own, so reconstruction uses only
//!   shards known to be good, and scrub can name the bad shard;
//! - `S` depends only on `len` and `k`, which the caller's index already knows, so a read needs
//!   no metadata object.
//!
//! Everything here is pure and synchronous; the caller runs large inputs on a blocking thread.

use std::ops::Range;

use bytes::Bytes;
use reed_solomon_erasure::galois_8::ReedSolomon;

use super::error::BackendError;

/// Bytes of the blake3 trailer after each shard.
pub(crate) const TRAILER_LEN: usize = 32;

/// The object key of shard `index` of a pack.
pub(crate) fn shard_key(key: &str, index: usize) -> String {
    format!("{key}.s{index}")
}

/// `"{key}.s{i}"` → `(key, i)`, for folding shards in listings.
pub(crate) fn split_shard_key(key: &str) -> Option<(&str, usize)> {
    let (base, suffix) = key.rsplit_once(".s")?;
    if base.is_empty() || suffix.is_empty() || suffix.len() > 3 || !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Only the spelling `shard_key` makes: `x.s07` is some other object.
    if suffix.len() > 1 && suffix.starts_with('0') {
        return None;
    }
    let index: usize = suffix.parse().ok()?;
    (index < 256).then_some((base, index))
}

/// Appends the blake3 trailer to a shard (which was allocated with room for it).
pub(crate) fn seal(mut shard: Vec<u8>) -> Bytes {
    let hash = blake3::hash(&shard);
    shard.extend_from_slice(hash.as_bytes());
    Bytes::from(shard)
}

/// Checks a whole shard object read back: its length and trailer. Returns the shard bytes.
pub(crate) fn open_shard(object: &Bytes, shard_len: usize) -> Result<Bytes, String> {
    if object.len() != shard_len + TRAILER_LEN {
        return Err(format!(
            "shard object is {} bytes, expected {} ({shard_len} + {TRAILER_LEN}-byte hash); wrong pack length in the \
             index, or a truncated object",
            object.len(),
            shard_len + TRAILER_LEN
        ));
    }
    let (body, trailer) = object.split_at(shard_len);
    if blake3::hash(body).as_bytes() != trailer {
        return Err("shard bytes do not match their blake3 trailer".into());
    }
    Ok(object.slice(..shard_len))
}

/// Encoder/decoder for one `k + m` geometry.
pub(crate) struct Codec {
    data: usize,
    parity: usize,
    /// `None` when `m == 0` (plain striping; `reed-solomon-erasure` refuses zero parity).
    rs: Option<ReedSolomon>,
}

impl Codec {
    pub(crate) fn new(data: usize, parity: usize) -> Result<Codec, BackendError> {
        if data == 0 {
            return Err(BackendError::BadConfig("erasure coding needs at least one data shard".into()));
        }
        let rs = if parity == 0 {
            None
        } else {
            Some(ReedSolomon::new(data, parity).map_err(|e| {
                BackendError::BadConfig(format!("erasure coding with {data} data + {parity} parity shards: {e:?}"))
            })?)
        };
        Ok(Codec { data, parity, rs })
    }

    pub(crate) fn data_shards(&self) -> usize {
        self.data
    }

    pub(crate) fn total_shards(&self) -> usize {
        self.data + self.parity
    }

    /// `S`: the length of every shard of a pack of `pack_len` bytes.
    pub(crate) fn shard_len(&self, pack_len: u64) -> Result<usize, BackendError> {
        let s = pack_len.div_ceil(self.data as u64).max(1);
        usize::try_from(s).map_err(|_| BackendError::Internal(format!("pack length {pack_len} is too large")))
    }

    /// All `k + m` shard objects (shard bytes + trailer) of `data`.
    pub(crate) fn encode(&self, data: &[u8]) -> Result<Vec<Bytes>, BackendError> {
        let s = self.shard_len(data.len() as u64)?;
        let mut shards: Vec<Vec<u8>> = (0..self.total_shards())
            .map(|i| {
                let mut shard = Vec::with_capacity(s + TRAILER_LEN);
                if i < self.data {
                    let start = (i * s).min(data.len());
                    let end = ((i + 1) * s).min(data.len());
                    shard.extend_from_slice(&data[start..end]);
                }
                shard.resize(s, 0);
                shard
            })
            .collect();
        if let Some(rs) = &self.rs {
            rs.encode(&mut shards).map_err(|e| BackendError::Internal(format!("erasure encoding failed: {e:?}")))?;
        }
        Ok(shards.into_iter().map(seal).collect())
    }

    /// Fills the `None` entries of `shards` (length `k + m`, every `Some` of the same length)
    /// from at least `k` good ones; with `data_only` the parity shards are left alone.
    pub(crate) fn reconstruct(&self, shards: &mut [Option<Vec<u8>>], data_only: bool) -> Result<(), String> {
        let present = shards.iter().filter(|s| s.is_some()).count();
        if present < self.data {
            return Err(format!("only {present} good shards, {} needed", self.data));
        }
        let missing_data = shards[..self.data].iter().any(Option::is_none);
        let missing_parity = shards[self.data..].iter().any(Option::is_none);
        if !missing_data && (data_only || !missing_parity) {
            return Ok(());
        }
        let Some(rs) = &self.rs else {
            return Err("no parity shards to rebuild from".into());
        };
        let result = if data_only { rs.reconstruct_data(shards) } else { rs.reconstruct(shards) };
        result.map_err(|e| format!("reconstruction failed: {e:?}"))
    }

    /// The pack from its (complete) data shards.
    pub(crate) fn join(&self, shards: &[Option<Vec<u8>>], pack_len: u64) -> Result<Vec<u8>, String> {
        let len = usize::try_from(pack_len).map_err(|_| format!("pack length {pack_len} is too large"))?;
        // The length is read from the store: never reserve more than the shards hold.
        let held: usize = shards[..self.data].iter().flatten().map(Vec::len).sum();
        if len > held {
            return Err(format!("data shards hold {held} bytes, the pack has {len}"));
        }
        let mut out = Vec::with_capacity(len);
        for shard in &shards[..self.data] {
            let shard = shard.as_ref().ok_or("a data shard is missing")?;
            let take = shard.len().min(len - out.len());
            out.extend_from_slice(&shard[..take]);
        }
        if out.len() != len {
            return Err(format!("data shards hold {} bytes, the pack has {len}", out.len()));
        }
        Ok(out)
    }

    /// Where bytes `range` of a pack of `pack_len` bytes lie: `(data shard, range in that shard)`,
    /// in order. `range` must be non-empty and within the pack.
    pub(crate) fn locate(&self, pack_len: u64, range: Range<u64>) -> Result<Vec<(usize, Range<u64>)>, BackendError> {
        let s = self.shard_len(pack_len)? as u64;
        let first = range.start / s;
        let last = (range.end - 1) / s;
        Ok((first..=last)
            .map(|i| {
                let base = i * s;
                (i as usize, range.start.max(base) - base..range.end.min(base + s) - base)
            })
            .collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shard_keys_round_trip() {
        assert_eq!(shard_key("packs/ab/cd", 3), "packs/ab/cd.s3");
        assert_eq!(split_shard_key("packs/ab/cd.s3"), Some(("packs/ab/cd", 3)));
        assert_eq!(split_shard_key("packs/ab/cd.s255"), Some(("packs/ab/cd", 255)));
        for plain in ["packs/ab/cd", "a.s", ".s1", "x.s256", "x.s1a", "x.s0001", "x.snap"] {
            assert_eq!(split_shard_key(plain), None, "{plain}");
        }
    }

    #[test]
    fn trailer_detects_damage() {
        let codec = Codec::new(2, 1).unwrap();
        let shards = codec.encode(b"hello world").unwrap();
        let s = codec.shard_len(11).unwrap();
        assert_eq!(s, 6);
        assert_eq!(open_shard(&shards[0], s).unwrap(), Bytes::from_static(b"hello "));
        assert_eq!(open_shard(&shards[1], s).unwrap(), Bytes::from_static(b"world\0"));
        let mut bad = shards[1].to_vec();
        bad[2] ^= 1;
        assert!(open_shard(&Bytes::from(bad), s).unwrap_err().contains("trailer"));
        assert!(open_shard(&shards[0], s + 1).unwrap_err().contains("wrong pack length"));
    }

    #[test]
    fn empty_and_tiny_packs_have_one_byte_shards() {
        let codec = Codec::new(4, 2).unwrap();
        let shards = codec.encode(b"").unwrap();
        assert_eq!(shards.len(), 6);
        assert!(shards.iter().all(|s| s.len() == 1 + TRAILER_LEN));
        let mut opened: Vec<Option<Vec<u8>>> = shards.iter().map(|s| Some(s[..1].to_vec())).collect();
        opened[0] = None;
        codec.reconstruct(&mut opened, true).unwrap();
        assert_eq!(codec.join(&opened, 0).unwrap(), b"");
    }

    #[test]
    fn zero_parity_is_plain_striping() {
        let codec = Codec::new(3, 0).unwrap();
        let shards = codec.encode(b"abcdefg").unwrap();
        assert_eq!(shards.len(), 3);
        let mut opened: Vec<Option<Vec<u8>>> = shards.iter().map(|s| Some(s[..3].to_vec())).collect();
        assert_eq!(codec.join(&opened, 7).unwrap(), b"abcdefg");
        // A length from the store past what the shards hold is refused before anything is
        // reserved for it (u64::MAX would abort the process).
        for claimed in [10, u64::from(u32::MAX), u64::MAX >> 1] {
            let err = codec.join(&opened, claimed).unwrap_err();
            assert!(err.contains("data shards hold 9 bytes"), "{err}");
        }
        opened[1] = None;
        assert!(codec.reconstruct(&mut opened, true).is_err());
    }

    #[test]
    fn locate_splits_ranges_at_shard_boundaries() {
        let codec = Codec::new(4, 2).unwrap();
        // 10 bytes over 4 shards: S = 3.
        assert_eq!(codec.locate(10, 0..10).unwrap(), vec![(0, 0..3), (1, 0..3), (2, 0..3), (3, 0..1)]);
        assert_eq!(codec.locate(10, 2..4).unwrap(), vec![(0, 2..3), (1, 0..1)]);
        assert_eq!(codec.locate(10, 3..6).unwrap(), vec![(1, 0..3)]);
        assert_eq!(codec.locate(10, 9..10).unwrap(), vec![(3, 0..1)]);
    }

    /// What a store may do to one shard object.
    #[derive(Debug, Clone)]
    enum Damage {
        None,
        Gone,
        Truncate(usize),
        Extend(Vec<u8>),
        Flip(usize, u8),
        Replace(Vec<u8>),
        /// Another shard's object of the same pack put at this one's key (no key needed).
        MovedFrom(usize),
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            3 => Just(Damage::None),
            1 => Just(Damage::Gone),
            1 => any::<usize>().prop_map(Damage::Truncate),
            1 => proptest::collection::vec(any::<u8>(), 1..64).prop_map(Damage::Extend),
            1 => (any::<usize>(), 0..8u8).prop_map(|(at, bit)| Damage::Flip(at, bit)),
            1 => proptest::collection::vec(any::<u8>(), 0..300).prop_map(Damage::Replace),
            1 => any::<usize>().prop_map(Damage::MovedFrom),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Shard objects as a hostile store serves them, read the way a whole-pack read does
        /// (each object checked by [`open_shard`], the bad ones rebuilt from the others, the
        /// data shards joined at the index's length): never a panic; either an error or the
        /// pack's own bytes. The one exception is a shard object moved to another shard's key
        /// of the same pack: its trailer holds, so the join may be wrong, and the envelope of
        /// every block read from it is what refuses it (docs/SEMANTICS.md).
        #[test]
        fn hostile_shard_objects_yield_the_pack_or_an_error(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            k in 1usize..6,
            m in 0usize..4,
            damages in proptest::collection::vec(damage(), 9),
            claimed in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        ) {
            let codec = Codec::new(k, m).unwrap();
            let objects = codec.encode(&data).unwrap();
            let pack_len = claimed.unwrap_or(data.len() as u64);
            let Ok(s) = codec.shard_len(pack_len) else { return Ok(()) };
            let mut moved = false;
            let served: Vec<Option<Bytes>> = objects
                .iter()
                .zip(&damages)
                .map(|(object, d)| {
                    let mut bytes = object.to_vec();
                    match d {
                        Damage::None => {}
                        Damage::Gone => return None,
                        Damage::Truncate(at) => bytes.truncate(at % (bytes.len() + 1)),
                        Damage::Extend(more) => bytes.extend_from_slice(more),
                        Damage::Flip(at, bit) => {
                            let n = bytes.len();
                            bytes[at % n] ^= 1 << bit;
                        }
                        Damage::Replace(other) => bytes = other.clone(),
                        Damage::MovedFrom(from) => {
                            let from = &objects[from % objects.len()];
                            moved |= from != object;
                            bytes = from.to_vec();
                        }
                    }
                    Some(Bytes::from(bytes))
                })
                .collect();
            let mut shards: Vec<Option<Vec<u8>>> =
                served.iter().map(|o| o.as_ref().and_then(|o| open_shard(o, s).ok()).map(|b| b.to_vec())).collect();
            let joined = codec.reconstruct(&mut shards, true).and_then(|()| codec.join(&shards, pack_len));
            if let Ok(bytes) = joined {
                if claimed.is_none() && !moved {
                    prop_assert_eq!(bytes, data);
                } else if !moved {
                    // A length the index did not give: a prefix of the pack's bytes, never others.
                    prop_assert!(bytes.len() as u64 == pack_len && (bytes.len() > data.len() || bytes[..] == data[..bytes.len()]));
                }
            }
        }
    }

    proptest! {
        /// Listed keys are the store's word: any string folds to a shard of index < 256 of a
        /// non-empty key, or to nothing, and a shard key folds back to what made it.
        #[test]
        fn listed_keys_fold_to_shards_only_when_they_are_shard_keys(
            key in prop_oneof![".{0,40}", "[a-z./]{0,6}\\.s[0-9]{0,4}"],
            index in 0usize..300,
        ) {
            if let Some((base, i)) = split_shard_key(&key) {
                prop_assert!(!base.is_empty() && i < 256);
                prop_assert_eq!(shard_key(base, i), key.clone());
            }
            if !key.is_empty() && index < 256 {
                let made = shard_key(&key, index);
                prop_assert_eq!(split_shard_key(&made), Some((key.as_str(), index)));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_m_shards_can_be_lost(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            k in 1usize..6,
            m in 0usize..4,
            lost in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let codec = Codec::new(k, m).unwrap();
            let objects = codec.encode(&data).unwrap();
            let s = codec.shard_len(data.len() as u64).unwrap();
            let mut shards: Vec<Option<Vec<u8>>> =
                objects.iter().map(|o| Some(open_shard(o, s).unwrap().to_vec())).collect();
            let mut dropped = 0;
            for idx in lost {
                if dropped < m {
                    let i = idx.index(k + m);
                    if shards[i].take().is_some() {
                        dropped += 1;
                    }
                }
            }
            codec.reconstruct(&mut shards, false).unwrap();
            for (i, object) in objects.iter().enumerate() {
                prop_assert_eq!(shards[i].as_deref(), Some(&object[..s]));
            }
            prop_assert_eq!(codec.join(&shards, data.len() as u64).unwrap(), data.clone());
            if !data.is_empty() {
                let mid = data.len() as u64 / 3;
                let end = data.len() as u64;
                let mut got = Vec::new();
                for (i, r) in codec.locate(end, mid..end).unwrap() {
                    got.extend_from_slice(&shards[i].as_ref().unwrap()[r.start as usize..r.end as usize]);
                }
                prop_assert_eq!(&got[..], &data[mid as usize..]);
            }
        }
    }
}
