//! A store on `file://` in a temporary directory, and sessions opened on it: the fixture the
//! core's session-level suites share (a real store, real RocksDB, a real tokio runtime).
//!
//! Every session's data dir is a directory of the fixture's own, named by the caller, so two
//! sessions of one test are two nodes of one store.

use std::sync::Arc;
use std::time::Duration;

use tierfs::backend::BackendSpec;
use tierfs::crypto::{KdfParams, Secret};
use tierfs::session::{Access, Session, SessionConfig, SessionError, StoreLocality};
use tierfs::store::{Store, StoreConfig};
use tokio::runtime::Runtime;

/// An initialized `file://` store (one replica, test KDF parameters) and the runtime sessions
/// on it run on.
pub struct FileStore {
    pub rt: Runtime,
    pub dir: tempfile::TempDir,
    pub store_config: StoreConfig,
    passphrase: &'static [u8],
}

impl FileStore {
    /// A new store unlocked by `passphrase`, its objects in `objects/` of a new temporary dir.
    pub fn new(passphrase: &'static [u8]) -> FileStore {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let objects = dir.path().join("objects");
        std::fs::create_dir_all(&objects).expect("objects dir");
        let mut store_config = StoreConfig::new(vec![BackendSpec::File { path: objects }.to_url()]);
        store_config.replicas = Some(1);
        rt.block_on(Store::init(&store_config, &Secret::Passphrase(passphrase), KdfParams::for_tests()))
            .expect("init store");
        FileStore { rt, dir, store_config, passphrase }
    }

    /// The store, opened anew (as a new node would).
    pub fn store(&self) -> Arc<Store> {
        let secret = Secret::Passphrase(self.passphrase);
        Arc::new(self.rt.block_on(Store::open(&self.store_config, &secret)).expect("open store"))
    }

    /// A session's configuration: data dir `data_dir` of the fixture, the store remote.
    pub fn config(&self, data_dir: &str, access: Access) -> SessionConfig {
        let mut config =
            SessionConfig::new(self.dir.path().join(data_dir), Some((self.store(), StoreLocality::Remote)));
        config.access = access;
        config.holder = format!("test-{data_dir}");
        config
    }

    /// Opens a session on data dir `data_dir`.
    pub fn open(&self, data_dir: &str, access: Access) -> Result<Session, SessionError> {
        Session::open(self.config(data_dir, access), self.rt.handle())
    }

    /// Flushes and closes `session`, within 30 s each.
    pub fn close(&self, session: Session) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        self.rt.block_on(session.flush(deadline)).expect("flush");
        self.rt.block_on(session.close(deadline)).expect("close");
    }
}
