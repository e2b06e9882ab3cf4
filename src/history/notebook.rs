//! What the history records of a Jupyter notebook: the notebook with its outputs, execution
//! counts and volatile metadata stripped, by nbstripout's default rules, so a re-run that
//! changed only outputs changes nothing in the history. The full notebook stays in the
//! snapshot.
//!
//! Invariants:
//! - a file that is not a notebook (not JSON, no `cells` list) is recorded unchanged;
//! - the output is nbformat's own layout (keys sorted, one-space indent, UTF-8 unescaped,
//!   a final newline), so a notebook saved by Jupyter strips to the same bytes whatever the
//!   outputs were.

use serde_json::{Map, Value};

/// Cell metadata keys nbstripout drops by default.
const CELL_METADATA: [&str; 6] = ["collapsed", "scrolled", "ExecuteTime", "execution", "heading_collapsed", "hidden"];
/// Notebook metadata keys nbstripout drops by default.
const NOTEBOOK_METADATA: [&str; 2] = ["signature", "widgets"];

/// The stripped form of `bytes`, or `None` when they are not a notebook.
pub fn strip(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut nb: Value = serde_json::from_slice(bytes).ok()?;
    let top = nb.as_object_mut()?;
    if let Some(meta) = top.get_mut("metadata").and_then(Value::as_object_mut) {
        drop_keys(meta, &NOTEBOOK_METADATA);
    }
    for cell in top.get_mut("cells")?.as_array_mut()? {
        let Some(cell) = cell.as_object_mut() else { continue };
        if cell.get("cell_type").and_then(Value::as_str) == Some("code") {
            cell.insert("outputs".into(), Value::Array(Vec::new()));
            cell.insert("execution_count".into(), Value::Null);
        }
        if let Some(meta) = cell.get_mut("metadata").and_then(Value::as_object_mut) {
            drop_keys(meta, &CELL_METADATA);
        }
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(b" "));
    serde::Serialize::serialize(&sorted(nb), &mut ser).ok()?;
    out.push(b'\n');
    Some(out)
}

fn drop_keys(map: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        map.remove(*k);
    }
}

/// `v` with every object's keys in order (whatever order serde_json's map keeps).
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    fn notebook(outputs: &str, count: &str) -> String {
        format!(
            r##"{{"cells": [{{"cell_type": "code", "execution_count": {count}, "id": "a1",
              "metadata": {{"scrolled": true, "tags": ["x"]}}, "outputs": {outputs}, "source": ["print(1)"]}},
             {{"cell_type": "markdown", "id": "b2", "metadata": {{}}, "source": ["# Title é"]}}],
             "metadata": {{"kernelspec": {{"name": "python3"}}, "widgets": {{"state": 1}}}},
             "nbformat": 4, "nbformat_minor": 5}}"##
        )
    }

    #[test]
    fn outputs_counts_and_volatile_metadata_go() {
        let a = strip(notebook("[]", "null").as_bytes()).unwrap();
        let b = strip(notebook(r#"[{"output_type": "stream", "name": "stdout", "text": ["1\n"]}]"#, "7").as_bytes())
            .unwrap();
        assert_eq!(a, b, "an outputs-only change strips to the same bytes");
        let text = String::from_utf8(a).unwrap();
        assert!(!text.contains("scrolled") && !text.contains("widgets"), "{text}");
        assert!(text.contains("\"tags\"") && text.contains("kernelspec") && text.contains('é'), "{text}");
        assert!(text.starts_with("{\n \"cells\": [\n  {\n"), "nbformat's layout: {text}");
        assert!(text.ends_with("}\n"));
    }

    #[test]
    fn a_source_change_shows() {
        let a = strip(notebook("[]", "1").as_bytes()).unwrap();
        let b = strip(notebook("[]", "1").replace("print(1)", "print(2)").as_bytes()).unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn what_is_not_a_notebook_is_left_alone() {
        assert!(strip(b"not json").is_none());
        assert!(strip(br#"{"no": "cells"}"#).is_none());
        assert!(strip(b"[1, 2]").is_none());
    }
}
