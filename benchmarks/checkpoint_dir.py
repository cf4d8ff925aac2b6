"""Checkpoints of several files: ``hb.load(folder)`` and ``hurray convert DIR OUT`` against
their peers, in the same run, interleaved.

One checkpoint (default 512 MiB, ``--small`` 32 MiB; the tensors of ``benchmarks.files``)
is written as safetensors shards of about a quarter of it each plus the index, as
``huggingface_hub.save_torch_state_dict`` lays one out (written here without torch: the
shards by ``safetensors_io.save``, the index as huggingface_hub writes it). Then:

- load: ``hb.load(folder)`` (the index read and checked against every shard's names, each
  shard mapped) + the first element of every tensor, against what a loader of the folder
  does with safetensors: the index read, then ``safe_open`` + ``get_tensor`` of each tensor
  of each shard (+ its first element). Also against ``hb.load`` of each shard file in turn:
  what the index and its checks cost;
- convert: ``convert_checkpoint(fsync=False)`` (``hurray convert DIR OUT --no-fsync``:
  every shard converted, CRC-32 checksums written, then the index) against
  ``shutil.copyfile`` of every file of the folder. Each output is removed before its timed
  call (untimed).

The files are read right after they are written: a warm page cache on both sides.

``python -m benchmarks checkpoint_dir [--small]``; ``python -m benchmarks.checkpoint_dir
--size 1GiB --shards 8``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any

import hurray_bridge as hb
from hurray_bridge import safetensors_io
from hurray_bridge.checkpoint_dir import convert_checkpoint

from ._timing import compare, parse_size, ratio
from .files import N_TENSORS, _checkpoint

DEFAULT_SIZE = 512 << 20
SMALL_SIZE = 32 << 20
N_SHARDS = 4


def _write_folder(folder: str, tensors: dict[str, Any], shards: int) -> None:
    """``tensors`` as ``shards`` safetensors files of about equal size and their index."""
    total = sum(a.nbytes for a in tensors.values())
    groups: list[dict[str, Any]] = [{}]
    filled = 0
    for name, a in tensors.items():
        if filled >= total * len(groups) / shards and len(groups) < shards:
            groups.append({})
        groups[-1][name] = a
        filled += a.nbytes
    weight_map = {}
    for i, group in enumerate(groups, 1):
        file = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        safetensors_io.save(os.path.join(folder, file), group, {"format": "np"}, fsync=False)
        weight_map.update(dict.fromkeys(group, file))
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def run(size: int | None = None, small: bool = False, shards: int = N_SHARDS,
        directory: str | None = None) -> dict[str, Any]:
    import numpy as np
    from safetensors import safe_open

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    rounds = 7 if small else 5
    tensors = _checkpoint(size, N_TENSORS)
    total = sum(a.nbytes for a in tensors.values())
    tmp = tempfile.mkdtemp(prefix="hurray-bench-", dir=directory)
    src = os.path.join(tmp, "src")
    out, copies = os.path.join(tmp, "out"), os.path.join(tmp, "copies")
    os.mkdir(src)
    results: dict[str, Any] = {
        "timings": [], "ratios": {},
        "checkpoint": {"bytes": total, "tensors": len(tensors), "shards": shards}}
    try:
        _write_folder(src, tensors, shards)
        index_path = os.path.join(src, "model.safetensors.index.json")

        def hb_folder() -> int:
            f = hb.load(src)
            return sum(x.memoryview()[0] for x in f.values())  # type: ignore[union-attr]

        shard_paths = sorted(os.path.join(src, n) for n in os.listdir(src)
                             if n.endswith(".safetensors"))

        def hb_each_file() -> int:
            acc = 0
            for path in shard_paths:
                f = hb.load(path)
                acc += sum(x.memoryview()[0] for x in f.values())  # type: ignore[union-attr]
            return acc

        def st_folder() -> int:
            with open(index_path) as fi:
                files = dict.fromkeys(json.load(fi)["weight_map"].values())
            acc = 0
            for file in files:
                with safe_open(os.path.join(src, file), framework="numpy") as f:
                    for k in f.keys():
                        acc += int(f.get_tensor(k).view(np.uint8).flat[0])
            return acc

        assert hb_folder() == hb_each_file()

        def converted() -> None:
            shutil.rmtree(out, ignore_errors=True)
            convert_checkpoint(src, out, fsync=False)

        def copied() -> None:
            shutil.rmtree(copies, ignore_errors=True)
            os.mkdir(copies)
            for name in os.listdir(src):
                shutil.copyfile(os.path.join(src, name), os.path.join(copies, name))

        t = results["timings"]
        r = results["ratios"]
        a, b, load_vs_st = compare(f"hb.load(folder of {shards} shards, {total >> 20} MiB) + "
                                   "first elements", hb_folder,
                                   "index + safe_open + get_tensor of each, per shard",
                                   st_folder, rounds=rounds * 3)
        t += [a.as_dict(), b.as_dict()]
        r["load_folder_vs_safe_open_get_tensor"] = ratio(load_vs_st, "<= 0.1")
        a, b, load_vs_each = compare("hb.load(folder) + first elements", hb_folder,
                                     "hb.load of each shard file + first elements",
                                     hb_each_file, rounds=rounds * 3)
        t += [a.as_dict(), b.as_dict()]
        r["load_folder_vs_each_file"] = ratio(load_vs_each, "<= 1.2", note="what the index "
                                              "and its checks add to loading the shards")
        a, b, convert_vs_copy = compare("convert_checkpoint(fsync=False), with CRC-32",
                                        converted, "shutil.copyfile of every file", copied,
                                        rounds=rounds, min_time=0.0)
        t += [a.as_dict(), b.as_dict()]
        r["convert_folder_vs_copyfile"] = ratio(convert_vs_copy, "informational: one read "
                                                "into user space and the CRC-32 more than a "
                                                "copy in the kernel")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_dir", description=__doc__)
    p.add_argument("--size", type=parse_size, default=None, help="checkpoint size, e.g. 1GiB")
    p.add_argument("--small", action="store_true", help=f"{SMALL_SIZE >> 20} MiB, for a quick run")
    p.add_argument("--shards", type=int, default=N_SHARDS)
    p.add_argument("--dir", default=None, help="where to write the folders (default: $TMPDIR)")
    args = p.parse_args()
    res = run(args.size, args.small, args.shards, args.dir)
    for t in res["timings"]:
        print(f"  {t['name']:<64} {t['median_us'] / 1e3:10.2f} ms  (IQR {t['iqr_us'] / 1e3:.2f})")
    for k, r in res["ratios"].items():
        print(f"  ratio {k:<40} {r['value']:8.4f}   goal {r['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
