"""Hurray files against safetensors on the same checkpoint (issue 6).

One checkpoint of 200 tensors (default ~1 GiB: 100 float32/float16 weight
matrices and 100 small vectors, random bytes), written and read both ways in
the same run:

- save: ``hb.save`` (durable: fsync of the file and its directory; CRC-32
  checksums), ``hb.save(fsync=False)`` and ``hb.save(fsync=False,
  checksums=False)`` against ``safetensors.numpy.save_file`` (which has
  neither); interleaved, each after ``os.sync()`` (see ``_timing.time_saves``);
- load: ``hb.load`` (mmap) + the metadata + the first element of every tensor,
  against ``safe_open`` + ``get_tensor`` of every tensor (+ its first element);
- every byte: the sum of every byte of every tensor, through each, and through
  ``hb.load(verify=True)`` (the checksums checked first: the cost of the opt-in);
- without mmap: ``hb.load(mmap=False)`` (every tensor read into its own 64-byte aligned
  memory: positional reads of 8 MiB on up to four threads) against a plain sequential
  copy of the whole file into one fresh buffer (``readinto`` of an unbuffered file, the
  least a reader that owns its bytes can do), interleaved (``compare``), for both files.

The files are read right after they are written, so both sides read from a
warm page cache (nothing here can drop caches). Also reported: how much the
resident set grows when ``hb.load`` hands out every tensor and one element of
each is read (the map is touched only there).

``python -m benchmarks files [--small]``; ``python -m benchmarks.files --size 4GiB``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any

import hurray_bridge as hb

from ._timing import compare, measure, parse_size, time_saves

DEFAULT_SIZE = 1 << 30
SMALL_SIZE = 32 << 20
N_TENSORS = 200


def _checkpoint(size: int, n: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(6)
    pool = rng.integers(0, 256, size=min(size, 64 << 20), dtype=np.uint8)  # random, reused
    n_big = (n + 1) // 2  # (one tensor: all of it)
    small = 4096 * 4
    big_total = max(size - (n - n_big) * small, n_big * 4096)
    out: dict[str, Any] = {}
    for i in range(n):
        if i % 2 == 0:
            nbytes = big_total // n_big // 4096 * 4096
            dtype = np.float32 if i % 4 == 0 else np.float16
            shape: tuple[int, ...] = (nbytes // np.dtype(dtype).itemsize // 1024, 1024)
            name = f"layers.{i // 2}.weight"
        else:
            dtype, shape, name = np.float32, (4096,), f"layers.{i // 2}.norm"
        nb = int(np.prod(shape)) * np.dtype(dtype).itemsize
        start = (i * 4099) % max(1, pool.size - nb)
        out[name] = pool[start:start + nb].view(dtype).reshape(shape).copy()
    return out




def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def run(size: int | None = None, small: bool = False, n_tensors: int = N_TENSORS,
        directory: str | None = None) -> dict[str, Any]:
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    repeat = 5 if small else 3
    tensors = _checkpoint(size, n_tensors)
    total = sum(a.nbytes for a in tensors.values())
    meta = {"format": "np", "bench": "files"}
    tmp = tempfile.mkdtemp(prefix="hurray-bench-", dir=directory)
    hpath, spath = os.path.join(tmp, "c.hurray"), os.path.join(tmp, "c.safetensors")
    results: dict[str, Any] = {"timings": [], "ratios": {},
                               "checkpoint": {"bytes": total, "tensors": len(tensors)}}
    t = results["timings"]

    def timed(name: str, fn: Any) -> float:
        m = measure(name, fn, repeat=repeat, min_time=0.0)
        t.append(m.as_dict())
        return m.median_us

    try:
        saves = time_saves({
            f"hb.save ({total >> 20} MiB, {len(tensors)} tensors; fsync, checksums)":
                lambda: hb.save(hpath, tensors, meta),
            "hb.save (fsync=False; checksums)":
                lambda: hb.save(hpath, tensors, meta, fsync=False),
            "hb.save (fsync=False, checksums=False)":
                lambda: hb.save(hpath, tensors, meta, fsync=False, checksums=False),
            "safetensors save_file (no fsync, no checksums)":
                lambda: save_file(tensors, spath, meta),
        }, repeat)
        t.extend(m.as_dict() for m in saves)
        save_hb, save_hb_nf, save_hb_bare, save_st = (m.median_us for m in saves)

        def hb_load_first() -> int:
            out = hb.load(hpath)
            acc = len(out.metadata)
            for x in out.values():
                acc += x.memoryview()[0]
            return acc

        def st_load_first() -> int:
            acc = 0
            with safe_open(spath, framework="numpy") as f:
                acc += len(f.metadata() or {})
                for k in f.keys():  # safe_open is not a mapping
                    acc += int(f.get_tensor(k).view(np.uint8).flat[0])
            return acc

        def hb_sum() -> int:
            out = hb.load(hpath)
            return sum(int(np.frombuffer(x.memoryview(), np.uint8).sum(dtype=np.uint64))
                       for x in out.values())

        def hb_sum_verified() -> int:
            # The opt-in check: every entry's CRC-32 and all padding, then the same reads.
            out = hb.load(hpath, verify=True)
            return sum(int(np.frombuffer(x.memoryview(), np.uint8).sum(dtype=np.uint64))
                       for x in out.values())

        def st_sum() -> int:
            acc = 0
            with safe_open(spath, framework="numpy") as f:
                for k in f.keys():
                    acc += int(f.get_tensor(k).view(np.uint8).sum(dtype=np.uint64))
            return acc

        assert hb_sum() == st_sum() == sum(int(a.view(np.uint8).sum(dtype=np.uint64))
                                           for a in tensors.values())
        load_hb = timed("hb.load (mmap) + metadata + first element of each", hb_load_first)
        load_st = timed("safe_open + get_tensor of each + first element", st_load_first)
        sum_hb = timed("sum of every byte through hb.load", hb_sum)
        sum_st = timed("sum of every byte through safetensors", st_sum)
        sum_hb_verified = timed("sum of every byte through hb.load(verify=True)",
                                hb_sum_verified)

        nommap_ratios = {}
        for label, path in ((".hurray", hpath), (".safetensors", spath)):
            file_size = os.path.getsize(path)

            def plain_copy(path: str = path, file_size: int = file_size) -> int:
                buf = bytearray(file_size)  # fresh, like the tensors' memory
                with open(path, "rb", buffering=0) as f:
                    return f.readinto(buf) or 0

            def hb_no_mmap(path: str = path) -> int:
                return len(hb.load(path, mmap=False))

            a, b, nommap_ratios[label] = compare(
                f"hb.load(mmap=False) of the {label} file", hb_no_mmap,
                f"sequential readinto of the whole {label} file", plain_copy,
                rounds=2 * repeat + 1, min_time=0.0)
            t.extend([a.as_dict(), b.as_dict()])

        import gc

        gc.collect()
        before = _rss()
        out = hb.load(hpath)
        touched = sum(x.memoryview()[0] for x in out.values())
        after = _rss()
        del out, touched
        r = results["ratios"]
        r["save_vs_save_file"] = {"value": save_hb / save_st, "goal": "informational: "
                                  "durable and checksummed against neither"}
        r["save_nofsync_vs_save_file"] = {"value": save_hb_nf / save_st, "goal": "informational: "
                                          "checksummed against not"}
        r["save_like_for_like_vs_save_file"] = {"value": save_hb_bare / save_st,
                                                "goal": "<= 1.0"}
        r["load_first_elements_vs_safe_open_get_tensor"] = {"value": load_hb / load_st,
                                                            "goal": "<= 0.05"}
        r["sum_every_byte_vs_safetensors"] = {"value": sum_hb / sum_st, "goal": "<= 1.0"}
        r["sum_every_byte_verified_vs_unverified"] = {
            "value": sum_hb_verified / sum_hb, "goal": "informational: what verify=True, "
            "off by default, adds to a read of every byte (docs/spec/container.md §9)"}
        for label, value in nommap_ratios.items():
            r[f"load_no_mmap_vs_sequential_copy{label.replace('.', '_')}"] = {
                "value": value, "goal": "<= 1.11 (at least 0.9x the copy's speed)"}
        if before is not None and after is not None:
            r["load_rss_growth_vs_file_size"] = {"value": (after - before) / total,
                                                 "goal": "<= 0.05"}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results




def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.files", description=__doc__)
    p.add_argument("--size", type=parse_size, default=None,
                   help="checkpoint size, e.g. 1GiB, 256MiB")
    p.add_argument("--small", action="store_true", help=f"{SMALL_SIZE >> 20} MiB, for a quick run")
    p.add_argument("--tensors", type=int, default=N_TENSORS)
    p.add_argument("--dir", default=None, help="where to write the two files (default: $TMPDIR)")
    args = p.parse_args()
    res = run(args.size, args.small, args.tensors, args.dir)
    for t in res["timings"]:
        print(f"  {t['name']:<56} {t['median_us'] / 1e3:10.2f} ms  (IQR {t['iqr_us'] / 1e3:.2f})")
    for k, r in res["ratios"].items():
        print(f"  ratio {k:<48} {r['value']:8.4f}   goal {r['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
