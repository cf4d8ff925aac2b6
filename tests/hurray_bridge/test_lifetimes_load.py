"""Lifetimes under load (issue 9): flat memory, every source freed after its last
consumer, and the capsule mishaps -- consumed twice, wrongly named, a raising
deleter -- handled every time, thousands of times.

The long run (1,000,000 cycles) is ``scripts/soak_lifetimes.py``; this file
runs the same engine with a small count, and each mishap in a loop.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import pathlib
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule
from hurray_bridge import _dlpack as D
from tests.frameworks import Backend

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads RSS from /proc/self/statm")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _soak_module() -> Any:
    key = "_hb_soak_lifetimes"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "scripts" / "soak_lifetimes.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def rss_mib() -> float:
    return _soak_module().rss_kib() / 1024


def exports() -> int:
    return _capsule.live_exports()


# ------------------------------------------------------------------ the engine
def test_cycles_across_frameworks_balance_and_stay_flat() -> None:
    soak = _soak_module()
    with soak.Soak() as s:
        res = s.run(24_000, sample=4_000, warmup=8_000)
    c = res.counts
    assert res.problems(max_growth_mib=8) == [], res.report()
    assert c.sources_made == c.sources_freed == 24_000
    assert c.capsules_consumed == c.foreign_deleters_run > 0
    assert c.exports_made > 0 and res.exports_live_after == res.exports_live_before
    assert c.values_checked == 24_000 // 16


# ------------------------------------------------- sources outlive their consumers
def _ptr(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    if isinstance(x, torch.Tensor):
        return int(x.data_ptr())
    if isinstance(x, jax.Array):
        return int(x.unsafe_buffer_pointer())
    return int(x.buffers()[1].address)


def _values(x: Any) -> list[float]:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, pa.Array):
        return x.to_pylist()
    return np.asarray(x).tolist()


FWS = ("numpy", "torch", "jax", "arrow")


@pytest.mark.parametrize("backend", FWS, indirect=True)
@pytest.mark.parametrize("dst_fw", FWS)
def test_source_freed_exactly_after_its_last_consumer(frozen_heap: None, backend: Backend,
                                                      dst_fw: str) -> None:
    src_fw = backend.name
    expected = (np.arange(64, dtype=np.float32) + 7).tolist()
    before = exports()
    src = backend.array(np.arange(64, dtype=np.float32) + 7)
    # What holds the source's memory: a torch export keeps the tensor's storage, not the
    # tensor object, so that x.set_() or x.data = y cannot free the memory it shares.
    ref = weakref.ref(src.untyped_storage() if src_fw == "torch" else src)
    src_ptr = _ptr(src)
    t = hb.asarray(src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CopyWarning: JAX copies 16-byte aligned NumPy
        out = hb.convert(t, dst_fw)
    shared = _ptr(out) == src_ptr
    del src, t
    gc.collect()
    if shared:  # the consumer reads the source's memory: the source must still be alive
        assert ref() is not None, f"{src_fw} source freed while a {dst_fw} consumer shares it"
    assert _values(out) == expected
    del out
    gc.collect()
    assert ref() is None, f"{src_fw} source still alive after its {dst_fw} consumer died"
    assert exports() == before


def test_chain_of_consumers_keeps_the_first_source() -> None:
    # numpy -> torch -> jax -> arrow -> numpy, each hop zero-copy where it can be; only
    # the last consumer survives, and it alone must keep the NumPy memory alive.
    a = np.arange(256, dtype=np.float32).reshape(16, 16)[:, :8].copy()
    base = hb.asarray(a)
    ref = weakref.ref(a)
    x: Any = a
    del a
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fw in ("torch", "jax", "arrow", "numpy"):
            x = hb.convert(hb.asarray(x) if fw != "arrow" else hb.asarray(x).copy(), fw)
    del base
    gc.collect()
    assert np.asarray(x).reshape(-1).tolist() == np.arange(256, dtype=np.float32).reshape(
        16, 16)[:, :8].reshape(-1).tolist()
    del x
    gc.collect()
    assert ref() is None


# ------------------------------------------------------- capsule consumed twice
class SameCapsule:
    """A broken producer: hands out the same capsule every time."""

    def __init__(self, x: Any) -> None:
        self.capsule = x.__dlpack__(max_version=(1, 3))

    def __dlpack__(self, **kw: Any) -> object:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_capsule_consumed_twice_under_load() -> None:
    before, rss0 = exports(), None
    for i in range(3_000):
        src = torch.arange(16, dtype=torch.float32) + i
        ref = weakref.ref(src)
        p = SameCapsule(src)
        del src
        t = hb.from_dlpack(p)
        with pytest.raises(hb.FormatError, match="already consumed"):
            hb.from_dlpack(p)
        assert t.memoryview().cast("f")[0] == i
        del p, t
        assert ref() is None  # the producer's deleter ran once: nothing holds the tensor
        if i == 500:
            gc.collect()
            rss0 = rss_mib()
    gc.collect()
    assert rss0 is not None and rss_mib() - rss0 < 4
    assert exports() == before


def test_our_export_consumed_twice_by_frameworks() -> None:
    # torch and NumPy refuse a capsule we already handed out; our export stays balanced.
    before = exports()
    for _ in range(500):
        t = hb.asarray(np.arange(8, dtype=np.float32))
        cap = t.__dlpack__(max_version=(1, 3))
        first = torch.from_dlpack(cap)
        with pytest.raises(Exception, match=r"(?i)used|consumed|capsule"):
            torch.from_dlpack(cap)
        assert first.tolist() == list(range(8))
        del first, cap, t
    gc.collect()
    assert exports() == before


# ----------------------------------------------------------- wrongly named capsules
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                                   ctypes.c_void_p)(("PyCapsule_New", ctypes.pythonapi))
_NAMES = (b"dltensor_version", b"DLTENSOR", b"used_dltensor_versioned", b"\xff\xfe garbage")


def test_wrong_capsule_names_under_load() -> None:
    from tests.broken_producers import LIVE, WrongCapsuleName

    live = len(LIVE)
    for i in range(2_000):
        p = WrongCapsuleName(np.arange(4.0) + i)
        with pytest.raises(hb.FormatError, match="dltensor_version"):
            hb.from_dlpack(p)
        # Not ours to take: the capsule keeps its name, and the producer's own capsule
        # destructor frees the struct when the capsule dies.
        cap = p.__dlpack__(max_version=(1, 3))
        with pytest.raises(hb.FormatError, match="not a DLPack tensor capsule"):
            _capsule.consume_capsule(cap)
        assert _capsule.capsule_name(cap) == "dltensor_version"
        del cap, p
        name = _NAMES[i % len(_NAMES)]
        odd = _PyCapsule_New(4096, name, None)
        with pytest.raises(hb.FormatError, match=r"already consumed|not a DLPack"):
            _capsule.consume_capsule(odd)
    gc.collect()
    assert len(LIVE) == live


# ------------------------------------------------------------ raising deleters
_calls: list[int] = []


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _raising_deleter(p: int | None) -> None:
    _calls.append(p or 0)
    raise RuntimeError("deleter failed on purpose")


class RaisingDeleterProducer:
    """A versioned CPU producer whose deleter raises (after recording the call)."""

    def __init__(self, a: Any) -> None:
        self.a = a
        self.shape = (ctypes.c_int64 * 1)(a.size)
        m = D.DLManagedTensorVersioned()
        m.version.major, m.version.minor = 1, 3
        m.deleter = ctypes.cast(_raising_deleter, D.DLManagedTensorVersionedDeleter)
        t = m.dl_tensor
        t.data = a.ctypes.data
        t.device.device_type, t.device.device_id = 1, 0
        t.ndim = 1
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        self.m = m

    def __dlpack__(self, **kw: Any) -> object:
        return _PyCapsule_New(ctypes.addressof(self.m), D.DLTENSOR_VERSIONED_NAME, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class _Unraisable:
    def __init__(self) -> None:
        self.seen: list[BaseException | None] = []

    def __call__(self, info: Any) -> None:
        self.seen.append(info.exc_value)


def test_foreign_deleter_raising_is_reported_not_propagated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _Unraisable()
    monkeypatch.setattr(sys, "unraisablehook", hook)
    n = 2_000
    start = len(_calls)
    for i in range(n):
        p = RaisingDeleterProducer(np.arange(4, dtype=np.float32) + i)
        t = hb.from_dlpack(p)
        assert t.memoryview().cast("f")[3] == i + 3
        k = len(_calls)
        if i % 2:
            t.owner.release()  # explicitly (the deleter raises inside the callback) ...
            t.owner.release()  # ... and idempotent: never a second call
            assert repr(t.owner) == "<DLPack managed tensor released>"
        del t  # the last reference: the deleter runs here unless it ran above
        assert len(_calls) == k + 1
    assert len(_calls) - start == n  # exactly once each
    assert len(hook.seen) == n
    assert all(isinstance(e, RuntimeError) and "on purpose" in str(e) for e in hook.seen)


class _RaisingOwner:
    """An owner whose finaliser raises: runs inside our export deleter."""

    freed = 0

    def __init__(self, a: Any) -> None:
        self.a = a

    def __del__(self) -> None:
        type(self).freed += 1
        raise RuntimeError("owner finaliser failed on purpose")


@pytest.mark.parametrize("consumer", ["torch", "numpy", "jax"])
def test_our_deleter_survives_a_raising_owner(consumer: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    hook = _Unraisable()
    monkeypatch.setattr(sys, "unraisablehook", hook)
    frm: Callable[[Any], Any] = {"torch": torch.from_dlpack, "numpy": np.from_dlpack,
                                 "jax": jnp.from_dlpack}[consumer]
    before, freed0 = exports(), _RaisingOwner.freed
    n = 300
    for i in range(n):
        a = np.zeros(16, np.float32) + i
        owner = _RaisingOwner(a)
        t = hb.Tensor(hb.Descriptor([16], hb.float32), [hb.Buffer(hb.BufferRole.DATA,
                                                                  a.ctypes.data, 64)],
                      owner=owner)
        del owner
        x = frm(t)
        del t
        assert float(x[5]) == i
        del x  # the consumer calls our deleter, which drops the owner, which raises
    gc.collect()
    assert exports() == before
    assert _RaisingOwner.freed - freed0 == n
    assert len(hook.seen) == n
