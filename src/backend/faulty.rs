//! Fault injection for the tests of this layer and the ones above it: [`FaultyStore`] wraps
//! any `object_store` store and fails, slows or corrupts its requests while its
//! [`FaultSwitch`] says so. The production [`Backend`](super::Backend) knows nothing of it; a
//! test builds a backend over the wrapper with `Backend::from_object_store` and keeps the switch.
//!
//! Faults act per *attempt*, below the backend's retries, timeouts and breaker, as a real
//! failing server would: a `Down` store answers every attempt with a transport error, which the
//! backend retries and counts like a refused connection.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::{self, BoxStream};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use parking_lot::Mutex;

/// An injected failure mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Every request fails as if the backend were unreachable (retried, counted by the breaker).
    Down,
    /// Reads succeed but return bytes with one bit flipped.
    CorruptReads,
    /// Every request attempt is delayed by this much.
    Slow(Duration),
    /// The next `n` request attempts fail transiently, then the fault clears itself.
    FailNext(u32),
    /// Conditional creates overwrite like plain puts, as on a server that ignores
    /// `If-None-Match: *` (Garage 2.x).
    IgnoreConditional,
    /// The next `n` puts reach the store, and then their answer is lost (a transient error,
    /// as when a connection drops after the server stored the object); then it clears itself.
    LoseAnswers(u32),
    /// Whole reads state a size of 1 byte and send the whole body, a byte at a time, as a
    /// server that lies in its Content-Length.
    UnderstateSize,
    /// A lagging replica: puts and conditional creates are acknowledged (a create as created,
    /// since it sees nothing there) but held; they reach the store only at
    /// [`FaultSwitch::deliver_late`], in order (a create that then finds the object is
    /// dropped, as the server would refuse it). Reads meanwhile see the store without them.
    Late,
}

/// A write a [`Fault::Late`] store acknowledged and holds.
type LateWrite = (Path, PutPayload, PutOptions);

/// The test's handle on one [`FaultyStore`]: `set(None)` heals it.
#[derive(Clone, Debug)]
pub struct FaultSwitch(Arc<Mutex<Option<Fault>>>, Arc<Mutex<Vec<LateWrite>>>, Arc<dyn ObjectStore>);

impl FaultSwitch {
    /// Lets the writes a [`Fault::Late`] store held reach it, in order, and returns how many
    /// were stored (a create that finds its object there is dropped).
    pub async fn deliver_late(&self) -> object_store::Result<usize> {
        let held = std::mem::take(&mut *self.1.lock());
        let mut stored = 0;
        for (location, payload, opts) in held {
            match self.2.put_opts(&location, payload, opts).await {
                Ok(_) => stored += 1,
                Err(object_store::Error::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(stored)
    }

    pub fn set(&self, fault: Option<Fault>) {
        *self.0.lock() = fault;
    }

    fn get(&self) -> Option<Fault> {
        *self.0.lock()
    }

    /// The fault set now (a self-clearing one reads `None` once used up).
    pub fn current(&self) -> Option<Fault> {
        self.get()
    }

    /// Whether this put's answer is lost, using up one unit of a `LoseAnswers`.
    fn lose_answer(&self) -> bool {
        let mut guard = self.0.lock();
        match *guard {
            Some(Fault::LoseAnswers(n)) if n > 0 => {
                *guard = if n > 1 { Some(Fault::LoseAnswers(n - 1)) } else { None };
                true
            }
            _ => false,
        }
    }

    /// The fault one attempt meets, using up one unit of a `FailNext`.
    fn take(&self) -> Option<Fault> {
        let mut guard = self.0.lock();
        let fault = *guard;
        if let Some(Fault::FailNext(n)) = fault {
            *guard = if n > 1 { Some(Fault::FailNext(n - 1)) } else { None };
            if n == 0 {
                return None;
            }
        }
        fault
    }
}

/// A store that misbehaves as its switch says.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    switch: FaultSwitch,
}

impl FaultyStore {
    /// `inner` wrapped, with the switch that controls it (no fault at first).
    pub fn wrap(inner: Arc<dyn ObjectStore>) -> (Arc<FaultyStore>, FaultSwitch) {
        let switch = FaultSwitch(Arc::default(), Arc::default(), inner.clone());
        (Arc::new(FaultyStore { inner, switch: switch.clone() }), switch)
    }

    /// What one attempt meets before it reaches the inner store: an error, or a delay (zero
    /// when there is no fault).
    fn meet(&self) -> object_store::Result<Duration> {
        match self.switch.take() {
            Some(Fault::Down) => Err(injected("backend down")),
            Some(Fault::FailNext(_)) => Err(injected("transient failure")),
            Some(Fault::Slow(delay)) => Ok(delay),
            _ => Ok(Duration::ZERO),
        }
    }

    async fn attempt(&self) -> object_store::Result<()> {
        let delay = self.meet()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    /// [`FaultyStore::attempt`] for the calls that answer with a stream.
    fn gate<T: Send + 'static>(
        &self,
        inner: impl FnOnce() -> BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        match self.meet() {
            Err(e) => stream::once(async { Err(e) }).boxed(),
            Ok(delay) if delay.is_zero() => inner(),
            Ok(delay) => {
                let inner = inner();
                stream::once(async move {
                    tokio::time::sleep(delay).await;
                    inner
                })
                .flatten()
                .boxed()
            }
        }
    }
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic { store: "faulty", source: format!("injected fault: {what}").into() }
}

/// `bytes` with one bit flipped in the middle (empty stays empty).
fn flip_a_bit(bytes: Bytes) -> Bytes {
    if bytes.is_empty() {
        return bytes;
    }
    let mut v = bytes.to_vec();
    let mid = v.len() / 2;
    v[mid] ^= 0x01;
    Bytes::from(v)
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "faulty({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.attempt().await?;
        if self.switch.get() == Some(Fault::IgnoreConditional) && matches!(opts.mode, PutMode::Create) {
            opts.mode = PutMode::Overwrite;
        }
        if self.switch.get() == Some(Fault::Late) {
            self.switch.1.lock().push((location.clone(), payload, opts));
            return Ok(PutResult { e_tag: None, version: None, extensions: Default::default() });
        }
        let stored = self.inner.put_opts(location, payload, opts).await?;
        if self.switch.lose_answer() {
            return Err(injected("the answer to a put that was stored got lost"));
        }
        Ok(stored)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.attempt().await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.attempt().await?;
        let result = self.inner.get_opts(location, options).await?;
        if self.switch.get() == Some(Fault::UnderstateSize) {
            let GetResult { meta, range, attributes, extensions, .. } = &result;
            let (mut meta, range, attributes, extensions) =
                (meta.clone(), range.clone(), attributes.clone(), extensions.clone());
            meta.size = meta.size.min(1);
            let bytes = result.bytes().await?;
            let pieces: Vec<object_store::Result<Bytes>> =
                (0..bytes.len()).map(|i| Ok(bytes.slice(i..i + 1))).collect();
            let payload = GetResultPayload::Stream(stream::iter(pieces).boxed());
            return Ok(GetResult { payload, meta, range, attributes, extensions });
        }
        if self.switch.get() != Some(Fault::CorruptReads) {
            return Ok(result);
        }
        let GetResult { meta, range, attributes, extensions, .. } = &result;
        let (meta, range, attributes, extensions) =
            (meta.clone(), range.clone(), attributes.clone(), extensions.clone());
        let bytes = flip_a_bit(result.bytes().await?);
        let payload = GetResultPayload::Stream(stream::once(async move { Ok(bytes) }).boxed());
        Ok(GetResult { payload, meta, range, attributes, extensions })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> object_store::Result<Vec<Bytes>> {
        self.attempt().await?;
        let parts = self.inner.get_ranges(location, ranges).await?;
        match self.switch.get() {
            Some(Fault::CorruptReads) => Ok(parts.into_iter().map(flip_a_bit).collect()),
            _ => Ok(parts),
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.gate(|| self.inner.delete_stream(locations))
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.gate(|| self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.gate(|| self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.attempt().await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.attempt().await?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> object_store::Result<()> {
        self.attempt().await?;
        self.inner.rename_opts(from, to, options).await
    }
}
