"""Sharded tensors: one global tensor held as boxes of its index space (docs/spec/sharding.md).

A :class:`ShardedTensor` is a global descriptor (shape and element type) plus
a list of shards, each an :class:`~hurray_bridge.Tensor` whose descriptor has
a :class:`~hurray_bridge.Shard` section: where its box sits in the global
index space, its replica id and the device it belongs to. Building one checks
the set rules of the spec: every box inside the global shape, distinct boxes
never overlap, together they cover every global index; replicas (same box,
different replica id) are allowed; uneven splits and empty shards too.

* :func:`split` cuts any dense tensor into shards by a box layout (zero-copy
  views wherever the memory allows);
* :func:`assemble` materialises the global tensor as one dense tensor (an
  explicit copy);
* :func:`from_jax` and :func:`to_jax` convert a sharded ``jax.Array`` without
  copying the shards (the jax adapter's ``shards`` module, imported on first use);
  ``hb.asarray`` and ``hb.convert`` use them for a jax.Array on several devices.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from . import _subbyte
from ._memory import ALIGNMENT, alloc_aligned
from ._numpy import loaded as numpy_if_loaded
from ._numpy import numpy
from ._registry import get_adapter, get_adapter_module
from .descriptor import DYNAMIC, Descriptor, Shard, compact_strides, form_name
from .dtypes import DType
from .errors import CopyRequiredError, FormatError, UnsupportedError
from .layout import BufferRole, Layout
from .tensor import CPU, Buffer, Device, Tensor, _is_compact, from_native

__all__ = ["Box", "ShardedTensor", "assemble", "copy_shards", "from_jax", "grid_boxes", "split",
           "to_dtensor", "to_jax"]

# A set whose boxes form a compressed grid larger than this is not searched
# for the exact gap; the error then reports how many elements are missing.
_GAP_SEARCH_LIMIT = 1 << 16


class Box(NamedTuple):
    """A box of a global index space: the start index and the extent along each dimension."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def volume(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def is_empty(self) -> bool:
        return 0 in self.sizes

    def slices(self) -> tuple[slice, ...]:
        """The box as a NumPy/JAX index: one ``slice(start, stop)`` per dimension."""
        return tuple(slice(o, o + n) for o, n in zip(self.offsets, self.sizes))

    def intersect(self, other: Box) -> Box | None:
        """The common part of two boxes, or ``None`` when they share no element."""
        offs, sizes = [], []
        for o1, n1, o2, n2 in zip(self.offsets, self.sizes, other.offsets, other.sizes):
            lo, hi = max(o1, o2), min(o1 + n1, o2 + n2)
            if hi <= lo:
                return None
            offs.append(lo)
            sizes.append(hi - lo)
        return Box(tuple(offs), tuple(sizes))

    def __str__(self) -> str:
        return "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(self.offsets, self.sizes)) + "]"


BoxLike = Any  # Box, (offsets, sizes), or a tuple of slices


def _as_box(value: BoxLike, shape: tuple[int, ...], where: str) -> Box:
    """A box from ``(offsets, sizes)`` or a tuple of slices (``slice(None)`` = whole dim)."""
    rank = len(shape)
    if isinstance(value, Box):
        offsets, sizes = value
    elif isinstance(value, tuple) and all(isinstance(v, slice) for v in value) and (
        len(value) == rank and (rank > 0 or value == ())
    ):
        offsets_l, sizes_l = [], []
        for k, (s, g) in enumerate(zip(value, shape)):
            if s.step not in (None, 1):
                raise FormatError(f"dim {k} slices with step {s.step}; a box takes unit steps",
                                  field=where)
            start = 0 if s.start is None else s.start
            stop = g if s.stop is None else s.stop
            if start < 0 or stop < start:
                raise FormatError(f"dim {k} slice {s} is not a forward range of indices",
                                  field=where)
            offsets_l.append(start)
            sizes_l.append(stop - start)
        offsets, sizes = tuple(offsets_l), tuple(sizes_l)
    else:
        try:
            offsets, sizes = value
        except (TypeError, ValueError):
            raise FormatError(
                f"a box is (offsets, sizes) or a tuple of slices, got {value!r}", field=where
            ) from None
    try:
        offsets = tuple(int(o.__index__()) for o in offsets)
        sizes = tuple(int(n.__index__()) for n in sizes)
    except (AttributeError, TypeError):
        raise FormatError(f"box offsets and sizes must be integers, got {value!r}",
                          field=where) from None
    if len(offsets) != rank or len(sizes) != rank:
        raise FormatError(
            f"box {value!r} has {len(offsets)} offsets and {len(sizes)} sizes for a tensor of "
            f"rank {rank}; give one of each per dimension", field=where,
        )
    for k, (o, n, g) in enumerate(zip(offsets, sizes, shape)):
        if o < 0 or n < 0:
            raise FormatError(f"box dim {k} has offset {o} and size {n}; neither may be negative",
                              field=where)
        if o + n > g:
            raise FormatError(
                f"box dim {k} spans [{o}, {o + n}), outside the global size {g}; a box must lie "
                "inside the global shape", field=where,
            )
    return Box(offsets, sizes)


def _ints(values: Any, name: str, low: int) -> tuple[int, ...]:
    """``values`` as a tuple of integers >= ``low`` (NumPy integers welcome; no bools, floats)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise UnsupportedError(f"{name} must be a sequence of integers, got "
                               f"{type(values).__name__} {values!r:.60}")
    out = []
    for k, v in enumerate(values):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise UnsupportedError(f"{name}[{k}] must be an integer, got {type(v).__name__} {v!r}")
        if v.__index__() < low:
            raise FormatError(f"{name}[{k}] = {v} is below {low}; {name} must be >= {low}, got "
                              f"{list(values)}", field=name)
        out.append(v.__index__())
    return tuple(out)


def _device(value: Any, where: str) -> Device:
    try:
        dev = Device(*value)
    except TypeError:
        raise UnsupportedError(f"{where} must be a (device_type, device_id) pair of integers "
                               f"(an hb.Device), got {value!r}") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in dev):
        raise FormatError(f"{where} = {value!r}: device type and id must be non-negative "
                          "integers", field=where)
    return dev


def grid_boxes(shape: Sequence[int], parts: Sequence[int]) -> list[Box]:
    """Boxes of a regular grid: ``parts[k]`` pieces along dimension ``k``, row-major order.

    Sizes follow ``numpy.array_split``: when a dimension does not divide evenly
    the first pieces are one larger; asking for more pieces than there are
    indices gives empty trailing boxes. Both are valid shard layouts.
    """
    shape = _ints(shape, "shape", 0)
    parts = _ints(parts, "parts", 1)
    if len(parts) != len(shape):
        raise FormatError(f"{len(parts)} part counts for rank {len(shape)}", field="parts")
    cuts: list[list[tuple[int, int]]] = []
    for g, p in zip(shape, parts):
        q, r = divmod(g, p)
        edges, pos = [], 0
        for i in range(p):
            n = q + (1 if i < r else 0)
            edges.append((pos, n))
            pos += n
        cuts.append(edges)
    return [Box(tuple(o for o, _ in combo), tuple(n for _, n in combo))
            for combo in itertools.product(*cuts)]


def _box_of(t: Tensor) -> Box:
    sh = t.descriptor.shard
    assert sh is not None
    return Box(sh.offsets, t.shape)


class ShardedTensor:
    """A global tensor held as shards: see the module docstring and docs/spec/sharding.md.

    Parameters
    ----------
    descriptor:
        The global descriptor: shape, element type and sub-byte form (row-major,
        static, without quantization, sparse or shard sections).
    shards:
        hb.Tensors, each with a shard section whose ``global_shape`` is the
        global shape. Their own layout is free (strided views, quantized
        shards); :func:`assemble` needs dense ones.
    partial:
        ``True`` for some of the shards only, such as one process's shards of a
        tensor spread over processes: the boxes need not cover the global shape
        (they still must not overlap). :attr:`is_complete` says whether they do;
        assembling an incomplete set is refused, naming a missing box.

    The shard set is validated on construction; any broken rule raises
    :class:`~hurray_bridge.FormatError` naming the shard, the rule and the fix.
    """

    __slots__ = ("__weakref__", "_boxes", "_complete", "_descriptor", "_origin", "_shards")

    def __init__(self, descriptor: Descriptor, shards: Iterable[Tensor], *,
                 partial: bool = False) -> None:
        if not isinstance(descriptor, Descriptor):
            raise UnsupportedError(  # a TypeError too
                f"descriptor must be an hb.Descriptor, got {type(descriptor).__name__}")
        if descriptor.is_dynamic:
            dims = [i for i, d in enumerate(descriptor.shape) if d == DYNAMIC]
            raise FormatError(
                f"a sharded tensor's global shape has dynamic dimension(s) {dims}; shard boxes "
                "need static sizes (resolve the descriptor first)", field="shape",
            )
        if (descriptor.layout != Layout.ROW_MAJOR or descriptor.quantization is not None
                or descriptor.shard is not None):
            raise FormatError(
                f"the global descriptor must be plain row-major, got {descriptor!r}; "
                "quantization, layouts and shard sections belong to the shards",
                field="descriptor",
            )
        self._descriptor = descriptor
        self._shards = tuple(shards)
        self._origin: tuple[Any, ...] | None = None
        self._boxes, self._complete = _validate(descriptor, self._shards, partial)

    # ------------------------------------------------------------ properties
    @property
    def descriptor(self) -> Descriptor:
        """The global descriptor (shape, element type, sub-byte form)."""
        return self._descriptor

    @property
    def shape(self) -> tuple[int, ...]:
        return self._descriptor.shape

    @property
    def dtype(self) -> DType:
        return self._descriptor.dtype

    @property
    def ndim(self) -> int:
        return self._descriptor.rank

    @property
    def shards(self) -> tuple[Tensor, ...]:
        return self._shards

    @property
    def is_complete(self) -> bool:
        """Whether the boxes cover the global shape (always, unless built ``partial``)."""
        return self._complete

    @property
    def boxes(self) -> tuple[Box, ...]:
        """The box of each shard, in shard order."""
        return self._boxes

    def __len__(self) -> int:
        return len(self._shards)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self._shards)

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        distinct = len({b for b, t in zip(self._boxes, self._shards) if not b.is_empty})
        part = "" if self._complete else ", partial"
        return (f"hb.ShardedTensor(shape=[{dims}], dtype={self.dtype.name}, "
                f"shards={len(self._shards)}, boxes={distinct}{part})")

    def __reduce__(self) -> Any:
        # Shards pickle as hb.Tensors (protocol-5 buffers); the global descriptor as its bytes.
        return _rebuild_sharded, (self._descriptor.to_bytes(), self._shards, not self._complete)

    @classmethod
    def _trusted(cls, descriptor: Descriptor, shards: tuple[Tensor, ...],
                 boxes: tuple[Box, ...], complete: bool = True) -> ShardedTensor:
        """A set laid out exactly as one validated before (the same shard descriptors, boxes
        in shard order, as complete as that one): the jax adapter's per-sharding cache skips
        checking it again."""
        self = cls.__new__(cls)
        self._descriptor = descriptor
        self._shards = shards
        self._origin = None
        self._boxes = boxes
        self._complete = complete
        return self

    def primary_shards(self) -> list[Tensor]:
        """One shard per distinct non-empty box: the one with the lowest replica id."""
        best: dict[Box, Tensor] = {}
        for box, t in zip(self._boxes, self._shards):
            if box.is_empty:
                continue
            cur = best.get(box)
            if cur is None or _replica(t) < _replica(cur):
                best[box] = t
        return list(best.values())

    def assemble(self, to: str = "numpy") -> Any:
        """Same as :func:`assemble` (``to`` is ``"numpy"``, ``"torch"``, ... or ``"hurray"``)."""
        return assemble(self, to=to)


def _rebuild_sharded(desc: bytes, shards: tuple[Tensor, ...],
                     partial: bool = False) -> ShardedTensor:
    return ShardedTensor(Descriptor.from_bytes(desc), shards, partial=partial)


def _replica(t: Tensor) -> int:
    sh = t.descriptor.shard
    assert sh is not None
    return sh.replica_id


def _validate(desc: Descriptor, shards: tuple[Tensor, ...],
              partial: bool = False) -> tuple[tuple[Box, ...], bool]:
    """The shards' boxes, and whether they cover the global shape (required unless partial)."""
    for i, t in enumerate(shards):
        if not isinstance(t, Tensor):
            raise UnsupportedError(f"shards[{i}] is a {type(t).__name__}, not an hb.Tensor")
    return check_set(desc, [t.descriptor for t in shards], partial)


def check_set(desc: Descriptor, shards: Sequence[Descriptor],
              partial: bool = False) -> tuple[tuple[Box, ...], bool]:
    """The rules of a shard set (sharding.md §3) on the shards' descriptors alone: the
    boxes, and whether they cover ``desc``'s global shape (required unless ``partial``).

    The one place of these rules: :class:`ShardedTensor`, the file readers that group
    shard entries, ``verify`` and every file writer (which refuses what its reader would)
    call it. Errors name ``shards[i]``, the position in ``shards``.
    """
    shape = desc.shape
    boxes: list[Box] = []
    seen: dict[tuple[Box, int], int] = {}
    for i, d in enumerate(shards):
        where = f"shards[{i}]"
        sh = d.shard
        if sh is None:
            raise FormatError(
                f"{where} has no shard section; give its descriptor a Shard(global_shape, "
                "offsets, ...) or cut the tensor with hb.split()", field=where,
            )
        if sh.global_shape != shape:
            raise FormatError(
                f"{where} belongs to a global shape {list(sh.global_shape)}, this tensor's is "
                f"{list(shape)}; every shard of a set has the same global shape", field=where,
            )
        if d.dtype != desc.dtype or d.padded != desc.padded:
            form = lambda x: f"{x.dtype.name}{' (padded)' if x.padded else ''}"  # noqa: E731
            raise FormatError(
                f"{where} holds {form(d)} but the global tensor is {form(desc)}; every shard "
                "of a set has the global element type", field=where,
            )
        box = Box(sh.offsets, d.shape)
        boxes.append(box)
        if box.is_empty:
            continue  # empty shards cover nothing: they never overlap or duplicate
        key = (box, sh.replica_id)
        if key in seen:
            raise FormatError(
                f"{where} and shards[{seen[key]}] both hold box {box} as replica "
                f"{sh.replica_id}; copies of one box need distinct replica ids", field=where,
            )
        seen[key] = i

    # Distinct boxes must not overlap (identical boxes are replicas, checked above).
    first: dict[Box, int] = {}
    for i, b in enumerate(boxes):
        if not b.is_empty:
            first.setdefault(b, i)
    distinct = sorted(first, key=lambda b: b.offsets)
    if desc.rank:
        for a_i, a in enumerate(distinct):
            end0 = a.offsets[0] + a.sizes[0]
            for b in distinct[a_i + 1:]:
                if b.offsets[0] >= end0:
                    break  # sorted by offsets[0]: no later box can reach back into a
                common = a.intersect(b)
                if common is not None:
                    raise FormatError(
                        f"shards[{first[a]}] (box {a}) and shards[{first[b]}] (box {b}) overlap "
                        f"in {common}; distinct boxes must not share elements (only identical "
                        "boxes, as replicas, may)", field=f"shards[{first[b]}]",
                    )
    covered = sum(b.volume for b in distinct)
    total = 1
    for g in shape:
        total *= g
    if covered != total and not partial:
        gap = _find_gap(shape, distinct)
        at = f"; index {list(gap)} is in no box" if gap is not None else ""
        raise FormatError(
            f"the shards cover {covered} of the {total} elements of global shape {list(shape)}"
            f"{at}; the boxes must tile the global shape (add the missing shards)",
            field="shards",
        )
    return tuple(boxes), covered == total


def _find_gap(shape: tuple[int, ...], boxes: list[Box]) -> tuple[int, ...] | None:
    """An index no box covers, searched on the grid the box edges cut (bounded)."""
    edges = []
    cells = 1
    for k, g in enumerate(shape):
        cut = sorted({0, g, *(b.offsets[k] for b in boxes), *(b.offsets[k] + b.sizes[k]
                                                               for b in boxes)})
        cut = [c for c in cut if c <= g]
        edges.append(cut[:-1])
        cells *= max(len(cut) - 1, 1)
    if cells > _GAP_SEARCH_LIMIT:
        return None
    for point in itertools.product(*edges):
        if not any(all(o <= p < o + n for p, o, n in zip(point, b.offsets, b.sizes))
                   for b in boxes):
            return tuple(point)
    return None


# -------------------------------------------------------------------- split
def _strided_tensor(
    ptr: int, shape: tuple[int, ...], dtype: DType, strides: tuple[int, ...] | None,
    padded: bool, shard: Shard | None, device: Device, owner: object, readonly: bool,
    copied: bool,
) -> Tensor:
    """A dense tensor whose element [0..0] is at ``ptr``, described with a shard section."""
    if strides is not None and _is_compact(shape, strides):
        strides = None
    layout = Layout.ROW_MAJOR if strides is None else Layout.STRIDED
    d = Descriptor(shape, dtype, layout, strides, shard=shard, padded=padded)
    nbytes = d.nbytes
    if nbytes == 0:
        base = 0
    elif strides is None:
        base = ptr
    else:
        back = sum((n - 1) * -s for n, s in zip(shape, strides) if s < 0)
        base = ptr - back * dtype.itemsize
    return Tensor(d, [Buffer(BufferRole.DATA, base, nbytes)], device=device, owner=owner,
                  readonly=readonly, copied=copied)


def _shard_view(d: Descriptor, ptr: int, device: Device, owner: object, readonly: bool,
                copied: bool, source: Any = None) -> Tensor:
    """A dense shard over ``ptr`` (element [0..0]) with the prebuilt, validated descriptor
    ``d``, shard section included, without building and checking it again."""
    t = Tensor._dense(ptr, d.shape, d.dtype, strides=d.strides, padded=d.padded, device=device,
                      owner=owner, readonly=readonly, copied=copied, source=source)
    t._desc = d
    return t


def _dense_source(obj: Any) -> Tensor:
    # Not hb.asarray: hb.asarray routes sharded arrays here, so this module cannot call it.
    t = from_native(obj)
    if not t.is_dense:
        d = t.descriptor
        what = form_name(d)
        raise UnsupportedError(
            f"split() cuts dense tensors; a {what} tensor has no element-addressable boxes "
            "(densify it first, or build each shard's descriptor by hand)"
        )
    return t


def split(
    tensor: Any,
    boxes: Iterable[BoxLike],
    *,
    replica_ids: Sequence[int] | None = None,
    devices: Sequence[Device | tuple[int, int]] | None = None,
    copy: bool | None = None,
) -> ShardedTensor:
    """Cut a dense tensor into shards, one per box.

    ``tensor`` is an hb.Tensor or any native array :func:`hb.asarray` takes.
    Each box is ``(offsets, sizes)``, a :class:`Box` or a tuple of slices;
    together the boxes must tile the tensor (a box given twice becomes a
    replica: its replica ids count up unless ``replica_ids`` says otherwise).
    ``devices`` records where each shard belongs (its shard section; default
    the tensor's own device); the memory does not move.

    ``copy=None``: each shard is a view of the tensor's memory (row-major when
    the box is a contiguous run, strided otherwise). Packed sub-byte elements
    share bytes, so a box whose first or last element does not start or end a
    byte is copied, and that shard says so (``copied``). ``copy=False`` raises
    :class:`CopyRequiredError` instead; ``copy=True`` copies every shard into
    fresh compact memory.
    """
    t = _dense_source(tensor)
    shape = t.shape
    gdesc = Descriptor(shape, t.dtype, padded=t.descriptor.padded)
    if isinstance(boxes, (str, bytes)) or not hasattr(boxes, "__iter__"):
        raise UnsupportedError(f"boxes must be an iterable of boxes ((offsets, sizes), a Box or "
                               f"a tuple of slices), got {type(boxes).__name__} {boxes!r:.60}")
    box_list = [_as_box(b, shape, f"boxes[{i}]") for i, b in enumerate(boxes)]
    if replica_ids is not None and len(replica_ids) != len(box_list):
        raise FormatError(f"{len(replica_ids)} replica ids for {len(box_list)} boxes",
                          field="replica_ids")
    if devices is not None and len(devices) != len(box_list):
        raise FormatError(f"{len(devices)} devices for {len(box_list)} boxes", field="devices")
    counts: dict[Box, int] = {}
    shards = []
    for i, box in enumerate(box_list):
        if replica_ids is not None:
            rid = replica_ids[i]
        else:
            rid = counts.get(box, 0)
            counts[box] = rid + 1
        dev = _device(devices[i], f"devices[{i}]") if devices is not None else t.device
        shard = Shard(shape, box.offsets, rid, dev.type, dev.id)
        shards.append(_cut(t, box, shard, copy, f"boxes[{i}]"))
    return ShardedTensor(gdesc, shards)


def _cut(t: Tensor, box: Box, shard: Shard, copy: bool | None, where: str) -> Tensor:
    dtype, padded = t.dtype, t.descriptor.padded
    packed = dtype.is_subbyte and not padded
    strides = t.strides if t.strides is not None else compact_strides(t.shape)
    if box.is_empty:
        return _strided_tensor(0, box.sizes, dtype, None, padded, shard, t.device, None,
                               t.readonly, t.copied)
    start = sum(o * s for o, s in zip(box.offsets, strides))
    if packed:
        # Packed tensors are always compact row-major, so a contiguous box is one run of bits.
        run = _is_compact(box.sizes, strides)
        end = start + box.volume
        total = 1
        for g in t.shape:
            total *= g
        aligned = (start * dtype.bits) % 8 == 0 and (end == total or (end * dtype.bits) % 8 == 0)
        if run and aligned and not copy:
            ptr = t.buffers[0].ptr + start * dtype.bits // 8
            return _strided_tensor(ptr, box.sizes, dtype, None, padded, shard, t.device, t,
                                   t.readonly, t.copied)
        if copy is False:
            why = ("is not one contiguous run" if not run
                   else "starts or ends inside a byte another box shares")
            raise CopyRequiredError(
                f"{where}: box {box} of packed {dtype.name} {why}, so it cannot be a view; "
                "pass copy=None to copy it, or split a padded tensor"
            )
        return _copy_packed_box(t, box, shard)
    if not copy:
        ptr = t.data_ptr + start * dtype.itemsize
        return _strided_tensor(ptr, box.sizes, dtype, strides, padded, shard, t.device, t,
                               t.readonly, t.copied)
    out = _extract_dense([(Box(tuple(0 for _ in box.sizes), t.shape), t)], box, dtype, padded)
    return _strided_tensor(out.buffers[0].ptr, box.sizes, dtype, None, padded, shard, CPU,
                           out.owner, False, True)


def _copy_packed_box(t: Tensor, box: Box, shard: Shard) -> Tensor:
    np = _numpy("copy a packed sub-byte box")
    pack_subbyte, unpack_subbyte = _subbyte_codecs()

    _require_host(t, "copy a shard")
    codes = unpack_subbyte(np.frombuffer(t.memoryview(), np.uint8),
                           _volume(t.shape), t.dtype.bits).reshape(t.shape)
    packed = pack_subbyte(codes[box.slices()], t.dtype.bits)
    alloc = alloc_aligned(packed.nbytes)
    assert alloc is not None  # the box is not empty
    ctypes.memmove(alloc.ptr, packed.ctypes.data, packed.nbytes)
    return _strided_tensor(alloc.ptr, box.sizes, t.dtype, None, False, shard, CPU,
                           alloc, False, True)


def _subbyte_codecs() -> tuple[Any, Any]:
    """The core's sub-byte pack/unpack (one implementation of the bit order)."""
    return _subbyte.pack, _subbyte.unpack


def _volume(shape: Sequence[int]) -> int:
    n = 1
    for g in shape:
        n *= g
    return n


def _numpy(why: str) -> Any:
    return numpy(f"NumPy is needed to {why}")


def _require_host(t: Tensor, what: str) -> None:
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"cannot {what} on {t.device}: the bridge copies host memory only; move the shards "
            "to the host with their framework first"
        )


# ----------------------------------------------------------------- assembly
_WORDS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}  # element size -> copy unit

def _copy_strided(
    dst: int, dst_strides: Sequence[int], src: int, src_strides: Sequence[int],
    shape: Sequence[int], isz: int,
) -> None:
    """Copy a box of ``isz``-byte elements between two strided host layouts."""
    if _volume(shape) == 0:
        return
    np = numpy_if_loaded()
    if np is not None:
        # NumPy is loaded in this process anyway: let it walk the strides in C, moving
        # whole elements as unsigned integers of their size (bytes one by one are ~10x
        # slower); other sizes go as rows of bytes.
        word = _WORDS.get(isz)
        dt = np.dtype(word or np.uint8)
        tail: tuple[int, ...] = () if word else (isz,)  # shape and stride of the byte rows
        step: tuple[int, ...] = () if word else (1,)

        def view(ptr: int, strides: Sequence[int], writeable: bool) -> Any:
            base = np.frombuffer((ctypes.c_ubyte * dt.itemsize).from_address(ptr), dt, 1)
            return np.lib.stride_tricks.as_strided(
                base, shape=(*shape, *tail), strides=(*(s * isz for s in strides), *step),
                writeable=writeable)

        view(dst, dst_strides, True)[...] = view(src, src_strides, False)
        return
    # Without NumPy: memmove the longest run that is contiguous on both sides.
    k, run = len(shape), 1
    while k > 0 and dst_strides[k - 1] == run and src_strides[k - 1] == run:
        k -= 1
        run *= shape[k]
    nbytes = run * isz
    for idx in itertools.product(*(range(n) for n in shape[:k])):
        d_off = sum(i * s for i, s in zip(idx, dst_strides))
        s_off = sum(i * s for i, s in zip(idx, src_strides))
        ctypes.memmove(dst + d_off * isz, src + s_off * isz, nbytes)


def _extract_dense(
    pieces: list[tuple[Box, Tensor]], target: Box, dtype: DType, padded: bool,
) -> Tensor:
    """Copy the part of each (box, dense host tensor) inside ``target`` into a fresh tensor.

    The pieces must cover ``target``: the memory is not zeroed first.
    """
    out_shape = target.sizes
    n = _volume(out_shape)
    if dtype.is_subbyte and not padded:
        return _extract_packed(pieces, target, dtype)
    if not n:
        return Tensor._dense(0, out_shape, dtype, strides=None, padded=padded, device=CPU,
                             owner=None, readonly=False, copied=True)
    base, owner = _fresh_host(n * dtype.itemsize)
    out_strides = compact_strides(out_shape)
    isz = dtype.itemsize
    for box, t in pieces:
        common = box.intersect(target)
        if common is None:
            continue
        _require_host(t, "assemble shards")
        src_strides = t.strides if t.strides is not None else compact_strides(t.shape)
        src = t.data_ptr + sum((c - o) * s for c, o, s in
                               zip(common.offsets, box.offsets, src_strides)) * isz
        dst = base + sum((c - o) * s for c, o, s in
                         zip(common.offsets, target.offsets, out_strides)) * isz
        _copy_strided(dst, out_strides, src, src_strides, common.sizes, isz)
    return Tensor._dense(base, out_shape, dtype, strides=None, padded=padded,
                         device=CPU, owner=owner, readonly=False, copied=True)


_UNZEROED_FROM = 1 << 20  # bytes; smaller allocations are cheap to zero


def _fresh_host(nbytes: int) -> tuple[int, object]:
    """``(pointer, owner)`` of ``nbytes`` of 64-byte aligned host memory, not zeroed when
    NumPy is loaded and the size is large: an assembly writes every byte, and zeroing
    first (ctypes' memset) took longer than the copy itself (65 ms for 64 MiB)."""
    np = numpy_if_loaded()
    if np is None or nbytes < _UNZEROED_FROM:
        alloc = alloc_aligned(nbytes)
        assert alloc is not None  # nbytes > 0
        return alloc.ptr, alloc
    raw = np.empty(nbytes + ALIGNMENT - 1, np.uint8)
    ptr = raw.ctypes.data
    return ptr + (-ptr % ALIGNMENT), raw


def _extract_packed(pieces: list[tuple[Box, Tensor]], target: Box, dtype: DType) -> Tensor:
    # Packed elements share bytes: place them as one-per-byte codes, then pack once.
    np = _numpy("assemble packed sub-byte shards")
    pack_subbyte, unpack_subbyte = _subbyte_codecs()

    codes = np.zeros(target.sizes, np.uint8)
    for box, t in pieces:
        common = box.intersect(target)
        if common is None:
            continue
        _require_host(t, "assemble shards")
        src = unpack_subbyte(np.frombuffer(t.memoryview(), np.uint8), box.volume,
                             dtype.bits).reshape(box.sizes)
        codes[tuple(slice(c - o, c - o + n) for c, o, n in
                    zip(common.offsets, target.offsets, common.sizes))] = src[
            tuple(slice(c - o, c - o + n) for c, o, n in
                  zip(common.offsets, box.offsets, common.sizes))]
    packed = pack_subbyte(codes, dtype.bits)
    alloc = alloc_aligned(packed.nbytes)
    if alloc is not None:
        ctypes.memmove(alloc.ptr, packed.ctypes.data, packed.nbytes)
    return Tensor._dense(alloc.ptr if alloc else 0, target.sizes, dtype, strides=None,
                         padded=False, device=CPU, owner=alloc, readonly=False,
                         copied=True)


def _pieces(sharded: ShardedTensor) -> list[tuple[Box, Tensor]]:
    if not sharded.is_complete:
        _refuse_incomplete(sharded, "assemble")
    out = []
    for t in sharded.primary_shards():
        if not t.is_dense:
            d = t.descriptor
            what = form_name(d)
            raise UnsupportedError(
                f"cannot assemble a {what} shard (box {_box_of(t)}): assembly copies dense "
                "elements; dequantize or densify the shards first"
            )
        out.append((_box_of(t), t))
    return out


def assemble(sharded: ShardedTensor, to: str = "numpy") -> Any:
    """The global tensor as one dense, compact tensor: always a copy.

    Each distinct box is read from its replica with the lowest replica id.
    ``to`` names the result: ``"hurray"`` for an hb.Tensor, or any adapter
    target (``"numpy"``, ``"torch"``, ...), handed the fresh 64-byte aligned
    memory without a second copy. Shards must be dense and host-accessible.
    """
    if not isinstance(sharded, ShardedTensor):
        raise UnsupportedError(
            f"assemble() takes an hb.ShardedTensor, got {type(sharded).__name__}")
    full = Box(tuple(0 for _ in sharded.shape), sharded.shape)
    out = _extract_dense(_pieces(sharded), full, sharded.dtype, sharded.descriptor.padded)
    if to in ("hurray", "hb"):
        return out
    return get_adapter(to).from_hurray(out)


def copy_shards(sharded: ShardedTensor) -> ShardedTensor:
    """The same shard set with every shard copied into fresh compact host memory.

    What ``hb.asarray(x, copy=True)`` gives for a sharded ``x``: each shard keeps
    its box, replica id and device record. Shards must be host-accessible.
    """
    shards = []
    for i, (box, t) in enumerate(zip(sharded.boxes, sharded.shards)):
        sh = t.descriptor.shard
        assert sh is not None  # checked when the set was built
        if not t.is_dense:
            _require_host(t, "copy a shard")
            shards.append(t.copy())  # buffer by buffer; the descriptor keeps its section
            continue
        whole = Box(tuple(0 for _ in box.sizes), box.sizes)
        shards.append(_cut(t, whole, sh, True, f"shards[{i}]"))
    return ShardedTensor(sharded.descriptor, shards)


def describe(sharded: ShardedTensor) -> str:
    """``8 shards of 4 distinct boxes on 8 devices``: for messages about a whole set."""
    boxes = len({b for b in sharded.boxes if not b.is_empty})
    sections = [t.descriptor.shard for t in sharded.shards]
    devices = len({(sh.device_type, sh.device_id) for sh in sections if sh is not None})
    return (f"{len(sharded)} shard{'s' * (len(sharded) != 1)} of {boxes} distinct "
            f"box{'es' * (boxes != 1)} on {devices} device{'s' * (devices != 1)}")


# ---------------------------------------------------------------------- JAX
# The JAX code is the jax adapter's (hurray_bridge.adapters.jax.shards); these names stay.
def from_jax(x: Any) -> ShardedTensor:
    """A ``jax.Array`` (sharded over any number of devices) as a :class:`ShardedTensor`.

    One shard per addressable shard of ``x``, zero-copy, read-only, keeping the
    JAX buffers alive (see ``hurray_bridge.adapters.jax.shards.from_jax``).
    """
    out: ShardedTensor = get_adapter_module("jax", "shards").from_jax(x)
    return out


def to_jax(sharded: ShardedTensor, sharding: Any, *, copy: bool | None = None) -> Any:
    """A ``jax.Array`` with ``sharding`` (any ``jax.sharding.Sharding``) over the shards.

    Zero-copy per shard where JAX can alias it; a copy otherwise, reported with
    :class:`hb.CopyWarning` (``copy=False`` raises, ``copy=True`` always copies).
    See ``hurray_bridge.adapters.jax.shards.to_jax``.
    """
    return get_adapter_module("jax", "shards").to_jax(sharded, sharding, copy=copy)


# ------------------------------------------------------ partial sets, torch
# A process of a distributed program holds some shards only (a DTensor's local shard, one
# rank's file): such a set is built ``partial`` and is read box by box.
def missing_box(shape: tuple[int, ...], boxes: Iterable[Box]) -> Box | None:
    """A box no shard covers: the cell, on the grid the box edges cut, of an uncovered index.

    ``None`` when every index is covered, or when that grid is too large to search.
    """
    distinct = list({b for b in boxes if not b.is_empty})
    point = _find_gap(shape, distinct)
    if point is None:
        return None
    sizes = []
    for k, p in enumerate(point):
        ends = [e for b in distinct for e in (b.offsets[k], b.offsets[k] + b.sizes[k]) if e > p]
        sizes.append(min([shape[k], *ends]) - p)
    return Box(point, tuple(sizes))


def _refuse_incomplete(sharded: ShardedTensor, what: str) -> None:
    box = missing_box(sharded.shape, sharded.boxes)
    at = f"box {box} is in no shard" if box is not None else "some indices are in no shard"
    raise FormatError(
        f"cannot {what} a partial shard set: {at} of global shape {list(sharded.shape)}; "
        "bring every process's shards together first (hb.load of every rank's file, or the "
        "framework's gather)", field="shards",
    )


def _pieces_for(sharded: ShardedTensor, box: Box) -> list[tuple[Box, Tensor]]:
    """The dense primary shards that overlap ``box``; they must cover it (partial sets too)."""
    out, covered = [], 0
    for t in sharded.primary_shards():
        b = _box_of(t)
        common = b.intersect(box)
        if common is None:
            continue
        if not t.is_dense:
            raise UnsupportedError(
                f"cannot copy from a {form_name(t.descriptor)} shard (box {b}): copies take "
                "dense elements; dequantize or densify the shards first")
        out.append((b, t))
        covered += common.volume
    if covered != box.volume:
        raise FormatError(
            f"box {box} is not covered by these shards (they hold {covered} of its "
            f"{box.volume} elements): a process has only its own shards; bring the others "
            "here first (hb.load of every rank's file)", field="shards",
        )
    return out


# The torch code is the torch adapter's (hurray_bridge.adapters.torch.shards); a DTensor
# reaches it through hb.asarray (conversion.special_module).
def to_dtensor(sharded: ShardedTensor, device_mesh: Any, placements: Sequence[Any], *,
               copy: bool | None = None) -> Any:
    """A torch ``DTensor`` on ``device_mesh`` with ``placements``, built in each process.

    Each process passes the shards it has (all of them, or a partial set such as
    its own file's); its local tensor is the shard whose box the placements give
    this rank, without a copy, or is copied out of the shards that cover that box
    (resharding, reported with :class:`hb.CopyWarning`; ``copy=False`` raises).
    See ``hurray_bridge.adapters.torch.shards.to_dtensor``.
    """
    return get_adapter_module("torch", "shards").to_dtensor(sharded, device_mesh, placements,
                                                           copy=copy)
