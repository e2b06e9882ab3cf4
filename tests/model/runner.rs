//! The runner: applies ops to both sides in lockstep and checks results, trees, handles, counts and times after every step.

use super::*;

/// Inode numbers seen so far: stable per inode, never reused.
#[derive(Default)]
pub(crate) struct Identity {
    pub(crate) by_id: HashMap<u64, Ino>,
    pub(crate) used: HashSet<Ino>,
}

impl Identity {
    pub(crate) fn check(&mut self, id: u64, ino: Ino, what: &str) -> Result<(), String> {
        match self.by_id.get(&id) {
            Some(&known) => ensure!(known == ino, "{what}: inode number changed from {known} to {ino}"),
            None => {
                ensure!(self.used.insert(ino), "{what}: inode number {ino} reused for a new inode");
                self.by_id.insert(id, ino);
            }
        }
        Ok(())
    }
}

/// Compares the model with the implementation; returns the implementation's timestamps of
/// every live inode, by model id.
pub(crate) fn check(model: &Model, real: &Real, ids: &mut Identity) -> Result<HashMap<u64, Times>, String> {
    let (ms, mids, mhandles) = model.snapshot();
    let rs = real.snapshot()?;
    if ms != rs.snap {
        return Err(format!("trees differ:\n{}", diff(&ms, &rs.snap)));
    }
    let mut times = HashMap::new();
    let pairs = mids.iter().map(|(p, id)| (p.as_str(), id)).chain(mhandles.iter().map(|id| ("open handle", id)));
    let inos = rs.paths.iter().map(|(_, ino)| ino).chain(&rs.handle_inos);
    for ((what, id), ino) in pairs.zip(inos) {
        ids.check(*id, *ino, what)?;
        let a = &rs.by_ino[ino];
        times.insert(*id, Times { mtime: a.mtime, ctime: a.ctime, crtime: a.crtime });
    }
    let files = model.nodes.values().filter(|n| matches!(n.body, Body::File(_))).count();
    let data_files = real.data_files();
    ensure!(data_files <= files, "hot tier holds {data_files} data files for {files} live regular files (leak)");
    Ok(times)
}

/// The timestamps an operation may change (atime is not checked: reads may set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Times {
    pub(crate) mtime: Timestamp,
    pub(crate) ctime: Timestamp,
    pub(crate) crtime: Timestamp,
}

/// Checks that exactly the timestamps `touched` says an op changes have changed (those it
/// says may change are not checked); birth times never change.
pub(crate) fn check_times(
    before: &HashMap<u64, Times>,
    after: &HashMap<u64, Times>,
    touched: &HashMap<Id, (Change, Change)>,
) -> Result<(), String> {
    for (id, b) in before {
        let Some(a) = after.get(id) else { continue };
        let (m, c) = touched.get(&(*id as Id)).copied().unwrap_or((Change::Never, Change::Never));
        let ok = |changed: bool, rule: Change| match rule {
            Change::Never => !changed,
            Change::May => true,
            Change::Must => changed,
        };
        ensure!(
            ok(a.mtime != b.mtime, m) && ok(a.ctime != b.ctime, c) && a.crtime == b.crtime,
            "timestamps of inode #{id} (mtime {m:?}, ctime {c:?} to change): before {b:?}, after {a:?}"
        );
    }
    Ok(())
}

pub(crate) fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::EINVAL => "EINVAL",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EBADF => "EBADF",
        libc::EIO => "EIO",
        libc::EFBIG => "EFBIG",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ERANGE => "ERANGE",
        libc::ENXIO => "ENXIO",
        _ => return format!("errno {errno}"),
    };
    name.to_string()
}

pub(crate) fn show_expect(x: &Expect) -> String {
    match x {
        Expect::Skip => "skip".into(),
        Expect::Ok(b) => format!("Ok({:?})", Bytes(b.clone())),
        Expect::Err(errs) => format!("Err({})", errs.iter().map(|&n| errno_name(n)).collect::<Vec<_>>().join(" or ")),
        Expect::Seek { data, offset, hole } => {
            let whence = if *hole { "SEEK_HOLE" } else { "SEEK_DATA" };
            format!("a {whence} answer from {offset} consistent with {:?}", Bytes(data.clone()))
        }
    }
}

pub(crate) fn show_got(x: &Result<Vec<u8>, i32>) -> String {
    match x {
        Ok(b) => format!("Ok({:?})", Bytes(b.clone())),
        Err(n) => format!("Err({})", errno_name(*n)),
    }
}

/// Outcomes per op kind (skipped, succeeded, failed), printed by `model_matches_vfs` when
/// `MODEL_STATS` is set: how to see whether the generator still reaches deep states.
pub(crate) static TALLY: Mutex<BTreeMap<String, [u64; 3]>> = Mutex::new(BTreeMap::new());

pub(crate) fn tally(op: &Op, expect: &Expect) {
    let kind = format!("{op:?}").split([' ', '{']).next().unwrap_or_default().to_string();
    let class = match expect {
        Expect::Skip => 0,
        Expect::Ok(_) | Expect::Seek { .. } => 1,
        Expect::Err(_) => 2,
    };
    TALLY.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).entry(kind).or_insert([0; 3])[class] += 1;
}

/// Runs `ops` on the model and on a fresh `Vfs`, comparing after every step.
pub(crate) fn run(ops: &[Op]) -> Result<(), String> {
    run_on(ops, Tier::Hot)
}

/// Where the `Vfs` under test keeps file data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Tier {
    /// The hot tier only.
    Hot,
    /// With a cold tier that evicts everything it seals; reads fetch chunks back into the cache.
    Cached,
    /// The same, and reads stream: fetched blocks are served from memory, never cached.
    Streamed,
}

/// The same on the given tier.
pub(crate) fn run_on(ops: &[Op], tier: Tier) -> Result<(), String> {
    let mut model = Model::new();
    let mut real = Real::new(tier)?;
    let mut ids = Identity::default();
    let mut done: Vec<Op> = Vec::new();
    let mut times = check(&model, &real, &mut ids).map_err(|m| format!("initial state: {m}"))?;
    for (step, op) in ops.iter().enumerate() {
        // Path selectors become the paths they pick in the current state, so the ops printed
        // on failure replay exactly, with no selector left.
        let op = model.concretize(op);
        done.push(op.clone());
        let replay = |msg: String| format!("{msg}\nops run (replay with check_ops):\n{done:#?}");
        let expect = model.apply(&op);
        tally(&op, &expect);
        if let Expect::Skip = expect {
            continue;
        }
        let got = real.apply(&op).map_err(|m| replay(format!("step {step} {op:?}: {m}")))?;
        let agree = match (&expect, &got) {
            (Expect::Ok(a), Ok(b)) => a == b,
            (Expect::Err(errs), Err(n)) => errs.contains(n),
            (Expect::Seek { data, offset, hole }, got) => seek_ok(data, *offset, *hole, got),
            _ => false,
        };
        if !agree {
            return Err(replay(format!(
                "step {step} {op:?}:\n  model: {}\n  vfs:   {}",
                show_expect(&expect),
                show_got(&got)
            )));
        }
        model.gc();
        let now = check(&model, &real, &mut ids).map_err(|m| replay(format!("after step {step} {op:?}: {m}")))?;
        let touched = if let Expect::Ok(_) = expect { std::mem::take(&mut model.touched) } else { HashMap::new() };
        check_times(&times, &now, &touched).map_err(|m| replay(format!("after step {step} {op:?}: {m}")))?;
        times = now;
    }
    Ok(())
}

/// Runs `ops` and panics with the first divergence.
pub(crate) fn check_ops(ops: &[Op]) {
    if let Err(msg) = run(ops) {
        panic!("{msg}");
    }
}
