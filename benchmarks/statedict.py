"""A whole state dict: 1000 torch tensors of mixed types to JAX and back.

The state dict mixes float32, float16, bfloat16, int32, int16, int8, uint8 and
bool in the shapes of a small model (weights, biases, norms, convolution
kernels; ~20 MiB in all). ``{k: hb.convert(v, "jax")}`` and back
``{k: hb.convert(v, "torch")}`` are timed against the loops of direct calls
``{k: jnp.from_dlpack(v)}`` and ``{k: torch.from_dlpack(v)}``, interleaved.
Every result is checked to alias its source first (both paths zero-copy).
Goal (issue 8): at most 1.0x the direct loops.

``python -m benchmarks statedict`` (``--small``: 200 tensors).
"""

from __future__ import annotations

import warnings
from typing import Any

import hurray_bridge as hb

from . import _frameworks as fw
from ._timing import compare, ratio

N_TENSORS = 1000
SHAPES: tuple[tuple[int, ...], ...] = (
    (256, 256), (256,), (64, 3, 3, 3), (512, 128), (128,), (4096,), (32, 32, 4), (1024, 16),
)
DTYPES = ("float32", "float16", "bfloat16", "int32", "int16", "int8", "uint8", "bool")


def _state_dict(n: int) -> dict[str, Any]:
    import torch

    out = {}
    for i in range(n):
        shape = SHAPES[i % len(SHAPES)]
        dt = getattr(torch, DTYPES[(i // len(SHAPES)) % len(DTYPES)])
        out[f"layers.{i // 4}.p{i % 4}"] = torch.ones(shape, dtype=dt)
    return out


def run(small: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    have = fw.available()
    if "torch" not in have or "jax" not in have:
        results["notes"].append("needs torch and JAX; skipped")
        return results
    import jax.numpy as jnp
    import torch

    n = 200 if small else N_TENSORS
    sd = _state_dict(n)
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    results["notes"].append(f"{n} tensors, {nbytes / (1 << 20):.1f} MiB, dtypes {DTYPES}")

    def ours_to_jax() -> dict[str, Any]:
        return {k: hb.convert(v, "jax") for k, v in sd.items()}

    def direct_to_jax() -> dict[str, Any]:
        return {k: jnp.from_dlpack(v) for k, v in sd.items()}

    jx = direct_to_jax()

    def ours_to_torch() -> dict[str, Any]:
        return {k: hb.convert(v, "torch") for k, v in jx.items()}

    def direct_to_torch() -> dict[str, Any]:
        return {k: torch.from_dlpack(v) for k, v in jx.items()}

    def ours_round_trip() -> dict[str, Any]:
        return {k: hb.convert(hb.convert(v, "jax"), "torch") for k, v in sd.items()}

    def direct_round_trip() -> dict[str, Any]:
        return {k: torch.from_dlpack(jnp.from_dlpack(v)) for k, v in sd.items()}

    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        warnings.simplefilter("ignore", UserWarning)  # torch's read-only notice
        for name, fn in (("ours", ours_to_jax), ("direct", direct_to_jax)):
            got = fn()
            if any(got[k].unsafe_buffer_pointer() != v.data_ptr() for k, v in sd.items()):
                raise AssertionError(f"{name} torch -> JAX copied")
        for name, fn in (("ours", ours_to_torch), ("direct", direct_to_torch)):
            got = fn()
            if any(got[k].data_ptr() != v.unsafe_buffer_pointer() for k, v in jx.items()):
                raise AssertionError(f"{name} JAX -> torch copied")
        rounds = 7 if small else 9
        for label, mine, theirs in (
            ("torch->jax", ours_to_jax, direct_to_jax),
            ("jax->torch", ours_to_torch, direct_to_torch),
            ("round trip", ours_round_trip, direct_round_trip),
        ):
            a, b, r = compare(f"state dict {label}: hb.convert", mine,
                              f"state dict {label}: direct loop", theirs,
                              rounds=rounds, min_time=0.0)
            results["timings"] += [a.as_dict(), b.as_dict()]
            results["ratios"][f"state dict {label}"] = ratio(r, "<= 1.0", zero_copy=True)
    return results
