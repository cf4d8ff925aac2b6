"""The compiled DLPack path and the DLPack C exchange API give what the Python path gives.

The Python functions stay the reference: every compiled answer is compared with theirs,
input by input, for what a user can observe (every slot of the hb.Tensor, its owner,
capsule fields and flags, errors and their messages).

* torch -> hb.Tensor: ``hb.asarray`` and the torch adapter's ``to_hurray`` read plain
  tensors through torch's exchange table in C; everything they decline (requires_grad,
  conj/neg bits, shell dtypes ...) takes the Python function.
* torch -> NumPy: the compiled shortcut entry, against hb.convert's full path.
* hb.Tensor -> DLPack: the compiled ``__dlpack__`` / ``__dlpack_device__`` against the
  Python methods, and hb.Tensor's own exchange table, read by a consumer written against
  the DLPack 1.3 header (``exchange_api_consumer.c`` beside this file, built here) and by
  apache-tvm-ffi.
* any producer type with a table: ``hb.from_dlpack`` through it, against the capsule path.
* lifetimes: deleters once, from any thread, exceptions in flight kept, memory flat.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import gc
import importlib.util
import inspect
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import threading
import types
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule, _exchange
from hurray_bridge.conversion import asarray as asarray_python
from hurray_bridge.tensor import Tensor

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

from hurray_bridge.adapters import torch as ht  # noqa: E402

COMPILED = _exchange.installed
needs_compiled = pytest.mark.skipif(not COMPILED,
                                    reason="hurray_bridge._speedups was not built")
SLOTS = ("_base0", "_buffers", "_copied", "_data", "_desc", "_device", "_dtype", "_nbytes",
         "_padded", "_readonly", "_shape", "_source", "_strides")
HERE = Path(__file__).resolve().parent
# The torch adapter's Python to_hurray: behind the compiled front where it is installed,
# the function itself where the module was not built (then both sides below are Python).
TO_HURRAY_PY = getattr(ht.to_hurray, "__wrapped__", ht.to_hurray)


# ---------------------------------------------------------------------------- helpers
def _observe_tensor(t: Any, source: Any) -> tuple[Any, ...]:
    """Everything of an hb.Tensor, with its owner said relative to the source."""
    owner = t._owner
    kind = ("source" if owner is source else type(owner).__name__ if owner is not None
            else None)
    tracked = getattr(owner, "tensor", None)
    if tracked is not None:
        kind = (kind, tracked.data_ptr() == source.data_ptr())
    # A copy lands elsewhere: what must match is whether the memory is the source's.
    values = tuple(None if t._copied and s in ("_base0", "_data") else getattr(t, s)
                   for s in SLOTS)
    # Side buffers (a quantized tensor's scales) are made afresh each time.
    bufs = t._buffers
    if bufs is not None:
        values = (*values[:1], tuple((b.role, b.nbytes, b.ptr == t._base0) for b in bufs),
                  *values[2:])
    return (type(t), kind, values)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out: Any = ("ok", fn(*args, **kwargs))
        except Exception as exc:
            out = ("error", type(exc), str(exc))
    return (*out, sorted(str(w.message) for w in caught))


def _same_import(compiled: Callable[..., Any], python: Callable[..., Any], x: Any,
                 **kwargs: Any) -> None:
    a, b = _call(compiled, x, **kwargs), _call(python, x, **kwargs)
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a == b
        return
    assert a[2] == b[2]
    assert _observe_tensor(a[1], x) == _observe_tensor(b[1], x)


def _neg_data() -> Any:
    return torch.arange(1.0, 4.0)._neg_view().data


def _shell(name: str) -> Callable[[], Any]:
    return lambda: torch.arange(4, dtype=torch.uint8).view(getattr(torch, name))


def _quantized() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.qint8)


# (label, factory, takes the compiled path)
TORCH_INPUTS: list[tuple[str, Callable[[], Any], bool]] = [
    ("f32", lambda: torch.arange(6.0), True),
    ("2-D", lambda: torch.arange(6.0).reshape(2, 3), True),
    ("2-D.T", lambda: torch.arange(6.0).reshape(2, 3).T, True),
    ("sliced", lambda: torch.arange(12.0).reshape(3, 4)[1:, ::2], True),
    ("offset", lambda: torch.arange(8.0)[3:], True),
    ("expanded", lambda: torch.arange(3.0).expand(4, 3), True),
    ("size-1 dims", lambda: torch.ones(3, 1, 2).transpose(0, 1), True),
    ("column", lambda: torch.ones(4, 4)[:, :1], True),
    ("channels_last", lambda: torch.ones(2, 3, 4, 5).to(memory_format=torch.channels_last), True),
    ("0-d", lambda: torch.tensor(2.5), True),
    ("empty", lambda: torch.empty(0), True),
    ("empty (3, 0)", lambda: torch.empty(3, 0), True),
    ("empty strided", lambda: torch.empty(4, 0)[::2], True),
    ("rank 64", lambda: torch.ones([1] * 64), True),
    ("rank 65", lambda: torch.ones([1] * 65), False),
    ("inference", lambda: torch.inference_mode()(lambda: torch.ones(3))(), True),
    ("from_numpy", lambda: torch.from_numpy(np.arange(6.0).reshape(2, 3)), True),
    *[(f"dtype {d.name}", (lambda tdt=tdt: torch.ones(3).to(tdt)), True)
      for d, tdt in ht.DTYPES.items() if d.bits >= 8],
    ("complex conj", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), False),
    ("complex conj resolved", lambda: torch.tensor([1 + 2j]).conj().resolve_conj(), True),
    ("neg view", lambda: torch.arange(1.0, 4.0)._neg_view(), False),
    ("neg imag", lambda: torch.tensor([1 + 2j, 3 + 4j]).conj().imag, False),
    ("neg .data (not a view)", _neg_data, False),
    ("requires_grad", lambda: torch.ones(3, requires_grad=True), False),
    ("requires_grad non-leaf", lambda: torch.ones(3, requires_grad=True) * 2, False),
    ("Parameter", lambda: torch.nn.Parameter(torch.ones(2)), False),
    ("fp4 x2", lambda: torch.zeros(4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2), False),
    ("int1 (shell)", _shell("int1"), False),
    ("uint7 (shell)", _shell("uint7"), False),
    ("complex32", lambda: torch.ones(2, dtype=torch.complex32), False),
    ("quantized", _quantized, False),
    ("sparse coo", lambda: torch.ones(2, 2).to_sparse(), False),
    ("sparse csr", lambda: torch.ones(2, 2).to_sparse_csr(), False),
    ("nested", lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), False),
    ("meta", lambda: torch.empty(2, device="meta"), False),
    ("zero tensor (NULL data)", lambda: torch._efficientzerotensor(3), False),
    ("functional (NULL data)", lambda: torch._to_functional_tensor(torch.ones(3)), False),
]


def _spy(general: Callable[..., Any], positional_copy: bool = False) -> tuple[Any, list[Any]]:
    calls: list[Any] = []

    def python(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return general(*args, **kwargs)

    return _exchange.front(python, positional_copy=positional_copy), calls


# ------------------------------------------------------------ torch -> hb.Tensor
@pytest.mark.parametrize("label, make, compiled", TORCH_INPUTS, ids=[c[0] for c in TORCH_INPUTS])
@pytest.mark.parametrize("kwargs", [{}, {"copy": None}, {"copy": False}, {"copy": True}],
                         ids=["plain", "copy=None", "copy=False", "copy=True"])
def test_torch_import_compiled_equals_python(label: str, make: Callable[[], Any],
                                             compiled: bool, kwargs: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = make()
    _same_import(hb.asarray, asarray_python, x, **kwargs)
    _same_import(ht.to_hurray, TO_HURRAY_PY, x, **kwargs)
    if COMPILED and ht.COMPILED_IMPORT:
        front, calls = _spy(TO_HURRAY_PY)
        _call(front, x, **kwargs)
        took = compiled and kwargs.get("copy") is not True
        assert (not calls) is took, f"{label}: compiled path taken: {not calls}"


def test_asarray_positional_copy_and_other_call_forms() -> None:
    x = torch.arange(6.0)
    for args in [(x, None), (x, False), (x, True)]:
        a, b = _call(hb.asarray, *args), _call(asarray_python, *args)
        assert a[0] == b[0] == "ok"
        assert _observe_tensor(a[1], x) == _observe_tensor(b[1], x)
    for bad in [((x, 2), {}), ((x,), {"copy": "yes"}), ((x,), {"cpy": None}), ((), {}),
                ((x, None, None), {})]:
        assert _call(hb.asarray, *bad[0], **bad[1]) == _call(asarray_python, *bad[0], **bad[1])
    # to_hurray takes copy by keyword only, as the Python function does
    assert _call(ht.to_hurray, x, None) == _call(TO_HURRAY_PY, x, None)


@needs_compiled
def test_the_fronts_are_compiled_and_say_whose() -> None:
    assert "compiled import front" in repr(hb.asarray)
    assert hb.asarray.__wrapped__ is asarray_python  # type: ignore[attr-defined]
    assert hb.asarray.__name__ == "asarray" and ht.to_hurray.__name__ == "to_hurray"
    assert hb.asarray.__doc__ == asarray_python.__doc__
    assert ht.COMPILED_IMPORT, ht._register_compiled()


@needs_compiled
def test_a_plain_torch_import_keeps_the_storage_as_owner() -> None:
    x = torch.arange(6.0)
    r = weakref.ref(x.untyped_storage())
    t = hb.asarray(x)
    assert t.owner is x.untyped_storage() and t.data_ptr == x.data_ptr()
    x.set_(torch.zeros(2))  # the storage, not the tensor object, holds the memory
    del x
    gc.collect()
    assert r() is not None
    assert np.from_dlpack(t).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    del t
    gc.collect()
    assert r() is None


def test_requires_grad_stays_read_only_and_conj_is_never_read_raw() -> None:
    g = torch.ones(3, requires_grad=True)
    t = hb.asarray(g)
    assert t.readonly and not t.copied and t.data_ptr == g.data_ptr()
    c = torch.tensor([1 + 2j, 3 - 4j]).conj()
    t = hb.asarray(c)
    assert t.copied and np.from_dlpack(t).tolist() == [1 - 2j, 3 + 4j]
    n = torch.tensor([1 + 2j, 3 + 4j]).conj().imag
    assert np.from_dlpack(hb.asarray(n)).tolist() == [-2.0, -4.0]


@needs_compiled
def test_a_changed_torch_type_is_read_again() -> None:
    # A monkeypatched guard (the type's version tag changes) is resolved anew.
    x = torch.ones(3)
    original = torch.Tensor.is_neg
    try:
        torch.Tensor.is_neg = lambda self: True  # type: ignore[method-assign]
        t = hb.asarray(x)
        assert t.copied  # the Python path saw "neg" and materialised
    finally:
        torch.Tensor.is_neg = original  # type: ignore[method-assign]
    assert not hb.asarray(x).copied


# ------------------------------------------------------------------ torch -> numpy
def _numpy_declines(x: Any) -> str:
    """Why the compiled torch -> NumPy entry leaves ``x`` to the full path, or ''."""
    if not x.numel():
        return "empty"
    try:
        x.numpy()
    except (TypeError, RuntimeError, ValueError) as exc:
        return f"Tensor.numpy() refuses it ({type(exc).__name__})"
    return "" if x.data_ptr() else "no data address"


@needs_compiled
@pytest.mark.parametrize("label, make, compiled", TORCH_INPUTS, ids=[c[0] for c in TORCH_INPUTS])
def test_compiled_numpy_entry_answers_as_the_full_path(label: str, make: Callable[[], Any],
                                                       compiled: bool) -> None:
    from hurray_bridge.adapters.torch import shortcuts

    entry = shortcuts._compiled_to_numpy()
    assert entry is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = make()
        out = entry(x)
        declines = _numpy_declines(x)
    # The entry answers for what Tensor.numpy() takes (shortcuts._compiled_to_numpy), and
    # leaves empty tensors and tensors without an address to the full path.
    assert (out is NotImplemented) is bool(declines), f"{label}: {declines or 'taken'}"
    if not declines:  # taken: it must answer as the full path does
        full = hb.convert.general(x, "numpy")  # type: ignore[attr-defined]
        assert type(out) is type(full) is np.ndarray
        assert out.dtype == full.dtype and out.shape == full.shape
        assert all(a == b for a, b, d in zip(out.strides, full.strides, out.shape) if d > 1)
        for flag in ("writeable", "aligned", "c_contiguous", "f_contiguous", "owndata"):
            assert getattr(out.flags, flag) == getattr(full.flags, flag), flag
        assert out.__array_interface__["data"] == full.__array_interface__["data"]
        assert out.tobytes() == full.tobytes()
        assert out.base is x.untyped_storage()


@needs_compiled
def test_torch_to_numpy_shortcut_is_the_compiled_entry() -> None:
    from hurray_bridge import _shortcuts

    x = torch.arange(4.0)
    hb.convert(x, "numpy")
    found = _shortcuts.TABLE[torch.Tensor]["numpy"]
    assert found is not None and type(found[0]).__name__ == "NumpyEntry"
    assert _shortcuts.serves(x, "numpy")


# ---------------------------------------------------------------- hb.Tensor exports
def _padded_int4() -> Tensor:
    a = np.arange(6, dtype=np.uint8) % 8
    return Tensor._dense(a.ctypes.data, (6,), hb.int4, strides=None, padded=True, device=hb.CPU,
                         owner=a, readonly=False, copied=False)


def _bytes_as(dtype: Any, shape: tuple[int, ...], nbytes: int) -> Tensor:
    a = np.zeros(nbytes, np.uint8)
    return Tensor._dense(a.ctypes.data, shape, dtype, strides=None, padded=False, device=hb.CPU,
                         owner=a, readonly=False, copied=False)


def _read_only() -> Tensor:
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False  # (hb.loads of bytes would copy: its tensors are writable)
    return hb.asarray(a)


def _read_only_empty() -> Tensor:
    t = hb.asarray(np.zeros(0, np.float32))
    t._readonly = True
    return t


def _descriptor_read() -> Tensor:
    t = hb.asarray(np.arange(6.0).reshape(2, 3))
    t.descriptor  # noqa: B018  (cached on the tensor from now on)
    return t


class _DeviceProducer:
    """A device producer: exports forward to it."""

    def __init__(self, a: Any) -> None:
        self.a = a
        self.calls: list[Any] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return self.a.__dlpack__()


def _on_device(kind: int, source: bool) -> Callable[[], Tensor]:
    def make() -> Tensor:
        a = np.arange(4.0)
        return Tensor._dense(a.ctypes.data, (4,), hb.float64, strides=None, padded=False,
                             device=hb.Device(kind, 0), owner=a, readonly=False, copied=False,
                             source=_DeviceProducer(a) if source else None)
    return make


def _file_entry(shape: list[int]) -> Any:
    from tests.vectors.generate_files import tensor

    return tensor(hb.Descriptor(shape, hb.float32), b"")  # no elements: no bytes


EXPORTS: list[tuple[str, Callable[[], Any]]] = [
    ("f32", lambda: hb.asarray(np.arange(6, dtype=np.float32))),
    ("2-D", lambda: hb.asarray(np.arange(6.0).reshape(2, 3))),
    ("reversed", lambda: hb.asarray(np.arange(6.0)[::-1])),
    ("transposed", lambda: hb.asarray(np.arange(6.0).reshape(2, 3).T)),
    ("0-d", lambda: hb.asarray(np.float32(3))),
    ("empty", lambda: hb.asarray(np.zeros((0, 3), np.int16))),
    # A zero inside the shape: compact strides count it as 1, as NumPy and torch do.
    ("empty inside", lambda: hb.asarray(np.zeros((2, 0, 5), np.float32))),
    ("empty, a huge dimension", lambda: _file_entry([2**61, 0, 5])),
    ("bool8", lambda: hb.asarray(np.array([True, False]))),
    ("from torch", lambda: hb.asarray(torch.arange(6.0).reshape(2, 3)[:, 1:])),
    ("read-only", _read_only),
    ("read-only, empty", _read_only_empty),
    ("padded int4", _padded_int4),
    ("packed int4", lambda: _bytes_as(hb.int4, (4,), 2)),
    ("1-bit bool", lambda: _bytes_as(hb.bool, (8,), 1)),
    ("descriptor read", _descriptor_read),
    ("pinned host", _on_device(3, False)),
    ("managed, with source", _on_device(13, True)),
    ("cuda, with source", _on_device(2, True)),
    ("cuda, no source", _on_device(2, False)),
]

CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    ((), {"max_version": (1, 0)}),
    ((), {"max_version": (1, 3)}),
    ((), {"max_version": (2, 0)}),
    ((), {"max_version": (0, 9)}),
    ((), {"max_version": None, "copy": None, "dl_device": None}),
    ((), {"max_version": (1, 0), "copy": False}),
    ((), {"max_version": (1, 0), "copy": True}),
    ((), {"copy": True}),
    ((), {"copy": 0}),
    ((), {"copy": "x"}),
    ((), {"stream": None}),
    ((), {"stream": -1, "max_version": (1, 0)}),
    ((), {"stream": 5}),
    ((), {"stream": 2**70, "max_version": (1, 0)}),
    ((), {"dl_device": (1, 0), "max_version": (1, 0)}),
    ((), {"dl_device": (2, 0)}),
    ((), {"max_version": "1.0"}),
    ((), {"max_version": ()}),
    ((), {"unknown": 1}),
    ((1,), {}),
]


def _capsule_view(capsule: Any) -> tuple[Any, ...]:
    name = _capsule.capsule_name(capsule)
    v = _capsule.consume_capsule(capsule)
    return (name, v.data, v.shape, v.strides, v.code, v.bits, v.lanes, v.device_type,
            v.device_id, v.flags, v.versioned)


@pytest.mark.parametrize("label, make", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_compiled_dlpack_equals_python(label: str, make: Callable[[], Any]) -> None:
    python = _exchange.python_dlpack or Tensor.__dlpack__
    for args, kwargs in CALLS:
        t = make()
        a = _call(t.__dlpack__, *args, **kwargs)
        b = _call(python, t, *args, **kwargs)
        assert a[0] == b[0], (label, kwargs, a, b)
        if a[0] == "error":
            assert a == b, (label, kwargs)
            continue
        va, vb = _capsule_view(a[1]), _capsule_view(b[1])
        if va[1] != vb[1]:  # a copy: another address, all else the same
            assert kwargs.get("copy") is True
            va, vb = va[:1] + va[2:], vb[:1] + vb[2:]
        assert va == vb, (label, kwargs)


@needs_compiled
def test_compiled_dlpack_binds_and_reads_as_the_python_method() -> None:
    # The compiled __dlpack__ binds as a Python function does (a method object, not a
    # builtin method): every way of reaching it exports what the Python method exports,
    # and introspection sees the Python method's keywords.
    python = _exchange.python_dlpack
    assert python is not None
    method = Tensor.__dlpack__
    t = hb.asarray(np.arange(4.0))
    bound = t.__dlpack__
    assert isinstance(bound, types.MethodType)
    assert bound.__self__ is t and bound.__func__ is method and hasattr(t, "__dlpack__")
    want = _capsule_view(python(t, max_version=(1, 0)))
    calls = (lambda: t.__dlpack__(max_version=(1, 0)), lambda: bound(max_version=(1, 0)),
             lambda: method(t, max_version=(1, 0)),
             lambda: t.__dlpack__(**{"max_version": (1, 0)}),  # an attribute read, then a call
             lambda: method.__get__(t, Tensor)(max_version=(1, 0)))
    for call in calls:
        assert _capsule_view(call()) == want
    assert method.__get__(None, Tensor) is method

    def keywords(f: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY]

    assert keywords(method) == keywords(python) != []
    assert next(iter(inspect.signature(method).parameters)) == "self"
    assert "self" not in inspect.signature(bound).parameters
    assert (method.__name__, method.__qualname__) == ("__dlpack__", "Tensor.__dlpack__")
    assert method.__objclass__ is Tensor
    assert repr(method) == "<method '__dlpack__' of 'Tensor' objects>"
    assert method.__doc__.startswith("Export as a DLPack capsule")
    assert bound.__module__ is None  # read through __func__, as the builtin method's was
    # Pickled and copied by name, as a method_descriptor is.
    assert pickle.loads(pickle.dumps(method)) is method
    assert copy.copy(method) is method and copy.deepcopy(method) is method
    partial = copy.deepcopy(functools.partial(method, max_version=(1, 0)))
    assert _capsule_view(partial(t)) == want
    with pytest.raises(TypeError, match="needs an argument"):
        method()
    with pytest.raises(TypeError, match=r"doesn't apply to a 'numpy\.ndarray' object"):
        method(np.arange(3))
    with pytest.raises(TypeError):
        method(t, 1)  # keywords only, as in Python


@pytest.mark.parametrize("label, make", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_compiled_dlpack_device_equals_python(label: str, make: Callable[[], Any]) -> None:
    t = make()
    python = _exchange.python_dlpack_device or Tensor.__dlpack_device__
    a, b = t.__dlpack_device__(), python(t)
    assert a == b and type(a[0]) is type(b[0])


@pytest.mark.parametrize("label, make", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_a_tensor_exported_again_and_changed_exports_as_python(label: str,
                                                                 make: Callable[[], Any]) -> None:
    # The compiled export keeps what it read of a tensor exported more than once: every
    # export, also after a slot was replaced, is the Python method's.
    python = _exchange.python_dlpack or Tensor.__dlpack__
    t = make()

    def same() -> None:
        for kwargs in ({"max_version": (1, 3)}, {}):
            a, b = _call(t.__dlpack__, **kwargs), _call(python, t, **kwargs)
            assert a[0] == b[0], (label, kwargs, a, b)
            if a[0] == "error":
                assert a == b, (label, kwargs)
            else:
                assert _capsule_view(a[1]) == _capsule_view(b[1]), (label, kwargs)

    for _ in range(3):
        same()
    t._readonly = not t._readonly
    same()
    same()
    if t._shape and t._strides is None and len(t._shape) == 1 and t._shape[0] > 1:
        t._shape, t._nbytes = (t._shape[0] - 1,), t._nbytes - t._nbytes // t._shape[0]
        same()
        same()


def test_a_released_hb_tensor_frees_its_slots_subclasses_too() -> None:
    class Held:
        pass

    class Sub(Tensor):
        __slots__ = ("extra",)

    class WithDict(Tensor):
        pass

    for cls in (Tensor, Sub, WithDict):
        t = cls.__new__(cls)
        t._owner, t._source = Held(), Held()
        refs = [weakref.ref(t._owner), weakref.ref(t._source), weakref.ref(t)]
        if cls is Sub:
            t.extra = Held()
            refs.append(weakref.ref(t.extra))
        if cls is WithDict:
            t.attr = Held()
            refs.append(weakref.ref(t.attr))
        del t
        assert [r() for r in refs] == [None] * len(refs), cls
    chain: Any = None  # a deep chain of owners is released without a deep C stack
    for _ in range(200_000):
        n = Tensor.__new__(Tensor)
        n._owner = chain
        chain = n
    del chain, n


def test_kept_tensors_come_back_fresh() -> None:
    # Compiled, released tensors of exactly hb.Tensor are reused by the import: a reused
    # one has no weak references, no cached export and the slots of its new tensor.
    x = torch.arange(4.0)
    old = [hb.asarray(x) for _ in range(20)]
    for t in old:
        t.__dlpack__(max_version=(1, 0))
        t.__dlpack__(max_version=(1, 0))
    refs = [weakref.ref(t) for t in old]
    del old, t
    gc.collect()
    assert all(r() is None for r in refs)
    y = torch.arange(6.0).reshape(2, 3)
    for _ in range(20):
        t = hb.asarray(y)
        assert weakref.getweakrefcount(t) == 0
        with pytest.raises(AttributeError):
            t._dl  # noqa: B018
        assert _observe_tensor(t, y) == _observe_tensor(asarray_python(y), y)
        assert torch.from_dlpack(t).tolist() == y.tolist()
        assert gc.is_tracked(t)


@needs_compiled
def test_compiled_exports_release_their_tensor_once() -> None:
    live = _capsule.live_exports()
    a = np.arange(4.0)
    t = hb.asarray(a)
    r = weakref.ref(t)
    capsule = t.__dlpack__(max_version=(1, 0))
    assert _capsule.live_exports() == live + 1
    del t
    gc.collect()
    assert r() is not None  # the capsule holds it
    del capsule  # never consumed: the destructor releases
    gc.collect()
    assert r() is None and _capsule.live_exports() == live
    t = hb.asarray(a)
    r = weakref.ref(t)
    out = torch.from_dlpack(t)
    del t
    gc.collect()
    assert r() is not None and out.tolist() == [0.0, 1.0, 2.0, 3.0]
    del out
    gc.collect()
    assert r() is None and _capsule.live_exports() == live


@needs_compiled
def test_a_compiled_export_is_released_by_a_thread_without_the_gil() -> None:
    t = hb.asarray(np.arange(4.0))
    r = weakref.ref(t)
    capsule = t.__dlpack__(max_version=(1, 0))
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
    api.PyCapsule_SetName(capsule, b"used_dltensor_versioned")  # consumed
    deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(  # a CFUNCTYPE call drops the GIL
        ctypes.c_void_p.from_address(p + 16).value)
    del t, capsule
    gc.collect()
    assert r() is not None
    th = threading.Thread(target=deleter, args=(p,))
    th.start()
    th.join()
    gc.collect()
    assert r() is None


@needs_compiled
def test_a_release_keeps_the_exception_in_flight() -> None:
    t = hb.asarray(np.arange(4.0))

    def fails() -> None:
        a = np.from_dlpack(t)  # noqa: F841  (dies while the error unwinds this frame)
        raise KeyError("the original error")

    for _ in range(3):
        with pytest.raises(KeyError, match="the original error"):
            fails()


# ----------------------------------------------- hb.Tensor's exchange table, consumed
@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the exchange API consumer")
    out = tmp_path_factory.mktemp("xapi") / (
        "exchange_api_consumer" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_paths()["include"]
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", f"-I{include}",
                           str(HERE / "exchange_api_consumer.c"), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"the exchange API consumer does not build here: {proc.stderr[-400:]}")
    spec = importlib.util.spec_from_file_location("exchange_api_consumer", out)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _versioned_view(t: Tensor) -> dict[str, Any]:
    """The __dlpack__ path: what a versioned capsule of t says."""
    capsule = t.__dlpack__(max_version=(1, 3))
    v = _capsule.consume_capsule(capsule)
    return {"data": v.data, "device": (v.device_type, v.device_id), "ndim": len(v.shape),
            "dtype": (v.code, v.bits, v.lanes), "shape": v.shape, "strides": v.strides,
            "flags": v.flags}


def _table_view(held: Any) -> dict[str, Any]:
    f = held.fields()
    data = f["data"] + f["byte_offset"] if f["data"] and all(f["shape"]) else 0
    return {"data": data, "device": f["device"], "ndim": f["ndim"], "dtype": f["dtype"],
            "shape": f["shape"], "strides": f["strides"], "flags": f["flags"]}


@needs_compiled
def test_the_table_is_published_on_the_type(consumer: Any) -> None:
    t = hb.asarray(np.arange(3.0))
    assert _capsule.capsule_name(Tensor.__dlpack_c_exchange_api__) == "dlpack_exchange_api"
    assert "__dlpack_c_exchange_api__" in Tensor.__dict__
    assert consumer.table(t) == {"major": 1, "minor": 3, "prev_api": False, "allocator": True,
                                 "from_py": True, "to_py": True, "dltensor_from_py": True,
                                 "stream": True}
    assert consumer.stream(t, 1, 0) == 0 and consumer.stream(t, 2, 0) == 0  # NULL: no stream


@needs_compiled
@pytest.mark.parametrize("label, make", EXPORTS, ids=[e[0] for e in EXPORTS])
def test_the_table_exports_as_dlpack_does(consumer: Any, label: str,
                                          make: Callable[[], Any]) -> None:
    t = make()
    try:
        want: Any = _versioned_view(t)
    except Exception as exc:  # what __dlpack__ refuses, the table refuses alike
        want = exc
    try:
        held = consumer.managed(t)
    except BufferError as exc:
        # Refused, for a consumer to import through __dlpack__ instead (DLPack's rule).
        if isinstance(want, Exception):
            assert type(exc) is type(want) and str(exc) == str(want)
            return
        reason = str(exc)
        assert ("read-only" in reason and t.readonly and t.nbytes) or (
            "device memory of another producer" in reason and t._source is not None), reason
        assert label in ("read-only", "cuda, with source")
        return
    assert not isinstance(want, Exception), (label, want)
    got = _table_view(held)
    assert got == want
    assert held.fields()["version"] == (1, 3) and held.fields()["has_deleter"]
    # borrowed: the same fields, no flags; refused where the flags matter
    try:
        b = consumer.borrowed(t)
    except BufferError as exc:
        assert t._padded and "padded" in str(exc)
    else:
        assert not t.readonly or not t.nbytes
        assert (b["data"] if all(b["shape"]) else 0) == want["data"]
        assert (b["shape"], b["strides"], b["dtype"], b["device"]) == (
            want["shape"], want["strides"], want["dtype"], want["device"])
    held.release()


@needs_compiled
def test_the_table_keeps_the_tensor_alive_until_the_deleter(consumer: Any) -> None:
    live = _capsule.live_exports()
    t = hb.asarray(np.arange(5.0))
    r = weakref.ref(t)
    held = consumer.managed(t)
    assert _capsule.live_exports() == live + 1
    del t
    gc.collect()
    assert r() is not None
    held.release()
    held.release()  # the struct is gone: a second release does nothing
    gc.collect()
    assert r() is None and _capsule.live_exports() == live
    held = consumer.managed(hb.asarray(np.arange(2.0)))
    del held  # dropped without release: the consumer's owner runs the deleter
    gc.collect()
    assert _capsule.live_exports() == live


@needs_compiled
def test_read_only_memory_is_refused_by_the_table_and_flagged_by_dlpack(consumer: Any) -> None:
    t = _read_only()
    with pytest.raises(BufferError, match="read-only") as info:
        consumer.managed(t)
    assert isinstance(info.value, hb.UnsupportedError)
    with pytest.raises(BufferError, match="read-only"):
        consumer.borrowed(t)
    # the fallback DLPack prescribes: __dlpack__ with a version, READ_ONLY set
    assert _versioned_view(t)["flags"] & 1
    assert np.from_dlpack(t).flags.writeable is False


@needs_compiled
def test_the_table_refuses_other_objects(consumer: Any) -> None:
    t = hb.asarray(np.arange(3.0))
    api = type(t).__dlpack_c_exchange_api__
    assert api is Tensor.__dlpack_c_exchange_api__

    class NotATensor:
        __dlpack_c_exchange_api__ = api

    with pytest.raises(TypeError, match=r"expected an hb\.Tensor"):
        consumer.managed(NotATensor())


@needs_compiled
@pytest.mark.parametrize("shape, strides, code, bits, flags, nbytes", [
    ((2, 3), (3, 1), 2, 32, 0, 24),
    ((2, 3), None, 2, 32, 0, 24),
    ((3, 2), (1, 3), 0, 16, 0, 12),
    ((), (), 2, 64, 0, 8),
    ((0, 4), (4, 1), 2, 32, 0, 0),
    ((4,), (1,), 1, 8, 1, 4),             # READ_ONLY
    ((4,), (1,), 1, 8, 2, 4),             # IS_COPIED
    ((6,), (1,), 0, 4, 4, 6),             # padded int4
    ((6,), None, 0, 4, 0, 3),             # packed int4
])
def test_the_table_imports_into_hb_tensor(consumer: Any, shape: tuple[int, ...],
                                          strides: tuple[int, ...] | None, code: int, bits: int,
                                          flags: int, nbytes: int) -> None:
    anchor = hb.asarray(np.arange(1.0))
    calls = consumer.deleter_calls()
    t = consumer.to_py(anchor, shape, strides, code, bits, 1, flags, nbytes, 1)
    assert type(t) is Tensor
    # what the capsule path builds from the same struct (re-exported by an hb.Tensor, so
    # IS_COPIED, a fact of the import only, is compared with the flag itself)
    cap_t = hb.from_dlpack(_CapsuleOf(consumer, shape, strides, code, bits, flags, nbytes))
    for s in ("_shape", "_strides", "_dtype", "_device", "_readonly", "_padded", "_nbytes"):
        assert getattr(t, s) == getattr(cap_t, s), s
    assert t.copied is bool(flags & 2)
    assert type(t.owner).__name__ == "ManagedTensor"
    if nbytes:
        assert bytes(t.memoryview()) == bytes(range(nbytes))
    del cap_t
    gc.collect()
    assert consumer.deleter_calls() == calls + 1  # the capsule path's struct
    del t
    gc.collect()
    assert consumer.deleter_calls() == calls + 2


class _CapsuleOf:
    """The same struct through the capsule path, for comparison."""

    def __init__(self, consumer: Any, *spec: Any) -> None:
        self.t = consumer.to_py(hb.asarray(np.arange(1.0)), *spec[:4], 1, *spec[4:], 1)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.t.__dlpack__(max_version=(1, 3))


@needs_compiled
@pytest.mark.parametrize("lanes, major, bits", [(2, 1, 32), (1, 2, 32), (1, 1, 7)])
def test_a_refused_import_leaves_the_struct_to_the_caller(consumer: Any, lanes: int,
                                                          major: int, bits: int) -> None:
    calls = consumer.deleter_calls()
    with pytest.raises(BufferError, match="stays the caller's"):
        consumer.to_py(hb.asarray(np.arange(1.0)), (2,), (1,), 2, bits, lanes, 0, 16, major)
    assert consumer.deleter_calls() == calls  # not called by the table
    assert consumer.release_refused()
    assert consumer.deleter_calls() == calls + 1


@needs_compiled
def test_the_allocator_gives_aligned_host_memory_without_the_gil(consumer: Any) -> None:
    t = hb.asarray(np.arange(1.0))
    held = consumer.alloc(t, (3, 4), 2, 32, 1)
    f = held.fields()
    assert f["shape"] == (3, 4) and f["strides"] == (4, 1) and f["dtype"] == (2, 32, 1)
    assert f["device"] == (1, 0) and f["data"] % 64 == 0 and f["flags"] == 0
    held.release()
    errors, message = consumer.alloc(t, (3,), 2, 32, 2)
    assert errors == 1 and "host memory" in message
    errors, message = consumer.alloc(t, (3,), 2, 7, 1)
    assert errors == 1 and "element type" in message


def test_tvm_ffi_imports_through_the_table() -> None:
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is in the test extra")
    a = np.arange(6.0).reshape(2, 3)
    t = hb.asarray(a)
    r = weakref.ref(t)
    x = tvm_ffi.from_dlpack(t)
    back = np.from_dlpack(x)
    assert back.ctypes.data == a.ctypes.data and back.tolist() == a.tolist()
    assert tuple(x.shape) == (2, 3)
    del t
    gc.collect()
    assert r() is not None  # tvm_ffi holds the export
    del x, back
    gc.collect()
    assert r() is None


# --------------------------------------------- any producer's table, hb.from_dlpack
def _through(monkeypatch: pytest.MonkeyPatch, obj: Any, table: bool) -> Any:
    with monkeypatch.context() as m:
        if not table:
            m.setattr(_exchange, "compiled", False)
        return _call(hb.from_dlpack, obj)


@needs_compiled
@pytest.mark.parametrize("spec, mode", [
    ((24, (2, 3), (3, 1), 2, 32), 0),
    ((24, (3, 2), (1, 3), 2, 32), 0),
    ((16, (2, 2), (2, 1), 0, 32, 1), 0),     # READ_ONLY
    ((8, (2, 2), (0, 1), 1, 16), 0),         # broadcast
    ((6, (6,), (1,), 0, 4, 4), 0),           # padded int4
    ((24, (2, 3), (3, 1), 2, 32), 1),        # the table raises RuntimeError (torch's way)
    ((24, (2, 3), (3, 1), 2, 32), 6),        # the table raises BufferError
    ((24, (2, 3), (3, 1), 2, 32), 2),        # NULL data with elements
    ((24, (2, 3), (3, 1), 2, 32), 3),        # major version 2
    ((24, (2, 3), (3, 1), 2, 32), 4),        # vector lanes
    ((24, (2, 3), (3, 1), 2, 32), 5),        # past the end of the address space
    ((24, (2, 3), (3, 1), 9, 32), 0),        # an element type without a Hurray type
    ((8, (4,), (1,), 0, 4), 0),              # packed int4 ...
    ((8, (2, 4), (8, 1), 0, 4), 0),          # ... with strides: refused by the Python path
])
def test_a_producer_table_imports_as_its_capsule(consumer: Any, monkeypatch: pytest.MonkeyPatch,
                                                 spec: tuple[Any, ...], mode: int) -> None:
    p = consumer.Producer(*spec[:5], spec[5] if len(spec) > 5 else 0, mode)
    a = _through(monkeypatch, p, True)
    exports_a = p.counts()[0]
    b = _through(monkeypatch, p, False)
    assert a[0] == b[0], (a, b)
    if a[0] == "error":
        assert a == b
    else:
        ta, tb = a[1], b[1]
        assert all(getattr(ta, s) == getattr(tb, s) for s in SLOTS if s != "_source")
        assert ta.data_ptr == p.address() or not ta.nbytes
        assert exports_a == 1
        # the table's struct where it gave one, the capsule's where it refused
        assert type(ta.owner).__name__ == ("ManagedTensor" if mode == 0 else "_ManagedTensor")
        del ta, tb
    del a, b
    gc.collect()
    exports, releases = p.counts()
    assert exports == releases  # every struct released, once


# ------------------------------------------------------------------- both builds
def test_without_the_compiled_module_every_path_is_the_python_one() -> None:
    code = textwrap.dedent("""
        import sys, json, gc
        sys.modules["hurray_bridge._speedups"] = None
        import numpy as np, torch
        import hurray_bridge as hb
        from hurray_bridge import _exchange, _capsule, conversion
        from hurray_bridge.adapters import torch as ht
        x = torch.arange(6.0).reshape(2, 3)
        t = hb.asarray(x)
        y = torch.from_dlpack(t)
        n = hb.convert(x, "numpy")
        c = hb.from_dlpack(np.arange(3.0))
        print(json.dumps([_exchange.compiled, hb.asarray is conversion.asarray,
                          ht.to_hurray is ht.to_hurray.__wrapped__ if hasattr(ht.to_hurray,
                          "__wrapped__") else True, ht.COMPILED_IMPORT,
                          hasattr(hb.Tensor, "__dlpack_c_exchange_api__"),
                          t.owner is x.untyped_storage(), y.data_ptr() == x.data_ptr(),
                          n.ctypes.data == x.data_ptr(), c.shape == (3,),
                          type(hb.Tensor.__dict__["__dlpack__"]).__name__]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        False, True, True, False, False, True, True, True, True, "function"]


# -------------------------------------------------------------------- memory flat
def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_million_import_export_cycles_keep_memory_flat(consumer: Any) -> None:
    cycles = 1_000_000 if COMPILED else 100_000
    x = torch.arange(256.0)
    live = _capsule.live_exports()

    def cycle() -> None:
        t = hb.asarray(x)
        torch.from_dlpack(t)
        np.from_dlpack(t)
        hb.convert(x, "numpy")
        if COMPILED:
            consumer.managed(t).release()

    for _ in range(20_000):
        cycle()
    gc.collect()
    start = _rss_mib()
    for _ in range(cycles):
        cycle()
    gc.collect()
    grown = _rss_mib() - start
    assert grown < 8, f"RSS grew {grown:.1f} MiB over {cycles} cycles"
    assert _capsule.live_exports() == live


# ------------------------------------------------------- hostile slots and reuse
_BORROW = """
import ctypes, copy, pickle, sys
import numpy as np, torch
import hurray_bridge as hb

class Dev(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
class DT(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DL(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Dev), ("ndim", ctypes.c_int32),
                ("dtype", DT), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
class API(ctypes.Structure):  # DLPackExchangeAPI: header, then the five function pointers
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("prev", ctypes.c_void_p), ("alloc", ctypes.c_void_p),
                ("from_py", ctypes.c_void_p), ("to_py", ctypes.c_void_p),
                ("dltensor_from_py", ctypes.c_void_p), ("stream", ctypes.c_void_p)]
get = ctypes.pythonapi.PyCapsule_GetPointer
get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
api = API.from_address(get(hb.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api"))
borrow_fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DL))(
    api.dltensor_from_py)

def borrow(t):
    d = DL()
    assert borrow_fn(t, ctypes.byref(d)) == 0
    return d

for touch in (lambda t: t.descriptor, pickle.dumps, copy.copy, lambda t: None):
    for again in (borrow, np.from_dlpack, torch.from_dlpack):
        t = hb.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
        d = borrow(t)
        touch(t)
        again(t)
        junk = [bytes(range(40)) * 3 for _ in range(2000)]  # reuse of freed memory shows
        print((d.shape[0], d.shape[1], d.strides[0], d.strides[1]))
"""


@needs_compiled
def test_borrowed_arrays_outlive_reads_and_exports_of_the_tensor() -> None:
    """``dltensor_from_py_object_no_sync`` lends shape and strides arrays that live as long
    as the tensor's shape and strides: reading its descriptor (which fills a lazy slot),
    pickling or copying it, and exporting it again leave them as they were."""
    out = subprocess.run([sys.executable, "-c", _BORROW], capture_output=True, text=True,
                         timeout=180, env=dict(os.environ, PYTHONMALLOC="debug"))
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 12 and set(lines) == {"(2, 3, 3, 1)"}, lines


_FORGED_DL = """
import sys, numpy as np
import hurray_bridge as hb
t = hb.asarray(np.arange(6, dtype=np.float32))
for tail in (b"", b"x" * 7, 12345, "x", None):
    t._dl = (t._shape, t._strides, tail)
    o = np.from_dlpack(t)
    assert o.shape == (6,) and o.ctypes.data == t.data_ptr
    t._dl = tuple(getattr(t, k) for k in
                  ("_shape", "_strides", "_data", "_device", "_dtype", "_desc", "_source",
                   "_readonly", "_padded", "_nbytes")) + (tail,)
    o = np.from_dlpack(t)
    assert o.shape == (6,) and o.ctypes.data == t.data_ptr
print("ok")
"""


def test_a_forged_dl_slot_is_never_trusted() -> None:
    """``_dl`` is a slot Python code can set: the compiled export reads back only an entry
    of its own making, whatever tuple is there."""
    out = subprocess.run([sys.executable, "-c", _FORGED_DL], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", (out.returncode, out.stderr[-2000:])


_EVIL_DESC = """
import sys, json
if sys.argv[1] == "python":
    sys.modules["hurray_bridge._speedups"] = None
import numpy as np
import hurray_bridge as hb
out = {}
for mode in ("replace", "delete"):
    t = hb.asarray(np.arange(6, dtype=np.float32))
    real = t.descriptor
    class Evil:  # a descriptor whose layout runs code that changes the tensor
        quantization = None
        @property
        def layout(self):
            if mode == "replace":
                t._shape, t._strides = (2, 3), None
            elif hasattr(t, "_nbytes"):
                del t._nbytes
            return real.layout
    t.__dlpack__(max_version=(1, 0))
    t._desc = Evil()
    got = []
    for _ in range(3):
        try:
            got.append(list(np.from_dlpack(t).shape))
        except Exception as exc:
            got.append(type(exc).__name__)
    out[mode] = got
print(json.dumps(out))
"""


def test_python_code_in_a_forged_descriptor_exports_as_the_python_path() -> None:
    runs = {}
    for build in ("compiled", "python"):
        out = subprocess.run([sys.executable, "-c", _EVIL_DESC, build], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, (build, out.returncode, out.stderr[-2000:])
        runs[build] = out.stdout.strip().splitlines()[-1]
    assert runs["compiled"] == runs["python"]


def test_a_tensor_finalized_before_it_died_is_not_reused() -> None:
    """A subclass whose ``__del__`` turns the tensor into a plain hb.Tensor leaves it marked
    finalized; memory kept for reuse must not carry that mark into the next object."""
    calls: list[int] = []

    class Swap(Tensor):
        __slots__ = ()

        def __del__(self) -> None:
            self.__class__ = Tensor

    class Fin(Tensor):
        __slots__ = ()

        def __del__(self) -> None:
            calls.append(1)

    x = torch.arange(4, dtype=torch.float32)
    hold = [hb.asarray(x) for _ in range(40)]  # whatever was kept is in use now
    for _ in range(16):
        s = object.__new__(Swap)
        del s
    for _ in range(16):
        t = hb.asarray(x)
        t.__class__ = Fin
        del t
    assert len(calls) == 16
    del hold
