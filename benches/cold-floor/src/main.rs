//! `tierfs-cold-floor`: a benchmark peer for the cold read, not part of tierfs.
//!
//! It measures the least work a cold sequential read of tierfs's store format must do on this
//! machine, using tierfs's own code for every step the cold tier requires and nothing else:
//! GETs through the same HTTP client (object_store, path-style, plain http), AES-256-GCM
//! decryption in place and the keyed blake3 id check of every block
//! (`tierfs::block::open_block_in`), and in `fuse` mode the plaintext handed to `dd` through a
//! FUSE mount with tierfs's FUSE settings (one request thread, `default_permissions`, async
//! reads, the largest read-ahead, `FOPEN_KEEP_CACHE`). There is no metadata, no cache, no
//! index and no disk, each object is fetched whole (one GET, as the raw boto3 GET does), and
//! the read-ahead window is as deep as the raw GET's thread count, so its rate is the ceiling
//! for tierfs's cold read against the same server: what tierfs reaches below it is tierfs's
//! own overhead, what it reaches below the raw GET is the price of the required checks and of
//! FUSE. `put` uploads random data sealed as tierfs seals blocks (4 MiB blocks, several per
//! object like a pack) and writes a state file with the data key and the block ids; `read
//! --mode get|open|fuse` reads everything back once and prints one JSON line. Invariant: every
//! byte served through the mount was decrypted and verified first; a failed GET or check ends
//! the run with an error, never with a number.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEntry, ReplyOpen, Request, SessionACL,
};
use futures::{StreamExt, TryStreamExt, stream};
use object_store::aws::{AmazonS3, AmazonS3Builder, Checksum};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tierfs::block::{BlockId, into_owned, open_block_in};
use tierfs::crypto::{DataKey, KEY_LEN, Keys, ObjectKind, sealed_len};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Semaphore;

const MIB: u64 = 1 << 20;
/// tierfs's chunk size: one block per 4 MiB of a file.
const BLOCK_BYTES: u64 = tierfs::block::CHUNK_SIZE;
const TTL: Duration = Duration::from_secs(60);
const ROOT: u64 = 1;
const FILE: u64 = 2;
const FILE_NAME: &str = "data";

#[derive(Parser)]
#[command(
    name = "tierfs-cold-floor",
    about = "Benchmark peer: the least work a cold read of tierfs's store format does (GET, AES-GCM, blake3, FUSE)",
    long_about = "Benchmark peer: the least work a cold read of tierfs's store format does.\n\n\
        `put` uploads random data sealed the way tierfs seals blocks and writes a state file;\n\
        `read --mode get` GETs every object (no checks), `--mode open` also decrypts and verifies\n\
        every block, `--mode fuse` serves the verified plaintext through a FUSE mount to\n\
        `dd if=MOUNTPOINT/data of=/dev/null bs=4M` and times dd. Credentials come from the\n\
        AWS_* environment variables. benches/cold.sh runs it beside tierfs (see benches/README.md)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Uploads SIZE_MIB of random data as sealed objects and writes the state file.
    Put {
        /// S3 endpoint, e.g. http://127.0.0.1:9000 (path-style requests)
        #[arg(long)]
        endpoint: String,
        #[arg(long)]
        bucket: String,
        /// Key prefix of the objects
        #[arg(long, default_value = "floor/")]
        prefix: String,
        /// Plaintext bytes in all, in MiB (a multiple of 4)
        #[arg(long)]
        size_mib: u64,
        /// Plaintext per object in MiB (a multiple of 4; tierfs's default pack is 16 MiB)
        #[arg(long, default_value_t = 16)]
        object_mib: u64,
        /// Uploads in flight
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Where to write the state (data key, object keys, block ids)
        #[arg(long)]
        state: PathBuf,
    },
    /// Reads every object back once and prints one JSON line.
    Read {
        #[arg(long)]
        state: PathBuf,
        #[arg(long, value_enum)]
        mode: Mode,
        /// Where to mount (mode fuse): an empty directory
        #[arg(long)]
        mountpoint: Option<PathBuf>,
        /// GETs in flight (and, in mode fuse, objects fetched ahead of the reader)
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// GET every object, no checks (the Rust client's raw GET)
    Get,
    /// GET, decrypt and verify every block
    Open,
    /// GET, decrypt, verify, and serve through FUSE to dd
    Fuse,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Get => "get",
            Mode::Open => "open",
            Mode::Fuse => "fuse",
        }
    }
}

#[derive(Serialize, Deserialize)]
struct State {
    endpoint: String,
    bucket: String,
    /// The data key, hex: the state file is a benchmark's throwaway secret.
    data_key: String,
    objects: Vec<Object>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Object {
    key: String,
    /// Hex ids of the object's blocks, each BLOCK_BYTES of plaintext, sealed back to back.
    blocks: Vec<String>,
}

type Res<T> = Result<T, String>;

fn s3(endpoint: &str, bucket: &str) -> Res<Arc<AmazonS3>> {
    // Without them object_store would ask the cloud's metadata service, far from loopback.
    for var in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(var).is_none() {
            return Err(format!("{var} is not set (credentials come from the AWS_* environment variables)"));
        }
    }
    // tierfs's client settings for a local server (src/backend/single.rs).
    AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_endpoint(endpoint)
        .with_allow_http(endpoint.starts_with("http://"))
        .with_virtual_hosted_style_request(false)
        .with_unsigned_payload(true)
        .with_checksum_algorithm(Checksum::CRC64NVME)
        .build()
        .map(Arc::new)
        .map_err(|e| format!("S3 client for {endpoint}/{bucket}: {e}"))
}

fn keys_of(state: &State) -> Res<Keys> {
    let raw = hex::decode(&state.data_key).map_err(|e| format!("state: data key: {e}"))?;
    let key: [u8; KEY_LEN] = raw.try_into().map_err(|_| "state: data key is not 32 bytes".to_owned())?;
    Ok(Keys::new(&DataKey::from_bytes(key)))
}

fn block_id(hex_id: &str) -> Res<BlockId> {
    let raw = hex::decode(hex_id).map_err(|e| format!("state: block id: {e}"))?;
    raw.try_into().map_err(|_| "state: a block id is not 32 bytes".to_owned())
}

/// Decrypts and verifies every block of one object's body where it lies; the plaintexts.
fn open_object(keys: &Keys, object: &Object, body: Bytes) -> Res<Vec<Bytes>> {
    let sealed = sealed_len(BLOCK_BYTES as usize);
    if body.len() != sealed * object.blocks.len() {
        return Err(format!("{}: {} bytes, expected {}", object.key, body.len(), sealed * object.blocks.len()));
    }
    let mut buf = into_owned(body);
    let mut plain = Vec::with_capacity(object.blocks.len());
    for hex_id in &object.blocks {
        let part = buf.split_to(sealed);
        plain.push(
            open_block_in(keys, &block_id(hex_id)?, BLOCK_BYTES as u32, part)
                .map_err(|e| format!("{}: {e}", object.key))?,
        );
    }
    Ok(plain)
}

async fn get(store: &AmazonS3, key: &str) -> Res<Bytes> {
    let path = Path::from(key);
    let result = store.get(&path).await.map_err(|e| format!("GET {key}: {e}"))?;
    result.bytes().await.map_err(|e| format!("GET {key}: body: {e}"))
}

/// Seconds of CPU (user + system) of this process, or of its waited-for children.
fn rusage_s(who: libc::c_int) -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `who` is RUSAGE_SELF or RUSAGE_CHILDREN.
    unsafe { libc::getrusage(who, &mut usage) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn put(
    endpoint: String,
    bucket: String,
    prefix: String,
    size_mib: u64,
    object_mib: u64,
    concurrency: usize,
    state_path: PathBuf,
) -> Res<()> {
    let block_mib = BLOCK_BYTES / MIB;
    if size_mib == 0 || size_mib % block_mib != 0 || object_mib == 0 || object_mib % block_mib != 0 {
        return Err(format!("--size-mib and --object-mib must be positive multiples of {block_mib}"));
    }
    let store = s3(&endpoint, &bucket)?;
    let data_key = DataKey::generate();
    let keys = Arc::new(Keys::new(&data_key));
    let seed = *blake3::hash(
        &SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_nanos().to_le_bytes(),
    )
    .as_bytes();
    let per_object = (object_mib / block_mib) as usize;
    let total_blocks = (size_mib / block_mib) as usize;
    let count = total_blocks.div_ceil(per_object);
    let rt = Runtime::new().map_err(|e| format!("tokio runtime: {e}"))?;
    let start = Instant::now();
    let objects: Vec<Object> = rt.block_on(async {
        stream::iter(0..count)
            .map(|i| {
                let (store, keys, prefix) = (store.clone(), keys.clone(), prefix.clone());
                let blocks = per_object.min(total_blocks - i * per_object);
                tokio::spawn(async move {
                    let mut body = Vec::with_capacity(blocks * sealed_len(BLOCK_BYTES as usize));
                    let mut ids = Vec::with_capacity(blocks);
                    let mut plain = vec![0u8; BLOCK_BYTES as usize];
                    for j in 0..blocks {
                        // Random-looking, incompressible, different per block and per run.
                        let mut xof = blake3::Hasher::new_keyed(&seed);
                        xof.update(&(i as u64).to_le_bytes()).update(&(j as u64).to_le_bytes());
                        xof.finalize_xof().fill(&mut plain);
                        let id = keys.block_id(&plain);
                        keys.seal_into(ObjectKind::Block, &id, &plain, &mut body);
                        ids.push(hex::encode(id));
                    }
                    let key = format!("{prefix}obj-{i:05}");
                    store
                        .put(&Path::from(key.as_str()), PutPayload::from(body))
                        .await
                        .map_err(|e| format!("PUT {key}: {e}"))?;
                    Ok::<_, String>(Object { key, blocks: ids })
                })
            })
            .buffered(concurrency.max(1))
            .map(|joined| joined.map_err(|e| format!("upload task: {e}"))?)
            .try_collect()
            .await
    })?;
    let state = State { endpoint, bucket, data_key: hex::encode(data_key.as_bytes()), objects };
    let text = serde_json::to_string(&state).map_err(|e| format!("state: {e}"))?;
    std::fs::write(&state_path, text).map_err(|e| format!("writing {}: {e}", state_path.display()))?;
    println!(
        "{}",
        json!({"op": "put", "bytes": size_mib * MIB, "objects": count, "seconds": start.elapsed().as_secs_f64()})
    );
    Ok(())
}

/// Mode get or open: every object GET in parallel (one task each), opened if asked.
fn read_direct(state: &State, keys: Arc<Keys>, open: bool, concurrency: usize) -> Res<u64> {
    let store = s3(&state.endpoint, &state.bucket)?;
    let rt = Runtime::new().map_err(|e| format!("tokio runtime: {e}"))?;
    rt.block_on(async {
        stream::iter(state.objects.clone())
            .map(|object| {
                let (store, keys) = (store.clone(), keys.clone());
                tokio::spawn(async move {
                    let body = get(&store, &object.key).await?;
                    if !open {
                        return Ok(body.len() as u64);
                    }
                    let plain = open_object(&keys, &object, body)?;
                    Ok::<_, String>(plain.iter().map(|b| b.len() as u64).sum())
                })
            })
            .buffer_unordered(concurrency.max(1))
            .map(|joined| joined.map_err(|e| format!("read task: {e}"))?)
            .try_fold(0u64, |sum, n| async move { Ok(sum + n) })
            .await
    })
}

/// What the FUSE side shares with the fetch tasks.
struct Window {
    /// Objects fetched and verified, by index, until the reader moves past them.
    ready: Mutex<Ready>,
    changed: Condvar,
    /// One permit per object that may be fetched ahead of the reader.
    permits: Arc<Semaphore>,
}

#[derive(Default)]
struct Ready {
    objects: HashMap<usize, Arc<Vec<Bytes>>>,
    /// Every object below this one was dropped (the reader is past it).
    dropped_below: usize,
    error: Option<String>,
}

struct Source {
    state: State,
    keys: Arc<Keys>,
    store: Arc<AmazonS3>,
    rt: Handle,
    window: Arc<Window>,
    started: OnceLock<()>,
    uid: u32,
}

impl Source {
    fn object_bytes(&self) -> u64 {
        self.state.objects.first().map_or(BLOCK_BYTES, |o| o.blocks.len() as u64 * BLOCK_BYTES)
    }

    fn size(&self) -> u64 {
        self.state.objects.iter().map(|o| o.blocks.len() as u64 * BLOCK_BYTES).sum()
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let dir = ino == ROOT;
        let now = SystemTime::now();
        let size = if dir { 0 } else { self.size() };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: if dir { FileType::Directory } else { FileType::RegularFile },
            perm: if dir { 0o755 } else { 0o444 },
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Starts fetching objects in order, at most `concurrency` ahead of the reader.
    fn start(&self) {
        self.started.get_or_init(|| {
            let (window, store, keys, objects) =
                (self.window.clone(), self.store.clone(), self.keys.clone(), self.state.objects.clone());
            self.rt.spawn(async move {
                for (i, object) in objects.into_iter().enumerate() {
                    let Ok(permit) = window.permits.clone().acquire_owned().await else { return };
                    permit.forget(); // given back by the reader when it drops the object
                    let (window, store, keys) = (window.clone(), store.clone(), keys.clone());
                    tokio::spawn(async move {
                        let result = match get(&store, &object.key).await {
                            Ok(body) => open_object(&keys, &object, body),
                            Err(e) => Err(e),
                        };
                        let mut ready = lock(&window.ready);
                        match result {
                            // The reader moved past it while it was in flight: its permit back.
                            Ok(_) if i < ready.dropped_below => window.permits.add_permits(1),
                            Ok(plain) => {
                                ready.objects.insert(i, Arc::new(plain));
                            }
                            Err(e) => ready.error = Some(e),
                        }
                        window.changed.notify_all();
                    });
                }
            });
        });
    }

    /// Object `i`'s plaintext blocks: waits for the fetch; drops the objects before it.
    fn object(&self, i: usize) -> Res<Arc<Vec<Bytes>>> {
        let mut ready = lock(&self.window.ready);
        if i < ready.dropped_below {
            // Read backwards past the window (the kernel's read-ahead seldom does): fetch again.
            drop(ready);
            let object = self.state.objects.get(i).ok_or("read past the end")?;
            let body = self.rt.block_on(get(&self.store, &object.key))?;
            return open_object(&self.keys, object, body).map(Arc::new);
        }
        let dropped = (ready.dropped_below..i).filter(|k| ready.objects.remove(k).is_some()).count();
        ready.dropped_below = i;
        self.window.permits.add_permits(dropped);
        loop {
            if let Some(error) = &ready.error {
                return Err(error.clone());
            }
            if let Some(blocks) = ready.objects.get(&i) {
                return Ok(blocks.clone());
            }
            ready = self.window.changed.wait(ready).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// The plaintext of [offset, end): a view when it lies in one block, else a copy.
    fn bytes(&self, offset: u64, end: u64) -> Res<Vec<Bytes>> {
        let per_object = self.object_bytes();
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < end {
            let obj = (at / per_object) as usize;
            let within = at % per_object;
            let blocks = self.object(obj)?;
            let block = blocks.get((within / BLOCK_BYTES) as usize).ok_or("offset past the object")?;
            let from = (within % BLOCK_BYTES) as usize;
            let to = (from as u64 + (end - at)).min(block.len() as u64) as usize;
            pieces.push(block.slice(from..to));
            at += (to - from) as u64;
        }
        Ok(pieces)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Filesystem for Source {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // tierfs's INIT (tierfs-mount/src/filesystem.rs) as far as reads are concerned.
        if let Err(nearest) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_READ);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == ROOT && name == FILE_NAME {
            reply.entry(&TTL, &self.attr(FILE), Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino.0 {
            ROOT | FILE => reply.attr(&TTL, &self.attr(ino.0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 != FILE {
            return reply.error(Errno::EISDIR);
        }
        self.start();
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino.0 != FILE {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.saturating_add(u64::from(size)).min(self.size());
        match self.bytes(offset, end) {
            Ok(pieces) if pieces.len() == 1 => reply.data(&pieces[0]),
            Ok(pieces) => reply.data(&pieces.concat()),
            Err(e) => {
                eprintln!("tierfs-cold-floor: read at {offset}: {e}");
                reply.error(Errno::EIO)
            }
        }
    }
}

/// Mode fuse: mounts, times `dd if=MOUNTPOINT/data of=/dev/null bs=4M` (dd alone, as cold.sh
/// times tierfs's cold read on a mount made before), unmounts. Bytes read and dd's seconds.
fn read_fuse(state: State, keys: Arc<Keys>, concurrency: usize, mountpoint: PathBuf) -> Res<(u64, f64)> {
    let rt = Runtime::new().map_err(|e| format!("tokio runtime: {e}"))?;
    let store = s3(&state.endpoint, &state.bucket)?;
    let concurrency = concurrency.max(1);
    let window = Arc::new(Window {
        ready: Mutex::new(Ready::default()),
        changed: Condvar::new(),
        permits: Arc::new(Semaphore::new(concurrency)),
    });
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let source = Source { state, keys, store, rt: rt.handle().clone(), window, started: OnceLock::new(), uid };
    let size = source.size();
    let mut config = Config::default();
    config.n_threads = Some(1);
    config.mount_options = vec![
        MountOption::FSName("cold-floor".to_owned()),
        MountOption::Subtype("cold-floor".to_owned()),
        MountOption::DefaultPermissions,
        MountOption::RO,
    ];
    if uid == 0 {
        config.acl = SessionACL::All;
    }
    let session =
        fuser::spawn_mount(source, &mountpoint, &config).map_err(|e| format!("mount {}: {e}", mountpoint.display()))?;
    let start = Instant::now();
    let out = Command::new("dd")
        .arg(format!("if={}", mountpoint.join(FILE_NAME).display()))
        .args(["of=/dev/null", "bs=4M"])
        .output()
        .map_err(|e| format!("running dd: {e}"));
    let seconds = start.elapsed().as_secs_f64();
    let unmounted = session.umount_and_join().map_err(|e| format!("unmount {}: {e}", mountpoint.display()));
    let out = out?;
    if !out.status.success() {
        return Err(format!("dd failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    unmounted?;
    Ok((size, seconds))
}

fn read(state_path: PathBuf, mode: Mode, mountpoint: Option<PathBuf>, concurrency: usize) -> Res<()> {
    let text = std::fs::read_to_string(&state_path).map_err(|e| format!("reading {}: {e}", state_path.display()))?;
    let state: State = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", state_path.display()))?;
    let keys = Arc::new(keys_of(&state)?);
    let self_before = rusage_s(libc::RUSAGE_SELF);
    let children_before = rusage_s(libc::RUSAGE_CHILDREN);
    let start = Instant::now();
    let (bytes, seconds) = match mode {
        Mode::Get | Mode::Open => {
            let bytes = read_direct(&state, keys, mode == Mode::Open, concurrency)?;
            (bytes, start.elapsed().as_secs_f64())
        }
        Mode::Fuse => {
            let mountpoint = mountpoint.ok_or("--mode fuse needs --mountpoint")?;
            read_fuse(state, keys, concurrency, mountpoint)?
        }
    };
    // The CPU of this process and of dd (its child in mode fuse). cold.sh adds moto's and the
    // total under "cpu_s".
    let out = json!({
        "op": "read",
        "mode": mode.name(),
        "bytes": bytes,
        "seconds": seconds,
        "mib_s": bytes as f64 / MIB as f64 / seconds,
        "concurrency": concurrency,
        "floor_cpu_s": rusage_s(libc::RUSAGE_SELF) - self_before,
        "dd_cpu_s": rusage_s(libc::RUSAGE_CHILDREN) - children_before,
    });
    println!("{out}");
    Ok(())
}

fn main() {
    let result = match Cli::parse().cmd {
        Cmd::Put { endpoint, bucket, prefix, size_mib, object_mib, concurrency, state } => {
            put(endpoint, bucket, prefix, size_mib, object_mib, concurrency, state)
        }
        Cmd::Read { state, mode, mountpoint, concurrency } => read(state, mode, mountpoint, concurrency),
    };
    if let Err(e) = result {
        eprintln!("tierfs-cold-floor: {e}");
        std::process::exit(1);
    }
}
