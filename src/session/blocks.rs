//! The production [`BlockStore`]: the cold tier's blocking calls entered into the async
//! [`Store`] with `Handle::block_on`.
//!
//! Invariant: only the tier's worker threads and FUSE (or watcher) threads call in, never a
//! runtime thread, since `block_on` on a runtime thread panics (docs/ARCHITECTURE.md, "Layers").
//! Store errors keep their type (the cold tier wraps them in `ColdError::Store`), so a caller can tell a store that is
//! down from data that is damaged.

use std::sync::Arc;

use bytes::Bytes;
use tokio::runtime::Handle;

use crate::block::{BlockId, BlockLoc, PackBuilder};
use crate::crypto::Keys;
use crate::store::{RunJoin, Store, StoreError};
use crate::tier::{BlockStore, Near};

/// The cold tier's view of a store.
pub struct StoreBlocks {
    store: Arc<Store>,
    handle: Handle,
}

impl StoreBlocks {
    pub fn new(store: Arc<Store>, handle: Handle) -> StoreBlocks {
        StoreBlocks { store, handle }
    }
}

impl BlockStore for StoreBlocks {
    fn keys(&self) -> &Keys {
        self.store.keys()
    }

    fn put_pack(&self, pack: PackBuilder) -> Result<Vec<(BlockId, BlockLoc)>, StoreError> {
        self.handle.block_on(self.store.put_pack(pack))
    }

    fn get_block(&self, id: &BlockId, loc: &BlockLoc) -> Result<Bytes, StoreError> {
        self.handle.block_on(self.store.get_block(id, loc))
    }

    fn get_blocks(&self, blocks: &[(BlockId, BlockLoc)], join: RunJoin) -> Result<Vec<Bytes>, StoreError> {
        self.handle.block_on(self.store.get_blocks(blocks, join))
    }

    fn get_block_near(&self, id: &BlockId, loc: &BlockLoc, window: u64) -> Result<Near, StoreError> {
        self.handle.block_on(self.store.get_block_near(id, loc, window))
    }

    fn pack_size(&self) -> usize {
        self.store.config().pack_size as usize
    }
}
