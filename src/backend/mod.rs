//! The object-storage layer: one [`Backend`] per URL, and the [`RedundantStore`] that spreads
//! objects over several of them (layout: docs/FORMAT.md, "Store layout").
//!
//! - [`BackendSpec`] parses `s3://bucket/prefix?endpoint=…&region=…&payload=…` and `file:///path`;
//!   [`Credentials`] and [`BackendOptions`] complete what [`Backend::open`] needs.
//! - [`Backend`] wraps one `object_store` client with timeouts, retries with backoff and a
//!   circuit breaker. Tests inject faults by wrapping that client (`faulty`, test builds only).
//! - Every whole-object read takes a [`SizeLimit`]: the object's size is learned before its
//!   body is read, and an object over the limit is refused as `Corrupt`, unbuffered.
//! - [`RedundantStore`] replicates small objects, replicates or erasure-codes packs, verifies
//!   every read through a caller-supplied [`Verify`] callback (or, for pack ranges, an [`Open`]
//!   callback that takes the bytes over and may decrypt them in place), repairs what it finds
//!   damaged and scrubs on request.
//!
//! Bytes passed in are already encrypted by the caller: this layer never sees keys and never
//! interprets content. All functions are async on the caller's tokio runtime; CPU-heavy erasure
//! coding of large packs runs on `spawn_blocking`.
//!
//! ```
//! use std::sync::Arc;
//! use bytes::Bytes;
//! use object_store::memory::InMemory;
//! use tierfs::backend::{Backend, BackendOptions, RedundantStore, Redundancy};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let backends = (0..3)
//!     .map(|i| Backend::from_object_store(format!("mem-{i}"), Arc::new(InMemory::new()), BackendOptions::default()))
//!     .collect();
//! let store = RedundantStore::new(backends, Redundancy::Erasure { data: 2, parity: 1 })?;
//! let pack = Bytes::from(vec![7u8; 1000]);
//! store.put_pack("packs/ab/abcd", pack.clone()).await?;
//! // The check takes the bytes over: it may decrypt them where they lie.
//! let part = store.get_pack_range("packs/ab/abcd", 1000, 400..600, &Some).await?;
//! assert_eq!(part, pack.slice(400..600));
//! # Ok::<(), tierfs::backend::BackendError>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod breaker;
mod erasure;
pub mod error;
#[cfg(test)]
pub(crate) mod faulty;
mod limit;
mod redundant;
mod repair;
mod single;
mod spec;

pub use error::BackendError;
pub use limit::SizeLimit;
pub use redundant::{CreateOutcome, Open, PutReport, Redundancy, RedundantStore, ScrubOutcome, Verify};
pub use repair::{SavedRepair, SavedSource};
pub use single::{Backend, BackendHealth, ObjectInfo};
pub use spec::{BackendOptions, BackendSpec, Credentials, DEFAULT_REGION, PayloadCheck};
