//! The history's settings: which files it records, up to what size, under which author, and
//! the git remote `push` goes to. A workspace carries its own in `.tierfshistory.toml` at its
//! root (so they travel and are versioned with it); anything it leaves out has the default.
//!
//! Invariants: include globs use gitignore syntax (a glob without `/` matches a name at any
//! depth); a settings file that does not parse is an error, never silently the defaults.

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use serde::Deserialize;

use super::HistoryError;

/// The settings file's name, at the workspace root.
pub const SETTINGS_FILE: &str = ".tierfshistory.toml";

/// What the history records by default: code (in the languages ML work is written in),
/// configs, notebooks and small text.
pub const DEFAULT_INCLUDE: [&str; 31] = [
    "*.py",
    "*.ipynb",
    "*.sh",
    "*.rs",
    "*.c",
    "*.cc",
    "*.cpp",
    "*.h",
    "*.hpp",
    "*.cu",
    "*.cuh",
    "*.js",
    "*.ts",
    "*.go",
    "*.r",
    "*.R",
    "*.jl",
    "*.sql",
    "*.lua",
    "*.yaml",
    "*.yml",
    "*.json",
    "*.toml",
    "*.cfg",
    "*.ini",
    "*.md",
    "*.txt",
    "requirements*.txt",
    "Dockerfile",
    "Makefile",
    SETTINGS_FILE,
];

/// Files larger than this are recorded as a pointer (size and content hash), not their bytes.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 1 << 20;

/// The settings as written in the file (every key optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    include: Option<Vec<String>>,
    #[serde(default)]
    exclude: Vec<String>,
    max_file_size: Option<u64>,
    author: Option<String>,
    remote: Option<String>,
}

/// The resolved settings.
#[derive(Debug, Clone)]
pub struct HistoryConfig {
    include: Gitignore,
    exclude: Gitignore,
    pub max_file_size: u64,
    /// `Name <email>`, when set.
    pub author: Option<String>,
    pub remote: Option<String>,
}

impl HistoryConfig {
    /// The defaults, for a workspace without a settings file.
    pub fn defaults() -> HistoryConfig {
        HistoryConfig::parse("").unwrap_or_else(|_| unreachable!("the empty settings parse"))
    }

    /// The settings of a `.tierfshistory.toml` with `text`.
    pub fn parse(text: &str) -> Result<HistoryConfig, HistoryError> {
        let bad = |reason: String| HistoryError::Config { path: SETTINGS_FILE.into(), reason };
        let raw: Raw = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let include = match &raw.include {
            Some(globs) => globs.iter().map(String::as_str).collect::<Vec<_>>(),
            None => DEFAULT_INCLUDE.to_vec(),
        };
        if raw.max_file_size == Some(0) {
            return Err(bad("max_file_size must be at least 1 byte".into()));
        }
        if let Some(a) = &raw.author {
            parse_author(a).ok_or_else(|| bad(format!("author {a:?} is not of the form \"Name <email>\"")))?;
        }
        Ok(HistoryConfig {
            include: matcher(&include).map_err(bad)?,
            exclude: matcher(&raw.exclude.iter().map(String::as_str).collect::<Vec<_>>()).map_err(bad)?,
            max_file_size: raw.max_file_size.unwrap_or(DEFAULT_MAX_FILE_SIZE),
            author: raw.author,
            remote: raw.remote,
        })
    }

    /// Whether the file at `path` (relative to the workspace root) is recorded.
    pub fn includes(&self, path: &str) -> bool {
        self.include.matched(path, false).is_ignore() && !self.exclude.matched(path, false).is_ignore()
    }

    /// Whether directory `path` is left out whole (by an exclude glob).
    pub fn excludes_dir(&self, path: &str) -> bool {
        self.exclude.matched(path, true).is_ignore()
    }
}

/// `(name, email)` of `Name <email>`.
pub fn parse_author(s: &str) -> Option<(&str, &str)> {
    let (name, rest) = s.split_once('<')?;
    let email = rest.strip_suffix('>')?;
    let name = name.trim();
    (!name.is_empty() && !email.is_empty() && !email.contains('>')).then_some((name, email.trim()))
}

fn matcher(globs: &[&str]) -> Result<Gitignore, String> {
    let mut b = GitignoreBuilder::new("");
    for g in globs {
        b.add_line(None, g).map_err(|e| format!("glob {g:?}: {e}"))?;
    }
    b.build().map_err(|e| e.to_string())
}

/// The rules of one `.gitignore` of the workspace, in directory `dir` (relative to the root,
/// `""` for the root).
pub fn gitignore(dir: &str, text: &str) -> Gitignore {
    let mut b = GitignoreBuilder::new(dir);
    for line in text.lines() {
        // A line that does not parse is skipped, as git does.
        let _ = b.add_line(None, line);
    }
    b.build().unwrap_or_else(|_| Gitignore::empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn defaults_match_code_and_configs_at_any_depth() {
        let c = HistoryConfig::defaults();
        let code = ["src/lib.rs", "ops/kernel.cu", "ops/kernel.cuh", "csrc/op.cpp", "web/app.ts", "stats.R", "q.sql"];
        for p in ["train.py", "conf/model.yaml", "a/b/nb.ipynb", "requirements-dev.txt", "x/Dockerfile", "Makefile"]
            .into_iter()
            .chain(code)
        {
            assert!(c.includes(p), "{p}");
        }
        for p in ["model.pt", "data/shard.bin", "Dockerfile.bak"] {
            assert!(!c.includes(p), "{p}");
        }
        assert_eq!(c.max_file_size, DEFAULT_MAX_FILE_SIZE);
    }

    #[test]
    fn the_file_replaces_includes_and_adds_excludes() {
        let c = HistoryConfig::parse(
            "include = [\"*.py\", \"*.csv\"]\nexclude = [\"scratch/\"]\nmax_file_size = 10\nauthor = \"Ada <ada@example.org>\"\n",
        )
        .unwrap();
        assert!(c.includes("a.csv") && c.includes("a.py") && !c.includes("a.yaml"));
        assert!(c.excludes_dir("scratch") && !c.excludes_dir("src"));
        assert_eq!(c.max_file_size, 10);
        assert_eq!(parse_author(c.author.as_deref().unwrap()), Some(("Ada", "ada@example.org")));
    }

    #[test]
    fn bad_settings_are_errors() {
        for text in ["include = 3", "max_file_size = 0", "author = \"nobody\"", "colour = \"red\""] {
            let e = HistoryConfig::parse(text).unwrap_err();
            assert!(e.to_string().contains(SETTINGS_FILE), "{e}");
        }
    }

    #[test]
    fn nested_gitignore_rules_apply_below_their_directory() {
        let g = gitignore("sub", "*.log\nbuild/\n");
        assert!(g.matched("sub/x.log", false).is_ignore());
        assert!(g.matched("sub/build", true).is_ignore());
        assert!(!g.matched("sub/x.py", false).is_ignore());
    }
}
