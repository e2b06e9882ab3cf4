//! Snapshots of a whole tree, the model's and the implementation's, and the per-path diff of two.

use super::*;

/// Bytes shown as runs: holes as `zeros`, data by its first bytes and a checksum.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Bytes(pub(crate) Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "{} bytes[", b.len())?;
        let mut i = 0;
        while i < b.len() {
            let zero = b[i] == 0;
            let mut j = i;
            while j < b.len() && (b[j] == 0) == zero {
                j += 1;
            }
            if i > 0 {
                write!(f, ", ")?;
            }
            if zero {
                write!(f, "{i}..{j}: zeros")?;
            } else {
                let sum: u64 = b[i..j].iter().map(|&x| u64::from(x)).sum();
                write!(f, "{i}..{j}: {:02x?}{} sum {sum}", &b[i..j.min(i + 6)], if j - i > 6 { "…" } else { "" })?;
            }
            i = j;
        }
        write!(f, "]")
    }
}

/// Permission bits, shown in octal.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Perm(pub(crate) u16);

impl fmt::Debug for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#o}", self.0)
    }
}

/// Everything observable about one inode, as reached by one path (or an open handle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntrySnap {
    pub(crate) kind: FileKind,
    pub(crate) perm: Perm,
    pub(crate) rdev: u32,
    pub(crate) nlink: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// None for directories (their st_size is not specified).
    pub(crate) size: Option<u64>,
    pub(crate) data: Option<Bytes>,
    pub(crate) target: Option<String>,
    pub(crate) xattrs: Vec<(String, Bytes)>,
    /// Sorted readdir names, `.` and `..` included.
    pub(crate) listing: Option<Vec<String>>,
    /// The smallest path naming the same inode ("(unlinked)" for an orphan's handle).
    pub(crate) same_as: String,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) entries: BTreeMap<String, EntrySnap>,
    pub(crate) handles: Vec<EntrySnap>,
    pub(crate) live_inodes: u64,
    pub(crate) open_files: u64,
}

/// Fills in `same_as` (hard-link groups) from each entry's identity (model id or inode number).
pub(crate) fn finish(
    raw: Vec<(String, u64, EntrySnap)>,
    handles: Vec<(u64, EntrySnap)>,
    live_inodes: u64,
    open_files: u64,
) -> (Snapshot, Vec<(String, u64)>, Vec<u64>) {
    let mut first: HashMap<u64, String> = HashMap::new();
    for (path, ident, _) in &raw {
        let f = first.entry(*ident).or_insert_with(|| path.clone());
        if path < f {
            *f = path.clone();
        }
    }
    let mut idents = Vec::new();
    let mut entries = BTreeMap::new();
    for (path, ident, mut e) in raw {
        e.same_as = first[&ident].clone();
        idents.push((path.clone(), ident));
        entries.insert(path, e);
    }
    idents.sort();
    let mut handle_idents = Vec::new();
    let handles = handles
        .into_iter()
        .map(|(ident, mut e)| {
            e.same_as = first.get(&ident).cloned().unwrap_or_else(|| "(unlinked)".into());
            handle_idents.push(ident);
            e
        })
        .collect();
    (Snapshot { entries, handles, live_inodes, open_files }, idents, handle_idents)
}

pub(crate) fn diff(model: &Snapshot, real: &Snapshot) -> String {
    let mut out = String::new();
    let paths: BTreeSet<&String> = model.entries.keys().chain(real.entries.keys()).collect();
    for p in paths {
        match (model.entries.get(p), real.entries.get(p)) {
            (Some(m), Some(r)) if m != r => out += &format!("  {p}:\n    model: {m:?}\n    vfs:   {r:?}\n"),
            (Some(m), None) => out += &format!("  {p}: only in the model: {m:?}\n"),
            (None, Some(r)) => out += &format!("  {p}: only in the vfs: {r:?}\n"),
            _ => {}
        }
    }
    if model.handles != real.handles {
        out += &format!("  open handles:\n    model: {:?}\n    vfs:   {:?}\n", model.handles, real.handles);
    }
    if (model.live_inodes, model.open_files) != (real.live_inodes, real.open_files) {
        out += &format!(
            "  stats (inodes, open files): model ({}, {}), vfs ({}, {})\n",
            model.live_inodes, model.open_files, real.live_inodes, real.open_files
        );
    }
    out
}
