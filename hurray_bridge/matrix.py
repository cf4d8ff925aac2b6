"""The compatibility report: which framework pairs and dtypes hand off zero-copy.

For every installed framework pair and every element type, one tensor is
made in the source framework and handed to the target with ``hb.convert``.
Each cell records what really happened — zero-copy (the target's data
pointer is the source's), a copy (and the bridge's stated reason), or a
refusal (and the error) — and the median hand-off time.
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._registry import ADAPTERS, CopyWarning, asarray, convert, get_adapter
from .dtypes import DType, all_dtypes
from .errors import HurrayError
from .tensor import canonical_bytes

__all__ = ["Cell", "available_frameworks", "format_report", "run_matrix"]

CPU_TARGETS = ("numpy", "torch", "jax", "arrow")


@dataclass
class Cell:
    source: str
    target: str
    dtype: str
    outcome: str  # "zero-copy", "copy", "refused", "wrong" (values differ: a bug)
    detail: str = ""
    microseconds: float | None = None


def available_frameworks(candidates: Sequence[str] = CPU_TARGETS) -> list[str]:
    """Frameworks whose packages are installed (found without importing them)."""
    out = []
    for name in candidates:
        if importlib.util.find_spec(ADAPTERS[name].framework) is not None:
            out.append(name)
    return out


def _sample(dtype: DType, n: int) -> Any:
    """A NumPy array of ``n`` distinct representable values of ``dtype``."""
    np_adapter = get_adapter("numpy")
    import numpy as np

    if dtype.bits == 1:
        # bit-packed bool has no NumPy form: pack the bits and describe them as hb.bool
        from .tensor import CPU, Tensor

        packed = np_adapter.pack_subbyte((np.arange(n) % 3 == 0).astype(np.uint8), 1)
        ptr = packed.__array_interface__["data"][0] if n else 0
        return Tensor._dense(ptr, (n,), dtype, None, False, CPU, packed, False, False)
    nd = np_adapter.native_dtype(dtype)
    if dtype.kind.name == "BOOL":
        return (np.arange(n) % 3 == 0).astype(nd)
    if dtype.is_subbyte:
        return (np.arange(n) % (1 << dtype.bits)).astype(np.uint8).view(nd)
    raw = np.arange(n, dtype=np.int64) % 7 + 1
    if dtype.kind.name == "COMPLEX":
        return (raw + 1j * raw).astype(nd)
    return raw.astype(nd)


def _logical_bytes(obj: Any) -> bytes:
    """The values of ``obj``, comparable across packed/padded forms (b"" off the host)."""
    t = asarray(obj)
    return canonical_bytes(t) if t.device.is_host_accessible else b""


def _measure(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def _cell(src: str, dst: str, dtype: DType, n: int, repeat: int) -> Cell:
    try:
        base = _sample(dtype, n)
        x = convert(base, src, copy=True) if src != "numpy" or dtype.bits == 1 else base
    except (HurrayError, TypeError, ValueError) as exc:
        return Cell(src, dst, dtype.name, "n/a", f"{src} cannot hold it: {exc}")
    held = asarray(x).dtype
    if held != dtype:
        return Cell(src, dst, dtype.name, "n/a", f"{src} holds it as {held.name}")
    try:
        before = asarray(x).data_ptr
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CopyWarning)
            y = convert(x, dst)
        copy_reasons = [str(w.message) for w in caught if issubclass(w.category, CopyWarning)]
        after = asarray(y).data_ptr
    except HurrayError as exc:
        return Cell(src, dst, dtype.name, "refused", f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a framework's own error: report it, it is a gap to look at
        return Cell(src, dst, dtype.name, "refused", f"{type(exc).__name__} from framework: {exc}")
    if _logical_bytes(x) != _logical_bytes(y):
        return Cell(src, dst, dtype.name, "wrong", "values differ after the hand-off")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CopyWarning)
        us = _measure(lambda: convert(x, dst), repeat)
    if before == after and n:
        return Cell(src, dst, dtype.name, "zero-copy", "", us)
    reason = "; ".join(copy_reasons) or "the target framework copied"
    return Cell(src, dst, dtype.name, "copy", reason, us)


def run_matrix(
    frameworks: Sequence[str] | None = None,
    dtypes: Sequence[DType] | None = None,
    n: int = 1024,
    repeat: int = 15,
) -> list[Cell]:
    """Hand one tensor per dtype across every ordered pair of ``frameworks``."""
    names = list(frameworks) if frameworks is not None else available_frameworks()
    if "numpy" not in names and importlib.util.find_spec("numpy") is None:
        raise HurrayError("the compatibility report needs NumPy to build its sample tensors")
    cells = []
    for dtype in dtypes or all_dtypes():
        for src in names:
            for dst in names:
                cells.append(_cell(src, dst, dtype, n, repeat))
    return cells


_MARK = {"zero-copy": "Z", "copy": "C", "refused": "-", "wrong": "!", "n/a": "."}


def format_report(cells: Sequence[Cell]) -> str:
    """A table per dtype and pair, then the reasons for every copy and refusal."""
    pairs = sorted({(c.source, c.target) for c in cells}, key=lambda p: (p[0], p[1]))
    dtypes = list(dict.fromkeys(c.dtype for c in cells))
    by = {(c.source, c.target, c.dtype): c for c in cells}
    heads = [f"{s[:5]}>{t[:5]}" for s, t in pairs]
    width = max(len(h) for h in heads) if heads else 8
    lines = [
        "Hand-off matrix (Z zero-copy, C copy, - refused, . source cannot hold it, ! WRONG)",
        "",
    ]
    lines.append(f"{'dtype':<16}" + " ".join(h.rjust(width) for h in heads))
    for d in dtypes:
        row = [_MARK[by[(s, t, d)].outcome] for s, t in pairs]
        lines.append(f"{d:<16}" + " ".join(m.rjust(width) for m in row))
    timed = [c for c in cells if c.microseconds is not None and c.dtype == "float32"]
    if timed:
        lines += ["", "Hand-off time, float32 x 1024 (median microseconds):"]
        for c in timed:
            lines.append(f"  {c.source:>6} -> {c.target:<6} {c.microseconds:8.1f} us  {c.outcome}")
    notes = [c for c in cells if c.outcome in ("copy", "refused", "wrong")]
    if notes:
        lines += ["", "Why (copies and refusals):"]
        for c in notes:
            lines.append(f"  {c.source} -> {c.target} {c.dtype}: {c.outcome}: {c.detail}")
    counts = {k: sum(c.outcome == k for c in cells) for k in _MARK}
    lines += ["", "Totals: " + ", ".join(f"{k} {v}" for k, v in counts.items())]
    return "\n".join(lines)


def cells_as_dicts(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    return [asdict(c) for c in cells]
