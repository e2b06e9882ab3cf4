"""The Python API against real mounts, from the test process itself (the installed wheel):
idempotent mounts, sync, status, snapshots, restore, unmount, and bad input, each of which
must raise a clear exception and leave nothing mounted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import daemon_pids, make_file_store, nothing_mounted_at, tierfs_cmd

import tierfs
from tierfs import _mounttable
from tierfs.errors import classify
from tierfs.status import Status

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
    nothing_mounted_at(mnt, isolated)
    with pytest.raises(tierfs.WrongKeyError, match="TIERFS_PASSPHRASE"):
        tierfs.mount(mnt, store=store, timeout=60, quiet=True)
    nothing_mounted_at(mnt, isolated)
    with pytest.raises(tierfs.WrongKeyError):
        tierfs.snapshots(store, passphrase="wrong")
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


def test_path_in_use(isolated: Path) -> None:
    store = make_file_store(isolated / "persistent")

    # A directory with files in it.
    full = isolated / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    with pytest.raises(tierfs.PathInUseError, match="not empty"):
        tierfs.mount(full, store=store, quiet=True)
    nothing_mounted_at(full, isolated)
    assert (full / "keep.txt").read_text() == "mine\n"

    # Another filesystem's mount point.
    other = isolated / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tierfs-test", str(other)], check=True)
    try:
        with pytest.raises(tierfs.PathInUseError, match="already a mount point"):
            tierfs.mount(other, store=store, quiet=True)
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
    with pytest.raises(tierfs.PathInUseError, match="in use"):
        tierfs.mount(second, store=store, workspace="one", quiet=True)
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
    }
    s = Status.from_report(report)
    assert s.pending_bytes == 5 << 20 and s.pending_files == 2 and s.oldest_unsynced_secs == 900
    assert s.cache_used_bytes == 7 << 20 and s.cache_limit_bytes == 1 << 30 and s.healthy
    text = s.format()
    assert "WARNING" in text.splitlines()[-1] and "15 min 0 s" in text, text
    assert s.warning(warn_after=1000) is None
    fresh = Status.from_report({**report, "cold": {**report["cold"], "dirty_bytes": 0, "dirty_files": 0}})
    assert fresh.oldest_unsynced_secs == 1.0 and "WARNING" not in fresh.format()
    down = Status.from_report(
        {**report, "backends": [{"name": "s3", "available": False, "consecutive_failures": 4, "last_error": "refused"}]}
    )
    assert not down.healthy and "DOWN" in down.format()


@pytest.mark.parametrize(
    ("message", "kind", "expected"),
    [
        (
            "opening the store: wrong passphrase or key file: it does not unlock any key of this store",
            None,
            tierfs.WrongKeyError,
        ),
        ("mountpoint /m is not empty; its files would be hidden while mounted", None, tierfs.PathInUseError),
        ("data directory /d is in use by another tierfs process (pid 3)", None, tierfs.PathInUseError),
        ('workspace "w" is in use by n:1 until 12:00 (lease renewed while it runs)', None, tierfs.FencedError),
        ("s3 is unavailable: connection refused", None, tierfs.UnavailableError),
        ('no snapshot "x" in this workspace', None, tierfs.NotFoundError),
        ("/m is busy: a process has a file open there or its working directory inside", None, tierfs.PathInUseError),
        ("/r is not empty; restore writes into an empty or new directory only", None, tierfs.InvalidInputError),
        ("something new", None, tierfs.TierfsError),
        ("something new", "corrupt", tierfs.CorruptError),
        ("wrong passphrase or key file", "invalid_input", tierfs.WrongKeyError),
        ("wrong passphrase or key file", "internal", tierfs.InternalError),
    ],
)
def test_classify(message: str, kind: str, expected: type) -> None:
    assert classify(message, kind) is expected


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
