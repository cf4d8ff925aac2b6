"""``hb.save`` of a Dask array from the workers, against ``da.store`` into a NumPy memmap.

One ``distributed.LocalCluster`` (2 worker processes, 1 thread each) on localhost.
The array (default 1 GiB of float32, row bands of 32 MiB) is made on the workers,
so neither side gathers anything into the client:

- hurray: ``hb.save(path, {"x": x}, fsync=False)``: the file planned in the client,
  each chunk computed and ``pwrite``-n into the preallocated temporary by its worker,
  CRC-32 per chunk combined in the client (container.md §7.1);
- peer: ``da.store(x, target, lock=False)`` into a ``np.memmap`` of the same array,
  created (preallocated) in the client; ``target`` opens the memmap in the worker
  that stores the chunk (a memmap pickled to a worker would arrive as a plain copy).

Neither flushes to disk (``fsync=False``; the memmap is not flushed): both leave the
same dirty pages. Rounds alternate the order, each after ``os.sync()`` and a reset of
every process's peak resident set (``/proc/self/clear_refs``), so the peak each worker
reports (``VmHWM``) is that of the one save. The peer maps the memmap afresh for each
chunk, so at most one chunk's written pages count in its resident set at a time.
The client's peak is reported too: neither side holds the array there.

``python -m benchmarks.dask_save [--size 1GiB] [--rounds 3]``;
``python -m benchmarks dask_save [--small]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import hurray_bridge as hb

from ._timing import Timing, parse_size, ratio

DEFAULT_SIZE = 1 << 30
SMALL_SIZE = 64 << 20
COLUMNS = 4096
CHUNK_BYTES = 32 << 20


class MemmapTarget:
    """A ``da.store`` target that maps the file in the process storing a chunk."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: Any) -> None:
        self.path, self.shape, self.dtype = path, shape, dtype

    def __setitem__(self, key: Any, value: Any) -> None:
        import numpy as np

        np.memmap(self.path, self.dtype, "r+", shape=self.shape)[key] = value


def _peak_rss_mib() -> float:
    """This process's peak resident set since the last ``_reset_peak`` (Linux's VmHWM)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _reset_peak() -> bool:
    """Start this process's peak resident set afresh (writing 5 to clear_refs, Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _array(size: int) -> Any:
    import dask.array as da
    import numpy as np

    rows = max(1, size // 4 // COLUMNS)
    band = max(1, CHUNK_BYTES // 4 // COLUMNS)
    return da.ones((rows, COLUMNS), chunks=(band, COLUMNS), dtype=np.float32) * 0.5


def _one(client: Any, name: str, x: Any, folder: str) -> tuple[float, list[float]]:
    """Seconds and peak RSS (MiB) of one save: each worker's, then the client's."""
    import dask.array as da
    import numpy as np

    client.run(_reset_peak)
    _reset_peak()
    if hasattr(os, "sync"):
        os.sync()
    path = os.path.join(folder, f"{name}.bin" if name == "peer" else f"{name}.hurray")
    t0 = time.perf_counter()
    if name == "peer":
        np.memmap(path, np.float32, "w+", shape=x.shape)  # preallocated, as hb.save does
        da.store(x, MemmapTarget(path, x.shape, np.float32), lock=False)
    else:
        hb.save(path, {"x": x}, fsync=False)
    seconds = time.perf_counter() - t0
    peaks = sorted(client.run(_peak_rss_mib).values())
    peaks.append(_peak_rss_mib())  # the client's, last
    os.unlink(path)
    return seconds, peaks


def run(small: bool = False, size: int | None = None, rounds: int = 3) -> dict[str, Any]:
    import distributed

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    folder = tempfile.mkdtemp(prefix="hb-dask-bench-", dir=os.environ.get("HB_BENCH_DIR"))
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, host="127.0.0.1")
    try:
        client = distributed.Client(cluster)
        try:
            x = _array(size)
            for n in ("hurray", "peer"):  # the workers import what each side needs, once
                _one(client, n, _array(CHUNK_BYTES), folder)
            secs: dict[str, list[float]] = {"hurray": [], "peer": []}
            peaks: dict[str, list[float]] = {"hurray": [], "peer": []}
            client_peaks: dict[str, list[float]] = {"hurray": [], "peer": []}
            ratios = []
            for r in range(rounds):
                order = ("hurray", "peer") if r % 2 == 0 else ("peer", "hurray")
                got = {n: _one(client, n, x, folder) for n in order}
                for n, (s, p) in got.items():
                    secs[n].append(s)
                    peaks[n].append(max(p[:-1]))
                    client_peaks[n].append(p[-1])
                ratios.append(got["hurray"][0] / got["peer"][0])
        finally:
            client.close()
    finally:
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    nbytes = int(x.nbytes)

    def timing(name: str) -> Timing:
        s = secs[name]
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0], s[0], s[0]]
        return Timing(name, statistics.median(s) * 1e6, (q[2] - q[0]) * 1e6, 1)

    t_hb, t_peer = timing("hurray"), timing("peer")
    t_hb.name = f"hb.save of {nbytes >> 20} MiB from 2 workers (fsync=False)"
    t_peer.name = f"da.store into np.memmap, {nbytes >> 20} MiB, 2 workers"
    gib_s = nbytes / (1 << 30) / statistics.median(secs["hurray"])
    return {
        "timings": [t_hb.as_dict(), t_peer.as_dict()],
        "ratios": {
            "dask_save_vs_store_memmap": ratio(statistics.median(ratios), "<= 1.3",
                                               rounds=rounds, bytes=nbytes),
        },
        "notes": [
            f"{nbytes >> 20} MiB float32 in {CHUNK_BYTES >> 20} MiB row bands, made on the "
            f"workers; {rounds} rounds, alternating order, peak RSS reset before each save",
            f"hb.save: {gib_s:.2f} GiB/s; peak RSS per worker (max of the two, median over "
            f"rounds): hb.save {statistics.median(peaks['hurray']):.0f} MiB, da.store into "
            f"memmap {statistics.median(peaks['peer']):.0f} MiB; array "
            f"{nbytes >> 20} MiB",
            "client peak RSS during a save: hb.save "
            f"{statistics.median(client_peaks['hurray']):.0f} MiB, da.store "
            f"{statistics.median(client_peaks['peer']):.0f} MiB (Python, NumPy, Dask and "
            "the client: neither holds the array)",
        ],
    }




def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dask_save")
    p.add_argument("--size", type=parse_size, default=DEFAULT_SIZE,
                   help="bytes (e.g. 256MiB, 1GiB)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    res = run(size=args.size, rounds=args.rounds)
    for t in res["timings"]:
        print(f"{t['name']:<56} {t['median_us'] / 1e6:8.3f} s  (IQR {t['iqr_us'] / 1e6:.3f})")
    for k, r in res["ratios"].items():
        print(f"{k}: {r['value']:.3f} (goal {r['goal']})")
    for note in res["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
