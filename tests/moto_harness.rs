//! Self-test of the S3 test server helper (`tests/support/src/moto.rs`, crate `tierfs-test-support`): a real `moto_server`
//! on loopback, driven through the helper's raw HTTP client. The other integration tests
//! trust it to show exactly what reached the server and to simulate loss, outages and
//! stalls, so each of those is checked here against the real server. Also here: S3 behaviour
//! tierfs depends on that only a real server shows, such as conditional create
//! (If-None-Match: *) deciding between two writers.

use tierfs_test_support::moto;

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use moto::MotoServer;
use tierfs::backend::{Backend, BackendOptions, BackendSpec, CreateOutcome, Credentials, Redundancy, RedundantStore};

/// More than one listing page: moto returns at most 1000 keys a page.
const OBJECTS: usize = 1500;

/// Object `i`: binary content of a varying length (0 included), distinct per object.
fn object(i: usize) -> (String, Vec<u8>) {
    let key = format!("blocks/{:02x}/{i:06}.pack", i % 256);
    let data = (0..i % 300).map(|j| ((i * 31 + j * 7) % 256) as u8).collect();
    (key, data)
}

#[test]
fn put_dump_delete_round_trip_across_listing_pages() {
    let server = MotoServer::start();
    server.create_bucket("harness");
    assert_eq!(server.dump_bucket("harness"), vec![], "a new bucket is empty");

    let mut expected: BTreeMap<String, Vec<u8>> = (0..OBJECTS).map(object).collect();
    // Keys outside tierfs's alphabet: percent-encoding on the way in, XML unescaping on the
    // way out.
    expected.insert("odd/a b&c+d=e%f?g#h<i>'\"é.txt".to_string(), b"odd".to_vec());
    expected.insert("odd/~tilde".to_string(), Vec::new());

    // Four writers: the helper is shared between threads, and moto serves them concurrently.
    let entries: Vec<(&String, &Vec<u8>)> = expected.iter().collect();
    thread::scope(|s| {
        for part in entries.chunks(entries.len().div_ceil(4)) {
            let server = &server;
            s.spawn(move || {
                for (key, data) in part {
                    server.put_raw("harness", key, data);
                }
            });
        }
    });

    let dumped = server.dump_bucket("harness");
    assert_eq!(dumped.len(), expected.len(), "every object is listed once, across pages");
    let dumped: BTreeMap<String, Vec<u8>> = dumped.into_iter().collect();
    assert!(dumped == expected, "dump_bucket returns exactly what was put");

    // Overwrite one (corruption), delete every other one (loss).
    let (key0, _) = object(0);
    server.put_raw("harness", &key0, b"corrupted");
    assert_eq!(server.get_raw("harness", &key0).as_deref(), Some(&b"corrupted"[..]));
    for i in (1..OBJECTS).step_by(2) {
        server.delete_raw("harness", &object(i).0);
    }
    // Deleting a missing key succeeds, as in S3.
    server.delete_raw("harness", &object(1).0);
    assert_eq!(server.get_raw("harness", &object(1).0), None);

    let keys = server.list_keys("harness");
    assert_eq!(keys.len(), expected.len() - OBJECTS / 2);
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "keys come sorted and unique");
    assert!(keys.contains(&key0) && !keys.contains(&object(1).0));
}

#[test]
fn kill_loses_everything_and_restart_comes_back_empty_on_the_same_port() {
    let mut server = MotoServer::start();
    let port = server.port();
    assert_eq!(server.endpoint(), format!("http://127.0.0.1:{port}"));
    server.create_bucket("killed");
    server.put_raw("killed", "k", b"v");
    assert!(server.is_running());

    server.kill();
    assert!(!server.is_running());
    assert_eq!(server.pid(), None);
    let err = server.try_request("GET", "/killed/k", b"", Duration::from_secs(2)).expect_err("a killed server answers");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    server.kill(); // a second kill is a no-op

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port, "restart keeps the port (the backend URL stays valid)");
    let resp =
        server.try_request("GET", "/killed?list-type=2", b"", Duration::from_secs(10)).expect("list after restart");
    assert_eq!(resp.status, 404, "the bucket is gone: {}", resp.text());
    server.create_bucket("killed");
    assert_eq!(server.dump_bucket("killed"), vec![]);
    server.put_raw("killed", "k", b"again");
    assert_eq!(server.get_raw("killed", "k").as_deref(), Some(&b"again"[..]));
}

#[test]
fn pause_makes_requests_time_out_and_resume_brings_the_data_back() {
    let server = MotoServer::start();
    server.create_bucket("paused");
    server.put_raw("paused", "k", b"kept");

    server.pause();
    assert!(server.is_running(), "a paused server still runs");
    let start = Instant::now();
    let err = server.try_request("GET", "/paused/k", b"", Duration::from_secs(2)).expect_err("a paused server answers");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(1900) && waited < Duration::from_secs(10), "timed out after {waited:?}");

    server.resume();
    assert_eq!(server.get_raw("paused", "k").as_deref(), Some(&b"kept"[..]), "resume keeps the data");
}

#[test]
fn drop_kills_the_server() {
    let server = MotoServer::start();
    let port = server.port();
    let pid = server.pid().expect("a started server has a pid");
    let log = server.log_path();
    assert!(log.exists());
    server.pause(); // a stopped process must die too
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "moto_server {pid} survived the drop");
    assert!(TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err(), "port {port} still answers");
    assert!(!log.exists(), "a passing test leaves no temporary files");
}

#[test]
fn url_and_env_point_tierfs_at_the_server() {
    let server = MotoServer::start();
    let port = server.port();
    assert_eq!(server.url("bkt", "ws/1"), format!("s3://bkt/ws/1?endpoint=http://127.0.0.1:{port}&region=us-east-1"));
    let env: BTreeMap<_, _> = MotoServer::env().into_iter().collect();
    assert_eq!(env.get("AWS_REGION"), Some(&"us-east-1"));
    assert!(env.contains_key("AWS_ACCESS_KEY_ID") && env.contains_key("AWS_SECRET_ACCESS_KEY"));
}

#[test]
fn http_parser_frames_bodies() {
    let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
    let resp = moto::parse_response(chunked, false).expect("chunked");
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"hello world"[..]));

    let sized = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 NOT FOUND\r\ncontent-length: 3\r\n\r\nabcEXTRA";
    let resp = moto::parse_response(sized, false).expect("content-length");
    assert_eq!((resp.status, resp.body.as_slice()), (404, &b"abc"[..]));
    assert_eq!(resp.header("Content-Length"), Some("3"));

    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
    assert!(moto::parse_response(head, true).expect("HEAD").body.is_empty());
    let until_eof = b"HTTP/1.0 200 OK\r\n\r\nall of it";
    assert_eq!(moto::parse_response(until_eof, false).expect("EOF").body, b"all of it");

    for broken in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Le",
        b"garbage\r\n\r\n",
    ] {
        assert!(moto::parse_response(broken, false).is_err(), "accepted {:?}", String::from_utf8_lossy(broken));
    }
}

#[test]
fn percent_encoding_and_xml_unescaping() {
    assert_eq!(moto::encode("a/b c_d-e.f~g", true), "a/b%20c_d-e.f~g");
    assert_eq!(moto::encode("a/b+=é", false), "a%2Fb%2B%3D%C3%A9");
    assert_eq!(moto::xml_unescape("a&amp;b&lt;&gt;&quot;&apos;&#233;&#xE9;&bogus;&"), "a&b<>\"'éé&bogus;&");
    assert_eq!(moto::xml_elements("<a><Key>x</Key><Key></Key><Key>y</Key></a>", "Key"), vec!["x", "", "y"]);
}

/// Two writers race to create each entry of a journal chain on three moto servers (majority
/// conditional create): exactly one wins each entry, and every server ends up holding the
/// winner's bytes. moto honours If-None-Match: *, so the probe passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn majority_conditional_create_has_one_winner_on_real_servers() {
    const BUCKET: &str = "journal";
    // Serial servers: a threaded moto can accept both of two overlapping conditional creates
    // (see MotoServer::start_serial), and then no majority scheme has one winner.
    let servers = MotoServer::start_many_serial(3, BUCKET);
    let creds =
        Credentials { access_key_id: Some("test".into()), secret_access_key: Some("test".into()), session_token: None };
    // One store per writer, with its own clients, as two processes would have.
    let writer = || {
        let backends = servers
            .iter()
            .map(|s| {
                let spec = BackendSpec::parse(&s.url(BUCKET, "ws")).expect("backend URL");
                Backend::open(&spec, &creds, &BackendOptions::for_tests()).expect("open backend")
            })
            .collect();
        RedundantStore::new(backends, Redundancy::Replicas(3)).expect("store")
    };
    let (a, b) = (writer(), writer());
    a.check_conditional_create().await.expect("moto honours If-None-Match: *");

    for seq in 0..20 {
        let key = format!("j/{seq}");
        let (da, db) = (Bytes::from(format!("writer a, entry {seq}")), Bytes::from(format!("writer b, entry {seq}")));
        let (oa, ob) = tokio::join!(a.create_object(&key, da.clone()), b.create_object(&key, db.clone()));
        let winner = match (oa.expect("create a"), ob.expect("create b")) {
            (CreateOutcome::Created, CreateOutcome::Exists) => &da,
            (CreateOutcome::Exists, CreateOutcome::Created) => &db,
            other => panic!("{key}: {other:?}"),
        };
        for s in &servers {
            let stored = s.get_raw(BUCKET, &format!("ws/{key}"));
            assert_eq!(stored.as_deref(), Some(&winner[..]), "{key} on {}", s.endpoint());
        }
    }
    for s in &servers {
        assert!(s.list_keys(BUCKET).iter().all(|k| !k.starts_with("ws/probe/")), "probe objects are deleted");
    }
}
