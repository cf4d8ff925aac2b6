"""Stream synchronisation across frameworks (DLPack's ``stream`` handshake through the bridge).

A producer writes on its own stream, behind a long kernel, and hands the array
over at once; the consumer reads it immediately on *its* stream. Only the
bridge forwarding the consumer's stream to the producer (which then makes that
stream wait) keeps the consumer from reading the old contents.

Every bridged test has a control: the same race with the synchronisation
switched off (the producer is asked with ``stream=-1``). The control must see
stale data; that is what proves the bridged test can fail.

Streams used: torch's side streams and CuPy's ``Stream(non_blocking=True)`` do
not synchronise implicitly with anything; CuPy's per-thread default stream
(``Stream.ptds``, handle 2) synchronises implicitly with the legacy default
stream only. torch refuses ``stream=2`` (BufferError, "per-thread default
stream is not supported"), so the CuPy adapter hands such producers a relay
stream and orders the per-thread stream after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb

N = 1 << 16
VALUE = 7.0
# ~0.1 s at the H200's 1.98 GHz boost clock (longer at lower clocks): far longer than
# the few hundred microseconds the hand-over and the consumer's read take to enqueue.
CYCLES = 200_000_000

_SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float* out, float v, long long n, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v;
}
"""


class NoSync:
    """The producer's memory, asked for with ``stream=-1`` whatever the consumer passes."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __dlpack_device__(self) -> Any:
        return self.x.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> object:
        if max_version is None:
            return self.x.__dlpack__(stream=-1)
        return self.x.__dlpack__(stream=-1, max_version=max_version)


# --------------------------------------------------------------------- producers
@contextlib.contextmanager
def _torch_side(torch: Any, cupy: Any) -> Iterator[Any]:
    x = torch.zeros(N, dtype=torch.float32, device="cuda:0")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()  # from torch's pool: non-blocking
    with torch.cuda.stream(side):
        torch.cuda._sleep(CYCLES)
        x.fill_(VALUE)
        yield x  # handed over while the side stream is torch's current stream
    torch.cuda.synchronize()


def _spin_fill(cupy: Any, x: Any) -> None:
    kernel = cupy.RawKernel(_SPIN_FILL, "spin_fill")
    kernel(((N + 255) // 256,), (256,), (x, np.float32(VALUE), np.int64(N), np.int64(CYCLES)))


@contextlib.contextmanager
def _cupy_side(torch: Any, cupy: Any) -> Iterator[Any]:
    x = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    with cupy.cuda.Stream(non_blocking=True):
        _spin_fill(cupy, x)
        yield x  # CuPy's contract: an array is ready on CuPy's current stream at export
    cupy.cuda.Device().synchronize()


@contextlib.contextmanager
def _cupy_ptds(torch: Any, cupy: Any) -> Iterator[Any]:
    x = cupy.zeros(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    with cupy.cuda.Stream.ptds:
        _spin_fill(cupy, x)
        yield x
    cupy.cuda.Device().synchronize()


PRODUCERS: dict[str, Callable[[Any, Any], Any]] = {
    "torch_side": _torch_side, "cupy_side": _cupy_side, "cupy_ptds": _cupy_ptds,
}


# --------------------------------------------------------------------- consumers
def _read(fws: Any, consumer: str, x: Any, bridged: bool) -> np.ndarray:
    """Import ``x`` into ``consumer`` and read it at once on the consumer's stream."""
    if consumer == "torch":
        torch = fws("torch").m
        y = hb.convert(x, "torch") if bridged else torch.from_dlpack(NoSync(x))
        return y.cpu().numpy()  # torch's current stream: the legacy default stream
    if consumer == "jax":
        jax = fws("jax").m
        y = hb.convert(x, "jax") if bridged else jax.dlpack.from_dlpack(NoSync(x))
        return np.asarray(y)
    cupy = fws("cupy").m
    stream = cupy.cuda.Stream.ptds if consumer == "cupy_ptds" else cupy.cuda.Stream.null
    with stream:
        y = hb.convert(x, "cupy") if bridged else cupy.from_dlpack(NoSync(x))
        return cupy.asnumpy(y)  # on the current (consumer's) stream


CASES = [
    ("torch_side", "cupy"), ("torch_side", "cupy_ptds"), ("torch_side", "jax"),
    ("cupy_side", "torch"), ("cupy_side", "jax"),
    ("cupy_ptds", "torch"), ("cupy_ptds", "jax"),
]
IDS = [f"{p}->{c}" for p, c in CASES]


def _frameworks(fws: Any, producer: str, consumer: str) -> None:
    for name in {producer.split("_")[0], consumer.split("_")[0], "torch", "cupy"}:
        fws(name)


@pytest.mark.parametrize(("producer", "consumer"), CASES, ids=IDS)
def test_consumer_sees_finished_data(fws: Any, torch: Any, cupy: Any, producer: str,
                                     consumer: str) -> None:
    _frameworks(fws, producer, consumer)
    with PRODUCERS[producer](torch, cupy) as x:
        host = _read(fws, consumer, x, bridged=True)
    assert host.shape == (N,)
    stale = int(np.count_nonzero(host != VALUE))
    assert stale == 0, f"{producer}->{consumer}: {stale} of {N} elements read before the write"


@pytest.mark.parametrize(("producer", "consumer"), CASES, ids=IDS)
def test_control_without_sync_reads_stale_data(fws: Any, torch: Any, cupy: Any, producer: str,
                                               consumer: str) -> None:
    if producer == "cupy_ptds" and consumer == "torch":
        pytest.skip("the legacy default stream (torch's) implicitly waits for the per-thread "
                    "default stream: no race to observe")
    _frameworks(fws, producer, consumer)
    with PRODUCERS[producer](torch, cupy) as x:
        host = _read(fws, consumer, x, bridged=False)
    assert not (host == VALUE).all(), (
        f"{producer}->{consumer}: the unsynchronised read saw finished data, so this machine "
        "does not expose the race and the synchronised test above proves nothing; raise CYCLES"
    )


# ------------------------------------------------------------------ JAX produces
@pytest.mark.parametrize("consumer", ["torch", "cupy", "cupy_ptds"])
def test_jax_result_still_computing_is_awaited(fws: Any, torch: Any, cupy: Any,
                                               consumer: str) -> None:
    # JAX dispatch is asynchronous: the result of a long computation is handed over
    # before it exists. JAX makes the consumer's stream wait for it.
    jax = fws("jax").m
    fws("torch")
    fws("cupy")
    jnp = jax.numpy
    n = 4096
    a = jax.random.normal(jax.random.key(0), (n, n), dtype=jnp.float32) / np.sqrt(n)
    a.block_until_ready()

    @jax.jit
    def heavy(m: Any) -> Any:
        return jax.lax.fori_loop(0, 40, lambda i, v: jnp.tanh(v @ m), m)

    heavy(a).block_until_ready()  # compile outside the race
    r = heavy(a)
    host = _read(fws, consumer, r, bridged=True)
    expected = np.asarray(r)
    assert host.shape == (n, n)
    assert host.tobytes() == expected.tobytes(), f"jax->{consumer}: read before JAX finished"


# ---------------------------------------------------------- per-thread default stream
def test_torch_refuses_per_thread_stream_directly(torch: Any, cupy: Any) -> None:
    """Documents what the bridge works around: CuPy under PTDS importing torch directly.

    torch's ``__dlpack__`` refuses ``stream=2``. Whatever torch does, stale data
    must never come back: either an error, or the finished values (the outcome
    is printed: ``pytest -rP`` shows it).
    """
    with _torch_side(torch, cupy) as x, cupy.cuda.Stream.ptds:
        try:
            y = cupy.from_dlpack(x)
        except BufferError as exc:
            print(f"torch with stream=2: refused, {type(exc).__name__}: {exc}")
            assert "stream" in str(exc).lower(), exc
            return
        host = cupy.asnumpy(y)
    print("torch with stream=2: accepted")
    assert (host == VALUE).all(), "torch accepted stream=2 but did not synchronise"


def test_bridge_under_ptds_forwards_a_real_stream(fws: Any, torch: Any, cupy: Any) -> None:
    fws("torch")
    fws("cupy")
    seen: list[Any] = []
    x = torch.ones(8, device="cuda:0")
    t = hb.asarray(x)

    class Spy:
        def __dlpack_device__(self) -> Any:
            return x.__dlpack_device__()

        def __dlpack__(self, **kw: Any) -> object:
            seen.append(kw.get("stream"))
            return x.__dlpack__(**kw)

    t._source = Spy()  # see what the producer is asked for
    with cupy.cuda.Stream.ptds:
        y = hb.get_adapter("cupy").from_hurray(t)
        assert (cupy.asnumpy(y) == 1).all()
    assert len(seen) == 1 and seen[0] not in (None, -1, 0, 1, 2), seen
