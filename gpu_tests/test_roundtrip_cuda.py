"""Every ordered pair of torch, JAX and CuPy on one GPU, through the bridge.

For each pair, Tier 1 dtype and layout (empty, rank 0, 2-D, transposed and
step-sliced views) and both paths (``hb.convert`` and ``hb.asarray`` +
``from_hurray``): the values arrive bit-exactly (compared on the host), and
where the hand-off is zero-copy the consumer's data pointer is the producer's.

Zero-copy is promised into torch and CuPy for every layout (both hold any
strided view), and into JAX for compact arrays. JAX has no strided arrays:
a transposed view may arrive zero-copy (XLA takes permuted layouts) and a view
with gaps may be refused (``UnsupportedError``) or copied with a CopyWarning;
what is never allowed is a copy nobody reported, or a silent change of values.
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb
from gpu_tests._fw import LAYOUTS, PAIRS, TIER1, apply_view, np_dtype, reference, same_bits

CUDA0 = hb.Device(2, 0)


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())  # the same data every run


def _convert(x: Any, dst: str, path: str, **kw: Any) -> tuple[Any, bool, hb.Tensor | None]:
    """(result, whether a CopyWarning was raised, the intermediate tensor if visible)."""
    t = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hb.CopyWarning)
        if path == "convert":
            y = hb.convert(x, dst, **kw)
        else:
            t = hb.asarray(x)
            y = hb.get_adapter(dst).from_hurray(t, **kw)
    copied = any(issubclass(w.category, hb.CopyWarning) for w in caught)
    return y, copied, t


@pytest.mark.parametrize("path", ["convert", "asarray"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", TIER1, ids=lambda d: d.name)
@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_roundtrip(fws: Any, src: str, dst: str, dtype: hb.DType, layout: str, path: str) -> None:
    S, D = fws(src), fws(dst)
    for fw in (S, D):
        if not fw.supports(dtype):
            pytest.skip(f"{fw.name} has no {dtype.name} here")
    shape, view = LAYOUTS[layout]
    ref = reference(dtype, shape, _seed(src, dtype.name, layout))
    expected = np.ascontiguousarray(apply_view(ref, view))
    x = S.make(ref, view)
    nonempty = expected.size > 0
    src_ptr = S.ptr(x) if nonempty else None

    try:
        y, copied, t = _convert(x, dst, path)
    except hb.UnsupportedError as exc:
        # Only JAX may refuse, and only a view it cannot alias (gaps) from device memory.
        if dst == "jax" and src != "jax" and view == "step":
            assert "strides" in str(exc), exc
            return
        raise

    if t is not None:
        assert t.device == CUDA0
        assert t.shape == expected.shape and t.dtype is dtype
        if nonempty:
            assert t.data_ptr == src_ptr, "hb.asarray copied a device array"
        else:
            assert (t.data_ptr, t.nbytes) == (0, 0)

    assert D.is_native(y), type(y)
    assert tuple(y.shape) == expected.shape
    assert D.dtype_matches(y, dtype), (y.dtype, dtype)
    assert D.device_index(y) == 0
    host = D.to_numpy(y, np_dtype(dtype))
    assert same_bits(host, expected), f"{src}->{dst} {dtype.name} {layout}: values differ"

    if not nonempty:
        return
    must_alias = dst in ("torch", "cupy") or view is None or src == "jax"
    if must_alias:
        assert not copied, f"{src}->{dst} {dtype.name} {layout}: a copy was reported"
        assert D.ptr(y) == src_ptr, f"{src}->{dst} {dtype.name} {layout}: not zero-copy"
    elif D.ptr(y) != src_ptr:
        assert copied, f"{src}->{dst} {dtype.name} {layout}: copied without a CopyWarning"


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_copy_true_gives_fresh_memory_without_warning(fws: Any, src: str, dst: str) -> None:
    S, D = fws(src), fws(dst)
    ref = reference(hb.float32, (17, 33), 7)
    x = S.make(ref, None)
    y, copied, _ = _convert(x, dst, "convert", copy=True)
    assert not copied, "copy=True asked for the copy: no CopyWarning"
    assert D.ptr(y) != S.ptr(x)
    assert same_bits(D.to_numpy(y, np.dtype(np.float32)), ref)


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_copy_false_is_zero_copy(fws: Any, src: str, dst: str) -> None:
    S, D = fws(src), fws(dst)
    ref = reference(hb.int32, (5, 7), 11)
    x = S.make(ref, None)
    y = hb.convert(x, dst, copy=False)
    assert D.ptr(y) == S.ptr(x)
    assert same_bits(D.to_numpy(y, np.dtype(np.int32)), ref)


@pytest.mark.parametrize("src", ["torch", "cupy"])
def test_copy_false_refuses_gaps_into_jax(fws: Any, src: str) -> None:
    S = fws(src)
    fws("jax")
    x = S.make(reference(hb.float32, (17, 33), 3), "step")
    with pytest.raises((hb.CopyRequiredError, hb.UnsupportedError)):
        hb.convert(x, "jax", copy=False)


# ---------------------------------------------------------------- CuPy specifics
def test_cupy_to_hurray_copy_true_owns_a_copy(fws: Any) -> None:
    C = fws("cupy")
    x = C.make(reference(hb.float64, (6, 4), 5), None)
    t = hb.get_adapter("cupy").to_hurray(x, copy=True)
    assert t.copied and t.device == CUDA0 and t.data_ptr != C.ptr(x)
    y = hb.get_adapter("cupy").from_hurray(t)
    assert C.ptr(y) == t.data_ptr
    assert same_bits(C.to_numpy(y, np.dtype(np.float64)), C.to_numpy(x, np.dtype(np.float64)))


def test_host_tensor_to_cupy_is_a_reported_copy(fws: Any) -> None:
    C = fws("cupy")
    a = reference(hb.int16, (9, 8), 1)[:, ::2]  # a strided host view
    t = hb.asarray(a)
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        hb.get_adapter("cupy").from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="copied for cupy"):
        y = hb.convert(a, "cupy")
    assert C.is_native(y) and C.device_index(y) == 0
    assert same_bits(C.to_numpy(y, a.dtype), np.ascontiguousarray(a))
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        y2 = hb.convert(a, "cupy", copy=True)
    assert same_bits(C.to_numpy(y2, a.dtype), np.ascontiguousarray(a))


def test_cupy_device_argument_on_the_same_device_is_zero_copy(fws: Any, cupy: Any) -> None:
    C = fws("cupy")
    x = C.make(reference(hb.uint8, (10,), 2), None)
    t = hb.asarray(x)
    for device in (0, cupy.cuda.Device(0), "cuda:0", (2, 0)):
        y = hb.get_adapter("cupy").from_hurray(t, device=device, copy=False)
        assert C.ptr(y) == C.ptr(x)


def test_cupy_rejects_types_it_cannot_hold(fws: Any, torch: Any) -> None:
    fws("cupy")
    T = fws("torch")
    x = T.m.zeros(4, dtype=T.m.uint8, device="cuda").view(T.m.float8_e4m3fn)
    with pytest.raises(hb.UnsupportedError, match=r"CuPy has no dtype for float8_e4m3fn"):
        hb.convert(x, "cupy")


def test_cupy_lifetime_memory_freed_after_last_consumer(fws: Any, cupy: Any) -> None:
    C = fws("cupy")
    fws("torch")
    pool = cupy.get_default_memory_pool()
    n = 1 << 20
    x = cupy.arange(n, dtype=cupy.float64)
    used = pool.used_bytes()
    y = hb.convert(x, "torch")
    assert y.data_ptr() == C.ptr(x)
    del x
    import gc

    gc.collect()
    assert pool.used_bytes() == used, "the torch view must keep CuPy's memory alive"
    assert float(y[-1].item()) == n - 1
    del y
    gc.collect()
    assert pool.used_bytes() == used - 8 * n, "CuPy's memory outlived its last consumer"


# ------------------------------------------------------------------- two GPUs
@pytest.mark.multi_gpu
@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_tensor_on_non_current_device(fws: Any, src: str, dst: str, torch: Any) -> None:
    # A producer's array on cuda:1 while cuda:0 is current: the result stays on cuda:1.
    S, D = fws(src), fws(dst)
    ref = reference(hb.float32, (8, 8), 4)
    if src == "torch":
        x = torch.from_numpy(ref).to("cuda:1")
    elif src == "cupy":
        with S.m.cuda.Device(1):
            x = S.m.asarray(ref)
    else:
        x = S.m.device_put(ref, S.m.devices("gpu")[1])
    torch.cuda.set_device(0)
    y = hb.convert(x, dst)
    assert D.device_index(y) == 1
    assert D.ptr(y) == S.ptr(x)
    assert same_bits(D.to_numpy(y, np.dtype(np.float32)), ref)


@pytest.mark.multi_gpu
@pytest.mark.usefixtures("two_gpus")
def test_cupy_device_argument_moves_between_gpus(fws: Any) -> None:
    C = fws("cupy")
    ref = reference(hb.float32, (8, 8), 4)
    x = C.make(ref, None)
    t = hb.asarray(x)
    with pytest.raises(hb.CopyRequiredError):
        hb.get_adapter("cupy").from_hurray(t, device=1, copy=False)
    with pytest.warns(hb.CopyWarning):
        y = hb.get_adapter("cupy").from_hurray(t, device=1)
    assert C.device_index(y) == 1
    assert same_bits(C.to_numpy(y, np.dtype(np.float32)), ref)
