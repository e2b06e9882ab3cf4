//! The local store file (`tierfs init --store FILE` writes it, `tierfs mount --store FILE`
//! reads it): which backends make up a store, the redundancy policy and where the key comes
//! from. Plain TOML a user can read and edit; it holds no key material unless the user puts
//! credentials in it (it is written owner-only).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::backend::{BackendSpec, Credentials, Redundancy};

/// Default pack size: large enough that small files cost few PUTs, small enough that a pack
/// is uploaded (and its memory freed) within a second on a modest link.
pub const DEFAULT_PACK_SIZE: u64 = 16 << 20;

/// The contents of a store file.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Random id written by `tierfs init`; the store's `config` object must carry the same.
    pub store_id: String,
    /// Backend URLs (`s3://bucket/prefix?endpoint=…&region=…`, `file:///path`).
    pub backends: Vec<String>,
    /// Copies of every object (omit when `erasure` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u8>,
    /// Reed-Solomon coding of packs as "K+M" (data + parity shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasure: Option<String>,
    /// Target pack size in bytes.
    #[serde(default = "default_pack_size")]
    pub pack_size: u64,
    /// A key file that unlocks the store (instead of a passphrase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// S3 credentials; anything missing comes from the AWS_* environment variables.
    #[serde(default, skip_serializing_if = "credentials_empty")]
    pub credentials: Credentials,
    /// How a workspace is kept to one writer at a time (see [`Fencing`]).
    #[serde(default, skip_serializing_if = "Fencing::is_default")]
    pub fencing: Fencing,
}

/// How a workspace is kept to one writer at a time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fencing {
    /// Journal segments are created with If-None-Match on a majority of their copies, so two
    /// writers can never both extend a workspace, whatever their clocks say. Needs servers
    /// that honour conditional writes (AWS S3, MinIO, moto); checked when a writer mounts.
    #[default]
    Conditional,
    /// For servers that ignore conditional writes (Garage 2.x): the writer lease alone,
    /// with time margins. A writer appends only while its lease is fresh by its own clock, a
    /// new writer takes a lease only after it expired and checks it again after writing it,
    /// and `--takeover` waits out a lease instead of fencing a live writer. Safe as long as
    /// clocks agree within a few seconds and no writer stalls for longer than that between
    /// checking its lease and writing.
    Lease,
}

impl Fencing {
    fn is_default(&self) -> bool {
        *self == Fencing::Conditional
    }

    /// Its name in the store file, `tierfs init --fencing` and `tierfs status`.
    pub fn name(self) -> &'static str {
        match self {
            Fencing::Conditional => "conditional",
            Fencing::Lease => "lease",
        }
    }
}

impl std::str::FromStr for Fencing {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Fencing, StoreError> {
        [Fencing::Conditional, Fencing::Lease]
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| StoreError::Config(format!("fencing must be \"conditional\" or \"lease\", not {s:?}")))
    }
}

fn default_pack_size() -> u64 {
    DEFAULT_PACK_SIZE
}

fn credentials_empty(c: &Credentials) -> bool {
    c.access_key_id.is_none() && c.secret_access_key.is_none() && c.session_token.is_none()
}

/// Parses "K+M".
pub fn parse_erasure(s: &str) -> Result<(u8, u8), StoreError> {
    let bad = || StoreError::Config(format!("erasure must look like K+M (e.g. 2+1), not {s:?}"));
    let (k, m) = s.split_once('+').ok_or_else(bad)?;
    let k: u8 = k.trim().parse().map_err(|_| bad())?;
    let m: u8 = m.trim().parse().map_err(|_| bad())?;
    if k == 0 {
        return Err(bad());
    }
    Ok((k, m))
}

impl StoreConfig {
    /// A new store over `backends` with the default policy: 3 replicas when there are three or
    /// more backends, otherwise one copy per backend.
    pub fn new(backends: Vec<String>) -> StoreConfig {
        StoreConfig {
            store_id: hex::encode(crate::block::random_id()),
            replicas: Some(backends.len().min(3) as u8),
            backends,
            erasure: None,
            pack_size: DEFAULT_PACK_SIZE,
            key_file: None,
            credentials: Credentials::default(),
            fencing: Fencing::Conditional,
        }
    }

    /// The redundancy policy, checked against the number of backends.
    pub fn redundancy(&self) -> Result<Redundancy, StoreError> {
        let n = self.backends.len();
        let r = match (&self.erasure, self.replicas) {
            (Some(_), Some(_)) => {
                return Err(StoreError::Config("set either replicas or erasure, not both".into()));
            }
            (Some(e), None) => {
                let (data, parity) = parse_erasure(e)?;
                if usize::from(data) + usize::from(parity) > n {
                    return Err(StoreError::Config(format!(
                        "erasure {data}+{parity} needs {} backends, the store has {n}",
                        data + parity
                    )));
                }
                Redundancy::Erasure { data, parity }
            }
            (None, r) => {
                let r = r.unwrap_or(n.min(3) as u8);
                if r == 0 || usize::from(r) > n {
                    return Err(StoreError::Config(format!("replicas = {r} needs 1..={n} (one per backend)")));
                }
                Redundancy::Replicas(r)
            }
        };
        Ok(r)
    }

    /// Checks everything that can be checked without the network.
    pub fn validate(&self) -> Result<(), StoreError> {
        if self.backends.is_empty() {
            return Err(StoreError::Config("a store needs at least one backend".into()));
        }
        for url in &self.backends {
            BackendSpec::parse(url)?;
        }
        if self.pack_size < (1 << 20) || self.pack_size > super::limits::MAX_PACK_SIZE {
            return Err(StoreError::Config(format!("pack_size {} is out of range (1 MiB ..= 1 GiB)", self.pack_size)));
        }
        self.redundancy()?;
        Ok(())
    }

    /// A store file that users other than its owner may read, write or run is refused
    /// ([`private_mode`]), as ssh
    /// refuses such a private key: it names the backends and the key file, and may hold
    /// credentials (`save_new` writes it 0600).
    pub fn load(path: &Path) -> Result<StoreConfig, StoreError> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let cannot_read = |source| StoreError::ReadConfig { path: path.to_path_buf(), source };
        let mut file = std::fs::File::open(path).map_err(cannot_read)?;
        let mode = file.metadata().map_err(cannot_read)?.mode();
        private_mode(path, mode, "store file")?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(cannot_read)?;
        let cfg: StoreConfig = toml::from_str(&text)
            .map_err(|e| StoreError::Config(format!("store file {} is not valid: {e}", path.display())))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Writes the file owner-only (it may hold credentials), refusing to overwrite one.
    pub fn save_new(&self, path: &Path) -> Result<(), StoreError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let text = format!(
            "# tierfs store file, written by `tierfs init`; see docs/FORMAT.md.\n{}",
            toml::to_string_pretty(self).map_err(|e| StoreError::Config(e.to_string()))?
        );
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| StoreError::Config(format!("cannot create store file {}: {e}", path.display())))?;
        f.write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(|e| StoreError::Config(format!("cannot write store file {}: {e}", path.display())))
    }
}

/// Refuses a secret file (`what`: "store file", "key file") at `path` whose `mode` lets users
/// other than its owner read, write or run it, with the `chmod` that fixes it: the one check
/// of the files that unlock a store.
pub fn private_mode(path: &Path, mode: u32, what: &str) -> Result<(), StoreError> {
    let mode = mode & 0o777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    Err(StoreError::NotPrivate { what: what.to_string(), path: path.to_path_buf(), mode })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_open_store_file_says_so_with_its_kind() {
        use crate::types::ErrorKind;
        let missing = StoreConfig::load(Path::new("/nonexistent/store.toml")).expect_err("no such file");
        assert_eq!(missing.kind(), ErrorKind::NotFound, "{missing}");
        assert!(missing.to_string().starts_with("cannot read store file /nonexistent/store.toml: "), "{missing}");
        let open = private_mode(Path::new("/s/store.toml"), 0o100644, "store file").expect_err("readable by others");
        assert_eq!(open.kind(), ErrorKind::InvalidInput);
        assert!(open.to_string().contains("(mode 0644)") && open.to_string().contains("chmod 600 /s/store.toml"));
        private_mode(Path::new("/s/store.toml"), 0o100600, "store file").expect("owner only");
    }

    #[test]
    fn default_policy_is_three_replicas_from_three_backends() {
        let c = StoreConfig::new(vec!["file:///a".into(), "file:///b".into(), "file:///c".into(), "file:///d".into()]);
        assert_eq!(c.redundancy().expect("policy"), Redundancy::Replicas(3));
        let c = StoreConfig::new(vec!["file:///a".into()]);
        assert_eq!(c.redundancy().expect("policy"), Redundancy::Replicas(1));
    }

    #[test]
    fn bad_policies_are_explained() {
        let mut c = StoreConfig::new(vec!["file:///a".into(), "file:///b".into()]);
        c.replicas = None;
        c.erasure = Some("2+1".into());
        assert!(c.redundancy().expect_err("too few").to_string().contains("needs 3 backends"));
        c.erasure = Some("two".into());
        assert!(c.redundancy().is_err());
        c.erasure = None;
        c.replicas = Some(5);
        assert!(c.redundancy().is_err());
    }

    #[test]
    fn round_trips_through_toml() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store.toml");
        let mut c = StoreConfig::new(vec!["file:///tmp/x".into()]);
        c.key_file = Some("/k".into());
        c.save_new(&path).expect("save");
        let back = StoreConfig::load(&path).expect("load");
        assert_eq!((back.store_id, back.backends, back.replicas), (c.store_id.clone(), c.backends.clone(), c.replicas));
        assert_eq!(back.key_file, c.key_file);
        assert!(c.save_new(&path).is_err(), "must not overwrite");
        assert_eq!(back.fencing, Fencing::Conditional, "no fencing key: conditional");
        assert!(!std::fs::read_to_string(&path).expect("read").contains("fencing"), "the default is not written");

        let lease = dir.path().join("lease.toml");
        c.fencing = Fencing::Lease;
        c.save_new(&lease).expect("save");
        assert!(std::fs::read_to_string(&lease).expect("read").contains("fencing = \"lease\""));
        assert_eq!(StoreConfig::load(&lease).expect("load").fencing, Fencing::Lease);
        let err = "sometimes".parse::<Fencing>().expect_err("not a fencing");
        assert!(err.to_string().contains("\"conditional\" or \"lease\""), "{err}");
    }
}
