"""The compatibility report: which framework pairs and dtypes hand off zero-copy.

For every installed framework pair and every element type, one tensor is
made in the source framework and handed to the target with ``hb.convert``.
Each cell records what really happened — zero-copy (the target's data
pointer is the source's), a copy (and the bridge's stated reason), or a
refusal (and the error) — and the median hand-off time.

The report is the same every run on one installation: the bridge's and the
frameworks' own allocations are 64-byte aligned, and a NumPy source (whose
allocator gives 16-byte alignment, so its address is luck) is measured twice,
once 64-byte aligned and once 16 bytes off. A cell whose outcome differs
between the two says so ("zero-copy if aligned") instead of reporting
whichever the allocator happened to give. Only the timings vary.
"""

from __future__ import annotations

import html
import importlib.util
import json
import platform
import re
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ._numpy import numpy
from ._registry import ADAPTERS, apart, conflicts, get_adapter
from .dtypes import DType, all_dtypes
from .errors import (
    BackendNotAvailableError,
    CopyWarning,
    FormatError,
    HurrayError,
    UnsupportedError,
)

__all__ = ["FORMATS", "Cell", "Report", "available_frameworks", "build_report",
           "cells_as_dicts", "format_report", "reason_groups", "run_matrix"]

# The registry's frameworks whose arrays live in host memory, in its order: a new adapter's
# line puts it in the report.
CPU_TARGETS = tuple(name for name, spec in ADAPTERS.items()
                    if not spec.not_in_matrix and not spec.device_only)
FORMATS = ("text", "markdown", "json", "html")
WIDTH = 100  # text and markdown lines fit this many columns
ALIGNED = 64  # what the bridge allocates, and what JAX needs to alias CPU memory
UNALIGNED_OFFSET = 16  # NumPy's own alignment: aligned for every element, not for JAX

# outcome -> (mark, meaning); the order is the report's.
OUTCOMES: dict[str, tuple[str, str]] = {
    "zero-copy": ("Z", "zero-copy"),
    "zero-copy if aligned": ("A", f"zero-copy when the source is {ALIGNED}-byte aligned, "
                                  "else a copy"),
    "copy": ("C", "copy"),
    "refused": ("-", "refused"),
    "wrong": ("!", "WRONG values (a bug)"),
    "apart": ("x", "the two frameworks cannot share a process: not measured"),
    "n/a": (".", "the source framework cannot hold the type"),
}
# How long the child process that measures a framework kept out of this one may take.
CHILD_TIMEOUT = 1800

# dtype name -> what a reader must know to read that row; shown only when the row is.
TYPE_NOTES: dict[str, str] = {
    "bool": "bool is the 1-bit packed boolean (eight per byte, as Arrow stores it); bool8 is "
            "the boolean with one byte per element (numpy.bool_, torch.bool, "
            "jax.numpy.bool_). NumPy, torch and JAX have no packed boolean, so they cannot "
            "hold bool as a source (.); handed bool, they unpack it to bytes, a copy.",
}


def _type_notes(dtypes: Sequence[str]) -> dict[str, str]:
    return {d: TYPE_NOTES[d] for d in dtypes if d in TYPE_NOTES}


@dataclass
class Cell:
    source: str
    target: str
    dtype: str
    outcome: str  # a key of OUTCOMES
    detail: str = ""  # the copy reason or the error ("zero-copy if aligned": the copy's)
    microseconds: float | None = None  # median hand-off time (aligned source)
    unaligned_microseconds: float | None = None  # the same, 16 bytes off (when it differs)


@dataclass
class Report:
    cells: list[Cell]
    versions: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        counts = {k: sum(c.outcome == k for c in self.cells) for k in OUTCOMES}
        return {"report": "hurray matrix", "versions": self.versions,
                "settings": self.settings, "outcomes": {k: v[1] for k, v in OUTCOMES.items()},
                "totals": counts, "reasons": reason_groups(self.cells),
                "notes": _type_notes(list(dict.fromkeys(c.dtype for c in self.cells))),
                "cells": cells_as_dicts(self.cells)}


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
    np = numpy()
    if dtype.bits == 1:
        # bit-packed bool has no NumPy form: pack the bits and describe them as hb.bool
        from ._subbyte import pack
        from .tensor import CPU, Tensor

        packed = pack((np.arange(n) % 3 == 0).astype(np.uint8), 1)
        ptr = packed.__array_interface__["data"][0] if n else 0
        return Tensor._dense(ptr, (n,), dtype, strides=None, padded=False, device=CPU,
                             owner=packed, readonly=False, copied=False)
    nd = np_adapter.native_dtype(dtype)
    if dtype.kind.name == "BOOL":
        return (np.arange(n) % 3 == 0).astype(nd)
    if dtype.is_subbyte:
        return (np.arange(n) % (1 << dtype.bits)).astype(np.uint8).view(nd)
    raw = np.arange(n, dtype=np.int64) % 7 + 1
    if dtype.kind.name == "COMPLEX":
        return (raw + 1j * raw).astype(nd)
    return raw.astype(nd)


def _placed(a: Any, offset: int) -> Any:
    """A copy of NumPy array ``a`` at exactly ``offset`` bytes past a 64-byte boundary."""
    from .sparse import aligned_zeros

    raw = aligned_zeros((a.nbytes + ALIGNED,), "uint8")
    out = raw[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def _logical_bytes(obj: Any) -> bytes:
    """The values of ``obj``, comparable across packed/padded forms (b"" off the host)."""
    from .conversion import asarray_one
    from .tensor import canonical_bytes

    t = asarray_one(obj, what="a matrix cell")
    return canonical_bytes(t) if t.device.is_host_accessible else b""


def _measure(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e6


def _probe(x: Any, dst: str, repeat: int) -> tuple[str, str, float | None]:
    """(outcome, detail, median microseconds) of handing ``x`` to ``dst``."""
    from .conversion import asarray_one, convert

    try:
        before = asarray_one(x, what="a matrix cell").data_ptr
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CopyWarning)
            y = convert(x, dst)
        copy_reasons = [str(w.message) for w in caught if issubclass(w.category, CopyWarning)]
        after = asarray_one(y, what="a matrix cell").data_ptr
    except HurrayError as exc:
        return "refused", f"{type(exc).__name__}: {exc}", None
    except Exception as exc:  # a framework's own error: report it, it is a gap to look at
        return "refused", f"{type(exc).__name__} from framework: {exc}", None
    if _logical_bytes(x) != _logical_bytes(y):
        return "wrong", "values differ after the hand-off", None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CopyWarning)
        us = _measure(lambda: convert(x, dst), repeat)
    if before == after:
        return "zero-copy", "", us
    return "copy", "; ".join(dict.fromkeys(copy_reasons)) or "the target framework copied", us


def _cell(src: str, dst: str, dtype: DType, n: int, repeat: int) -> Cell:
    # (imported here: ``hurray --help`` and ``--version`` read this module's FORMATS, and
    # start faster without the conversion machinery)
    from .conversion import asarray, convert

    placed = src == "numpy" and dtype.bits != 1
    try:
        base = _sample(dtype, n)
        x = _placed(base, 0) if placed else convert(base, src, copy=True)
    except (HurrayError, TypeError, ValueError) as exc:
        return Cell(src, dst, dtype.name, "n/a", f"{src} cannot hold it: {exc}")
    held = asarray(x).dtype
    if held != dtype:
        return Cell(src, dst, dtype.name, "n/a", f"{src} holds it as {held.name}")
    outcome, detail, us = _probe(x, dst, repeat)
    if not placed:
        return Cell(src, dst, dtype.name, outcome, detail, us)
    # NumPy's allocator places arrays at 16-byte alignment: try that placement too.
    off_outcome, off_detail, off_us = _probe(_placed(base, UNALIGNED_OFFSET), dst, repeat)
    if (off_outcome, off_detail) == (outcome, detail):
        return Cell(src, dst, dtype.name, outcome, detail, us)
    if "wrong" in (outcome, off_outcome):
        which = "aligned" if outcome == "wrong" else f"{UNALIGNED_OFFSET} bytes off alignment"
        return Cell(src, dst, dtype.name, "wrong", f"values differ after the hand-off ({which})")
    if outcome == "zero-copy" and off_outcome == "copy":
        return Cell(src, dst, dtype.name, "zero-copy if aligned", off_detail, us, off_us)
    return Cell(src, dst, dtype.name, outcome,
                f"{detail or outcome} when {ALIGNED}-byte aligned; {off_outcome} "
                f"({off_detail}) when {UNALIGNED_OFFSET} bytes off", us, off_us)


def _check_args(names: Sequence[str], n: int, repeat: int) -> None:
    unknown = [f for f in names if f not in ADAPTERS]
    if unknown:
        raise UnsupportedError(f"frameworks: unknown {', '.join(map(repr, unknown))}; the "
                               f"frameworks are {', '.join(ADAPTERS)}")
    for f in names:
        if ADAPTERS[f].not_in_matrix:
            raise UnsupportedError(f"frameworks: {f!r} is not in the report: "
                                   f"{ADAPTERS[f].not_in_matrix}")
        if importlib.util.find_spec(ADAPTERS[f].framework) is None:
            raise BackendNotAvailableError(ADAPTERS[f].framework, ADAPTERS[f].extra,
                                           f"the report was asked for {f}")
    for what, value in (("size", n), ("repeat", repeat)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise FormatError(f"must be a whole number >= 1, got {value!r}", field=what)


def run_matrix(
    frameworks: Sequence[str] | None = None,
    dtypes: Sequence[DType] | None = None,
    n: int = 1024,
    repeat: int = 15,
) -> list[Cell]:
    """Hand one tensor per dtype across every ordered pair of ``frameworks``.

    ``n`` elements per tensor (>= 1), ``repeat`` timed calls per cell (>= 1).
    """
    names = list(dict.fromkeys(frameworks)) if frameworks is not None else available_frameworks()
    _check_args(names, n, repeat)
    if importlib.util.find_spec("numpy") is None:
        raise BackendNotAvailableError("numpy", "numpy",
                                       "the compatibility report builds its samples with it")
    kept, left_out = apart(names)
    cells = []
    for dtype in dtypes or all_dtypes():
        for src in kept:
            for dst in kept:
                cells.append(_cell(src, dst, dtype, n, repeat))
    for name, (other, why) in left_out.items():
        cells += _measured_apart(name, other, why, names, dtypes, n, repeat)
    if not left_out:
        return cells
    # Two frameworks left out both measure their pair: the first measurement stands.
    unique = {(c.source, c.target, c.dtype): c for c in reversed(cells)}
    order = {f: i for i, f in enumerate(names)}
    rank = {d.name: i for i, d in enumerate(dtypes or all_dtypes())}
    return sorted(unique.values(), key=lambda c: (rank[c.dtype], order[c.source],
                                                  order[c.target]))


def _measured_apart(name: str, other: str, why: str, names: Sequence[str],
                    dtypes: Sequence[DType] | None, n: int, repeat: int) -> list[Cell]:
    """The cells of ``name``, which cannot share this process with ``other`` (``why``):
    its pairs with ``other`` are "apart"; the rest are measured in a child process that
    imports ``name`` and none of the frameworks it conflicts with."""
    types = [d.name for d in (dtypes or all_dtypes())]
    with_it = [f for f in names if f not in conflicts(name)]
    # The child's run is this report's run with ``name`` among frameworks it can share a
    # process with; its cells of ``name`` are kept, the others are measured here.
    argv = [sys.executable, "-m", "hurray_bridge", "matrix", "--format", "json",
            "--frameworks", *with_it, "--dtypes", *types, "--size", str(n),
            "--repeat", str(repeat)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
        fields = {f for f in Cell.__dataclass_fields__}
        child = [Cell(**{k: v for k, v in c.items() if k in fields})
                 for c in json.loads(done.stdout)["cells"]]
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
        child = None
    else:
        failure = f"exit status {done.returncode}: {done.stderr.strip()[-300:]}"
    cells = []
    for d in types:
        for f in names:
            pairs = [(name, f)] if f == name else [(name, f), (f, name)]
            for src, dst in pairs:
                if f not in with_it:
                    cells.append(Cell(src, dst, d, "apart",
                                      f"{name} and {f} cannot share a process: {why}"))
                    continue
                got = None if child is None else next(
                    (c for c in child if (c.source, c.target, c.dtype) == (src, dst, d)), None)
                cells.append(got if got is not None else Cell(
                    src, dst, d, "refused", f"the child process that measures {name} apart "
                    f"from {other} gave no cell ({failure})"))
    return cells


def _versions(names: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    from . import __version__

    out = {"hurray-bridge": __version__, "python": platform.python_version()}
    mods = [ADAPTERS[f].framework for f in names]
    if "numpy" in mods:
        mods.insert(mods.index("numpy") + 1, "ml_dtypes")  # NumPy's bfloat16, float8, int4
    if "jax" in mods:
        mods.insert(mods.index("jax") + 1, "jaxlib")
    for mod in mods:
        version = getattr(sys.modules.get(mod), "__version__", None)
        if not isinstance(version, str):
            # A framework measured in a child process is not imported here; its
            # distribution may be named otherwise (paddle's is paddlepaddle).
            dists = [mod, *metadata.packages_distributions().get(mod, [])]
            version = next((v for v in map(_dist_version, dists) if v), None)
            if version is None:
                continue
        out[mod] = version
    return out


def _dist_version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def build_report(
    frameworks: Sequence[str] | None = None,
    dtypes: Sequence[DType] | None = None,
    n: int = 1024,
    repeat: int = 15,
) -> Report:
    """:func:`run_matrix`, with the versions and settings the cells depend on."""
    names = list(dict.fromkeys(frameworks)) if frameworks is not None else available_frameworks()
    cells = run_matrix(names, dtypes, n, repeat)
    from . import _shortcuts

    # Only where the jax cells ran, so JAX is imported already.
    x64 = get_adapter("jax").x64_enabled() if "jax" in names and "jax" in sys.modules else None
    settings: dict[str, Any] = {
        "frameworks": names,
        "size": n,
        "repeat": repeat,
        "timing": f"median of {repeat} calls after one untimed call, in microseconds",
        "numpy_source_alignment": f"measured {ALIGNED}-byte aligned and again "
                                  f"{UNALIGNED_OFFSET} bytes off (NumPy itself aligns arrays "
                                  f"to {UNALIGNED_OFFSET} bytes)",
        "jax_enable_x64": x64,
        "compiled_speedups": bool(_shortcuts.compiled),
        "platform": f"{platform.system()} {platform.machine()}",
    }
    return Report(cells, _versions(names), settings)


def cells_as_dicts(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    return [asdict(c) for c in cells]


# ------------------------------------------------------------------ reasons
def _template(detail: str, dtype: str) -> str:
    """``detail`` with the cell's own type name as ``<type>``, so cells group by reason."""
    return re.sub(rf"(?<![\w.]){re.escape(dtype)}(?![\w.])", "<type>", detail)


def reason_groups(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """One entry per (outcome, reason): the reason and the pairs and types it covers.

    ``covers`` lists ``{"pairs": [[source, target], ...], "dtypes": [...]}``: every
    pair listed there has that reason for every type listed with it.
    """
    groups: dict[tuple[str, str], dict[tuple[str, str], list[str]]] = {}
    for c in cells:
        if c.outcome in ("zero-copy", "n/a"):
            continue
        key = (c.outcome, _template(c.detail, c.dtype))
        groups.setdefault(key, {}).setdefault((c.source, c.target), []).append(c.dtype)
    out = []
    for (outcome, reason), pairs in groups.items():
        by_types: dict[tuple[str, ...], list[list[str]]] = {}
        for pair, types in pairs.items():
            by_types.setdefault(tuple(types), []).append(list(pair))
        out.append({"outcome": outcome, "reason": reason,
                    "covers": [{"pairs": p, "dtypes": list(t)} for t, p in by_types.items()]})
    return out


def _pairs_text(pairs: Sequence[Sequence[str]]) -> str:
    """``[[numpy, jax], [torch, jax]]`` as ``numpy, torch -> jax``."""
    by_target: dict[str, list[str]] = {}
    for s, t in pairs:
        by_target.setdefault(t, []).append(s)
    return "; ".join(f"{', '.join(srcs)} -> {t}" for t, srcs in by_target.items())


# ------------------------------------------------------------------ formats
def _frameworks_of(cells: Sequence[Cell]) -> list[str]:
    return list(dict.fromkeys([c.source for c in cells] + [c.target for c in cells]))


def _version_line(report: Report) -> str:
    v = dict(report.versions)
    head = f"hurray-bridge {v.pop('hurray-bridge', '?')}, Python {v.pop('python', '?')}"
    parts = []
    for mod, ver in v.items():
        text = f"{mod} {ver}"
        if mod == "jax":
            extra = [f"jaxlib {jaxlib}"] if (jaxlib := v.get("jaxlib")) else []
            x64 = report.settings.get("jax_enable_x64")
            if x64 is not None:
                extra.append(f"jax_enable_x64 {'on' if x64 else 'off'}")
            text += f" ({', '.join(extra)})" if extra else ""
        elif mod == "jaxlib" and "jax" in v:
            continue
        parts.append(text)
    return head + ("; " + ", ".join(parts) if parts else "")


def _settings_line(report: Report) -> str:
    s = report.settings
    return (f"{s.get('size', '?')} elements per tensor; {s.get('timing', '')}; NumPy sources "
            f"{s.get('numpy_source_alignment', '?')}; C speedups "
            f"{'compiled' if s.get('compiled_speedups') else 'not compiled'}")


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent if first is None else first,
                         subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=True)


def _timed(cells: Sequence[Cell]) -> tuple[str, list[Cell]]:
    """The type whose timings the text and markdown forms show, and its cells."""
    names = list(dict.fromkeys(c.dtype for c in cells))
    dtype = "float32" if "float32" in names else (names[0] if names else "")
    return dtype, [c for c in cells if c.dtype == dtype]


def _letters(frameworks: Sequence[str]) -> dict[str, str]:
    """One letter per framework for column heads (its initial, else a free letter)."""
    out: dict[str, str] = {}
    for f in frameworks:
        for ch in f + "abcdefghijklmnopqrstuvwxyz":
            if ch not in out.values():
                out[f] = ch
                break
    return out


def _blocks(sources: list[str], n_targets: int, name_w: int) -> list[tuple[list[str], str]]:
    """The source groups of the text table, each with the space between its marks, so
    that a line fits WIDTH: all sources in one table, with the marks 3, 2 or 1 space
    apart, or else as many tables as it takes (the fewest), 1 space apart."""
    for sep in ("   ", "  ", " "):
        group = max([(len(sep) + 1) * n_targets - len(sep)] + [len(s) for s in sources])
        fit = max(1, (WIDTH - name_w + 3) // (group + 3))
        if fit >= len(sources):
            return [(sources, sep)]
    return [(sources[i:i + fit], sep) for i in range(0, len(sources), fit)]


def _format_text(report: Report) -> str:
    cells = report.cells
    fws = _frameworks_of(cells)
    sources = list(dict.fromkeys(c.source for c in cells))
    targets = list(dict.fromkeys(c.target for c in cells))
    by = {(c.source, c.target, c.dtype): c for c in cells}
    dtypes = list(dict.fromkeys(c.dtype for c in cells))
    letter = _letters(fws)
    lines = _wrap(_version_line(report), "  ", "hurray matrix: ")
    lines += _wrap(_settings_line(report), "  ", "sample: ")
    lines += [""]
    lines += _wrap("; ".join(f"{m} {text}" for m, text in OUTCOMES.values()), "  ",
                   "Hand-off matrix: ")
    lines += _wrap("Rows are element types; columns are grouped by source framework, one "
                   "column per target: " + ", ".join(f"{letter[t]} {t}" for t in targets), "  ",
                   "")
    for note in _type_notes(dtypes).values():
        lines += _wrap(note, "  ", "")
    lines.append("")
    name_w = max([5] + [len(d) for d in dtypes]) + 2
    for i, (block, sep) in enumerate(_blocks(sources, len(targets), name_w)):
        group = max([(len(sep) + 1) * len(targets) - len(sep)] + [len(s) for s in block])
        if i:
            lines.append("")  # the next sources, under the same heads
        lines.append(" " * name_w + "   ".join(s.ljust(group) for s in block).rstrip())
        sub = sep.join(letter[t] for t in targets)
        lines.append("dtype".ljust(name_w) + "   ".join(sub.ljust(group) for _ in block).rstrip())
        for d in dtypes:
            row = []
            for s in block:
                marks = sep.join(OUTCOMES[by[(s, t, d)].outcome][0] if (s, t, d) in by
                                 else " " for t in targets)
                row.append(marks.ljust(group))
            lines.append(d.ljust(name_w) + "   ".join(row).rstrip())
    dtype, timed = _timed(cells)
    if any(c.microseconds is not None for c in timed):
        st = report.settings
        lines += [""]
        lines += _wrap(f"Hand-off time, {dtype} x {st.get('size', '?')} "
                       f"({st.get('timing', '')}; marked as above):", "  ", "")
        col = max([10] + [len(t) + 2 for t in targets])
        label = max([name_w] + [len(src) + 2 for src in sources])
        lines.append("from \\ to".ljust(label) + "".join(t.rjust(col) for t in targets))
        for src in sources:
            row = []
            for t in targets:
                c = by.get((src, t, dtype))
                if c is None or c.microseconds is None:
                    row.append((OUTCOMES[c.outcome][0] if c else "").rjust(col))
                else:
                    row.append(f"{c.microseconds:.1f} {OUTCOMES[c.outcome][0]}".rjust(col))
            lines.append(src.ljust(label) + "".join(row))
    groups = reason_groups(cells)
    if groups:
        lines += ["", "Why (one paragraph per reason; <type> stands for each type listed):"]
        for g in groups:
            lines += _wrap(f"{g['outcome']}: {g['reason']}", "    ", "  ")
            for cover in g["covers"]:
                lines += _wrap(f"{_pairs_text(cover['pairs'])}: {', '.join(cover['dtypes'])}",
                               "        ", "      ")
    counts = report.to_dict()["totals"]
    lines += ["", *_wrap("Totals: " + ", ".join(f"{k} {v}" for k, v in counts.items()),
                         "  ", "")]
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


def _format_markdown(report: Report) -> str:
    cells = report.cells
    sources = list(dict.fromkeys(c.source for c in cells))
    targets = list(dict.fromkeys(c.target for c in cells))
    dtypes = list(dict.fromkeys(c.dtype for c in cells))
    by = {(c.source, c.target, c.dtype): c for c in cells}
    lines = ["# Hurray hand-off matrix", ""]
    lines += _wrap(_md(_version_line(report)))
    lines += [""]
    lines += _wrap(_md(_settings_line(report)))
    lines += [""]
    lines += _wrap("Marks: " + "; ".join(f"`{m}` {_md(text)}" for m, text in OUTCOMES.values()))
    lines += [""]
    for note in _type_notes(dtypes).values():
        lines += [*_wrap(_md(note)), ""]
    for s in sources:
        lines += [f"## From {s}", "", "| dtype | " + " | ".join(targets) + " |",
                  "|---|" + "---|" * len(targets)]
        for d in dtypes:
            marks = [OUTCOMES[by[(s, t, d)].outcome][0] if (s, t, d) in by else ""
                     for t in targets]
            lines.append(f"| {d} | " + " | ".join(f"`{m}`" for m in marks) + " |")
        lines.append("")
    dtype, timed = _timed(cells)
    if any(c.microseconds is not None for c in timed):
        lines += [f"## Hand-off time, {dtype} x {report.settings.get('size', '?')}", "",
                  _md(str(report.settings.get("timing", ""))), "",
                  "| from \\ to | " + " | ".join(targets) + " |", "|---|" + "---:|" * len(targets)]
        for s in sources:
            row = []
            for t in targets:
                c = by.get((s, t, dtype))
                row.append("" if c is None or c.microseconds is None
                           else f"{c.microseconds:.1f} `{OUTCOMES[c.outcome][0]}`")
            lines.append(f"| {s} | " + " | ".join(row) + " |")
        lines.append("")
    groups = reason_groups(cells)
    if groups:
        lines += ["## Why", ""]
        for g in groups:
            lines += _wrap(f"- **{g['outcome']}**: {_md(g['reason'])}", "  ", "")
            for cover in g["covers"]:
                lines += _wrap(f"- {_md(_pairs_text(cover['pairs']))}: "
                               f"{', '.join(cover['dtypes'])}", "    ", "  ")
        lines.append("")
    counts = report.to_dict()["totals"]
    lines.append("Totals: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return "\n".join(lines)


_COLOURS = {"zero-copy": "#2e9e44", "zero-copy if aligned": "#9bd17a", "copy": "#f0c419",
            "refused": "#d9d9d9", "wrong": "#d7263d", "apart": "#8fb8de", "n/a": "#ffffff"}


def _format_html(report: Report) -> str:
    """A page that needs nothing but itself: inline style, no script, no links out."""
    e = html.escape
    cells = report.cells
    sources = list(dict.fromkeys(c.source for c in cells))
    targets = list(dict.fromkeys(c.target for c in cells))
    dtypes = list(dict.fromkeys(c.dtype for c in cells))
    by = {(c.source, c.target, c.dtype): c for c in cells}
    cls = {k: "o-" + re.sub(r"[^a-z]+", "-", k).strip("-") for k in OUTCOMES}
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>Hurray hand-off matrix</title>", f"<style>\n{_html_style(cls)}\n</style>",
           "</head>", "<body>", "<h1>Hurray hand-off matrix</h1>",
           f"<p>{e(_version_line(report))}</p>", f"<p>{e(_settings_line(report))}</p>",
           "<p>"]
    for k, (mark, text) in OUTCOMES.items():
        out.append(f'<span class="sw {cls[k]}"></span>{e(mark)} {e(text)}&nbsp; ')
    out.append("</p>")
    out += [f'<p class="note">{e(note)}</p>' for note in _type_notes(dtypes).values()]
    out += _html_matrix(sources, targets, dtypes, by, cls)
    dtype, timed = _timed(cells)
    if any(c.microseconds is not None for c in timed):
        out += [f"<h2>Hand-off time, {e(dtype)} x {e(str(report.settings.get('size', '?')))}"
                "</h2>", f"<p>{e(str(report.settings.get('timing', '')))}</p>",
                '<table id="timing">', "<tr><th>from \\ to</th>"
                + "".join(f"<th>{e(t)}</th>" for t in targets) + "</tr>"]
        for s in sources:
            row = [f"<tr><th>{e(s)}</th>"]
            for t in targets:
                c = by.get((s, t, dtype))
                if c is None or c.microseconds is None:
                    row.append("<td></td>")
                else:
                    row.append(f'<td class="num {cls[c.outcome]}">{c.microseconds:.1f}</td>')
            out.append("".join(row) + "</tr>")
        out.append("</table>")
    out += _html_reasons(cells, cls)
    counts = report.to_dict()["totals"]
    out += ["<p>Totals: " + e(", ".join(f"{k} {v}" for k, v in counts.items())) + "</p>",
            "</body>", "</html>"]
    return "\n".join(out)


def _html_style(cls: dict[str, str]) -> str:
    """The page's style sheet: the tables, and one background colour per outcome class."""
    return "\n".join(
        ["body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}",
         "table{border-collapse:collapse;margin:1em 0}",
         "th,td{border:1px solid #999;padding:2px 6px;text-align:center}",
         "td.m{font-family:monospace;min-width:1.4em}",
         "th.g{border-left:3px solid #444}td.g{border-left:3px solid #444}",
         "td.num{text-align:right;font-family:monospace}",
         ".sw{display:inline-block;width:1em;height:1em;border:1px solid #999;"
         "vertical-align:middle;margin-right:.3em}"]
        + [f".{cls[k]}{{background:{v}}}" for k, v in _COLOURS.items()])


def _html_matrix(sources: list[str], targets: list[str], dtypes: list[str],
                 by: dict[tuple[str, str, str], Cell], cls: dict[str, str]) -> list[str]:
    """The matrix table's lines: a row per type, a column group per source, each cell its
    outcome's mark and colour, with the pair, outcome and detail as data and tooltip."""
    e = html.escape
    out = ['<table id="matrix">', "<thead>", '<tr><th rowspan="2">dtype</th>']
    out += [f'<th class="g" colspan="{len(targets)}">from {e(s)}</th>' for s in sources]
    out += ["</tr>", "<tr>"]
    for _ in sources:
        out += [f'<th{" class=g" if i == 0 else ""}>{e(t)}</th>' for i, t in enumerate(targets)]
    out += ["</tr>", "</thead>", "<tbody>"]
    for d in dtypes:
        row = [f"<tr><th>{e(d)}</th>"]
        for s in sources:
            for i, t in enumerate(targets):
                c = by.get((s, t, d))
                if c is None:
                    row.append("<td></td>")
                    continue
                tip = f"{s} -> {t} {d}: {c.outcome}" + (f": {c.detail}" if c.detail else "")
                if c.microseconds is not None:
                    tip += f" ({c.microseconds:.1f} us)"
                row.append(f'<td class="m {cls[c.outcome]}{" g" if i == 0 else ""}" '
                           f'data-source="{e(s)}" data-target="{e(t)}" data-dtype="{e(d)}" '
                           f'data-outcome="{e(c.outcome)}" title="{e(tip)}">'
                           f"{e(OUTCOMES[c.outcome][0])}</td>")
        out.append("".join(row) + "</tr>")
    out += ["</tbody>", "</table>"]
    return out


def _html_reasons(cells: Sequence[Cell], cls: dict[str, str]) -> list[str]:
    """The "Why" list's lines: one item per reason, the pairs and types it covers under it
    (none where no cell has a reason)."""
    e = html.escape
    groups = reason_groups(cells)
    if not groups:
        return []
    out = ["<h2>Why</h2>", '<ul id="reasons">']
    for g in groups:
        out.append(f'<li><span class="sw {cls[g["outcome"]]}"></span><b>{e(g["outcome"])}'
                   f"</b>: {e(g['reason'])}<ul>")
        for cover in g["covers"]:
            out.append(f"<li>{e(_pairs_text(cover['pairs']))}: "
                       f"{e(', '.join(cover['dtypes']))}</li>")
        out.append("</ul></li>")
    out.append("</ul>")
    return out


def format_report(report: Report | Sequence[Cell], fmt: str = "text") -> str:
    """The report as ``text`` (fits 100 columns), ``markdown``, ``json`` or ``html``."""
    if not isinstance(report, Report):
        report = Report(list(report))
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1)
    if fmt == "text":
        return _format_text(report)
    if fmt == "markdown":
        return _format_markdown(report)
    if fmt == "html":
        return _format_html(report)
    raise UnsupportedError(f"format: unknown {fmt!r}; the formats are {', '.join(FORMATS)}")
