"""Eight threads converting at once (issue 9): no error, no leak, no wrong value.

For a bounded time (``HB_THREAD_SECONDS``, default 2.5 s: some 14,000 conversions
here; set it higher for a soak) eight workers run a random mix of:

* **shared**: a tensor from a pool that every thread reads (made once from
  NumPy, torch, JAX and Arrow arrays, views included) goes to a random
  framework and its values are checked;
* **hand-off**: a fresh source of a random framework becomes an ``hb.Tensor``
  and a consumer of another framework; the source is dropped at once and the
  consumer goes to a queue, where another thread checks and drops it, so
  sources die on one thread while their consumers live on another;
* **chain**: a shared tensor goes through two frameworks and back.

Every value is compared with what its source held. At the end every source
made during the run has been freed, the export registry is back where it
started, and resident memory has not grown beyond a bound.
"""

from __future__ import annotations

import gc
import os
import queue
import random
import sys
import threading
import time
import traceback
import weakref
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pa = pytest.importorskip("pyarrow")

SECONDS = float(os.environ.get("HB_THREAD_SECONDS", "2.5"))
THREADS = 8
FWS = ("numpy", "torch", "jax", "arrow")
# 32 bits at most: JAX without jax_enable_x64 refuses 64-bit types (it would narrow them).
DTYPES = (np.float32, np.int32, np.uint8, np.int16, np.float16)
# A few shapes, not every size: JAX keeps a compiled transfer per (shape, dtype) it has
# seen (~1.5 MiB each), which would look like a leak of ours in the RSS check.
SHAPES = ((0, 3), (1, 1), (5, 7), (8, 2), (3, 0))
LENGTHS = ((0,), (1,), (17,), (40,))


def values(x: Any) -> Any:
    """A consumer's values as a NumPy array, read through its own framework."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, torch.Tensor):
        return x.numpy()
    if isinstance(x, jax.Array):
        return np.asarray(x)
    if isinstance(x, hb.Tensor):
        return np.asarray(x)
    if isinstance(x, pa.Tensor):
        return x.to_numpy()
    return x.to_numpy(zero_copy_only=False)


def make(fw: str, a: Any) -> Any:
    """A native array of framework ``fw`` holding ``a``'s values (its own memory or a view)."""
    if fw == "numpy":
        return a
    if fw == "torch":
        return torch.from_numpy(np.ascontiguousarray(a))
    if fw == "jax":
        return jnp.asarray(a)
    return pa.array(np.ascontiguousarray(a).reshape(-1))  # Arrow arrays are flat


def expected_for(fw: str, a: Any) -> Any:
    return np.ascontiguousarray(a).reshape(-1) if fw == "arrow" else a


class Run:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds
        self.errors: list[str] = []
        self.handoff: queue.Queue[tuple[Any, Any, str]] = queue.Queue(maxsize=256)
        self.lock = threading.Lock()
        self.made = 0
        self.freed = 0
        self.ops = {"shared": 0, "handoff": 0, "checked": 0, "chain": 0}
        rng = np.random.default_rng(0)
        self.pool: list[tuple[hb.Tensor, Any, str]] = []
        for fw in FWS:
            for dt in DTYPES:
                a = (rng.integers(0, 100, (12, 10)) + 1).astype(dt)
                for view in (a, a[::2, 1::3], a[3]):  # compact, strided, a row
                    src = make(fw, view)
                    self.pool.append((hb.asarray(src), expected_for(fw, view),
                                      f"{fw}:{dt.__name__}"))

    def count(self, key: str) -> None:
        with self.lock:
            self.ops[key] += 1

    def _freed(self) -> None:
        with self.lock:
            self.freed += 1

    def check(self, got: Any, want: Any, what: str) -> None:
        v = values(got)
        if v.shape != want.shape or v.tolist() != want.tolist():
            raise AssertionError(f"{what}: wrong values {v!r}, expected {want!r}")

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        nrng = np.random.default_rng(seed)
        try:
            while time.perf_counter() < self.deadline:
                op = rng.random()
                if op < 0.4:
                    t, want, tag = rng.choice(self.pool)
                    dst = rng.choice(FWS)
                    if dst == "arrow" and t.ndim != 1:
                        dst = "numpy"  # a 2-D Arrow result is a pa.Tensor: covered by chain
                    self.check(hb.convert(t, dst), want, f"shared {tag} -> {dst}")
                    self.count("shared")
                elif op < 0.75:
                    src_fw, dst = rng.choice(FWS), rng.choice(FWS)
                    dt = rng.choice(DTYPES)
                    shape = rng.choice(LENGTHS if src_fw == "arrow" else SHAPES)
                    a = nrng.integers(0, 100, shape).astype(dt)
                    src = make(src_fw, a)
                    with self.lock:
                        self.made += 1
                    weakref.finalize(src, self._freed)
                    out = hb.convert(hb.asarray(src), dst)
                    del src  # the source dies here; the consumer lives on elsewhere
                    want = a  # a 2-D Arrow result is a pa.Tensor of the same shape
                    try:
                        self.handoff.put_nowait((out, want, f"{src_fw}->{dst}"))
                    except queue.Full:
                        self.check(out, want, f"handoff {src_fw}->{dst}")
                    self.count("handoff")
                elif op < 0.9:
                    try:
                        out, want, tag = self.handoff.get_nowait()
                    except queue.Empty:
                        continue
                    self.check(out, want, f"handed-off {tag}")
                    del out
                    self.count("checked")
                else:
                    t, want, tag = rng.choice(self.pool)
                    x = hb.convert(t, rng.choice(("torch", "jax", "numpy")))
                    y = hb.convert(x, rng.choice(("torch", "jax", "numpy", "arrow")))
                    self.check(hb.asarray(y), want, f"chain {tag}")
                    self.count("chain")
        except BaseException:
            with self.lock:
                self.errors.append(f"thread {seed}:\n{traceback.format_exc()}")

    def drain(self) -> None:
        while True:
            try:
                out, want, tag = self.handoff.get_nowait()
            except queue.Empty:
                return
            self.check(out, want, f"drained {tag}")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_threads(seconds: float, samples: list[float] | None = None) -> Run:
    run = Run(seconds)
    threads = [threading.Thread(target=run.worker, args=(seed,), name=f"hb-{seed}")
               for seed in range(THREADS)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: more interleavings per second
    try:
        for th in threads:
            th.start()
        while samples is not None and any(th.is_alive() for th in threads):
            samples.append(rss_mib())
            time.sleep(0.1)
        for th in threads:
            th.join(seconds + 60)
    finally:
        sys.setswitchinterval(switch)
    assert not any(th.is_alive() for th in threads), "a worker hung"
    assert not run.errors, "\n".join(run.errors[:3])
    run.drain()
    return run


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.filterwarnings("ignore::hurray_bridge.CopyWarning")
def test_eight_threads_convert_concurrently() -> None:
    gc.collect()
    exports0 = _capsule.live_exports()
    # First JAX's transfer for every (shape, dtype), then a short threaded run (first
    # dispatches, one malloc arena per thread): they stay, and are not ours to measure.
    for dt in DTYPES:
        for shape in SHAPES + LENGTHS:
            hb.convert(hb.asarray(jnp.asarray(np.zeros(shape, dt))), "jax")
    # And every pair's first conversion, which imports its adapter modules: under pytest
    # their import parses them (assertion rewriting, as hurray_bridge is a plugin), and
    # CPython 3.11 keeps ast's recursion depth per module, not per thread, so two
    # threads parsing at once raise "AST constructor recursion depth mismatch"
    # (1 run in 5 of this test here).
    for fw in FWS:
        src = make(fw, np.arange(6.0, dtype=np.float32))
        for dst in FWS:
            hb.convert(hb.convert(src, dst), "numpy")
    run_threads(min(1.0, SECONDS / 3))
    gc.collect()
    samples: list[float] = []
    run = run_threads(SECONDS, samples)
    assert min(run.ops.values()) > 0, run.ops
    gc.collect()
    made = run.made
    assert made > 100, run.ops
    # Every source made during the run was freed once its last consumer was gone.
    assert run.freed == made, f"{made - run.freed} of {made} sources never freed"
    print(f"\n8 threads, {SECONDS:g} s: {run.ops}; {made} sources made and freed; "
          f"RSS {samples[0]:.0f} -> {samples[-1]:.0f} MiB")
    del run
    gc.collect()
    assert _capsule.live_exports() == exports0
    # Memory is flat: the second half of the run holds no more than the first reached.
    half = samples[: len(samples) // 2]
    grown = max(samples[len(samples) // 2:]) - max(half)
    assert grown < 48, f"RSS grew {grown:.1f} MiB in the second half of the run ({samples})"


_FIRST_USE = """
import sys, threading, time
import hurray_bridge as hb
from hurray_bridge import _registry
name = "hurray_bridge.adapters.torch"
assert "torch" not in sys.modules
# One thread imports the adapter (torch with it, a second or so); the main thread asks
# for it while that import is under way, its module already in sys.modules, half made.
importer = threading.Thread(target=__import__, args=(name,))
importer.start()
while name not in sys.modules:
    time.sleep(0.0005)
mod = _registry.get_adapter("torch")
print("to_hurray" in vars(mod), flush=True)
importer.join()
x = sys.modules["torch"].arange(4.0)
print(hb.asarray(x).shape, flush=True)
"""


def test_a_first_use_while_another_thread_imports_the_adapter_waits_for_it() -> None:
    # Eight threads making their first hb.asarray(torch tensor) at once: the ones that
    # lost the race got the adapter's module from sys.modules before its import was
    # done ("partially initialized module 'hurray_bridge.adapters.torch' has no
    # attribute 'to_hurray'", in about one run of six). Here the race is forced.
    import subprocess

    out = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[:2] == ["True", "(4,)"], out.stdout + out.stderr
