"""A ``torch.distributed.checkpoint`` storage backend that writes Hurray files.

``dcp.save(state_dict, storage_writer=HurrayStorageWriter(dir))`` writes one
``.hurray`` file per rank (``__{rank}_0.hurray``) and, once every rank is done,
the checkpoint's global plan as the JSON string metadata of an entry-less Hurray
file (``.metadata.hurray``). ``dcp.load(state_dict,
storage_reader=HurrayStorageReader(dir))`` serves the byte ranges DCP's planner
asks for, on any world size and placement (resharding is the planner's work).

Every tensor chunk is an ordinary entry: a plain tensor's is named by its fully
qualified name; a chunk of a DTensor (or ShardedTensor) is ``FQN[k]`` with a
shard section, so ``hb.load`` of every rank's file gives one ShardedTensor of
the global shape. DCP's byte items (``io.BytesIO``: what its planner made of a
non-tensor value with ``torch.save``) are opaque ``uint8`` entries handed back to
DCP as bytes: the bridge never unpickles them. DCP's default load planner does, with
``torch.load(weights_only=False)``, so a checkpoint with byte items is only as
trustworthy as its source. docs/spec/sharding.md §10 describes the files.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from hurray_bridge.descriptor import Shard
from hurray_bridge.errors import FormatError, UnsupportedError
from hurray_bridge.files.checksums import crc32 as _crc32
from hurray_bridge.files.data_checks import check_checksum as _check_checksum
from hurray_bridge.files.disk import open_regular as _open_regular
from hurray_bridge.files.format import EntryInfo, FileIndex, load_metadata
from hurray_bridge.files.format import index_from as _index_from
from hurray_bridge.files.format import read_head as _read_head
from hurray_bridge.files.pread import pread_into as _pread_into
from hurray_bridge.files.writing import save
from hurray_bridge.layout import Layout
from hurray_bridge.shards import _strided_tensor
from hurray_bridge.tensor import Tensor

from . import dtype_of, to_hurray

__all__ = ["METADATA_FILE", "METADATA_KEY", "HurrayStorageReader", "HurrayStorageWriter",
           "data_file"]

METADATA_FILE = ".metadata.hurray"
"""The file of the global plan, written last: a checkpoint without it is incomplete."""
METADATA_KEY = "torch.distributed.checkpoint"
"""The string-metadata key of the plan's JSON in :data:`METADATA_FILE`."""
_FORMAT = 1  # the layout of the JSON below; a reader refuses a later one
_SCRATCH = 1 << 20  # the buffer that checksums the bytes of an entry a box does not need


def data_file(rank: int) -> str:
    """The file rank ``rank`` writes its chunks to (DCP's own: ``__{rank}_0.distcp``)."""
    return f"__{rank}_0.hurray"


def _metadata_file(rank: int | None) -> str:
    # Without collectives every rank writes and reads its own plan, as FileSystemWriter does.
    return METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"


def _new_id() -> str:
    return uuid.uuid4().hex


def _is_path(checkpoint_id: str | os.PathLike[str]) -> bool:
    try:
        p = os.fspath(checkpoint_id)
    except TypeError:
        return False
    return isinstance(p, str) and "://" not in p


# ------------------------------------------------------------------- writing
def _entry_tensor(item: Any, data: Any) -> tuple[Tensor, bool]:
    """The hb.Tensor of one write item's data, and whether it is a shard entry.

    The planner's SHARD items (the chunks of DTensors and ShardedTensors, even a
    box that is the whole tensor) become shard entries, so that every rank's
    pieces of one tensor are one set in ``hb.load``; TENSOR items (a plain tensor,
    written by one rank) and byte items are entries of their own.
    """
    if item.type == WriteItemType.BYTE_IO:
        raw = bytes(data.getbuffer()) if isinstance(data, io.BytesIO) else bytes(data)
        # frombuffer refuses an empty buffer; an empty byte item is a length-0 entry.
        b = (torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw
             else torch.empty(0, dtype=torch.uint8))
        return to_hurray(b), False
    if not isinstance(data, torch.Tensor):
        raise UnsupportedError(f"write item {item.index.fqn!r}: the planner resolved a "
                               f"{type(data).__qualname__}, not a tensor")
    x = data.detach()
    if hasattr(x, "to_local"):  # a DTensor the planner did not unwrap
        x = x.to_local()
    x = x.to("cpu").contiguous()  # a file holds host memory, row-major: DCP's chunks are boxes
    td = item.tensor_data
    if tuple(x.shape) != tuple(td.chunk.sizes):
        raise UnsupportedError(
            f"write item {item.index.fqn!r}: the planner resolved a tensor of shape "
            f"{list(x.shape)} for a chunk of sizes {list(td.chunk.sizes)}")
    t = to_hurray(x)
    if item.type != WriteItemType.SHARD:
        return t, False
    dev = t.device
    shard = Shard(tuple(td.size), tuple(td.chunk.offsets), 0, dev.type, dev.id)
    return _strided_tensor(t.data_ptr, t.shape, t.dtype, None, t.descriptor.padded, shard,
                           dev, t, t.readonly, t.copied), True


def _plan_json(metadata: Metadata, storage: dict[MetadataIndex, tuple[str, str]],
               save_id: str | None) -> str:
    """The global plan as JSON: what :meth:`HurrayStorageReader.read_metadata` rebuilds."""
    items: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            items[fqn] = {"bytes": True}
        else:
            items[fqn] = {"dtype": str(md.properties.dtype).removeprefix("torch."),
                          "size": list(md.size),
                          "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks]}
    pd = metadata.planner_data
    if pd is not None:
        if not (isinstance(pd, dict) and all(
                isinstance(k, str) and isinstance(v, (tuple, list))
                and all(isinstance(p, (str, int)) for p in v) for k, v in pd.items())):
            raise UnsupportedError(
                f"the save planner's planner_data ({type(pd).__qualname__}) has no JSON form: "
                "HurrayStorageWriter stores {str: tuple of str/int} (DefaultSavePlanner's "
                "flattening map) or None; use DefaultSavePlanner or FileSystemWriter")
        pd = {k: list(v) for k, v in pd.items()}
    modules = list(metadata.storage_meta.modules) if metadata.storage_meta else []
    doc = {"format": _FORMAT, "version": metadata.version, "save_id": save_id,
           "modules": modules, "items": items, "planner_data": pd,
           "storage": [[k.fqn, None if k.offset is None else list(k.offset), f, e]
                       for k, (f, e) in storage.items()]}
    return json.dumps(doc, separators=(",", ":"))


class HurrayStorageWriter(StorageWriter):
    """Writes a DCP checkpoint as Hurray files in the folder ``path``.

    One file per rank, ``__{rank}_0.hurray`` (:func:`data_file`), written
    atomically with data checksums; then the coordinator writes the global
    plan, ``.metadata.hurray`` (:data:`METADATA_FILE`). ``fsync=False`` skips the
    flushes that make the files durable (they stay atomic). Tensors on another
    device are copied to the CPU first, non-contiguous ones made contiguous.
    A later save to the same folder replaces the files of the ranks it has; the
    files of ranks it does not have stay, unused by the new plan.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.fsync = fsync
        self.save_id = _new_id()
        self.rank: int | None = None
        self.use_collectives = True

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new save, into ``checkpoint_id`` when given."""
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = _new_id()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Note this process's rank and whether DCP plans with collectives."""
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Create the folder; without collectives, name this rank's file here."""
        os.makedirs(self.path, exist_ok=True)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data=data_file(self.rank))
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give each rank's plan its file name."""
        return [p if p.storage_data is not None else
                dataclasses.replace(p, storage_data=data_file(i)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's items to its one file; each result names the file and entry."""
        file = plan.storage_data
        entries: dict[str, Tensor] = {}
        owner: dict[str, str] = {}  # entry name -> the FQN that took it (for the refusal)
        results = []
        boxes: dict[str, int] = {}
        for item in plan.items:
            t, is_box = _entry_tensor(item, planner.resolve_data(item))
            fqn = item.index.fqn
            if is_box:
                k = boxes.get(fqn, 0)
                boxes[fqn] = k + 1
                name = f"{fqn}[{k}]"
            else:
                name = fqn
            if name in entries:
                raise UnsupportedError(
                    f"state dict keys {owner[name]!r} and {fqn!r} both become entry {name!r} "
                    "(a box of a sharded tensor NAME is the entry NAME[k]); rename one key")
            entries[name], owner[name] = t, fqn
            results.append(WriteResult(index=item.index, size_in_bytes=t.nbytes,
                                       storage_data=(file, name)))
        save(os.path.join(self.path, file), entries, fsync=self.fsync)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write the global plan, as JSON, to :data:`METADATA_FILE` (the last file written)."""
        storage = {wr.index: wr.storage_data for rs in results for wr in rs}
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        text = _plan_json(metadata, storage, self.save_id)
        rank = self.rank if not self.use_collectives else None
        save(os.path.join(self.path, _metadata_file(rank)), {}, {METADATA_KEY: text},
             fsync=self.fsync)

    def storage_meta(self) -> StorageMeta | None:
        """The folder and this save's id."""
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """A local path (no ``scheme://``) is a checkpoint id of this writer."""
        return _is_path(checkpoint_id)


# ------------------------------------------------------------------- reading
def _plan_error(what: str) -> FormatError:
    return FormatError(f"{what}; the file is not a plan HurrayStorageWriter wrote (or is "
                       "damaged): save the checkpoint again", field=METADATA_KEY)


def _ints(value: Any, what: str) -> list[int]:
    if not (isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)):
        raise _plan_error(f"{what} is {value!r}, not a list of non-negative integers")
    return value


def _dtype(name: Any, fqn: str) -> torch.dtype:
    dt = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise _plan_error(f"item {fqn!r} has dtype {name!r}, which torch {torch.__version__} "
                          "does not have")
    return dt


def _parse_plan(text: str, path: str) -> tuple[Metadata, dict[MetadataIndex, tuple[str, str]]]:
    """Rebuild DCP's Metadata from the JSON of :func:`_plan_json`, checking every field."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise _plan_error(f"{path}: the plan is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else None
        raise _plan_error(f"{path}: plan format {got!r}, this reader knows {_FORMAT}")
    items = doc.get("items")
    if not isinstance(items, dict):
        raise _plan_error(f"{path}: 'items' is not an object")
    sd_md: dict[str, Any] = {}
    for fqn, md in items.items():
        if not isinstance(md, dict):
            raise _plan_error(f"item {fqn!r} is {md!r}")
        if md.get("bytes") is True:
            sd_md[fqn] = BytesStorageMetadata()
            continue
        size = _ints(md.get("size"), f"item {fqn!r} size")
        chunks = md.get("chunks")
        if not isinstance(chunks, list):
            raise _plan_error(f"item {fqn!r} chunks is {chunks!r}")
        cs = []
        for c in chunks:
            if not (isinstance(c, list) and len(c) == 2):
                raise _plan_error(f"item {fqn!r} has chunk {c!r}, not [offsets, sizes]")
            offs = _ints(c[0], f"item {fqn!r} chunk offsets")
            sizes = _ints(c[1], f"item {fqn!r} chunk sizes")
            if len(offs) != len(size) or len(sizes) != len(size) or any(
                    o + n > g for o, n, g in zip(offs, sizes, size)):
                raise _plan_error(f"item {fqn!r} has chunk {c!r} outside its size {size}")
            cs.append(ChunkStorageMetadata(torch.Size(offs), torch.Size(sizes)))
        sd_md[fqn] = TensorStorageMetadata(TensorProperties(dtype=_dtype(md.get("dtype"), fqn)),
                                           torch.Size(size), cs)
    pd = doc.get("planner_data")
    if pd is not None:
        if not (isinstance(pd, dict) and all(isinstance(v, list) and all(
                isinstance(p, (str, int)) for p in v) for v in pd.values())):
            raise _plan_error(f"{path}: planner_data is not {{str: [str or int, ...]}}")
        pd = {k: tuple(v) for k, v in pd.items()}
    storage: dict[MetadataIndex, tuple[str, str]] = {}
    rows = doc.get("storage")
    if not isinstance(rows, list):
        raise _plan_error(f"{path}: 'storage' is not a list")
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and isinstance(row[0], str)
                and isinstance(row[2], str) and isinstance(row[3], str)):
            raise _plan_error(f"storage row {row!r} is not [fqn, offsets, file, entry]")
        fqn, offset, file, entry = row
        if file != os.path.basename(file) or file in ("", ".", "..") or "\\" in file:
            raise _plan_error(f"storage row {row!r} names file {file!r}, which is not a "
                              "file name in the checkpoint's folder")
        key = MetadataIndex(fqn) if offset is None else MetadataIndex(
            fqn, _ints(offset, f"storage row {row!r}"))
        storage[key] = (file, entry)
    modules = doc.get("modules") or []
    if not (isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
        raise _plan_error(f"{path}: 'modules' is {modules!r:.60}, not a list of module names")
    meta = Metadata(state_dict_metadata=sd_md, planner_data=pd, storage_data=storage,
                    storage_meta=StorageMeta(save_id=doc.get("save_id"),
                                             modules=modules),
                    version=doc.get("version"))
    return meta, storage


class _RankFile:
    """One rank file, open for positional reads of the entries a plan needs."""

    def __init__(self, path: str, verify: bool) -> None:
        self.path = path
        self.verify = verify
        self.file = _open_regular(path)
        try:
            # The index from the open file itself: a save replacing the file meanwhile
            # cannot pair one file's offsets with another's bytes.
            self.index: FileIndex = _index_from(*_read_head(self.file))
        except BaseException:
            self.file.close()
            raise
        self.by_name: dict[str, EntryInfo] = {e.name: e for e in self.index.entries}
        self.fd = self.file.fileno()
        self.verified: set[str] = set()  # entries whose checksum was checked
        self.scratch: memoryview | None = None
        self.bytes_read = 0

    def close(self) -> None:
        self.file.close()

    def entry(self, name: str, shape: Sequence[int] | None, dtype: torch.dtype) -> EntryInfo:
        """The entry ``name``, checked to be a dense chunk of ``shape`` and ``dtype``."""
        e = self.by_name.get(name)
        if e is None:
            raise FormatError(f"{self.path}: the plan names entry {name!r}, which the file "
                              "does not have; the folder mixes files of different saves: "
                              "save the checkpoint again", field="name")
        d = e.descriptor
        want = (tuple(shape) if shape is not None else None)
        if (len(e.buffers) != 1 or d.layout != Layout.ROW_MAJOR or d.quantization is not None
                or (want is not None and d.shape != want)):
            raise FormatError(f"{self.path}: entry {name!r} is {list(d.shape)} "
                              f"{d.dtype.name} ({d.layout.name}); the plan expects a "
                              "row-major chunk of shape "
                              f"{list(want) if want is not None else '?'}", field="shape")
        if d.dtype != dtype_of(dtype):  # same size, other type: bytes would be misread
            raise FormatError(f"{self.path}: entry {name!r} holds {d.dtype.name}, the plan "
                              f"says {dtype}; the folder mixes files of different saves: "
                              "save the checkpoint again", field="dtype")
        return e

    def read_into(self, e: EntryInfo, dest: torch.Tensor) -> None:
        """Read the whole entry into ``dest`` (contiguous CPU memory of its byte size),
        then check its checksum over the bytes as read."""
        view = to_hurray(dest).memoryview().cast("B")
        if len(view) != e.nbytes:
            raise FormatError(f"{self.path}: entry {e.name!r} holds {e.nbytes} bytes, the "
                              f"plan's chunk {len(view)}", field="length")
        if e.nbytes:
            _pread_into(self.fd, view, self.index.data_offset + e.buffers[0].offset)
            self.bytes_read += e.nbytes
        if self.verify:
            _check_checksum(e, _crc32(view, 0) if e.nbytes else 0)
            self.verified.add(e.name)

    def _crc_of(self, e: EntryInfo, start: int, stop: int, crc: int) -> int:
        """``crc`` continued over the entry's bytes [start, stop), read through one small
        reused buffer: what a box does not need is checked, never kept."""
        if self.scratch is None:
            self.scratch = memoryview(bytearray(_SCRATCH))
        base = self.index.data_offset + e.buffers[0].offset
        while start < stop:
            v = self.scratch[:min(len(self.scratch), stop - start)]
            _pread_into(self.fd, v, base + start)
            crc = _crc32(v, crc)
            start += len(v)
            self.bytes_read += len(v)
        return crc

    def box(self, e: EntryInfo, dtype: torch.dtype, offsets: Sequence[int],
            lengths: Sequence[int]) -> torch.Tensor:
        """The box ``offsets``/``lengths`` of the entry, in fresh memory that holds the
        bytes from its first element to its last. The first time a checked reader touches
        an entry, the rest of it is read through a small buffer for the checksum."""
        shape = e.descriptor.shape
        strides = [1] * len(shape)
        for k in range(len(shape) - 2, -1, -1):
            strides[k] = strides[k + 1] * shape[k + 1]
        if len(offsets) != len(shape) or any(
                o < 0 or n < 0 or o + n > g for o, n, g in zip(offsets, lengths, shape)):
            raise FormatError(f"{self.path}: a request for box offsets {list(offsets)} "
                              f"lengths {list(lengths)} of entry {e.name!r} of shape "
                              f"{list(shape)} leaves the entry", field="storage_offsets")
        if 0 in lengths:
            return torch.empty(tuple(lengths), dtype=dtype)
        first = sum(o * s for o, s in zip(offsets, strides))
        last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
        buf = torch.empty(last - first + 1, dtype=dtype)
        view = to_hurray(buf).memoryview().cast("B")
        lo = first * buf.element_size()
        check = self.verify and e.name not in self.verified
        crc = self._crc_of(e, 0, lo, 0) if check else 0
        _pread_into(self.fd, view, self.index.data_offset + e.buffers[0].offset + lo)
        self.bytes_read += len(view)
        if check:
            crc = self._crc_of(e, lo + len(view), e.nbytes, _crc32(view, crc))
            _check_checksum(e, crc)
            self.verified.add(e.name)
        return buf.as_strided(tuple(lengths), tuple(strides))


class HurrayStorageReader(StorageReader):
    """Reads a DCP checkpoint written by :class:`HurrayStorageWriter` from the folder ``path``.

    The plan comes from the JSON of ``.metadata.hurray`` (no unpickling). Each
    read item is served from the entry that holds its chunk: a request for a
    whole entry into contiguous CPU memory is read straight into the destination
    tensor (no intermediate buffer). A request for part of an entry (a load on
    another world size or placement) reads the bytes from the box's first element
    to its last into fresh memory and copies the box out. ``verify=True`` (the
    default) checks the CRC-32 of every entry it reads, over all its bytes: the
    first request of an entry also reads the rest of it, through a small reused
    buffer, so memory stays at what the rank needs while the bytes read are the
    entry's. ``verify=False`` reads only the boxes' spans (for a split along the
    first dimension: exactly the box). Entries no request needs are never read.
    Byte items are handed to DCP's planner as
    ``io.BytesIO``. ``bytes_read`` counts what was read from the rank files.
    """

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.verify = verify
        self.load_id = _new_id()
        self.storage_data: dict[MetadataIndex, tuple[str, str]] = {}
        self.metadata: Metadata | None = None
        self.bytes_read = 0
        """Bytes this reader read from the rank files (the plan's file aside), since made."""

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Start a new load, from ``checkpoint_id`` when given."""
        self.storage_data = {}
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.load_id = _new_id()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's Metadata, rebuilt from the plan's JSON (``rank=``: a rank's own plan)."""
        path = os.path.join(self.path, _metadata_file(kwargs.get("rank")))
        try:
            meta = load_metadata(path)
        except FileNotFoundError:
            raise FormatError(f"{path} is missing: {self.path} holds no complete checkpoint "
                              "of HurrayStorageWriter (the plan is written last; a save that "
                              "did not finish leaves none)", field="path") from None
        text = meta.get(METADATA_KEY)
        if text is None:
            raise _plan_error(f"{path} has no {METADATA_KEY!r} metadata")
        md, _ = _parse_plan(text, path)
        assert md.storage_meta is not None
        md.storage_meta.checkpoint_id = self.path
        md.storage_meta.load_id = self.load_id
        self.metadata = md
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Keep the plan's map from chunk to file and entry."""
        if not isinstance(metadata.storage_data, dict):
            raise _plan_error("the metadata has no storage map")
        self.storage_data = metadata.storage_data
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Nothing to change: every rank reads the files itself."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Nothing to change: every rank reads the files itself."""
        return plans

    def _chunk(self, req: ReadItem) -> tuple[torch.Size, torch.dtype] | None:
        md = self.metadata.state_dict_metadata.get(req.storage_index.fqn) if self.metadata \
            else None
        if not isinstance(md, TensorStorageMetadata):
            return None
        offset, hint = req.storage_index.offset, req.storage_index.index
        if offset is None:
            return None
        # The planner's index hint first: a search per request is quadratic in the chunks.
        if hint is not None and 0 <= hint < len(md.chunks) and md.chunks[hint].offsets == offset:
            return md.chunks[hint].sizes, md.properties.dtype
        for c in md.chunks:
            if c.offsets == offset:
                return c.sizes, md.properties.dtype
        return None

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Serve every read item of ``plan`` from the rank files that hold them."""
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            where = self.storage_data.get(req.storage_index)
            if where is None:
                raise _plan_error(f"the plan has no file for {req.storage_index}")
            per_file.setdefault(where[0], []).append(req)
        for file, reqs in per_file.items():
            f = _RankFile(os.path.join(self.path, file), self.verify)
            try:
                at = {e.name: e.position for e in f.index.entries}
                # In file order: the reads go forward through the file.
                reqs.sort(key=lambda r: at.get(self.storage_data[r.storage_index][1], -1))
                for req in reqs:
                    self._serve(f, req, planner)
            finally:
                self.bytes_read += f.bytes_read
                f.close()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _serve(self, f: _RankFile, req: ReadItem, planner: LoadPlanner) -> None:
        name = self.storage_data[req.storage_index][1]
        if req.type == LoadItemType.BYTE_IO:
            e = f.entry(name, None, torch.uint8)
            raw = torch.empty(e.nbytes, dtype=torch.uint8)
            f.read_into(e, raw)
            planner.load_bytes(req, io.BytesIO(to_hurray(raw).memoryview().tobytes()))
            return
        chunk = self._chunk(req)
        if chunk is None:
            raise _plan_error(f"the plan has no chunk {req.storage_index}")
        sizes, dtype = chunk
        e = f.entry(name, sizes, dtype)
        target = planner.resolve_tensor(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            raise FormatError(f"{req.storage_index}: the planner's destination has shape "
                              f"{list(target.shape)}, the request {list(req.lengths)}",
                              field="shape")
        if target.dtype != dtype:
            raise FormatError(f"{req.storage_index}: the checkpoint holds {dtype}, the "
                              f"destination is {target.dtype}; load into a {dtype} tensor",
                              field="dtype")
        whole = tuple(req.storage_offsets) == (0,) * len(sizes) and \
            tuple(req.lengths) == tuple(sizes)
        if whole and target.device.type == "cpu" and target.is_contiguous():
            f.read_into(e, target)  # straight into the destination: no buffer in between
        else:
            target.copy_(f.box(e, dtype, req.storage_offsets, req.lengths))
        planner.commit_tensor(req, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """A local path (no ``scheme://``) is a checkpoint id of this reader."""
        return _is_path(checkpoint_id)
