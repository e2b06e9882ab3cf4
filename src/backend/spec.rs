//! What a backend is, before it is opened: its URL ([`BackendSpec`]), the credentials to use
//! ([`Credentials`]) and the request policy ([`BackendOptions`]).
//!
//! Two URL forms exist: `s3://bucket/prefix?endpoint=http://host:port&region=r&payload=signed`
//! (endpoint, region and payload optional) and `file:///absolute/path`. Parsing is strict and
//! every rejection says what form was expected, because a typo here otherwise surfaces much
//! later as "not found".
//! Invariants:
//! - a spec never holds a secret, so `to_url()` is safe to print, log and use as the backend's
//!   name; credentials in the URL (user-info) are refused with a pointer to where they belong;
//! - prefix segments (and object keys, see `single.rs`) use only `[A-Za-z0-9._=-]`, so every
//!   store (S3 flavours, the local filesystem) names the objects identically and a listing
//!   returns exactly the keys that were written;
//! - `parse(spec.to_url()) == spec`.

use std::fmt;
use std::path::{Component, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use url::Url;

use super::error::BackendError;

/// The region used when neither the URL nor the environment names one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// A parsed backend URL: `s3://bucket/prefix?endpoint=http://127.0.0.1:9001&region=us-east-1`
/// (endpoint, region and `payload` optional; with an endpoint use path-style addressing and
/// allow http) or `file:///abs/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    S3 { bucket: String, prefix: String, endpoint: Option<String>, region: Option<String>, payload: PayloadCheck },
    File { path: PathBuf },
}

/// How the server checks that a PUT's body arrived intact (URL parameter `payload`).
///
/// Either way the body is an AES-GCM envelope that tierfs authenticates on every read; this is
/// about catching a body damaged on its way *in*, before the upload is acknowledged and the
/// local copy may be evicted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PayloadCheck {
    /// `payload=crc64nvme` (the default, left out of the URL): the request carries
    /// `x-amz-checksum-crc64nvme` (computed at memory speed) and `UNSIGNED-PAYLOAD`, and the
    /// server refuses a body that does not match (AWS S3, Garage 2.x). SHA-256 of every body
    /// was the largest single cost of an upload (a fifth of the daemon's CPU).
    #[default]
    Crc64Nvme,
    /// `payload=signed`: SigV4 signs the body's SHA-256 (`x-amz-content-sha256`), for servers
    /// that refuse unsigned payloads or do not know the CRC64NVME checksum header.
    Signed,
}

impl PayloadCheck {
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadCheck::Crc64Nvme => "crc64nvme",
            PayloadCheck::Signed => "signed",
        }
    }

    fn parse(value: &str) -> Option<PayloadCheck> {
        [PayloadCheck::Crc64Nvme, PayloadCheck::Signed].into_iter().find(|p| p.as_str() == value)
    }
}

const EXPECTED: &str =
    "expected s3://bucket/prefix[?endpoint=http://host:port&region=name&payload=signed] or file:///absolute/path";

impl BackendSpec {
    /// Parses a backend URL; anything unsupported is a [`BackendError::BadUrl`] saying what to write.
    pub fn parse(url: &str) -> Result<BackendSpec, BackendError> {
        let bad = |reason: String| BackendError::BadUrl { url: url.to_string(), reason };
        let trimmed = url.trim();
        let parsed = Url::parse(trimmed).map_err(|e| bad(format!("not a URL ({e}); {EXPECTED}")))?;
        // The URL parser resolves `.` and `..` silently; a prefix or directory that is not what
        // was written is refused instead.
        if has_dot_segment(trimmed) {
            return Err(bad("'.' and '..' are not allowed as path segments".into()));
        }
        match parsed.scheme() {
            "s3" => parse_s3(&parsed).map_err(bad),
            "file" => parse_file(&parsed).map_err(bad),
            other => Err(bad(format!("unsupported scheme {other:?}; {EXPECTED}"))),
        }
    }

    /// The canonical URL of this spec (no secrets: safe to print). `parse(to_url())` gives the spec back.
    pub fn to_url(&self) -> String {
        match self {
            BackendSpec::S3 { bucket, prefix, endpoint, region, payload } => {
                let mut url = format!("s3://{bucket}");
                if !prefix.is_empty() {
                    url.push('/');
                    url.push_str(prefix);
                }
                let mut sep = '?';
                // The default is left out, so the URLs (the backends' names) of stores made
                // before the parameter existed stay as they were.
                let payload = (*payload != PayloadCheck::default()).then(|| payload.as_str().to_string());
                for (name, value) in [("endpoint", endpoint), ("region", region), ("payload", &payload)] {
                    if let Some(value) = value {
                        url.push(sep);
                        url.push_str(name);
                        url.push('=');
                        url.push_str(&encode_query_value(value));
                        sep = '&';
                    }
                }
                url
            }
            BackendSpec::File { path } => match Url::from_file_path(path) {
                Ok(url) => url.to_string(),
                Err(()) => format!("file://{}", path.display()),
            },
        }
    }
}

impl fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_url())
    }
}

impl FromStr for BackendSpec {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<BackendSpec, BackendError> {
        BackendSpec::parse(s)
    }
}

fn parse_s3(url: &Url) -> Result<BackendSpec, String> {
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials do not belong in the URL (it is printed and logged); put them in the store \
                    config or the AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables"
            .into());
    }
    let bucket = url.host_str().unwrap_or_default();
    if bucket.is_empty() {
        return Err(format!("no bucket name; {EXPECTED}"));
    }
    if url.port().is_some() {
        return Err(format!(
            "s3:// takes a bucket name, not host:port; give the server as ?endpoint=http://{bucket}:{}",
            url.port().unwrap_or_default()
        ));
    }
    if let Some(c) = bucket.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))) {
        return Err(format!(
            "bucket name {bucket:?} contains {c:?}; bucket names use letters, digits, '.', '-' and '_'"
        ));
    }
    if url.fragment().is_some() {
        return Err("a '#fragment' is not allowed".into());
    }
    let prefix = parse_prefix(url.path())?;

    let mut endpoint = None;
    let mut region = None;
    let mut payload = None;
    for (name, value) in url.query_pairs() {
        let slot = match name.as_ref() {
            "endpoint" => &mut endpoint,
            "region" => &mut region,
            "payload" => &mut payload,
            other => {
                return Err(format!("unknown parameter {other:?}; the known ones are endpoint, region and payload"));
            }
        };
        if slot.is_some() {
            return Err(format!("parameter {name:?} is given twice"));
        }
        if value.is_empty() {
            return Err(format!("parameter {name:?} is empty"));
        }
        *slot = Some(value.into_owned());
    }
    let endpoint = endpoint.map(|e| check_endpoint(&e)).transpose()?;
    if let Some(r) = &region {
        if let Some(c) = r.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))) {
            return Err(format!("region {r:?} contains {c:?}"));
        }
    }
    let payload = match payload {
        None => PayloadCheck::default(),
        Some(p) => PayloadCheck::parse(&p).ok_or_else(|| {
            format!("payload={p:?} is not one of crc64nvme (the default) or signed (SigV4 signs the body's SHA-256)")
        })?,
    };
    Ok(BackendSpec::S3 { bucket: bucket.to_string(), prefix, endpoint, region, payload })
}

/// Whether the path of a raw URL has a `.` or `..` segment (also percent-encoded).
fn has_dot_segment(raw: &str) -> bool {
    let Some((_, rest)) = raw.split_once("://") else { return false };
    let path = rest.split(['?', '#']).next().unwrap_or_default();
    path.split('/').any(|segment| {
        let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
        decoded == "." || decoded == ".."
    })
}

/// The prefix from a URL path: segments separated by '/', leading and trailing '/' ignored.
fn parse_prefix(path: &str) -> Result<String, String> {
    let trimmed = path.trim_start_matches('/').trim_end_matches('/');
    if trimmed.is_empty() {
        return Ok(String::new());
    }
    for segment in trimmed.split('/') {
        check_segment(segment).map_err(|reason| format!("prefix {trimmed:?}: {reason}"))?;
    }
    Ok(trimmed.to_string())
}

/// One path segment of a prefix or key: `[A-Za-z0-9._=-]+`, not `.` or `..`.
pub(crate) fn check_segment(segment: &str) -> Result<(), String> {
    if segment.is_empty() {
        return Err("empty path segment ('//')".into());
    }
    if segment == "." || segment == ".." {
        return Err(format!("{segment:?} is not allowed as a path segment"));
    }
    if let Some(c) = segment.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '=' | '-'))) {
        return Err(format!("{c:?} is not allowed (use letters, digits, '.', '_', '=' and '-')"));
    }
    Ok(())
}

fn check_endpoint(endpoint: &str) -> Result<String, String> {
    if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
        return Err(format!("endpoint {endpoint:?} must start with http:// or https:// (e.g. http://127.0.0.1:9000)"));
    }
    let url = Url::parse(endpoint).map_err(|e| format!("endpoint {endpoint:?} is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("endpoint {endpoint:?} must start with http:// or https://"));
    }
    if url.host_str().unwrap_or_default().is_empty() {
        return Err(format!("endpoint {endpoint:?} has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("credentials do not belong in the endpoint URL; put them in the store config or the \
                    AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables"
            .into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!("endpoint {endpoint:?} must not have a query or fragment (percent-encode it)"));
    }
    Ok(endpoint.trim_end_matches('/').to_string())
}

fn parse_file(url: &Url) -> Result<BackendSpec, String> {
    let host = url.host_str().unwrap_or_default();
    if !host.is_empty() && host != "localhost" {
        return Err(format!(
            "file:// URLs take an absolute path with three slashes, file:///abs/path; {host:?} was read as a host name"
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("file:// URLs take no parameters".into());
    }
    let path = url.to_file_path().map_err(|()| format!("not an absolute local path; {EXPECTED}"))?;
    if path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err("the path must not contain '.' or '..'".into());
    }
    // Rebuilding from components drops a trailing '/' so equal directories compare equal.
    Ok(BackendSpec::File { path: path.components().collect() })
}

/// Percent-encodes what `query_pairs` would otherwise split or decode, leaving URLs readable.
fn encode_query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if c.is_ascii_alphanumeric() || ":/.-_~@[]!$'()*,;".contains(c) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// Credentials from the store config; any `None` falls back to the standard `AWS_*` environment
/// variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`). `Debug` never
/// prints the secret or the token.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token: Option<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redact = |s: &Option<String>| if s.is_some() { "Some(<redacted>)" } else { "None" };
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &format_args!("{}", redact(&self.secret_access_key)))
            .field("session_token", &format_args!("{}", redact(&self.session_token)))
            .finish()
    }
}

/// Credentials and region after the environment fallbacks, ready for the S3 client.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ResolvedCredentials {
    /// `None`: no static keys; the S3 client's own chain (web identity, container, instance
    /// metadata) is used.
    pub static_keys: Option<(String, String, Option<String>)>,
    pub region: String,
}

impl Credentials {
    /// Applies the environment fallbacks. `env` is injected so tests need not touch the process
    /// environment. A session token from the environment is only used with the access key from
    /// the environment: it is meaningless with a different key.
    pub(crate) fn resolve(
        &self,
        region: Option<&str>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedCredentials, BackendError> {
        let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
        let (key, key_from_env) = match nonempty(self.access_key_id.clone()) {
            Some(k) => (Some(k), false),
            None => (nonempty(env("AWS_ACCESS_KEY_ID")), true),
        };
        let secret = nonempty(self.secret_access_key.clone()).or_else(|| nonempty(env("AWS_SECRET_ACCESS_KEY")));
        let token = match nonempty(self.session_token.clone()) {
            Some(t) => Some(t),
            None if key_from_env => nonempty(env("AWS_SESSION_TOKEN")),
            None => None,
        };
        let static_keys = match (key, secret) {
            (Some(k), Some(s)) => Some((k, s, token)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(BackendError::BadConfig(
                    "an S3 access key id is set but no secret access key: set secret_access_key in the store \
                     config or AWS_SECRET_ACCESS_KEY"
                        .into(),
                ));
            }
            (None, Some(_)) => {
                return Err(BackendError::BadConfig(
                    "an S3 secret access key is set but no access key id: set access_key_id in the store config \
                     or AWS_ACCESS_KEY_ID"
                        .into(),
                ));
            }
        };
        let region = region
            .map(str::to_string)
            .or_else(|| nonempty(env("AWS_REGION")))
            .or_else(|| nonempty(env("AWS_DEFAULT_REGION")))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        Ok(ResolvedCredentials { static_keys, region })
    }
}

/// Request policy of one backend.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    /// Upper bound of one attempt of a request, body included (default 30 s). Retries only
    /// start while the request has run for less than this, so a request as a whole ends within
    /// about twice this plus backoff.
    pub request_timeout: Duration,
    /// Upper bound of establishing a connection (default 5 s).
    pub connect_timeout: Duration,
    /// Retries of a transient failure (default 3), exponential backoff with jitter. Missing
    /// objects, refused credentials and a missing bucket are never retried.
    pub max_retries: u32,
    /// First backoff delay (default 100 ms); doubles per retry.
    pub retry_base: Duration,
    /// Consecutive failed requests that trip the circuit breaker (default 5; 0 disables it).
    pub breaker_threshold: u32,
    /// How long a tripped breaker rejects requests before one probe is let through (default 5 s).
    pub breaker_probe_after: Duration,
}

impl Default for BackendOptions {
    fn default() -> BackendOptions {
        BackendOptions {
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_retries: 3,
            retry_base: Duration::from_millis(100),
            breaker_threshold: 5,
            breaker_probe_after: Duration::from_secs(5),
        }
    }
}

impl BackendOptions {
    /// Millisecond-scale timeouts and backoff for tests of this and higher layers, so that
    /// failure paths (retries, breaker trips and probes) run in milliseconds.
    pub fn for_tests() -> BackendOptions {
        BackendOptions {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            max_retries: 2,
            retry_base: Duration::from_millis(1),
            breaker_threshold: 5,
            breaker_probe_after: Duration::from_millis(20),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s3(bucket: &str, prefix: &str, endpoint: Option<&str>, region: Option<&str>) -> BackendSpec {
        BackendSpec::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
            endpoint: endpoint.map(Into::into),
            region: region.map(Into::into),
            payload: PayloadCheck::Crc64Nvme,
        }
    }

    fn signed(spec: BackendSpec) -> BackendSpec {
        match spec {
            BackendSpec::S3 { bucket, prefix, endpoint, region, .. } => {
                BackendSpec::S3 { bucket, prefix, endpoint, region, payload: PayloadCheck::Signed }
            }
            file => file,
        }
    }

    #[test]
    fn parses_good_urls() {
        let cases = [
            ("s3://bucket", s3("bucket", "", None, None)),
            ("s3://bucket/", s3("bucket", "", None, None)),
            ("s3://bucket/a/b/", s3("bucket", "a/b", None, None)),
            (
                "s3://b/p?endpoint=http://127.0.0.1:9001&region=us-east-1",
                s3("b", "p", Some("http://127.0.0.1:9001"), Some("us-east-1")),
            ),
            ("s3://b/p?region=eu-west-3", s3("b", "p", None, Some("eu-west-3"))),
            ("s3://b/p?payload=signed&region=r", signed(s3("b", "p", None, Some("r")))),
            ("s3://b/p?payload=crc64nvme", s3("b", "p", None, None)),
            ("s3://b?endpoint=https%3A%2F%2Fs3.example.com%2F", s3("b", "", Some("https://s3.example.com"), None)),
            (" s3://my.bucket-1/team_a/ws=1 ", s3("my.bucket-1", "team_a/ws=1", None, None)),
            ("file:///var/lib/tierfs", BackendSpec::File { path: "/var/lib/tierfs".into() }),
            ("file:///var/lib/tierfs/", BackendSpec::File { path: "/var/lib/tierfs".into() }),
            ("file://localhost/tmp/x", BackendSpec::File { path: "/tmp/x".into() }),
            ("file:///tmp/with%20space", BackendSpec::File { path: "/tmp/with space".into() }),
        ];
        for (url, want) in cases {
            assert_eq!(BackendSpec::parse(url).unwrap(), want, "{url}");
        }
    }

    #[test]
    fn rejects_bad_urls_with_a_reason() {
        let cases = [
            ("", "not a URL"),
            ("bucket/prefix", "not a URL"),
            ("/abs/path", "not a URL"),
            ("http://host/bucket", "unsupported scheme"),
            ("gs://bucket", "unsupported scheme"),
            ("s3://", "no bucket"),
            ("s3:///prefix", "no bucket"),
            ("s3://host:9000/bucket", "?endpoint=http://host:9000"),
            ("s3://key:secret@bucket/p", "credentials do not belong"),
            ("s3://b/p?endpoint=http://k:s@127.0.0.1:9000", "credentials do not belong"),
            ("s3://b/a//b", "empty path segment"),
            ("s3://b/a/../b", "not allowed"),
            ("s3://b/a/%2E/b", "not allowed"),
            ("file:///a/../b", "not allowed"),
            ("s3://b/a%2Fb", "not allowed"),
            ("s3://b/p?endpont=http://x", "unknown parameter \"endpont\""),
            ("s3://b/p?region=a&region=b", "given twice"),
            ("s3://b/p?region=", "empty"),
            ("s3://b/p?payload=sha256", "not one of crc64nvme"),
            ("s3://b/p?endpoint=ftp://x", "http:// or https://"),
            ("s3://b/p?endpoint=127.0.0.1:9000", "http:// or https://"),
            ("s3://b/p#frag", "fragment"),
            ("s3://b_%21/p", "bucket name"),
            ("file://relative/path", "three slashes"),
            ("file:///tmp/x?y=1", "no parameters"),
        ];
        for (url, needle) in cases {
            let err = BackendSpec::parse(url).expect_err(url);
            let msg = err.to_string();
            assert!(matches!(err, BackendError::BadUrl { .. }), "{url}: {err:?}");
            assert!(msg.contains(needle), "{url}: {msg:?} lacks {needle:?}");
        }
    }

    #[test]
    fn to_url_is_canonical_and_readable() {
        let spec = s3("b", "p/q", Some("http://127.0.0.1:9001"), Some("us-east-1"));
        assert_eq!(spec.to_url(), "s3://b/p/q?endpoint=http://127.0.0.1:9001&region=us-east-1");
        assert_eq!(spec.to_string(), spec.to_url());
        assert_eq!(BackendSpec::File { path: "/tmp/a b".into() }.to_url(), "file:///tmp/a%20b");
        assert_eq!(
            signed(s3("b", "", None, Some("r"))).to_url(),
            "s3://b?region=r&payload=signed",
            "only a payload check other than the default is written"
        );
        let odd = s3("b", "", Some("http://h:1/a&b=c d"), None);
        assert_eq!(BackendSpec::parse(&odd.to_url()).unwrap(), odd);
    }

    proptest! {
        #[test]
        fn parse_inverts_to_url(
            bucket in "[a-z0-9][a-z0-9.-]{0,20}",
            prefix in proptest::collection::vec("[A-Za-z0-9._=-]{1,8}", 0..4),
            port in proptest::option::of(1u16..),
            region in proptest::option::of("[a-z]{2}-[a-z]{2,8}-[0-9]"),
            sign in any::<bool>(),
            dir in proptest::collection::vec("[A-Za-z0-9 _%-]{1,8}", 0..4),
        ) {
            let prefix: Vec<String> = prefix.into_iter().filter(|s| s != "." && s != "..").collect();
            let spec = BackendSpec::S3 {
                bucket,
                prefix: prefix.join("/"),
                endpoint: port.map(|p| format!("http://127.0.0.1:{p}")),
                region,
                payload: if sign { PayloadCheck::Signed } else { PayloadCheck::Crc64Nvme },
            };
            prop_assert_eq!(BackendSpec::parse(&spec.to_url()).unwrap(), spec);
            let file = BackendSpec::File { path: PathBuf::from("/").join(dir.join("/")) };
            prop_assert_eq!(BackendSpec::parse(&file.to_url()).unwrap(), file);
        }
    }

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn credentials_fall_back_to_the_environment() {
        let env = env_of(&[
            ("AWS_ACCESS_KEY_ID", "envkey"),
            ("AWS_SECRET_ACCESS_KEY", "envsecret"),
            ("AWS_SESSION_TOKEN", "envtoken"),
            ("AWS_DEFAULT_REGION", "eu-north-1"),
        ]);
        let r = Credentials::default().resolve(None, &env).unwrap();
        assert_eq!(r.static_keys, Some(("envkey".into(), "envsecret".into(), Some("envtoken".into()))));
        assert_eq!(r.region, "eu-north-1");

        // A configured key does not pick up the environment's session token (it belongs to another key).
        let creds =
            Credentials { access_key_id: Some("k".into()), secret_access_key: Some("s".into()), session_token: None };
        let r = creds.resolve(Some("us-west-2"), &env).unwrap();
        assert_eq!(r.static_keys, Some(("k".into(), "s".into(), None)));
        assert_eq!(r.region, "us-west-2");

        let none = env_of(&[]);
        let r = Credentials::default().resolve(None, &none).unwrap();
        assert!(r.static_keys.is_none());
        assert_eq!(r.region, DEFAULT_REGION);
        let r =
            Credentials::default().resolve(None, &env_of(&[("AWS_REGION", "ap-south-1"), ("AWS_DEFAULT_REGION", "x")]));
        assert_eq!(r.unwrap().region, "ap-south-1");

        let half = Credentials { access_key_id: Some("k".into()), ..Default::default() };
        let err = half.resolve(None, &none).err().unwrap();
        assert!(err.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{err}");
    }

    #[test]
    fn credentials_debug_hides_secrets() {
        let creds = Credentials {
            access_key_id: Some("AKIA".into()),
            secret_access_key: Some("very-secret".into()),
            session_token: Some("tok-secret".into()),
        };
        let shown = format!("{creds:?}");
        assert!(shown.contains("AKIA") && !shown.contains("very-secret") && !shown.contains("tok-secret"), "{shown}");
    }
}
