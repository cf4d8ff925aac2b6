"""Timing helpers: medians over repeats, with the spread, as ratios in one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timing:
    name: str
    median_us: float
    spread_us: float  # interquartile range
    loops: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "median_us": self.median_us, "iqr_us": self.spread_us,
                "loops": self.loops}


def measure(name: str, fn: Callable[[], object], *, repeat: int = 15, min_time: float = 0.02) -> Timing:
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
