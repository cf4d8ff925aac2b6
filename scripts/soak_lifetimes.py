#!/usr/bin/env python3
"""Lifetimes under load: import/export cycles across NumPy, torch, JAX and Arrow.

    python scripts/soak_lifetimes.py                 # 1,000,000 cycles (issue 9)
    python scripts/soak_lifetimes.py --cycles 20000  # a quick look

One cycle is one import and one export: a fresh source array of one framework
(its values encode the cycle number) becomes an ``hb.Tensor`` (``hb.asarray``),
which is handed to another framework (``hb.convert``); the source is then
dropped while the consumer still lives, and the consumer is dropped some
cycles later (a window of live consumers). The 24 (source, target) pairs take
turns (sources: the four frameworks' arrays, a ``pa.Tensor`` and a bare DLPack
producer). Every 16th cycle the consumer's values are checked against the cycle
number.

What is counted, and must balance at the end:

* **sources**: created, and freed (a ``weakref.finalize`` on each);
* **foreign deleters**: DLPack capsules the bridge consumed (imports from
  torch, JAX, Arrow tensors), and deleters run (a finalizer on the managed
  tensor that owns each; its ``__del__`` runs the producer's deleter);
* **our exports**: capsules ``hb.Tensor.__dlpack__`` made for consumers, and
  how many are still registered (the export deleter unregisters each).

RSS is sampled every ``--sample`` cycles; the script prints the samples, the
counts and the verdict (RSS growth after warm-up under ``--max-growth-mib``,
every count balanced), and exits 1 when a check fails.
``tests/hurray_bridge/test_lifetimes_load.py`` runs the same engine with a small count.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FRAMEWORKS = ("numpy", "torch", "jax", "arrow")
# Sources: each framework's own array, plus two that come in through a DLPack capsule
# (so the producer's deleter is the bridge's to run): a pyarrow Tensor, and a bare
# producer object wrapping a torch tensor (hb.asarray falls back to hb.from_dlpack).
SOURCES = (*FRAMEWORKS, "arrow_tensor", "dlpack")
PAIRS = [(s, d) for s in SOURCES for d in FRAMEWORKS]
WIDTH = 6  # elements per source: values k, k+1, ..., k+5 with k = cycle % 4096


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


@dataclass
class Counts:
    sources_made: int = 0
    sources_freed: int = 0
    capsules_consumed: int = 0
    foreign_deleters_run: int = 0
    exports_made: int = 0
    values_checked: int = 0

    def exports_live(self) -> int:
        from hurray_bridge import _capsule

        return _capsule.live_exports()


@dataclass
class Result:
    cycles: int
    seconds: float
    counts: Counts
    exports_live_before: int
    exports_live_after: int
    rss: list[tuple[int, int]] = field(default_factory=list)  # (cycle, KiB)
    warmup_kib: int = 0

    @property
    def growth_kib(self) -> int:
        return self.rss[-1][1] - self.warmup_kib

    def problems(self, max_growth_mib: float) -> list[str]:
        c = self.counts
        out = []
        if c.sources_freed != c.sources_made:
            out.append(f"{c.sources_made - c.sources_freed} of {c.sources_made} sources "
                       "never freed")
        if c.foreign_deleters_run != c.capsules_consumed:
            out.append(f"{c.capsules_consumed - c.foreign_deleters_run} of {c.capsules_consumed} "
                       "consumed capsules never had their deleter run")
        if self.exports_live_after != self.exports_live_before:
            out.append(f"{self.exports_live_after - self.exports_live_before} of "
                       f"{c.exports_made} exports still registered (deleter not run)")
        if self.growth_kib > max_growth_mib * 1024:
            out.append(f"RSS grew {self.growth_kib / 1024:.1f} MiB after warm-up "
                       f"(limit {max_growth_mib} MiB)")
        return out

    def report(self) -> str:
        c = self.counts
        lines = [
            f"{self.cycles} cycles in {self.seconds:.1f} s "
            f"({self.cycles / max(self.seconds, 1e-9):.0f} cycles/s, "
            f"{len(PAIRS)} source->target pairs)",
            f"RSS: {self.rss[0][1] / 1024:.1f} MiB at start, {self.warmup_kib / 1024:.1f} MiB "
            f"after warm-up, {self.rss[-1][1] / 1024:.1f} MiB at the end "
            f"(growth after warm-up {self.growth_kib / 1024:+.1f} MiB); "
            f"max {max(k for _, k in self.rss) / 1024:.1f} MiB",
            f"sources: {c.sources_made} made, {c.sources_freed} freed",
            f"foreign deleters: {c.capsules_consumed} capsules consumed, "
            f"{c.foreign_deleters_run} deleters run",
            f"our exports: {c.exports_made} capsules made, "
            f"{self.exports_live_after - self.exports_live_before} still registered",
            f"values checked: {c.values_checked}",
            "RSS samples (cycle: MiB): " + ", ".join(
                f"{n}: {k / 1024:.1f}" for n, k in self.rss[:: max(1, len(self.rss) // 12)]),
        ]
        return "\n".join(lines)


class _Producer:
    """A bare DLPack producer (no adapter claims it): forwards to the object it wraps."""

    __slots__ = ("__weakref__", "x")

    def __init__(self, x: Any) -> None:
        self.x = x

    def __dlpack__(self, **kw: Any) -> object:
        return self.x.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.x.__dlpack_device__()  # type: ignore[no-any-return]


class Soak:
    """The cycle engine. Instruments the capsule module while it runs (``with Soak() as s``)."""

    def __init__(self, window: int = 64) -> None:
        import jax
        import jax.numpy as jnp
        import numpy as np
        import pyarrow as pa
        import torch

        import hurray_bridge as hb
        from hurray_bridge import _capsule

        self.np, self.torch, self.jax, self.jnp, self.pa, self.hb = np, torch, jax, jnp, pa, hb
        self._capsule = _capsule
        self.counts = Counts()
        self.window: collections.deque[tuple[int, Any]] = collections.deque(maxlen=window)
        self._base = np.arange(WIDTH, dtype=np.float32)

    # -- instrumentation: count what goes through the one capsule module
    def __enter__(self) -> Soak:
        cap = self._capsule
        counts = self.counts
        orig_consume, orig_make = cap.consume_capsule, cap.make_capsule

        def freed() -> None:
            counts.foreign_deleters_run += 1

        def consume_capsule(capsule: object) -> Any:
            view = orig_consume(capsule)
            counts.capsules_consumed += 1
            weakref.finalize(view.owner, freed)  # after its __del__ ran the deleter
            return view

        def make_capsule(**kw: Any) -> object:
            counts.exports_made += 1
            return orig_make(**kw)

        # Modules bind these under other names for speed (tensor.py's _make_capsule):
        # every module attribute that *is* one of them is swapped for the counting one.
        swap = {id(orig_consume): consume_capsule, id(orig_make): make_capsule}
        self._patched: list[tuple[Any, str, Any]] = []
        for name, mod in list(sys.modules.items()):
            if not name.startswith("hurray_bridge") or mod is None:
                continue
            for attr, value in list(vars(mod).items()):
                if id(value) in swap and (value is orig_consume or value is orig_make):
                    self._patched.append((mod, attr, value))
                    setattr(mod, attr, swap[id(value)])
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore", self.hb.CopyWarning)  # JAX copies 16-byte aligned NumPy
        warnings.filterwarnings("ignore", "torch tensor shares read-only memory")  # Arrow's
        return self

    def __exit__(self, *exc: object) -> None:
        for mod, attr, value in self._patched:
            setattr(mod, attr, value)
        self._warnings.__exit__(*exc)

    # -- one cycle
    def _freed(self) -> None:
        self.counts.sources_freed += 1

    def source(self, fw: str, k: int) -> Any:
        a = self._base + k
        if fw == "numpy":
            src: Any = a
        elif fw == "torch":
            src = self.torch.from_numpy(a)  # a owned by the torch tensor: dies with it
        elif fw == "jax":
            src = self.jnp.asarray(a)
        elif fw == "arrow":
            src = self.pa.array(a)
        elif fw == "arrow_tensor":
            src = self.pa.Tensor.from_numpy(a)
        else:
            src = _Producer(self.torch.from_numpy(a))
        self.counts.sources_made += 1
        weakref.finalize(src, self._freed)
        return src

    def values(self, x: Any) -> Any:
        """The consumer's values as a NumPy array (read through its own framework)."""
        np = self.np
        if isinstance(x, np.ndarray):
            return x
        if isinstance(x, self.torch.Tensor):
            return x.numpy()
        if isinstance(x, self.jax.Array):
            return np.asarray(x)
        return x.to_numpy(zero_copy_only=False)

    def cycle(self, i: int) -> None:
        src_fw, dst_fw = PAIRS[i % len(PAIRS)]
        k = i % 4096
        src = self.source(src_fw, k)
        t = self.hb.asarray(src)  # import
        out = self.hb.convert(t, dst_fw)  # export
        del src, t  # the source dies first; the consumer keeps its memory alive
        if i % 16 == 0:
            got = self.values(out)
            if got.tolist() != (self._base + k).tolist():
                raise AssertionError(f"cycle {i} ({src_fw} -> {dst_fw}): {got} != k={k}")
            self.counts.values_checked += 1
        self.window.append((i, out))  # dropped len(window) cycles later

    def run(self, cycles: int, sample: int = 10_000, warmup: int = 0,
            progress: Callable[[str], None] | None = None) -> Result:
        gc.collect()
        before = self._capsule.live_exports()
        rss = [(0, rss_kib())]
        warm = 0
        t0 = time.perf_counter()
        for i in range(cycles):
            self.cycle(i)
            if (i + 1) % sample == 0:
                rss.append((i + 1, rss_kib()))
                if progress is not None:
                    progress(f"  {i + 1} cycles, RSS {rss[-1][1] / 1024:.1f} MiB, "
                             f"exports live {self._capsule.live_exports() - before}")
            if i + 1 == warmup:
                gc.collect()
                warm = rss_kib()
        seconds = time.perf_counter() - t0
        self.window.clear()  # the last consumers die
        gc.collect()
        rss.append((cycles, rss_kib()))
        return Result(cycles, seconds, self.counts, before, self._capsule.live_exports(), rss,
                      warm or rss[0][1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=1_000_000)
    ap.add_argument("--sample", type=int, default=20_000, help="RSS sample interval (cycles)")
    ap.add_argument("--warmup", type=int, default=50_000,
                    help="cycles before the RSS baseline (allocator pools, JAX caches)")
    ap.add_argument("--max-growth-mib", type=float, default=16.0)
    args = ap.parse_args(argv)
    with Soak() as soak:
        print(f"soak: {args.cycles} cycles over {len(PAIRS)} pairs "
              f"(numpy {soak.np.__version__}, torch {soak.torch.__version__}, "
              f"jax {soak.jax.__version__}, pyarrow {soak.pa.__version__})", flush=True)
        res = soak.run(args.cycles, args.sample, min(args.warmup, args.cycles // 2),
                       progress=lambda s: print(s, flush=True))
    print(res.report())
    problems = res.problems(args.max_growth_mib)
    print("verdict: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
