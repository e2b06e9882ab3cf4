//! An in-memory block store for tests of the cold tier: packs are sealed and opened with real
//! keys, as the production store does, and kept in a map. Invariant: a block comes back only
//! if its pack was put and it verifies under the store's keys; anything else is the store
//! error the production store would give (not found, a bad pack, a failed authentication).
//! A test can hold the next `put_pack` or `get_block` at the store (to change things while it
//! is in flight, with no timing) and read which blocks were fetched, in order.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use tierfs::backend::BackendError;
use tierfs::block::{BlockError, BlockId, BlockLoc, PackBuilder, open_block};
use tierfs::crypto::{DataKey, Keys};
use tierfs::store::StoreError;
use tierfs::tier::BlockStore;

/// Packs in memory under fixed test keys.
pub struct MemStore {
    keys: Keys,
    packs: Mutex<HashMap<BlockId, bytes::Bytes>>,
    /// Set by [`MemStore::hold_next_put`]: the next `put_pack` says it arrived, then waits.
    gate: Gate,
    /// Set by [`MemStore::hold_next_get`]: the same for the next `get_block`.
    get_gate: Gate,
    /// The first [`HEAD`] bytes of every block `get_block` returned, in order.
    fetched: Mutex<Vec<Vec<u8>>>,
}

/// How many leading bytes of each fetched block [`MemStore::fetched_heads`] keeps.
pub const HEAD: usize = 8;

/// One held call: it says it arrived, then waits to be let go.
type Gate = Mutex<Option<(SyncSender<()>, Receiver<()>)>>;

/// A call held at the store (see [`MemStore::hold_next_put`], [`MemStore::hold_next_get`]).
pub struct HeldPut {
    arrived: Receiver<()>,
    go: SyncSender<()>,
}

impl HeldPut {
    /// Waits until the held call is at the store (a `put_pack` has its pack: the uploader
    /// read and sealed the chunks).
    pub fn arrived(&self) {
        self.arrived.recv().expect("the held call never came");
    }

    /// Lets the held call go on and return.
    pub fn release(self) {
        let _ = self.go.send(());
    }
}

fn hold(gate: &Gate) -> HeldPut {
    let (arrived_tx, arrived) = sync_channel(1);
    let (go, go_rx) = sync_channel(1);
    *gate.lock().unwrap_or_else(|p| p.into_inner()) = Some((arrived_tx, go_rx));
    HeldPut { arrived, go }
}

/// Holds the caller if `gate` is set (once: the gate is cleared).
fn wait_at(gate: &Gate) {
    let held = gate.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((arrived, go)) = held {
        let _ = arrived.send(());
        let _ = go.recv();
    }
}

impl Default for MemStore {
    fn default() -> MemStore {
        MemStore::new()
    }
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore {
            keys: Keys::new(&DataKey::from_bytes([7; 32])),
            packs: Mutex::new(HashMap::new()),
            gate: Mutex::new(None),
            get_gate: Mutex::new(None),
            fetched: Mutex::new(Vec::new()),
        }
    }

    /// Holds the next `put_pack` before it stores anything, so a test can change files while
    /// an upload of their old bytes is in flight.
    pub fn hold_next_put(&self) -> HeldPut {
        hold(&self.gate)
    }

    /// Holds the next `get_block` before it reads anything, so a test can act while a fetch
    /// is in flight.
    pub fn hold_next_get(&self) -> HeldPut {
        hold(&self.get_gate)
    }

    /// The first [`HEAD`] bytes of each block fetched so far, in the order they were fetched.
    pub fn fetched_heads(&self) -> Vec<Vec<u8>> {
        self.fetched.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many packs were put.
    pub fn packs(&self) -> usize {
        self.packs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl BlockStore for MemStore {
    fn keys(&self) -> &Keys {
        &self.keys
    }

    fn put_pack(&self, pack: PackBuilder) -> Result<Vec<(BlockId, BlockLoc)>, StoreError> {
        wait_at(&self.gate);
        let pack = pack.finish(&self.keys);
        self.packs.lock().unwrap_or_else(|p| p.into_inner()).insert(pack.id, pack.bytes);
        Ok(pack.blocks)
    }

    fn get_block(&self, id: &BlockId, loc: &BlockLoc) -> Result<bytes::Bytes, StoreError> {
        wait_at(&self.get_gate);
        let packs = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        let key = hex_id(&loc.pack);
        let pack = packs.get(&loc.pack).ok_or_else(|| BackendError::NotFound { key: key.clone() })?;
        let sealed = pack
            .get(loc.offset as usize..loc.range().end as usize)
            .ok_or_else(|| BlockError::BadPack { pack: key, reason: format!("block {} past its end", hex_id(id)) })?;
        let block = open_block(&self.keys, id, loc.plain_len, sealed)?;
        self.fetched.lock().unwrap_or_else(|p| p.into_inner()).push(block[..block.len().min(HEAD)].to_vec());
        Ok(bytes::Bytes::from(block))
    }

    fn pack_size(&self) -> usize {
        1 << 20
    }
}

fn hex_id(id: &BlockId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
