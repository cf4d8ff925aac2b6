"""hb.save of a Dask array under a ``distributed.Client``: each chunk is computed and
written by the worker that holds it.

One ``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` on localhost,
without a dashboard, serves the module; it is started with a timeout and closed in a
``finally``; every compute and save runs under a time bound, so a stuck cluster fails a
test instead of hanging CI. The module takes about 10 s, most of it the cluster starting.
Skipped when dask or distributed is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
da = pytest.importorskip("dask.array", reason="dask is not installed: pip install "
                                              "'hurray-bridge[dask]'")
distributed = pytest.importorskip("distributed", reason="distributed is not installed: pip "
                                                        "install 'hurray-bridge[dask]'")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge.container import verify  # noqa: E402

TIMEOUT = 60  # seconds: the cluster's start, and each save or compute


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with warnings.catch_warnings():
        # JAX (imported by an earlier test) warns at any fork; the workers are spawned.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
            host="127.0.0.1", memory_limit="1GiB", timeout=TIMEOUT)
    try:
        c = distributed.Client(cluster, timeout=TIMEOUT)
        try:
            c.wait_for_workers(2, timeout=TIMEOUT)
            yield c
        finally:
            c.close(timeout=TIMEOUT)
    finally:
        cluster.close(timeout=TIMEOUT)


def bounded(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a thread of this process, failed after TIMEOUT seconds."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result(timeout=TIMEOUT)


def generated(shape: tuple[int, int], chunks: tuple[int, int]) -> da.Array:
    """An array whose chunks are made on the workers (from their block positions alone)."""
    base = da.ones(shape, chunks=chunks, dtype=np.float64)
    return base.map_blocks(
        lambda b, block_info=None: b * (block_info[0]["array-location"][0][0] + 1)
        + np.arange(b.shape[1]), dtype=np.float64)


def test_each_chunk_is_written_by_the_worker_that_computed_it(client: Any,
                                                              tmp_path: Path) -> None:
    x = generated((64, 48), (16, 24))  # 8 chunks, two per row band, cut across columns
    path = tmp_path / "x.hurray"
    with distributed.get_task_stream(client) as stream:
        bounded(hb.save, path, {"x": x})
    records = stream.data
    made = {r["key"][1:]: r["worker"] for r in records
            if isinstance(r["key"], tuple) and r["key"][0] == x.name}
    written = {r["key"][1:]: r["worker"] for r in records
               if isinstance(r["key"], tuple) and r["key"][0] == f"hurray-write-{x.name}"}
    assert len(made) == len(written) == 8
    assert written == made  # every chunk written where it was computed
    assert len(set(made.values())) == 2  # both workers took part
    # No chunk moved between processes: the scheduler recorded no transfer at all.
    assert not [s for r in records for s in r["startstops"] if s["action"] == "transfer"]

    want = bounded(x.compute)
    np.testing.assert_array_equal(hb.convert(hb.load(path)["x"], "numpy"), want)
    verify(path)  # the CRC-32 combined from the workers' runs is the entry's
    cli = subprocess.run([sys.executable, "-m", "hurray_bridge", "verify", str(path)],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    hb.save(tmp_path / "n.hurray", {"x": want})
    assert path.read_bytes() == (tmp_path / "n.hurray").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["n.hurray", "x.hurray"]


def test_loaded_entry_is_read_by_the_workers_from_the_file(client: Any,
                                                           tmp_path: Path) -> None:
    a = np.arange(32 * 40, dtype=np.int32).reshape(32, 40)
    path = tmp_path / "a.hurray"
    hb.save(path, {"a": a})
    x = hb.get_adapter("dask").from_hurray(hb.load(path)["a"], chunks=(8, 40))
    # The graph carries the path, not the bytes: what is sent to the workers is small.
    assert all(not isinstance(v, np.ndarray) for v in dict(x.dask).values())
    total = bounded(lambda: int(x.sum().compute()))
    assert total == int(a.sum())
    # And a save of it from the workers gives the same file again.
    bounded(hb.save, tmp_path / "b.hurray", {"a": x})
    assert (tmp_path / "b.hurray").read_bytes() == path.read_bytes()


def test_a_failing_chunk_leaves_no_file_and_no_temporary(client: Any, tmp_path: Path) -> None:
    x = generated((8, 8), (4, 4)).map_blocks(lambda b: b.astype(np.float32),
                                             dtype=np.float64)  # the graph lies
    path = tmp_path / "x.hurray"
    with pytest.raises(hb.FormatError, match="planned from the Dask array's metadata"):
        bounded(hb.save, path, {"x": x})
    assert os.listdir(tmp_path) == []
