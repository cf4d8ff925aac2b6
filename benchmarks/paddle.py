"""Paddle hand-offs: ``hb.convert`` to and from Paddle against the frameworks' own DLPack.

One small tensor (1000 float32). Into Paddle, ``hb.convert(x, "paddle")`` is timed
against ``paddle.from_dlpack(x)`` for a NumPy array and a torch tensor; out of Paddle,
``hb.convert(p, target)`` against ``np.from_dlpack(p)`` and ``torch.from_dlpack(p)``.
Interleaved in one run (``_timing.compare``). Every path is checked to alias the source
first (data pointers equal), so a copy cannot win a race. The goal is the hand-off
benchmark's: at most 1.3x the direct path. The Paddle adapter has no fast hooks; these
ratios are what would justify adding them.

``python -m benchmarks paddle``
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import hurray_bridge as hb

from ._timing import compare, ratio

N = 1000
GOAL = "<= 1.3"


def _pointer(x: Any) -> int:
    if hasattr(x, "__array_interface__"):
        return int(x.__array_interface__["data"][0])
    return int(x.data_ptr())


def run(small: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    if importlib.util.find_spec("paddle") is None:
        results["notes"].append("paddle is not installed: nothing measured")
        return results
    from hurray_bridge._registry import kept_apart

    why = kept_apart("paddle")
    if why:
        results["notes"].append(why)
        return results
    import numpy as np
    import paddle

    a = np.arange(N, dtype=np.float32)
    pairs: list[tuple[str, Any, str, str, Callable[[Any], Any]]] = [
        ("numpy->paddle", a, "paddle", "paddle.from_dlpack", paddle.from_dlpack),
        ("paddle->numpy", paddle.to_tensor(a), "numpy", "np.from_dlpack", np.from_dlpack),
    ]
    if importlib.util.find_spec("torch") is not None:
        import torch

        pairs += [
            ("torch->paddle", torch.arange(N, dtype=torch.float32), "paddle",
             "paddle.from_dlpack", paddle.from_dlpack),
            ("paddle->torch", paddle.to_tensor(a), "torch", "torch.from_dlpack",
             torch.from_dlpack),
        ]
    else:
        results["notes"].append("torch is not installed: its pairs are skipped")
    rounds = 11 if small else 21
    for pair, x, target, dname, direct in pairs:
        want = _pointer(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            warnings.simplefilter("ignore", UserWarning)
            for out in (hb.convert(x, target), direct(x)):
                if _pointer(out) != want:
                    raise AssertionError(f"{pair}: a copy (data pointer differs)")

        def ours(x: Any = x, target: str = target, convert: Any = hb.convert) -> Any:
            return convert(x, target)

        def theirs(x: Any = x, direct: Any = direct) -> Any:
            return direct(x)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_ours, t_theirs, r = compare(f"hb.convert {pair}", ours, f"{dname} {pair}",
                                          theirs, rounds=rounds)
        results["timings"] += [t_ours.as_dict(), t_theirs.as_dict()]
        results["ratios"][pair] = ratio(r, GOAL, zero_copy=True, direct=dname)
    return results
