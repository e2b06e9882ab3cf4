//! The layer rules of docs/ARCHITECTURE.md, checked from the source: no module of the core
//! (`src/`) names a module of its own layer or of one above it, the daemon's modules
//! (`tierfs-daemon/src/`) form no cycle, and no files of one directory form a circle. Read from the `crate::…` paths of each file, comments
//! left out; the checkers are tested on made-up trees first, so this test can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The core's top-level modules, lowest first. A module may use only modules of a lower rank;
/// a module missing here fails the check (add it where it belongs).
const CORE_RANKS: &[(&str, u32)] = &[
    ("types", 0),
    ("telemetry", 0),
    ("crypto", 1),
    ("backend", 1),
    ("block", 2),
    ("meta", 3),
    ("store", 3),
    ("tier", 4),
    ("remote", 4),
    ("vfs", 5),
    ("export", 6),
    ("history", 6),
    ("session", 7),
    ("watch", 8),
    ("error", 9),
];

/// `crate::name` references of each top-level module under `root`: module → modules it names.
fn references(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).expect("under root");
            let first = rel.components().next().expect("component").as_os_str().to_string_lossy().into_owned();
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" || module == "main" || module == "bin" {
                continue;
            }
            let text = fs::read_to_string(&path).expect("read");
            let named = out.entry(module.clone()).or_default();
            for used in crate_paths(&text) {
                if used != module {
                    named.insert(used);
                }
            }
        }
    }
    out
}

/// The module names after `crate::` in code (not in `//` comments), in `use` lines and paths.
fn crate_paths(text: &str) -> Vec<String> {
    paths_after(text, "crate::")
}

/// The names after `prefix` (`crate::`, `super::`) in code, comments left out.
fn paths_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // e.g. `tierfs_crate::`, `super::super::`
            }
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// For each directory under `root`, the files in it (sibling modules) and the siblings each
/// names: `crate::x` at the crate's root, `super::x` in a module's directory. A `mod.rs` is the
/// directory's parent module, not a sibling.
fn sibling_references(root: &Path) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut files = Vec::new();
        let mut siblings = BTreeSet::new();
        for entry in fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let name = path.file_stem().expect("a name").to_string_lossy().into_owned();
            if path.is_dir() {
                stack.push(path);
                siblings.insert(name);
            } else if path.extension().is_some_and(|e| e == "rs") && !["mod", "lib", "main"].contains(&name.as_str()) {
                siblings.insert(name.clone());
                files.push((name, path));
            }
        }
        let prefix = if dir == root { "crate::" } else { "super::" };
        let mut refs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (name, path) in files {
            let text = fs::read_to_string(&path).expect("read");
            let named: BTreeSet<String> =
                paths_after(&text, prefix).into_iter().filter(|u| *u != name && siblings.contains(u)).collect();
            refs.insert(name, named);
        }
        out.insert(dir.strip_prefix(root).expect("under root").display().to_string(), refs);
    }
    out
}

/// Every reference that breaks the ranks, as "a -> b" lines.
fn rank_violations(refs: &BTreeMap<String, BTreeSet<String>>, ranks: &[(&str, u32)]) -> Vec<String> {
    let rank: BTreeMap<&str, u32> = ranks.iter().copied().collect();
    let mut bad = Vec::new();
    for (module, used) in refs {
        let Some(&r) = rank.get(module.as_str()) else {
            bad.push(format!("{module}: not in the layer table"));
            continue;
        };
        for u in used {
            match rank.get(u.as_str()) {
                Some(&ru) if ru < r => {}
                Some(&ru) => bad.push(format!("{module} (layer {r}) -> {u} (layer {ru})")),
                None => bad.push(format!("{module} -> {u}: not in the layer table")),
            }
        }
    }
    bad
}

/// A cycle among the modules, if any (as the path around it).
fn find_cycle(refs: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        refs: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(m) {
            Some(2) => return None,
            Some(1) => {
                let start = path.iter().position(|p| p == m).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(m.to_string());
                return Some(cycle);
            }
            _ => {}
        }
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for n in refs.get(m).into_iter().flatten() {
            if let Some(c) = visit(n, refs, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in refs.keys() {
        if let Some(c) = visit(m, refs, &mut state, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

fn tree(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in edges {
        out.entry((*a).to_string()).or_default().insert((*b).to_string());
        out.entry((*b).to_string()).or_default();
    }
    out
}

#[test]
fn the_checkers_catch_what_they_look_for() {
    assert_eq!(
        crate_paths("use crate::meta::X; // crate::vfs in a comment\nlet y = crate::tier::f(); my_crate::z;"),
        ["meta", "tier"]
    );
    let ranks = &[("low", 0), ("high", 1)];
    assert!(rank_violations(&tree(&[("high", "low")]), ranks).is_empty());
    assert_eq!(rank_violations(&tree(&[("low", "high")]), ranks), ["low (layer 0) -> high (layer 1)"]);
    assert_eq!(rank_violations(&tree(&[("new", "low")]), ranks), ["new: not in the layer table"]);
    assert_eq!(find_cycle(&tree(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        find_cycle(&tree(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn core_modules_use_only_lower_layers() {
    let refs = references(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(refs.contains_key("vfs") && refs.contains_key("types"), "the core's modules were not found: {refs:?}");
    let bad = rank_violations(&refs, CORE_RANKS);
    assert!(bad.is_empty(), "calls must only go down (docs/ARCHITECTURE.md, \"Layers\"):\n{}", bad.join("\n"));
}

#[test]
fn daemon_modules_form_no_cycle() {
    let refs = references(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tierfs-daemon/src"));
    assert!(refs.contains_key("serve") && refs.contains_key("cli"), "the daemon's modules were not found: {refs:?}");
    if let Some(cycle) = find_cycle(&refs) {
        panic!("the daemon's modules import each other in a circle: {}", cycle.join(" -> "));
    }
}

/// No two files of one directory name each other, in the core, the adapter or the daemon
/// (a circle of files is a module that should be one, or a piece in the wrong file).
#[test]
fn sibling_files_form_no_circle() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let core = sibling_references(&here.join("src"));
    // The reader sees what it must: a known one-way edge.
    assert!(core["tier/cold"]["refill"].contains("fetch"), "references were not read: {:?}", core["tier/cold"]);
    for root in ["src", "tierfs-mount/src", "tierfs-daemon/src"] {
        for (dir, refs) in sibling_references(&here.join(root)) {
            if let Some(cycle) = find_cycle(&refs) {
                panic!("files of {root}/{dir} import each other in a circle: {}", cycle.join(" -> "));
            }
        }
    }
}
