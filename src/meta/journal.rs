//! The metadata journal: the changes every committed batch made to the workspace's shared
//! state, numbered, queued for the remote committer (`crate::remote`).
//!
//! Invariants:
//! - batches get consecutive sequence numbers in the order RocksDB applied them (the number is
//!   assigned and the batch written under one mutex), and the number is written into the
//!   batch itself (`Cjournal_seq`), so the local store always knows the last batch it holds;
//! - only shared state is journaled: inodes, entries, xattrs, symlinks, counters, orphans,
//!   chunk records and block locations. Local cache state (dirty markers, whether a chunk is
//!   resident) never is, and chunk records are journaled as not resident: a node restoring
//!   them fetches on demand;
//! - nothing is dropped from the queue until the committer says it is durable; waiters for a
//!   sequence number are woken when it is (or when the committer fails for good);
//! - every batch carries the wall-clock time it was committed at (unix milliseconds, from the
//!   journal's [`Clock`]), never earlier than the batch before it: a clock that steps back
//!   repeats the last time, so "the batches up to time T" is always a prefix of the journal
//!   (point-in-time restore, docs/FORMAT.md "Workspaces").
//!
//! A waiter that does not get durability gets a [`JournalError`]: the committer's own error
//! (behind an `Arc`, with the kind it had, so a writer fenced by a takeover reads `Fenced`
//! rather than a retryable failure), or the deadline that passed.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use super::MetaError;
use crate::types::ErrorKind;

/// Why the changes a caller waits for are not durable in the store (they are durable locally).
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// The committer stopped for good (another writer took over, …): no later change of this
    /// session reaches the store. `kind` is the kind of `cause`, the committer's own error
    /// (this layer sits below the committer's, so it keeps the kind beside the error).
    #[error("{cause}")]
    Stopped {
        kind: ErrorKind,
        #[source]
        cause: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The store did not confirm the changes within the caller's deadline.
    #[error(
        "the store did not confirm the metadata within {} s (durable up to batch {durable}, need {need})",
        timeout.as_secs()
    )]
    Timeout { timeout: Duration, durable: u64, need: u64 },
}

impl JournalError {
    /// The committer stopped for good because of `cause`, whose kind is `kind`.
    pub fn stopped(kind: ErrorKind, cause: impl std::error::Error + Send + Sync + 'static) -> JournalError {
        JournalError::Stopped { kind, cause: Arc::new(cause) }
    }

    /// What a caller can do about this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            JournalError::Stopped { kind, .. } => *kind,
            JournalError::Timeout { .. } => ErrorKind::Unavailable,
        }
    }

    /// The committer's error when it is a `T`.
    pub fn cause<T: std::error::Error + 'static>(&self) -> Option<&T> {
        match self {
            JournalError::Stopped { cause, .. } => cause.downcast_ref::<T>(),
            JournalError::Timeout { .. } => None,
        }
    }
}

/// One change to a key of the shared tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalOp {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Deletes `[from, to)`.
    DeleteRange {
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_DELETE_RANGE: u8 = 3;
/// The shortest encoded op: a delete of an empty key (tag u8, key_len u32).
const MIN_OP_LEN: usize = 5;
/// The shortest encoded batch: a batch of no ops (seq u64, n u32).
pub const MIN_BATCH_LEN: usize = 12;

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

impl JournalOp {
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            JournalOp::Put { key, value } => {
                out.push(OP_PUT);
                put_bytes(out, key);
                put_bytes(out, value);
            }
            JournalOp::Delete { key } => {
                out.push(OP_DELETE);
                put_bytes(out, key);
            }
            JournalOp::DeleteRange { from, to } => {
                out.push(OP_DELETE_RANGE);
                put_bytes(out, from);
                put_bytes(out, to);
            }
        }
    }

    /// Bytes this op takes encoded.
    pub fn encoded_len(&self) -> usize {
        match self {
            JournalOp::Put { key: a, value: b } | JournalOp::DeleteRange { from: a, to: b } => 9 + a.len() + b.len(),
            JournalOp::Delete { key } => MIN_OP_LEN + key.len(),
        }
    }
}

/// A reader over an encoded sequence of ops and numbers.
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub fn new(buf: &'a [u8]) -> Decoder<'a> {
        Decoder { buf }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Bytes not decoded yet: what bounds any count read from them.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], MetaError> {
        if self.buf.len() < n {
            return Err(MetaError::Corrupt(format!("journal record cut short ({} of {n} bytes)", self.buf.len())));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub fn u64(&mut self) -> Result<u64, MetaError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().map_err(|_| MetaError::Corrupt("u64".into()))?))
    }

    pub fn u32(&mut self) -> Result<u32, MetaError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b.try_into().map_err(|_| MetaError::Corrupt("u32".into()))?))
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], MetaError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    pub fn op(&mut self) -> Result<JournalOp, MetaError> {
        let tag = self.take(1)?[0];
        Ok(match tag {
            OP_PUT => JournalOp::Put { key: self.bytes()?.to_vec(), value: self.bytes()?.to_vec() },
            OP_DELETE => JournalOp::Delete { key: self.bytes()?.to_vec() },
            OP_DELETE_RANGE => JournalOp::DeleteRange { from: self.bytes()?.to_vec(), to: self.bytes()?.to_vec() },
            t => return Err(MetaError::Corrupt(format!("journal op tag {t}"))),
        })
    }
}

/// The journaled changes of one committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalBatch {
    pub seq: u64,
    pub ops: Vec<JournalOp>,
    /// When it was committed (unix milliseconds). Not part of [`JournalBatch::encode`]: a
    /// segment carries its batches' times in its header (docs/FORMAT.md), and a decoded batch
    /// has 0 here until its segment's reader sets it.
    pub unix_ms: u64,
}

/// Where the journal reads the time of day: unix milliseconds. Tests inject their own, so a
/// point-in-time restore can be tested without sleeping.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock in unix milliseconds (0 before 1970).
pub fn system_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl JournalBatch {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&(self.ops.len() as u32).to_le_bytes());
        for op in &self.ops {
            op.encode(out);
        }
    }

    pub fn decode(d: &mut Decoder<'_>) -> Result<JournalBatch, MetaError> {
        let seq = d.u64()?;
        let n = d.u32()? as usize;
        // The count is the store's word: no more ops than the bytes left can hold.
        if n > d.remaining() / MIN_OP_LEN {
            return Err(MetaError::Corrupt(format!(
                "a journal batch says it holds {n} ops, more than its {} bytes can",
                d.remaining()
            )));
        }
        let mut ops = Vec::with_capacity(n);
        for _ in 0..n {
            ops.push(d.op()?);
        }
        Ok(JournalBatch { seq, ops, unix_ms: 0 })
    }

    pub fn encoded_len(&self) -> usize {
        MIN_BATCH_LEN + self.ops.iter().map(JournalOp::encoded_len).sum::<usize>()
    }
}

#[derive(Default)]
struct Queue {
    enabled: bool,
    /// The clock batches are stamped from (`None`: the system clock).
    clock: Option<Clock>,
    /// The time the last batch was stamped with: no batch gets an earlier one.
    last_ms: u64,
    /// The sequence number of the last committed batch.
    last_seq: u64,
    pending: Vec<JournalBatch>,
    pending_bytes: usize,
    /// When the oldest pending batch was committed.
    oldest: Option<Instant>,
    /// Everything up to here is durable remotely (in a journal segment or a checkpoint).
    durable_seq: u64,
    /// Everything up to here is in a stored journal segment (or was before journaling
    /// started): what a replay of the journal (`tierfs trash`, `restore --at`) sees. A
    /// checkpoint makes batches durable without putting them in a segment.
    journaled_seq: u64,
    /// Set when the committer gave up for good (another writer took over, …).
    failed: Option<JournalError>,
    /// The next segment number handed out by [`Journal::take`].
    next_segment: u64,
    /// Callers in [`Journal::wait_durable`]: while there are any, segments are not held back
    /// for group commit.
    waiters: usize,
    /// While the committer holds a segment back for group commit, the pending bytes that fill
    /// it ([`Journal::take`]'s `max_bytes`): an append wakes it only on reaching them.
    full_at: Option<usize>,
}

/// A snapshot of the queue for `tierfs status`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub last_seq: u64,
    pub durable_seq: u64,
    pub pending_batches: u64,
    pub pending_bytes: u64,
    pub oldest_pending: Option<Duration>,
}

/// What the committer takes to write one segment.
pub struct Taken {
    pub segment: u64,
    pub batches: Vec<JournalBatch>,
}

/// The queue of journaled batches between the metadata store and the remote committer.
#[derive(Default)]
pub struct Journal {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Journal {
    /// Starts journaling: batches committed from now on are numbered after `last_seq` and
    /// queued; segments are numbered from `next_segment`.
    pub(super) fn enable(&self, last_seq: u64, next_segment: u64) {
        let mut q = self.queue.lock();
        q.enabled = true;
        q.last_seq = last_seq;
        q.durable_seq = last_seq;
        q.journaled_seq = last_seq;
        q.next_segment = next_segment;
    }

    pub fn is_enabled(&self) -> bool {
        self.queue.lock().enabled
    }

    /// Stamps batches from `clock` from now on (tests; the system clock otherwise).
    pub fn set_clock(&self, clock: Clock) {
        self.queue.lock().clock = Some(clock);
    }

    /// The time of day by the journal's clock (unix milliseconds), never before the last
    /// batch's: a state read now is the state at this time.
    pub fn now_ms(&self) -> u64 {
        let q = self.queue.lock();
        Self::stamp(&q)
    }

    fn stamp(q: &Queue) -> u64 {
        let now = q.clock.as_ref().map_or_else(system_unix_ms, |c| c());
        now.max(q.last_ms)
    }

    /// Runs `write(seq)` for the next batch under the queue lock and queues its ops after it
    /// succeeded. `None` (no number) when journaling is off or `ops` is empty.
    pub(super) fn append<T>(
        &self,
        ops: Vec<JournalOp>,
        write: impl FnOnce(Option<u64>) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let mut q = self.queue.lock();
        if !q.enabled || ops.is_empty() {
            // Nothing shared changed (or nobody listens): no number, nothing queued.
            drop(q);
            return write(None);
        }
        let seq = q.last_seq + 1;
        let unix_ms = Self::stamp(&q);
        let out = write(Some(seq))?;
        q.last_seq = seq;
        q.last_ms = unix_ms;
        let batch = JournalBatch { seq, ops, unix_ms };
        q.pending_bytes += batch.encoded_len();
        q.pending.push(batch);
        q.oldest.get_or_insert_with(Instant::now);
        // Wake the committer only when this batch gives it something to do: the first batch
        // (it waits for one), or one that fills the segment it holds back. Waking it on every
        // batch of a burst cost a context switch per metadata operation.
        let wake = q.pending.len() == 1 || q.full_at.is_some_and(|full| q.pending_bytes >= full);
        drop(q);
        if wake {
            self.changed.notify_all();
        }
        Ok(out)
    }

    /// The number of the last committed batch.
    pub fn last_seq(&self) -> u64 {
        self.queue.lock().last_seq
    }

    pub fn stats(&self) -> JournalStats {
        let q = self.queue.lock();
        JournalStats {
            last_seq: q.last_seq,
            durable_seq: q.durable_seq,
            pending_batches: q.pending.len() as u64,
            pending_bytes: q.pending_bytes as u64,
            oldest_pending: q.oldest.map(|t| t.elapsed()),
        }
    }

    /// Waits up to `timeout` for pending batches (or for `wake` to be called), then takes up
    /// to `max_bytes` of them as the next segment. `None` if nothing is pending.
    ///
    /// Group commit: a segment is taken once its oldest batch is `window` old, unless it is
    /// full (`max_bytes`) or someone waits for durability (`fsync` with remote durability,
    /// `tierfs sync`), so a stream of small operations makes a few segments a second instead
    /// of one per round trip to the store.
    pub fn take(&self, timeout: Duration, max_bytes: usize, window: Duration) -> Option<Taken> {
        let mut q = self.queue.lock();
        if q.pending.is_empty() {
            self.changed.wait_for(&mut q, timeout);
        }
        if q.pending.is_empty() {
            return None;
        }
        while q.waiters == 0 && q.pending_bytes < max_bytes {
            let Some(due) = q.oldest.map(|t| t + window) else { break };
            if Instant::now() >= due {
                break;
            }
            q.full_at = Some(max_bytes);
            self.changed.wait_until(&mut q, due);
            q.full_at = None;
        }
        let mut bytes = 0;
        let mut n = 0;
        for b in &q.pending {
            if n > 0 && bytes + b.encoded_len() > max_bytes {
                break;
            }
            bytes += b.encoded_len();
            n += 1;
        }
        let batches: Vec<JournalBatch> = q.pending.drain(..n).collect();
        q.pending_bytes -= bytes;
        if q.pending.is_empty() {
            // The next batch starts the next group's window (what is left, if any, is as old
            // as what was taken, so it keeps its time and goes next).
            q.oldest = None;
        }
        let segment = q.next_segment;
        q.next_segment += 1;
        Some(Taken { segment, batches })
    }

    /// The committer stored a journal segment whose last batch is `seq`: everything up to
    /// it is in the journal, and durable.
    pub fn mark_journaled(&self, seq: u64) {
        let mut q = self.queue.lock();
        q.journaled_seq = q.journaled_seq.max(seq);
        drop(q);
        self.mark_durable(seq);
    }

    /// The committer stored everything up to `seq` (a segment, or a checkpoint covering it).
    pub fn mark_durable(&self, seq: u64) {
        let mut q = self.queue.lock();
        if seq > q.durable_seq {
            q.durable_seq = seq;
        }
        if q.pending.is_empty() {
            q.oldest = None;
            // Batches without shared changes after `seq` are durable too.
            q.durable_seq = q.last_seq;
        }
        drop(q);
        self.changed.notify_all();
    }

    /// The committer cannot go on (another writer took over, …): every waiter gets `reason`
    /// ([`JournalError::Stopped`]).
    pub fn fail(&self, reason: JournalError) {
        self.queue.lock().failed = Some(reason);
        self.changed.notify_all();
    }

    pub fn failure(&self) -> Option<JournalError> {
        self.queue.lock().failed.clone()
    }

    /// Wakes a committer waiting in [`Journal::take`].
    pub fn wake(&self) {
        self.changed.notify_all();
    }

    /// Waits until every batch up to `seq` is durable remotely. `Err` when the committer
    /// failed or `timeout` passed first.
    pub fn wait_durable(&self, seq: u64, timeout: Duration) -> Result<(), JournalError> {
        self.wait_for(seq, timeout, |q| q.durable_seq)
    }

    /// Waits until every batch up to `seq` is in a stored journal segment, not only in a
    /// checkpoint: a replay of the journal (the trash, `restore --at`) then sees it. `Err`
    /// when the committer failed or `timeout` passed first.
    pub fn wait_journaled(&self, seq: u64, timeout: Duration) -> Result<(), JournalError> {
        self.wait_for(seq, timeout, |q| q.journaled_seq)
    }

    /// Waits until `reached` says the queue got to `seq`.
    fn wait_for(&self, seq: u64, timeout: Duration, reached: fn(&Queue) -> u64) -> Result<(), JournalError> {
        let deadline = Instant::now() + timeout;
        let mut q = self.queue.lock();
        q.waiters += 1;
        self.changed.notify_all(); // a committer holding a segment back takes it now
        let result = self.wait_locked(&mut q, seq, deadline, timeout, reached);
        q.waiters -= 1;
        result
    }

    fn wait_locked(
        &self,
        q: &mut parking_lot::MutexGuard<'_, Queue>,
        seq: u64,
        deadline: Instant,
        timeout: Duration,
        reached: fn(&Queue) -> u64,
    ) -> Result<(), JournalError> {
        loop {
            if reached(q) >= seq {
                return Ok(());
            }
            if let Some(f) = &q.failed {
                return Err(f.clone());
            }
            if Instant::now() >= deadline {
                return Err(JournalError::Timeout { timeout, durable: reached(q), need: seq });
            }
            self.changed.wait_until(q, deadline.min(Instant::now() + Duration::from_millis(200)));
        }
    }

    /// Runs `f(last_seq, next_segment)` with commits held off: what `f` reads from the store
    /// is exactly the state after batch `last_seq`, and batches after it go to segments from
    /// `next_segment` on.
    pub fn at_cut<T>(&self, f: impl FnOnce(u64, u64) -> T) -> T {
        let q = self.queue.lock();
        f(q.last_seq, q.next_segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_op() -> impl Strategy<Value = JournalOp> {
        let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
        prop_oneof![
            (bytes(), bytes()).prop_map(|(key, value)| JournalOp::Put { key, value }),
            bytes().prop_map(|key| JournalOp::Delete { key }),
            (bytes(), bytes()).prop_map(|(from, to)| JournalOp::DeleteRange { from, to }),
        ]
    }

    proptest! {
        #[test]
        fn batches_round_trip(seq: u64, ops in proptest::collection::vec(arb_op(), 0..10)) {
            let b = JournalBatch { seq, ops, unix_ms: 0 };
            let mut buf = Vec::new();
            b.encode(&mut buf);
            prop_assert_eq!(buf.len(), b.encoded_len());
            let mut d = Decoder::new(&buf);
            prop_assert_eq!(JournalBatch::decode(&mut d).expect("decodes"), b);
            prop_assert!(d.is_empty());
        }

        #[test]
        fn truncated_batches_are_errors(ops in proptest::collection::vec(arb_op(), 1..5), cut in 0usize..1000) {
            let b = JournalBatch { seq: 7, ops, unix_ms: 0 };
            let mut buf = Vec::new();
            b.encode(&mut buf);
            let cut = cut % buf.len();
            prop_assert!(JournalBatch::decode(&mut Decoder::new(&buf[..cut])).is_err());
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("taken over")]
    struct TakenOver;

    #[test]
    fn waiters_see_durability_and_failure() {
        let j = Journal::default();
        j.enable(10, 1);
        j.append(vec![JournalOp::Delete { key: b"a".to_vec() }], |seq| {
            assert_eq!(seq, Some(11));
            Ok(())
        })
        .expect("append");
        let late = j.wait_durable(11, Duration::from_millis(10)).expect_err("not durable yet");
        assert_eq!(late.kind(), ErrorKind::Unavailable, "a deadline that passed is worth a retry: {late}");
        let t = j.take(Duration::ZERO, 1 << 20, Duration::ZERO).expect("pending");
        assert_eq!((t.segment, t.batches.len()), (1, 1));
        j.mark_durable(11);
        j.wait_durable(11, Duration::ZERO).expect("durable");
        // A batch without shared changes gets no number.
        j.append(Vec::new(), |seq| {
            assert_eq!(seq, None);
            Ok(())
        })
        .expect("append");
        assert_eq!(j.last_seq(), 11);
        j.append(vec![JournalOp::Delete { key: b"b".to_vec() }], |_| Ok(())).expect("append");
        j.fail(JournalError::stopped(ErrorKind::Fenced, TakenOver));
        let failed = j.wait_durable(12, Duration::from_secs(5)).expect_err("failed");
        assert_eq!(failed.kind(), ErrorKind::Fenced, "the committer's kind reaches the waiter");
        assert_eq!(failed.to_string(), "taken over");
        assert!(failed.cause::<TakenOver>().is_some(), "the committer's error is kept: {failed:?}");
    }

    #[test]
    fn a_checkpoint_makes_batches_durable_but_only_a_segment_puts_them_in_the_journal() {
        let j = Journal::default();
        j.enable(0, 1);
        j.append(vec![JournalOp::Delete { key: b"a".to_vec() }], |_| Ok(())).expect("append");
        // A checkpoint covered batch 1: durable, but in no segment yet.
        j.mark_durable(1);
        j.wait_durable(1, Duration::ZERO).expect("durable");
        let err = j.wait_journaled(1, Duration::from_millis(10)).expect_err("in no segment yet");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        // The committer still takes it and stores it as a segment.
        let t = j.take(Duration::ZERO, 1 << 20, Duration::ZERO).expect("still pending");
        assert_eq!(t.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), [1]);
        j.mark_journaled(1);
        j.wait_journaled(1, Duration::ZERO).expect("in the journal");
    }

    #[test]
    fn batches_carry_their_commit_time_and_a_clock_that_steps_back_repeats_the_last() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let j = Journal::default();
        j.enable(0, 1);
        let now = Arc::new(AtomicU64::new(5_000));
        let clock = now.clone();
        j.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
        let put = |k: &[u8]| j.append(vec![JournalOp::Delete { key: k.to_vec() }], |_| Ok(())).expect("append");
        put(b"a");
        now.store(7_000, Ordering::SeqCst);
        put(b"b");
        now.store(6_000, Ordering::SeqCst); // the clock stepped back
        put(b"c");
        assert_eq!(j.now_ms(), 7_000, "a state read now is not older than its last batch");
        let t = j.take(Duration::ZERO, 1 << 20, Duration::ZERO).expect("pending");
        let times: Vec<u64> = t.batches.iter().map(|b| b.unix_ms).collect();
        assert_eq!(times, vec![5_000, 7_000, 7_000]);
    }

    #[test]
    fn segments_gather_batches_for_the_window_unless_someone_waits() {
        let j = std::sync::Arc::new(Journal::default());
        j.enable(0, 1);
        let put = |k: &[u8]| j.append(vec![JournalOp::Delete { key: k.to_vec() }], |_| Ok(())).expect("append");
        put(b"a");
        let window = Duration::from_millis(300);
        let appender = {
            let j = j.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                j.append(vec![JournalOp::Delete { key: b"b".to_vec() }], |_| Ok(())).expect("append");
            })
        };
        let started = Instant::now();
        let t = j.take(Duration::ZERO, 1 << 20, window).expect("pending");
        appender.join().expect("appender");
        assert!(started.elapsed() >= Duration::from_millis(250), "taken after {:?}", started.elapsed());
        assert_eq!(t.batches.len(), 2, "the batch of 50 ms later went into the same segment");
        j.mark_durable(t.batches[1].seq);

        // A waiter for durability: the segment goes at once.
        put(b"c");
        let waiter = {
            let j = j.clone();
            std::thread::spawn(move || j.wait_durable(3, Duration::from_secs(10)))
        };
        while j.queue.lock().waiters == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = Instant::now();
        let t = j.take(Duration::ZERO, 1 << 20, Duration::from_secs(30)).expect("pending");
        assert!(started.elapsed() < Duration::from_secs(5), "held back {:?} with a waiter", started.elapsed());
        j.mark_durable(t.batches[0].seq);
        waiter.join().expect("waiter").expect("durable");
    }
}
