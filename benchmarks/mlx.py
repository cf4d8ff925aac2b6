"""MLX hand-offs: ``hb.convert`` to and from MLX against what an MLX user writes.

Out of MLX, both sides share the array's memory (checked before timing):

- ``hb.convert(a, "numpy")`` against ``np.array(a, copy=False)``, MLX's documented view;
- ``hb.convert(a, "torch")`` against ``torch.from_numpy(np.array(a, copy=False))``.

Into MLX, both sides copy (MLX takes no foreign CPU memory, so the peer copies too):

- ``hb.convert(x, "mlx", copy=True)`` of a NumPy array against ``mx.array(x)``, for a
  small array (1000 float32: the bridge's overhead) and a large one (16 MiB: the copy),
  and for float64 against ``mx.array(x, dtype=mx.float64)`` (left to choose, MLX would
  narrow it: not the same result).

Each pair is timed interleaved in one run (``_timing.compare``); goal: at most 1.3x the
peer out of MLX and for the large copy into it.

``python -m benchmarks mlx [--small]``
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import hurray_bridge as hb

from ._timing import compare, ratio

GOAL = "<= 1.3"


def run(small: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    try:
        import mlx.core as mx
        import numpy as np
    except ImportError as exc:
        results["notes"].append(f"{exc.name} is not installed (extra 'mlx'): nothing measured")
        return results
    torch: Any = None
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        results["notes"].append("torch is not installed: the MLX -> torch pair is skipped")
    rounds = 11 if small else 21
    big = (1 << 20) if small else (4 << 20)  # float32 elements: 4 or 16 MiB

    a = mx.arange(1000, dtype=mx.float32)
    mx.eval(a)
    where = int(np.array(a, copy=False).__array_interface__["data"][0])
    pairs: list[tuple[str, str, Any, Any, bool]] = [
        ("mlx->numpy", "np.array(a, copy=False)", lambda: hb.convert(a, "numpy"),
         lambda: np.array(a, copy=False), True)]
    if torch is not None:
        pairs.append(("mlx->torch", "torch.from_numpy(np.array(a, copy=False))",
                      lambda: hb.convert(a, "torch"),
                      lambda: torch.from_numpy(np.array(a, copy=False)), True))
    for n, dtype, kw in ((1000, np.float32, {}), (big, np.float32, {}),
                         (1000, np.float64, {"dtype": mx.float64})):
        x = np.arange(n, dtype=dtype)
        label = f"numpy->mlx {np.dtype(dtype).name} x {n}"

        def ours(x: Any = x) -> Any:
            return hb.convert(x, "mlx", copy=True)

        def theirs(x: Any = x, kw: dict[str, Any] = kw) -> Any:
            return mx.array(x, **kw)

        pairs.append((label, "mx.array(x" + (", dtype=mx.float64)" if kw else ")"), ours,
                      theirs, False))

    for pair, peer, ours, theirs, shared in pairs:
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            out = ours()
        if shared:
            got = (out.data_ptr() if torch is not None and isinstance(out, torch.Tensor)
                   else int(out.__array_interface__["data"][0]))
            if got != where:
                raise AssertionError(f"{pair}: hb.convert copied (data pointer differs)")
        else:
            assert out.dtype == theirs().dtype and mx.array_equal(out, theirs()).item()
        ta, tb, r = compare(f"hb.convert {pair}", ours, f"{peer} {pair}", theirs,
                            rounds=rounds)
        results["timings"] += [ta.as_dict(), tb.as_dict()]
        goal = GOAL if shared or "x 1000" not in pair else "report"
        results["ratios"][f"{pair} / {peer}"] = ratio(r, goal)
    return results


if __name__ == "__main__":
    import json
    import sys

    json.dump(run(small="--small" in sys.argv), sys.stdout, indent=1)
