"""What every fuzz target shares: the invariants, the runner, the numbers it prints.

Each target module (fuzz_*.py) defines ``check(data: bytes) -> None``: it feeds ``data``
to one reader and returns normally when the reader either accepted the bytes
(and what it returned is usable) or refused them with ``hb.FormatError``.
Anything else -- another exception, a hang, a memory blow-up -- is a finding:
``check`` raises, and the fuzzer saves the input (``crash-<sha1>``).

The invariants, checked around every input by :func:`guarded`:

* only ``hb.FormatError`` (the readers' documented error) escapes a reader;
* the call finishes within ``HANG_SECONDS``;
* the peak Python-heap allocation (tracemalloc, which sees every allocation
  the bridge makes: ctypes buffers, bytes, objects) stays within
  ``ALLOC_FACTOR * len(data) + ALLOC_SLACK`` bytes. tracemalloc slows
  allocation about six-fold, so it runs around one input in
  ``HB_FUZZ_TRACE_EVERY`` (default 16; 1 traces every input);
* resident memory does not grow over the run (a leak would): sampled every
  ``RSS_EVERY`` inputs and reported; the *peak* RSS (a high-water mark, so a
  transient spike counts) may not grow by more than ``PEAK_GROWTH_KIB`` --
  memory that no tracemalloc sees (an anonymous map, a zero-filled buffer)
  is caught here.

Run a target with atheris (coverage-guided, libFuzzer flags pass through)::

    python fuzz/fuzz_descriptor.py fuzz/corpus/descriptor -max_total_time=300

Without atheris (``pip install atheris`` has wheels for CPython 3.8-3.11 on
Linux x86-64 and macOS) the same script runs a mutation loop over the corpus
(no coverage feedback): ``python fuzz/fuzz_descriptor.py --no-atheris ...``.
"""

from __future__ import annotations

import os
import pathlib
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = pathlib.Path(__file__).resolve().parent / "corpus"

HANG_SECONDS = 2.0
ALLOC_FACTOR = 16
ALLOC_SLACK = 256 << 10  # Python objects per entry/message: descriptors, tensors, tuples
RSS_EVERY = 20_000
PEAK_GROWTH_KIB = 256 << 10  # peak RSS may not grow by more than this over a run
# CPython 3.11 leaks a little per tracemalloc.start()/stop() pair (measured: ~0.7 KiB;
# flat RSS over 5 million inputs with tracing off). With sampling (1 < every), that
# much per traced input is allowed on top, else a fast target trips the RSS guard on
# the interpreter's leak within minutes.
TRACE_LEAK_KIB = 1

Check = Callable[[bytes], None]


class Finding(AssertionError):
    """An input broke an invariant (not a FormatError: a bug)."""


class Guard:
    """Wraps ``check`` with the allocation, time and RSS invariants, and counts."""

    def __init__(self, check: Check, *, trace_every: int = 16, report: str = "") -> None:
        self.check = check
        self.report = report  # a target name: print the summary every 200,000 inputs
        self.trace_every = trace_every  # 1: every input under tracemalloc
        self.runs = 0
        self.traced = 0
        self.max_ratio = 0.0
        self.max_peak = 0
        self.slowest = 0.0
        self.rss: list[tuple[int, int]] = []
        self.start = time.perf_counter()
        self.peak0 = peak_rss_kib()

    def __call__(self, data: bytes) -> None:
        self.runs += 1
        # tracemalloc slows every allocation about six-fold while it runs: it is
        # switched on around one input in ``trace_every`` only.
        traced = self.trace_every and self.runs % self.trace_every == 0
        outer = traced and tracemalloc.is_tracing()  # someone else's trace: leave it running
        if outer:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
        elif traced:
            tracemalloc.start(1)
            base = 0
        t0 = time.perf_counter()
        try:
            self.check(data)
        finally:
            dt = time.perf_counter() - t0
            if traced:
                peak = tracemalloc.get_traced_memory()[1] - base
                if not outer:
                    tracemalloc.stop()
        if dt > self.slowest:
            self.slowest = dt
        if dt > HANG_SECONDS * (4 if traced else 1):
            raise Finding(f"hang: {dt:.2f} s for a {len(data)}-byte input")
        if traced:
            self.traced += 1
            limit = ALLOC_FACTOR * len(data) + ALLOC_SLACK
            if peak > limit:
                raise Finding(f"allocation: peak {peak} bytes for a {len(data)}-byte input "
                              f"(limit {limit})")
            if peak > self.max_peak:
                self.max_peak = peak
            ratio = peak / max(len(data), 1)
            if ratio > self.max_ratio:
                self.max_ratio = ratio
        if self.runs % RSS_EVERY == 0:
            self.rss.append((self.runs, rss_kib()))
            peak = peak_rss_kib()
            allowed = PEAK_GROWTH_KIB
            if self.trace_every and self.trace_every > 1:
                allowed += TRACE_LEAK_KIB * self.traced
            if peak - self.peak0 > allowed:
                raise Finding(f"peak RSS grew {(peak - self.peak0) >> 10} MiB since the start: "
                              f"one of the last {RSS_EVERY} inputs made a reader commit memory "
                              "it never needed (replay them with HB_FUZZ_TRACE_EVERY=0 and "
                              "watch ru_maxrss)")
            if self.report and self.runs % (10 * RSS_EVERY) == 0:
                print(self.summary(self.report), file=sys.stderr, flush=True)

    def summary(self, name: str) -> str:
        wall = time.perf_counter() - self.start
        rss = self.rss or [(self.runs, rss_kib())]
        return (f"[{name}] {self.runs} executions in {wall:.0f} s = "
                f"{self.runs / max(wall, 1e-9):.0f} exec/s; "
                f"slowest input {self.slowest * 1e3:.1f} ms; "
                f"{self.traced} inputs under tracemalloc: peak allocation {self.max_peak} bytes "
                f"(at most {self.max_ratio:.1f} x the input size); "
                f"RSS {rss[0][1]} KiB at {rss[0][0]} runs -> {rss[-1][1]} KiB at {rss[-1][0]}")


def peak_rss_kib() -> int:
    """The process's peak resident set size so far (a high-water mark); 0 where unknown."""
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS


def rss_kib() -> int:
    """Current resident set size (Linux), else the peak."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, AttributeError, ValueError):
        return peak_rss_kib()


def corpus_files(name: str) -> list[pathlib.Path]:
    d = CORPUS / name
    return sorted(p for p in d.iterdir() if p.is_file()) if d.is_dir() else []


# ------------------------------------------------------------------------ fallback
def _mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """libFuzzer's cheap mutations, without coverage: flips, sets, cuts, splices."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(7)
        if op == 0 and buf:
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[rng.randrange(len(buf))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2 and len(buf) >= 8:
            i = rng.randrange(0, len(buf) - 7) & ~7
            word = rng.choice((0, 1, 2**63, 2**64 - 1, rng.getrandbits(64)))
            buf[i:i + 8] = word.to_bytes(8, "little")
        elif op == 3 and buf:
            del buf[rng.randrange(len(buf)):]
        elif op == 4:
            i = rng.randrange(len(buf) + 1)
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 5 and pool:
            other = rng.choice(pool)
            i, j = rng.randrange(len(buf) + 1), rng.randrange(len(other) + 1)
            buf = buf[:i] + other[j:]
        elif op == 6 and len(buf) >= 4:
            i = rng.randrange(0, len(buf) - 3) & ~3
            buf[i:i + 4] = rng.getrandbits(32).to_bytes(4, "little")
    return bytes(buf)


def _fallback(name: str, guard: Guard, seconds: float, seed: int,
              prepare: Callable[[bytes], bytes] | None) -> None:
    pool = [p.read_bytes() for p in corpus_files(name)] or [b""]
    rng = random.Random(seed)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(256):
            data = _mutate(rng, rng.choice(pool), pool)
            if prepare is not None and rng.random() < 0.5:
                data = prepare(data)
            try:
                guard(data)
            except BaseException:
                out = pathlib.Path(f"crash-{name}-{guard.runs}")
                out.write_bytes(data)
                print(f"finding saved to {out}", file=sys.stderr)
                raise


# -------------------------------------------------------------------------- runner
def main(name: str, load_check: Callable[[], Check], argv: list[str] | None = None, *,
         prepare: Callable[[bytes], bytes] | None = None) -> None:
    """Run target ``name``; ``load_check`` imports the readers (instrumented under atheris)."""
    argv = list(sys.argv if argv is None else argv)
    use_atheris = "--no-atheris" not in argv
    argv = [a for a in argv if a != "--no-atheris"]
    trace_every = int(os.environ.get("HB_FUZZ_TRACE_EVERY", "16"))
    atheris: Any = None
    if use_atheris:
        try:
            import atheris
        except ImportError:
            print("atheris is not installed: running the mutation loop without coverage "
                  "(pip install atheris for coverage-guided fuzzing)", file=sys.stderr)
    if atheris is not None:
        with atheris.instrument_imports(include=["hurray_bridge"]):
            check = load_check()
        guard = Guard(check, trace_every=trace_every, report=name)
        import atexit

        atexit.register(lambda: print(guard.summary(name), file=sys.stderr, flush=True))
        atheris.Setup(argv, guard)
        atheris.Fuzz()
        return
    check = load_check()
    guard = Guard(check, trace_every=trace_every)
    seconds = float(os.environ.get("HB_FUZZ_SECONDS", "60"))
    seed = int(os.environ.get("HB_FUZZ_SEED", "0"))
    try:
        _fallback(name, guard, seconds, seed, prepare)
    finally:
        print(guard.summary(name), file=sys.stderr, flush=True)
