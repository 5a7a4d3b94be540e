"""File transfer (upload, download, read_file, write_file) through the edge of the
session's 3-replica cluster, with both clients: a 2 GiB round trip with the
process's memory bounded, file objects and bytes, directory trees with modes,
times, links and ignore files, progress reports on the caller's thread, and bad
input that names the path and leaves nothing behind."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random
import re
import resource
import stat
import threading
import time
from pathlib import Path

import pytest

from openshell_sdk import (
    AsyncClient,
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidConfigError,
    NotFoundError,
    TransferProgress,
    TransferSummary,
)

GIB = 1 << 30
MIB = 1 << 20


def sh(client: Client, sandbox: str, script: str) -> str:
    out = client.exec(sandbox, ["sh", "-c", script], timeout=300)
    assert out.exit_code == 0, (script, out.stderr_text)
    return out.stdout_text


def leftovers(client: Client, sandbox: str) -> str:
    """Temp files of uploads anywhere under the sandbox's working directory."""
    return sh(client, sandbox, "find . -name '*.openshell-part-*'")


def local_leftovers(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if ".openshell-part-" in p.name]


def peak_rss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * MIB):
            digest.update(chunk)
    return digest.hexdigest()


def remote_sha256(client: Client, sandbox: str, path: str) -> str:
    return sh(client, sandbox, f"sha256sum '{path}'").split()[0]


def random_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def random_file(path: Path, size: int) -> str:
    """Writes ``size`` random bytes (16 MiB at a time); their SHA-256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(size // (16 * MIB)):
            block = os.urandom(16 * MIB)
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def download_to_devnull(client: Client, sandbox: str, remote: str) -> int:
    with open(os.devnull, "wb") as devnull:
        return client.download(sandbox, remote, devnull).bytes


async def test_a_2_gib_file_round_trips_with_the_process_memory_bounded(
    aclient: AsyncClient, client: Client, ready_sandbox: str, tmp_path: Path
) -> None:
    sandbox = ready_sandbox
    source = tmp_path / "big.bin"
    started = time.monotonic()
    want = random_file(source, 2 * GIB)
    generated = time.monotonic() - started
    rss_before = peak_rss_mib()
    reports: list[TransferProgress] = []
    threads: set[int] = set()

    def progress(report: TransferProgress) -> None:
        assert report.bytes_done <= report.bytes_total == 2 * GIB
        reports.append(report)
        threads.add(threading.get_ident())

    try:
        t = time.monotonic()
        up = await aclient.upload(sandbox, source, "big.bin", progress=progress, timeout=900)
        upload_s = time.monotonic() - t
        assert (up.files, up.bytes) == (1, 2 * GIB)
        # On the event loop's thread, throttled to ~10 a second, the last one complete.
        assert threads == {threading.get_ident()}
        assert 2 <= len(reports) <= upload_s * 10 + 3, (len(reports), upload_s)
        assert reports[-1].bytes_done == 2 * GIB and reports[-1].files_done == 1
        assert remote_sha256(client, sandbox, "big.bin") == want

        back = tmp_path / "back.bin"
        t = time.monotonic()
        down = client.download(sandbox, "big.bin", back, timeout=900)
        download_s = time.monotonic() - t
        assert (down.files, down.bytes) == (1, 2 * GIB)
        assert sha256_file(back) == want
        back.unlink()
    finally:
        source.unlink(missing_ok=True)
        sh(client, sandbox, "rm -f big.bin")
    peak = peak_rss_mib()
    print(
        f"\n2 GiB (debug build): generated in {generated:.1f} s; upload {upload_s:.1f} s "
        f"({2048 / upload_s:.0f} MiB/s), download {download_s:.1f} s "
        f"({2048 / download_s:.0f} MiB/s); peak RSS {peak:.0f} MiB "
        f"(before the transfers {rss_before:.0f} MiB); {len(reports)} progress reports"
    )
    assert peak < 400, f"peak RSS {peak:.0f} MiB"
    assert local_leftovers(tmp_path) == []
    assert leftovers(client, sandbox) == ""


async def test_file_objects_and_bytes_stream_both_ways(
    aclient: AsyncClient, client: Client, ready_sandbox: str
) -> None:
    sandbox = ready_sandbox
    data = random_bytes(64 * MIB, seed=1)
    reports: list[TransferProgress] = []
    up = await aclient.upload(sandbox, io.BytesIO(data), "obj.bin", progress=reports.append)
    assert (up.files, up.bytes) == (1, len(data))
    assert reports and reports[-1].bytes_done == len(data)
    assert reports[-1].current.endswith("/obj.bin")
    assert remote_sha256(client, sandbox, "obj.bin") == hashlib.sha256(data).hexdigest()
    assert sh(client, sandbox, "stat -c %a obj.bin").strip() == "644"

    sink = io.BytesIO()
    reports.clear()
    down = await aclient.download(sandbox, "obj.bin", sink, progress=reports.append)
    assert down.bytes == len(data)
    assert sink.getvalue() == data
    assert reports[-1].bytes_done == reports[-1].bytes_total == len(data)
    del sink

    # bytes, and the blocking client with a real file object.
    small = random_bytes(3 * MIB + 17, seed=2)
    assert client.upload(sandbox, small, "small.bin").bytes == len(small)
    out = io.BytesIO()
    client.download(sandbox, "small.bin", out)
    assert out.getvalue() == small
    assert download_to_devnull(client, sandbox, "small.bin") == len(small)
    sh(client, sandbox, "rm -f obj.bin small.bin")
    assert leftovers(client, sandbox) == ""


def test_read_file_and_write_file(client: Client, ready_sandbox: str) -> None:
    sandbox = ready_sandbox
    summary = client.write_file(sandbox, "notes/../hello.txt", "hello, sandbox\n")
    assert summary == TransferSummary(1, 0, 0, 0, 0, 0, 15)
    assert client.read_file(sandbox, "hello.txt") == b"hello, sandbox\n"
    assert sh(client, sandbox, "cat hello.txt") == "hello, sandbox\n"
    # Replaced atomically; an absolute path inside the working directory is fine.
    root = sh(client, sandbox, "pwd").strip()
    client.write_file(sandbox, f"{root}/hello.txt", b"\x00\x01binary")
    assert client.read_file(sandbox, "hello.txt") == b"\x00\x01binary"
    client.write_file(sandbox, "empty", b"")
    assert client.read_file(sandbox, "empty") == b""
    sh(client, sandbox, "rm -f hello.txt empty")


async def test_async_read_file_and_write_file(aclient: AsyncClient, ready_sandbox: str) -> None:
    data = random_bytes(MIB + 3, seed=3)
    await aclient.write_file(ready_sandbox, "async.bin", memoryview(data))
    assert await aclient.read_file(ready_sandbox, "async.bin") == data


def make_tree(top: Path) -> None:
    (top / "src" / "deep").mkdir(parents=True)
    (top / "src" / "main.py").write_text("print('hi')\n")
    (top / "src" / "deep" / "data.bin").write_bytes(random_bytes(300_000, seed=4))
    script = top / "run.sh"
    script.write_text("#!/bin/sh\necho run\n")
    script.chmod(0o750)
    (top / "debug.log").write_text("ignored\n")
    (top / "src" / "deep" / "trace.log").write_text("ignored too\n")
    (top / "build").mkdir()
    (top / "build" / "out.o").write_bytes(b"\x7fELF")
    (top / ".gitignore").write_text("*.log\nbuild/\n")
    (top / "link-inside").symlink_to("src/main.py")
    (top / "link-outside").symlink_to("../../etc/passwd")
    os.utime(top / "src" / "main.py", (1_600_000_000, 1_600_000_000))


async def test_a_directory_tree_round_trips(
    aclient: AsyncClient, client: Client, ready_sandbox: str, tmp_path: Path
) -> None:
    sandbox = ready_sandbox
    tree = tmp_path / "tree"
    make_tree(tree)
    up = await aclient.upload(sandbox, tree, "tree-up", ignore_file=".gitignore")
    assert up.files == 4, up  # main.py, data.bin, run.sh, .gitignore
    assert up.symlinks == 1 and up.skipped_symlinks == 1, up
    assert up.ignored == 3, up  # debug.log, trace.log, build/
    listing = sh(client, sandbox, "cd tree-up && find . | sort")
    assert "./src/deep/data.bin" in listing and "./link-inside" in listing
    assert ".log" not in listing and "build" not in listing and "link-outside" not in listing
    assert sh(client, sandbox, "stat -c %a tree-up/run.sh").strip() == "750"
    assert sh(client, sandbox, "stat -c %Y tree-up/src/main.py").strip() == "1600000000"
    assert sh(client, sandbox, "readlink tree-up/link-inside").strip() == "src/main.py"

    # Back with the blocking client, into an existing directory: under its own name.
    back = tmp_path / "back"
    back.mkdir()
    reports: list[TransferProgress] = []
    down = client.download(sandbox, "tree-up", back, progress=reports.append)
    assert down.files == 4 and down.symlinks == 1, down
    got = back / "tree-up"
    for rel in ["src/main.py", "src/deep/data.bin", "run.sh", ".gitignore"]:
        assert (got / rel).read_bytes() == (tree / rel).read_bytes(), rel
    assert stat.S_IMODE((got / "run.sh").stat().st_mode) == 0o750
    assert int((got / "src" / "main.py").stat().st_mtime) == 1_600_000_000
    assert os.readlink(got / "link-inside") == "src/main.py"
    assert reports[-1].files_done == reports[-1].files_total == 4
    assert local_leftovers(tmp_path) == []
    sh(client, sandbox, "rm -rf tree-up")


async def test_bad_input_names_the_path_and_leaves_nothing(
    aclient: AsyncClient, client: Client, ready_sandbox: str, tmp_path: Path
) -> None:
    sandbox = ready_sandbox
    with pytest.raises(NotFoundError, match=re.escape("no-such-file.txt")):
        await aclient.read_file(sandbox, "no-such-file.txt")
    with pytest.raises(NotFoundError, match=re.escape("missing/deeper.bin")):
        client.download(sandbox, "missing/deeper.bin", tmp_path / "x.bin")
    with pytest.raises(NotFoundError, match=re.escape("gone.bin")):
        await aclient.download(sandbox, "gone.bin", io.BytesIO())
    with pytest.raises(NotFoundError, match="no-such-local"):
        await aclient.upload(sandbox, tmp_path / "no-such-local", "x.bin")
    assert not (tmp_path / "x.bin").exists()

    local = tmp_path / "f.txt"
    local.write_text("x")
    for remote in ["../escaped.txt", "a/../../escaped.txt", "/etc/openshell-py-test"]:
        with pytest.raises(InvalidArgumentError, match=re.escape(remote)) as caught:
            await aclient.upload(sandbox, local, remote)
        assert caught.value.code == "invalid_argument"
        with pytest.raises(InvalidArgumentError):
            client.upload(sandbox, b"data", remote)
        with pytest.raises(InvalidArgumentError):
            client.write_file(sandbox, remote, b"data")
        with pytest.raises(InvalidArgumentError):
            await aclient.download(sandbox, remote, tmp_path / "g.txt")
    assert sh(client, sandbox, "ls ../escaped.txt /etc/openshell-py-test 2>/dev/null; true") == ""

    sh(client, sandbox, "mkdir -p a-dir")
    with pytest.raises(FailedPreconditionError, match="a-dir"):
        client.download(sandbox, "a-dir", io.BytesIO())
    with pytest.raises(FailedPreconditionError, match="a-dir"):
        client.write_file(sandbox, "a-dir", b"x")

    # Refused before any I/O.
    with pytest.raises(TypeError, match="binary file object"):
        await aclient.upload(sandbox, 42, "x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="binary mode"):
        client.upload(sandbox, io.StringIO("text"), "x")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        client.upload(sandbox, b"x", "x", ignore_file=".gitignore")
    assert local_leftovers(tmp_path) == []
    assert leftovers(client, sandbox) == ""


async def test_a_failing_progress_callback_or_a_cancelled_task_leaves_nothing(
    aclient: AsyncClient, client: Client, ready_sandbox: str, tmp_path: Path
) -> None:
    sandbox = ready_sandbox
    source = tmp_path / "big.bin"
    random_file(source, 256 * MIB)

    def refuse(report: TransferProgress) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        await aclient.upload(sandbox, source, "refused.bin", progress=refuse)
    with pytest.raises(RuntimeError, match="stop here"):
        client.upload(sandbox, source, "refused.bin", progress=refuse)
    with pytest.raises(RuntimeError, match="stop here"):
        await aclient.upload(sandbox, io.BytesIO(b"y" * 64 * MIB), "refused.bin", progress=refuse)

    # Cancelled at a known point: from the progress callback (on this event
    # loop), once some bytes have moved and before all have.
    cancelled_at: list[TransferProgress] = []

    def cancel_midway(report: TransferProgress) -> None:
        if not cancelled_at and 0 < report.bytes_done < report.bytes_total:
            cancelled_at.append(report)
            task.cancel()

    task = asyncio.ensure_future(
        aclient.upload(sandbox, source, "cancelled.bin", progress=cancel_midway)
    )
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 300)
    assert cancelled_at, "the upload was never cancelled"

    # The sandbox's server removes a temp file when its stream ends.
    for _ in range(75):
        if (left := leftovers(client, sandbox)) == "":
            break
        await asyncio.sleep(0.2)
    assert left == ""
    assert sh(client, sandbox, "ls refused.bin cancelled.bin 2>/dev/null; true") == ""
