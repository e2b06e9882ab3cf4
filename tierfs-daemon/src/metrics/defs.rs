//! Every metric the node daemon exports, defined once: its name, type, help and the field of
//! a mount's [`StatusReport`] (or of the node's own record of the mount) it is read from.
//!
//! [`METRICS`] is the one list. The exposition at each scrape walks it ([`render`], through
//! `prometheus-client`'s OpenMetrics text encoder), and the table of `deploy/README.md` is
//! generated from it ([`markdown_table`]; a test checks the README holds exactly that), so a
//! metric cannot be served without being documented, or documented without being served.
//!
//! Invariants:
//! - Names follow Prometheus' conventions: `tierfs_` prefix, base units, `_bytes`,
//!   `_seconds`, `_total` on counters (the encoder adds it to a counter's family name).
//! - Every series of a mount carries `workspace` and `mountpoint`; a [`Source`] adds the
//!   labels of what it walks (`backend`, `method`, `op`). The encoder escapes label values.
//! - A family is written once, with all its samples, and only when it has one: a metric of a
//!   part a mount does not have (no store, not a watch) is absent rather than zero.
//! - Values are read whole at each scrape from what the mounts report anyway (the same
//!   `StatusReport` that `tierfs status` prints); nothing here counts on its own.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use tierfs::backend::BackendHealth;
use tierfs::telemetry::{HistogramSnapshot, LATENCY_BOUNDS_NS, OpSnapshot};

use crate::control::{StatusReport, StatusSummary};

/// One mount as a scrape sees it.
#[derive(Debug)]
pub struct MountView {
    pub labels: Labels,
    pub phase: &'static str,
    /// Why it failed, or its kind (`fuse`, `watch`).
    pub detail: String,
    pub restarts: u64,
    /// While it is live.
    pub status: Option<StatusReport>,
}

/// The labels of one series, in order.
pub type Labels = Vec<(&'static str, String)>;

/// The `workspace` and `mountpoint` labels every series of a mount carries.
pub fn mount_labels(workspace: &str, mountpoint: &std::path::Path) -> Labels {
    vec![("workspace", workspace.into()), ("mountpoint", mountpoint.display().to_string())]
}

fn with(labels: &Labels, name: &'static str, value: &str) -> Labels {
    let mut labels = labels.clone();
    labels.push((name, value.into()));
    labels
}

/// What a metric is, for Prometheus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    /// Latencies over the core's fixed buckets ([`LATENCY_BOUNDS_NS`]), in seconds.
    Histogram,
}

/// One value of a series.
#[derive(Debug, Clone, Copy)]
pub enum Sample<'a> {
    Int(u64),
    Float(f64),
    Latency(&'a HistogramSnapshot),
}

/// Where a metric's samples come from, which says what labels they carry.
pub enum Source {
    /// The node itself: one sample, labelled `version`.
    Build,
    /// Every mount the node declares, live or not; adds `state` and `detail`; always 1.
    MountState,
    /// Every mount the node declares, live or not.
    Mount(fn(&MountView) -> Sample<'_>),
    /// Every live mount, from its status and the scrape's Unix time; `None` leaves it out.
    Status(fn(&StatusReport, u64) -> Option<Sample<'_>>),
    /// Every backend of a live mount; adds `backend`.
    Backend(fn(&BackendHealth) -> Sample<'_>),
    /// Every method a backend was asked at least once; adds `backend` and `method`.
    Request(fn(&OpSnapshot) -> Sample<'_>),
    /// Every FUSE operation requested at least once; adds `op`.
    Fuse(fn(&OpSnapshot) -> Sample<'_>),
}

impl Source {
    /// The labels its series carry, as the docs list them.
    pub fn labels(&self) -> &'static str {
        match self {
            Source::Build => "version",
            Source::MountState => "workspace, mountpoint, state, detail",
            Source::Mount(_) | Source::Status(_) => "workspace, mountpoint",
            Source::Backend(_) => "workspace, mountpoint, backend",
            Source::Request(_) => "workspace, mountpoint, backend, method",
            Source::Fuse(_) => "workspace, mountpoint, op",
        }
    }
}

/// One metric family.
pub struct Metric {
    /// As scraped: a counter's ends in `_total`.
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub source: Source,
}

const fn gauge(name: &'static str, help: &'static str, source: Source) -> Metric {
    Metric { name, kind: Kind::Gauge, help, source }
}

const fn counter(name: &'static str, help: &'static str, source: Source) -> Metric {
    Metric { name, kind: Kind::Counter, help, source }
}

const fn histogram(name: &'static str, help: &'static str, source: Source) -> Metric {
    Metric { name, kind: Kind::Histogram, help, source }
}

fn int(v: u64) -> Option<Sample<'static>> {
    Some(Sample::Int(v))
}

fn flag(on: bool) -> Option<Sample<'static>> {
    int(u64::from(on))
}

fn millis(ms: u64) -> Option<Sample<'static>> {
    Some(Sample::Float(ms as f64 / 1000.0))
}

/// Every metric, in the order of the exposition and of the docs' table.
pub static METRICS: &[Metric] = &[
    gauge("tierfs_build_info", "The tierfs version serving, as a label; always 1.", Source::Build),
    gauge(
        "tierfs_mount_state",
        "The mount's phase (starting, live, stopping, failed, stopped) as a label, with why it failed or its kind (fuse, watch); always 1.",
        Source::MountState,
    ),
    gauge(
        "tierfs_mount_up",
        "1 while the mount (or watched directory) is served.",
        Source::Mount(|m| Sample::Int(u64::from(m.status.is_some()))),
    ),
    counter(
        "tierfs_mount_restarts_total",
        "Times the node started the mount again after it failed to start or failed while served (after 1 s, doubling up to 60 s while it keeps failing; an unmount is not a failure).",
        Source::Mount(|m| Sample::Int(m.restarts)),
    ),
    gauge(
        "tierfs_mount_uptime_seconds",
        "Time since the mount became ready.",
        Source::Status(|s, _| int(s.uptime_secs)),
    ),
    gauge(
        "tierfs_inodes",
        "Files, directories and other inodes in the workspace.",
        Source::Status(|s, _| int(s.inodes)),
    ),
    gauge("tierfs_open_files", "Files open on the mount.", Source::Status(|s, _| int(s.open_files))),
    gauge("tierfs_local_data_bytes", "File data held on the local disk.", Source::Status(|s, _| int(s.data_bytes))),
    gauge("tierfs_disk_free_bytes", "Free space on the data dir's disk.", Source::Status(|s, _| int(s.disk_free))),
    gauge(
        "tierfs_disk_reserve_bytes",
        "Of the free space, what file data leaves to the metadata.",
        Source::Status(|s, _| int(s.reserve)),
    ),
    gauge(
        "tierfs_cache_capacity_bytes",
        "The cache's size limit (--cache-size).",
        Source::Status(|s, _| s.cache_size.and_then(int)),
    ),
    gauge(
        "tierfs_cache_used_bytes",
        "Workspace data cached on this node: what a scheduler reads to prefer nodes that hold a dataset.",
        Source::Status(|s, _| int(StatusSummary::of(s).cache_used_bytes)),
    ),
    gauge(
        "tierfs_dirty_bytes",
        "Bytes written and not yet in the store.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.dirty_bytes))),
    ),
    gauge(
        "tierfs_dirty_files",
        "Files with bytes not yet in the store.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.dirty_files))),
    ),
    gauge(
        "tierfs_dirty_oldest_age_seconds",
        "Age of the oldest change not yet in the store.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| millis(c.oldest_dirty_ms))),
    ),
    gauge(
        "tierfs_evicted_bytes",
        "File data held only in the store (evicted from the cache).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.evicted_bytes))),
    ),
    counter(
        "tierfs_cache_evictions_total",
        "Chunks evicted from the cache.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.evictions))),
    ),
    counter(
        "tierfs_cache_miss_bytes_total",
        "Bytes fetched from the store: reads the cache lacked, read-ahead and the refill.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.fetched_bytes))),
    ),
    counter(
        "tierfs_stream_bytes_total",
        "Of those, bytes of streamed reads (kept out of the cache).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.streamed_bytes))),
    ),
    counter(
        "tierfs_store_uploaded_bytes_total",
        "File data bytes uploaded to the store.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.uploaded_bytes))),
    ),
    counter(
        "tierfs_store_uploaded_packs_total",
        "Packs (store objects of file data) uploaded.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.uploaded_packs))),
    ),
    counter(
        "tierfs_store_upload_errors_total",
        "Uploads of file data that failed (and were retried).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.upload_errors))),
    ),
    counter(
        "tierfs_cache_hits_total",
        "Reads whose chunks were all in the cache (streamed reads aside).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.read_hits))),
    ),
    counter(
        "tierfs_cache_hit_bytes_total",
        "Bytes of those reads.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.read_hit_bytes))),
    ),
    counter(
        "tierfs_cache_misses_total",
        "Reads that waited for a chunk from the store (their bytes: tierfs_cache_miss_bytes_total).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.read_misses))),
    ),
    counter(
        "tierfs_cache_neighbour_blocks_total",
        "Blocks fetched beside a missed small block, from around it in its pack (pack neighbours, docs/SEMANTICS.md).",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.neighbour_blocks))),
    ),
    counter(
        "tierfs_cache_neighbour_bytes_total",
        "Bytes of those blocks.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.neighbour_bytes))),
    ),
    counter(
        "tierfs_cache_neighbour_hits_total",
        "Chunks a later fetch took from those blocks in memory instead of the store.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.neighbour_hits))),
    ),
    counter(
        "tierfs_cache_verify_failures_total",
        "Cached chunks that failed their check against the store at start.",
        Source::Status(|s, _| s.cold.as_ref().and_then(|c| int(c.verify_failures))),
    ),
    gauge(
        "tierfs_refill_planned_bytes",
        "Bytes of the hot set the refill after a reset fetches back (only while a mount has run one).",
        Source::Status(|s, _| s.cold.as_ref()?.refill.as_ref().and_then(|r| int(r.planned_bytes))),
    ),
    gauge(
        "tierfs_refill_fetched_bytes",
        "Of those, bytes fetched back so far.",
        Source::Status(|s, _| s.cold.as_ref()?.refill.as_ref().and_then(|r| int(r.fetched_bytes))),
    ),
    gauge(
        "tierfs_refill_running",
        "1 while the refill after a reset runs.",
        Source::Status(|s, _| {
            let refill = s.cold.as_ref()?.refill.as_ref()?;
            flag(refill.state == tierfs::tier::RefillState::Running)
        }),
    ),
    gauge(
        "tierfs_follow_head_seq",
        "The last batch of the head a follower serves.",
        Source::Status(|s, _| s.follow.as_ref().and_then(|f| int(f.seq))),
    ),
    counter(
        "tierfs_follow_heads_total",
        "Newer heads a follower switched to.",
        Source::Status(|s, _| s.follow.as_ref().and_then(|f| int(f.heads))),
    ),
    gauge(
        "tierfs_follow_switch_timestamp_seconds",
        "When a follower switched to the head it serves (Unix time).",
        Source::Status(|s, _| s.follow.as_ref().and_then(|f| int(f.switched_unix))),
    ),
    counter(
        "tierfs_follow_errors_total",
        "Failed looks for, or switches to, a newer head (tried again at the next interval).",
        Source::Status(|s, _| s.follow.as_ref().and_then(|f| int(f.errors))),
    ),
    gauge(
        "tierfs_repair_queue_length",
        "Copies a backend missed, waiting to be written to it.",
        Source::Status(|s, _| s.store.as_ref().and_then(|_| int(s.pending_repairs))),
    ),
    gauge(
        "tierfs_backend_up",
        "1 while the backend's circuit breaker lets requests through.",
        Source::Backend(|b| Sample::Int(u64::from(b.available))),
    ),
    gauge(
        "tierfs_backend_consecutive_failures",
        "Requests to the backend that failed in a row.",
        Source::Backend(|b| Sample::Int(u64::from(b.consecutive_failures))),
    ),
    counter(
        "tierfs_store_requests_total",
        "Requests to the backend, by method.",
        Source::Request(|m| Sample::Int(m.calls)),
    ),
    counter(
        "tierfs_store_request_errors_total",
        "Of those, requests that failed (after their retries).",
        Source::Request(|m| Sample::Int(m.errors)),
    ),
    histogram(
        "tierfs_store_request_duration_seconds",
        "Time from a request's admission to its outcome, retries included.",
        Source::Request(|m| Sample::Latency(&m.latency)),
    ),
    counter(
        "tierfs_store_retries_total",
        "Attempts made again after a transient failure (an S3 client's own retries are inside one attempt).",
        Source::Backend(|b| Sample::Int(b.traffic.retries)),
    ),
    counter(
        "tierfs_store_refused_requests_total",
        "Requests the open circuit breaker refused without sending.",
        Source::Backend(|b| Sample::Int(b.traffic.refused)),
    ),
    counter(
        "tierfs_store_received_bytes_total",
        "Object bytes received from the backend.",
        Source::Backend(|b| Sample::Int(b.traffic.received_bytes)),
    ),
    counter(
        "tierfs_store_sent_bytes_total",
        "Object bytes sent to the backend.",
        Source::Backend(|b| Sample::Int(b.traffic.sent_bytes)),
    ),
    counter(
        "tierfs_fuse_requests_total",
        "FUSE requests answered, by operation.",
        Source::Fuse(|o| Sample::Int(o.calls)),
    ),
    counter(
        "tierfs_fuse_request_errors_total",
        "Of those, answered with an error.",
        Source::Fuse(|o| Sample::Int(o.errors)),
    ),
    histogram(
        "tierfs_fuse_request_duration_seconds",
        "Time from a FUSE request's arrival in tierfs to its reply.",
        Source::Fuse(|o| Sample::Latency(&o.latency)),
    ),
    gauge(
        "tierfs_metadata_pending_bytes",
        "Metadata changes not yet in the store.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| int(r.pending_bytes))),
    ),
    gauge(
        "tierfs_metadata_pending_batches",
        "Metadata batches not yet in the store.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| int(r.pending_batches))),
    ),
    gauge(
        "tierfs_metadata_oldest_pending_seconds",
        "Age of the oldest metadata change not yet in the store.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| millis(r.oldest_pending_ms))),
    ),
    counter(
        "tierfs_journal_segments_total",
        "Metadata journal segments written to the store.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| int(r.segments_written))),
    ),
    gauge(
        "tierfs_last_commit_timestamp_seconds",
        "When metadata last reached the store.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| int(r.last_commit_unix))),
    ),
    gauge(
        "tierfs_last_snapshot_timestamp_seconds",
        "When this mount last committed a snapshot.",
        Source::Status(|s, _| {
            s.remote.as_ref().filter(|r| r.last_snapshot_unix > 0).and_then(|r| int(r.last_snapshot_unix))
        }),
    ),
    gauge(
        "tierfs_lease_held",
        "1 while this node holds the workspace's write lease.",
        Source::Status(|s, now| {
            s.remote.as_ref().and_then(|r| flag(r.stopped.is_none() && r.lease_expires_unix > now))
        }),
    ),
    gauge(
        "tierfs_lease_expiry_timestamp_seconds",
        "When the write lease runs out unless renewed.",
        Source::Status(|s, _| s.remote.as_ref().and_then(|r| int(r.lease_expires_unix))),
    ),
    counter(
        "tierfs_watch_passes_total",
        "Passes over changed directories of a watched directory.",
        Source::Status(|s, _| s.watch.as_ref().and_then(|w| int(w.passes))),
    ),
    counter(
        "tierfs_watch_full_passes_total",
        "Of those, passes over the whole directory.",
        Source::Status(|s, _| s.watch.as_ref().and_then(|w| int(w.full_passes))),
    ),
    gauge(
        "tierfs_watch_pending_dirs",
        "Directories changed and not passed yet.",
        Source::Status(|s, _| s.watch.as_ref().and_then(|w| int(w.pending_dirs))),
    ),
    gauge(
        "tierfs_watch_oldest_pending_seconds",
        "Age of the oldest change not passed yet.",
        Source::Status(|s, _| s.watch.as_ref().and_then(|w| millis(w.oldest_pending_ms))),
    ),
    gauge(
        "tierfs_watch_rescan_only",
        "1 when change events could not be trusted and only full passes run.",
        Source::Status(|s, _| s.watch.as_ref().and_then(|w| flag(w.mode != "events"))),
    ),
];

impl Metric {
    /// Its series over the node's mounts, with their labels, in the order of `mounts`.
    fn samples<'a>(&self, mounts: &'a [MountView], now: u64) -> Vec<(Labels, Sample<'a>)> {
        let live = || mounts.iter().filter_map(|m| Some((&m.labels, m.status.as_ref()?)));
        let backends =
            move || live().flat_map(|(l, s)| s.backends.iter().map(move |b| (with(l, "backend", &b.name), b)));
        match &self.source {
            Source::Build => vec![(vec![("version", crate::serve::VERSION.into())], Sample::Int(1))],
            Source::MountState => mounts
                .iter()
                .map(|m| (with(&with(&m.labels, "state", m.phase), "detail", &m.detail), Sample::Int(1)))
                .collect(),
            Source::Mount(f) => mounts.iter().map(|m| (m.labels.clone(), f(m))).collect(),
            Source::Status(f) => live().filter_map(|(l, s)| Some((l.clone(), f(s, now)?))).collect(),
            Source::Backend(f) => backends().map(|(l, b)| (l, f(b))).collect(),
            Source::Request(f) => backends()
                .flat_map(|(l, b)| {
                    let asked = b.traffic.requests.iter().filter(|m| m.calls > 0);
                    asked.map(move |m| (with(&l, "method", &m.op), f(m)))
                })
                .collect(),
            Source::Fuse(f) => {
                live().flat_map(|(l, s)| s.fuse_ops.iter().map(move |o| (with(l, "op", &o.op), f(o)))).collect()
            }
        }
    }
}

/// The node's mounts at one scrape, for the encoder.
#[derive(Debug)]
struct Scrape {
    mounts: Vec<MountView>,
    now_unix: u64,
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for metric in METRICS {
            let samples = metric.samples(&self.mounts, self.now_unix);
            if samples.is_empty() {
                continue;
            }
            let (family, kind) = match metric.kind {
                // The encoder writes `_total` after a counter's family name.
                Kind::Counter => (metric.name.trim_end_matches("_total"), MetricType::Counter),
                Kind::Gauge => (metric.name, MetricType::Gauge),
                Kind::Histogram => (metric.name, MetricType::Histogram),
            };
            let mut family = encoder.encode_descriptor(family, metric.help, None, kind)?;
            for (labels, sample) in &samples {
                let mut series = family.encode_family(labels)?;
                encode_sample(&mut series, metric.kind, *sample)?;
            }
        }
        Ok(())
    }
}

fn encode_sample(
    series: &mut prometheus_client::encoding::MetricEncoder,
    kind: Kind,
    sample: Sample,
) -> Result<(), std::fmt::Error> {
    match (kind, sample) {
        (Kind::Counter, Sample::Int(v)) => series.encode_counter::<NoLabelSet, _, u64>(&v, None),
        (Kind::Counter, Sample::Float(v)) => series.encode_counter::<NoLabelSet, _, f64>(&v, None),
        (_, Sample::Int(v)) => series.encode_gauge(&v),
        (_, Sample::Float(v)) => series.encode_gauge(&v),
        (_, Sample::Latency(h)) => {
            // Per bucket, not cumulative: the encoder adds them up into `le` buckets.
            let bounds = LATENCY_BOUNDS_NS.iter().map(|&ns| ns as f64 / 1e9).chain([f64::INFINITY]);
            let buckets: Vec<(f64, u64)> = bounds.zip(h.buckets.iter().copied()).collect();
            series.encode_histogram::<NoLabelSet>(h.sum_ns as f64 / 1e9, h.count(), &buckets, None)
        }
    }
}

/// The exposition of the node's state (OpenMetrics text, ending in `# EOF`). Writing into a
/// String fails only on a name or label value the encoder refuses.
pub fn render(mounts: Vec<MountView>, now_unix: u64) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { mounts, now_unix }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The table of every metric, as `deploy/README.md` lists it.
pub fn markdown_table() -> String {
    let mut out = String::from("| series | type | labels | what |\n| --- | --- | --- | --- |\n");
    for m in METRICS {
        let kind = match m.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        };
        out.push_str(&format!("| `{}` | {kind} | {} | {} |\n", m.name, m.source.labels(), m.help));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(workspace: &str, mountpoint: &str, status: Option<StatusReport>) -> MountView {
        let labels = mount_labels(workspace, std::path::Path::new(mountpoint));
        let phase = if status.is_some() { "live" } else { "failed" };
        MountView { labels, phase, detail: "store unreachable".into(), restarts: 2, status }
    }

    #[test]
    fn a_failed_mount_is_down_and_says_why() {
        let text = render(vec![view("w", "/m", None)], 0).expect("encoding");
        assert!(text.contains("\ntierfs_mount_restarts_total{workspace=\"w\",mountpoint=\"/m\"} 2\n"), "{text}");
        assert!(text.contains("\ntierfs_mount_up{workspace=\"w\",mountpoint=\"/m\"} 0\n"), "{text}");
        assert!(text.contains("state=\"failed\",detail=\"store unreachable\"} 1\n"), "{text}");
        assert!(text.contains("\ntierfs_build_info{version="), "{text}");
        assert!(!text.contains("tierfs_inodes"), "a mount that is not live has no status series: {text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn families_group_their_samples_and_escape_labels() {
        let live = StatusReport { inodes: 7, ..StatusReport::default() };
        let text =
            render(vec![view("a", "/mnt/a", Some(live)), view("b\"x", "/mnt/b\\\n", None)], 0).expect("encoding");
        let up = "# HELP tierfs_mount_up 1 while the mount (or watched directory) is served.\n\
                  # TYPE tierfs_mount_up gauge\n\
                  tierfs_mount_up{workspace=\"a\",mountpoint=\"/mnt/a\"} 1\n\
                  tierfs_mount_up{workspace=\"b\\\"x\",mountpoint=\"/mnt/b\\\\\\n\"} 0\n";
        assert!(text.contains(up), "{text}");
        assert!(text.contains("# TYPE tierfs_mount_restarts counter\n"), "a counter's family has no _total: {text}");
        assert!(text.contains("\ntierfs_inodes{workspace=\"a\",mountpoint=\"/mnt/a\"} 7\n"), "{text}");
        assert!(!text.contains("tierfs_dirty_bytes"), "a mount without a store has no upload series: {text}");
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_a_sum_and_a_count() {
        let h = tierfs::telemetry::OpStats::default();
        h.record(std::time::Duration::from_micros(20), false);
        h.record(std::time::Duration::from_millis(3), true);
        let live = StatusReport { fuse_ops: vec![h.snapshot("read")], ..StatusReport::default() };
        let text = render(vec![view("w", "/m", Some(live))], 0).expect("encoding");
        assert!(text.contains("# TYPE tierfs_fuse_request_duration_seconds histogram\n"), "{text}");
        let base = "workspace=\"w\",mountpoint=\"/m\",op=\"read\"";
        for line in [
            format!("tierfs_fuse_requests_total{{{base}}} 2"),
            format!("tierfs_fuse_request_errors_total{{{base}}} 1"),
            format!("tierfs_fuse_request_duration_seconds_bucket{{le=\"0.00005\",{base}}} 1"),
            format!("tierfs_fuse_request_duration_seconds_bucket{{le=\"0.0025\",{base}}} 1"),
            format!("tierfs_fuse_request_duration_seconds_bucket{{le=\"0.005\",{base}}} 2"),
            format!("tierfs_fuse_request_duration_seconds_bucket{{le=\"+Inf\",{base}}} 2"),
            format!("tierfs_fuse_request_duration_seconds_sum{{{base}}} 0.00302"),
            format!("tierfs_fuse_request_duration_seconds_count{{{base}}} 2"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn every_metric_is_named_by_the_conventions_once() {
        let mut names = std::collections::BTreeSet::new();
        for m in METRICS {
            assert!(names.insert(m.name), "{} defined twice", m.name);
            assert!(m.name.starts_with("tierfs_"), "{}", m.name);
            assert_eq!(m.kind == Kind::Counter, m.name.ends_with("_total"), "{}: _total on counters only", m.name);
            if m.kind == Kind::Histogram {
                assert!(m.name.ends_with("_seconds"), "{}: a latency histogram in seconds", m.name);
            }
            assert!(m.help.ends_with('.') && !m.help.contains('|'), "{}: help is a sentence for a table cell", m.name);
        }
    }

    /// `deploy/README.md` lists exactly [`METRICS`], between its `metrics-table` markers.
    /// `TIERFS_WRITE_METRICS_TABLE=1` rewrites the table there instead of failing.
    #[test]
    fn the_deploy_readme_lists_every_metric() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/README.md");
        let readme = std::fs::read_to_string(&path).expect("reading deploy/README.md");
        let (begin, end) = ("<!-- metrics-table: generated from metrics/defs.rs -->\n", "<!-- metrics-table end -->");
        let start = readme.find(begin).expect("the table's begin marker") + begin.len();
        let stop = readme.find(end).expect("the table's end marker");
        let want = markdown_table();
        if readme[start..stop] != want && std::env::var_os("TIERFS_WRITE_METRICS_TABLE").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &readme[..start], &readme[stop..])).expect("writing it");
            return;
        }
        assert_eq!(
            readme[start..stop],
            want,
            "deploy/README.md's table differs from METRICS (TIERFS_WRITE_METRICS_TABLE=1 rewrites it)"
        );
    }
}
