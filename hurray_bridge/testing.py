"""A conformance kit for array libraries: DLPack producer checks and framework round trips.

Two tools for authors of array libraries and of code that builds DLPack capsules:

* :func:`check_producer` runs a battery of checks on any object factory and
  returns a :class:`Report` (one :class:`CheckResult` per check, with the
  reason). The same battery runs as a pytest plugin
  (``pytest --hurray-producer mylib.testing:make_tensor``) and from the
  command line (``hurray check mylib.testing:make_tensor``).
* :func:`assert_round_trip` hands a tensor through a chain of frameworks and
  back, asserting values, dtype, shape and (on request) pointer identity at
  every hop, and names the hop that broke.

Importing this module loads no framework; a check or a hop imports what it
needs. The checks read the producer's struct directly, before consumption,
because they look at exactly what a consumer normalises away (the version,
raw NULL pointers, NULL strides, byte offsets, the deleter); ownership then
goes through the ordinary consumer in :mod:`hurray_bridge._capsule`.

Everything runs in the calling process: a producer that crashes the process
(for instance in its capsule destructor) crashes the check run with it.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import inspect
import os
import sys
import textwrap
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from ._capsule import DLView, capsule_name, consume_capsule
from ._dlpack import (
    DLPACK_VERSION,
    FLAG_IS_COPIED,
    FLAG_IS_SUBBYTE_TYPE_PADDED,
    FLAG_READ_ONLY,
    MAX_NDIM,
    DLManagedTensor,
    DLManagedTensorVersioned,
)
from ._registry import adapter_for
from .conversion import asarray, convert
from .dtypes import DType, dtype_from_dlpack, dtype_from_name
from .errors import CopyRequiredError, CopyWarning, FormatError, UnsupportedError
from .tensor import Device, Tensor, canonical_bytes, from_dlpack, from_dlview

__all__ = [
    "CHECKS",
    "CheckResult",
    "Report",
    "assert_round_trip",
    "check_producer",
    "load_factory",
    "numpy_dtype",
]

# ----------------------------------------------------------------------------- results

PASS, FAIL, SKIP = "pass", "fail", "skip"


class CheckResult(NamedTuple):
    """One check: its name, ``"pass"``, ``"fail"`` or ``"skip"``, and why (a note on a pass)."""

    name: str
    status: str
    why: str = ""


class Report(list[CheckResult]):
    """The results of :func:`check_producer`, in check order; ``str()`` is a table."""

    def __init__(
        self, results: Iterable[CheckResult] = (), *, producer: str = "", dtype: str = ""
    ) -> None:
        super().__init__(results)
        self.producer = producer
        self.dtype = dtype

    @property
    def passed(self) -> list[CheckResult]:
        return [r for r in self if r.status == PASS]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self if r.status == FAIL]

    @property
    def skipped(self) -> list[CheckResult]:
        return [r for r in self if r.status == SKIP]

    @property
    def ok(self) -> bool:
        """No check failed (skips are not failures)."""
        return not self.failed

    def result(self, name: str) -> CheckResult:
        """The result of the check called ``name``."""
        for r in self:
            if r.name == name:
                return r
        names = ", ".join(r.name for r in self)
        raise KeyError(f"no check {name!r} in this report; it has {names}")

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` listing every failed check and why."""
        if self.failed:
            lines = [f"{r.name}: {r.why}" for r in self.failed]
            raise AssertionError(
                f"{len(lines)} DLPack producer check(s) failed for {self.producer or 'producer'}:\n"
                + "\n".join(f"  {line}" for line in lines)
            )

    def __str__(self, width: int = 100) -> str:
        name_w = max([len("check"), *(len(r.name) for r in self)])
        head = f"DLPack producer checks: {self.producer}"
        if self.dtype:
            head += f" ({self.dtype})"
        out = [head, "", f"{'check':<{name_w}}  result  why", f"{'-' * name_w}  ------  {'-' * 40}"]
        indent = " " * (name_w + 10)
        for r in self:
            label = r.status.upper() if r.status == FAIL else r.status
            why = textwrap.wrap(r.why, max(30, width - len(indent))) or [""]
            out.append(f"{r.name:<{name_w}}  {label:<6}  {why[0]}")
            out.extend(indent + w for w in why[1:])
        out += ["", f"{len(self)} checks: {len(self.passed)} passed, {len(self.failed)} failed, "
                    f"{len(self.skipped)} skipped"]
        return "\n".join(out)

    def __repr__(self) -> str:
        return (f"<Report {self.producer or 'producer'}: {len(self.passed)} passed, "
                f"{len(self.failed)} failed, {len(self.skipped)} skipped>")


class _Fail(Exception):
    pass


class _Skip(Exception):
    pass


# ---------------------------------------------------------------- reading raw capsules

_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)  # our own prototypes (see _capsule)
_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_V_NAME, _L_NAME = "dltensor_versioned", "dltensor"
_V_DELETER_OFFSET = DLManagedTensorVersioned.deleter.offset  # 16
_L_DELETER_OFFSET = DLManagedTensor.deleter.offset  # 56
_V_TENSOR_OFFSET = DLManagedTensorVersioned.dl_tensor.offset  # 32
_KNOWN_FLAGS = FLAG_READ_ONLY | FLAG_IS_COPIED | FLAG_IS_SUBBYTE_TYPE_PADDED
_ADDRESS_LIMIT = 1 << 48  # bytes: beyond any real address space (x86-64 and aarch64 use 47-52 bits)


class _Raw(NamedTuple):
    """A capsule's struct exactly as the producer filled it in (read, not consumed)."""

    name: str
    versioned: bool
    version: tuple[int, int] | None
    flags: int
    data: int
    byte_offset: int
    device: tuple[int, int]
    ndim: int
    code: int
    bits: int
    lanes: int
    shape: tuple[int, ...] | None  # None: NULL, or ndim out of range (not read)
    strides: tuple[int, ...] | None  # None: NULL (or not read)
    deleter: int
    address: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape or ():
            n *= d
        return n

    @property
    def pointer(self) -> int:
        return self.data + self.byte_offset if self.data else 0

    def describe(self) -> str:
        kind = f"DLPack {self.version[0]}.{self.version[1]}" if self.version else "legacy"
        return f"'{self.name}' ({kind})"


def _peek(capsule: object) -> _Raw:
    """Read a fresh capsule's struct without taking ownership (``_Fail``: no DLPack capsule)."""
    name = capsule_name(capsule)
    if name is None:
        what = "an unnamed capsule" if type(capsule).__name__ == "PyCapsule" else (
            f"a {type(capsule).__module__}.{type(capsule).__qualname__} object")
        raise _Fail(f"__dlpack__ returned {what}, not a DLPack capsule")
    if name not in (_V_NAME, _L_NAME):
        hint = " (already consumed)" if name in ("used_" + _V_NAME, "used_" + _L_NAME) else ""
        raise _Fail(f"capsule name {name!r}{hint}, expected '{_V_NAME}' or '{_L_NAME}'")
    versioned = name == _V_NAME
    p: int = _GetPointer(capsule, name.encode())
    if versioned:
        m = DLManagedTensorVersioned.from_address(p)
        version: tuple[int, int] | None = (m.version.major, m.version.minor)
        flags = m.flags
        deleter = ctypes.c_void_p.from_address(p + _V_DELETER_OFFSET).value or 0
        if m.version.major != DLPACK_VERSION[0]:
            # Another major may lay out everything after `flags` differently: read no further.
            return _Raw(name, True, version, flags, 0, 0, (0, 0), -1, 0, 0, 0, None, None,
                        deleter, p)
        t = m.dl_tensor
    else:
        lm = DLManagedTensor.from_address(p)
        version, flags = None, 0
        deleter = ctypes.c_void_p.from_address(p + _L_DELETER_OFFSET).value or 0
        t = lm.dl_tensor
    ndim = t.ndim
    shape_p = ctypes.cast(t.shape, ctypes.c_void_p).value
    strides_p = ctypes.cast(t.strides, ctypes.c_void_p).value
    shape = strides = None
    if 0 <= ndim <= MAX_NDIM:
        if ndim == 0:
            shape, strides = (), (() if strides_p else None)
        else:
            if shape_p:
                shape = tuple((ctypes.c_int64 * ndim).from_address(shape_p))
            if strides_p:
                strides = tuple((ctypes.c_int64 * ndim).from_address(strides_p))
    return _Raw(name, versioned, version, flags, t.data or 0, t.byte_offset,
                (t.device.device_type, t.device.device_id), ndim, t.dtype.code, t.dtype.bits,
                t.dtype.lanes, shape, strides, deleter, p)


def _compact_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def _validate(raw: _Raw, shape: tuple[int, ...] | None = None,
              dtype: str | None = None) -> tuple[list[str], list[str]]:
    """What is wrong with a struct (problems) and what is odd but allowed (notes)."""
    problems: list[str] = []
    notes: list[str] = []
    if raw.version is not None and raw.version[0] != DLPACK_VERSION[0]:
        return [f"DLPack major version {raw.version[0]} (this kit reads 1)"], notes
    if not 0 <= raw.ndim <= MAX_NDIM:
        return [f"ndim {raw.ndim} outside 0..{MAX_NDIM}"], notes
    if raw.shape is None:
        return [f"NULL shape for ndim {raw.ndim}"], notes
    if any(d < 0 for d in raw.shape):
        problems.append(f"negative dimension in shape {raw.shape}")
    if shape is not None and raw.shape != shape:
        problems.append(f"shape {raw.shape}, but the factory was asked for {shape}")
    if raw.lanes != 1:
        problems.append(f"lanes={raw.lanes}: vector element types are not array elements")
    try:
        found: DType | None = dtype_from_dlpack(raw.code, raw.bits, raw.lanes)
    except Exception:
        found = None
        problems.append(f"dtype (code {raw.code}, bits {raw.bits}) is no DLPack element type "
                        "Hurray knows")
    if found is not None and dtype is not None and found.name != dtype:
        problems.append(f"dtype {found.name}, but the factory was asked for {dtype}")
    itemsize = max(1, raw.bits // 8)
    if raw.ndim and raw.strides is None:
        if raw.version is not None and raw.version >= (1, 2):
            problems.append(f"NULL strides in a DLPack {raw.version[0]}.{raw.version[1]} capsule "
                            "(DLPack 1.2 and later require strides when ndim > 0)")
        else:
            notes.append("NULL strides (compact row-major; allowed before DLPack 1.2)")
    if raw.strides:
        span = 0
        garbage = [s for s in raw.strides if abs(s) * itemsize > _ADDRESS_LIMIT]
        if garbage:
            problems.append(f"garbage strides {raw.strides}: a step of {garbage[0]} elements "
                            f"({abs(garbage[0]) * itemsize} bytes) is beyond any address space")
        for d, s in zip(raw.shape, raw.strides, strict=True):
            if d > 1:
                span += abs(s) * (d - 1) * itemsize
        if raw.elements and span >= 1 << 63 and not garbage:
            problems.append(f"strides {raw.strides} with shape {raw.shape} span more than "
                            "2**63 bytes")
    n = raw.elements
    if n and not raw.data:
        problems.append(f"NULL data pointer for a tensor of {n} element(s)")
    if not n and raw.data:
        notes.append("non-NULL data for a 0-element tensor (allowed; DLPack recommends NULL)")
    if raw.versioned and raw.version is not None and raw.version <= DLPACK_VERSION:
        unknown = raw.flags & ~_KNOWN_FLAGS
        if unknown:
            problems.append(f"unknown flag bits 0x{unknown:x} in a DLPack "
                            f"{raw.version[0]}.{raw.version[1]} capsule")
    if raw.byte_offset:
        notes.append(f"byte_offset {raw.byte_offset}")
    return problems, notes


# ------------------------------------------------------------------ watching the deleter
#
# Before consuming (or dropping) a capsule the kit points its struct's deleter at one
# static trampoline that counts the calls and forwards the first one to the producer's
# deleter; a second call is counted and not forwarded, so a double free is reported
# instead of crashing the run. Entries of structs whose deleter never ran stay, so a
# late call still reaches the producer.

_DeleterFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ForwardFn = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)  # GIL held, as consumers call deleters
_WATCHED: dict[int, list[int]] = {}  # struct address -> [producer's deleter, calls]


def _trampoline(p: int | None, _watched: dict[int, list[int]] = _WATCHED) -> None:
    entry = _watched.get(p or 0)
    if entry is None:
        return
    entry[1] += 1
    if entry[1] == 1 and entry[0]:
        _ForwardFn(entry[0])(p)


_TRAMPOLINE = _DeleterFn(_trampoline)
_TRAMPOLINE_ADDR: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value  # type: ignore[assignment]


class _Watch:
    """Counts the calls of one struct's deleter (installed before the capsule is consumed)."""

    def __init__(self, raw: _Raw) -> None:
        self._addr = raw.address
        self._entry = [raw.deleter, 0]
        _WATCHED[raw.address] = self._entry
        offset = _V_DELETER_OFFSET if raw.versioned else _L_DELETER_OFFSET
        ctypes.c_void_p.from_address(raw.address + offset).value = _TRAMPOLINE_ADDR

    @property
    def calls(self) -> int:
        return self._entry[1]

    def close(self) -> None:
        if self._entry[1] and _WATCHED.get(self._addr) is self._entry:
            del _WATCHED[self._addr]


def _eventually(condition: Callable[[], bool]) -> bool:
    """``condition()`` now, or after a full garbage collection.

    Reference counting frees almost everything at once; a full collection
    (0.1-0.3 s with torch and JAX loaded) is paid only when the condition is
    not met yet, i.e. only on the way to a failure or for objects in cycles.
    """
    if condition():
        return True
    gc.collect()
    gc.collect()
    return condition()


# ------------------------------------------------------------------------- the context

_BASE_SHAPES: tuple[tuple[int, ...], ...] = ((2, 3), (6,))
_EMPTY_SHAPES: tuple[tuple[int, ...], ...] = ((0,), (3, 0, 5))
_RANK64_SHAPE: tuple[int, ...] = (1,) * 62 + (2, 3)
_REQUEST = DLPACK_VERSION  # max_version the checks send, (1, 3)
_PINNED = (3, 11)  # kDLCUDAHost, kDLROCMHost: producers put kDLCPU in the capsule


def _short(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _takes_shape(factory: Callable[..., Any]) -> bool | None:
    """True for factory(shape, dtype_name), False for factory(), None for a hidden signature."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind((2, 3), "float32")
        return True
    except TypeError:
        pass
    try:
        sig.bind()
        return False
    except TypeError:
        return None


class _Ctx:
    def __init__(self, factory: Callable[..., Any], dtype: str, readonly: bool | None) -> None:
        self.factory = factory
        self.dtype = dtype
        self.readonly = readonly
        self.shaped = False
        self.base_shape: tuple[int, ...] | None = None
        self.base_notes: list[str] = []
        self.factory_error: str | None = None
        self._gate: str | bool | None = False  # False: not computed yet
        self._same_object: bool | None = None
        self._setup()

    def _setup(self) -> None:
        form = _takes_shape(self.factory)
        errors: list[str] = []
        if form is not False:
            for shape in _BASE_SHAPES:
                try:
                    obj = self.factory(shape, self.dtype)
                except TypeError as exc:
                    if form is None:  # hidden signature: maybe it takes no arguments
                        break
                    errors.append(f"{shape}: {_short(exc)}")
                    continue
                except Exception as exc:
                    errors.append(f"{shape}: {_short(exc)}")
                    continue
                self.shaped, self.base_shape = True, shape
                if errors:
                    self.base_notes.append(f"cannot make {errors[0]}; using {shape}")
                self._check_object(obj)
                return
            if form is True:
                self.factory_error = ("factory(shape, dtype_name) made no base object: "
                                      + "; ".join(errors))
                return
        try:
            obj = self.factory()
        except Exception as exc:
            tried = f"; factory(shape, dtype_name): {'; '.join(errors)}" if errors else ""
            self.factory_error = f"factory() raised {_short(exc)}{tried}"
            return
        self._check_object(obj)

    def _check_object(self, obj: Any) -> None:
        if not hasattr(obj, "__dlpack__"):
            self.factory_error = (f"the factory made a {type(obj).__module__}."
                                  f"{type(obj).__qualname__}, which has no __dlpack__ method")

    @property
    def form(self) -> str:
        if self.shaped:
            form = f"factory(shape, dtype_name), base shape {self.base_shape}"
            if self.dlpack_dtype != self.dtype:
                form += (f"; {self.dtype} travels through DLPack as {self.dlpack_dtype} (one "
                         f"byte per element): the capsules are checked for {self.dlpack_dtype}")
            return form
        return "factory() making a fixed object"

    def base(self) -> Any:
        if self.factory_error:
            raise _Skip("the factory made no object (see 'factory')")
        return self.factory(self.base_shape, self.dtype) if self.shaped else self.factory()

    def make(self, shape: tuple[int, ...]) -> Any:
        if not self.shaped:
            raise _Skip("the factory takes no (shape, dtype_name) arguments, so it cannot make "
                        f"shape {shape}")
        try:
            return self.factory(shape, self.dtype)
        except Exception as exc:
            raise _Skip(f"the factory cannot make shape {shape}: {_short(exc)}") from None

    @property
    def expect_shape(self) -> tuple[int, ...] | None:
        return self.base_shape if self.shaped else None

    @property
    def dlpack_dtype(self) -> str:
        """The element type the capsules must carry: 1-bit ``bool`` cannot travel through
        DLPack (kDLBool is one byte per element), so a factory asked for bool exports
        bool8."""
        return _DLPACK_FORM.get(self.dtype, self.dtype)

    @property
    def expect_dtype(self) -> str | None:
        return self.dlpack_dtype if self.shaped else None

    def same_object(self) -> bool:
        if self._same_object is None:
            self._same_object = bool(not self.shaped and self.factory() is self.factory())
        return self._same_object

    def tracker(self, obj: Any) -> weakref.ref[Any] | None:
        """A weak reference to the producer object, when its death can mean "released"."""
        if self.same_object():
            return None
        try:
            return weakref.ref(obj)
        except TypeError:
            return None

    def gate(self) -> None:
        """Skip a check that needs a consumable capsule when the producer has none to give."""
        if self.factory_error:
            raise _Skip("the factory made no object (see 'factory')")
        if self._gate is False:
            self._gate = self._base_problem()
        if self._gate:
            raise _Skip(f"needs a consumable capsule, and __dlpack__(max_version={_REQUEST}) "
                        f"gave none: {self._gate}")

    def _base_problem(self) -> str | None:
        try:
            cap = _request(self.base())
            _peek(cap)
            consume_capsule(cap)
        except (_Fail, Exception) as exc:
            return str(exc) if isinstance(exc, _Fail) else _short(exc)
        return None


# Element types with no DLPack form of their own -> the one their library exports.
_DLPACK_FORM = {"bool": "bool8"}


def numpy_dtype(dtype_name: str) -> Any:
    """The NumPy dtype a NumPy-based factory makes for a Hurray element-type name.

    ``dtype_name`` is what the checks pass to a factory: a Hurray name, which is not
    always a NumPy one (``bool8`` is NumPy's ``bool``, an alias NumPy 2 removed;
    ``bfloat16`` and ``float8_*`` come from ml_dtypes). 1-bit ``bool`` gives NumPy's
    ``bool`` too, as DLPack carries it. Imports NumPy (and ml_dtypes where needed).
    """
    from ._registry import get_adapter

    name = dtype_from_name(dtype_name).name
    return get_adapter("numpy").native_dtype(dtype_from_name(_DLPACK_FORM.get(name, name)))


def _request(obj: Any, **kwargs: Any) -> object:
    """Ask for a capsule as a consumer does: max_version first, plain call on TypeError."""
    try:
        return obj.__dlpack__(max_version=_REQUEST, **kwargs)
    except TypeError:
        if kwargs:
            raise
        return _legacy(obj)[0]


def _legacy(obj: Any) -> tuple[object, list[str]]:
    """``obj.__dlpack__()`` with the warnings it emitted (pyarrow 26 deprecates this call)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = obj.__dlpack__()
    return cap, [f"{w.category.__name__}: {w.message}" for w in caught]


def _take(capsule: object) -> tuple[_Raw, DLView]:
    raw = _peek(capsule)
    return raw, consume_capsule(capsule)


def _host_bytes(view: DLView) -> bytes | None:
    """The tensor's elements as compact bytes, or None when the host cannot read them."""
    if not Device(view.device_type, view.device_id).is_host_accessible:
        return None
    try:
        t = from_dlview(view)
    except (UnsupportedError, FormatError):
        return None  # an element type Hurray cannot read: 'shape_and_dtype' says so
    return canonical_bytes(t)


def _device_of(obj: Any) -> tuple[int, int] | None:
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        return None
    t, i = fn()
    return int(t), int(i)


def _same_device(reported: tuple[int, int], in_capsule: tuple[int, int]) -> bool:
    return reported == in_capsule or (reported[0] in _PINNED and in_capsule[0] == 1)


def _claims_readonly(obj: Any) -> tuple[bool | None, str]:
    """What the producer object says about writing to its memory, and how it says it."""
    flags = getattr(obj, "flags", None)
    writeable = getattr(flags, "writeable", None)
    if isinstance(writeable, bool):
        return not writeable, f"flags.writeable={writeable}"
    readonly = getattr(obj, "readonly", None)
    if isinstance(readonly, bool):
        return readonly, f"readonly={readonly}"
    mutable = getattr(obj, "is_mutable", None)
    if isinstance(mutable, bool):
        return not mutable, f"is_mutable={mutable}"
    top = type(obj).__module__.partition(".")[0]
    if top in ("jax", "jaxlib"):
        return True, "JAX arrays are immutable"
    if top == "pyarrow":
        return True, "Arrow arrays are immutable"
    if top == "torch":
        return False, "torch has no read-only tensors"
    return None, ""


# ------------------------------------------------------------------------------ checks

_CheckFn = Callable[[_Ctx], str]
_REGISTRY: dict[str, tuple[_CheckFn, str]] = {}


def _check(name: str, description: str) -> Callable[[_CheckFn], _CheckFn]:
    def register(fn: _CheckFn) -> _CheckFn:
        _REGISTRY[name] = (fn, description)
        return fn

    return register


@_check("factory", "the factory makes an object with __dlpack__, for (shape, dtype_name) or "
                   "with no arguments")
def _factory(ctx: _Ctx) -> str:
    if ctx.factory_error:
        raise _Fail(ctx.factory_error)
    return "; ".join([ctx.form, *ctx.base_notes])


@_check("versioned_capsule", "__dlpack__(max_version=(1, 0)) and (1, 3) give a consumable "
                             "'dltensor_versioned' capsule of DLPack major version 1")
def _versioned_capsule(ctx: _Ctx) -> str:
    legacy: list[tuple[int, int]] = []
    raw: _Raw | None = None
    for mv in ((1, 0), _REQUEST):
        obj = ctx.base()
        try:
            cap = obj.__dlpack__(max_version=mv)
        except TypeError as exc:
            raise _Fail("does not accept max_version (a keyword of the 2023.12 array API): "
                        f"{_short(exc)}") from None
        if capsule_name(cap) == _L_NAME:
            legacy.append(mv)
            _take(cap)
            continue
        raw, _view = _take(cap)
    if legacy:
        raise _Fail(f"answered max_version={', '.join(map(str, legacy))} with a legacy "
                    f"'{_L_NAME}' capsule: no DLPack 1.x export, so no version and no "
                    "READ_ONLY / IS_COPIED flags reach the consumer")
    assert raw is not None and raw.version is not None
    return f"'{_V_NAME}', DLPack {raw.version[0]}.{raw.version[1]}"


@_check("legacy_capsule", "__dlpack__() without max_version gives a consumable legacy "
                          "'dltensor' capsule")
def _legacy_capsule(ctx: _Ctx) -> str:
    obj = ctx.base()
    try:
        cap, warned = _legacy(obj)
    except BufferError as exc:
        raise _Skip(f"refused a legacy export ({_short(exc)}); the array API allows that since "
                    "2024.12, but consumers that never pass max_version (JAX) cannot import "
                    "it") from None
    if capsule_name(cap) == _V_NAME:
        _take(cap)
        raise _Fail(f"answered a call without max_version with a '{_V_NAME}' capsule; a "
                    "consumer that passes no max_version only reads the legacy struct")
    raw, _view = _take(cap)
    note = f"'{raw.name}'"
    if warned:
        note += f"; warned {'; '.join(warned)}"
    return note


@_check("rename_on_consume", "once the consumer renames the capsule to used_*, dropping it "
                             "neither calls the deleter nor frees the memory")
def _rename_on_consume(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    cap = _request(obj)
    raw = _peek(cap)
    watch = _Watch(raw)
    try:
        view = consume_capsule(cap)
        renamed = capsule_name(cap)
        before = _host_bytes(view)
        del obj
        del cap
        calls = watch.calls
        after = _host_bytes(view)
        del view
    finally:
        watch.close()
    if renamed != "used_" + raw.name:
        raise _Fail(f"the capsule is named {renamed!r} after consumption")
    if calls:
        raise _Fail(f"dropping the consumed ('used_') capsule called the deleter {calls} "
                    "time(s): the capsule destructor ignores the name, and the consumer's own "
                    "call then frees the tensor twice")
    if before != after:
        raise _Fail("the tensor's bytes changed once the consumed capsule was dropped: the "
                    "memory was freed while the consumer still held it")
    return f"{raw.describe()} -> {renamed!r}"


@_check("deleter_once", "the consumer's release calls the deleter exactly once, and that "
                        "releases the producer's memory")
def _deleter_once(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref = ctx.tracker(obj)
    cap = _request(obj)
    raw = _peek(cap)
    watch = _Watch(raw)
    try:
        view = consume_capsule(cap)
        del obj, cap
        held = ref is not None and ref() is not None
        early = watch.calls
        owner = view.owner
        del view
        owner.release()  # type: ignore[attr-defined]
        del owner
        _eventually(lambda: watch.calls > 0)
        calls = watch.calls
        alive = held and not _eventually(lambda: ref() is None)  # type: ignore[misc]
    finally:
        watch.close()
    if early:
        raise _Fail(f"the deleter ran {early} time(s) before the consumer released the tensor")
    if calls != 1:
        raise _Fail(f"one release called the deleter {calls} times (DLPack: exactly once)")
    if held and alive:
        raise _Fail("the producer object is still alive after its deleter ran: the deleter "
                    "does not release it (a leak)")
    notes = ["called once"]
    if not raw.deleter:
        notes.append("the deleter is NULL (nothing to free)")
    if held:
        notes.append("producer object released")
    else:
        notes.append("the capsule does not keep the producer object alive, so only the call "
                     "count is observable")
    return "; ".join(notes)


@_check("unconsumed_capsule", "a capsule nobody consumed is released by its destructor, "
                              "once, without a crash")
def _unconsumed_capsule(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref = ctx.tracker(obj)
    cap = _request(obj)
    raw = _peek(cap)
    watch = _Watch(raw)
    try:
        del obj
        held = ref is not None and ref() is not None
        del cap
        _eventually(lambda: watch.calls > 0 or (held and ref() is None))  # type: ignore[misc]
        calls = watch.calls
        alive = held and not _eventually(lambda: ref() is None)  # type: ignore[misc]
    finally:
        watch.close()
    if calls > 1:
        raise _Fail(f"dropping one unconsumed capsule called the deleter {calls} times")
    if calls == 1:
        if held and alive:
            raise _Fail("the capsule destructor called the deleter, but the producer object "
                        "stays alive: the deleter does not release it (a leak)")
        return "the capsule destructor called the deleter once"
    if held and not alive:
        return ("released by the capsule destructor (the producer object is gone) without "
                "calling the struct's deleter")
    if held:
        raise _Fail("dropping an unconsumed capsule released nothing: its destructor never "
                    "calls the deleter and the producer object stays alive (a leak)")
    # The destructor may call the deleter function directly rather than through the
    # struct's field (jaxlib does); with no producer object to watch, nothing shows it.
    raise _Skip("the capsule destructor did not call the deleter through the struct, and the "
                "capsule does not keep the producer object alive, so a release cannot be "
                "observed")


@_check("dlpack_device", "__dlpack_device__() returns (device_type, device_id) integers that "
                         "agree with the device in the capsules")
def _dlpack_device(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        raise _Fail("no __dlpack_device__ method (the array API requires it next to __dlpack__)")
    answer = fn()
    try:
        t, i = answer
        reported = (int(t), int(i))
        if not (isinstance(t, int) and isinstance(i, int)):
            raise TypeError
    except (TypeError, ValueError):
        raise _Fail(f"__dlpack_device__() returned {answer!r}, not a (device_type, device_id) "
                    "pair of integers") from None
    found = []
    raw, _v = _take(_request(obj))
    found.append(("max_version request", raw))
    try:
        cap, _w = _legacy(obj)
        if capsule_name(cap) == _L_NAME:
            found.append(("legacy request", _take(cap)[0]))
    except Exception:
        pass  # reported by legacy_capsule
    for how, r in found:
        if not _same_device(reported, r.device):
            raise _Fail(f"__dlpack_device__() says {Device(*reported)} but the capsule of the "
                        f"{how} says {Device(*r.device)}")
    note = f"{Device(*reported)}"
    if reported != raw.device:
        note += f" (pinned host memory; the capsule says {Device(*raw.device)})"
    return note


@_check("shape_and_dtype", "the capsule describes the shape and dtype the factory was asked "
                           "for, lanes 1, non-NULL data for a non-empty tensor, no unknown flags")
def _shape_and_dtype(ctx: _Ctx) -> str:
    ctx.gate()
    raw, _view = _take(_request(ctx.base()))
    problems, notes = _validate(raw, ctx.expect_shape, ctx.expect_dtype)
    problems = [p for p in problems if "stride" not in p]
    if problems:
        raise _Fail("; ".join(problems))
    dt = dtype_from_dlpack(raw.code, raw.bits, raw.lanes).name
    return "; ".join([f"shape {raw.shape}, {dt}, {raw.describe()}",
                      *(n for n in notes if "stride" not in n)])


@_check("strides", "strides are present (DLPack >= 1.2) and sane, and the versioned and legacy "
                   "exports describe the same memory")
def _strides(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    raw, view = _take(_request(obj))
    problems, notes = _validate(raw)
    problems = [p for p in problems if "stride" in p]
    notes = [n for n in notes if "stride" in n]
    if raw.versioned:
        try:
            cap, _w = _legacy(obj)
            other: tuple[_Raw, DLView] | None = _take(cap) if capsule_name(cap) == _L_NAME else None
        except Exception as exc:
            other = None
            notes.append(f"no legacy export to compare ({_short(exc)})")
        if other is not None:
            problems += _compare(raw, view, *other)
    if problems:
        raise _Fail("; ".join(problems))
    shown = raw.strides if raw.strides is not None else "NULL"
    return "; ".join([f"strides {shown} for shape {raw.shape}", *notes])


def _effective(raw: _Raw) -> tuple[int, ...]:
    assert raw.shape is not None
    return raw.strides if raw.strides is not None else _compact_strides(raw.shape)


def _compare(a: _Raw, av: DLView, b: _Raw, bv: DLView) -> list[str]:
    out = []
    if (a.shape, a.code, a.bits, a.device) != (b.shape, b.code, b.bits, b.device):
        out.append(f"the versioned capsule says shape {a.shape}, dtype ({a.code}, {a.bits}), "
                   f"device {a.device}; the legacy one {b.shape}, ({b.code}, {b.bits}), {b.device}")
        return out
    if a.elements:
        if a.pointer != b.pointer:
            out.append(f"the versioned and legacy capsules point to different memory "
                       f"(0x{a.pointer:x} and 0x{b.pointer:x})")
        sa, sb = _effective(a), _effective(b)
        if any(x != y for d, x, y in zip(a.shape or (), sa, sb, strict=True) if d > 1):
            out.append(f"the versioned capsule has strides {sa}, the legacy one {sb}")
        elif _host_bytes(av) != _host_bytes(bv):
            out.append("the versioned and legacy capsules read different bytes")
    return out


def _shaped_check(ctx: _Ctx, shapes: Sequence[tuple[int, ...]], what: str) -> str:
    """Export each shape, validate the struct, consume it, read it, count the deleter."""
    ctx.gate()
    done: list[str] = []
    skipped: list[str] = []
    problems: list[str] = []
    notes: dict[str, list[str]] = {}  # note -> the shapes it applies to
    for shape in shapes:
        try:
            obj = ctx.make(shape)
        except _Skip as exc:
            skipped.append(str(exc))
            continue
        label = "rank 64" if len(shape) > 8 else str(shape)
        cap = _request(obj)
        raw = _peek(cap)
        found, seen = _validate(raw, shape, ctx.dlpack_dtype)
        if raw.ndim < 0 or raw.shape is None or raw.ndim > MAX_NDIM:
            problems += [f"{label}: {p}" for p in found]
            continue
        watch = _Watch(raw)
        try:
            view = consume_capsule(cap)
            data = _host_bytes(view) if not found else None
            del view, cap, obj
            _eventually(lambda: watch.calls > 0)  # noqa: B023 - called at once
            calls = watch.calls
        finally:
            watch.close()
        n = raw.elements
        if data is not None and n and len(data) != n * max(1, raw.bits // 8):
            found.append(f"read {len(data)} bytes for {n} element(s)")
        if calls != 1:
            found.append(f"the deleter ran {calls} times after one release (DLPack: exactly once"
                         "; NULL-data tensors are where producers forget it, pytorch#117058)")
        problems += [f"{label}: {p}" for p in found]
        for note in seen:
            notes.setdefault(note, []).append(label)
        done.append(label)
    if problems:
        raise _Fail("; ".join(problems))
    if not done:
        raise _Skip("; ".join(skipped))
    return "; ".join([f"{', '.join(done)} {what}",
                      *(f"{', '.join(where)}: {note}" for note, where in notes.items()),
                      *skipped])


@_check("empty_tensors", "shapes (0,) and (3, 0, 5) export consumable capsules with sane strides "
                         "(NULL data recommended) and a deleter called once")
def _empty_tensors(ctx: _Ctx) -> str:
    return _shaped_check(ctx, _EMPTY_SHAPES, "ok")


@_check("rank_0", "a rank-0 tensor exports ndim 0 with non-NULL data for its one element")
def _rank_0(ctx: _Ctx) -> str:
    return _shaped_check(ctx, [()], "ok")


@_check("rank_64", "a rank-64 tensor exports all 64 dimensions and strides")
def _rank_64(ctx: _Ctx) -> str:
    return _shaped_check(ctx, [_RANK64_SHAPE], "ok")


@_check("read_only_flag", "READ_ONLY is set exactly when the producer says its memory must not "
                          "be written")
def _read_only_flag(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    claim: bool | None
    if ctx.readonly is not None:
        claim, how = ctx.readonly, f"check_producer(readonly={ctx.readonly})"
    else:
        claim, how = _claims_readonly(obj)
    raw, _view = _take(_request(obj))
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if not raw.versioned:
        if claim:
            raise _Fail(f"the memory is read-only ({how}) but the producer answers a legacy "
                        "capsule, which has no READ_ONLY flag: consumers get writable access")
        if claim is False:
            return f"legacy capsule (no flags): writable, matching {how}"
        raise _Skip("legacy capsule (no flags), and nothing says whether the memory is "
                    "writable; pass readonly= to check_producer")
    flag = bool(raw.flags & FLAG_READ_ONLY)
    state = "set" if flag else "clear"
    if claim is None:
        raise _Skip(f"READ_ONLY is {state}, but {kind} has no flags.writeable, readonly or "
                    "is_mutable to compare with; pass readonly= to check_producer")
    if flag != claim:
        said = "read-only" if claim else "writable"
        raise _Fail(f"the memory is {said} ({how}) but READ_ONLY is {state}")
    note = f"READ_ONLY {state}, matching {how}"
    if claim:
        note += "; " + _legacy_of_read_only(obj, raw, how)
    return note


def _legacy_of_read_only(obj: Any, raw: _Raw, how: str) -> str:
    """What a legacy request (no READ_ONLY flag to carry) gets of read-only memory: a
    refusal or a private copy pass; the memory itself fails (``raw``: its versioned export,
    still held, so a copy cannot land at the same address)."""
    try:
        cap, _w = _legacy(obj)
    except BufferError as exc:
        return f"legacy request refused ({type(exc).__name__})"
    except Exception as exc:
        return f"legacy request raised {_short(exc, 60)} (see legacy_capsule)"
    if capsule_name(cap) != _L_NAME:
        _take(cap)
        return "a legacy request gets a versioned capsule (see legacy_capsule)"
    lraw, _lview = _take(cap)
    if lraw.elements and lraw.pointer == raw.pointer:
        raise _Fail(f"the memory is read-only ({how}) but a legacy request (no max_version) "
                    f"gets a '{_L_NAME}' capsule of that same memory, which has no READ_ONLY "
                    "flag: legacy-only consumers (apache-tvm-ffi, jax.numpy.from_dlpack) get "
                    "write access. Refuse it with BufferError (as NumPy does), or hand out a "
                    "private copy")
    return "a legacy request gets a private copy"


def _copy_reference(obj: Any) -> tuple[_Raw, DLView, bytes | None]:
    raw, view = _take(_request(obj))
    return raw, view, _host_bytes(view)


def _request_copy(obj: Any, copy: bool) -> object:
    """``obj.__dlpack__(max_version=..., copy=copy)``; a producer that does not take the
    keywords fails the check (a BufferError is the caller's to judge)."""
    try:
        return obj.__dlpack__(max_version=_REQUEST, copy=copy)
    except TypeError as exc:
        raise _Fail(f"does not accept max_version and copy (keywords of the 2023.12 array API): "
                    f"{_short(exc)}") from None


@_check("copy_true", "__dlpack__(copy=True) gives different memory with the same bytes and "
                     "the IS_COPIED flag")
def _copy_true(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref, _ref_view, ref_bytes = _copy_reference(obj)
    try:
        cap = _request_copy(obj, True)
    except BufferError as exc:
        raise _Fail(f"refused copy=True: {_short(exc)}") from None
    raw, view = _take(cap)
    problems = []
    if raw.elements and raw.pointer == ref.pointer:
        problems.append(f"copy=True shares the memory at 0x{raw.pointer:x}: no copy was made")
    got = _host_bytes(view)
    if got is not None and ref_bytes is not None and got != ref_bytes:
        problems.append("the copy's bytes differ from the original's")
    if raw.versioned and not raw.flags & FLAG_IS_COPIED:
        problems.append("IS_COPIED is not set (DLPack requires it on a copy made for the "
                        "consumer)")
    if problems:
        raise _Fail("; ".join(problems))
    if not raw.versioned:
        raise _Skip("a legacy capsule cannot carry IS_COPIED; the data did move "
                    f"(0x{ref.pointer:x} -> 0x{raw.pointer:x}) with the same bytes")
    return f"IS_COPIED, 0x{ref.pointer:x} -> 0x{raw.pointer:x}"


@_check("copy_false", "__dlpack__(copy=False) shares the memory of the ordinary export and "
                      "never sets IS_COPIED")
def _copy_false(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref, _ref_view, _ = _copy_reference(obj)
    try:
        cap = _request_copy(obj, False)
    except BufferError as exc:
        if ref.flags & FLAG_IS_COPIED:
            return f"refused ({_short(exc)}); the ordinary export is a copy too"
        raise _Fail(f"refused copy=False although the ordinary export shares memory: "
                    f"{_short(exc)}") from None
    raw, _view = _take(cap)
    problems = []
    if raw.elements and raw.pointer != ref.pointer:
        problems.append(f"copy=False gave memory at 0x{raw.pointer:x}, the ordinary export "
                        f"0x{ref.pointer:x}: a copy")
    if raw.flags & FLAG_IS_COPIED:
        problems.append("IS_COPIED is set under copy=False")
    if problems:
        raise _Fail("; ".join(problems))
    return f"shares 0x{raw.pointer:x}"


@_check("dl_device", "dl_device equal to __dlpack_device__() is accepted; a foreign device is "
                     "refused with BufferError (or served, on that device)")
def _dl_device(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    own = _device_of(obj)
    if own is None:
        raise _Skip("no __dlpack_device__ to take the device from (see 'dlpack_device')")
    problems, notes = [], []
    try:
        raw, _view = _take(obj.__dlpack__(max_version=_REQUEST, dl_device=own))
        if not _same_device(own, raw.device):
            problems.append(f"dl_device={own} gave a capsule on {Device(*raw.device)}")
    except TypeError as exc:
        raise _Fail(f"does not accept max_version and dl_device (keywords of the 2023.12 array "
                    f"API): {_short(exc)}") from None
    except (_Fail, Exception) as exc:
        problems.append(f"refused dl_device={own}, its own device: "
                        f"{exc if isinstance(exc, _Fail) else _short(exc)}")
    foreign = (2, 0) if own[0] != 2 else (10, 0)  # kDLCUDA, or kDLROCM for a CUDA producer
    for copy in (False, None):
        try:
            cap = obj.__dlpack__(max_version=_REQUEST, dl_device=foreign, copy=copy)
        except BufferError:
            continue
        except Exception as exc:
            problems.append(f"dl_device={foreign}, copy={copy} raised {_short(exc, 100)}; the "
                            "array API asks for BufferError")
            continue
        raw, _view = _take(cap)
        if raw.device != foreign:
            problems.append(f"dl_device={foreign}, copy={copy} gave a capsule on "
                            f"{Device(*raw.device)}: dl_device was ignored")
        elif copy is None and raw.versioned and not raw.flags & FLAG_IS_COPIED:
            problems.append(f"moved to {Device(*foreign)} without IS_COPIED")
        else:
            notes.append(f"served {Device(*foreign)} with copy={copy}")
    if problems:
        raise _Fail("; ".join(problems))
    head = f"own device {Device(*own)} accepted"
    if not notes:
        head += f"; {Device(*foreign)} refused with BufferError"
    return "; ".join([head, *notes])


@_check("stream_none", "__dlpack__(stream=None) is accepted (the default stream; the only "
                       "value a CPU producer must take)")
def _stream_none(ctx: _Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    try:
        cap = obj.__dlpack__(stream=None, max_version=_REQUEST)
    except TypeError:
        try:
            cap = obj.__dlpack__(stream=None)
        except Exception as exc:
            raise _Fail(f"refused stream=None: {_short(exc)}") from None
    except Exception as exc:
        raise _Fail(f"refused stream=None: {_short(exc)}") from None
    raw, _view = _take(cap)
    return raw.describe()


CHECKS: dict[str, str] = {name: desc for name, (_fn, desc) in _REGISTRY.items()}
"""Every check's name and what it verifies, in the order the checks run."""


def _run_one(ctx: _Ctx, name: str) -> CheckResult:
    fn = _REGISTRY[name][0]
    try:
        why = fn(ctx)
        result = CheckResult(name, PASS, why)
    except _Skip as exc:
        result = CheckResult(name, SKIP, str(exc))
    except _Fail as exc:
        result = CheckResult(name, FAIL, str(exc))
    except Exception as exc:
        result = CheckResult(name, FAIL, f"raised {_short(exc, 300)}")
    return result


def _label(factory: Callable[..., Any]) -> str:
    mod = getattr(factory, "__module__", None)
    qual = getattr(factory, "__qualname__", None)
    return f"{mod}:{qual}" if mod and qual else repr(factory)


def check_producer(
    factory: Callable[..., Any],
    *,
    dtype: str = "float32",
    readonly: bool | None = None,
    checks: Iterable[str] | None = None,
    label: str | None = None,
) -> Report:
    """Run the DLPack producer checks on the objects ``factory`` makes.

    ``factory(shape, dtype_name)`` returns a fresh object of that shape and
    element type (``dtype_name`` is a Hurray name such as ``"float32"``); a
    factory taking no arguments returns one fixed object, and the checks that
    need other shapes are skipped. ``readonly`` says whether the producer's
    memory is read-only when the object itself cannot tell (no
    ``flags.writeable``, ``readonly`` or ``is_mutable``). ``checks`` runs a
    subset, by name (see :data:`CHECKS`; one name may be given as a string).
    Never raises for a failing check: the :class:`Report` holds every result
    (``report.raise_if_failed()``). An unknown check name raises ``ValueError``,
    an unknown ``dtype`` :class:`hb.UnsupportedError`.
    """
    dtype = dtype_from_name(dtype).name
    if isinstance(checks, str):
        checks = (checks,)  # one name, not its letters
    asked = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in asked if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(map(repr, unknown))}; the checks are "
                         f"{', '.join(CHECKS)}")
    names = [n for n in CHECKS if n in asked]  # always in the documented order
    ctx = _Ctx(factory, dtype, readonly)
    return Report((_run_one(ctx, n) for n in names), producer=label or _label(factory),
                  dtype=dtype)


def load_factory(spec: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:factory"`` (attribute paths with dots work).

    The current directory is searched too when the module is not found
    elsewhere, as ``python -m`` would. Raises ``ValueError`` naming the problem.
    """
    if not isinstance(spec, str):
        raise ValueError(f"load_factory() takes a 'MODULE:FACTORY' string (for example "
                         f"mylib.testing:make_tensor), got {type(spec).__name__} {spec!r:.60}")
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r} is not MODULE:FACTORY (for example "
                         "mylib.testing:make_tensor)")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        missing = exc.name or module
        if cwd in sys.path or not (module == missing or module.startswith(missing + ".")):
            raise ValueError(f"cannot import {module!r}: {exc}") from exc
        sys.path.insert(0, cwd)
        try:
            mod = importlib.import_module(module)
        except Exception as exc2:
            raise ValueError(f"cannot import {module!r}: {_short(exc2)}") from exc2
    except Exception as exc:
        raise ValueError(f"importing {module!r} failed: {_short(exc)}") from exc
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a callable factory")
    return obj


# ---------------------------------------------------------------------------- round trips


def _framework(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return "hb"
    adapter = adapter_for(obj)
    return "hb" if adapter is None else str(adapter.NAME)


class _HostCopy:
    """A device tensor's host copy, asked of its own producer (``dl_device=CPU, copy=True``)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, **kwargs: Any) -> object:
        return self._obj.__dlpack__(max_version=_REQUEST, dl_device=(1, 0), copy=True)


class _State(NamedTuple):
    dtype: DType
    shape: tuple[int, ...]
    data: bytes
    ptr: int | None  # None: the object cannot be seen without a copy


def _state(obj: Any) -> _State:
    t = asarray(obj)
    try:
        ptr: int | None = asarray(obj, copy=False).data_ptr
    except CopyRequiredError:
        ptr = None
    if not t.device.is_host_accessible:
        t = from_dlpack(_HostCopy(t))
    return _State(t.dtype, t.shape, canonical_bytes(t), ptr)


def _first_difference(a: bytes, b: bytes, itemsize: int) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            k = i // itemsize
            s = slice(k * itemsize, (k + 1) * itemsize)
            return f"element {k} (flat) is {a[s].hex()} before and {b[s].hex()} after"
    return f"{len(a)} bytes before, {len(b)} after"


def _hop(obj: Any, target: str, copy: bool | None) -> Any:
    if target == "hb":
        return asarray(obj, copy=copy)
    return convert(obj, target, copy=copy)


def _check_targets(via: Any) -> None:
    """A usage error (not a failed hop) for ``via`` that names no framework."""
    from ._registry import _ALIASES, ADAPTERS

    if not isinstance(via, (list, tuple)):
        raise UnsupportedError(f"via must be a framework name or a sequence of them, got "
                               f"{type(via).__name__} {via!r:.60}")
    for i, name in enumerate(via):
        if name != "hb" and (not isinstance(name, str) or _ALIASES.get(name, name) not in ADAPTERS):
            raise UnsupportedError(f"via[{i}] = {name!r} is not a framework; choose from "
                                   f"{', '.join(ADAPTERS)} or 'hb'")


def assert_round_trip(
    x: Any, via: Sequence[str] | str | None = None, zero_copy: bool | None = None
) -> Any:
    """Hand ``x`` through the frameworks in ``via`` and back, asserting it survives every hop.

    Hop 1 converts ``x`` to ``via[0]`` with ``hb.convert``, and so on; the last
    hop returns to ``x``'s own framework (an ``hb.Tensor`` for an hb.Tensor or
    any other DLPack producer). ``"hb"`` in ``via`` means ``hb.asarray``;
    ``via=None`` means every installed CPU framework. After each hop the dtype,
    the shape and the bytes (bit-exact, so NaN payloads count) must equal
    ``x``'s. ``zero_copy=True`` also asserts that every hop keeps the data
    pointer (``hb.asarray(obj).data_ptr``); ``zero_copy=False`` converts with
    ``copy=True`` and asserts that every hop moved to new memory.

    Returns the object that came back. Raises ``AssertionError`` naming the hop
    (``"hop 2: torch -> jax: ..."``); a framework that is not installed raises
    :class:`hb.BackendNotAvailableError` unchanged.
    """
    if via is None:
        from .matrix import available_frameworks

        via = [f for f in available_frameworks() if f != _framework(x)]
    elif isinstance(via, str):
        via = (via,)
    _check_targets(via)
    origin = _framework(x)
    chain = [*via, origin]
    copy = True if zero_copy is False else None
    before = _state(x)
    last = before
    names = [origin]
    obj = x
    for i, target in enumerate(chain, 1):
        where = f"hop {i}: {names[-1]} -> {target}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                new = _hop(obj, target, copy)
            except ImportError:
                raise
            except Exception as exc:
                raise AssertionError(f"{where}: conversion failed: {_short(exc, 400)}") from exc
        copies = [str(w.message) for w in caught if issubclass(w.category, CopyWarning)]
        for w in caught:
            if not issubclass(w.category, CopyWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        try:
            after = _state(new)
        except Exception as exc:
            raise AssertionError(f"{where}: the result cannot be read back: {_short(exc, 400)}"
                                 ) from exc
        if after.dtype != before.dtype:
            raise AssertionError(f"{where}: dtype changed {before.dtype.name} -> "
                                 f"{after.dtype.name}" + (f" ({copies[0]})" if copies else ""))
        if after.shape != before.shape:
            raise AssertionError(f"{where}: shape changed {before.shape} -> {after.shape}")
        if after.data != before.data:
            raise AssertionError(f"{where}: values differ: "
                                 + _first_difference(before.data, after.data,
                                                     max(1, before.dtype.bits // 8)))
        prev = last.ptr
        if zero_copy is True and prev != after.ptr:
            reason = copies[0] if copies else (
                "the target's memory cannot be seen without a copy" if after.ptr is None
                else "no CopyWarning was emitted: a silent copy")
            raise AssertionError(f"{where}: data pointer changed {_hex(prev)} -> "
                                 f"{_hex(after.ptr)} ({reason})")
        if zero_copy is False and before.data and prev is not None and prev == after.ptr:
            raise AssertionError(f"{where}: copy=True kept the data pointer {_hex(prev)}")
        names.append(target)
        obj, last = new, after
    return obj


def _hex(p: int | None) -> str:
    return "unknown" if p is None else f"0x{p:x}"
