//! The backend contract (`tierfs_test_support::conformance`) on every kind of server tierfs
//! talks to: object_store's in-memory store, a `file://` directory, and moto, a real S3 server
//! over HTTP on loopback.

use std::sync::Arc;

use object_store::memory::InMemory;
use tierfs::backend::{Backend, BackendOptions, BackendSpec, Credentials};
use tierfs_test_support::conformance::check_backend;
use tierfs_test_support::moto::MotoServer;

#[tokio::test]
async fn in_memory() {
    check_backend(&Backend::from_object_store("mem".into(), Arc::new(InMemory::new()), BackendOptions::for_tests()))
        .await;
}

#[tokio::test]
async fn local_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("not/yet/there");
    let spec = BackendSpec::File { path: root.clone() };
    let b = Backend::open(&spec, &Credentials::default(), &BackendOptions::for_tests()).expect("open");
    assert!(root.is_dir(), "opening a file:// backend creates its directory");
    assert_eq!(b.name(), spec.to_url());
    check_backend(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_server() {
    let server = MotoServer::start();
    server.create_bucket("conformance");
    let spec = BackendSpec::parse(&server.url("conformance", "prefix")).expect("url");
    let credentials =
        Credentials { access_key_id: Some("test".into()), secret_access_key: Some("test".into()), session_token: None };
    let b = Backend::open(&spec, &credentials, &BackendOptions::for_tests()).expect("open");
    check_backend(&b).await;
}
