//! `kill -9` of a mount with a store in the middle of writes that turn chunks dirty, extend
//! files and overwrite chunks already sealed (issue 48: one metadata commit per write, whose
//! batch carries the chunk's unsealed mark with the size).
//!
//! Each round writes from one thread into three open files, with `pwrite`s that append,
//! jump past the end (a hole, then a new chunk), or overwrite anywhere inside the file,
//! 1 byte to 300 KiB each, no fsync; uploads run meanwhile (`--dirty-age 0`), so chunks go
//! back and forth between sealed and dirty. The daemon is killed after a random number of
//! acknowledged writes, the same data dir is mounted again and every file must hold exactly
//! what was acknowledged (or, for the file of the write in flight, bytes each either the old
//! one, the new one or zero, and a size between the two). Then `tierfs sync` and a fresh node
//! restoring from the store show the same bytes: every chunk the crash left unsealed was
//! sealed and uploaded after the restart, none was served from an older record.
//!
//! The seed is printed; `TIERFS_TEST_SEED=<seed>` replays a run.

mod common;
mod store_node;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::Rng;
use store_node::Node;
use tierfs_test_support::moto;

const ROUNDS: usize = 4;
const STEPS: usize = 400;
const FILES: usize = 3;
const CHUNK: u64 = 4 << 20;

/// One planned `pwrite`: `len` bytes of the seeded stream `seed` at `offset` of file `file`.
#[derive(Debug, Clone, Copy)]
struct Step {
    file: usize,
    offset: u64,
    len: usize,
    seed: u64,
}

impl Step {
    fn bytes(&self) -> Vec<u8> {
        Rng::new(self.seed).bytes(self.len)
    }

    /// `contents` after this write.
    fn apply(&self, contents: &mut Vec<u8>) {
        let end = self.offset as usize + self.len;
        if contents.len() < end {
            contents.resize(end, 0);
        }
        contents[self.offset as usize..end].copy_from_slice(&self.bytes());
    }
}

/// Writes that append, skip into a later chunk, or overwrite, sized so files grow past a few
/// chunks within a round.
fn plan(rng: &mut Rng) -> Vec<Step> {
    let mut sizes = [0u64; FILES];
    (0..STEPS)
        .map(|_| {
            let file = rng.range(0, FILES as u64) as usize;
            let len = if rng.chance(1, 5) { rng.range(1, 4096) } else { rng.range(4096, 300 << 10) };
            let size = sizes[file];
            let offset = match rng.range(0, 10) {
                0..=3 => size,
                4 => size + rng.range(1, CHUNK + CHUNK / 2),
                _ => rng.range(0, size.max(1)),
            };
            sizes[file] = sizes[file].max(offset + len);
            Step { file, offset, len: len as usize, seed: rng.next_u64() }
        })
        .collect()
}

fn name(file: usize) -> String {
    format!("f{file}")
}

/// The contents of every file after the first `n` steps.
fn model(steps: &[Step], n: usize) -> Vec<Vec<u8>> {
    let mut files = vec![Vec::new(); FILES];
    for step in &steps[..n] {
        step.apply(&mut files[step.file]);
    }
    files
}

/// Checks what `root` shows against `steps`, `acked` of them acknowledged; the next one may be
/// partly done.
fn check(root: &Path, steps: &[Step], acked: usize, when: &str) {
    let before = model(steps, acked);
    let in_flight = steps.get(acked);
    for (file, old) in before.iter().enumerate() {
        let seen = fs::read(root.join(name(file))).unwrap_or_else(|e| panic!("{when}: read {}: {e}", name(file)));
        if seen == *old {
            continue;
        }
        let step = in_flight.filter(|s| s.file == file).unwrap_or_else(|| {
            let at = seen.iter().zip(old).position(|(a, b)| a != b);
            panic!(
                "{when}: {} differs from the acknowledged writes ({} bytes, expected {}, first difference at {at:?})",
                name(file),
                seen.len(),
                old.len()
            )
        });
        let mut new = old.clone();
        step.apply(&mut new);
        let (lo, hi) = (old.len().min(new.len()), old.len().max(new.len()));
        let byte_ok = |i: usize, b: u8| b == 0 || old.get(i) == Some(&b) || new.get(i) == Some(&b);
        let bad = seen.iter().enumerate().position(|(i, &b)| !byte_ok(i, b));
        assert!(
            (lo..=hi).contains(&seen.len()) && bad.is_none(),
            "{when}: {} ({} bytes) is neither the acknowledged state ({} bytes) nor the write in flight \
             ({step:?}, {} bytes) partly done; first bad byte at {bad:?}",
            name(file),
            seen.len(),
            old.len(),
            new.len()
        );
    }
}

fn round(round: usize, rng: &mut Rng) {
    let steps = Arc::new(plan(rng));
    let kill_after = rng.range(20, STEPS as u64 - 20) as usize;
    let extra_delay = Duration::from_micros(rng.range(0, 3000));
    println!("round {round}: kill after {kill_after} acknowledged writes + {extra_delay:?}");
    let mut a = Node::init_file();
    a.mount(&["--dirty-age", "0"]);
    let root = a.fx.mountpoint.clone();
    let files: Vec<File> = (0..FILES)
        .map(|f| OpenOptions::new().read(true).write(true).create(true).truncate(true).open(root.join(name(f))))
        .collect::<Result<_, _>>()
        .expect("create the files");
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (steps, acked) = (steps.clone(), acked.clone());
        thread::spawn(move || {
            for (i, step) in steps.iter().enumerate() {
                if files[step.file].write_all_at(&step.bytes(), step.offset).is_err() {
                    return; // the kill
                }
                acked.store(i + 1, Ordering::SeqCst);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.load(Ordering::SeqCst) < kill_after {
        assert!(!writer.is_finished(), "the writer stopped early, at step {}", acked.load(Ordering::SeqCst));
        assert!(Instant::now() < deadline, "the writer is stuck at step {}", acked.load(Ordering::SeqCst));
        thread::sleep(Duration::from_micros(200));
    }
    thread::sleep(extra_delay);
    a.kill9();
    let _ = writer.join();
    let done = acked.load(Ordering::SeqCst);
    println!("round {round}: killed with {done} of {STEPS} writes acknowledged");

    a.mount(&["--dirty-age", "0"]);
    check(&root, &steps, done, &format!("round {round}, after the restart"));
    let seen: Vec<Vec<u8>> = (0..FILES).map(|f| fs::read(root.join(name(f))).expect("read")).collect();
    a.sync("after the crash").assert_success("tierfs sync");
    a.fx.umount();

    // Every chunk reached the store: a fresh node restores the same bytes.
    let mut b = Node::new(&a.store_file);
    b.mount(&[]);
    for (f, want) in seen.iter().enumerate() {
        let got = fs::read(b.fx.mountpoint.join(name(f))).expect("read on the fresh node");
        let at = got.iter().zip(want).position(|(x, y)| x != y);
        assert!(
            got == *want,
            "round {round}: {} on a fresh node: {} bytes, expected {}, first difference at {at:?}",
            name(f),
            got.len(),
            want.len()
        );
    }
    b.fx.umount();
}

#[test]
fn kill_9_during_writes_that_dirty_extend_and_overwrite_chunks_loses_nothing_acknowledged() {
    let seed = Rng::seed_from_env();
    println!("write_crash seed {seed} (TIERFS_TEST_SEED={seed} replays this run)");
    let mut rng = Rng::new(seed);
    for r in 0..ROUNDS {
        round(r, &mut rng);
    }
}
