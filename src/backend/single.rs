//! [`Backend`]: one object store (an `object_store` client plus a key prefix) made dependable
//! enough to build redundancy on: every request has a timeout, transient failures are retried
//! with exponential backoff and jitter, and a circuit breaker turns a dead backend into an
//! immediate `Unavailable` instead of a timeout per request.
//!
//! Invariants and why:
//! - Keys are relative (`packs/ab/abcd…`) and restricted to `[A-Za-z0-9._=-]` segments (see
//!   `spec.rs`): every store then names objects identically, so listings return exactly the keys
//!   written. The spec's prefix is prepended here and stripped from listings.
//! - Retries: for S3 the `object_store` client retries (it knows which HTTP failures are
//!   retryable and which requests are idempotent) and this layer makes one attempt under an
//!   overall deadline; for every other store this layer retries. Either way a request is retried
//!   at most `max_retries` times (never by both), and no retry starts once the request has run
//!   for `request_timeout`, so a dead or hung backend costs a bounded time per request.
//! - The breaker counts *requests* (after their retries), not attempts. Answers that prove the
//!   backend works (not found, already exists) count as successes; a missing object is never
//!   retried and never trips the breaker.
//! - Every request is counted once, by method, with its latency from admission to outcome
//!   (retries and backoff included) and whether it failed; retries, refusals by the open
//!   breaker, and the bytes sent and received are counted beside ([`BackendTraffic`], read by
//!   status and the node's metrics). For S3 the client's own retries happen inside one attempt
//!   and are not seen here.
//! - A whole-object GET states its limit ([`SizeLimit`]): the size in the answer's metadata is
//!   checked before the body is read, and the body is read into no more than that size, so
//!   a store cannot make this layer allocate more than the caller allowed.
//! - Bytes are opaque (already encrypted by the caller); this layer never checks content. Tests
//!   inject faults below it, by wrapping the store it is given (`backend::faulty`); nothing
//!   here knows of them.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, Checksum, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, GetResult, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig,
};
use serde::{Deserialize, Serialize};

use super::breaker::{CircuitBreaker, Refusal};
use super::error::BackendError;
use super::limit::SizeLimit;
use super::spec::{BackendOptions, BackendSpec, Credentials, PayloadCheck, check_segment};
use crate::telemetry::{OpSnapshot, OpStats};

/// One backend's state, for status displays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendHealth {
    pub name: String,
    pub available: bool,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    /// Requests sent to it since the process started.
    #[serde(default)]
    pub traffic: BackendTraffic,
}

/// What a backend was asked since the process started.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendTraffic {
    /// Per method ([`METHODS`]): requests, failed ones, latency.
    pub requests: Vec<OpSnapshot>,
    /// Attempts made again after a transient failure (by this layer; see the module docs).
    pub retries: u64,
    /// Requests the open circuit breaker refused without sending.
    pub refused: u64,
    /// Object bytes received (gets) and sent (puts) by requests that succeeded.
    pub received_bytes: u64,
    pub sent_bytes: u64,
}

/// The methods requests are counted by, in [`BackendTraffic::requests`] order.
pub const METHODS: [&str; 6] = ["get", "get_range", "put", "put_if_absent", "delete", "list"];

/// The counters behind [`BackendTraffic`].
#[derive(Default)]
struct Traffic {
    methods: [OpStats; METHODS.len()],
    retries: AtomicU64,
    refused: AtomicU64,
    received_bytes: AtomicU64,
    sent_bytes: AtomicU64,
}

impl Traffic {
    fn snapshot(&self) -> BackendTraffic {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BackendTraffic {
            requests: self.methods.iter().zip(METHODS).map(|(m, name)| m.snapshot(name)).collect(),
            retries: load(&self.retries),
            refused: load(&self.refused),
            received_bytes: load(&self.received_bytes),
            sent_bytes: load(&self.sent_bytes),
        }
    }
}

/// One object stored on a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key relative to the backend's prefix.
    pub key: String,
    pub size: u64,
}

/// One backend: an object_store client + key prefix, with per-request timeouts, retries with
/// backoff, and a circuit breaker. `Send + Sync`; share it behind an `Arc`.
pub struct Backend {
    name: String,
    /// The server, for messages ("cannot connect to http://…").
    endpoint: Option<String>,
    store: Arc<dyn ObjectStore>,
    /// Key prefix inside the store, "" or "a/b" (no slashes at the ends).
    root: String,
    retry_base: Duration,
    /// Retries done by this layer (0 when the client retries itself).
    layer_retries: u32,
    /// No retry starts once a request has run this long.
    retry_budget: Duration,
    /// Deadline of one attempt of this layer (covers the client's own retries, if any).
    attempt_timeout: Duration,
    breaker: CircuitBreaker,
    traffic: Traffic,
}

/// What a request does, to word its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Get,
    GetRange,
    Put,
    PutIfAbsent,
    Delete,
    List,
    Check,
}

impl Op {
    fn describe(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::GetRange => "range get",
            Op::Put => "put",
            Op::PutIfAbsent => "conditional create (If-None-Match: *)",
            Op::Delete => "delete",
            Op::List => "list",
            Op::Check => "list",
        }
    }

    /// Its index in [`METHODS`].
    fn method(self) -> usize {
        match self {
            Op::Get => 0,
            Op::GetRange => 1,
            Op::Put => 2,
            Op::PutIfAbsent => 3,
            Op::Delete => 4,
            Op::List | Op::Check => 5,
        }
    }
}

/// How a failed attempt counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// The backend answered definitively (not found, exists): a success for the breaker, no retry.
    Definite,
    /// A problem of the request itself (bad key, unsupported): neither retried nor counted.
    Neutral,
    /// The backend is unusable as configured (access denied, no bucket): counted, not retried.
    Permanent,
    /// Might work next time: retried, counted.
    Transient,
}

impl Backend {
    /// Opens the backend a spec names. Nothing is sent over the network (see [`Backend::check`]);
    /// for `file://` the directory is created if missing.
    pub fn open(spec: &BackendSpec, creds: &Credentials, opts: &BackendOptions) -> Result<Backend, BackendError> {
        let name = spec.to_url();
        match spec {
            BackendSpec::S3 { bucket, prefix, endpoint, region, payload } => {
                let resolved = creds.resolve(region.as_deref(), &|var| std::env::var(var).ok())?;
                let (retry, deadline) = s3_retry(opts);
                let mut builder = AmazonS3Builder::new()
                    .with_bucket_name(bucket)
                    .with_region(&resolved.region)
                    .with_retry(retry)
                    .with_client_options(
                        ClientOptions::new()
                            .with_timeout(opts.request_timeout)
                            .with_connect_timeout(opts.connect_timeout),
                    )
                    .with_conditional_put(S3ConditionalPut::ETagMatch);
                builder = match payload {
                    PayloadCheck::Crc64Nvme => {
                        builder.with_unsigned_payload(true).with_checksum_algorithm(Checksum::CRC64NVME)
                    }
                    PayloadCheck::Signed => builder.with_unsigned_payload(false),
                };
                if let Some(endpoint) = endpoint {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_allow_http(endpoint.starts_with("http://"))
                        .with_virtual_hosted_style_request(false);
                }
                match resolved.static_keys {
                    Some((key, secret, token)) => {
                        builder = builder.with_access_key_id(key).with_secret_access_key(secret);
                        if let Some(token) = token {
                            builder = builder.with_token(token);
                        }
                    }
                    None => {
                        // No static keys: let the client's chain find them (web identity on
                        // Kubernetes, container credentials, instance metadata).
                        for (var, key) in [
                            ("AWS_WEB_IDENTITY_TOKEN_FILE", AmazonS3ConfigKey::WebIdentityTokenFile),
                            ("AWS_ROLE_ARN", AmazonS3ConfigKey::RoleArn),
                            ("AWS_ROLE_SESSION_NAME", AmazonS3ConfigKey::RoleSessionName),
                            (
                                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                                AmazonS3ConfigKey::ContainerCredentialsRelativeUri,
                            ),
                        ] {
                            if let Ok(value) = std::env::var(var) {
                                builder = builder.with_config(key, value);
                            }
                        }
                        if endpoint.is_some() {
                            tracing::warn!(
                                backend = %name,
                                "no S3 access key configured (store config or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); \
                                 falling back to cloud instance credentials, which S3-compatible servers rarely accept"
                            );
                        }
                    }
                }
                let store = builder
                    .build()
                    .map_err(|e| BackendError::BadConfig(format!("cannot set up the S3 client for {name}: {e}")))?;
                Ok(Backend::assemble(name, endpoint.clone(), Arc::new(store), prefix.clone(), opts, 0, deadline))
            }
            BackendSpec::File { path } => {
                std::fs::create_dir_all(path).map_err(|source| BackendError::Io {
                    what: format!("cannot create the directory {} for backend {name}", path.display()),
                    source,
                })?;
                let store = LocalFileSystem::new_with_prefix(path)
                    .map_err(|e| BackendError::Io {
                        what: format!("cannot open backend {name}"),
                        source: io_error_of(e),
                    })?
                    // A file backend promises durability once a put returns, like S3 does.
                    .with_fsync(true);
                let retries = opts.max_retries;
                Ok(Backend::assemble(name, None, Arc::new(store), String::new(), opts, retries, opts.request_timeout))
            }
        }
    }

    /// Wraps any object_store implementation (tests: `object_store::memory::InMemory`). This
    /// layer does the retries, so pass a store that does not retry itself.
    pub fn from_object_store(name: String, store: Arc<dyn ObjectStore>, opts: BackendOptions) -> Backend {
        let retries = opts.max_retries;
        let timeout = opts.request_timeout;
        Backend::assemble(name, None, store, String::new(), &opts, retries, timeout)
    }

    fn assemble(
        name: String,
        endpoint: Option<String>,
        store: Arc<dyn ObjectStore>,
        root: String,
        opts: &BackendOptions,
        layer_retries: u32,
        attempt_timeout: Duration,
    ) -> Backend {
        Backend {
            name,
            endpoint,
            store,
            root,
            retry_base: opts.retry_base,
            layer_retries,
            retry_budget: opts.request_timeout,
            attempt_timeout,
            breaker: CircuitBreaker::new(opts.breaker_threshold, opts.breaker_probe_after),
            traffic: Traffic::default(),
        }
    }

    /// The backend's URL (or the name given to [`Backend::from_object_store`]); holds no secret.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The breaker is closed, or open but a probe is due (the next request would be sent).
    pub fn is_available(&self) -> bool {
        self.breaker.is_available()
    }

    /// Breaker state for status reports.
    pub fn health(&self) -> BackendHealth {
        let s = self.breaker.snapshot();
        BackendHealth {
            name: self.name.clone(),
            available: s.available,
            consecutive_failures: s.consecutive_failures,
            last_error: s.last_error,
            traffic: self.traffic.snapshot(),
        }
    }

    /// Stores `data` at `key`, replacing what was there.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), BackendError> {
        let path = self.path(key)?;
        let (store, path, data) = (&self.store, &path, &data);
        self.run(Op::Put, key, move || {
            let payload = PutPayload::from_bytes(data.clone());
            async move { store.put_opts(path, payload, PutOptions::default()).await.map(drop) }
        })
        .await?;
        self.traffic.sent_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Conditional create (If-None-Match: *): `Ok(true)` created, `Ok(false)` it already existed.
    ///
    /// An object that already holds exactly `data` also gives `Ok(true)`: an attempt of this very
    /// call may have landed before a retry. Callers that must tell the difference (leases) make
    /// their contents unique, e.g. with a nonce.
    pub async fn put_if_absent(&self, key: &str, data: Bytes) -> Result<bool, BackendError> {
        let path = self.path(key)?;
        let (store, path_ref, data_ref) = (&self.store, &path, &data);
        let outcome = self
            .run(Op::PutIfAbsent, key, move || {
                let payload = PutPayload::from_bytes(data_ref.clone());
                let opts = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
                async move { store.put_opts(path_ref, payload, opts).await.map(drop) }
            })
            .await;
        match outcome {
            Ok(()) => {
                self.traffic.sent_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(true)
            }
            // Anything longer than `data` is not `data`: not read.
            Err(BackendError::AlreadyExists { .. }) => match self.fetch(key, data.len() as u64).await {
                Ok(Fetched::Whole(existing)) => Ok(existing == data),
                Ok(Fetched::TooLarge(_) | Fetched::Overran(_)) => Ok(false),
                // Deleted in between: report what we saw, it existed.
                Err(e) if e.is_not_found() => Ok(false),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    }

    /// The whole object, if it is no larger than `limit`. Missing → [`BackendError::NotFound`]
    /// (not retried, doesn't trip the breaker); larger, or a body that runs past the size the
    /// store stated → [`BackendError::Corrupt`] naming the key and both sizes, with no more
    /// than the stated size read (see `limit.rs`).
    pub async fn get(&self, key: &str, limit: SizeLimit) -> Result<Bytes, BackendError> {
        match self.fetch(key, limit.max_len).await? {
            Fetched::Whole(bytes) => Ok(bytes),
            Fetched::TooLarge(size) => Err(BackendError::Corrupt { key: key.to_string(), reason: limit.refusal(size) }),
            Fetched::Overran(stated) => Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!("its body ran past the {stated} bytes the store stated for it"),
            }),
        }
    }

    /// One whole-object GET whose body is read only if the stated size is at most `max_len`,
    /// and only up to that size.
    async fn fetch(&self, key: &str, max_len: u64) -> Result<Fetched, BackendError> {
        let path = self.path(key)?;
        let (store, path) = (&self.store, &path);
        let fetched = self
            .run(Op::Get, key, move || {
                let (store, path) = (store.clone(), path.clone());
                on_runtime(
                    async move { read_bounded(store.get_opts(&path, GetOptions::default()).await?, max_len).await },
                )
            })
            .await?;
        if let Fetched::Whole(bytes) = &fetched {
            self.traffic.received_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        Ok(fetched)
    }

    /// Bytes `range` of the object; a range reaching past its end is [`BackendError::Corrupt`]
    /// (the caller knows the object's length, so a shorter object is a damaged one).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BackendError> {
        if range.start > range.end {
            return Err(BackendError::BadRange { key: key.to_string(), range: range.clone(), len: range.end });
        }
        let path = self.path(key)?;
        if range.is_empty() {
            return Ok(Bytes::new());
        }
        let (store, path, r) = (&self.store, &path, &range);
        let bytes = self
            .run(Op::GetRange, key, move || {
                let (store, path) = (store.clone(), path.clone());
                let opts = GetOptions { range: Some(GetRange::Bounded(r.clone())), ..GetOptions::default() };
                on_runtime(async move { store.get_opts(&path, opts).await?.bytes().await })
            })
            .await?;
        self.traffic.received_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let want = range.end - range.start;
        if bytes.len() as u64 != want {
            return Err(BackendError::Corrupt {
                key: key.to_string(),
                reason: format!(
                    "{} returned {} bytes for range {}..{} (the object is shorter than expected)",
                    self.name,
                    bytes.len(),
                    range.start,
                    range.end
                ),
            });
        }
        Ok(bytes)
    }

    /// Removes the object; a missing one is fine.
    pub async fn delete(&self, key: &str) -> Result<(), BackendError> {
        let path = self.path(key)?;
        let (store, path) = (&self.store, &path);
        match self.run(Op::Delete, key, move || async move { store.delete(path).await }).await {
            Err(e) if e.is_not_found() => Ok(()),
            other => other,
        }
    }

    /// Every object under `prefix`, which is a key path: `"packs"` and `"packs/"` both list
    /// `packs/…` (path segments, not a string prefix: `"pack"` does not match `packs/…`);
    /// `""` lists the whole backend. Keys come back relative, in no particular order.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, BackendError> {
        self.list_after(prefix, None).await
    }

    /// Like [`Backend::list`], only keys sorting after `after` (a full key under `prefix`):
    /// the server skips the rest (S3 `start-after`), so a long listing is not read again.
    pub async fn list_after(&self, prefix: &str, after: Option<&str>) -> Result<Vec<ObjectInfo>, BackendError> {
        let trimmed = prefix.trim_end_matches('/');
        let dir = if trimmed.is_empty() { self.root_path() } else { Some(self.path(trimmed)?) };
        let offset = after.map(|a| self.path(a)).transpose()?;
        let (store, dir, offset, timeout) = (&self.store, &dir, &offset, self.attempt_timeout);
        let metas = self
            .run(Op::List, prefix, move || async move {
                let mut stream = match offset {
                    Some(off) => store.list_with_offset(dir.as_ref(), off),
                    None => store.list(dir.as_ref()),
                };
                let mut out = Vec::new();
                // Each page has the full timeout: a listing of a big prefix takes many pages.
                loop {
                    match tokio::time::timeout(timeout, stream.next()).await {
                        Ok(Some(item)) => out.push(item?),
                        Ok(None) => return Ok(out),
                        Err(_) => return Err(page_timeout()),
                    }
                }
            })
            .await?;
        let mut objects = Vec::with_capacity(metas.len());
        for meta in metas {
            let location = meta.location.as_ref();
            let key = if self.root.is_empty() {
                Some(location)
            } else {
                location.strip_prefix(self.root.as_str()).and_then(|k| k.strip_prefix('/'))
            };
            match key {
                Some(key) if !key.is_empty() => objects.push(ObjectInfo { key: key.to_string(), size: meta.size }),
                _ => tracing::debug!(backend = %self.name, %location, "listing returned a key outside the prefix"),
            }
        }
        Ok(objects)
    }

    /// Cheap reachability check for `tierfs init`/status: lists at most one object under the
    /// prefix, one attempt, no breaker. The error names the backend and what to check.
    pub async fn check(&self) -> Result<(), BackendError> {
        let root = self.root_path();
        let deadline = self.attempt_timeout;
        let attempt = async {
            let mut stream = self.store.list(root.as_ref());
            match stream.next().await {
                Some(Err(e)) => Err(e),
                _ => Ok(()),
            }
        };
        match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(self.classify(Op::Check, "", e).0),
            Err(_) => Err(BackendError::Timeout { backend: self.name.clone() }),
        }
    }

    fn root_path(&self) -> Option<Path> {
        if self.root.is_empty() { None } else { Some(Path::from(self.root.as_str())) }
    }

    /// The store path of a relative key, validated.
    fn path(&self, key: &str) -> Result<Path, BackendError> {
        validate_key(key)?;
        let full = if self.root.is_empty() { key.to_string() } else { format!("{}/{key}", self.root) };
        Path::parse(&full).map_err(|e| BackendError::BadKey { key: key.to_string(), reason: e.to_string() })
    }

    /// Runs one request: breaker admission, attempts under a deadline, retries with backoff
    /// for transient failures, and the outcome reported to the breaker.
    async fn run<T, F, Fut>(&self, op: Op, key: &str, mut attempt: F) -> Result<T, BackendError>
    where
        F: FnMut() -> Fut + Send,
        Fut: Future<Output = object_store::Result<T>> + Send,
        T: Send,
    {
        let permit = match self.breaker.admit() {
            Ok(permit) => permit,
            Err(refusal) => {
                self.traffic.refused.fetch_add(1, Ordering::Relaxed);
                return Err(self.refused(refusal));
            }
        };
        let mut tries = 0u32;
        let started = Instant::now();
        let result = loop {
            let outcome = match tokio::time::timeout(self.attempt_timeout, attempt()).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(self.classify(op, key, e)),
                Err(_) => Err((BackendError::Timeout { backend: self.name.clone() }, Class::Transient)),
            };
            match outcome {
                Err((e, Class::Transient)) if tries < self.layer_retries && started.elapsed() < self.retry_budget => {
                    tries += 1;
                    self.traffic.retries.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(backend = %self.name, key, op = op.describe(), attempt = tries, error = %e, "retrying");
                    tokio::time::sleep(self.backoff(tries)).await;
                }
                other => break other,
            }
        };
        let failed = matches!(result, Err((_, Class::Neutral | Class::Permanent | Class::Transient)));
        self.traffic.methods[op.method()].record(started.elapsed(), failed);
        // Every request with its time (RUST_LOG=tierfs::backend=trace): how a mount's or a
        // refill's requests line up, which a server's own log (whole seconds) cannot show.
        tracing::trace!(backend = %self.name, key, op = op.describe(), failed, micros = started.elapsed().as_micros() as u64, "request");
        match result {
            Ok(v) => {
                permit.succeeded();
                Ok(v)
            }
            Err((e, Class::Definite)) => {
                permit.succeeded();
                Err(e)
            }
            Err((e, Class::Neutral)) => {
                drop(permit);
                Err(e)
            }
            Err((e, Class::Permanent | Class::Transient)) => {
                tracing::debug!(backend = %self.name, key, op = op.describe(), error = %e, "request failed");
                permit.failed(e.to_string());
                Err(e)
            }
        }
    }

    /// Exponential backoff with jitter: uniformly in [d/2, d] for d = base·2^(n-1), capped.
    fn backoff(&self, retry: u32) -> Duration {
        let max = Duration::from_secs(30);
        let d = self.retry_base.saturating_mul(1u32 << retry.saturating_sub(1).min(20)).min(max);
        let nanos = d.as_nanos().min(u64::MAX as u128) as u64;
        if nanos < 2 {
            return d;
        }
        Duration::from_nanos(rand::random_range(nanos / 2..=nanos))
    }

    fn refused(&self, r: Refusal) -> BackendError {
        BackendError::Unavailable {
            backend: self.name.clone(),
            reason: format!(
                "tripped out after {} consecutive failed requests (last: {}); next probe in {:.1}s",
                r.consecutive_failures,
                r.last_error.as_deref().unwrap_or("unknown"),
                r.probe_in.as_secs_f64()
            ),
        }
    }

    /// Maps an `object_store` error to ours and to how it counts.
    fn classify(&self, op: Op, key: &str, err: object_store::Error) -> (BackendError, Class) {
        use object_store::Error as E;
        let backend = self.name.clone();
        let key = key.to_string();
        match err {
            E::NotFound { .. } if matches!(op, Op::Get | Op::GetRange | Op::Delete) => {
                (BackendError::NotFound { key }, Class::Definite)
            }
            E::NotFound { .. } => {
                let reason = "the bucket (or directory) does not exist — create it or fix the URL".to_string();
                (BackendError::Unavailable { backend, reason }, Class::Permanent)
            }
            E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
                (BackendError::AlreadyExists { backend, key }, Class::Definite)
            }
            E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
                let reason = root_cause(source.as_ref());
                (BackendError::AccessDenied { backend, key, reason }, Class::Permanent)
            }
            E::NotSupported { source } => {
                let reason = root_cause(source.as_ref());
                (BackendError::NotSupported { backend, operation: op.describe().into(), reason }, Class::Neutral)
            }
            E::NotImplemented { operation, .. } => {
                let reason = format!("{operation} is not implemented by this store");
                (BackendError::NotSupported { backend, operation: op.describe().into(), reason }, Class::Neutral)
            }
            E::InvalidPath { source } => (BackendError::BadKey { key, reason: source.to_string() }, Class::Neutral),
            other => self.transport_error(op, key, &other),
        }
    }

    fn transport_error(&self, op: Op, key: String, err: &object_store::Error) -> (BackendError, Class) {
        let backend = self.name.clone();
        let text = err.to_string();
        let s3 = S3Failure::parse(&text);
        let code = s3.as_ref().and_then(|f| f.code.as_deref());
        if op == Op::GetRange
            && (text.contains("Wanted range starting at")
                || code == Some("InvalidRange")
                || s3.as_ref().is_some_and(|f| f.status.starts_with("416")))
        {
            let reason = format!("{backend} holds fewer bytes than the requested range");
            return (BackendError::Corrupt { key, reason }, Class::Definite);
        }
        if code == Some("NoSuchBucket") {
            let reason = "the bucket does not exist — create it or fix the URL".to_string();
            return (BackendError::Unavailable { backend, reason }, Class::Permanent);
        }
        match http_error_kind(err) {
            Some(object_store::client::HttpErrorKind::Timeout) => (BackendError::Timeout { backend }, Class::Transient),
            Some(object_store::client::HttpErrorKind::Connect) => {
                let server = self.endpoint.as_deref().unwrap_or("the S3 endpoint");
                let reason = format!(
                    "cannot connect to {server}: {} — is the server running and the endpoint right?",
                    root_cause(err)
                );
                (BackendError::Unavailable { backend, reason }, Class::Transient)
            }
            _ => {
                let what =
                    if key.is_empty() { op.describe().to_string() } else { format!("{} of {key}", op.describe()) };
                let detail = s3.map_or(text, |f| f.to_string());
                let reason = format!("{what} failed: {detail}");
                (BackendError::Unavailable { backend, reason }, Class::Transient)
            }
        }
    }
}

/// The useful part of an S3 error response as `object_store` renders it: the HTTP status and
/// the `<Code>`/`<Message>` of the XML body (the full text is a long request dump).
struct S3Failure {
    status: String,
    code: Option<String>,
    message: Option<String>,
}

impl S3Failure {
    fn parse(text: &str) -> Option<S3Failure> {
        let status = text.split_once("status code: ")?.1;
        let status = status.split(':').next().unwrap_or_default().trim().to_string();
        let between = |open: &str, close: &str| {
            let start = text.find(open)? + open.len();
            let len = text[start..].find(close)?;
            Some(text[start..start + len].to_string())
        };
        Some(S3Failure { status, code: between("<Code>", "</Code>"), message: between("<Message>", "</Message>") })
    }
}

impl fmt::Display for S3Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {}", self.status)?;
        if let Some(code) = &self.code {
            write!(f, " {code}")?;
        }
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend").field("name", &self.name).field("available", &self.is_available()).finish()
    }
}

/// Checks a relative object key: non-empty `/`-separated segments of `[A-Za-z0-9._=-]`, no `.`
/// or `..`. Keys are chosen by tierfs itself, so a bad one is a bug, reported before any request.
pub(crate) fn validate_key(key: &str) -> Result<(), BackendError> {
    let bad = |reason: String| BackendError::BadKey { key: key.to_string(), reason };
    if key.is_empty() {
        return Err(bad("empty key".into()));
    }
    for segment in key.split('/') {
        check_segment(segment).map_err(bad)?;
    }
    Ok(())
}

/// The retry policy handed to the S3 client, and the overall deadline of one call through it.
fn s3_retry(opts: &BackendOptions) -> (RetryConfig, Duration) {
    let max_backoff = opts
        .retry_base
        .saturating_mul(1u32 << opts.max_retries.min(16))
        .clamp(opts.retry_base, Duration::from_secs(30));
    // Like this layer's own loop: no retry starts once the request has run for `request_timeout`,
    // so a request ends within about two request timeouts however many retries are allowed.
    let retry = RetryConfig {
        backoff: BackoffConfig { init_backoff: opts.retry_base, max_backoff, base: 2.0 },
        max_retries: opts.max_retries as usize,
        retry_timeout: opts.request_timeout,
    };
    let deadline =
        opts.request_timeout.saturating_mul(2).saturating_add(max_backoff).saturating_add(opts.connect_timeout);
    (retry, deadline)
}

fn page_timeout() -> object_store::Error {
    object_store::Error::Generic { store: "list", source: "timed out waiting for a listing page".into() }
}

/// The transport failure kind somewhere in an error's source chain, if any.
fn http_error_kind(err: &object_store::Error) -> Option<object_store::client::HttpErrorKind> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(http) = e.downcast_ref::<object_store::client::HttpError>() {
            return Some(http.kind());
        }
        current = e.source();
    }
    None
}

/// The innermost message of an error chain ("Connection refused (os error 111)").
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

/// What a whole-object GET brought back.
enum Fetched {
    Whole(Bytes),
    /// The stated size, over the limit: the body was not read.
    TooLarge(u64),
    /// The body ran past the stated size (this many bytes): reading stopped there.
    Overran(u64),
}

/// Reads the body of `result` if the object's stated size is at most `max_len`, into no more
/// than that size: a store that states a small size and sends more is stopped at the size it
/// stated. A body that arrives in one piece is returned as it is (no copy).
async fn read_bounded(result: GetResult, max_len: u64) -> object_store::Result<Fetched> {
    let stated = result.meta.size;
    if stated > max_len {
        return Ok(Fetched::TooLarge(stated));
    }
    let mut stream = result.into_stream();
    let Some(first) = stream.next().await.transpose()? else { return Ok(Fetched::Whole(Bytes::new())) };
    if first.len() as u64 > stated {
        return Ok(Fetched::Overran(stated));
    }
    let Some(second) = stream.next().await.transpose()? else { return Ok(Fetched::Whole(first)) };
    // The stated size, reserved fallibly: a size the allocator cannot give is an error here,
    // never an abort.
    let mut buf: Vec<u8> = Vec::new();
    let reserved = usize::try_from(stated).ok().and_then(|n| buf.try_reserve_exact(n).ok());
    if reserved.is_none() {
        return Err(object_store::Error::Generic {
            store: "tierfs",
            source: format!("cannot reserve the {stated} bytes the object is stated to hold").into(),
        });
    }
    buf.extend_from_slice(&first);
    drop(first);
    let mut next = Some(second);
    while let Some(piece) = next {
        if (buf.len() + piece.len()) as u64 > stated {
            return Ok(Fetched::Overran(stated));
        }
        buf.extend_from_slice(&piece);
        next = stream.next().await.transpose()?;
    }
    Ok(Fetched::Whole(Bytes::from(buf)))
}

/// Runs `fut` as a task of the runtime and waits for it; dropped early (a timeout), the task
/// is aborted. A body read this way is gathered by the runtime thread that reads the socket,
/// instead of waking a thread blocked on the read (a fetch thread) for every chunk of it.
async fn on_runtime<T: Send + 'static>(
    fut: impl Future<Output = object_store::Result<T>> + Send + 'static,
) -> object_store::Result<T> {
    struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);
    impl<T> Drop for AbortOnDrop<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut task = AbortOnDrop(tokio::spawn(fut));
    match (&mut task.0).await {
        Ok(result) => result,
        Err(e) => Err(object_store::Error::Generic { store: "tierfs", source: Box::new(e) }),
    }
}

/// `e` as an I/O error of the kind of the I/O error it wraps, if any (object_store wraps the
/// error of canonicalizing a `file://` path), so [`BackendError::Io`] keeps that kind.
fn io_error_of(e: object_store::Error) -> std::io::Error {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut kind = std::io::ErrorKind::Other;
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            kind = io.kind();
            break;
        }
        cause = c.source();
    }
    std::io::Error::new(kind, e)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::backend::faulty::{Fault, FaultSwitch, FaultyStore};
    use crate::types::ErrorKind;
    use object_store::memory::InMemory;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Counts attempts of a closure, for tests of the retry loop.
    struct Counter(AtomicU32);

    impl Counter {
        fn bump(&self) -> u32 {
            self.0.fetch_add(1, Ordering::SeqCst) + 1
        }
    }

    /// Room for every object these tests store.
    const TEST_LIMIT: SizeLimit = SizeLimit { max_len: 1 << 20, what: "a test object" };

    #[tokio::test]
    async fn an_object_over_its_limit_is_refused_unread_naming_key_and_sizes() {
        let b = mem("mem", BackendOptions::default());
        b.put("ws/lease", Bytes::from(vec![7u8; 100])).await.unwrap();
        let limit = SizeLimit { max_len: 99, what: "a lease record" };
        let err = b.get("ws/lease", limit).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        let msg = err.to_string();
        assert!(
            msg.contains("ws/lease") && msg.contains("100 bytes") && msg.contains("99 bytes a lease record"),
            "{msg}"
        );
        assert_eq!(b.health().traffic.received_bytes, 0, "no byte of the body was read");
        // At the limit it is read.
        assert_eq!(b.get("ws/lease", SizeLimit { max_len: 100, ..limit }).await.unwrap().len(), 100);
        // Refusing is an answer: the backend works.
        assert!(b.is_available());
    }

    #[tokio::test]
    async fn a_body_longer_than_its_stated_size_is_cut_off_and_refused() {
        let (b, faults) = faulty_mem("mem", BackendOptions::default());
        b.put("k", Bytes::from(vec![1u8; 64])).await.unwrap();
        faults.set(Some(Fault::UnderstateSize));
        let err = b.get("k", TEST_LIMIT).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt);
        assert!(err.to_string().contains("ran past the 1 bytes the store stated"), "{err}");
        faults.set(None);
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap().len(), 64);
    }

    #[tokio::test]
    async fn a_body_in_many_pieces_is_assembled_within_its_size() {
        // The local store streams a file in pieces of some KiB.
        let dir = tempfile::tempdir().unwrap();
        let b = Backend::from_object_store(
            "file".into(),
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
            BackendOptions::default(),
        );
        let data = Bytes::from((0..1_000_003u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        b.put("k", data.clone()).await.unwrap();
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), data);
        let err = b.get("k", SizeLimit { max_len: 1_000_002, what: "a test object" }).await.unwrap_err();
        assert!(err.to_string().contains("1000003 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_conditional_create_over_a_longer_object_does_not_read_it() {
        let b = mem("mem", BackendOptions::default());
        b.put("k", Bytes::from(vec![1u8; 64])).await.unwrap();
        assert!(!b.put_if_absent("k", Bytes::from_static(b"short")).await.unwrap());
        assert_eq!(b.health().traffic.received_bytes, 0);
    }

    fn mem(name: &str, opts: BackendOptions) -> Backend {
        Backend::from_object_store(name.into(), Arc::new(InMemory::new()), opts)
    }

    /// A backend over an in-memory store behind a [`FaultyStore`], and the switch of its faults.
    fn faulty_mem(name: &str, opts: BackendOptions) -> (Backend, FaultSwitch) {
        let (store, faults) = FaultyStore::wrap(Arc::new(InMemory::new()));
        (Backend::from_object_store(name.into(), store, opts), faults)
    }

    /// CRC-64/NVME, bit by bit (the reference the test holds the client's header against).
    fn crc64nvme(data: &[u8]) -> u64 {
        let mut crc = u64::MAX;
        for &byte in data {
            crc ^= u64::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0x9a6c_9329_ac4b_c9b5 } else { crc >> 1 };
            }
        }
        !crc
    }

    /// Answers one HTTP request with 200 and returns its head and body.
    async fn capture_one_request(listener: tokio::net::TcpListener) -> (String, Vec<u8>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut raw = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        let (head, body_start) = loop {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed before the request head ended");
            raw.extend_from_slice(&buf[..n]);
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                break (String::from_utf8_lossy(&raw[..end]).into_owned(), end + 4);
            }
        };
        let len: usize = header(&head, "content-length").map_or(0, |v| v.parse().unwrap());
        while raw.len() < body_start + len {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed inside the body");
            raw.extend_from_slice(&buf[..n]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        (head, raw[body_start..body_start + len].to_vec())
    }

    /// The value of header `name` (any case) in a request head.
    fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
        head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then_some(v.trim())
        })
    }

    #[tokio::test]
    async fn an_s3_put_carries_a_checksum_of_its_body_for_the_server_to_verify() {
        use base64::Engine as _;
        assert_eq!(crc64nvme(b"123456789"), 0xae8b_1486_0a79_9888, "the reference CRC itself");
        let body: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for payload in [PayloadCheck::Crc64Nvme, PayloadCheck::Signed] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let server = tokio::spawn(capture_one_request(listener));
            let spec = BackendSpec::S3 {
                bucket: "b".into(),
                prefix: "p".into(),
                endpoint: Some(format!("http://127.0.0.1:{port}")),
                region: Some("us-east-1".into()),
                payload,
            };
            let creds = Credentials {
                access_key_id: Some("k".into()),
                secret_access_key: Some("s".into()),
                session_token: None,
            };
            let b = Backend::open(&spec, &creds, &BackendOptions::for_tests()).unwrap();
            b.put("packs/x", Bytes::from(body.clone())).await.unwrap();
            let (head, got) = server.await.unwrap();
            assert!(head.starts_with("PUT /b/p/packs/x "), "{head}");
            assert_eq!(got, body, "{payload:?}: the body arrives as sent");
            let sha = hex::encode(ring::digest::digest(&ring::digest::SHA256, &body));
            match payload {
                PayloadCheck::Crc64Nvme => {
                    let crc = base64::engine::general_purpose::STANDARD.encode(crc64nvme(&body).to_be_bytes());
                    assert_eq!(header(&head, "x-amz-checksum-crc64nvme"), Some(crc.as_str()), "{head}");
                    assert_eq!(header(&head, "x-amz-content-sha256"), Some("UNSIGNED-PAYLOAD"), "{head}");
                }
                PayloadCheck::Signed => {
                    assert_eq!(header(&head, "x-amz-content-sha256"), Some(sha.as_str()), "{head}");
                    assert_eq!(header(&head, "x-amz-checksum-crc64nvme"), None, "{head}");
                }
            }
        }
    }

    #[tokio::test]
    async fn prefix_is_prepended_and_stripped() {
        let store = Arc::new(InMemory::new());
        let opts = BackendOptions::for_tests();
        let b = Backend::assemble("p".into(), None, store.clone(), "team/ws".into(), &opts, 0, opts.request_timeout);
        b.put("packs/x", Bytes::from_static(b"1")).await.unwrap();
        let raw = store.get(&Path::from("team/ws/packs/x")).await.unwrap().bytes().await.unwrap();
        assert_eq!(raw, Bytes::from_static(b"1"));
        store.put(&Path::from("team/other"), PutPayload::from_static(b"2")).await.unwrap();
        assert_eq!(b.list("").await.unwrap(), vec![ObjectInfo { key: "packs/x".into(), size: 1 }]);
        b.check().await.unwrap();
    }

    #[tokio::test]
    async fn bad_keys_are_refused_without_a_request() {
        let b = mem("mem", BackendOptions::for_tests());
        for key in ["", "/abs", "a//b", "a/../b", "trailing/", "sp ace", "a/./b"] {
            let err = b.get(key, TEST_LIMIT).await.unwrap_err();
            assert!(matches!(err, BackendError::BadKey { .. }), "{key:?}: {err:?}");
        }
        assert_eq!(b.health().consecutive_failures, 0);
    }

    #[tokio::test]
    async fn transient_failures_are_retried() {
        let (b, faults) = faulty_mem("mem", BackendOptions { max_retries: 2, ..BackendOptions::for_tests() });
        b.put("k", Bytes::from_static(b"v")).await.unwrap();
        faults.set(Some(Fault::FailNext(2)));
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"v"));
        assert_eq!(b.health().consecutive_failures, 0);

        faults.set(Some(Fault::FailNext(3)));
        let err = b.get("k", TEST_LIMIT).await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable { .. }), "{err:?}");
        assert!(err.to_string().contains("mem is unavailable"), "{err}");
        assert_eq!(b.health().consecutive_failures, 1, "one failed request, however many attempts");
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"v"), "the fault cleared itself");

        // Counted once per request, by method: 2 retries + 3 attempts of the failed get, 3 gets.
        let t = b.health().traffic;
        let method = |name: &str| t.requests.iter().find(|m| m.op == name).unwrap().clone();
        let (get, put) = (method("get"), method("put"));
        assert_eq!((get.calls, get.errors, get.latency.count()), (3, 1, 3), "{t:?}");
        assert_eq!((put.calls, put.errors), (1, 0), "{t:?}");
        assert_eq!(t.retries, 2 + 2, "{t:?}");
        assert_eq!((t.sent_bytes, t.received_bytes, t.refused), (1, 2, 0), "{t:?}");
        assert_eq!(t.requests.len(), METHODS.len());
    }

    #[tokio::test]
    async fn retry_loop_counts_attempts() {
        let b = mem("mem", BackendOptions { max_retries: 3, ..BackendOptions::for_tests() });
        let counter = Counter(AtomicU32::new(0));
        let c = &counter;
        let result: Result<(), _> = b
            .run(Op::Get, "k", move || async move {
                if c.bump() < 3 {
                    Err(object_store::Error::Generic { store: "test", source: "flaky".into() })
                } else {
                    Ok(())
                }
            })
            .await;
        result.unwrap();
        assert_eq!(counter.0.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn breaker_trips_and_probes_back() {
        let probe_after = Duration::from_millis(200);
        let opts = BackendOptions {
            max_retries: 1,
            breaker_threshold: 3,
            breaker_probe_after: probe_after,
            ..BackendOptions::for_tests()
        };
        let (b, faults) = faulty_mem("mem", opts);
        b.put("k", Bytes::from_static(b"v")).await.unwrap();
        // Missing objects never trip it.
        for _ in 0..10 {
            assert!(b.get("missing", TEST_LIMIT).await.unwrap_err().is_not_found());
        }
        assert!(b.is_available());

        faults.set(Some(Fault::Down));
        for _ in 0..3 {
            assert!(b.is_available());
            assert!(b.get("k", TEST_LIMIT).await.is_err());
        }
        assert!(!b.is_available());
        let health = b.health();
        assert!(!health.available && health.consecutive_failures == 3);
        assert!(health.last_error.unwrap_or_default().contains("injected fault"));

        // Refused at once while open, without reaching the store.
        faults.set(None);
        let err = b.get("k", TEST_LIMIT).await.unwrap_err();
        assert!(err.to_string().contains("tripped out after 3 consecutive failed requests"), "{err}");
        let t = b.health().traffic;
        assert_eq!(t.refused, 1, "{t:?}");
        // The missing objects were answers, not failures; the refused get was never sent.
        assert_eq!((t.requests[0].calls, t.requests[0].errors), (13, 3), "{t:?}");

        // A failed probe re-opens it.
        faults.set(Some(Fault::Down));
        tokio::time::sleep(probe_after + Duration::from_millis(20)).await;
        assert!(b.is_available());
        assert!(b.get("k", TEST_LIMIT).await.is_err());
        assert!(!b.is_available());

        // A successful probe closes it.
        faults.set(None);
        tokio::time::sleep(probe_after + Duration::from_millis(20)).await;
        assert!(b.is_available());
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"v"));
        assert!(b.is_available());
        assert_eq!(b.health().consecutive_failures, 0);
    }

    #[tokio::test]
    async fn slow_requests_time_out() {
        let opts = BackendOptions {
            request_timeout: Duration::from_millis(20),
            max_retries: 0,
            ..BackendOptions::for_tests()
        };
        let (b, faults) = faulty_mem("mem", opts);
        b.put("k", Bytes::from_static(b"v")).await.unwrap();
        faults.set(Some(Fault::Slow(Duration::from_millis(200))));
        let err = b.get("k", TEST_LIMIT).await.unwrap_err();
        assert!(matches!(err, BackendError::Timeout { .. }), "{err:?}");
        faults.set(Some(Fault::Slow(Duration::from_millis(1))));
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"v"));
    }

    #[tokio::test]
    async fn corrupt_reads_flip_a_bit() {
        let (b, faults) = faulty_mem("mem", BackendOptions::for_tests());
        b.put("k", Bytes::from_static(b"abcdef")).await.unwrap();
        faults.set(Some(Fault::CorruptReads));
        assert_ne!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"abcdef"));
        assert_ne!(b.get_range("k", 0..6).await.unwrap(), Bytes::from_static(b"abcdef"));
        faults.set(None);
        assert_eq!(b.get("k", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"abcdef"));
    }

    #[tokio::test]
    async fn ignored_conditional_creates_overwrite() {
        let (b, faults) = faulty_mem("mem", BackendOptions::for_tests());
        faults.set(Some(Fault::IgnoreConditional));
        assert!(b.put_if_absent("refs/ws/lease", Bytes::from_static(b"me")).await.unwrap());
        assert!(b.put_if_absent("refs/ws/lease", Bytes::from_static(b"you")).await.unwrap(), "the header is ignored");
        assert_eq!(b.get("refs/ws/lease", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"you"));
        faults.set(None);
        assert!(!b.put_if_absent("refs/ws/lease", Bytes::from_static(b"me")).await.unwrap());
    }

    #[test]
    fn futures_are_send() {
        fn send<T: Send>(_: T) {}
        let b = mem("mem", BackendOptions::for_tests());
        send(b.put("k", Bytes::new()));
        send(b.put_if_absent("k", Bytes::new()));
        send(b.get("k", TEST_LIMIT));
        send(b.get_range("k", 0..1));
        send(b.delete("k"));
        send(b.list(""));
        send(b.check());
        fn sync<T: Send + Sync>(_: &T) {}
        sync(&b);
    }

    #[test]
    fn s3_error_responses_are_summarized() {
        let text = "Generic S3 error: Error performing GET http://h/b?list-type=2 in 8ms - Server returned non-2xx \
                    status code: 404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code>\
                    <Message>The specified bucket does not exist</Message><BucketName>b</BucketName></Error>";
        let f = S3Failure::parse(text).unwrap();
        assert_eq!(f.to_string(), "HTTP 404 Not Found NoSuchBucket: The specified bucket does not exist");
        let b = mem("mem", BackendOptions::for_tests());
        let err = object_store::Error::Generic { store: "S3", source: text.into() };
        let (e, class) = b.classify(Op::Check, "", err);
        assert_eq!(class, Class::Permanent);
        assert!(e.to_string().contains("the bucket does not exist — create it"), "{e}");
        let err = object_store::Error::Generic { store: "S3", source: "status code: 500 Internal Server Error".into() };
        let (e, class) = b.classify(Op::Put, "config", err);
        assert_eq!(class, Class::Transient);
        assert_eq!(e.to_string(), "mem is unavailable: put of config failed: HTTP 500 Internal Server Error");
    }

    fn free_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn unreachable_s3_endpoint_gives_an_actionable_error() {
        let endpoint = format!("http://127.0.0.1:{}", free_port());
        let spec = BackendSpec::parse(&format!("s3://bucket/prefix?endpoint={endpoint}")).unwrap();
        let creds = Credentials {
            access_key_id: Some("test".into()),
            secret_access_key: Some("not-shown".into()),
            session_token: None,
        };
        let opts = BackendOptions { max_retries: 0, ..BackendOptions::for_tests() };
        let b = Backend::open(&spec, &creds, &opts).unwrap();
        let msg = b.check().await.unwrap_err().to_string();
        assert!(msg.contains("s3://bucket/prefix") && msg.contains(&endpoint), "{msg}");
        assert!(msg.contains("is the server running"), "{msg}");
        assert!(!msg.contains("not-shown"), "{msg}");
        let err = b.put("k", Bytes::from_static(b"v")).await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
    }

    /// Runs against a real S3-compatible server when `TIERFS_TEST_S3_ENDPOINT` is set (bucket
    /// `TIERFS_TEST_S3_BUCKET`, default `testbucket`, must exist; credentials from `AWS_*`).
    #[tokio::test]
    async fn s3_smoke() {
        let Ok(endpoint) = std::env::var("TIERFS_TEST_S3_ENDPOINT") else {
            println!("s3_smoke skipped: set TIERFS_TEST_S3_ENDPOINT (and TIERFS_TEST_S3_BUCKET) to run it");
            return;
        };
        let bucket = std::env::var("TIERFS_TEST_S3_BUCKET").unwrap_or_else(|_| "testbucket".into());
        let run = hex::encode(rand::random::<[u8; 6]>());
        let spec = BackendSpec::parse(&format!("s3://{bucket}/smoke-{run}?endpoint={endpoint}")).unwrap();
        let b = Backend::open(&spec, &Credentials::default(), &BackendOptions::for_tests()).unwrap();
        b.check().await.unwrap();
        let data = Bytes::from((0..=255u8).cycle().take(100_000).collect::<Vec<u8>>());
        b.put("packs/ab/abcd", data.clone()).await.unwrap();
        b.put("config", Bytes::from_static(b"cfg")).await.unwrap();
        assert_eq!(b.get("packs/ab/abcd", TEST_LIMIT).await.unwrap(), data);
        assert_eq!(b.get_range("packs/ab/abcd", 1000..70_000).await.unwrap(), data.slice(1000..70_000));
        assert!(b.get("nope", TEST_LIMIT).await.unwrap_err().is_not_found());
        let mut listed = b.list("").await.unwrap();
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(
            listed,
            vec![
                ObjectInfo { key: "config".into(), size: 3 },
                ObjectInfo { key: "packs/ab/abcd".into(), size: 100_000 }
            ]
        );
        assert_eq!(b.list("packs/").await.unwrap().len(), 1);
        assert!(b.put_if_absent("refs/ws/lease", Bytes::from_static(b"holder-1")).await.unwrap());
        assert!(!b.put_if_absent("refs/ws/lease", Bytes::from_static(b"holder-2")).await.unwrap());
        assert_eq!(b.get("refs/ws/lease", TEST_LIMIT).await.unwrap(), Bytes::from_static(b"holder-1"));
        for key in ["packs/ab/abcd", "config", "refs/ws/lease", "never-written"] {
            b.delete(key).await.unwrap();
        }
        assert!(b.list("").await.unwrap().is_empty());

        // The redundant layer over three prefixes of the bucket, erasure 2+1.
        use crate::backend::{Redundancy, RedundantStore};
        let backends = (0..3)
            .map(|i| {
                let spec = BackendSpec::parse(&format!("s3://{bucket}/smoke-{run}-{i}?endpoint={endpoint}")).unwrap();
                Backend::open(&spec, &Credentials::default(), &BackendOptions::for_tests()).unwrap()
            })
            .collect();
        let store = RedundantStore::new(backends, Redundancy::Erasure { data: 2, parity: 1 }).unwrap();
        store.put_pack("packs/ab/p", data.clone()).await.unwrap();
        // Lose shard 0 (on whichever backend holds it): the read rebuilds and repairs it.
        store.backends()[1].delete("packs/ab/p.s0").await.unwrap();
        store.backends()[0].delete("packs/ab/p.s0").await.unwrap();
        store.backends()[2].delete("packs/ab/p.s0").await.unwrap();
        let want = data.slice(10..60_000);
        let got = store.get_pack_range("packs/ab/p", 100_000, 10..60_000, &|b| (b == want).then_some(b)).await.unwrap();
        assert_eq!(got, want);
        assert!(store.scrub_pack("packs/ab/p", 100_000, &|b| b == &data[..], false).await.is_healthy());
        assert_eq!(store.list("packs").await.unwrap().len(), 1);
        store.delete_pack("packs/ab/p").await.unwrap();

        // A missing bucket is named as such.
        let spec = BackendSpec::parse(&format!("s3://tierfs-no-such-bucket-{run}?endpoint={endpoint}")).unwrap();
        let missing = Backend::open(&spec, &Credentials::default(), &BackendOptions::for_tests()).unwrap();
        let msg = missing.check().await.unwrap_err().to_string();
        assert!(msg.contains("the bucket does not exist — create it"), "{msg}");
        println!("s3_smoke passed against {endpoint} bucket {bucket}");
    }
}
