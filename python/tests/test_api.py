"""The Python API against real mounts, from the test process itself (the installed wheel):
idempotent mounts, sync, status, snapshots, restore, unmount, and bad input, each of which
must raise a clear exception and leave nothing mounted. The watch-mode fallback runs in
processes where FUSE is really unavailable (conftest's ``without_fuse``), and the test
process, where FUSE works, checks what they left: a watch it reattaches to, and a store that
restores their files."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import daemon_pids, make_file_store, nothing_mounted_at, run_without_fuse, tierfs_cmd

import tierfs
from tierfs import _mounttable
from tierfs.errors import error_class
from tierfs.status import Status, WatchState

TOOLS = Path(os.environ.get("TIERFS_TOOLS_DIR", "/var/lib/tierfs-test-tools"))


def test_mount_is_idempotent_and_syncs(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    m = tierfs.mount(mnt, store=store, quiet=True)
    assert m.is_mounted and not m.reattached and m.store == str(store) and m.workspace == "default"
    again = tierfs.mount(mnt, store=store, quiet=True)
    assert again.reattached and again.pid == m.pid and daemon_pids(isolated) == [m.pid]

    (mnt / "notes.txt").write_text("first\n")
    snap = m.sync("one")
    assert snap.message == "one" and snap.data_bytes is not None
    status = m.status()
    assert status.mode == "fuse" and status.last_snapshot == snap.id
    assert status.healthy and status.backends and all(b.available for b in status.backends)
    # Every byte written before the sync is in the store (the sync's own metadata may not be).
    assert status.pending_bytes == 0 and status.pending_files == 0
    assert status.warning() is None and snap.id in status.format()

    (mnt / "notes.txt").write_text("second\n")
    later = m.sync("two", wait=False).result(timeout=300)
    assert later.id != snap.id and later.seq > snap.seq
    # Listed by id (time, then batch): two syncs of one second keep their order by seq.
    listed = {s.id: s for s in m.snapshots()}
    assert listed[snap.id].message == "one" and listed[later.id].message == "two", listed
    assert {s.id for s in tierfs.snapshots(store)} == set(listed)

    m.unmount()
    assert not m.is_mounted and _mounttable.find(str(mnt)) is None and not daemon_pids(isolated)


def test_mounted_context_and_restore(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    with tierfs.mounted(mnt, store=store, quiet=True) as m:
        (mnt / "a").mkdir()
        (mnt / "a" / "data.bin").write_bytes(os.urandom(3 << 20))
        (mnt / "a" / "run.sh").write_text("#!/bin/sh\necho ok\n")
        (mnt / "a" / "run.sh").chmod(0o755)
        snap = m.sync("for restore")
        expected = (mnt / "a" / "data.bin").read_bytes()
    assert _mounttable.find(str(mnt)) is None, "the with block unmounted"

    copy = isolated / "copy"
    result = tierfs.restore(copy, snapshot=snap.id, store=store, progress=True)
    assert result.snapshot == snap.id and result.files == 2 and result.bytes >= len(expected)
    assert (copy / "a" / "data.bin").read_bytes() == expected
    assert os.access(copy / "a" / "run.sh", os.X_OK)
    with pytest.raises(tierfs.InvalidInputError, match="not empty"):
        tierfs.restore(copy, store=store)
    with pytest.raises(tierfs.NotFoundError, match="no snapshot"):
        tierfs.restore(isolated / "copy2", snapshot="no-such-snapshot", store=store)


def test_a_layer_keeps_what_is_installed_into_a_system_directory(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    system = isolated / "usr-local"
    (system / "bin").mkdir(parents=True)
    (system / "bin" / "shipped").write_text("image\n")
    m = tierfs.mount(mnt, store=store, quiet=True)
    upper = m.layer(system)
    assert upper.startswith(str(mnt) + "/") and m.layers() == [str(system)]
    (system / "bin" / "installed").write_text("kept\n")
    # unmount() takes the layer off first: the directory shows the image again.
    m.unmount()
    assert sorted(os.listdir(system / "bin")) == ["shipped"]

    m = tierfs.mount(mnt, store=store, quiet=True)
    assert m.layer(system) == upper
    assert (system / "bin" / "installed").read_text() == "kept\n"
    with pytest.raises(tierfs.InvalidInputError):
        m.layer("/")
    m.unmount()
    assert not m.layers()


def test_trash_and_undo(isolated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    with tierfs.mounted(mnt, store=store, quiet=True) as m:
        (mnt / "out").mkdir()
        (mnt / "out" / "a.txt").write_text("first version")
        m.sync("written")  # its data in the store
        (mnt / "out" / "a.txt").unlink()
        listing = m.trash()
        assert [(e.path, e.what, e.size) for e in listing] == [("out/a.txt", "deleted", 13)]

        back = m.restore("out/a.txt")
        assert not back.beside and not back.incomplete
        assert (mnt / "out" / "a.txt").read_text() == "first version"
        # The path is taken now: the magic puts it beside, and says where.
        tierfs.magics.tierfs_magic(f"undo {mnt / 'out' / 'a.txt'}")
        said = capsys.readouterr().out
        assert "beside it as" in said and ".restored-" in said, said
        beside = [p for p in (mnt / "out").iterdir() if p.name.startswith("a.txt.restored-")]
        assert len(beside) == 1 and beside[0].read_text() == "first version"

        # Refusals come by kind: a path out of the mount, nothing in the trash.
        with pytest.raises(tierfs.InvalidInputError):
            m.restore("../outside.txt")
        with pytest.raises(tierfs.NotFoundError):
            m.restore("never-there.txt")
        assert not (isolated / "outside.txt").exists()

        # A directory comes back with its tree, through Mount.restore and through the magic.
        (mnt / "runs" / "r1").mkdir(parents=True)
        (mnt / "runs" / "r1" / "log.txt").write_text("epoch 1")
        (mnt / "runs" / "latest").symlink_to("r1")
        m.sync("runs")
        shutil.rmtree(mnt / "runs")
        kinds = {e.path: e.kind for e in m.trash()}
        assert kinds["runs"] == "dir" and kinds["runs/latest"] == "symlink", kinds
        back = m.restore("runs")
        assert back.kind == "dir" and back.entries == 4 and not back.beside, back
        assert (mnt / "runs" / "r1" / "log.txt").read_text() == "epoch 1"
        assert os.readlink(mnt / "runs" / "latest") == "r1"
        tierfs.magics.tierfs_magic(f"undo {mnt / 'runs'}")
        said = capsys.readouterr().out
        assert "(4 entries) beside it as" in said, said
        beside = [p for p in mnt.iterdir() if p.name.startswith("runs.restored-")]
        assert len(beside) == 1 and (beside[0] / "r1" / "log.txt").read_text() == "epoch 1"


def test_every_rust_message_reworded_gives_the_same_exceptions(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A debug build of `tierfs` with TIERFS_TEST_REWORD replaces every failure's message with
    # words of its own: the classes must come from `kind` and `reason` alone.
    store = make_file_store(isolated / "persistent", passphrase="right horse battery")
    monkeypatch.setenv("TIERFS_TEST_REWORD", "1")
    mnt = isolated / "mnt"
    with pytest.raises(tierfs.WrongKeyError) as wrong:
        tierfs.mount(mnt, store=store, passphrase="wrong", timeout=60, quiet=True)
    full = isolated / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    with pytest.raises(tierfs.PathInUseError) as taken:
        tierfs.mount(full, store=store, passphrase="right horse battery", quiet=True)
    with pytest.raises(tierfs.NotFoundError) as missing:
        tierfs.restore(isolated / "copy", snapshot="no-such-snapshot", store=store, passphrase="right horse battery")
    for caught in (wrong, taken, missing):
        assert caught.value.message.startswith("reworded "), caught.value.message
    assert (wrong.value.reason, taken.value.reason) == ("wrong_key", "mountpoint_taken")
    nothing_mounted_at(full, isolated)
    assert (full / "keep.txt").read_text() == "mine\n"


def test_embedded_default_store(isolated: Path) -> None:
    mnt = isolated / "mnt"
    m = tierfs.mount(mnt, quiet=True)
    data_home = Path(os.environ["XDG_DATA_HOME"], "tierfs")
    assert m.store == str(data_home / "store.toml") and m.workspace == "default"
    (mnt / "x").write_text("x")
    snap = m.sync()
    assert snap.id in [s.id for s in tierfs.snapshots()]
    m.unmount()


def test_wrong_passphrase(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent", passphrase="right horse battery")
    mnt = isolated / "mnt"
    with pytest.raises(tierfs.WrongKeyError, match="wrong passphrase") as caught:
        tierfs.mount(mnt, store=store, passphrase="wrong", timeout=60, quiet=True)
    assert caught.value.kind == "invalid_input" and "wrong passphrase" in str(caught.value)
    assert caught.value.reason == "wrong_key", "the CLI says why, beside the kind"
    nothing_mounted_at(mnt, isolated)
    with pytest.raises(tierfs.WrongKeyError, match="TIERFS_PASSPHRASE") as caught:
        tierfs.mount(mnt, store=store, timeout=60, quiet=True)
    assert caught.value.reason == "wrong_key"
    nothing_mounted_at(mnt, isolated)
    with pytest.raises(tierfs.WrongKeyError) as caught:
        tierfs.snapshots(store, passphrase="wrong")
    assert caught.value.reason == "wrong_key"
    # The right one mounts: the failures above were about the passphrase.
    m = tierfs.mount(mnt, store=store, passphrase="right horse battery", timeout=60, quiet=True)
    assert m.is_mounted
    m.unmount()


@pytest.fixture
def moto(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A moto S3 server on a free loopback port with bucket ``tierfs-test``; yields (process,
    backend url)."""
    binary = TOOLS / "moto-venv" / "bin" / "moto_server"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run scripts/setup-debian.sh")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(isolated / "moto.log", "wb")  # noqa: SIM115 (closed after the yield)
    proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"moto_server did not start: {(isolated / 'moto.log').read_text()}")
            time.sleep(0.2)
    request = urllib.request.Request(f"{endpoint}/tierfs-test", method="PUT")
    # moto treats a request without Authorization as anonymous.
    request.add_header(
        "Authorization",
        "AWS4-HMAC-SHA256 Credential=test/20240101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
    )
    urllib.request.urlopen(request, timeout=10).close()
    for key, value in dict(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true"
    ).items():
        monkeypatch.setenv(key, value)
    yield proc, f"s3://tierfs-test/ws?endpoint={endpoint}&region=us-east-1"
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)
    log.close()


def test_unreachable_store(isolated: Path, moto: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = moto
    store = isolated / "s3.toml"
    tierfs_cmd("init", "--store", str(store), "--backend", url, "--key-file", str(isolated / "s3.key"))
    # The store's server goes away.
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    mnt = isolated / "mnt"
    with pytest.raises(tierfs.UnavailableError) as caught:
        tierfs.mount(mnt, store=store, timeout=30, quiet=True)
    assert caught.value.kind == "unavailable" and str(caught.value)
    nothing_mounted_at(mnt, isolated)
    with pytest.raises(tierfs.UnavailableError):
        tierfs.snapshots(store, timeout=120)


def test_a_daemon_that_outlives_the_mount_timeout(isolated: Path, moto: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, url = moto
    store = isolated / "s3.toml"
    tierfs_cmd("init", "--store", str(store), "--backend", url, "--key-file", str(isolated / "s3.key"))
    # The store's server hangs: it takes connections and never answers them.
    proc.send_signal(signal.SIGSTOP)
    mnt = isolated / "mnt"
    try:
        with pytest.raises(tierfs.CommandTimeoutError, match="did not report the mount ready") as caught:
            tierfs.mount(mnt, store=store, timeout=2, mode="fuse", quiet=True)
    finally:
        proc.send_signal(signal.SIGCONT)
    assert (caught.value.kind, caught.value.reason) == ("unavailable", "timeout")
    nothing_mounted_at(mnt, isolated)


def test_a_writer_fenced_by_a_takeover(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    first = tierfs.mount(isolated / "a", store=store, quiet=True)
    (isolated / "a" / "before").write_text("from a\n")
    first.sync("before the takeover")
    second = tierfs.mount(
        isolated / "b", store=store, takeover=True, options=["--data-dir", str(isolated / "b-data")], quiet=True
    )
    assert (isolated / "b" / "before").read_text() == "from a\n"
    # The first writer's next durable write fails (EIO), and its sync says why: fenced,
    # which no retry fixes.
    with open(isolated / "a" / "after", "wb") as f:
        f.write(b"lost")
        f.flush()
        with pytest.raises(OSError) as fsynced:
            os.fsync(f.fileno())
    assert fsynced.value.errno == errno.EIO
    with pytest.raises(tierfs.FencedError) as caught:
        first.sync("after the takeover")
    assert caught.value.kind == "fenced" and caught.value.reason is None
    with pytest.raises(tierfs.FencedError, match="flush did not complete"):
        first.unmount()  # its last metadata cannot reach the store either
    assert not first.is_mounted
    second.unmount()


def test_path_in_use(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")

    # A directory with files in it.
    full = isolated / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    with pytest.raises(tierfs.PathInUseError, match="not empty") as caught:
        tierfs.mount(full, store=store, quiet=True)
    assert (caught.value.kind, caught.value.reason) == ("conflict", "mountpoint_taken")
    nothing_mounted_at(full, isolated)
    assert (full / "keep.txt").read_text() == "mine\n"

    # Another filesystem's mount point.
    other = isolated / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tierfs-test", str(other)], check=True)
    try:
        with pytest.raises(tierfs.PathInUseError, match="already a mount point") as caught:
            tierfs.mount(other, store=store, quiet=True)
        assert caught.value.reason == "mountpoint_taken"
        entry = _mounttable.find(str(other))
        assert entry is not None and entry.fs_type == "tmpfs"
    finally:
        subprocess.run(["umount", str(other)], check=True)

    # A tierfs mount of another workspace: refused, and left alone.
    mnt = isolated / "mnt"
    first = tierfs.mount(mnt, store=store, workspace="one", quiet=True)
    with pytest.raises(tierfs.PathInUseError, match="workspace 'one'"):
        tierfs.mount(mnt, store=store, workspace="two", quiet=True)
    assert first.is_mounted and daemon_pids(isolated) == [first.pid]

    # The same workspace (one data dir) at a second mount point.
    second = isolated / "mnt2"
    with pytest.raises(tierfs.PathInUseError, match="in use") as caught:
        tierfs.mount(second, store=store, workspace="one", quiet=True)
    assert caught.value.reason == "path_in_use"
    nothing_mounted_at(second, isolated)
    assert daemon_pids(isolated) == [first.pid]

    # force_remount replaces the mount with the one asked for.
    replaced = tierfs.mount(mnt, store=store, workspace="two", force_remount=True, quiet=True)
    assert replaced.workspace == "two" and replaced.pid != first.pid and daemon_pids(isolated) == [replaced.pid]
    replaced.unmount()


def test_stale_mount_after_a_daemon_crash(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    m = tierfs.mount(mnt, store=store, quiet=True)
    (mnt / "kept.txt").write_text("synced\n")
    m.sync("before the crash")
    os.kill(m.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while m.pid in daemon_pids(isolated) and time.monotonic() < deadline:
        time.sleep(0.1)
    # "Transport endpoint is not connected": the next mount() clears it and mounts again.
    with pytest.raises(OSError):
        os.listdir(mnt)
    again = tierfs.mount(mnt, store=store, quiet=True)
    assert again.pid != m.pid and not again.reattached
    assert (mnt / "kept.txt").read_text() == "synced\n"
    again.unmount()


def test_sync_without_a_store(isolated: Path) -> None:
    mnt = isolated / "mnt"
    m = tierfs.mount(mnt, options=["--no-store"], quiet=True)
    assert m.store is None and m.status().store is None
    with pytest.raises(tierfs.InvalidInputError, match="no store"):
        m.sync("nothing to sync to")
    m.unmount()


def test_status_warns_about_old_unsynced_data() -> None:
    report = {
        "mountpoint": "/content/work",
        "pid": 7,
        "data_dir": "/d",
        "store": "/s/store.toml",
        "cache_size": 1 << 30,
        "read_only": False,
        "backends": [{"name": "file:///s/objects", "available": True, "consecutive_failures": 0}],
        "cold": {"dirty_bytes": 5 << 20, "dirty_files": 2, "oldest_dirty_ms": 900_000, "resident_bytes": 7 << 20},
        "remote": {"workspace": "default", "pending_batches": 3, "pending_bytes": 4096, "oldest_pending_ms": 1000},
        # What the daemon derives from the above (control.rs `StatusSummary`, tested there).
        "summary": {
            "mode": "fuse",
            "pending_bytes": 5 << 20,
            "pending_files": 2,
            "pending_metadata_bytes": 4096,
            "oldest_unsynced_ms": 900_000,
            "cache_used_bytes": 7 << 20,
            "healthy": True,
            "error": None,
        },
    }
    s = Status.from_report(report)
    assert s.pending_bytes == 5 << 20 and s.pending_files == 2 and s.oldest_unsynced_secs == 900
    assert s.cache_used_bytes == 7 << 20 and s.cache_limit_bytes == 1 << 30 and s.healthy
    text = s.format()
    assert "WARNING" in text.splitlines()[-1] and "15 min 0 s" in text, text
    assert s.warning(warn_after=1000) is None
    fresh_summary = {**report["summary"], "pending_bytes": 0, "pending_files": 0, "oldest_unsynced_ms": 1000}
    fresh = Status.from_report({**report, "summary": fresh_summary})
    assert fresh.oldest_unsynced_secs == 1.0 and "WARNING" not in fresh.format()
    down = Status.from_report(
        {
            **report,
            "backends": [{"name": "s3", "available": False, "consecutive_failures": 4, "last_error": "refused"}],
            "summary": {**report["summary"], "healthy": False, "error": "refused"},
        }
    )
    assert not down.healthy and "DOWN" in down.format()


@pytest.mark.parametrize(
    ("kind", "reason", "expected"),
    [
        ("invalid_input", "wrong_key", tierfs.WrongKeyError),
        ("conflict", "path_in_use", tierfs.PathInUseError),
        ("unavailable", "timeout", tierfs.CommandTimeoutError),
        ("unavailable", "fuse_unavailable", tierfs.UnavailableError),
        ("fenced", None, tierfs.FencedError),
        ("not_found", None, tierfs.NotFoundError),
        ("corrupt", None, tierfs.CorruptError),
        ("no_space", None, tierfs.NoSpaceError),
        ("internal", "wrong_key", tierfs.InternalError),
        ("something_new", None, tierfs.TierfsError),
        (None, "path_in_use", tierfs.PathInUseError),
        (None, None, tierfs.TierfsError),
    ],
)
def test_error_class(kind: str | None, reason: str | None, expected: type) -> None:
    assert error_class(kind, reason) is expected


def test_the_class_comes_from_kind_and_reason_never_from_the_message() -> None:
    from tierfs import _cli

    reworded = _cli.error_from(["tierfs"], 1, '{"ok": false, "error": "anything at all", "kind": "fenced"}\n', "")
    assert type(reworded) is tierfs.FencedError and reworded.kind == "fenced"
    wrong_words = _cli.error_from(
        ["tierfs"], 1, '{"ok": false, "error": "wrong passphrase or key file", "kind": "corrupt"}\n', ""
    )
    assert type(wrong_words) is tierfs.CorruptError and wrong_words.reason is None


def test_progress_falls_back_to_plain_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from tierfs import progress

    monkeypatch.setattr(progress, "_tqdm_class", lambda: None)
    bar = progress.Progress("tierfs sync /m", total=3 << 20, show=True)
    bar.update_to(1 << 20)
    bar.update_to(3 << 20)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "tierfs sync /m: 1.0 MiB of 3.0 MiB" and lines[-1] == "tierfs sync /m: 3.0 MiB of 3.0 MiB", lines
    quiet = progress.Progress("tierfs sync /m", total=10, show=False)
    quiet.update_to(10)
    quiet.close()
    assert capsys.readouterr().err == ""


# --- watch mode: the fallback where FUSE is unavailable ------------------------------

# Run where FUSE is unavailable (argv: mount point, store, expected reason). Checks that FUSE
# really fails there, that what watch mode cannot honour is refused before anything starts,
# then mounts as a notebook would and works in the directory.
FALLBACK = """
import contextlib, hashlib, io, json, os, sys
from pathlib import Path
import tierfs

mnt, store, reason = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
try:
    tierfs.mount(mnt, store=store, mode="fuse", quiet=True)
except tierfs.UnavailableError as err:
    fuse_error = str(err)
else:
    raise AssertionError("a FUSE mount worked here: this is not a no-FUSE environment")
assert reason in fuse_error, fuse_error
refused = []
for kwargs in ({"readonly": True}, {"options": ["--writeback-cache"]}):
    try:
        tierfs.mount(mnt, store=store, quiet=True, **kwargs)
    except tierfs.InvalidInputError as err:
        refused.append(str(err))
    else:
        raise AssertionError(f"mount({kwargs}) was not refused in watch mode")
    assert not tierfs.mounts(), tierfs.mounts()

said = io.StringIO()
with contextlib.redirect_stdout(said):
    m = tierfs.mount(mnt, store=store)
again = tierfs.mount(mnt, store=store, quiet=True)
(mnt / "notes.txt").write_text("watched\\n")
(mnt / "sub").mkdir()
(mnt / "sub" / "run.sh").write_text("#!/bin/sh\\necho ok\\n")
(mnt / "sub" / "run.sh").chmod(0o755)
data = os.urandom(3 << 20)
(mnt / "sub" / "data.bin").write_bytes(data)
snap = m.sync("watched")
status = m.status()
print("RESULT", json.dumps({
    "said": said.getvalue().splitlines(), "fuse_error": fuse_error, "refused": refused,
    "mode": m.mode, "reattached": m.reattached, "fallback_reason": m.fallback_reason, "pid": m.pid,
    "again": [again.mode, again.reattached, again.pid], "snapshot": snap.id,
    "status": [status.mode, status.last_snapshot, status.pending_bytes, status.watch is not None, status.healthy],
    "status_text": str(status), "is_mounted": m.is_mounted, "data_sha256": hashlib.sha256(data).hexdigest(),
}))
"""


@pytest.mark.parametrize("how", ["missing", "dead"])
def test_no_fuse_device_falls_back_to_watch(isolated: Path, how: str) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    reason = {"missing": "/dev/fuse is missing", "dead": "No such device"}[how]
    seen = run_without_fuse(FALLBACK, str(mnt), str(store), reason, how=how)

    # FUSE really failed there, and watch mode refused what it cannot honour, by name.
    assert reason in seen["fuse_error"], seen
    assert "readonly=True" in seen["refused"][0] and "--writeback-cache" in seen["refused"][1], seen["refused"]
    assert all("watch mode" in r and reason in r for r in seen["refused"]), seen["refused"]
    # One line says that it fell back, and why.
    assert len(seen["said"]) == 1, seen["said"]
    line = seen["said"][0]
    assert "no FUSE here" in line and reason in line and "watch mode" in line and str(mnt) in line, line
    assert seen["mode"] == "watch" and not seen["reattached"] and reason in seen["fallback_reason"], seen
    assert seen["again"] == ["watch", True, seen["pid"]], seen["again"]
    assert seen["status"] == ["watch", seen["snapshot"], 0, True, True], seen["status"]
    assert seen["status_text"].splitlines()[1].startswith("watch"), seen["status_text"]
    assert seen["is_mounted"]

    # Out here FUSE works, and the watcher the no-FUSE process started runs on: no mount at
    # the path, a plain directory. mount() (mode auto) reattaches to the watch instead of
    # mounting over it, as a restarted kernel does; mode="fuse" refuses it.
    assert daemon_pids(isolated) == [seen["pid"]] and _mounttable.find(str(mnt)) is None
    m = tierfs.mount(mnt, store=store, quiet=True)
    assert m.mode == "watch" and m.reattached and m.pid == seen["pid"] and m.is_mounted, m
    assert tierfs.attach(mnt).mode == "watch" and [x.mode for x in tierfs.mounts()] == ["watch"]
    with pytest.raises(tierfs.PathInUseError, match="watch"):
        tierfs.mount(mnt, store=store, mode="fuse", quiet=True)
    assert m.status().mode == "watch" and m.status().last_snapshot == seen["snapshot"]

    # Written after the last sync: unmount() (`tierfs unwatch`) makes a last pass and flushes.
    (mnt / "late.txt").write_text("after the sync\n")
    m.unmount()
    assert not m.is_mounted and not daemon_pids(isolated) and not tierfs.mounts()

    copy = isolated / "copy"
    tierfs.restore(copy, store=store)
    assert (copy / "notes.txt").read_text() == "watched\n" and (copy / "late.txt").read_text() == "after the sync\n"
    assert hashlib.sha256((copy / "sub" / "data.bin").read_bytes()).hexdigest() == seen["data_sha256"]
    assert os.access(copy / "sub" / "run.sh", os.X_OK)
    # The snapshot the watcher committed has what was there at its sync, and not the rest.
    at_sync = isolated / "at-sync"
    tierfs.restore(at_sync, snapshot=seen["snapshot"], store=store)
    assert (at_sync / "notes.txt").is_file() and not (at_sync / "late.txt").exists()


# Run without CAP_SYS_ADMIN (argv: mount point, store): /dev/fuse opens, the kernel refuses
# the FUSE mount. The first process finds the directory empty; the second (a new kernel, which
# does not know what the first learnt) finds it holding the workspace.
REFUSED = """
import contextlib, io, json, os, sys
from pathlib import Path
import tierfs

mnt, store = Path(sys.argv[1]), sys.argv[2]
os.close(os.open("/dev/fuse", os.O_RDWR))  # the device works here
try:  # but a FUSE mount (of an empty directory beside mnt) does not
    tierfs.mount(mnt.parent / "fuse-check", store=store, mode="fuse", quiet=True)
except tierfs.UnavailableError as err:
    fuse_error = str(err)
else:
    raise AssertionError("a FUSE mount worked without CAP_SYS_ADMIN")
said = io.StringIO()
with contextlib.redirect_stdout(said):
    m = tierfs.mount(mnt, store=store)
assert m.mode == "watch", m
seen = sorted(os.listdir(mnt))
name = f"from-watch-{len(seen)}.txt"
(mnt / name).write_text(name)
m.sync(name)
m.unmount()
assert not m.is_mounted
print("RESULT", json.dumps({"fuse_error": fuse_error, "said": said.getvalue().splitlines(), "seen": seen,
                            "reason": m.fallback_reason, "status_after": [x.path for x in tierfs.mounts()]}))
"""


def test_refused_fuse_mount_falls_back_to_watch(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    # The workspace is written by a FUSE mount first (out here, where FUSE works).
    with tierfs.mounted(mnt, store=store, quiet=True) as m:
        assert m.mode == "fuse"
        (mnt / "from-fuse.txt").write_text("fuse\n")
    # The scratch directory of a probe mount goes to TMPDIR: nothing may be left there.
    scratch = isolated / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))

    first = run_without_fuse(REFUSED, str(mnt), str(store), how="no-cap")
    assert "Operation not permitted" in first["fuse_error"], first
    assert len(first["said"]) == 1 and "the FUSE mount failed" in first["said"][0], first["said"]
    assert "Operation not permitted" in first["reason"]
    # An empty directory: the workspace was restored into it.
    assert first["seen"] == ["from-fuse.txt"], first
    assert (mnt / "from-fuse.txt").read_text() == "fuse\n"

    # The directory is not empty now, which the CLI refuses before it tries FUSE: mount()
    # finds out that FUSE does not work (a probe mount of a scratch directory) and watches.
    second = run_without_fuse(REFUSED, str(mnt), str(store), how="no-cap")
    assert len(second["said"]) == 1 and "Operation not permitted" in second["said"][0], second["said"]
    assert second["seen"] == ["from-fuse.txt", "from-watch-1.txt"], second
    assert not first["status_after"] and not second["status_after"]
    assert not daemon_pids(isolated) and not list(scratch.iterdir()), list(scratch.iterdir())

    copy = isolated / "copy"
    tierfs.restore(copy, store=store)
    assert sorted(os.listdir(copy)) == ["from-fuse.txt", "from-watch-1.txt", "from-watch-2.txt"]
    assert (copy / "from-watch-2.txt").read_text() == "from-watch-2.txt"


def test_watch_mode_on_request(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_file_store(isolated / "persistent")
    mnt = isolated / "mnt"
    with pytest.raises(tierfs.InvalidInputError, match="'auto', 'fuse' or 'watch'"):
        tierfs.mount(mnt, store=store, mode="nfs", quiet=True)  # type: ignore[arg-type]
    monkeypatch.setenv("TIERFS_MODE", "bogus")
    with pytest.raises(tierfs.InvalidInputError, match="TIERFS_MODE"):
        tierfs.mount(mnt, store=store, quiet=True)
    monkeypatch.setenv("TIERFS_MODE", "watch")
    with pytest.raises(tierfs.InvalidInputError, match="mode='watch'.*readonly=True"):
        tierfs.mount(mnt, store=store, readonly=True, quiet=True)
    assert not daemon_pids(isolated)

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        m = tierfs.mount(mnt, store=store)  # $TIERFS_MODE, where FUSE works
    assert said.getvalue().count("\n") == 1 and "as asked" in said.getvalue(), said.getvalue()
    assert m.mode == "watch" and m.fallback_reason is None and _mounttable.find(str(mnt)) is None, m
    monkeypatch.delenv("TIERFS_MODE")
    with pytest.raises(tierfs.PathInUseError, match="a tierfs watch"):
        tierfs.mount(mnt, store=store, mode="fuse", quiet=True)
    (mnt / "kept.txt").write_text("kept\n")

    # flush=False: SIGTERM; the watcher makes its last pass, flushes and exits on its own.
    m.unmount(flush=False)
    deadline = time.monotonic() + 120
    while daemon_pids(isolated) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not daemon_pids(isolated) and not m.is_mounted

    # The directory holds the workspace now: watch mode resumes on it; the with block unwatches.
    with tierfs.mounted(mnt, store=store, mode="watch", quiet=True) as w:
        assert w.mode == "watch" and w.status().watch is not None
        (mnt / "more.txt").write_text("more\n")
    assert not daemon_pids(isolated)
    # A directory with files of its own is refused, and left as it was.
    foreign = isolated / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("mine\n")
    with pytest.raises(tierfs.PathInUseError, match="does not hold this workspace"):
        tierfs.mount(foreign, store=store, mode="watch", quiet=True)
    assert os.listdir(foreign) == ["mine.txt"] and not daemon_pids(isolated)
    copy = isolated / "copy"
    tierfs.restore(copy, store=store)
    assert (copy / "kept.txt").read_text() == "kept\n" and (copy / "more.txt").read_text() == "more\n"


def test_status_of_a_watch() -> None:
    # What a report adds up to is the daemon's (`StatusSummary`, tested in Rust with the same
    # cases); here, that the watch's own state and the summary reach the Status.
    summary = {"mode": "watch", "pending_bytes": 0, "oldest_unsynced_ms": None, "healthy": True, "error": None}
    report = {
        "mountpoint": "/content/work",
        "pid": 7,
        "store": "/s/store.toml",
        "backends": [{"name": "file:///s/objects", "available": True}],
        "cold": {"dirty_bytes": 0, "dirty_files": 0, "resident_bytes": 0},
        "remote": {"workspace": "default", "pending_batches": 0},
        "watch": {
            "dir": "/content/work",
            "mode": "events",
            "start": "fresh",
            "passes": 4,
            "full_passes": 2,
            "pending_dirs": 0,
            "oldest_pending_ms": 0,
            "unstable": [],
            "unreadable": [],
        },
        "summary": summary,
    }
    s = Status.from_report(report)
    assert s.mode == "watch" and s.synced and s.healthy and s.warning() is None
    assert s.watch == WatchState("events", None, "fresh", 4, 2, 0, None, (), (), None)
    assert "watch" in s.format().splitlines()[1] and "4 passes (2 full)" in s.format()
    # Changes no pass has seen yet are not in the store.
    waiting = Status.from_report(
        {
            **report,
            "watch": {**report["watch"], "pending_dirs": 2, "oldest_pending_ms": 400_000},
            "summary": {**summary, "oldest_unsynced_ms": 400_000},
        }
    )
    assert waiting.oldest_unsynced_secs == 400 and not waiting.synced and "WARNING" in waiting.format()
    # Nor are files the watcher cannot read.
    unreadable = Status.from_report({**report, "watch": {**report["watch"], "unreadable": [["secret", "EACCES"]]}})
    assert not unreadable.synced and "secret" in (unreadable.warning() or ""), unreadable.format()
    failing = Status.from_report(
        {
            **report,
            "watch": {**report["watch"], "last_error": "reading sub: EIO"},
            "summary": {**summary, "healthy": False, "error": "reading sub: EIO"},
        }
    )
    assert not failing.healthy and failing.error == "reading sub: EIO"
    fuse = {k: v for k, v in report.items() if k != "watch"}
    assert Status.from_report({**fuse, "summary": {**summary, "mode": "fuse"}}).mode == "fuse"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (
            "/dev/fuse is missing: FUSE is not available here. Load the kernel module (`modprobe fuse`), or in a "
            "container pass `--device /dev/fuse --cap-add SYS_ADMIN`",
            "/dev/fuse is missing",
        ),
        ("checking /dev/fuse: Permission denied (os error 13)", "/dev/fuse: Permission denied (os error 13)"),
        (
            "/dev/fuse cannot be opened (No such device (os error 19)): this kernel has no FUSE driver loaded. "
            "Load it (`modprobe fuse`), or use `tierfs watch DIR`, which needs no FUSE",
            "/dev/fuse: No such device (os error 19)",
        ),
        (
            "mounting FUSE filesystem at /m: fusermount3: mount failed: Operation not permitted\n",
            "the FUSE mount failed: fusermount3: mount failed: Operation not permitted",
        ),
        (
            "mounting FUSE filesystem at /m (non-root mounts need the setuid fusermount3 helper from the fuse3 "
            "package): Permission denied (os error 13)",
            "the FUSE mount failed: Permission denied (os error 13)",
        ),
        # The user's to fix: not a reason to watch.
        (
            "mounting FUSE filesystem at /m (allow_other needs `user_allow_other` in /etc/fuse.conf; or mount with "
            "--no-allow-other): Permission denied (os error 13)",
            None,
        ),
        ("opening the store: wrong passphrase or key file: it does not unlock any key of this store", None),
        ("mountpoint /m is not empty; its files would be hidden while mounted", None),
        ("s3 is unavailable: connection refused", None),
    ],
)
def test_which_mount_failures_mean_no_fuse(message: str, reason: str | None) -> None:
    from tierfs.mount import _fuse_error_reason

    # The CLI gives these failures (and only these) the reason `fuse_unavailable`; the
    # message picks the words, never the decision.
    given = "fuse_unavailable" if reason is not None else None
    assert _fuse_error_reason(tierfs.TierfsError(message, reason=given)) == reason
    assert _fuse_error_reason(tierfs.TierfsError(message)) is None
