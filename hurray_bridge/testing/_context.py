"""What the checks share: the factory under test (:class:`Ctx`) and the ways they ask a
producer for capsules and read them back."""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .._capsule import DLView, consume_capsule
from .._dlpack import DLPACK_VERSION, DLDeviceType
from ..errors import FormatError, UnsupportedError
from ..tensor import Device, canonical_bytes, from_dlview
from ._dtypes import DLPACK_FORM
from ._raw import peek
from ._report import Fail, Skip, short

_BASE_SHAPES: tuple[tuple[int, ...], ...] = ((2, 3), (6,))
REQUEST = DLPACK_VERSION  # max_version the checks send, (1, 3)
# Producers of pinned host memory put kDLCPU in the capsule.
_PINNED = (int(DLDeviceType.kDLCUDAHost), int(DLDeviceType.kDLROCMHost))


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


class Ctx:
    """One factory under test: how it is called, the objects it makes, what their capsules
    must carry, and whether it can give a consumable capsule at all (:meth:`gate`)."""

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
                    errors.append(f"{shape}: {short(exc)}")
                    continue
                except Exception as exc:
                    errors.append(f"{shape}: {short(exc)}")
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
            self.factory_error = f"factory() raised {short(exc)}{tried}"
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
            raise Skip("the factory made no object (see 'factory')")
        return self.factory(self.base_shape, self.dtype) if self.shaped else self.factory()

    def make(self, shape: tuple[int, ...]) -> Any:
        if not self.shaped:
            raise Skip("the factory takes no (shape, dtype_name) arguments, so it cannot make "
                        f"shape {shape}")
        try:
            return self.factory(shape, self.dtype)
        except Exception as exc:
            raise Skip(f"the factory cannot make shape {shape}: {short(exc)}") from None

    @property
    def expect_shape(self) -> tuple[int, ...] | None:
        return self.base_shape if self.shaped else None

    @property
    def dlpack_dtype(self) -> str:
        """The element type the capsules must carry: 1-bit ``bool`` cannot travel through
        DLPack (kDLBool is one byte per element), so a factory asked for bool exports
        bool8."""
        return DLPACK_FORM.get(self.dtype, self.dtype)

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
            raise Skip("the factory made no object (see 'factory')")
        if self._gate is False:
            self._gate = self._base_problem()
        if self._gate:
            raise Skip(f"needs a consumable capsule, and __dlpack__(max_version={REQUEST}) "
                        f"gave none: {self._gate}")

    def _base_problem(self) -> str | None:
        try:
            cap = request(self.base())
            peek(cap)
            consume_capsule(cap)
        except (Fail, Exception) as exc:
            return str(exc) if isinstance(exc, Fail) else short(exc)
        return None


def request(obj: Any, **kwargs: Any) -> object:
    """Ask for a capsule as a consumer does: max_version first, plain call on TypeError."""
    try:
        return obj.__dlpack__(max_version=REQUEST, **kwargs)
    except TypeError:
        if kwargs:
            raise
        return request_legacy(obj)[0]


def request_legacy(obj: Any) -> tuple[object, list[str]]:
    """``obj.__dlpack__()`` with the warnings it emitted (pyarrow 26 deprecates this call)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = obj.__dlpack__()
    return cap, [f"{w.category.__name__}: {w.message}" for w in caught]


def host_bytes(view: DLView) -> bytes | None:
    """The tensor's elements as compact bytes, or None when the host cannot read them."""
    if not Device(view.device_type, view.device_id).is_host_accessible:
        return None
    try:
        t = from_dlview(view)
    except (UnsupportedError, FormatError):
        return None  # an element type Hurray cannot read: 'shape_and_dtype' says so
    return canonical_bytes(t)


def device_of(obj: Any) -> tuple[int, int] | None:
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        return None
    t, i = fn()
    return int(t), int(i)


def same_device(reported: tuple[int, int], in_capsule: tuple[int, int]) -> bool:
    return reported == in_capsule or (reported[0] in _PINNED
                                      and in_capsule[0] == DLDeviceType.kDLCPU)


def claims_readonly(obj: Any) -> tuple[bool | None, str]:
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
