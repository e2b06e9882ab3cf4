//! Read caches in front of RocksDB: decoded inode records, and directory entries (names that
//! exist and names that do not).
//!
//! Every POSIX operation reads one to seven inode records (parents, the entry, the target,
//! each again after taking its lock) and one to three directory entries (a create's and a
//! rename's lookup of a new name, then the operation's own check of it), and a RocksDB point
//! lookup costs microseconds of skip-list search and table probes; the kernel's GETATTR after
//! each change to a directory reads one more record. These caches answer those reads from
//! memory. A name that does not exist is cached as such, since most names an operation looks
//! up are new ones.
//!
//! Invariant: a lookup never returns a value older than the last committed batch that wrote
//! it. Every write (a commit or an import) drops the entries it touches and moves the
//! generation of their shards twice: once before and once after the RocksDB write; a commit
//! then stores the values it wrote (moving the generation again), under a lock that orders
//! such writes the same way in RocksDB and here. A reader that missed inserts what it read
//! from RocksDB only if its shard's generation did not move meanwhile, so a value read before
//! a write can never be put back after it. Each shard holds at most [`SHARD_CAP`] entries and
//! is emptied when full: about 20 MiB of inode records, and 13 MiB of entries with names of
//! 30 bytes.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use parking_lot::Mutex;

use super::codec::InodeRecord;
use crate::types::{FileKind, Ino};

const SHARDS: usize = 32;
/// Entries per shard: 32 × 4096 = 131 072 per cache.
pub const SHARD_CAP: usize = 4096;

/// Inode records by inode number.
pub type InodeCache = Cache<Ino, InodeRecord>;
/// What a directory entry's key holds: the inode and its kind, or `None` for a name that does
/// not exist.
pub type Entry = Option<(Ino, FileKind)>;
/// Directory entries by their RocksDB key (parent and name).
pub type DentryCache = Cache<Vec<u8>, Entry>;

/// The Fx hash (rustc's): a rotate, xor and multiply per word. The keys are inode numbers and
/// short names from the kernel, not chosen to collide, and a lookup costs a few cycles instead
/// of SipHash's tens.
#[derive(Default, Clone, Copy)]
pub struct FxBuild;

pub struct Fx(u64);

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(last));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl BuildHasher for FxBuild {
    type Hasher = Fx;
    fn build_hasher(&self) -> Fx {
        Fx(0)
    }
}

struct Shard<K, V> {
    generation: u64,
    entries: HashMap<K, V, FxBuild>,
}

impl<K, V> Default for Shard<K, V> {
    fn default() -> Self {
        Shard { generation: 0, entries: HashMap::default() }
    }
}

/// The keys one write changes.
#[derive(Debug, PartialEq, Eq)]
pub enum Touched<K> {
    /// These keys (possibly none).
    Keys(Vec<K>),
    /// Too many to name (a range delete over the table): drop everything.
    All,
}

impl<K> Touched<K> {
    /// Whether the write changes nothing cached here.
    pub fn is_empty(&self) -> bool {
        matches!(self, Touched::Keys(keys) if keys.is_empty())
    }
}

/// What [`Cache::lookup`] found.
pub enum Lookup<V> {
    Hit(V),
    /// Not cached: read RocksDB, then [`Cache::fill`] with this generation.
    Miss(u64),
}

/// A sharded map of values read from or written to RocksDB (see the module doc).
pub struct Cache<K, V> {
    shards: Vec<Mutex<Shard<K, V>>>,
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect() }
    }
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    fn shard(&self, key: &K) -> &Mutex<Shard<K, V>> {
        // Bits 32 and up: the map inside the shard indexes by the low bits and tags by the
        // top seven, so the shard's choice stays out of both.
        &self.shards[(FxBuild.hash_one(key) >> 32) as usize % SHARDS]
    }

    pub fn lookup(&self, key: &K) -> Lookup<V> {
        let shard = self.shard(key).lock();
        match shard.entries.get(key) {
            Some(v) => Lookup::Hit(v.clone()),
            None => Lookup::Miss(shard.generation),
        }
    }

    /// Caches `value`, read from RocksDB after a [`Lookup::Miss`] with `generation`, unless a
    /// write touched the shard since.
    pub fn fill(&self, key: K, generation: u64, value: V) {
        let mut shard = self.shard(&key).lock();
        if shard.generation != generation {
            return;
        }
        if shard.entries.len() >= SHARD_CAP {
            shard.entries.clear();
        }
        shard.entries.insert(key, value);
    }

    /// Caches values a commit just wrote (after its RocksDB write, in the order of the
    /// writes: see `MetaStore::commit`). Moves each shard's generation, so a reader that
    /// read the value before the write cannot put it back.
    pub fn store(&self, written: impl IntoIterator<Item = (K, V)>) {
        for (key, value) in written {
            let mut shard = self.shard(&key).lock();
            shard.generation += 1;
            if shard.entries.len() >= SHARD_CAP {
                shard.entries.clear();
            }
            shard.entries.insert(key, value);
        }
    }

    /// Drops what a write changes. Called before the write and again after it.
    pub fn invalidate(&self, touched: &Touched<K>) {
        match touched {
            Touched::Keys(keys) => {
                for key in keys {
                    let mut shard = self.shard(key).lock();
                    shard.generation += 1;
                    shard.entries.remove(key);
                }
            }
            Touched::All => {
                for shard in &self.shards {
                    let mut shard = shard.lock();
                    shard.generation += 1;
                    shard.entries.clear();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::codec::test_file_record as rec;

    fn hit(cache: &InodeCache, ino: Ino) -> Option<u64> {
        match cache.lookup(&ino) {
            Lookup::Hit(r) => Some(r.attr.size),
            Lookup::Miss(_) => None,
        }
    }

    #[test]
    fn a_filled_record_is_served_until_a_write_touches_it() {
        let cache = InodeCache::default();
        let Lookup::Miss(g) = cache.lookup(&7) else { panic!("empty cache hit") };
        cache.fill(7, g, rec(7, 10));
        assert_eq!(hit(&cache, 7), Some(10));
        cache.invalidate(&Touched::Keys(vec![7]));
        assert_eq!(hit(&cache, 7), None);
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_cached() {
        let cache = InodeCache::default();
        // A reader misses and reads the old value from RocksDB...
        let Lookup::Miss(g) = cache.lookup(&7) else { panic!("empty cache hit") };
        // ...a commit writes a new value meanwhile...
        cache.invalidate(&Touched::Keys(vec![7]));
        cache.invalidate(&Touched::Keys(vec![7]));
        // ...and the reader's stale value must not be put back.
        cache.fill(7, g, rec(7, 10));
        assert_eq!(hit(&cache, 7), None);
        // A write to another shard does not stop the fill.
        let Lookup::Miss(g) = cache.lookup(&7) else { panic!("hit after a dropped fill") };
        let other = (8..).find(|i| !std::ptr::eq(cache.shard(i), cache.shard(&7))).expect("another shard");
        cache.invalidate(&Touched::Keys(vec![other]));
        cache.fill(7, g, rec(7, 11));
        assert_eq!(hit(&cache, 7), Some(11));
        cache.invalidate(&Touched::All);
        assert_eq!(hit(&cache, 7), None);
        // A record a commit stores is served, and a reader that missed before it cannot
        // replace it with what it read earlier.
        let Lookup::Miss(g) = cache.lookup(&7) else { panic!("hit after invalidating all") };
        cache.store([(7, rec(7, 12))]);
        cache.fill(7, g, rec(7, 10));
        assert_eq!(hit(&cache, 7), Some(12));
    }

    #[test]
    fn a_full_shard_is_emptied_rather_than_grown() {
        let cache = InodeCache::default();
        // Inodes that fall into one shard.
        let first = cache.shard(&0) as *const _;
        let same: Vec<Ino> = (0..).filter(|i| std::ptr::eq(cache.shard(i), first)).take(SHARD_CAP + 1).collect();
        for (i, &ino) in same.iter().enumerate() {
            let Lookup::Miss(g) = cache.lookup(&ino) else { panic!("hit") };
            cache.fill(ino, g, rec(ino, i as u64));
        }
        assert!(cache.shards.iter().all(|s| s.lock().entries.len() <= SHARD_CAP));
        assert_eq!(hit(&cache, same[SHARD_CAP]), Some(SHARD_CAP as u64));
    }

    #[test]
    fn names_that_do_not_exist_are_cached_as_such_and_dropped_by_a_write() {
        let cache = DentryCache::default();
        let key = b"D-parent-name".to_vec();
        let Lookup::Miss(g) = cache.lookup(&key) else { panic!("empty cache hit") };
        cache.fill(key.clone(), g, None);
        assert!(matches!(cache.lookup(&key), Lookup::Hit(None)));
        cache.store([(key.clone(), Some((9, FileKind::File)))]);
        assert!(matches!(cache.lookup(&key), Lookup::Hit(Some((9, FileKind::File)))));
        cache.invalidate(&Touched::Keys(vec![key.clone()]));
        assert!(matches!(cache.lookup(&key), Lookup::Miss(_)));
    }

    #[test]
    fn the_fx_hash_spreads_sequential_inodes_over_all_shards() {
        let cache = InodeCache::default();
        let mut used = std::collections::HashSet::new();
        for ino in 1..=1024u64 {
            used.insert(cache.shard(&ino) as *const _);
        }
        assert_eq!(used.len(), SHARDS);
    }
}
