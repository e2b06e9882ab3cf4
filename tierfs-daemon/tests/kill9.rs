//! Durability under `kill -9`: the serving process dies at a random moment of a numbered
//! sequence of acknowledged operations, and the recovered tree must be exactly a prefix of
//! that sequence.
//!
//! Each round plans a seeded random sequence of steps (create + write + close a file, some
//! with fsync; mkdir; rename of files and directories, also over existing files; hard links;
//! unlink; fsync of a directory), runs it from a writer thread against a
//! `tierfs mount --foreground` child, and `kill -9`s that child once a random number of
//! steps has been acknowledged. The dead mount is detached with `fusermount3 -u -z` and the
//! same data directory is mounted again. What this proves:
//! - every fsynced file is intact byte for byte;
//! - more strongly, every acknowledged step survives (tierfs promises that a process crash
//!   loses nothing acknowledged: metadata batches reach the write-ahead log with `write(2)`
//!   before the reply), and nothing after the step in flight appears: the tree equals the
//!   model after `k` steps, or after `k + 1` with the step in flight possibly partial (a file
//!   whose bytes are each either written or zero, never garbage);
//! - link counts, inode identity of hard links and directory link counts are consistent;
//! - a file unlinked while open at the crash is reclaimed at the next start (the inode count
//!   equals what the tree shows), and the recovered tree can be removed entirely.
//!
//! The seed is printed; `TIERFS_TEST_SEED=<seed>` replays a run.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Fixture, Rng};

/// Rounds per run, each with its own kill point.
const ROUNDS: usize = 12;
/// Steps planned per round; the kill comes somewhere in the middle.
const STEPS: usize = 300;

/// A run of bytes: `Rng::new(seed).bytes(len)`, or zeros. Seeded streams are
/// prefix-stable, so cutting a segment short keeps its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    seed: Option<u64>,
    len: usize,
}

/// A file's contents as a list of segments.
type Contents = Vec<Segment>;

fn bytes_of(contents: &[Segment]) -> Vec<u8> {
    let mut out = Vec::with_capacity(contents.iter().map(|s| s.len).sum());
    for s in contents {
        match s.seed {
            Some(seed) => out.extend(Rng::new(seed).bytes(s.len)),
            None => out.resize(out.len() + s.len, 0),
        }
    }
    out
}

fn len_of(contents: &[Segment]) -> usize {
    contents.iter().map(|s| s.len).sum()
}

/// `contents` cut or zero-extended to `len` bytes.
fn resized(contents: &[Segment], len: usize) -> Contents {
    let mut out = Vec::new();
    let mut left = len;
    for s in contents {
        if left == 0 {
            break;
        }
        let take = s.len.min(left);
        out.push(Segment { seed: s.seed, len: take });
        left -= take;
    }
    if left > 0 {
        out.push(Segment { seed: None, len: left });
    }
    out
}

#[derive(Debug, Clone)]
enum Step {
    /// Create a new file, write its contents, optionally fsync, close.
    File {
        path: String,
        id: usize,
        data: Segment,
        fsync: bool,
    },
    /// Open an existing file with O_TRUNC, write new contents, optionally fsync, close.
    Rewrite {
        path: String,
        data: Segment,
        fsync: bool,
    },
    /// Open an existing file with O_APPEND, write, close.
    Append {
        path: String,
        data: Segment,
    },
    /// truncate(2) by path, down or up.
    Truncate {
        path: String,
        len: usize,
    },
    Mkdir {
        path: String,
    },
    Rmdir {
        path: String,
    },
    /// Rename a file or directory; a file may replace an existing file.
    Rename {
        from: String,
        to: String,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    FsyncDir {
        path: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    Dir,
    /// A name of file `id` (hard links share the id).
    File(usize),
}

/// The expected tree: relative path → node, plus the contents of every file id.
#[derive(Debug, Clone, Default)]
struct Model {
    tree: BTreeMap<String, Node>,
    files: HashMap<usize, Contents>,
}

fn parent_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(parent, _)| parent)
}

impl Model {
    fn id_at(&self, path: &str) -> usize {
        match self.tree.get(path) {
            Some(Node::File(id)) => *id,
            other => panic!("planned a file operation on {path}: {other:?}"),
        }
    }

    fn apply(&mut self, step: &Step) {
        match step {
            Step::File { path, id, data, .. } => {
                self.files.insert(*id, vec![*data]);
                self.tree.insert(path.clone(), Node::File(*id));
            }
            Step::Rewrite { path, data, .. } => {
                let id = self.id_at(path);
                self.files.insert(id, vec![*data]);
            }
            Step::Append { path, data } => {
                let id = self.id_at(path);
                self.files.get_mut(&id).expect("contents of a planned file").push(*data);
            }
            Step::Truncate { path, len } => {
                let id = self.id_at(path);
                let contents = resized(&self.files[&id], *len);
                self.files.insert(id, contents);
            }
            Step::Mkdir { path } => {
                self.tree.insert(path.clone(), Node::Dir);
            }
            Step::Rmdir { path } | Step::Unlink { path } => {
                self.tree.remove(path);
            }
            Step::Rename { from, to } if self.tree.contains_key(to) && self.tree.get(to) == self.tree.get(from) => {
                // Two names of one file: rename(2) does nothing and succeeds.
            }
            Step::Rename { from, to } => {
                let node = self.tree.remove(from).expect("planned rename of an existing name");
                if node == Node::Dir {
                    let prefix = format!("{from}/");
                    let moved: Vec<(String, Node)> = self
                        .tree
                        .range(prefix.clone()..)
                        .take_while(|(p, _)| p.starts_with(&prefix))
                        .map(|(p, n)| (p.clone(), *n))
                        .collect();
                    for (p, n) in moved {
                        self.tree.remove(&p);
                        self.tree.insert(format!("{to}/{}", &p[prefix.len()..]), n);
                    }
                }
                self.tree.insert(to.clone(), node);
            }
            Step::Link { from, to } => {
                let node = self.tree[from];
                self.tree.insert(to.clone(), node);
            }
            Step::FsyncDir { .. } => {}
        }
    }

    fn dirs(&self) -> Vec<String> {
        let mut dirs = vec![String::new()];
        dirs.extend(self.tree.iter().filter(|(_, n)| **n == Node::Dir).map(|(p, _)| p.clone()));
        dirs
    }

    fn empty_dirs(&self) -> Vec<String> {
        self.dirs()
            .into_iter()
            .skip(1)
            .filter(|d| {
                let prefix = format!("{d}/");
                self.tree.range(prefix.clone()..).next().is_none_or(|(p, _)| !p.starts_with(&prefix))
            })
            .collect()
    }

    fn file_names(&self) -> Vec<String> {
        self.tree.iter().filter(|(_, n)| matches!(n, Node::File(_))).map(|(p, _)| p.clone()).collect()
    }

    fn nlink(&self, id: usize) -> usize {
        self.tree.values().filter(|n| **n == Node::File(id)).count()
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

fn pick<'a>(rng: &mut Rng, items: &'a [String]) -> &'a String {
    &items[rng.range(0, items.len() as u64) as usize]
}

fn random_segment(rng: &mut Rng) -> Segment {
    let len = match rng.range(0, 100) {
        0..50 => rng.range(0, 4096),
        50..85 => rng.range(4096, 100_000),
        _ => rng.range(100_000, 1_500_000),
    } as usize;
    Segment { seed: Some(rng.next_u64()), len }
}

/// A random but valid sequence of steps.
fn plan(rng: &mut Rng, steps: usize) -> Vec<Step> {
    let mut model = Model::default();
    let mut out = Vec::with_capacity(steps);
    for i in 0..steps {
        let dirs = model.dirs();
        let files = model.file_names();
        let empty = model.empty_dirs();
        let roll = rng.range(0, 100);
        let step = if roll < 40 || files.len() < 3 {
            let path = join(pick(rng, &dirs), &format!("f{i:04}"));
            Step::File { path, id: i, data: random_segment(rng), fsync: rng.chance(1, 4) }
        } else if roll < 46 {
            Step::Rewrite { path: pick(rng, &files).clone(), data: random_segment(rng), fsync: rng.chance(1, 3) }
        } else if roll < 52 {
            let mut data = random_segment(rng);
            data.len %= 70_000;
            Step::Append { path: pick(rng, &files).clone(), data }
        } else if roll < 56 {
            let path = pick(rng, &files).clone();
            let old = len_of(&model.files[&model.id_at(&path)]);
            let len = if rng.chance(2, 3) { rng.range(0, old as u64 + 1) } else { rng.range(0, 3 * old as u64 + 10) };
            Step::Truncate { path, len: len as usize }
        } else if roll < 64 {
            Step::Mkdir { path: join(pick(rng, &dirs), &format!("d{i:04}")) }
        } else if roll < 67 && !empty.is_empty() {
            Step::Rmdir { path: pick(rng, &empty).clone() }
        } else if roll < 76 {
            // A file to a new name, or over another file.
            let from = pick(rng, &files).clone();
            let to =
                if rng.chance(1, 3) { pick(rng, &files).clone() } else { join(pick(rng, &dirs), &format!("r{i:04}")) };
            if to == from { Step::FsyncDir { path: parent_of(&from).to_owned() } } else { Step::Rename { from, to } }
        } else if roll < 81 && dirs.len() > 2 {
            // A directory to a new name anywhere outside itself.
            let from = pick(rng, &dirs[1..]).clone();
            let outside: Vec<String> =
                dirs.iter().filter(|d| **d != from && !d.starts_with(&format!("{from}/"))).cloned().collect();
            Step::Rename { from, to: join(pick(rng, &outside), &format!("m{i:04}")) }
        } else if roll < 87 {
            Step::Link { from: pick(rng, &files).clone(), to: join(pick(rng, &dirs), &format!("l{i:04}")) }
        } else if roll < 96 {
            Step::Unlink { path: pick(rng, &files).clone() }
        } else {
            Step::FsyncDir { path: pick(rng, &dirs).clone() }
        };
        model.apply(&step);
        out.push(step);
    }
    out
}

/// Writes `data`, optionally fsyncs, and closes `f` reporting close's own error: closing
/// flushes the kernel's cached pages to tierfs, so a silent close would hide a failed write.
fn write_and_close(f: File, data: &Segment, fsync: bool) -> io::Result<()> {
    let mut f = f;
    for chunk in bytes_of(&[*data]).chunks(256 * 1024) {
        f.write_all(chunk)?;
    }
    if fsync {
        f.sync_all()?;
    }
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: closing the descriptor we own (taken out of the File above).
    if unsafe { libc::close(fd) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs one step against the mount.
fn execute(root: &Path, step: &Step) -> io::Result<()> {
    match step {
        Step::File { path, data, fsync, .. } => {
            write_and_close(OpenOptions::new().write(true).create_new(true).open(root.join(path))?, data, *fsync)
        }
        Step::Rewrite { path, data, fsync } => {
            write_and_close(OpenOptions::new().write(true).truncate(true).open(root.join(path))?, data, *fsync)
        }
        Step::Append { path, data } => {
            write_and_close(OpenOptions::new().append(true).open(root.join(path))?, data, false)
        }
        Step::Truncate { path, len } => {
            let c = common::cpath(&root.join(path));
            // SAFETY: a valid path.
            if unsafe { libc::truncate(c.as_ptr(), *len as libc::off_t) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        }
        Step::Mkdir { path } => fs::create_dir(root.join(path)),
        Step::Rmdir { path } => fs::remove_dir(root.join(path)),
        Step::Rename { from, to } => fs::rename(root.join(from), root.join(to)),
        Step::Link { from, to } => fs::hard_link(root.join(from), root.join(to)),
        Step::Unlink { path } => fs::remove_file(root.join(path)),
        Step::FsyncDir { path } => File::open(root.join(path))?.sync_all(),
    }
}

/// What the recovered mount shows.
#[derive(Debug)]
enum Seen {
    Dir { nlink: u64, ino: u64 },
    File { nlink: u64, ino: u64, bytes: Vec<u8> },
    Other,
}

fn observe(root: &Path) -> BTreeMap<String, Seen> {
    common::walk_tree(root)
        .into_iter()
        .map(|(rel, path, m)| {
            let seen = if m.is_dir() {
                Seen::Dir { nlink: m.nlink(), ino: m.ino() }
            } else if m.is_file() {
                let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {rel}: {e}"));
                assert_eq!(bytes.len() as u64, m.len(), "{rel}: size and contents disagree");
                Seen::File { nlink: m.nlink(), ino: m.ino(), bytes }
            } else {
                Seen::Other
            };
            (rel, seen)
        })
        .collect()
}

/// The file written by the step in flight at the crash: its contents may be incomplete.
#[derive(Debug, Clone, Copy)]
struct Partial {
    id: usize,
    /// Leading bytes that must be exact (what the file held before an append).
    exact: usize,
}

/// Differences between what the mount shows and `model`. For the `partial` file, any length
/// from `exact` up to the full contents is accepted, as long as every byte past `exact` is
/// either the one written or still zero (never garbage, never stale data).
fn differences(seen: &BTreeMap<String, Seen>, model: &Model, partial: Option<Partial>) -> Vec<String> {
    let mut problems = Vec::new();
    let expected: BTreeSet<&String> = model.tree.keys().collect();
    let actual: BTreeSet<&String> = seen.keys().collect();
    for missing in expected.difference(&actual) {
        problems.push(format!("missing {missing} ({:?})", model.tree[*missing]));
    }
    for extra in actual.difference(&expected) {
        problems.push(format!("unexpected {extra}"));
    }
    let mut ino_of_id: HashMap<usize, u64> = HashMap::new();
    for (path, node) in &model.tree {
        let Some(s) = seen.get(path) else { continue };
        match (node, s) {
            (Node::Dir, Seen::Dir { nlink, .. }) => {
                let prefix = format!("{path}/");
                let subdirs = model
                    .tree
                    .iter()
                    .filter(|(p, n)| **n == Node::Dir && p.starts_with(&prefix) && !p[prefix.len()..].contains('/'))
                    .count() as u64;
                if *nlink != 2 + subdirs {
                    problems.push(format!("{path}: nlink {nlink}, expected {}", 2 + subdirs));
                }
            }
            (Node::File(id), Seen::File { nlink, ino, bytes }) => {
                let want = bytes_of(&model.files[id]);
                match partial.filter(|p| p.id == *id) {
                    Some(Partial { exact, .. }) => {
                        let ok = bytes.len() >= exact
                            && bytes.len() <= want.len()
                            && bytes[..exact] == want[..exact]
                            && bytes.iter().zip(&want).skip(exact).all(|(b, w)| b == w || *b == 0);
                        if !ok {
                            problems.push(format!(
                                "{path}: the file in flight ({} bytes, {exact} of them old, {} when complete) \
                                 holds bytes that are neither the old ones, the written ones nor zero",
                                bytes.len(),
                                want.len()
                            ));
                        }
                    }
                    None if *bytes != want => {
                        let at = bytes.iter().zip(&want).position(|(a, b)| a != b);
                        problems.push(format!(
                            "{path}: contents differ ({} bytes, expected {}, first difference at {at:?})",
                            bytes.len(),
                            want.len()
                        ));
                    }
                    None => {}
                }
                let links = model.nlink(*id) as u64;
                if *nlink != links {
                    problems.push(format!("{path}: nlink {nlink}, expected {links}"));
                }
                if let Some(other) = ino_of_id.insert(*id, *ino) {
                    if other != *ino {
                        problems.push(format!("{path}: hard links of one file show different inodes"));
                    }
                }
            }
            (node, s) => problems.push(format!("{path}: expected {node:?}, found {s:?}")),
        }
    }
    problems
}

fn root_nlink_problem(root: &Path, seen: &BTreeMap<String, Seen>) -> Option<String> {
    let top_dirs = seen.iter().filter(|(p, s)| !p.contains('/') && matches!(s, Seen::Dir { .. })).count() as u64;
    let nlink = fs::metadata(root).expect("stat root").nlink();
    (nlink != 2 + top_dirs).then(|| format!("root nlink {nlink}, expected {}", 2 + top_dirs))
}

/// The steps whose paths appear in `problems` (each problem starts with a path or with
/// "missing "/"unexpected " and a path), for failure messages.
fn history(steps: &[Step], problems: &[String]) -> String {
    let names: BTreeSet<String> = problems
        .iter()
        .filter_map(|p| {
            let p = p.strip_prefix("missing ").or_else(|| p.strip_prefix("unexpected ")).unwrap_or(p);
            p.split([':', ' ']).next().map(|n| n.rsplit('/').next().unwrap_or(n).to_owned())
        })
        .collect();
    steps
        .iter()
        .enumerate()
        .filter(|(_, step)| {
            let text = format!("{step:?}");
            names.iter().any(|n| text.contains(&format!("/{n}\"")) || text.contains(&format!("\"{n}\"")))
        })
        .map(|(i, step)| format!("  {i}: {step:?}\n"))
        .collect()
}

struct Outcome {
    acked: usize,
    /// (step, file id, contents) of every acknowledged fsync of a file.
    fsynced: Vec<(usize, usize, Contents)>,
    error: io::Error,
}

fn round(round: usize, rng: &mut Rng) {
    let mut fx = Fixture::new();
    let steps = Arc::new(plan(rng, STEPS));
    let kill_after = rng.range(5, STEPS as u64 - 20) as usize;
    let extra_delay = Duration::from_micros(rng.range(0, 3000));
    println!("round {round}: kill after {kill_after} acknowledged steps + {extra_delay:?}");

    let mut server = fx.spawn_foreground();
    let root = fx.mountpoint.clone();

    // A file unlinked while open, still open at the crash: the next start must reclaim it.
    let mut orphan = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(root.join("orphan"))
        .expect("create the orphan");
    orphan.write_all(&vec![9u8; 300_000]).expect("write the orphan");
    orphan.sync_all().expect("fsync the orphan");
    fs::remove_file(root.join("orphan")).expect("unlink the orphan");
    orphan.write_all_at(b"still open", 0).expect("write to the orphan after unlink");

    let acked = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let writer = {
        let (steps, acked, killed, root) = (steps.clone(), acked.clone(), killed.clone(), root.clone());
        thread::spawn(move || {
            let mut fsynced = Vec::new();
            let mut model = Model::default();
            for (i, step) in steps.iter().enumerate() {
                if let Err(error) = execute(&root, step) {
                    assert!(
                        killed.load(Ordering::SeqCst),
                        "step {i} {step:?} failed before the kill: {error} (a real failure, not the crash)"
                    );
                    return Outcome { acked: i, fsynced, error };
                }
                model.apply(step);
                if let Step::File { path, fsync: true, .. } | Step::Rewrite { path, fsync: true, .. } = step {
                    let id = model.id_at(path);
                    fsynced.push((i, id, model.files[&id].clone()));
                }
                acked.store(i + 1, Ordering::SeqCst);
            }
            Outcome { acked: steps.len(), fsynced, error: io::Error::other("the writer finished before the kill") }
        })
    };

    let deadline = Instant::now() + Duration::from_secs(40);
    while acked.load(Ordering::SeqCst) < kill_after {
        assert!(!writer.is_finished() || acked.load(Ordering::SeqCst) >= kill_after, "the writer stopped early");
        assert!(Instant::now() < deadline, "the writer is stuck at step {}", acked.load(Ordering::SeqCst));
        thread::sleep(Duration::from_micros(200));
    }
    thread::sleep(extra_delay);
    killed.store(true, Ordering::SeqCst);
    // The writer stops on the dead mount (ENOTCONN) before it goes: once unmounted, its next
    // call would land in the empty directory beneath and count as acknowledged.
    let status = server.kill9_leaving_the_dead_mount();
    let outcome = match writer.join() {
        Ok(outcome) => outcome,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    server.unmount_dead();
    drop(orphan);
    println!(
        "round {round}: killed ({status}) with {} of {} steps acknowledged, {} fsynced; the writer then saw: {}",
        outcome.acked,
        steps.len(),
        outcome.fsynced.len(),
        outcome.error
    );
    assert!(outcome.acked >= kill_after, "acknowledged steps cannot go backwards");

    // Mount the same data directory again and compare with the plan.
    fx.mount();
    let seen = observe(&root);
    let mut before = Model::default();
    for step in &steps[..outcome.acked] {
        before.apply(step);
    }

    let exact = differences(&seen, &before, None);
    let (accepted, accepted_model, partial_id) = if exact.is_empty() {
        ("the acknowledged prefix".to_owned(), before.clone(), None)
    } else if let Some(in_flight) = steps.get(outcome.acked) {
        let mut after = before.clone();
        after.apply(in_flight);
        let partial = match in_flight {
            Step::File { id, .. } => Some(Partial { id: *id, exact: 0 }),
            Step::Rewrite { path, .. } => Some(Partial { id: before.id_at(path), exact: 0 }),
            Step::Append { path, .. } => {
                let id = before.id_at(path);
                Some(Partial { id, exact: len_of(&before.files[&id]) })
            }
            _ => None,
        };
        let with_step = differences(&seen, &after, partial);
        assert!(
            with_step.is_empty(),
            "round {round}: the recovered tree is not a prefix of the acknowledged steps.\n\
             against the {} acknowledged steps: {exact:#?}\n\
             with step {} in flight ({in_flight:?}): {with_step:#?}\n\
             steps that named those paths:\n{}",
            outcome.acked,
            outcome.acked,
            history(&steps[..=outcome.acked], &exact)
        );
        (format!("the acknowledged prefix plus the step in flight ({in_flight:?})"), after, partial.map(|p| p.id))
    } else {
        panic!("round {round}: every step was acknowledged, yet the tree differs: {exact:#?}");
    };
    // Every fsynced file is intact byte for byte: each name the accepted model gives it shows
    // the contents it had when fsynced, unless a later step changed it (then the comparison
    // above already checked the newer contents) or the step in flight is rewriting it.
    for &(i, id, ref synced) in &outcome.fsynced {
        if accepted_model.files.get(&id) != Some(synced) || partial_id == Some(id) {
            continue;
        }
        let want = bytes_of(synced);
        for (path, node) in &accepted_model.tree {
            if *node == Node::File(id) {
                match seen.get(path) {
                    Some(Seen::File { bytes, .. }) => assert!(
                        *bytes == want,
                        "round {round}: fsynced file {path} (step {i}) is not intact: {} bytes, expected {}",
                        bytes.len(),
                        want.len()
                    ),
                    other => panic!("round {round}: fsynced file {path} (step {i}) is missing: {other:?}"),
                }
            }
        }
    }
    println!("round {round}: recovered {} entries: {accepted}", seen.len());
    if let Some(problem) = root_nlink_problem(&root, &seen) {
        panic!("round {round}: {problem}");
    }

    // Nothing leaked: the orphan was reclaimed, and every inode is reachable.
    let reachable: BTreeSet<u64> = seen
        .values()
        .filter_map(|s| match s {
            Seen::Dir { ino, .. } | Seen::File { ino, .. } => Some(*ino),
            Seen::Other => None,
        })
        .collect();
    let inodes = fx.status()["inodes"].as_u64().expect("inodes in status");
    assert_eq!(
        inodes,
        reachable.len() as u64 + 1,
        "round {round}: the store holds {inodes} inodes but the tree shows {} plus the root \
         (the orphan was not reclaimed, or an inode leaked)",
        reachable.len()
    );

    // The recovered tree is fully usable: remove it all.
    for entry in fs::read_dir(&root).expect("readdir root") {
        let path = entry.expect("entry").path();
        if path.is_dir() && !path.is_symlink() {
            fs::remove_dir_all(&path).unwrap_or_else(|e| panic!("rm -r {}: {e}", path.display()));
        } else {
            fs::remove_file(&path).unwrap_or_else(|e| panic!("rm {}: {e}", path.display()));
        }
    }
    assert_eq!(fx.status()["inodes"].as_u64(), Some(1), "round {round}: only the root is left");
    fx.umount();
}

#[test]
fn kill9_recovers_a_prefix_of_acknowledged_operations() {
    let seed = Rng::seed_from_env();
    println!("kill9 seed {seed} (TIERFS_TEST_SEED={seed} replays this run)");
    let mut rng = Rng::new(seed);
    for r in 0..ROUNDS {
        round(r, &mut rng);
    }
}

/// A clean SIGTERM of the foreground server is the opposite case: it must flush and
/// unmount, and everything (even what was never fsynced) is there afterwards.
#[test]
fn sigterm_flushes_and_unmounts() {
    let mut fx = Fixture::new();
    let mut server = fx.spawn_foreground();
    let contents = bytes_of(&[Segment { seed: Some(77), len: 2_000_000 }]);
    fs::create_dir(fx.p("dir")).expect("mkdir");
    fs::write(fx.p("dir/file"), &contents).expect("write");
    let status = server.terminate(Duration::from_secs(60));
    assert!(!common::is_mounted(&fx.mountpoint), "still mounted after SIGTERM ({status})");
    assert!(server.log_text().contains("flushed everything"), "the flush is reported: {}", server.log_text());
    fx.mount();
    assert!(fs::read(fx.p("dir/file")).expect("read") == contents, "contents after SIGTERM and remount");
}

/// The serving process must also *exit* cleanly after a clean shutdown: status 0 for a
/// service manager, and RocksDB closed before the process goes. Repeated because the
/// failure is a race at exit.
#[test]
fn clean_shutdown_exits_with_status_zero_every_time() {
    for cycle in 0..30 {
        let fx = Fixture::new();
        let mut server = fx.spawn_foreground();
        fs::write(fx.p("f"), vec![1u8; 100_000]).expect("write");
        let status = server.terminate(Duration::from_secs(60));
        assert!(
            status.success(),
            "cycle {cycle}: SIGTERM should end `tierfs mount --foreground` with status 0, got {status}; log:\n{}",
            server.log_text()
        );
    }
}
