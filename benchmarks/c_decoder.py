"""The C library's descriptor decoder against the Python one.

Three ways to decode the same bytes, per descriptor:

* ``python``: ``wire.decode`` written in Python alone (the dense fast path in Python, and the
  general decoder for everything else) -- what runs when ``_speedups`` was not built;
* ``compiled``: ``hb.Descriptor.from_bytes`` as installed, whose dense fast path is the C
  library's decoder (``c/src/descriptor.c``) compiled into ``hurray_bridge._speedups``; the
  time includes building the Python ``Descriptor``;
* ``C``: ``hry_decode`` itself, timed in C by the C test driver (no Python at all); the
  library is built with ``make`` into a temporary directory first (skipped with a note when
  there is no C compiler).

No goal (information): the ratios say what the C decoder buys.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from typing import Any

import hurray_bridge as hb
from hurray_bridge import wire

from ._timing import compare, measure, ratio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _descriptors() -> dict[str, hb.Descriptor]:
    q = hb.QuantScheme
    return {
        "rank1": hb.Descriptor([1000], hb.float32),
        "rank4": hb.Descriptor([8, 64, 56, 56], hb.bfloat16),
        "rank64": hb.Descriptor([1] * 62 + [3, 5], hb.int8),
        "strided4": hb.Descriptor([2, 3, 4, 5], hb.float32, hb.Layout.STRIDED,
                                  strides=[60, -20, 5, 1]),
        "per_block_int4": hb.Descriptor([4096, 4096], hb.int4, quantization=hb.Quantization(
            q.PER_BLOCK, hb.float8_e8m0fnu, None, axis=1, block_size=32)),
        "csr": hb.Descriptor([1000, 1000], hb.float32, hb.Layout.CSR,
                             sparse=hb.Sparse(5000, hb.int32)),
    }


def _with_fast_path(fast: Any, raw: bytes) -> hb.Descriptor:
    """``wire.decode(raw)`` with ``fast`` as its dense fast path (the swap costs ~0.04 us)."""
    saved = wire._decode_dense
    wire._decode_dense = fast
    try:
        return wire.decode(raw)
    finally:
        wire._decode_dense = saved


def _python_decode(raw: bytes) -> hb.Descriptor:
    """wire.decode in Python alone, as without the compiled module."""
    return _with_fast_path(wire._decode_dense_python, raw)


def _general(raw: bytes) -> hb.Descriptor:
    """The general decoder only (no fast path)."""
    return _with_fast_path(lambda data, n: None, raw)


def _c_driver(tmp: str) -> tuple[str | None, str]:
    """Build the C library and its driver; (path of test_hurray or None, note)."""
    cc, make = shutil.which("cc") or shutil.which("gcc"), shutil.which("make")
    if cc is None or make is None:
        return None, "no C compiler or make: the in-C timings are skipped"
    build = os.path.join(tmp, "build")
    proc = subprocess.run([make, "-C", os.path.join(ROOT, "c"), f"BUILD={build}", "test"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"make -C c failed: {proc.stderr[-300:]}"
    return os.path.join(build, "test_hurray"), "C timings: hry_decode in a loop, in C"


def run() -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    try:
        from hurray_bridge import _speedups  # noqa: F401

        built = wire._decode_dense is not wire._decode_dense_python
    except ImportError:
        built = False
    if not built:
        results["notes"].append("hurray_bridge._speedups is not built: 'compiled' = Python")
    with tempfile.TemporaryDirectory() as tmp:
        driver, note = _c_driver(tmp)
        results["notes"].append(note)
        for name, d in _descriptors().items():
            raw = d.to_bytes()
            assert _python_decode(raw) == d == hb.Descriptor.from_bytes(raw)
            py, comp, r = compare(f"python decode {name}", lambda raw=raw: _python_decode(raw),
                                  f"compiled decode {name}",
                                  lambda raw=raw: hb.Descriptor.from_bytes(raw))
            results["timings"] += [py.as_dict(), comp.as_dict()]
            results["ratios"][f"python_over_compiled_{name}"] = ratio(r, "information")
            if driver is not None:
                out = subprocess.run([driver, "bench", raw.hex()], capture_output=True,
                                     text=True, check=True).stdout
                c = json.loads(out)
                results["timings"].append({"name": f"C hry_decode {name}",
                                           "median_us": c["median_ns"] / 1000,
                                           "iqr_us": c["iqr_ns"] / 1000, "loops": c["loops"]})
                results["ratios"][f"python_over_c_{name}"] = ratio(
                    py.median_us * 1000 / c["median_ns"], "information")
        # the general decoder alone (no fast path), for the record
        raw4 = _descriptors()["rank4"].to_bytes()
        gen = measure("python general decoder rank4", lambda: _general(raw4))
        results["timings"].append(gen.as_dict())
    return results
