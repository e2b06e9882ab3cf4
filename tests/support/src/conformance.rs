//! The contract every backend of `tierfs::backend::Backend` must keep, as one check run
//! against each kind of server (in memory, `file://`, a real S3 server): whole and ranged
//! reads, an object over the reader's size limit refused as corruption before its body is
//! read, a range past the end as corruption, not-found, listing by path segment, the
//! conditional create that fences writers (a repeat of our own bytes counts as created),
//! idempotent delete, and the health check. Invariant: the check starts from an empty
//! backend and leaves only the lease object behind.

use bytes::Bytes;
use tierfs::backend::{Backend, BackendError, ObjectInfo, SizeLimit};

/// Room for every object the check stores.
const ANY: SizeLimit = SizeLimit { max_len: 1 << 10, what: "a test object" };

/// Runs the contract against `b`, panicking at the first broken promise.
pub async fn check_backend(b: &Backend) {
    let data = Bytes::from_static(b"0123456789abcdef");
    b.put("packs/ab/abcd", data.clone()).await.expect("put");
    b.put("config", Bytes::from_static(b"cfg")).await.expect("put config");
    assert_eq!(b.get("packs/ab/abcd", ANY).await.expect("get"), data);
    assert_eq!(b.get_range("packs/ab/abcd", 2..6).await.expect("range"), Bytes::from_static(b"2345"));
    assert_eq!(b.get_range("packs/ab/abcd", 5..5).await.expect("empty range"), Bytes::new());
    let short = b.get_range("packs/ab/abcd", 10..20).await.expect_err("a range past the end");
    assert!(matches!(short, BackendError::Corrupt { .. }), "{short:?}");
    assert!(b.get("packs/ab/nope", ANY).await.expect_err("missing").is_not_found());
    // One byte over the limit: refused as corrupt, naming the key and both sizes, unread.
    let received = b.health().traffic.received_bytes;
    let small = SizeLimit { max_len: 15, what: "a small object" };
    let err = b.get("packs/ab/abcd", small).await.expect_err("an object over its limit");
    assert!(matches!(err, BackendError::Corrupt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("packs/ab/abcd") && msg.contains("16 bytes") && msg.contains("15 bytes a small object"),
        "{msg}"
    );
    assert_eq!(b.health().traffic.received_bytes, received, "the body of a refused object is not counted as read");

    let mut all = b.list("").await.expect("list");
    all.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        all,
        vec![ObjectInfo { key: "config".into(), size: 3 }, ObjectInfo { key: "packs/ab/abcd".into(), size: 16 }]
    );
    assert_eq!(b.list("packs").await.expect("list packs").len(), 1);
    assert_eq!(b.list("packs/").await.expect("list packs/").len(), 1);
    assert_eq!(b.list("pack").await.expect("list pack").len(), 0, "segments, not string prefixes");
    assert!(b.list("index").await.expect("list index").is_empty());

    assert!(b.put_if_absent("refs/ws/lease", Bytes::from_static(b"me")).await.expect("create"));
    assert!(!b.put_if_absent("refs/ws/lease", Bytes::from_static(b"you")).await.expect("second create"));
    // The same bytes again: our own earlier attempt may have landed; reported as created.
    assert!(b.put_if_absent("refs/ws/lease", Bytes::from_static(b"me")).await.expect("repeat"));
    assert_eq!(b.get("refs/ws/lease", ANY).await.expect("get lease"), Bytes::from_static(b"me"));

    b.delete("packs/ab/abcd").await.expect("delete");
    b.delete("packs/ab/abcd").await.expect("delete again");
    assert!(b.get("packs/ab/abcd", ANY).await.expect_err("deleted").is_not_found());
    b.delete("config").await.expect("delete config");
    b.check().await.expect("health check");
    assert!(b.is_available());
}
