//! An in-memory block store for tests of the cold tier: packs are sealed and opened with real
//! keys, as the production store does, and kept in a map. Invariant: a block comes back only
//! if its pack was put and it verifies under the store's keys; anything else is the store
//! error the production store would give (not found, a bad pack, a failed authentication).

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
    gate: Mutex<Option<(SyncSender<()>, Receiver<()>)>>,
}

/// A `put_pack` held at the store (see [`MemStore::hold_next_put`]).
pub struct HeldPut {
    arrived: Receiver<()>,
    go: SyncSender<()>,
}

impl HeldPut {
    /// Waits until the held `put_pack` has its pack (the uploader read and sealed the chunks).
    pub fn arrived(&self) {
        self.arrived.recv().expect("the held put_pack never came");
    }

    /// Lets the held `put_pack` store its pack and return.
    pub fn release(self) {
        let _ = self.go.send(());
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
        }
    }

    /// Holds the next `put_pack` before it stores anything, so a test can change files while
    /// an upload of their old bytes is in flight.
    pub fn hold_next_put(&self) -> HeldPut {
        let (arrived_tx, arrived) = sync_channel(1);
        let (go, go_rx) = sync_channel(1);
        *self.gate.lock().unwrap_or_else(|p| p.into_inner()) = Some((arrived_tx, go_rx));
        HeldPut { arrived, go }
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
        let gate = self.gate.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((arrived, go)) = gate {
            let _ = arrived.send(());
            let _ = go.recv();
        }
        let pack = pack.finish(&self.keys);
        self.packs.lock().unwrap_or_else(|p| p.into_inner()).insert(pack.id, pack.bytes);
        Ok(pack.blocks)
    }

    fn get_block(&self, id: &BlockId, loc: &BlockLoc) -> Result<bytes::Bytes, StoreError> {
        let packs = self.packs.lock().unwrap_or_else(|p| p.into_inner());
        let key = hex_id(&loc.pack);
        let pack = packs.get(&loc.pack).ok_or_else(|| BackendError::NotFound { key: key.clone() })?;
        let sealed = pack
            .get(loc.offset as usize..loc.range().end as usize)
            .ok_or_else(|| BlockError::BadPack { pack: key, reason: format!("block {} past its end", hex_id(id)) })?;
        Ok(open_block(&self.keys, id, loc.plain_len, sealed).map(bytes::Bytes::from)?)
    }

    fn pack_size(&self) -> usize {
        1 << 20
    }
}

fn hex_id(id: &BlockId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}
