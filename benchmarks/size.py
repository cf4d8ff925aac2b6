"""Size independence: the same hand-off at 1 KiB and at 1 GiB.

One float32 buffer of each size (64-byte aligned, every page touched), seen as
a NumPy array, a torch tensor, a JAX array and an Arrow array that all alias it
(checked). For every CPU pair ``hb.convert(x, target)`` is timed at both sizes,
interleaved: the ratio 1 GiB / 1 KiB must stay at most 1.2 (zero-copy costs the
same whatever the size). And the proof: the process's peak resident set
(``VmHWM`` in /proc/self/status, reset before each pair through
/proc/self/clear_refs; ``ru_maxrss`` where that is not available) grows by less
than 1 MiB while the 1 GiB hand-off runs, and the result's data pointer is the
source's.

``python -m benchmarks size`` (``--small``: 64 MiB instead of 1 GiB).
"""

from __future__ import annotations

import gc
import re
import resource
import warnings
from typing import Any

import hurray_bridge as hb

from . import _frameworks as fw
from ._timing import compare, ratio

SMALL_BYTES = 1 << 10
LARGE_BYTES = 1 << 30
REDUCED_BYTES = 64 << 20
MIB = 1 << 20


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # "reset the peak resident set size" (Linux >= 4.0)
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"VmHWM:\s+(\d+) kB", f.read())
        if m:
            return int(m.group(1)) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def run(small: bool = False) -> dict[str, Any]:
    large_bytes = REDUCED_BYTES if small else LARGE_BYTES
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    base_s = fw.aligned_numpy(SMALL_BYTES // 4)
    base_l = fw.aligned_numpy(large_bytes // 4)
    srcs_s, srcs_l = fw.sources(base_s), fw.sources(base_l)
    resettable = _reset_peak()
    results["notes"].append(
        f"sizes {SMALL_BYTES} B and {large_bytes} B; peak RSS from "
        + ("VmHWM, reset before each pair" if resettable else "the process's high-water mark")
    )
    rounds = 11 if small else 15
    for src in srcs_l:
        for target in srcs_l:
            if target == src:
                continue
            pair = f"{src}->{target}"
            xs, xl = srcs_s[src], srcs_l[src]
            want = fw.pointer(src, xl)
            with warnings.catch_warnings():
                warnings.simplefilter("error", hb.CopyWarning)
                warnings.simplefilter("ignore", UserWarning)  # torch's read-only notice
                for _ in range(10):  # first calls load code and fill caches: not the data
                    hb.convert(xs, target)
                gc.collect()
                _reset_peak()
                before = _peak_bytes()
                for _ in range(10):
                    out = hb.convert(xl, target)
                zero_copy = fw.pointer(target, out) == want
                del out
                growth = _peak_bytes() - before

                def large(x: Any = xl, target: str = target) -> Any:
                    return hb.convert(x, target)

                def small_(x: Any = xs, target: str = target) -> Any:
                    return hb.convert(x, target)

                a, b, r = compare(f"hb.convert {pair} {large_bytes >> 20} MiB", large,
                                  f"hb.convert {pair} 1 KiB", small_, rounds=rounds)
            results["timings"] += [a.as_dict(), b.as_dict()]
            results["ratios"][f"{pair} time 1GiB/1KiB"] = ratio(r, "<= 1.2", zero_copy=zero_copy)
            results["ratios"][f"{pair} peak RSS growth MiB"] = ratio(growth / MIB, "< 1.0",
                                                                     zero_copy=zero_copy)
    del srcs_l, base_l
    gc.collect()
    return results
