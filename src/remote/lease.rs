//! The writer lease of a workspace: who writes it, and until when.
//!
//! The lease is what a second writer is told ("in use by host:pid until …"); the fence is the
//! journal chain (see the parent module): the first thing a writer does after taking the lease
//! is to append a segment, and a writer whose next segment number is taken stops. So even two
//! nodes that both believe they hold the lease (a forced `--takeover` while the old node still
//! runs, clocks far apart) can never both extend the workspace.
//!
//! Invariants: a lease is renewed well before it expires (every third of its time to live); a
//! writer that finds another session's lease at renewal stops writing to the store. A lease
//! whose holder was a process of this machine and pid namespace that no longer exists (a
//! restart after `kill -9`) is free at once; anywhere else it is free once it expires.
//!
//! On a store fenced by lease only ([`Fencing::Lease`]: its servers ignore conditional
//! writes, so the chain cannot fence), the lease is the fence: a new writer checks, after
//! [`LEASE_SETTLE`], that the lease it wrote is still its own (two writers racing for an
//! expired lease: the last write wins, the other backs off); `--takeover` waits until the
//! holder's lease is [`CLOCK_MARGIN`] past its expiry and refuses a holder that renews
//! meanwhile; and the committer appends only while its lease is fresh by
//! [`Lease::fresh_for`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{RemoteError, Result, Workspace, chrono_like, unix_now};
use crate::crypto::ObjectKind;
use crate::store::{Fencing, WholeObject};

/// Lease fencing: how long a new writer waits before it reads back the lease it wrote.
pub const LEASE_SETTLE: Duration = Duration::from_secs(2);

/// Lease fencing: how far apart the clocks of two nodes may be. A lease counts as expired for a
/// taker only this long after its expiry, and as fresh for its holder only until this long
/// before it.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(5);

/// The stored lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    pub format: u32,
    pub session: String,
    /// `host:pid`, for messages.
    pub holder: String,
    pub acquired_unix: u64,
    pub expires_unix: u64,
    /// Set by a clean unmount: anyone may take the workspace at once.
    pub released: bool,
    /// `boot id/pid namespace/pid` of the holder: on the same machine and pid namespace, a
    /// holder whose process is gone (kill -9, crash) is known dead without waiting for expiry.
    #[serde(default)]
    pub process: String,
    /// The highest batch number the holder knew the store to hold when it wrote this record
    /// (its high-water mark, carried from holder to holder): a node that finds the chain behind
    /// it knows the store went back in time, even with no data dir of its own. `0` in records
    /// from before the mark existed.
    #[serde(default)]
    pub seen_seq: u64,
}

impl LeaseRecord {
    /// Decodes the plaintext of a workspace's lease object (JSON).
    pub fn decode(plain: &[u8]) -> Result<LeaseRecord> {
        serde_json::from_slice(plain)
            .map_err(|e| RemoteError::Corrupt { what: "workspace lease".into(), reason: e.to_string() })
    }
}

/// This process as [`LeaseRecord::process`] names it.
fn this_process() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
    format!("{}/{}/{}", boot.trim(), pidns, std::process::id())
}

/// Whether `process` (a [`LeaseRecord::process`]) is a process of this machine and pid
/// namespace that no longer exists.
fn is_dead_here(process: &str) -> bool {
    let mine = this_process();
    let (Some((place, pid)), Some((my_place, _))) = (process.rsplit_once('/'), mine.rsplit_once('/')) else {
        return false;
    };
    let Ok(pid) = pid.parse::<i32>() else { return false };
    if place != my_place || place.starts_with('/') || !place.contains("pid:[") || pid <= 0 {
        return false; // another machine or namespace, or identity unknown: wait for expiry
    }
    let Some(pid) = rustix::process::Pid::from_raw(pid) else { return false };
    if let Err(e) = rustix::process::test_kill_process(pid) {
        return e == rustix::io::Errno::SRCH;
    }
    // A killed daemon nobody has reaped yet (its parent is gone) is a zombie: dead too.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

/// This node's claim on a workspace.
pub struct Lease {
    ws: Arc<Workspace>,
    holder: String,
    session: String,
    ttl: Duration,
    /// The high-water mark this session writes ([`LeaseRecord::seen_seq`]): the last holder's
    /// until the committer has checked the chain, then the batches the store acknowledged.
    seen: AtomicU64,
}

impl Lease {
    pub(super) fn new(ws: Arc<Workspace>, holder: &str, ttl: Duration) -> Lease {
        let session = hex::encode(rand::random::<[u8; 12]>());
        Lease { ws, holder: holder.to_string(), session, ttl, seen: AtomicU64::new(0) }
    }

    /// Records that the store acknowledged batches up to `seq`, for the next lease write.
    pub fn note_stored(&self, seq: u64) {
        self.seen.fetch_max(seq, Ordering::Relaxed);
    }

    /// Starts the mark over at `seq`: the chain as the committer found it once its checks
    /// passed (or once a rollback was accepted).
    pub(super) fn restart_mark(&self, seq: u64) {
        self.seen.store(seq, Ordering::Relaxed);
    }

    pub fn session(&self) -> &str {
        &self.session
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// How often [`Lease::renew`] should run.
    pub fn renew_every(&self) -> Duration {
        self.ttl / 3
    }

    /// The current lease record, if any.
    pub async fn current(&self) -> Result<Option<LeaseRecord>> {
        self.ws.lease_record().await
    }

    async fn write(&self, released: bool, acquired_unix: u64) -> Result<()> {
        let now = unix_now();
        let rec = LeaseRecord {
            format: super::REMOTE_FORMAT,
            session: self.session.clone(),
            holder: self.holder.clone(),
            acquired_unix,
            expires_unix: if released { now } else { now + self.ttl.as_secs() },
            released,
            process: this_process(),
            seen_seq: self.seen.load(Ordering::Relaxed),
        };
        let body = serde_json::to_vec(&rec).expect("a lease serializes");
        self.ws.put_sealed(ObjectKind::Lease, WholeObject::Lease, &self.ws.lease_key(), &body).await
    }

    /// Takes the lease: refused while another session holds an unexpired one, unless
    /// `takeover` (which, on a store fenced by lease only, waits the lease out).
    pub async fn acquire(&self, takeover: bool) -> Result<()> {
        let lease_only = self.ws.fencing() == Fencing::Lease;
        if let Some(cur) = self.current().await? {
            // The mark goes on even if this session fails before it checks the chain.
            self.seen.fetch_max(cur.seen_seq, Ordering::Relaxed);
            let mut live = !cur.released && cur.expires_unix > unix_now() && cur.session != self.session;
            if live && is_dead_here(&cur.process) {
                tracing::info!(holder = %cur.holder, "the last holder of the lease was a process of this machine that is gone");
                live = false;
            }
            if live && !takeover {
                return Err(RemoteError::Held {
                    workspace: self.ws.name().to_string(),
                    holder: cur.holder,
                    expires: chrono_like(cur.expires_unix),
                });
            }
            if live && lease_only {
                self.wait_out(cur).await?;
            } else if live {
                tracing::warn!(holder = %cur.holder, "taking over workspace {:?} from a live lease", self.ws.name());
            }
        }
        self.write(false, unix_now()).await?;
        if lease_only {
            // Another node may have written the lease at the same moment: the last write wins,
            // and only its writer goes on.
            tokio::time::sleep(LEASE_SETTLE).await;
            match self.current().await? {
                Some(cur) if cur.session == self.session => {}
                other => {
                    return Err(RemoteError::Held {
                        workspace: self.ws.name().to_string(),
                        holder: other.as_ref().map_or_else(|| "another node".into(), |c| c.holder.clone()),
                        expires: other.map_or_else(|| "unknown".into(), |c| chrono_like(c.expires_unix)),
                    });
                }
            }
        }
        Ok(())
    }

    /// Lease fencing, `--takeover`: waits until `cur` is [`CLOCK_MARGIN`] past its expiry;
    /// a holder that renews or hands it to someone else meanwhile is alive.
    async fn wait_out(&self, cur: LeaseRecord) -> Result<()> {
        let until = cur.expires_unix + CLOCK_MARGIN.as_secs();
        tracing::warn!(
            holder = %cur.holder,
            "workspace {:?} is fenced by lease only: waiting {} s for the lease of {} to run out",
            self.ws.name(),
            until.saturating_sub(unix_now()),
            cur.holder
        );
        while unix_now() <= until {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.current().await? {
                Some(now) if now.released => return Ok(()),
                Some(now) if now == cur => {}
                Some(now) => {
                    return Err(RemoteError::StillRenewing {
                        workspace: self.ws.name().to_string(),
                        holder: now.holder,
                    });
                }
                None => return Ok(()),
            }
        }
        Ok(())
    }

    /// Lease fencing: how long after a successful renewal this node may still write to the
    /// store (its lease's time to live, less [`CLOCK_MARGIN`] for clocks that disagree);
    /// `None` on a store whose chain fences writers.
    pub fn fresh_for(&self) -> Option<Duration> {
        (self.ws.fencing() == Fencing::Lease).then(|| self.ttl.saturating_sub(CLOCK_MARGIN))
    }

    /// Extends the lease; [`RemoteError::TakenOver`] if another session holds it now.
    pub async fn renew(&self) -> Result<()> {
        match self.current().await? {
            Some(cur) if cur.session != self.session => {
                Err(RemoteError::TakenOver { workspace: self.ws.name().to_string(), holder: cur.holder })
            }
            cur => self.write(false, cur.map_or_else(unix_now, |c| c.acquired_unix)).await,
        }
    }

    /// Gives the lease up (clean unmount), if this session still holds it.
    pub async fn release(&self) -> Result<()> {
        match self.current().await? {
            Some(cur) if cur.session == self.session => self.write(true, cur.acquired_unix).await,
            _ => Ok(()),
        }
    }
}

impl Workspace {
    /// The workspace's lease record, read from a majority of copies.
    pub async fn lease_record(&self) -> Result<Option<LeaseRecord>> {
        let key = self.lease_key();
        let Some(plain) = self.get_sealed_majority(ObjectKind::Lease, WholeObject::Lease, &key).await? else {
            return Ok(None);
        };
        LeaseRecord::decode(&plain).map(Some)
    }

    /// Refuses a chain that ends before the batch the lease's last holder saw the store hold
    /// ([`RemoteError::RolledBack`]): newer checkpoints and segments were deleted, or older
    /// copies put back. `chain_end` is where the chain ends, if the caller has read it; else it
    /// is read here, only when the lease has a mark. What this cannot see: the lease itself
    /// deleted or put back as well (docs/SEMANTICS.md, "What a store can do to you").
    pub async fn check_lease_mark(&self, chain_end: Option<u64>) -> Result<()> {
        let Some(rec) = self.lease_record().await?.filter(|r| r.seen_seq > 0) else {
            return Ok(());
        };
        let store = match chain_end {
            Some(seq) => seq,
            None => self.chain_state().await?.remote_seq,
        };
        if rec.seen_seq > store {
            return Err(RemoteError::RolledBack {
                workspace: self.name().to_string(),
                witness: format!("the workspace's last writer ({})", rec.holder),
                seen: rec.seen_seq,
                store,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gone_process_of_this_machine_and_namespace_counts_as_dead() {
        let mine = this_process();
        assert!(!is_dead_here(&mine), "this process is alive: {mine}");
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let pid = child.id();
        let (place, _) = mine.rsplit_once('/').expect("an identity");
        // Exited but not reaped yet (a zombie), then reaped.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(is_dead_here(&format!("{place}/{pid}")), "an exited child is dead");
        child.wait().expect("wait");
        assert!(is_dead_here(&format!("{place}/{pid}")), "a reaped child is gone");
        // Elsewhere (another boot id), or unknown: never assumed dead.
        assert!(!is_dead_here(&format!("00000000-0000-0000-0000-000000000000/pid:[1]/{pid}")));
        assert!(!is_dead_here(""));
        assert!(!is_dead_here(&format!("//{pid}")));
    }

    /// A workspace of a `file://` store fenced by lease only, whose backend ignores
    /// conditional writes as Garage 2.x does.
    async fn lease_fenced_workspace(dir: &std::path::Path) -> Arc<Workspace> {
        let (ws, faults) = faulty_workspace(dir, Fencing::Lease).await;
        faults.set(Some(crate::backend::faulty::Fault::IgnoreConditional));
        ws
    }

    /// A workspace of a `file://` store behind a fault switch.
    async fn faulty_workspace(
        dir: &std::path::Path,
        fencing: Fencing,
    ) -> (Arc<Workspace>, crate::backend::faulty::FaultSwitch) {
        let (ws, mut faults) = faulty_replicas(dir, 1, fencing).await;
        (ws, faults.remove(0))
    }

    /// A workspace of `n` `file://` backends (a copy of every object on each), each behind
    /// a fault switch.
    async fn faulty_replicas(
        dir: &std::path::Path,
        n: usize,
        fencing: Fencing,
    ) -> (Arc<Workspace>, Vec<crate::backend::faulty::FaultSwitch>) {
        use crate::backend::faulty::FaultyStore;
        use crate::backend::{Backend, BackendOptions, RedundantStore};
        use crate::crypto::{KdfParams, Secret};
        use crate::store::{Store, StoreConfig};
        let mut backends = Vec::new();
        let mut faults = Vec::new();
        let mut urls = Vec::new();
        for i in 0..n {
            let path = dir.join(format!("b{i}"));
            let url = format!("file://{}", path.display());
            std::fs::create_dir_all(&path).expect("mkdir");
            let files = object_store::local::LocalFileSystem::new_with_prefix(&path).expect("file store");
            let (files, switch) = FaultyStore::wrap(Arc::new(files));
            backends.push(Backend::from_object_store(url.clone(), files, BackendOptions::for_tests()));
            faults.push(switch);
            urls.push(url);
        }
        let mut cfg = StoreConfig::new(urls);
        cfg.fencing = fencing;
        let backend = RedundantStore::new(backends, cfg.redundancy().expect("policy")).expect("store");
        let secret = Secret::Passphrase(b"p");
        let store = Store::init_on(backend, &cfg, &secret, KdfParams::for_tests()).await.expect("init");
        (Arc::new(Workspace::new(Arc::new(store), "w")), faults)
    }

    /// Split brain under replica lag: writer a's segment reaches two of three replicas and
    /// stores late on the third; writer b's create of the same segment takes that third copy
    /// and loses on the other two. b must read back a's ownership from the majority: its own
    /// copy, which a plain read finds first when it is on the first replica read, would make
    /// b take the segment as its own and replace batches a acknowledged. Each replica lags in
    /// turn, so one trial has b's copy where a first-copy read looks first.
    #[tokio::test]
    async fn a_writer_that_lost_a_segment_to_a_majority_never_takes_it_from_its_own_minority_copy() {
        use crate::backend::faulty::Fault;
        for lagging in 0..3 {
            let t = tempfile::tempdir().expect("tempdir");
            let (ws, faults) = faulty_replicas(t.path(), 3, Fencing::default()).await;
            faults[lagging].set(Some(Fault::Late));
            assert!(ws.append_segment(1, "a", "a:1", &[]).await.expect("append"), "a creates segment 1");
            faults[lagging].set(None);
            let took = ws.append_segment(1, "b", "b:2", &[]).await.expect("b's append");
            assert!(!took, "replica {lagging} lagging: b took segment 1 from its own minority copy");
            assert_eq!(faults[lagging].deliver_late().await.expect("deliver"), 0, "a's late create is refused there");
        }
    }

    /// A journal segment whose create reached the store but whose answer was lost is this
    /// session's, not a takeover, whether the backend's own retry or the committer's next
    /// try (after the backend gave up, as during an outage) finds it there: before, the
    /// committer's try found it "taken over" by its own holder and stopped the journal for
    /// good, so a writer cut off from its store in mid-write lost its final flush.
    #[tokio::test]
    async fn a_segment_whose_answer_was_lost_is_written_not_taken_over() {
        use crate::backend::faulty::Fault;
        let t = tempfile::tempdir().expect("tempdir");
        let (ws, faults) = faulty_workspace(t.path(), Fencing::default()).await;
        faults.set(Some(Fault::LoseAnswers(1)));
        assert!(ws.append_segment(1, "first", "a:1", &[]).await.expect("append"), "its own segment");
        assert_eq!(faults.current(), None, "the answer was lost once");
        assert!(!ws.append_segment(1, "second", "b:2", &[]).await.expect("append"), "segment 1 is taken");
        assert_eq!(ws.segment_writer(1).await.expect("read").map(|(s, _)| s), Some("first".into()));
        assert!(ws.append_segment(1, "first", "a:1", &[]).await.expect("append"), "trying again is idempotent");
    }

    #[tokio::test]
    async fn lease_fencing_never_overwrites_another_sessions_segment() {
        let t = tempfile::tempdir().expect("tempdir");
        let ws = lease_fenced_workspace(t.path()).await;
        assert!(ws.append_segment(1, "first", "a:1", &[]).await.expect("append"));
        assert!(!ws.append_segment(1, "second", "b:2", &[]).await.expect("append"), "segment 1 is taken");
        assert_eq!(ws.segment_writer(1).await.expect("read").map(|(s, _)| s), Some("first".into()));
        // Trying again after a lost answer: this session's own copy counts as written.
        assert!(ws.append_segment(1, "first", "a:1", &[]).await.expect("append"));
    }

    #[tokio::test]
    async fn lease_fencing_refuses_to_take_over_a_writer_that_renews() {
        let t = tempfile::tempdir().expect("tempdir");
        let ws = lease_fenced_workspace(t.path()).await;
        // 5 s: a's acquire takes the 2 s settle and expiry is in whole seconds, so a shorter
        // lease could run out before b looks on a loaded machine (it did with 3 s, in CI).
        let a = Arc::new(Lease::new(ws.clone(), "a:1", Duration::from_secs(5)));
        let b = Lease::new(ws.clone(), "b:2", Duration::from_secs(5));
        assert_eq!(a.fresh_for(), Some(Duration::ZERO), "a 5 s lease is never fresh past a 5 s margin");
        a.acquire(false).await.expect("a takes the free lease");
        assert!(matches!(b.acquire(false).await, Err(RemoteError::Held { .. })), "a holds it");
        // b waits the lease out; a renews meanwhile: a is alive and keeps the workspace.
        let renewer = a.clone();
        let renewing = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            renewer.renew().await
        });
        match b.acquire(true).await {
            Err(RemoteError::StillRenewing { holder, .. }) => assert_eq!(holder, "a:1"),
            other => panic!("takeover of a live writer: {other:?}"),
        }
        renewing.await.expect("join").expect("a renews");
        a.renew().await.expect("a still holds the lease");
    }

    #[tokio::test]
    async fn lease_fencing_takes_over_once_a_silent_holders_lease_ran_out() {
        let t = tempfile::tempdir().expect("tempdir");
        let ws = lease_fenced_workspace(t.path()).await;
        // Still live when b looks (a's acquire takes the 2 s settle), then never renewed.
        let a = Lease::new(ws.clone(), "a:1", Duration::from_secs(4));
        let b = Lease::new(ws.clone(), "b:2", Duration::from_secs(30));
        a.acquire(false).await.expect("a takes the free lease");
        let started = std::time::Instant::now();
        b.acquire(true).await.expect("b takes over once a's lease ran out");
        assert!(started.elapsed() >= CLOCK_MARGIN, "b waited {:?}, less than the clock margin", started.elapsed());
        assert!(matches!(a.renew().await, Err(RemoteError::TakenOver { .. })), "a learns it lost the lease");
        assert_eq!(b.fresh_for(), Some(Duration::from_secs(25)));
    }
}
