"""Hand-off overhead per tensor: ``hb.convert(x, target)`` against the target's own import.

One small tensor (1000 float32) made by each framework; for every CPU pair of
NumPy, torch, JAX and Arrow, ``hb.convert(x, target)`` is timed against the
target's direct DLPack import of ``x`` (``np.from_dlpack``, ``torch.from_dlpack``,
``jax.numpy.from_dlpack``, ``pa.Array.from_dlpack``), interleaved in the same run.

Before timing, both results are checked to alias the source (data pointers
equal: zero-copy on both sides, so a copy cannot win a race), and hb.CopyWarning
is an error. Goals (issue 8): at most 1.3x the direct path for every pair, and
faster than the direct path for torch -> JAX.

``python -m benchmarks handoff``
"""

from __future__ import annotations

import warnings
from typing import Any

import hurray_bridge as hb

from . import _frameworks as fw
from ._timing import compare, ratio

N = 1000
GOAL = "<= 1.3"


def _zero_copy(target: str, out: Any, want: int) -> bool:
    return fw.pointer(target, out) == want


def run(small: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    srcs = fw.native_sources(N)
    missing = [f for f in fw.FRAMEWORKS if f not in srcs]
    if missing:
        results["notes"].append(f"not installed, pairs skipped: {', '.join(missing)}")
    rounds = 11 if small else 21
    for src, x in srcs.items():
        want = fw.pointer(src, x)
        for target in srcs:
            if target == src:
                continue
            pair = f"{src}->{target}"
            dname, dfn = fw.direct(target)
            note = None
            try:
                d_out = dfn(x)
                if not _zero_copy(target, d_out, want):
                    note = f"{dname} copies"
            except Exception as exc:  # the direct path may not exist for this pair
                note = f"{dname} fails: {type(exc).__name__}: {exc}"
                fb = fw.direct_fallback(target)
                if fb is None:
                    results["ratios"][pair] = ratio(None, GOAL, note=note)
                    continue
                dname, dfn = fb
                d_out = dfn(x)
                note += f"; compared with {dname}"
            with warnings.catch_warnings():
                warnings.simplefilter("error", hb.CopyWarning)
                warnings.simplefilter("ignore", UserWarning)  # torch's read-only notice
                out = hb.convert(x, target)
            ours_zc = _zero_copy(target, out, want)
            if not ours_zc:
                raise AssertionError(f"{pair}: hb.convert copied (data pointer differs)")

            # Both callables are bound the same way (a local name), so neither side
            # pays a module attribute lookup the other does not.
            def ours(x: Any = x, target: str = target, convert: Any = hb.convert) -> Any:
                return convert(x, target)

            def theirs(x: Any = x, dfn: Any = dfn) -> Any:
                return dfn(x)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                a, b, r = compare(f"hb.convert {pair}", ours, f"{dname} {pair}", theirs,
                                  rounds=rounds)
            results["timings"] += [a.as_dict(), b.as_dict()]
            extra: dict[str, Any] = {"zero_copy": ours_zc, "direct": dname}
            if note:
                extra["note"] = note
            results["ratios"][pair] = ratio(r, GOAL, **extra)
            if pair == "torch->jax":
                results["ratios"]["torch->jax faster than direct"] = ratio(r, "< 1.0")
    return results
