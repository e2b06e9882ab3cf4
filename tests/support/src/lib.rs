//! Dev-only helpers the test suites of the core and of the daemon share, as one crate instead
//! of files included with `#[path]`:
//! - [`moto`]: a real S3-compatible server (moto) on a free loopback port, started by the
//!   test that needs it and killed when dropped, plus a raw HTTP client to inspect and tamper
//!   with what it stores;
//! - [`conformance`]: the contract every object backend keeps, run against each kind of
//!   server (`tests/backend_conformance.rs`);
//! - [`file_store`]: a `file://` store in a temporary directory, and sessions opened on it;
//! - [`mem_store`]: an in-memory [`tierfs::tier::BlockStore`] for unit-level tests of the
//!   cold tier (packs sealed and opened with real keys). Integration tests use real stores.
//!
//! Never a dependency of a production crate: only `[dev-dependencies]` name it.

pub mod conformance;
pub mod file_store;
pub mod mem_store;
pub mod moto;
