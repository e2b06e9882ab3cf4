//! `tierfs diff`: which paths differ between two states of a workspace (two snapshots, or a
//! snapshot and the latest state), computed from their metadata alone — file contents are
//! compared by the block ids of their chunks, so nothing is downloaded but metadata.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::meta::{MetaError, MetaStore};
use crate::types::{FileKind, Ino, ROOT_INO};

/// One path that differs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `+` added, `-` removed, `M` modified.
    pub op: char,
    pub path: String,
    /// For `M`: what differs (`type`, `content`, `size`, `mode`, `owner`, `mtime`, `xattrs`,
    /// `target`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub what: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
struct Node {
    kind: FileKind,
    perm: u16,
    owner: (u32, u32),
    size: u64,
    mtime: (i64, u32),
    content: Vec<[u8; 32]>,
    target: Option<Vec<u8>>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn index(meta: &MetaStore) -> Result<BTreeMap<String, Node>, MetaError> {
    let mut chunks: HashMap<Ino, Vec<(u64, [u8; 32])>> = HashMap::new();
    for (ino, idx, rec) in meta.chunks()? {
        chunks.entry(ino).or_default().push((idx, rec.block));
    }
    let mut out = BTreeMap::new();
    let mut stack = vec![(ROOT_INO, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for (name, ino, kind) in meta.list_dir(dir)? {
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&name));
            let Some(rec) = meta.inode(ino)? else { continue };
            if kind == FileKind::Dir {
                stack.push((ino, path.clone()));
            }
            let mut content: Vec<(u64, [u8; 32])> = chunks.get(&ino).cloned().unwrap_or_default();
            content.sort_unstable();
            let mut xattrs = BTreeMap::new();
            for n in meta.xattr_names(ino)? {
                let v = meta.xattr(ino, &n)?.unwrap_or_default();
                xattrs.insert(n, v);
            }
            let a = rec.attr;
            out.insert(
                path,
                Node {
                    kind: a.kind,
                    perm: a.perm,
                    owner: (a.uid, a.gid),
                    size: a.size,
                    mtime: (a.mtime.secs, a.mtime.nanos),
                    content: content.into_iter().map(|(_, b)| b).collect(),
                    target: if kind == FileKind::Symlink { meta.symlink(ino)? } else { None },
                    xattrs,
                },
            );
        }
    }
    Ok(out)
}

/// The paths that differ from `a` to `b`, sorted by path.
pub fn diff(a: &MetaStore, b: &MetaStore) -> Result<Vec<Change>, MetaError> {
    let (a, b) = (index(a)?, index(b)?);
    let mut out = Vec::new();
    for (path, old) in &a {
        match b.get(path) {
            None => out.push(Change { op: '-', path: path.clone(), what: Vec::new() }),
            Some(new) if new != old => {
                let mut what = Vec::new();
                let mut differs = |cond: bool, name: &str| {
                    if cond {
                        what.push(name.to_string());
                    }
                };
                differs(old.kind != new.kind, "type");
                differs(old.content != new.content, "content");
                differs(old.size != new.size, "size");
                differs(old.perm != new.perm, "mode");
                differs(old.owner != new.owner, "owner");
                differs(old.mtime != new.mtime, "mtime");
                differs(old.xattrs != new.xattrs, "xattrs");
                differs(old.target != new.target, "target");
                out.push(Change { op: 'M', path: path.clone(), what });
            }
            Some(_) => {}
        }
    }
    for path in b.keys().filter(|p| !a.contains_key(*p)) {
        out.push(Change { op: '+', path: path.clone(), what: Vec::new() });
    }
    out.sort_by(|x, y| x.path.cmp(&y.path));
    Ok(out)
}
