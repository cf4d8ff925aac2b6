"""The adapter contract: the one set of names every ``adapters/<framework>/`` exports.

An adapter is a package ``hurray_bridge.adapters.<name>`` whose ``__all__`` is exactly
:data:`NAMES`, and which satisfies :class:`Adapter` (docs/impl/adapters.md writes the
contract down; ``tests/cross/test_house_rules.py`` holds every adapter to it). The core
reads only these names, through the registry, and so never needs to know which
framework it talks to: a new framework is one folder that fills them in, and its line
in ``_registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .dtypes import DType
    from .tensor import Tensor

__all__ = ["KINDS", "NAMES", "Adapter", "FastExport", "FastImport"]

KINDS = frozenset({"dense", "sparse", "quantized", "sharded"})
"""What an adapter may declare in ``HOLDS``: the kinds of native object it converts."""

FastImport = Callable[[type], "dict[str, tuple[Any, ...] | None]"]
"""``fast_import(tp)``: raw form -> shortcut entry (None: the object is that form) for an
object of exact type ``tp`` (hurray_bridge/_shortcuts.py)."""
FastExport = Callable[[], "dict[str, tuple[Any, ...] | None]"]
"""``fast_export()``: raw form -> entry that builds the native object (None: the raw form
is the native object), best form first."""


@runtime_checkable
class Adapter(Protocol):
    """What every adapter module provides (a module satisfies it by its attributes)."""

    NAME: str
    """The target name: ``hb.convert(x, NAME)``."""
    HOLDS: frozenset[str]
    """The kinds (of :data:`KINDS`) of native object it converts; ``"dense"`` always. The
    core asks the adapter's ``sparse``, ``quant`` and ``shards`` modules only for the
    kinds declared here."""
    DEVICES: frozenset[int]
    """The DLPack device types (``hb.Device.type``) its objects can live on; memory on
    any other device is copied to the host (or refused with ``copy=False``)."""
    LEGACY_EXPORTS_MUTABLE: bool
    """Whether a legacy DLPack capsule it exports carries writable memory (a legacy
    capsule cannot say; the core reads one as read-only unless this is True)."""
    HOLD_HOST_MEMORY: Callable[[Any], Any] | None
    """Called with an object before its host memory is shared, to keep that memory valid
    while it is (``None``: nothing to do)."""
    DEFERRED_SAVE: Any
    """How ``hb.save`` writes its objects when other processes hold their parts (a
    ``hurray_bridge._deferred.DeferredSave``: the file is planned here, and each part is
    written where it is computed), or ``None``: the saving process writes them itself."""
    fast_import: FastImport | None
    """The fast import of hb.convert's shortcuts, or None (hurray_bridge/_shortcuts.py)."""
    fast_export: FastExport | None
    """The fast export of hb.convert's shortcuts, or None."""

    def to_hurray(self, obj: Any, *, copy: bool | None = None) -> Tensor:
        """A native dense object as an hb.Tensor (zero-copy unless a copy is needed)."""

    def from_hurray(self, t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
        """An hb.Tensor as a native object."""

    def dtype_of(self, native: Any) -> DType:
        """The Hurray element type of a native element type."""

    def native_dtype(self, dtype: DType) -> Any:
        """The native element type of a Hurray element type."""

    def native_dtypes(self) -> Mapping[DType, Any]:
        """Its element-type table: every Hurray type it holds, with its native type."""

    def special_kind(self, obj: Any) -> str | None:
        """For an object ``to_hurray`` refused: the kind (of :data:`KINDS`, not
        ``"dense"``) that converts it instead, or None (the refusal stands)."""


NAMES = tuple(sorted(
    [name for name in Adapter.__annotations__]
    + [name for name, value in vars(Adapter).items()
       if callable(value) and not name.startswith("_")]))
"""Every adapter's ``__all__``, sorted: these names and no other."""
