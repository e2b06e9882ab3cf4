//! A read cache of decoded inode records in front of RocksDB.
//!
//! Every POSIX operation reads one to seven inode records (parents, the entry, the target,
//! each again after taking its lock), and a RocksDB point lookup costs microseconds of
//! skip-list search and table probes per record; the kernel's GETATTR after each change to a
//! directory reads one more. This cache answers those reads from memory.
//!
//! Invariant: a lookup never returns a record older than the last committed batch that wrote
//! it. Every write of inode records (a commit or an import) drops the entries it touches and
//! moves the generation of their shards twice: once before and once after the RocksDB
//! write; a commit then stores the records it wrote (moving the generation again), under a
//! lock that orders such writes the same way in RocksDB and here. A reader that missed
//! inserts what it read from RocksDB only if its shard's generation did not move meanwhile,
//! so a value read before a write can never be put back after it. Missing records are not
//! cached. Each shard holds at most [`SHARD_CAP`] records and is emptied when full (about
//! 20 MiB in all).

use std::collections::HashMap;

use parking_lot::Mutex;

use super::codec::InodeRecord;
use crate::types::Ino;

const SHARDS: usize = 32;
/// Records per shard: 32 × 4096 = 131 072 records.
pub const SHARD_CAP: usize = 4096;

#[derive(Default)]
struct Shard {
    generation: u64,
    records: HashMap<Ino, InodeRecord>,
}

/// The inodes one write changes.
#[derive(Debug, PartialEq, Eq)]
pub enum Touched {
    /// These inode records (possibly none).
    Inodes(Vec<Ino>),
    /// Too many to name (a range delete over the inode table): drop everything.
    All,
}

/// What [`InodeCache::lookup`] found.
pub enum Lookup {
    Hit(InodeRecord),
    /// Not cached: read RocksDB, then [`InodeCache::fill`] with this generation.
    Miss(u64),
}

pub struct InodeCache {
    shards: Vec<Mutex<Shard>>,
}

impl Default for InodeCache {
    fn default() -> Self {
        InodeCache { shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect() }
    }
}

impl InodeCache {
    fn shard(&self, ino: Ino) -> &Mutex<Shard> {
        // Inode numbers are sequential: the low bits spread them evenly.
        &self.shards[(ino as usize) % SHARDS]
    }

    pub fn lookup(&self, ino: Ino) -> Lookup {
        let shard = self.shard(ino).lock();
        match shard.records.get(&ino) {
            Some(rec) => Lookup::Hit(rec.clone()),
            None => Lookup::Miss(shard.generation),
        }
    }

    /// Caches `rec`, read from RocksDB after a [`Lookup::Miss`] with `generation`, unless a
    /// write touched the shard since.
    pub fn fill(&self, ino: Ino, generation: u64, rec: &InodeRecord) {
        let mut shard = self.shard(ino).lock();
        if shard.generation != generation {
            return;
        }
        if shard.records.len() >= SHARD_CAP {
            shard.records.clear();
        }
        shard.records.insert(ino, rec.clone());
    }

    /// Caches records a commit just wrote (after its RocksDB write, in the order of the
    /// writes: see `MetaStore::commit`). Moves each shard's generation, so a reader that
    /// read the value before the write cannot put it back.
    pub fn store(&self, recs: &[InodeRecord]) {
        for rec in recs {
            let mut shard = self.shard(rec.attr.ino).lock();
            shard.generation += 1;
            if shard.records.len() >= SHARD_CAP {
                shard.records.clear();
            }
            shard.records.insert(rec.attr.ino, rec.clone());
        }
    }

    /// Drops what a write changes. Called before the write and again after it.
    pub fn invalidate(&self, touched: &Touched) {
        match touched {
            Touched::Inodes(inos) => {
                for &ino in inos {
                    let mut shard = self.shard(ino).lock();
                    shard.generation += 1;
                    shard.records.remove(&ino);
                }
            }
            Touched::All => {
                for shard in &self.shards {
                    let mut shard = shard.lock();
                    shard.generation += 1;
                    shard.records.clear();
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
        match cache.lookup(ino) {
            Lookup::Hit(r) => Some(r.attr.size),
            Lookup::Miss(_) => None,
        }
    }

    #[test]
    fn a_filled_record_is_served_until_a_write_touches_it() {
        let cache = InodeCache::default();
        let Lookup::Miss(g) = cache.lookup(7) else { panic!("empty cache hit") };
        cache.fill(7, g, &rec(7, 10));
        assert_eq!(hit(&cache, 7), Some(10));
        cache.invalidate(&Touched::Inodes(vec![7]));
        assert_eq!(hit(&cache, 7), None);
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_cached() {
        let cache = InodeCache::default();
        // A reader misses and reads the old value from RocksDB...
        let Lookup::Miss(g) = cache.lookup(7) else { panic!("empty cache hit") };
        // ...a commit writes a new value meanwhile...
        cache.invalidate(&Touched::Inodes(vec![7]));
        cache.invalidate(&Touched::Inodes(vec![7]));
        // ...and the reader's stale value must not be put back.
        cache.fill(7, g, &rec(7, 10));
        assert_eq!(hit(&cache, 7), None);
        // A write to another shard does not stop the fill.
        let Lookup::Miss(g) = cache.lookup(7) else { panic!("hit after a dropped fill") };
        cache.invalidate(&Touched::Inodes(vec![8]));
        cache.fill(7, g, &rec(7, 11));
        assert_eq!(hit(&cache, 7), Some(11));
        cache.invalidate(&Touched::All);
        assert_eq!(hit(&cache, 7), None);
        // A record a commit stores is served, and a reader that missed before it cannot
        // replace it with what it read earlier.
        let Lookup::Miss(g) = cache.lookup(7) else { panic!("hit after invalidating all") };
        cache.store(&[rec(7, 12)]);
        cache.fill(7, g, &rec(7, 10));
        assert_eq!(hit(&cache, 7), Some(12));
    }

    #[test]
    fn a_full_shard_is_emptied_rather_than_grown() {
        let cache = InodeCache::default();
        for i in 0..=SHARD_CAP as u64 {
            let ino = i * SHARDS as u64;
            let Lookup::Miss(g) = cache.lookup(ino) else { panic!("hit") };
            cache.fill(ino, g, &rec(ino, i));
        }
        assert!(cache.shards[0].lock().records.len() <= SHARD_CAP);
        assert_eq!(hit(&cache, SHARD_CAP as u64 * SHARDS as u64), Some(SHARD_CAP as u64));
    }
}
