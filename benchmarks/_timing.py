"""Timing helpers: medians over repeats, with the spread, as ratios in one run."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    name: str
    median_us: float
    spread_us: float  # interquartile range
    loops: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "median_us": self.median_us, "iqr_us": self.spread_us,
                "loops": self.loops}


def measure(
    name: str, fn: Callable[[], object], *, repeat: int = 15, min_time: float = 0.02
) -> Timing:
    """Median per-call time of ``fn`` over ``repeat`` batches of calls."""
    loops = 1
    while True:  # size the batch so one batch takes at least min_time
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - t0 >= min_time or loops >= 1 << 20:
            break
        loops *= 2
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter() - t0) / loops * 1e6)
    q = statistics.quantiles(samples, n=4)
    return Timing(name, statistics.median(samples), q[2] - q[0], loops)


def _batch(fn: Callable[[], object], loops: int) -> float:
    t0 = time.perf_counter()
    for _ in range(loops):
        fn()
    return (time.perf_counter() - t0) / loops * 1e6


def _loops_for(fn: Callable[[], object], min_time: float) -> int:
    loops = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        if time.perf_counter() - t0 >= min_time or loops >= 1 << 20:
            return loops
        loops *= 2


def compare(
    name_a: str, fn_a: Callable[[], object], name_b: str, fn_b: Callable[[], object], *,
    rounds: int = 21, min_time: float = 0.004,
) -> tuple[Timing, Timing, float]:
    """Time ``fn_a`` against ``fn_b`` interleaved; the ratio a/b is the median per round.

    The machines are shared and noisy: a batch of each function runs back to back in
    every round (in alternating order), so a slow patch of the machine hits both sides
    of a ratio alike. Returns both timings and ``median(a_round / b_round)``.
    """
    la, lb = _loops_for(fn_a, min_time), _loops_for(fn_b, min_time)
    sa: list[float] = []
    sb: list[float] = []
    ratios: list[float] = []
    for r in range(rounds):
        if r % 2:
            b = _batch(fn_b, lb)
            a = _batch(fn_a, la)
        else:
            a = _batch(fn_a, la)
            b = _batch(fn_b, lb)
        sa.append(a)
        sb.append(b)
        ratios.append(a / b)
    qa, qb = statistics.quantiles(sa, n=4), statistics.quantiles(sb, n=4)
    return (Timing(name_a, statistics.median(sa), qa[2] - qa[0], la),
            Timing(name_b, statistics.median(sb), qb[2] - qb[0], lb),
            statistics.median(ratios))


def ratio(value: float | None, goal: str, **extra: object) -> dict[str, object]:
    """A ratio entry: ``value``, ``goal`` ("<= 1.3", "< 1.0"), ``met`` and any notes."""
    met: bool | None = None
    if value is not None:
        op, _, bound = goal.partition(" ")
        try:
            b = float(bound)
        except ValueError:
            met = None
        else:
            met = value <= b if op == "<=" else value < b if op == "<" else None
    return {"value": value, "goal": goal, "met": met, **extra}


def time_saves(variants: dict[str, Callable[[], object]], repeat: int) -> list[Timing]:
    """Median time of each save, interleaved, each starting with no dirty pages.

    Writing a checkpoint leaves it dirty in the page cache; the next writes are
    then throttled by the kernel's writeback of the previous ones, by an amount
    that depends on the order of the runs more than on the writer. ``os.sync``
    before each timed save gives every writer the same clean start.
    """
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeat + 1):  # the first round warms up and is dropped
        for name, fn in variants.items():
            if hasattr(os, "sync"):
                os.sync()
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) * 1e6)
    out = []
    for name, v in samples.items():
        v = v[1:]
        q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        out.append(Timing(name, statistics.median(v), q[2] - q[0], 1))
    return out


def parse_size(text: str) -> int:
    """A byte count from the command line: ``1GiB``, ``256MiB``, ``64k``, ``4096``."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "k": 1 << 10, "m": 1 << 20,
             "g": 1 << 30}
    low = text.strip().lower()
    try:
        for u in sorted(units, key=len, reverse=True):
            if low.endswith(u):
                return int(float(low[: -len(u)]) * units[u])
        return int(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GiB, 256MiB)") from None


def run_on_host_devices(module: str, args: list[str], devices: int, needs: tuple[str, ...],
                        timeout: float) -> dict[str, Any]:
    """``python -m benchmarks.<module> --child ARGS`` with JAX on ``devices`` forced CPU
    devices (the flag must be set before JAX is imported: a child process), and its last
    line of output read as the results. A missing package of ``needs``, or a failed child,
    is a note instead of figures."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu")
    try:
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--child", *args],
                              capture_output=True, text=True, timeout=timeout, check=False,
                              env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"timings": [], "ratios": {}, "notes": [f"{module} child failed: {exc}"]}
    if proc.returncode != 0:
        missing = [m for m in needs if f"No module named '{m}" in proc.stderr]
        if missing:
            why = f"{missing[0]} is not installed: nothing measured"
        else:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
            why = f"{module} child failed: {tail[0]}"
        return {"timings": [], "ratios": {}, "notes": [why]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out
