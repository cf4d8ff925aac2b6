"""The DLPack engine end to end: producers x consumers through hb.from_dlpack and hb.Tensor.

Producers: NumPy, torch, JAX, pyarrow and the hand-built ones in
``dlpack_producers``. Consumers: ``numpy.from_dlpack``, ``torch.from_dlpack``,
``jax.numpy.from_dlpack`` and ``hb.from_dlpack`` itself, all fed an hb.Tensor.
"""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge._capsule import capsule_name
from tests.dlpack_producers import ByteOffsetProducer, DLPackOnly, IgnoresMaxVersion, LegacyOnly
from tests.frameworks import need, optional

np = pytest.importorskip("numpy", reason="numpy is not installed")
# The other frameworks are optional: a test that takes or makes their arrays asks for them.
torch = optional("torch")
jnp = optional("jax.numpy")
pa = optional("pyarrow")


def _ptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _aligned(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A NumPy array whose data starts on a 64-byte boundary (so JAX can alias it)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 64, np.uint8)
    off = -_ptr(raw) % 64
    a = raw[off:off + n].view(dtype).reshape(shape)
    a[...] = np.arange(a.size, dtype=np.int64).reshape(shape).astype(dtype) if a.size else a
    return a


SHAPES: dict[str, Callable[[], np.ndarray]] = {
    "empty_0": lambda: _aligned((0,)),
    "empty_3_0_5": lambda: _aligned((3, 0, 5)),
    "rank_0": lambda: _aligned(()),
    "2x3": lambda: _aligned((2, 3)),
    "rank_64": lambda: _aligned((1,) * 62 + (2, 3)),
    "transposed": lambda: _aligned((3, 4)).T,
    "negative": lambda: _aligned((3, 4))[::-1, ::2],
    # writable, so that legacy (flag-less) producers may export it too
    "zero_stride": lambda: np.lib.stride_tricks.as_strided(_aligned((4,)), (3, 4), (0, 4)),
}

PRODUCERS: dict[str, Callable[[np.ndarray], Any]] = {
    "numpy": lambda a: a,
    "dlpack_only": DLPackOnly,
    "legacy_only": LegacyOnly,
    "ignores_max_version": IgnoresMaxVersion,
    "byte_offset": ByteOffsetProducer,
}


def _check_values(out: Any, ref: np.ndarray) -> None:
    got = np.asarray(out.numpy() if torch and isinstance(out, torch.Tensor) else out)
    assert got.shape == ref.shape
    assert got.tobytes() == np.ascontiguousarray(ref).tobytes()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("producer", PRODUCERS)
def test_import_is_zero_copy_and_exact(producer: str, shape: str) -> None:
    ref = SHAPES[shape]()
    t = hb.from_dlpack(PRODUCERS[producer](ref))
    assert t.shape == ref.shape and t.dtype is hb.float32
    if ref.size == 0:
        assert t.buffers == (hb.Buffer(hb.BufferRole.DATA, 0, 0),) and t.data_ptr == 0
        assert t.descriptor.layout == hb.Layout.ROW_MAJOR and t.nbytes == 0
    else:
        assert t.data_ptr == _ptr(ref)  # zero-copy, byte_offset folded in
        compact = ref.flags.c_contiguous
        assert (t.strides is None) == compact
        if not compact:
            assert t.descriptor.layout == hb.Layout.STRIDED
            assert t.strides == tuple(s // 4 for s in ref.strides)
    _check_values(np.from_dlpack(t), ref)


def test_legacy_fallback_retries_without_max_version() -> None:
    p = LegacyOnly(_aligned((4,)))
    hb.from_dlpack(p)
    assert len(p.calls) == 1  # the first call raised TypeError inside Python: not recorded


def test_producer_ignoring_max_version_is_accepted() -> None:
    p = IgnoresMaxVersion(_aligned((4,)))
    t = hb.from_dlpack(p)
    assert p.calls[0]["max_version"] is not None and t.shape == (4,)


CONSUMERS: dict[str, Callable[[Any], Any]] = {
    "numpy": np.from_dlpack,
    "torch": lambda t: torch.from_dlpack(t),
    "jax": lambda t: jnp.from_dlpack(t),
    "hb": lambda t: hb.from_dlpack(DLPackOnly(t)),
}


def _consumer_ptr(out: Any) -> int:
    if torch and isinstance(out, torch.Tensor):
        return out.data_ptr()
    if isinstance(out, hb.Tensor):
        return out.data_ptr
    if isinstance(out, np.ndarray):
        return _ptr(out)
    return out.unsafe_buffer_pointer()


# What a consumer cannot take, and why (one table; nothing here is silently skipped).
KNOWN_GAPS: dict[tuple[str, str], str] = {
    ("torch", "negative"): "torch 2.13 aborts the process on negative strides (pytorch#188023)",
    ("jax", "negative"): "XLA accepts only permutations of compact layouts",
    ("jax", "zero_stride"): "XLA accepts only permutations of compact layouts",
}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("consumer", CONSUMERS)
def test_consumers_accept_hb_tensor(consumer: str, shape: str) -> None:
    if consumer in ("torch", "jax"):
        need(consumer)
    ref = SHAPES[shape]()
    t = hb.from_dlpack(ref)
    gap = KNOWN_GAPS.get((consumer, shape))
    if gap and consumer == "torch":
        pytest.skip(gap)  # cannot even be tried in-process
    if gap:
        with pytest.raises(Exception):  # noqa: B017 - the framework's own error type
            CONSUMERS[consumer](t)
        return
    out = CONSUMERS[consumer](t)
    _check_values(out, ref)
    if ref.size and consumer != "jax":
        assert _consumer_ptr(out) == _ptr(ref)
    if ref.size and consumer == "jax" and ref.flags.c_contiguous:
        assert _consumer_ptr(out) == _ptr(ref)  # 64-byte aligned: JAX aliases


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4),
    lambda: torch.arange(12, dtype=torch.float32).reshape(3, 4).T,
    lambda: torch.empty(3, 0, 5),
    lambda: torch.tensor(2.5),
], ids=["torch_2d", "torch_T", "torch_empty", "torch_scalar"])
def test_torch_producer(make: Callable[[], torch.Tensor]) -> None:
    need("torch")
    x = make()
    t = hb.from_dlpack(x)
    assert t.shape == tuple(x.shape)
    assert t.data_ptr == (x.data_ptr() if x.numel() else 0)
    np.testing.assert_array_equal(np.from_dlpack(t), x.numpy())


def test_jax_producer_answers_legacy_and_imports_zero_copy() -> None:
    need("jax")
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    assert capsule_name(x.__dlpack__(max_version=(1, 0))) == "dltensor"
    t = hb.from_dlpack(x)
    assert t.data_ptr == x.unsafe_buffer_pointer() and not t.copied
    np.testing.assert_array_equal(np.from_dlpack(t), np.asarray(x))


def test_pyarrow_producer() -> None:
    need("arrow")
    arr = pa.array([1.5, 2.5, 3.5], pa.float64())[1:]
    t = hb.from_dlpack(arr)
    assert t.data_ptr == arr.buffers()[1].address + 8
    assert np.from_dlpack(t).tolist() == [2.5, 3.5]


def test_readonly_numpy_source_is_readonly_everywhere_that_honours_it() -> None:
    a = _aligned((4,))
    a.flags.writeable = False
    t = hb.from_dlpack(a)
    assert t.readonly
    assert not np.from_dlpack(t).flags.writeable  # versioned capsule carries READ_ONLY
    assert hb.from_dlpack(t).readonly is not False


def test_copy_true_always_copies_and_says_so() -> None:
    a = _aligned((2, 3))
    t = hb.from_dlpack(a, copy=True)
    assert t.copied and t.data_ptr != _ptr(a) and t.data_ptr % 64 == 0
    np.testing.assert_array_equal(np.from_dlpack(t), a)
    out = np.from_dlpack(hb.from_dlpack(a), copy=True)
    assert _ptr(out) != _ptr(a)


def test_export_copy_false_never_copies() -> None:
    a = _aligned((5,))
    out = np.from_dlpack(hb.from_dlpack(a), copy=False)
    assert _ptr(out) == _ptr(a)


def test_export_versioned_or_legacy_by_max_version() -> None:
    t = hb.from_dlpack(_aligned((3,)))
    assert capsule_name(t.__dlpack__()) == "dltensor"
    assert capsule_name(t.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"


def test_export_to_other_device_is_refused() -> None:
    t = hb.from_dlpack(_aligned((3,)))
    with pytest.raises(BufferError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(hb.CopyRequiredError):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0), copy=False)
    assert t.__dlpack_device__() == (1, 0)
    # the host itself is fine
    assert capsule_name(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))) == "dltensor_versioned"


def test_export_stream_on_cpu_must_be_none() -> None:
    t = hb.from_dlpack(_aligned((3,)))
    with pytest.raises(BufferError, match="stream must be None"):
        t.__dlpack__(stream=5)


def test_empty_export_has_null_pointer() -> None:
    need("torch")
    t = hb.from_dlpack(torch.empty(3, 0, 5))
    back = hb.from_dlpack(t)
    assert back.data_ptr == 0 and back.shape == (3, 0, 5)
    assert torch.from_dlpack(t).data_ptr() == 0


def test_source_alive_while_export_lives_and_freed_after() -> None:
    need("torch")
    x = torch.arange(10, dtype=torch.float32)
    ref = weakref.ref(x)
    t = hb.from_dlpack(x)
    out = np.from_dlpack(t)
    del x, t
    gc.collect()
    assert ref() is not None and out[3] == 3.0
    del out
    gc.collect()
    assert ref() is None


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def test_import_export_cycles_do_not_leak() -> None:
    a = np.arange(16, dtype=np.float32)
    for _ in range(2000):  # warm up caches and allocators
        np.from_dlpack(hb.from_dlpack(a))
    gc.collect()
    before = _rss_kib()
    # The bound is per cycle: 1 MiB over 25k cycles catches a leak of 42 bytes a cycle
    # (a leaked capsule or shape array is more); a clean run grows by nothing.
    for _ in range(25_000):
        np.from_dlpack(hb.from_dlpack(a))
    gc.collect()
    grown = _rss_kib() - before
    assert grown < 1024, f"RSS grew by {grown} KiB over 25k cycles"
