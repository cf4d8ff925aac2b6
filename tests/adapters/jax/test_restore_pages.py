"""A process restoring a sharded array from a mapped file reads the pages of its own boxes only.

One file holds a float32 array cut into 8 row boxes. Two processes (``jax.distributed`` on
CPU, four forced host devices each: eight devices) each call
``hb.shards.to_jax(hb.load(path)["w"], NamedSharding(mesh, P("x")))`` and read every
element of their four boxes through JAX. The page cache is emptied before each turn
(``posix_fadvise(DONTNEED)`` after ``fsync``) and ``mincore`` then says which pages of
the file were read: all of this process's boxes, and of the others at most the kernel's
readahead (a few windows of the block device's ``read_ahead_kb``; a box is four).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge import container  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PAGE = mmap.PAGESIZE
LINUX = sys.platform.startswith("linux")

WORKER = textwrap.dedent("""
    import gc, json, os, sys, time
    rank, port, path, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # before jax
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import numpy as np
    import hurray_bridge as hb

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                               initialization_timeout=60)
    try:
        # Both processes make the backend together (they exchange their devices): before
        # one waits for its turn.
        assert len(jax.devices()) == 8 and len(jax.local_devices()) == 4
        turn = os.path.join(folder, f"turn{rank}")
        deadline = time.monotonic() + 120
        while not os.path.exists(turn):  # the parent empties the page cache first
            assert time.monotonic() < deadline, "no turn"
            time.sleep(0.02)
        sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
        loaded = hb.load(path)
        x = hb.shards.to_jax(loaded["w"], sharding)
        seen = []
        for s in x.addressable_shards:  # every element of this process's boxes, through JAX
            rows = s.index[0]
            seen.append([rows.start, rows.stop, float(jnp.min(s.data)), float(jnp.max(s.data))])
        del x, s, loaded
        gc.collect()  # the map goes with the last tensor: the parent may drop the pages
        with open(os.path.join(folder, f"done{rank}"), "w") as f:
            json.dump(seen, f)
    finally:
        jax.distributed.shutdown()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _readahead(path: Path) -> int | None:
    """The readahead window of the file system holding ``path``, in bytes (None: unknown)."""
    st = os.stat(path)
    try:
        kb = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
        return int(kb.read_text()) * 1024
    except (OSError, ValueError):
        return None


def _drop(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident(path: Path) -> np.ndarray:
    """One flag per page of the file: in the page cache (mincore of a map never touched)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        holder = ctypes.c_char.from_buffer(m)  # the map's address (no page is touched)
        try:
            vec = np.zeros(-(-size // PAGE), np.uint8)
            if libc.mincore(ctypes.addressof(holder), size, vec.ctypes.data) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del holder
    return (vec & 1).astype(bool)


@pytest.mark.skipif(not LINUX, reason="mincore and posix_fadvise(DONTNEED) of Linux")
def test_each_process_reads_only_the_pages_of_its_own_boxes(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    ra = _readahead(tmp_path)
    if ra is None:
        pytest.skip(f"{tmp_path} is on no block device with a readahead window (tmpfs?): "
                    "its pages cannot be dropped and counted")
    box_bytes = max(4 << 20, 4 * ra)
    if box_bytes > 64 << 20:
        pytest.skip(f"readahead of {ra >> 20} MiB on {tmp_path}'s device: boxes four times "
                    "that would make a file of over 512 MiB")
    cols = 1024
    rows = box_bytes // (cols * 4)
    host = np.repeat(np.arange(8 * rows, dtype=np.float32)[:, None], cols, axis=1)
    path = tmp_path / "w.hurray"
    hb.save(path, {"w": hb.split(host, [((k * rows, 0), (rows, cols)) for k in range(8)])})
    del host
    idx = container.read_index(path)
    spans = {}  # first row of each box -> its bytes in the file
    for e in idx.entries:
        (b,) = e.buffers
        assert e.descriptor.shard is not None
        spans[e.descriptor.shard.offsets[0]] = (idx.data_offset + b.offset,
                                               idx.data_offset + b.offset + b.length)
    _drop(path)
    if _resident(path).any():
        pytest.skip(f"posix_fadvise(DONTNEED) leaves {tmp_path}'s pages cached: the pages read "
                    "cannot be counted")

    port = str(_free_port())
    env = dict(os.environ, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    half = 4 * rows
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
                     [sys.executable, "-c", WORKER, str(r), port, str(path), str(tmp_path)],
                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for r in (0, 1)]
        try:
            for r in (0, 1):
                _drop(path)
                assert not _resident(path).any(), "a process still maps the file's pages"
                (tmp_path / f"turn{r}").touch()
                done = tmp_path / f"done{r}"
                deadline = time.monotonic() + 180
                while not done.exists():
                    if time.monotonic() > deadline or procs[r].poll() is not None:
                        pytest.fail(f"rank {r} did not finish:\n" + procs[r].communicate(
                            timeout=30)[0][-6000:])
                    time.sleep(0.05)
                time.sleep(0.05)  # (the file is complete once it has content)
                seen = json.loads(done.read_text())
                # JAX saw this process's four boxes, with their values.
                assert sorted(s[0] for s in seen) == [r * half + k * rows for k in range(4)]
                assert all(mn == a and mx == b - 1 for a, b, mn, mx in seen), seen
                resident = _resident(path)
                mine = np.zeros_like(resident)
                for first in range(r * half, (r + 1) * half, rows):
                    a, b = spans[first]
                    mine[a // PAGE:-(-b // PAGE)] = True
                head = np.zeros_like(resident)
                head[:-(-idx.data_offset // PAGE)] = True  # the header and index, read by load
                # Every page of ours was read; on a loaded machine the kernel may already have
                # evicted a few of them again (eviction only lowers the counts below, so the
                # bounds on the other boxes stay exact).
                share = float(resident[mine].mean())
                assert share >= 0.9, f"only {share:.1%} of this process's boxes' pages are in"
                others = int((resident & ~mine & ~head).sum()) * PAGE
                # Readahead keeps up to two windows in flight past the last page read (and
                # reads half a window before a first fault): at most part of the neighbouring
                # box. Reading the other process's boxes would be four boxes, 16 windows.
                read = [int(resident[a // PAGE:-(-b // PAGE)].sum()) * PAGE
                        for _, (a, b) in sorted(spans.items())]
                assert others <= 3 * ra, (r, others, ra, read)
                # Untouched: the other process's boxes but its one next to ours (readahead)
                # and the first (the header's readahead reads its first pages).
                far = [5, 6, 7] if r == 0 else [1, 2]
                assert not any(read[k] for k in far), (r, read)
            outputs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
