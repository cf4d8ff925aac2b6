"""Checkpoints of many small tensors: the cost per tensor against safetensors.

A state dict of N small tensors (N = 10, 100, 1,000, 10,000 and 100,000; a few
shapes and element types, 16 to 1,024 bytes each, as the norms, biases and
scalars of a model) is saved and loaded both ways in the same run, interleaved
(``_timing.compare``), each ratio against its peer:

- save: ``hb.save`` (``fsync=False``: safetensors does not flush either) and
  ``safetensors_io.save`` (the bridge writing safetensors) against
  ``safetensors.numpy.save_file``;
- load: ``hb.load`` of the safetensors file and of the Hurray file against
  ``safetensors.numpy.load_file`` (which reads every tensor into a NumPy array);
- load + NumPy: ``hb.load`` then ``hb.convert(t, "numpy")`` of every tensor,
  against ``load_file`` (both end with a dict of NumPy arrays);
- with torch installed, the same against ``safetensors.torch`` (``save_file`` of
  torch tensors; ``load_file`` against ``hb.load`` + ``hb.convert(t, "torch")``).

Goal: at most 1.0x at every count, i.e. the cost is linear in the number of
tensors with a constant no larger than safetensors'. The microseconds per tensor
of each side are reported too.

``python -m benchmarks many_tensors [--small]`` (``--small``: up to 10,000 tensors).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import hurray_bridge as hb
from hurray_bridge import safetensors_io

from . import _frameworks as fw
from ._timing import compare, ratio

COUNTS = (10, 100, 1_000, 10_000, 100_000)
SMALL_COUNTS = (10, 100, 1_000, 10_000)
SHAPES: tuple[tuple[int, ...], ...] = ((64,), (16, 16), (4,), (), (8, 4, 2), (256,), (3, 3))
DTYPES = ("float32", "float16", "int64", "uint8")


def _state_dict(n: int) -> dict[str, Any]:
    import numpy as np

    out = {}
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)]
        dt = DTYPES[(i // len(SHAPES)) % len(DTYPES)]
        out[f"model.layers.{i // 8}.p{i % 8}"] = np.full(shape, i % 100, dtype=dt)
    return out


def _rounds(n: int, small: bool) -> int:
    if n >= 100_000:
        return 3
    if n >= 10_000:
        return 5
    if n <= 100:
        # A save or load of 10 or 100 tensors takes 0.05-1 ms, one call a round: the median
        # of 11 rounds moved by 0.3 between runs; of 201, by a few hundredths.
        return 101 if small else 201
    return 7 if small else 11


def run(small: bool = False, counts: tuple[int, ...] | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    have = fw.available()
    counts = counts or (SMALL_COUNTS if small else COUNTS)
    results["notes"].append(f"tensors of shapes {SHAPES} and types {DTYPES}; "
                            "save with fsync=False on both sides")
    tmp = tempfile.mkdtemp(prefix="hurray-bench-many-")
    try:
        with warnings.catch_warnings():
            # torch has no read-only tensors: a mapped file's tensors are copied (and say so)
            warnings.simplefilter("ignore", hb.CopyWarning)
            warnings.simplefilter("ignore", UserWarning)
            for n in counts:
                sd = _state_dict(n)
                cases = _numpy_cases(sd, tmp, n)
                if "torch" in have:
                    cases += _torch_cases(sd, tmp, n)
                for mine_name, mine, peer_name, peer in cases:
                    a, b, r = compare(f"{mine_name} ({n})", mine, f"{peer_name} ({n})", peer,
                                      rounds=_rounds(n, small), min_time=0.0)
                    results["timings"] += [a.as_dict(), b.as_dict()]
                    results["ratios"][f"{mine_name.split(':')[0]} x{n}"] = ratio(
                        r, "<= 1.0", us_per_tensor=round(a.median_us / n, 2),
                        peer_us_per_tensor=round(b.median_us / n, 2), peer=peer_name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


_Case = tuple[str, Callable[[], object], str, Callable[[], object]]


def _numpy_cases(sd: dict[str, Any], tmp: str, n: int) -> list[_Case]:
    from safetensors.numpy import load_file, save_file

    hp = os.path.join(tmp, f"{n}.hurray")
    sp = os.path.join(tmp, f"{n}.safetensors")
    bp = os.path.join(tmp, f"{n}.bridge.safetensors")
    save_file(sd, sp)
    hb.save(hp, sd, fsync=False)
    return [
        ("save .hurray: hb.save", lambda: hb.save(hp, sd, fsync=False),
         "safetensors.numpy.save_file", lambda: save_file(sd, sp)),
        ("save .safetensors: safetensors_io.save",
         lambda: safetensors_io.save(bp, sd, fsync=False),
         "safetensors.numpy.save_file", lambda: save_file(sd, sp)),
        ("load .safetensors: hb.load", lambda: hb.load(sp),
         "safetensors.numpy.load_file", lambda: load_file(sp)),
        ("load .hurray: hb.load", lambda: hb.load(hp),
         "safetensors.numpy.load_file", lambda: load_file(sp)),
        ("load .safetensors + NumPy: hb.load, hb.convert",
         lambda: {k: hb.convert(v, "numpy") for k, v in hb.load(sp).items()},
         "safetensors.numpy.load_file", lambda: load_file(sp)),
    ]


def _torch_cases(sd: dict[str, Any], tmp: str, n: int) -> list[_Case]:
    import torch
    from safetensors.torch import load_file, save_file

    td = {k: torch.from_numpy(v) for k, v in sd.items()}
    hp = os.path.join(tmp, f"{n}.torch.hurray")
    sp = os.path.join(tmp, f"{n}.torch.safetensors")
    save_file(td, sp)
    hb.save(hp, td, fsync=False)
    return [
        ("save torch .hurray: hb.save", lambda: hb.save(hp, td, fsync=False),
         "safetensors.torch.save_file", lambda: save_file(td, sp)),
        ("load .safetensors + torch: hb.load, hb.convert",
         lambda: {k: hb.convert(v, "torch") for k, v in hb.load(sp).items()},
         "safetensors.torch.load_file", lambda: load_file(sp)),
    ]


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(run(small="--small" in sys.argv), indent=1))
