"""Empty tensors on the GPU (ADR-007): a NULL device pointer and zero bytes inside Hurray,
and no zero-byte allocation by any framework on the way through.

Allocations are counted, not guessed: torch's caching allocator counts every
allocation it serves (``allocation.all.allocated``, cumulative), CuPy's pool
reports used/total bytes and free blocks, and XLA's allocator reports
``num_allocs`` where the JAX build exposes memory stats.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb
from gpu_tests._fw import PAIRS, np_dtype

SHAPES = [(0,), (3, 0, 5), (0, 4)]
DTYPES = [hb.float32, hb.int8, hb.complex128]


def _alloc_state(torch: Any, cupy: Any, jax: Any) -> dict[str, Any]:
    pool = cupy.get_default_memory_pool()
    state = {
        "torch allocations": torch.cuda.memory_stats(0).get("allocation.all.allocated", 0),
        "cupy used bytes": pool.used_bytes(),
        "cupy total bytes": pool.total_bytes(),
        "cupy free blocks": pool.n_free_blocks(),
    }
    stats = jax.devices("gpu")[0].memory_stats() or {}
    if "num_allocs" in stats:
        state["xla allocations"] = stats["num_allocs"]
    return state


def _empty_source(S: Any, shape: tuple[int, ...], d: hb.DType) -> Any:
    if S.name == "torch":
        return S.m.empty(shape, dtype=S.native_dtype(d), device="cuda:0")
    if S.name == "cupy":
        with S.m.cuda.Device(0):
            return S.m.empty(shape, dtype=S.native_dtype(d))
    return S.from_numpy(np.empty(shape, np_dtype(d)))


@pytest.mark.parametrize("path", ["convert", "asarray"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_empty_is_null_and_allocates_nothing(
    fws: Any, torch: Any, cupy: Any, jax: Any,
    src: str, dst: str, shape: tuple[int, ...], dtype: hb.DType, path: str,
) -> None:
    S, D = fws(src), fws(dst)
    x = _empty_source(S, shape, dtype)
    torch.cuda.synchronize()
    gc.collect()
    before = _alloc_state(torch, cupy, jax)

    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)  # nothing to copy, nothing copied
        if path == "convert":
            y = hb.convert(x, dst)
        else:
            t = hb.asarray(x)
            assert t.shape == shape and t.dtype is dtype
            assert t.device == hb.Device(2, 0)
            assert t.data_ptr == 0 and t.nbytes == 0
            assert all(b.ptr == 0 and b.nbytes == 0 for b in t.buffers)
            assert t.descriptor.is_empty and t.descriptor.nbytes == 0
            y = hb.get_adapter(dst).from_hurray(t)
    torch.cuda.synchronize()
    after = _alloc_state(torch, cupy, jax)

    assert D.is_native(y)
    assert tuple(y.shape) == shape and D.dtype_matches(y, dtype)
    assert after == before, f"{src}->{dst}: an allocation happened for an empty tensor"


@pytest.mark.parametrize("src", ["torch", "cupy"])
def test_empty_slice_of_nonempty_buffer_is_null_in_hurray(fws: Any, src: str) -> None:
    # An empty view into live memory: CuPy gives it the base's address (torch 2.11 reports
    # data_ptr() 0 for any empty tensor); Hurray records no memory for it either way.
    S = fws(src)
    base = S.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    x = base[1:1]
    if src == "cupy":
        assert S.ptr(x) != 0
    t = hb.asarray(x)
    assert t.shape == (0, 4)
    assert (t.data_ptr, t.nbytes) == (0, 0)
    for dst in ("torch", "cupy", "jax"):
        y = hb.get_adapter(dst).from_hurray(t)
        assert tuple(y.shape) == (0, 4)


def test_empty_host_tensor_to_cupy_allocates_nothing(fws: Any, cupy: Any) -> None:
    C = fws("cupy")
    pool = cupy.get_default_memory_pool()
    a = np.empty((3, 0, 5), np.float32)
    used, total = pool.used_bytes(), pool.total_bytes()
    y = hb.convert(a, "cupy", device=(2, 0), copy=True)
    assert C.is_native(y) and tuple(y.shape) == (3, 0, 5) and C.ptr(y) == 0
    assert (pool.used_bytes(), pool.total_bytes()) == (used, total)
