"""hurray_bridge._capsule against real producers and consumers, and hand-built capsules.

Hand-built capsules (plain ctypes structs and a counting deleter) reach the
corners no framework produces: non-zero byte_offset, NULL strides, bad
versions, vector types, oversized ranks.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hurray_bridge import _capsule as C
from hurray_bridge import _dlpack as D
from hurray_bridge import dtypes as hbd
from hurray_bridge.errors import FormatError, UnsupportedError
from tests.native import shared_library

np = pytest.importorskip("numpy")

unraisable_ok = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# -- helpers -------------------------------------------------------------------------------

_PyCapsule_New = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_PyCapsule_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)
# Capsule names must outlive the capsules: module-level constants.
_V, _L = D.DLTENSOR_VERSIONED_NAME, D.DLTENSOR_NAME
_USED_V = D.USED_DLTENSOR_VERSIONED_NAME
_ODD_NAME = b"not_a_tensor"

_deleted: list[int] = []


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _counting_deleter(p: int | None) -> None:
    _deleted.append(p or 0)


class HandBuilt:
    """A managed tensor built field by field; its deleter records the struct's address."""

    def __init__(
        self,
        *,
        versioned: bool = True,
        shape: tuple[int, ...] = (4,),
        strides: tuple[int, ...] | None = (1,),
        ndim: int | None = None,
        data: int = 0,
        byte_offset: int = 0,
        code: int = 2,
        bits: int = 32,
        lanes: int = 1,
        major: int = 1,
        flags: int = 0,
        shape_null: bool = False,
    ) -> None:
        self.versioned = versioned
        self.struct: Any = D.DLManagedTensorVersioned() if versioned else D.DLManagedTensor()
        m = self.struct
        if versioned:
            m.version.major, m.version.minor = major, 3
            m.flags = flags
            m.deleter = ctypes.cast(_counting_deleter, D.DLManagedTensorVersionedDeleter)
        else:
            m.deleter = ctypes.cast(_counting_deleter, D.DLManagedTensorDeleter)
        t = m.dl_tensor
        t.data = data or None
        t.device.device_type, t.device.device_id = 1, 0
        t.ndim = len(shape) if ndim is None else ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        n = max(len(shape), 1)
        self.shape = (ctypes.c_int64 * n)(*shape)
        self.strides = (ctypes.c_int64 * n)(*(strides or ()))
        i64p = ctypes.POINTER(ctypes.c_int64)
        if not shape_null:
            t.shape = ctypes.cast(self.shape, i64p)
        if strides is not None:
            t.strides = ctypes.cast(self.strides, i64p)
        t.byte_offset = byte_offset
        self.address = ctypes.addressof(m)
        self._before = _deleted.count(self.address)  # addresses get reused across tests

    def capsule(self) -> object:
        return _PyCapsule_New(self.address, _V if self.versioned else _L, None)

    def deleted(self) -> int:
        return _deleted.count(self.address) - self._before


class Owner:
    """An owner whose death is observable through a weak reference."""

    def __init__(self, payload: object = None) -> None:
        self.payload = payload


class Producer:
    """A minimal __dlpack__ producer built on make_capsule over a NumPy array."""

    def __init__(self, array: Any, owner: object, *, flags: int = 0) -> None:
        self.array = array
        self.owner = owner
        self.flags = flags
        self.requests: list[dict[str, Any]] = []

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> object:
        self.requests.append(
            {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
        )
        a = self.array
        code, bits = _np_code(a.dtype)
        return C.make_capsule(
            data=a.ctypes.data,
            shape=a.shape,
            strides=tuple(s // a.itemsize for s in a.strides),
            code=code,
            bits=bits,
            device_type=1,
            device_id=0,
            flags=self.flags,
            owner=self.owner,
            versioned=max_version is not None and max_version[0] >= 1,
        )

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def _np_code(dtype: Any) -> tuple[int, int]:
    kind = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}[dtype.kind]
    return kind, dtype.itemsize * 8


def aligned(nbytes: int, align: int = 64) -> Any:
    """A uint8 array of nbytes whose data address is a multiple of align."""
    raw = np.zeros(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


def collect() -> None:
    gc.collect()


def exports() -> int:
    return C.live_exports()


# -- consuming real producers --------------------------------------------------------------


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_numpy_producer(max_version: tuple[int, int] | None) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    cap = a.__dlpack__(max_version=max_version) if max_version else a.__dlpack__()
    v = C.consume_capsule(cap)
    assert v.versioned is (max_version is not None)
    assert v.data == a.ctypes.data
    assert v.shape == (3, 4)
    # NumPy 2.2 and 2.3 export compact arrays with NULL strides (DLPack: row-major).
    assert v.strides in ((4, 1), None)
    assert (v.code, v.bits, v.lanes) == (hbd.DLPACK_CODE.kDLFloat, 32, 1)
    assert (v.device_type, v.device_id) == (D.DLDeviceType.kDLCPU, 0)
    assert v.flags == 0
    assert C.capsule_name(cap) == ("used_dltensor_versioned" if max_version else "used_dltensor")


@pytest.mark.parametrize(
    "make_view, strides",
    [
        (lambda a: a.T, (1, 4)),
        (lambda a: a[:, ::-1], (4, -1)),
        (lambda a: a[::-2, 1:3], (-8, 1)),
        (lambda a: np.broadcast_to(a[0], (5, 4)), (0, 1)),
    ],
    ids=["transposed", "negative", "negative-gapped", "zero-stride"],
)
def test_numpy_strided_views(make_view: Any, strides: tuple[int, ...]) -> None:
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    view = make_view(a)
    # broadcast views are read-only: NumPy only exports them in versioned capsules
    v = C.consume_capsule(view.__dlpack__(max_version=(1, 3)))
    assert v.data == view.ctypes.data  # the address of element [0, 0]
    assert v.shape == view.shape
    assert v.strides == strides


def test_numpy_dtype_codes() -> None:
    for d in hbd.all_dtypes():
        if d.numpy is None or not d.numpy.startswith("numpy:") or d.dlpack is None:
            continue
        a = np.zeros(3, dtype=getattr(np, d.numpy.split(":")[1]))
        v = C.consume_capsule(a.__dlpack__(max_version=(1, 3)))
        assert (v.code, v.bits, v.lanes) == (*d.dlpack, 1), d.name


def test_numpy_read_only_sets_flag_in_versioned_capsule() -> None:
    a = np.arange(4.0)
    a.flags.writeable = False
    v = C.consume_capsule(a.__dlpack__(max_version=(1, 3)))
    assert v.flags & D.FLAG_READ_ONLY
    # NumPy refuses a legacy capsule for read-only data: there is no flag to carry it.
    with pytest.raises(BufferError):
        a.__dlpack__()


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_torch_producer(max_version: tuple[int, int] | None) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.float64).reshape(3, 4).T
    cap = t.__dlpack__(max_version=max_version) if max_version else t.__dlpack__()
    v = C.consume_capsule(cap)
    assert v.versioned is (max_version is not None)
    assert v.data == t.data_ptr()
    assert v.shape == (4, 3)
    assert v.strides == (1, 4)
    assert (v.code, v.bits, v.lanes) == (2, 64, 1)
    assert v.flags == 0


def test_torch_dtype_codes() -> None:
    torch = pytest.importorskip("torch")
    for d in hbd.all_dtypes():
        if d.torch is None or d.dlpack is None or d.is_subbyte:
            continue
        dtype = getattr(torch, d.torch, None)
        if dtype is None:
            continue
        t = torch.zeros(3, dtype=dtype)
        try:
            cap = t.__dlpack__(max_version=(1, 3))
        except (BufferError, RuntimeError, TypeError):
            continue  # torch cannot export this type through DLPack
        v = C.consume_capsule(cap)
        assert (v.code, v.bits, v.lanes) == (*d.dlpack, 1), d.name


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_jax_producer_answers_legacy(max_version: tuple[int, int] | None) -> None:
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    cap = x.__dlpack__(max_version=max_version) if max_version else x.__dlpack__()
    assert C.capsule_name(cap) == "dltensor"  # JAX ignores max_version
    v = C.consume_capsule(cap)
    assert v.versioned is False
    assert v.flags == 0
    assert v.data == x.unsafe_buffer_pointer()
    assert (v.shape, v.strides) == ((3, 4), (4, 1))
    assert (v.code, v.bits) == (2, 32)


@pytest.mark.filterwarnings("ignore:Exporting an unversioned DLPack capsule:DeprecationWarning")
@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_pyarrow_producer(max_version: tuple[int, int] | None) -> None:
    pa = pytest.importorskip("pyarrow")
    arr = pa.array([1, 2, 3, 4, 5], pa.int32())
    for sub, offset in ((arr, 0), (arr[2:], 8)):
        cap = sub.__dlpack__(max_version=max_version) if max_version else sub.__dlpack__()
        v = C.consume_capsule(cap)
        assert v.data == arr.buffers()[1].address + offset
        assert v.shape == (len(sub),)
        assert v.strides == (1,)
        assert (v.code, v.bits) == (0, 32)
        assert v.versioned is (max_version is not None)
        if v.versioned and int(pa.__version__.split(".")[0]) >= 26:
            assert v.flags & D.FLAG_READ_ONLY  # Arrow memory is immutable


def test_empty_tensors_normalise_to_null() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(0, 3)
    assert C.consume_capsule(t.__dlpack__(max_version=(1, 3))).data == 0  # torch sends NULL
    a = np.zeros((0, 3))
    assert a.ctypes.data != 0  # NumPy allocates even for no elements...
    v = C.consume_capsule(a.__dlpack__(max_version=(1, 3)))
    assert v.data == 0  # ...and the view says there is nothing to point at
    assert v.shape == (0, 3)
    b = np.arange(6.0)[3:3]  # an empty slice into live memory
    assert C.consume_capsule(b.__dlpack__()).data == 0


@pytest.mark.parametrize("max_version", [None, (1, 3)])
def test_rank_zero(max_version: tuple[int, int] | None) -> None:
    a = np.array(2.5)
    cap = a.__dlpack__(max_version=max_version) if max_version else a.__dlpack__()
    v = C.consume_capsule(cap)
    assert (v.shape, v.strides) == ((), ())
    assert v.data == a.ctypes.data


def test_rank_64() -> None:
    a = np.ones((1,) * 64, dtype=np.float32)
    v = C.consume_capsule(a.__dlpack__(max_version=(1, 3)))
    assert v.shape == (1,) * 64
    assert v.strides is None or len(v.strides) == 64  # NULL: NumPy 2.2 and 2.3
    assert v.data == a.ctypes.data


def test_request_then_consume_real_producers() -> None:
    a = np.arange(3.0)
    v = C.consume_capsule(C.request_capsule(a))
    assert v.versioned and v.data == a.ctypes.data
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.arange(3.0)
    v = C.consume_capsule(C.request_capsule(x))
    assert not v.versioned and v.data == x.unsafe_buffer_pointer()


# -- hand-built capsules ---------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [True, False])
def test_byte_offset_is_folded_into_data(versioned: bool) -> None:
    base = np.arange(8, dtype=np.float32)
    hb = HandBuilt(versioned=versioned, data=base.ctypes.data, byte_offset=16, shape=(4,))
    v = C.consume_capsule(hb.capsule())
    assert v.data == base.ctypes.data + 16
    del v
    collect()
    assert hb.deleted() == 1


def test_null_strides_are_accepted() -> None:
    base = np.zeros(6, np.float32)
    hb = HandBuilt(data=base.ctypes.data, shape=(2, 3), strides=None)
    v = C.consume_capsule(hb.capsule())
    assert v.strides is None
    assert v.shape == (2, 3)


def test_hand_built_flags_pass_through() -> None:
    base = np.zeros(4, np.float32)
    flags = D.FLAG_READ_ONLY | D.FLAG_IS_COPIED
    hb = HandBuilt(data=base.ctypes.data, flags=flags)
    v = C.consume_capsule(hb.capsule())
    assert v.flags == flags


def test_null_data_with_elements_is_refused() -> None:
    # buffer-protocol.md §1: only a tensor without elements may have NULL data.
    hb = HandBuilt(data=0, shape=(4,))
    with pytest.raises(FormatError, match="data: NULL data pointer"):
        C.consume_capsule(hb.capsule())
    assert hb.deleted() == 1
    empty = HandBuilt(data=0, shape=(4, 0), strides=(1, 1))
    v = C.consume_capsule(empty.capsule())
    assert v.data == 0 and v.shape == (4, 0)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"major": 2}, UnsupportedError, ["2.3", "major"]),
        ({"major": 0}, UnsupportedError, ["0.3"]),
        ({"lanes": 4}, UnsupportedError, ["lanes 4"]),
        ({"shape": (1,) * 65}, FormatError, ["65", "64"]),
        ({"shape": (2,), "ndim": -1}, FormatError, ["-1", "64"]),
        ({"shape": (3, -2)}, FormatError, ["negative", "-2"]),
        ({"shape": (3,), "shape_null": True}, FormatError, ["NULL shape"]),
    ],
    ids=["major-2", "major-0", "lanes", "rank-65", "rank-negative", "negative-dim", "null-shape"],
)
def test_invalid_capsules_run_the_deleter_once(
    kwargs: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    kwargs.setdefault("strides", None)
    hb = HandBuilt(**kwargs)
    cap = hb.capsule()
    with pytest.raises(error) as info:
        C.consume_capsule(cap)
    for w in words:
        assert w in str(info.value)
    assert hb.deleted() == 1
    assert C.capsule_name(cap) == "used_dltensor_versioned"  # ownership was taken
    collect()
    assert hb.deleted() == 1


def test_legacy_invalid_capsule_runs_the_deleter_once() -> None:
    hb = HandBuilt(versioned=False, lanes=2)
    with pytest.raises(UnsupportedError):
        C.consume_capsule(hb.capsule())
    assert hb.deleted() == 1


def test_capsule_consumed_twice() -> None:
    cap = np.arange(3.0).__dlpack__(max_version=(1, 3))
    C.consume_capsule(cap)
    with pytest.raises(FormatError, match="already consumed"):
        C.consume_capsule(cap)
    legacy = np.arange(3.0).__dlpack__()
    C.consume_capsule(legacy)
    with pytest.raises(FormatError, match="already consumed"):
        C.consume_capsule(legacy)


def test_wrong_capsule_name_and_non_capsules() -> None:
    odd = _PyCapsule_New(1234, _ODD_NAME, None)
    with pytest.raises(FormatError, match="not_a_tensor"):
        C.consume_capsule(odd)
    assert C.capsule_name(odd) == "not_a_tensor"
    with pytest.raises(FormatError, match="list"):
        C.consume_capsule([1, 2])
    with pytest.raises(ValueError):  # FormatError is a ValueError
        C.consume_capsule(b"dltensor")
    assert C.capsule_name(object()) is None
    assert C.capsule_name(np.arange(2).__dlpack__()) == "dltensor"


# -- ownership --------------------------------------------------------------------------------


def test_numpy_base_lives_as_long_as_the_view_owner() -> None:
    a = np.arange(10.0)
    ref = weakref.ref(a)
    cap = a.__dlpack__(max_version=(1, 3))
    del a
    v = C.consume_capsule(cap)
    del cap
    collect()
    assert ref() is not None  # the consumed tensor keeps the array alive
    owner = v.owner
    del v
    collect()
    assert ref() is not None  # the owner alone is enough
    del owner
    collect()
    assert ref() is None


def test_make_consume_runs_deleter_exactly_once() -> None:
    before = exports()
    for versioned in (True, False):
        owner = Owner()
        ref = weakref.ref(owner)
        count = [0]
        weakref.finalize(owner, lambda c=count: c.__setitem__(0, c[0] + 1))
        cap = C.make_capsule(
            data=0, shape=(0,), strides=(1,), code=2, bits=32, device_type=1, device_id=0,
            flags=0, owner=owner, versioned=versioned,
        )  # fmt: skip
        del owner
        v = C.consume_capsule(cap)
        del cap  # the destructor of a consumed capsule must not run the deleter
        collect()
        assert ref() is not None and count[0] == 0
        v.owner.release()  # type: ignore[attr-defined]
        v.owner.release()  # type: ignore[attr-defined]  # idempotent
        assert ref() is None and count[0] == 1
        del v
        collect()
        assert count[0] == 1
    assert exports() == before


@pytest.mark.parametrize("versioned", [True, False])
def test_unconsumed_capsule_releases_owner_once(versioned: bool) -> None:
    before = exports()
    owner = Owner()
    ref = weakref.ref(owner)
    count = [0]
    weakref.finalize(owner, lambda: count.__setitem__(0, count[0] + 1))
    cap = C.make_capsule(
        data=1234, shape=(2,), strides=(1,), code=2, bits=32, device_type=1, device_id=0,
        flags=0, owner=owner, versioned=versioned,
    )  # fmt: skip
    del owner
    collect()
    assert ref() is not None
    assert exports() == before + 1
    del cap
    assert ref() is None and count[0] == 1
    assert exports() == before


def _consumed_export() -> tuple[Any, int, int, weakref.ref[Owner]]:
    """An export consumed as C code does (renamed): (capsule, struct address, its
    deleter's address, a weak reference to the owner nothing else holds)."""
    owner = Owner()
    ref = weakref.ref(owner)
    cap = C.make_capsule(
        data=0, shape=(0,), strides=(1,), code=2, bits=32, device_type=1, device_id=0,
        flags=0, owner=owner, versioned=True,
    )  # fmt: skip
    p = _PyCapsule_GetPointer(cap, _V)
    _PyCapsule_SetName(cap, _USED_V)
    return cap, p, D.DLManagedTensorVersioned.from_address(p).deleter, ref


def test_deleter_called_from_a_thread_without_the_gil() -> None:
    # What XLA's worker threads and C++ consumers do: call the deleter from C, GIL not held.
    cap, p, deleter_addr, ref = _consumed_export()
    call = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
        ctypes.cast(deleter_addr, ctypes.c_void_p).value
    )  # a CFUNCTYPE call releases the GIL around the C call
    t = threading.Thread(target=call, args=(p,))
    t.start()
    t.join()
    collect()
    assert ref() is None
    del cap  # renamed: its destructor must not call the deleter a second time


# What XLA does: it calls DLPack deleters from the noexcept destructors of buffers
# that its C++ worker threads free. This helper runs fn(arg) on such a thread.
_NATIVE_THREAD_SOURCE = """
#include <chrono>
#include <thread>
extern "C" void call_later(void (*fn)(void *), void *arg, int delay_ms) {
    std::thread([=]() noexcept {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        fn(arg);
    }).detach();
}
"""


@pytest.fixture(scope="module")
def native_thread_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return shared_library(tmp_path_factory, "native_thread", _NATIVE_THREAD_SOURCE, cxx=True)


_EXIT_SCRIPT = textwrap.dedent("""
    import atexit, ctypes, sys, time
    if sys.argv[3] == "ctypes":  # the parent runs without the compiled module: so do we
        sys.modules["hurray_bridge._speedups"] = None
    # Registered before hurray_bridge's own exit hook, so it runs after it.
    atexit.register(lambda: print("left at exit:", C.live_exports(), flush=True))
    import numpy as np
    import hurray_bridge as hb
    from hurray_bridge import _capsule as C
    lib = ctypes.CDLL(sys.argv[1])
    lib.call_later.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    a = np.arange(4.0)
    if sys.argv[2] == "waiting, slow release":
        import weakref  # the owner's release drops the GIL (as munmap does) after the pop
        weakref.finalize(a, time.sleep, 0.2).atexit = False
    cap = hb.asarray(a).__dlpack__()
    del a
    p = api.PyCapsule_GetPointer(cap, b"dltensor")
    api.PyCapsule_SetName(cap, b"used_dltensor")  # consumed, as a framework does
    deleter = ctypes.c_void_p.from_address(p + C._L_DELETER_OFFSET).value

    class SlowTeardown:  # finalisation hands the GIL around while this sleeps
        def __del__(self, sleep=time.sleep):
            sleep(1.0)
    if sys.argv[2] != "fork while waiting":
        slow = SlowTeardown()
    if sys.argv[2] == "late, after a subinterpreter":
        # One subinterpreter, ever, makes PyGILState_Check() answer 1 on every thread.
        try:
            import _interpreters as si  # 3.13+
        except ImportError:
            import _xxsubinterpreters as si
        si.destroy(si.create())
    if sys.argv[2].startswith("late"):
        lib.call_later(deleter, p, 300)  # called while the interpreter finalises
    elif sys.argv[2] == "fork while waiting":
        # A child forked while a thread waits inside the deleter inherits the count of
        # calls in flight, not the thread: its exit must not wait for it.
        import os
        sys.setswitchinterval(30)
        lib.call_later(deleter, p, 50)
        end = time.perf_counter() + 0.3
        while time.perf_counter() < end:
            pass
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        print(f"child exit took {time.perf_counter() - t0:.2f} s", flush=True)
    else:
        # "waiting": the call starts while this thread holds the GIL and is still
        # waiting for it when the interpreter begins to exit.
        # Nothing may release the GIL after the wait, printing included: that would let
        # the call in by chance, before the exit hook does.
        sys.setswitchinterval(30)
        lib.call_later(deleter, p, 100)
        print("exiting", flush=True)
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
    if not sys.argv[2].startswith("waiting"):
        print("exiting", flush=True)
""")


# Only a call that starts during finalisation fails with ctypes deleters: one already
# waiting for the GIL is let finish by the exit hook, whichever deleters are in use.
_CTYPES_LATE = pytest.mark.xfail(
    not C.COMPILED_DELETERS,
    strict=True,
    reason="a ctypes deleter asks for the GIL before any of our code runs, and CPython ends "
    "a thread that does so during finalisation; inside XLA's noexcept destructors that is "
    "std::terminate (hurray_bridge._speedups, when built, lifts this)",
)


@pytest.mark.parametrize("when", [pytest.param("late", marks=_CTYPES_LATE), "waiting",
                                  "waiting, slow release",
                                  pytest.param("late, after a subinterpreter",
                                               marks=_CTYPES_LATE),
                                  "fork while waiting"])
def test_a_native_thread_releasing_an_export_at_exit_does_not_abort(
    native_thread_lib: str, when: str
) -> None:
    # Seen with XLA on the GPU machine and here (jnp.from_dlpack(t, device=other)
    # then exit: ~60% of runs aborted with "terminate called without an active
    # exception"). The deleter must neither take the GIL during finalisation ("late":
    # the export is left to the exiting process) nor be caught waiting for it when
    # finalisation starts ("waiting": the exit hook lets it finish first), also once a
    # subinterpreter existed; and a forked child must not wait for its parent's call.
    if when == "fork while waiting" and not hasattr(os, "fork"):
        pytest.skip("os.fork is not available on this platform")
    deleters = "compiled" if C.COMPILED_DELETERS else "ctypes"
    out = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, native_thread_lib, when, deleters],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "exiting" in out.stdout and "terminate" not in out.stderr
    # "waiting" was released by the exit hook; "late" had not been called yet then.
    late = when.startswith("late")
    assert f"left at exit: {1 if late else 0}" in out.stdout, out.stdout
    if when == "fork while waiting":
        took = float(out.stdout.split("child exit took ")[1].split()[0])
        assert took < 1.5, out.stdout  # the exit hook waits up to 2 s for calls in flight


# Child code of the two tests below: `cap`, an export of `t` made by the path that
# EXPORT names, and `Producer`, which hands it to np.from_dlpack.
_EXPORT_OF_T = """
kwargs = {"max_version": (1, 0)}
if EXPORT == "python export":
    kwargs["dl_device"] = (1, 0)  # made by the Python method, released by deleters.c
cap = t.__dlpack__(**kwargs)
class Producer:
    def __dlpack__(self, **_):
        return cap
    def __dlpack_device__(self):
        return (1, 0)
"""

_HELD_RELEASE_SCRIPT = textwrap.dedent("""
    import sys, threading, time, weakref
    import numpy as np
    import hurray_bridge as hb
    from hurray_bridge import _capsule as C, _speedups
    EXPORT, HOW = sys.argv[1], sys.argv[2]
    t = hb.asarray(np.arange(4.0))
    entered, done = threading.Event(), threading.Event()
    def slow(_):  # the owner's release drops the GIL, as torch freeing a source does
        entered.set()
        time.sleep(0.5)
        done.set()
    r = weakref.ref(t, slow)
    before = len(C._EXPORTS)
""") + _EXPORT_OF_T + textwrap.dedent("""
    assert (len(C._EXPORTS) > before) == (EXPORT == "python export")
    held = [np.from_dlpack(Producer()) if HOW == "consumed" else cap]
    del t, cap
    # The release runs on a thread that holds the GIL (NumPy's deleter, or the dying
    # capsule), and its owner's release gives the GIL away while it sleeps.
    threading.Thread(target=held.clear).start()
    assert entered.wait(10)
    left = _speedups.stop_foreign_releases(2000)
    print(f"left {left}, finished {done.is_set()}", flush=True)
""")


@pytest.mark.skipif(not C.COMPILED_DELETERS, reason="the exit guard it checks is compiled "
                    "(hurray_bridge._speedups not built)")
@pytest.mark.parametrize("how", ["consumed", "unconsumed"])
@pytest.mark.parametrize("export", ["compiled export", "python export"])
def test_the_exit_guard_waits_for_a_release_that_gave_the_gil_away(export: str,
                                                                     how: str) -> None:
    # A thread that holds the GIL cannot overlap finalisation -- unless its release
    # drops the GIL (a weakref callback, a __del__, torch's THPVariable_clear freeing a
    # source). Uncounted, the exit guard let finalisation start while it waited to take
    # the GIL back, and the thread was ended inside its consumer's frames (with torch on
    # a daemon thread: "terminate called without an active exception").
    out = subprocess.run([sys.executable, "-c", _HELD_RELEASE_SCRIPT, export, how],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "left 0, finished True" in out.stdout, out.stdout + out.stderr


# Runs inside the subinterpreter, after a line that sets CTYPES, EXPORT and HOW.
_SUBINTERPRETER_CODE = """
import sys, warnings
warnings.simplefilter("ignore")  # NumPy warns that it does not support subinterpreters
if CTYPES:
    sys.modules["hurray_bridge._speedups"] = None
import numpy as np
import hurray_bridge as hb
t = hb.asarray(np.arange(4.0))
""" + _EXPORT_OF_T + """
if HOW == "consumed":
    a = np.from_dlpack(Producer())
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    del a
del cap
print("released", flush=True)
"""


# A known gap of the pure-Python build.
_CTYPES_SUBINTERPRETER = pytest.mark.xfail(
    not C.COMPILED_DELETERS,
    strict=True,
    reason="a ctypes callback takes the GIL with PyGILState_Ensure, which knows only the "
    "main interpreter's thread states: inside a subinterpreter it waits for the GIL its "
    "own thread holds (hurray_bridge._speedups, when built, lifts this)",
)


@pytest.mark.skipif(importlib.util.find_spec("_testcapi") is None,
                    reason="CPython's _testcapi (run_in_subinterp) is not built")
@_CTYPES_SUBINTERPRETER
@pytest.mark.parametrize("how", ["consumed", "unconsumed"])
@pytest.mark.parametrize("export", ["compiled export", "python export"])
def test_a_release_inside_a_subinterpreter_does_not_wait_for_its_own_gil(export: str,
                                                                          how: str) -> None:
    # Python 3.10/3.11 keep one "current" thread state for the process. A thread inside
    # a subinterpreter holds the GIL with that interpreter's state, not with the state
    # PyGILState_GetThisThreadState() answers, and the deleter, comparing the two, took
    # itself for a thread without the GIL: it asked for the GIL it held, and hung.
    deleters = "compiled" if C.COMPILED_DELETERS else "ctypes"
    code = (f"CTYPES, EXPORT, HOW = {deleters == 'ctypes'}, {export!r}, {how!r}\n"
            + _SUBINTERPRETER_CODE)
    script = f"import _testcapi\nprint('rc', _testcapi.run_in_subinterp({code!r}), flush=True)"
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=20)  # a second or less when it works
    except subprocess.TimeoutExpired:
        pytest.fail(f"the release inside a subinterpreter hung ({deleters} deleters)")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "released" in out.stdout and "rc 0" in out.stdout, out.stdout + out.stderr


_CTYPES_EXIT_PRELUDE = """
import atexit, ctypes, sys, time
sys.modules["hurray_bridge._speedups"] = None  # the ctypes deleters' exit hook, in any build
timed = {}
# Registered around hurray_bridge's own: the first runs after it, the second before it.
atexit.register(lambda: print(f"hook took {time.perf_counter() - timed['t0']:.3f} s", flush=True))
from hurray_bridge import _capsule as C
atexit.register(lambda: timed.setdefault("t0", time.perf_counter()))
buf = (ctypes.c_double * 4)()
cap = C.make_capsule(data=ctypes.addressof(buf), shape=(4,), strides=(1,), code=2, bits=64,
                     device_type=1, device_id=0, flags=0, owner=buf, versioned=True)
"""


def _exit_of(script: str, runs: int = 1) -> list[subprocess.CompletedProcess[str]]:
    # Started together: each spends most of its time starting up, not racing.
    code = _CTYPES_EXIT_PRELUDE + textwrap.dedent(script)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(runs)]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return out


def test_exiting_while_threads_start_and_end_does_not_crash() -> None:
    # The exit hook looks for thread states without a frame. Walking them from Python
    # (PyThreadState_Next through ctypes) let a thread switch free the next one under
    # the walk: 7 of 30 exits of this program crashed (SIGSEGV in PyThreadState_Next).
    for out in _exit_of("""
            import _thread, threading
            sys.setswitchinterval(1e-5)
            ev = threading.Event()
            for _ in range(300):
                threading.Thread(target=ev.wait, daemon=True).start()
            def churn():
                while True:
                    try:
                        _thread.start_new_thread(int, ())  # ends at once, freeing its state
                    except RuntimeError:
                        time.sleep(0.0001)
            for _ in range(2):
                threading.Thread(target=churn, daemon=True).start()
            time.sleep(0.05)
            """, runs=8):
        assert out.returncode == 0 and "hook took" in out.stdout, (out.returncode, out.stderr)


def test_the_exit_hook_waits_50_ms_at_most() -> None:
    # A thread state without a frame that is not a deleter waiting for the GIL (a
    # builtin run by _thread), and a busy thread that holds the GIL for a whole switch
    # interval after each of the hook's sleeps: 50 sleeps took 2.6 s before the wait was
    # bounded by the clock.
    (out,) = _exit_of("""
        import _thread, threading
        _thread.start_new_thread(time.sleep, (100,))
        def spin():
            while True:
                pass
        threading.Thread(target=spin, daemon=True).start()
        sys.setswitchinterval(0.05)
        time.sleep(0.05)
        """)
    assert out.returncode == 0, out.stderr
    took = float(out.stdout.split("hook took ")[1].split()[0])
    assert took < 1.0, out.stdout  # 0.05 s, plus at most one switch interval, plus noise


@pytest.mark.parametrize("deleters", ["compiled", "ctypes"])
def test_a_collection_inside_the_exit_hook_leaves_no_export_armed(deleters: str) -> None:
    # Building the list of live exports allocates, which may run a collection, whose
    # garbage may hold a consumer of an export: its deleter changed the registry under
    # list() ("dictionary changed size during iteration", 3.10 and 3.11) and the hook
    # stopped before disarming any of 3000 exports.
    if deleters == "compiled" and not C.COMPILED_DELETERS:
        pytest.skip("hurray_bridge._speedups was not built")
    code = textwrap.dedent("""
        import atexit, ctypes, sys
        if sys.argv[1] == "ctypes":
            sys.modules["hurray_bridge._speedups"] = None
        atexit.register(lambda: print("armed:", sum(
            ctypes.c_void_p.from_address(p + off).value != C._NOOP_ADDR
            for p, (_b, _o, off) in C._EXPORTS.items()), "of", len(C._EXPORTS), flush=True))
        import numpy as np
        from hurray_bridge import _capsule as C
        class Producer:
            def __init__(self, a):
                self.a = a
            def __dlpack_device__(self):
                return (1, 0)
            def __dlpack__(self, **kw):
                return C.make_capsule(data=self.a.ctypes.data, shape=self.a.shape, strides=(1,),
                                      code=2, bits=64, device_type=1, device_id=0, flags=0,
                                      owner=self.a, versioned=True)
        keep = [np.from_dlpack(Producer(np.arange(4.0))) for _ in range(3000)]
        class Node:
            pass
        n = Node()
        n.me, n.arr = n, np.from_dlpack(Producer(np.arange(4.0)))
        del n
        """)
    out = subprocess.run([sys.executable, "-c", code, deleters], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Exception ignored" not in out.stderr, out.stderr
    armed, total = out.stdout.split("armed: ")[1].split(" of ")
    assert int(armed) == 0 and int(total) >= 3000, out.stdout


def test_a_native_thread_releases_an_export_while_running(native_thread_lib: str) -> None:
    # Outside exit, a thread without a Python thread state releases at once.
    lib = ctypes.CDLL(native_thread_lib)
    lib.call_later.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    cap, p, deleter_addr, ref = _consumed_export()
    lib.call_later(deleter_addr, p, 0)
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.001)  # lets the native thread take the GIL
    assert ref() is None
    del cap


def test_foreign_owner_released_on_another_thread() -> None:
    a = np.arange(5.0)
    ref = weakref.ref(a)
    v = C.consume_capsule(a.__dlpack__(max_version=(1, 3)))
    del a
    owner = v.owner
    del v
    t = threading.Thread(target=owner.release)  # type: ignore[attr-defined]
    t.start()
    t.join()
    collect()
    assert ref() is None


@unraisable_ok
def test_deleter_under_an_exception_in_flight_still_releases() -> None:
    # NumPy calls the deleter while `+` is unwinding; the release must still happen.
    before = exports()
    owner = Owner()
    ref = weakref.ref(owner)
    prod = Producer(np.arange(4.0), owner)
    del owner
    with pytest.raises(Exception):  # noqa: B017  (see the xfail test below for which)
        np.from_dlpack(prod) + "x"
    prod = None  # type: ignore[assignment]
    collect()
    assert ref() is None
    assert exports() == before


@unraisable_ok
@pytest.mark.xfail(
    not C.COMPILED_DELETERS,
    strict=True,
    reason="ctypes callbacks cannot hand an in-flight exception back to C: the consumer's "
    "caller sees SystemError (hurray_bridge._speedups, when built, lifts this)",
)
def test_deleter_keeps_the_exception_in_flight() -> None:
    with pytest.raises(TypeError):
        np.from_dlpack(Producer(np.arange(4.0), Owner())) + "x"


# -- make_capsule into real consumers ---------------------------------------------------------


def _lifetime_check(consume: Any, array: Any, expected: Any, ptr: Any | None) -> None:
    owner = Owner(array)
    ref = weakref.ref(owner)
    prod = Producer(array, owner)
    del owner
    out = consume(prod)
    del prod
    collect()
    assert ref() is not None  # alive while the consumer's array is
    got = np.asarray(out)
    assert got.dtype == expected.dtype
    assert got.tobytes() == expected.tobytes()
    if ptr is not None:
        assert ptr(out) == array.ctypes.data
    del got, out
    collect()
    assert ref() is None  # and released with it


def test_numpy_consumes_our_export() -> None:
    for a in (np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(12.0).reshape(3, 4).T):
        _lifetime_check(np.from_dlpack, a, np.ascontiguousarray(a), lambda r: r.ctypes.data)


def test_torch_consumes_our_export() -> None:
    torch = pytest.importorskip("torch")
    for a in (np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(12.0).reshape(3, 4)[:, ::2]):
        _lifetime_check(torch.from_dlpack, a, np.ascontiguousarray(a), lambda r: r.data_ptr())


def test_jax_consumes_our_legacy_export_zero_copy() -> None:
    jnp = pytest.importorskip("jax.numpy")
    a = aligned(48).view(np.float32).reshape(3, 4)
    a[...] = np.arange(12).reshape(3, 4)
    prod = Producer(a, Owner())
    x = jnp.from_dlpack(prod)
    assert prod.requests[-1]["max_version"] is None  # JAX asks for a legacy capsule
    del prod
    assert x.unsafe_buffer_pointer() == a.ctypes.data  # 64-byte aligned: no copy
    _lifetime_check(jnp.from_dlpack, a, a.copy(), lambda r: r.unsafe_buffer_pointer())


def test_read_only_flag_reaches_numpy() -> None:
    a = np.arange(4.0)
    r = np.from_dlpack(Producer(a, Owner(), flags=D.FLAG_READ_ONLY))
    assert not r.flags.writeable
    w = np.from_dlpack(Producer(a, Owner()))
    assert w.flags.writeable and w.ctypes.data == a.ctypes.data


def test_legacy_export_into_numpy_is_read_only() -> None:
    # NumPy marks every legacy import read-only: the legacy struct cannot say otherwise.
    cap = Producer(np.arange(3.0), Owner()).__dlpack__()
    assert C.capsule_name(cap) == "dltensor"

    class Legacy:
        def __dlpack__(self, **kw: Any) -> object:
            return cap

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    assert not np.from_dlpack(Legacy()).flags.writeable


@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 0, 1)])
def test_empty_export_into_consumers(shape: tuple[int, ...]) -> None:
    a = np.zeros(shape, np.float32)
    consumers = [np.from_dlpack]
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    consumers += [torch.from_dlpack, jnp.from_dlpack]
    for consume in consumers:
        owner = Owner()
        ref = weakref.ref(owner)
        prod = Producer(a, owner)
        del owner
        out = consume(prod)
        assert tuple(out.shape) == shape
        del out, prod
        collect()
        assert ref() is None, consume


def test_rank_zero_export_into_consumers() -> None:
    a = np.array(3.5, np.float32)
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    for consume in (np.from_dlpack, torch.from_dlpack, jnp.from_dlpack):
        assert float(consume(Producer(a, Owner()))) == 3.5


def test_make_capsule_rejects_bad_rank() -> None:
    with pytest.raises(FormatError):
        C.make_capsule(
            data=0, shape=(1,) * 65, strides=(1,) * 65, code=2, bits=32, device_type=1,
            device_id=0, flags=0, owner=None, versioned=True,
        )  # fmt: skip
    with pytest.raises(FormatError):
        C.make_capsule(
            data=0, shape=(2, 2), strides=(1,), code=2, bits=32, device_type=1, device_id=0,
            flags=0, owner=None, versioned=True,
        )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    # Far enough from 0 that no negative stride below reaches under address 0.
    data=st.integers(2**20, 2**48),
    code_bits=st.sampled_from([d.dlpack for d in hbd.all_dtypes() if d.dlpack]),
    flags=st.integers(0, 7),
    device=st.tuples(st.integers(1, 18), st.integers(0, 7)),
    versioned=st.booleans(),
    stride_seed=st.integers(-100, 100),
)
def test_make_consume_round_trip(
    shape: list[int],
    data: int,
    code_bits: tuple[int, int],
    flags: int,
    device: tuple[int, int],
    versioned: bool,
    stride_seed: int,
) -> None:
    strides = tuple(stride_seed * (i + 1) for i in range(len(shape)))
    owner = Owner()
    cap = C.make_capsule(
        data=data, shape=tuple(shape), strides=strides, code=code_bits[0], bits=code_bits[1],
        device_type=device[0], device_id=device[1], flags=flags, owner=owner,
        versioned=versioned,
    )  # fmt: skip
    v = C.consume_capsule(cap)
    assert v.shape == tuple(shape)
    assert v.strides == strides
    assert v.data == (0 if 0 in shape else data)
    assert (v.code, v.bits, v.lanes) == (*code_bits, 1)
    assert (v.device_type, v.device_id) == device
    assert v.flags == (flags if versioned else 0)
    assert v.versioned is versioned


# -- request_capsule ------------------------------------------------------------------------


class Spy:
    def __init__(self, *, modern: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.modern = modern
        self.array = np.arange(3.0)

    def __dlpack__(self, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        if not self.modern and set(kwargs) - {"stream"}:
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        return self.array.__dlpack__(max_version=kwargs.get("max_version"))


def test_request_sends_max_version_and_only_given_keywords() -> None:
    spy = Spy()
    C.request_capsule(spy)
    assert spy.calls == [{"max_version": (1, 3)}]
    C.request_capsule(spy, stream=None, copy=False, dl_device=(1, 0))
    assert spy.calls[-1] == {"max_version": (1, 3), "copy": False, "dl_device": (1, 0)}
    C.request_capsule(spy, stream=7, copy=True)
    assert spy.calls[-1] == {"max_version": (1, 3), "stream": 7, "copy": True}


def test_request_falls_back_for_old_producers() -> None:
    spy = Spy(modern=False)
    cap = C.request_capsule(spy, copy=True, dl_device=(1, 0))
    assert spy.calls[-1] == {}
    assert C.capsule_name(cap) == "dltensor"
    C.request_capsule(spy, stream=5)
    assert spy.calls[-2:] == [{"max_version": (1, 3), "stream": 5}, {"stream": 5}]

    class Oldest:
        def __dlpack__(self, stream: Any = None) -> object:
            return np.arange(2.0).__dlpack__()

    assert C.capsule_name(C.request_capsule(Oldest())) == "dltensor"


def test_request_passes_producer_errors_through() -> None:
    class Refuses:
        def __dlpack__(self, **kwargs: Any) -> object:
            raise BufferError("cannot export")

    with pytest.raises(BufferError, match="cannot export"):
        C.request_capsule(Refuses())
    with pytest.raises(UnsupportedError, match="__dlpack__"):
        C.request_capsule(object())


# -- resources ----------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_100k_make_consume_cycles_do_not_grow_rss() -> None:
    owner = Owner()
    before_exports = exports()

    def cycle(n: int) -> None:
        for i in range(n):
            cap = C.make_capsule(
                data=4096, shape=(3, 4), strides=(4, 1), code=2, bits=32, device_type=1,
                device_id=0, flags=0, owner=owner, versioned=bool(i & 1),
            )  # fmt: skip
            v = C.consume_capsule(cap)
            del cap, v
            if i % 7 == 0:  # and some that nobody consumes
                C.make_capsule(
                    data=4096, shape=(2,), strides=(1,), code=2, bits=32, device_type=1,
                    device_id=0, flags=0, owner=owner, versioned=True,
                )  # fmt: skip

    cycle(20_000)  # warm up caches and allocator pools
    collect()
    start = _rss_bytes()
    t0 = time.perf_counter()
    cycle(100_000)
    elapsed = time.perf_counter() - t0
    collect()
    grown = _rss_bytes() - start
    assert grown < 4 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB"
    assert exports() == before_exports
    assert elapsed < 10, f"100k cycles took {elapsed:.1f} s"


def test_interpreter_exit_with_live_exports_is_clean() -> None:
    # Exports still held by torch/JAX/NumPy (and unconsumed capsules) when the
    # interpreter shuts down must not crash it.
    script = textwrap.dedent(
        """
        import numpy as np
        from hurray_bridge import _capsule as C

        class P:
            def __init__(self, a): self.a = a
            def __dlpack_device__(self): return (1, 0)
            def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
                a = self.a
                return C.make_capsule(
                    data=a.ctypes.data, shape=a.shape, strides=(1,), code=2, bits=32,
                    device_type=1, device_id=0, flags=0, owner=a,
                    versioned=max_version is not None)

        a = np.arange(16, dtype=np.float32)
        KEEP = [np.from_dlpack(P(a)), P(a).__dlpack__(), P(a).__dlpack__(max_version=(1, 3))]
        KEEP.append(C.consume_capsule(np.arange(3.0).__dlpack__(max_version=(1, 3))))
        try:
            import torch
            KEEP.append(torch.from_dlpack(P(a)))
        except ImportError:
            pass
        try:
            import jax.numpy as jnp
            KEEP.append(jnp.from_dlpack(P(a)))
        except ImportError:
            pass
        print("ok", len(KEEP))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok")
    assert "Fatal" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_the_ctypes_deleters_still_release_without_the_compiled_module() -> None:
    # The compiled pair replaces the ctypes callbacks when hurray_bridge._speedups is
    # built; the fallback must keep working for installs without a C compiler.
    code = textwrap.dedent("""
        import gc, sys, weakref
        sys.modules["hurray_bridge._speedups"] = None
        import numpy as np
        from hurray_bridge import _capsule as C
        assert not C.COMPILED_DELETERS
        class Owner: pass
        def export(a, owner, versioned):
            return C.make_capsule(data=a.ctypes.data, shape=a.shape, strides=(1,), code=2,
                                  bits=64, device_type=1, device_id=0, flags=0, owner=owner,
                                  versioned=versioned)
        class Producer:
            def __init__(self, a, owner): self.a, self.owner = a, owner
            def __dlpack__(self, **kw): return export(self.a, self.owner, True)
            def __dlpack_device__(self): return (1, 0)
        a = np.arange(4.0)
        o = Owner(); r = weakref.ref(o)
        out = np.from_dlpack(Producer(a, o)); del o; gc.collect()
        assert r() is not None and out.tolist() == [0.0, 1.0, 2.0, 3.0]
        del out; gc.collect(); assert r() is None          # consumed: the deleter ran
        o = Owner(); r = weakref.ref(o)
        cap = export(a, o, False); del o, cap; gc.collect()
        assert r() is None and not C.live_exports()               # never consumed: the destructor
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
