"""Checkpoints of several files: a folder of shard files and the index that maps names to them.

The index is the JSON document Hugging Face writes beside a sharded checkpoint
(``model.safetensors.index.json``)::

    {"metadata": {"total_size": 98390},
     "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors", ...}}

and its Hurray counterpart (``model.hurray.index.json``, the same shape, naming ``.hurray``
files). :func:`hurray_bridge.load` of such an index, or of the folder holding it, gives one
mapping over every shard (:func:`load_checkpoint`); ``hurray convert DIR OUT`` converts the
whole folder both ways (:func:`convert_checkpoint`). ``docs/spec/container.md`` §12 is the
normative text: how a folder is read, what is checked, how metadata merges.

The index is outside input: it is read within :data:`MAX_INDEX_BYTES`, as strict JSON, and it
may name files of its own folder only. Each shard file is read as :func:`hurray_bridge.load`
reads one file, and the names the files hold must be those the index places in them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

from .errors import FormatError, UnsupportedError
from .files.disk import atomic_output
from .files.disk import fspath as _fspath
from .files.disk import open_regular as _open_regular
from .files.disk import write_all as _write_all
from .files.format import BUFFER_ALIGNMENT, MAGIC, MAX_BUFFER_ALIGNMENT
from .files.format import read_index as _read_hurray_index
from .files.reading import CHECKPOINT_OPENERS as _CHECKPOINT_OPENERS
from .files.reading import load_file as _load_file
from .files.reading import load_files as _load_files
from .files.safetensors_header import looks_like_safetensors, read_header_from
from .files.sharded import grouped as _grouped
from .files.tensor_file import TensorFile

__all__ = [
    "FORMATS",
    "MAX_INDEX_BYTES",
    "CheckpointFile",
    "CheckpointIndex",
    "convert_checkpoint",
    "find_checkpoint",
    "is_checkpoint_path",
    "load_checkpoint",
    "read_checkpoint_index",
]

FORMATS = ("safetensors", "hurray")
"""The formats of a checkpoint's shard files: a shard ``NAME.<format>``, an index
``NAME.<format>.index.json``."""
MAX_INDEX_BYTES = 64 << 20
"""The largest index read: a million tensor names fit many times over (huggingface_hub stops
at 10 MiB)."""
_INDEX = ".index.json"
_Progress = Callable[[int, int], None]


class CheckpointIndex(NamedTuple):
    """An index file, read and checked (:func:`read_checkpoint_index`).

    ``weight_map`` is ``{tensor name: shard file name}`` in the index's order; ``metadata``
    its ``"metadata"`` object as JSON gave it (``total_size`` is a number); ``document``
    the whole JSON object, other members included, which a conversion writes back with
    only the file names changed. ``format`` is ``"safetensors"`` or ``"hurray"`` as the
    index's name says (``NAME.safetensors.index.json``), else as its shard files' names
    agree, else ``None``.
    """

    path: str
    format: str | None
    weight_map: dict[str, str]
    metadata: dict[str, Any]
    document: dict[str, Any]

    @property
    def files(self) -> list[str]:
        """The shard file names, each once, in the order the index first names them."""
        return list(dict.fromkeys(self.weight_map.values()))


class CheckpointFile(TensorFile):
    """What :func:`hurray_bridge.load` returns for a checkpoint folder or index: one
    :class:`~hurray_bridge.container.TensorFile` over every shard file.

    ``metadata`` merges the files' and the index's (container.md §12.2); ``file_metadata``
    is each shard file's own, by file name; ``index`` the :class:`CheckpointIndex`
    (``None`` for a folder read without one). Every tensor points into the memory map of
    its own file; ``close()`` (or the end of a ``with`` block) drops them all, and each
    map goes with the last tensor taken from it.
    """

    file_metadata: dict[str, dict[str, str]]
    index: CheckpointIndex | None

    def __init__(self, tensors: TensorFile, file_metadata: dict[str, dict[str, str]],
                 index: CheckpointIndex | None, metadata: dict[str, str],
                 alignment: int) -> None:
        super().__init__(tensors, metadata, alignment)
        self.file_metadata = file_metadata
        self.index = index


# ------------------------------------------------------------------ the index
def _index_error(path: str, field: str, message: str) -> FormatError:
    return FormatError(f"checkpoint index {path}: {message}", field=field)


def _no_duplicates(path: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                # json keeps the last of a repeated key: a tensor placed twice, silently once
                raise _index_error(path, repr(k), f"the key {k!r} appears twice in one object; "
                                   "JSON names each member once: keep one")
            out[k] = v
        return out
    return pairs


def _refuse_constant(path: str) -> Callable[[str], Any]:
    def constant(word: str) -> Any:
        raise _index_error(path, "index", f"{word} is no JSON value (Python's json writes it, "
                           "JSON does not allow it): write the index as strict JSON")
    return constant


def _check_shard_name(path: str, tensor: str, name: object) -> str:
    field = f"weight_map[{tensor!r}]"
    if not isinstance(name, str):
        raise _index_error(path, field, f"expected a shard file name (a string), got "
                           f"{type(name).__name__} {name!r}")
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
            or name.endswith(_INDEX)):
        raise _index_error(path, field, f"{name!r} is not the name of a shard file in the "
                           "index's folder: a shard is named by its file name alone (no '/', "
                           "'\\', '..' or NUL), and is no index")
    return name


def _format_of(name: str) -> str | None:
    """The format a file or index name claims (``.safetensors``, ``.hurray``), or ``None``."""
    base = name[:-len(_INDEX)] if name.endswith(_INDEX) else name
    return next((f for f in FORMATS if base.endswith("." + f)), None)


def read_checkpoint_index(path: str | os.PathLike[str]) -> CheckpointIndex:
    """Read and check a checkpoint index (``model.safetensors.index.json`` and the like).

    The file must be a regular file of at most :data:`MAX_INDEX_BYTES`, strict UTF-8 JSON
    (no repeated key, no NaN or Infinity) holding an object whose ``"weight_map"`` is an
    object of tensor names to file names of the index's own folder (a name alone: no
    ``/``, ``\\``, ``..``), and whose ``"metadata"``, if present, is an object. Each
    refusal is a :class:`~hurray_bridge.FormatError` naming the index and the field.
    """
    p = _fspath(path, "path")
    with _open_regular(p) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_INDEX_BYTES:
            raise _index_error(p, "index", f"{size} bytes, over the limit of {MAX_INDEX_BYTES} "
                               "for an index (it lists names, not data): is this an index?")
        raw = f.read(MAX_INDEX_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _index_error(p, "index", f"not UTF-8 (byte {exc.start}): an index is JSON "
                           "text") from None
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates(p),
                         parse_constant=_refuse_constant(p))
    except json.JSONDecodeError as exc:
        raise _index_error(p, "index", f"not JSON: {exc.msg} at line {exc.lineno} column "
                           f"{exc.colno}") from None
    except RecursionError:
        raise _index_error(p, "index", "nested too deeply to be an index (an index is an "
                           "object of two objects)") from None
    if not isinstance(doc, dict):
        raise _index_error(p, "index", f"expected a JSON object, got {type(doc).__name__}")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict):
        got = "nothing" if weight_map is None else type(weight_map).__name__
        raise _index_error(p, "weight_map", f"expected an object of tensor names to shard "
                           f"file names, got {got}: is this a checkpoint index?")
    metadata = doc.get("metadata", {})
    if not isinstance(metadata, dict):
        raise _index_error(p, "metadata", f"expected an object, got {type(metadata).__name__}")
    for tensor, name in weight_map.items():
        _check_shard_name(p, tensor, name)
    fmt = _format_of(os.path.basename(p))
    if fmt is None:
        claimed = {_format_of(n) for n in weight_map.values()}
        fmt = claimed.pop() if len(claimed) == 1 else None
    return CheckpointIndex(p, fmt, weight_map, metadata, doc)


# --------------------------------------------------------------- the folder
def is_checkpoint_path(path: object) -> TypeGuard[str | os.PathLike[str]]:
    """Whether :func:`hurray_bridge.load` reads ``path`` as a checkpoint of several files:
    a folder, or a name ending in ``.json`` (an index)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    p = os.fsdecode(os.fspath(path))
    return p.endswith(".json") or os.path.isdir(p)


def find_checkpoint(folder: str | os.PathLike[str]) -> tuple[CheckpointIndex | None, list[str]]:
    """The index of the checkpoint in ``folder`` and its shard files' paths.

    The folder's one ``*.safetensors.index.json`` or ``*.hurray.index.json`` (two or more
    are a :class:`~hurray_bridge.FormatError` listing them: pass the one to read);
    without one, every ``*.safetensors`` and ``*.hurray`` file in it, in name order, with
    no index. Other files (``config.json``,
    ``pytorch_model.bin.index.json`` ...) are not read.
    """
    d = _fspath(folder, "path")
    names = sorted(os.listdir(d))
    regular = [n for n in names if os.path.isfile(os.path.join(d, n))]
    indexes = [n for n in regular if n.endswith(_INDEX) and _format_of(n) is not None]
    if len(indexes) > 1:
        raise FormatError(
            f"{d} holds {len(indexes)} checkpoint indexes ({', '.join(indexes)}); pass the one "
            f"to read (hb.load({os.path.join(d, indexes[0])!r}))", field="path")
    if indexes:
        index = read_checkpoint_index(os.path.join(d, indexes[0]))
        return index, [os.path.join(d, n) for n in index.files]
    files = [n for n in regular if not n.endswith(_INDEX) and _format_of(n) is not None]
    if not files:
        raise FormatError(
            f"{d} holds no checkpoint: no *.safetensors.index.json or *.hurray.index.json "
            "index, and no *.safetensors or *.hurray file", field="path")
    return None, [os.path.join(d, n) for n in files]


def _resolve(path: str | os.PathLike[str]) -> tuple[CheckpointIndex | None, list[str], str]:
    """The index and shard paths of a folder or an index file, and the folder."""
    p = _fspath(path, "path")
    if os.path.isdir(p):
        return (*find_checkpoint(p), p)
    index = read_checkpoint_index(p)
    folder = os.path.dirname(p) or os.curdir
    return index, [os.path.join(folder, n) for n in index.files], folder


def _check_files_exist(index: CheckpointIndex | None, paths: Sequence[str]) -> None:
    if index is None:
        return
    for path in paths:
        if not os.path.exists(path):  # (a link to nothing too: a cache's blob not fetched)
            name = os.path.basename(path)
            held = [t for t, f in index.weight_map.items() if f == name]
            raise FormatError(
                f"{path} is missing: the checkpoint index {index.path} places "
                f"{len(held)} tensor{'s' * (len(held) != 1)} in it (the first {held[0]!r}); "
                "copy every shard file beside the index (a download that stopped early?)",
                field=f"weight_map[{held[0]!r}]")


def _check_names(index: CheckpointIndex | None, held: Mapping[str, Iterable[str]]) -> None:
    """Refuse names that the files and the index do not agree on.

    ``held`` is ``{shard path: the names in it}``, in the order the files are read: a name
    in two files, a name the index places in another file or not at all, and a name of
    the index that its file lacks, each naming both places.
    """
    where: dict[str, str] = {}
    for path, names in held.items():
        file = os.path.basename(path)
        for name in names:
            if name in where:
                raise FormatError(
                    f"tensor {name!r} is in two files, {where[name]} and {path}: a checkpoint "
                    "holds each name once; remove one (or pass the file to read alone)",
                    field=f"weight_map[{name!r}]" if index else "name")
            where[name] = path
            if index is None:
                continue
            placed = index.weight_map.get(name)
            if placed is None:
                raise FormatError(
                    f"tensor {name!r} is in {path} but not in the checkpoint index "
                    f"{index.path}: the index lists every tensor of the checkpoint; add it, "
                    "or write the index again (huggingface_hub loads such a tensor with a "
                    "warning)", field=f"weight_map[{name!r}]")
            if placed != file:
                raise FormatError(
                    f"tensor {name!r}: the checkpoint index {index.path} places it in "
                    f"{placed}, but it is in {path}; write the index again from the files",
                    field=f"weight_map[{name!r}]")
    if index is not None:
        folder = os.path.dirname(index.path)
        for name, file in index.weight_map.items():
            if name not in where:
                raise FormatError(
                    f"tensor {name!r}: the checkpoint index {index.path} places it in "
                    f"{os.path.join(folder, file)}, which does not hold it (a shard of another "
                    "checkpoint?)", field=f"weight_map[{name!r}]")


def _merged_metadata(index: CheckpointIndex | None,
                     per_file: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """The items every file's metadata has with one value, then the index's metadata (a
    string as it is, any other JSON value as its compact JSON text) over them."""
    meta: dict[str, str] = dict(per_file[0]) if per_file else {}
    for m in per_file[1:]:
        meta = {k: v for k, v in meta.items() if m.get(k) == v}
    if index is not None:
        for k, v in index.metadata.items():
            meta[k] = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    return meta


def load_checkpoint(path: str | os.PathLike[str], mmap: bool = True, *,
                    verify: bool = False) -> CheckpointFile:
    """One mapping over every shard file of a checkpoint: what :func:`hurray_bridge.load`
    returns for a folder or an index (``.json``).

    Each file (safetensors or Hurray, known by its content) is loaded as ``hb.load`` loads
    it, with ``mmap`` and ``verify``: its tensors zero-copy and read-only in its own memory
    map. Before any file is opened the index's files must all be there; then each name
    must be in one file only, in the one the index places it in, and every name of the
    index in its file (a :class:`~hurray_bridge.FormatError` naming the tensor, the
    files and the index; a defect inside a file names the file). The tensors come in the
    index's order; sharded tensors' entries (``NAME[k]``) are grouped as ``hb.load``
    groups them. A folder without an index loads as ``hb.load`` of the list of its files:
    each sharded tensor's shards from all of them together (every rank's file), any other
    name in one file only.
    """
    index, paths, _ = _resolve(path)
    _check_files_exist(index, paths)
    loaded: dict[str, TensorFile] = {}

    def shard(p: str, mmap: bool, verify: bool) -> TensorFile:
        with _in_shard(p, index):
            f = _load_file(p, mmap, verify)
        loaded[p] = f
        return f

    if index is None:
        # Every file of the folder, as hb.load of the list of them: a sharded tensor's
        # entries (NAME[k], each rank's file numbering its own from 0) merge into one.
        merged = _load_files(paths, mmap, verify, opener=shard)
        per_file = {os.path.basename(p): f.metadata for p, f in loaded.items()}
        return CheckpointFile(merged, per_file, None, merged.metadata, merged.alignment)
    for p in paths:
        shard(p, mmap, verify)
    _check_names(index, {p: f.keys() for p, f in loaded.items()})
    by_name = {os.path.basename(p): f for p, f in loaded.items()}
    tensors = {name: by_name[file][name] for name, file in index.weight_map.items()}
    per_file = {os.path.basename(p): f.metadata for p, f in loaded.items()}
    meta = _merged_metadata(index, list(per_file.values()))
    alignment = min((f.alignment for f in loaded.values()), default=MAX_BUFFER_ALIGNMENT)
    grouped = _grouped(TensorFile(tensors, meta, alignment))
    return CheckpointFile(grouped, per_file, index, meta, alignment)


@contextlib.contextmanager
def _in_shard(path: str, index: CheckpointIndex | None) -> Iterator[None]:
    """A shard's defect, with the shard named (one file's reader names none: it has one)."""
    try:
        yield
    except FormatError as exc:
        message = str(exc)
        if exc.field and message.startswith(exc.field + ": "):
            message = message[len(exc.field) + 2:]
        of = f" (a shard of the checkpoint index {index.path})" if index is not None else ""
        raise FormatError(f"{path}{of}: {message}", field=exc.field) from None


def _open_if_checkpoint(path: Any, mmap: bool, verify: bool) -> CheckpointFile | None:
    return load_checkpoint(path, mmap, verify=verify) if is_checkpoint_path(path) else None


_CHECKPOINT_OPENERS.append(_open_if_checkpoint)


# ---------------------------------------------------------------- converting
def _renamed(name: str, src: str | None, dst: str) -> str:
    """A shard or index name with its format's suffix swapped (added when it has none)."""
    if name.endswith(_INDEX):
        base = name[:-len(_INDEX)]
        if src is not None and base.endswith("." + src):
            base = base[:-len(src) - 1]
        return f"{base}.{dst}{_INDEX}"
    if src is not None and name.endswith("." + src):
        name = name[:-len(src) - 1]
    return f"{name}.{dst}"


def _names_in(path: str, fmt: str) -> list[str]:
    """The tensor names of a shard file, from its header alone."""
    if fmt == "safetensors":
        with _open_regular(path) as f:
            return [e.name for e in read_header_from(f).entries]
    return [e.name for e in _read_hurray_index(path).entries]


def _sniff(path: str) -> str:
    """A shard file's format, by its content as ``hb.load`` knows it."""
    with _open_regular(path) as f:
        head = f.read(16)
    if head[:4] == MAGIC:
        return "hurray"
    if looks_like_safetensors(head):
        return "safetensors"
    raise FormatError(f"{path} is neither a safetensors nor a Hurray file (by its first "
                      "bytes): a checkpoint's shards are one or the other", field="path")


def _index_text(document: Mapping[str, Any]) -> str:
    """An index as huggingface_hub and torch write it (``json.dump(index, f, indent=2)``)."""
    return json.dumps(document, indent=2)


def convert_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                       to: str | None = None, *, alignment: int | None = None,
                       checksums: bool = True, verify: bool = True, fsync: bool = True,
                       progress: _Progress | None = None) -> tuple[int, int]:
    """Convert the checkpoint ``src`` (a folder or its index) into the folder ``dst``;
    returns the number of files written (the index included) and of tensors.

    Each shard file becomes one of the other format (``to``: ``"hurray"`` or
    ``"safetensors"``; by default the one the input is not), named with the suffix
    swapped (``model-00001-of-00002.safetensors`` -> ``model-00001-of-00002.hurray``),
    as ``hurray convert`` converts one file (``alignment``, ``checksums``, ``verify``,
    ``fsync``); then the index, its file names changed and nothing else
    (``model.safetensors.index.json`` -> ``model.hurray.index.json``), written as
    huggingface_hub writes one. A safetensors checkpoint converted there and back is
    byte-identical, every file, when its files came from the safetensors writer (or
    torch's) and its index from huggingface_hub or torch. Before a byte is written, every
    shard's header is read and checked against the index as :func:`load_checkpoint`
    checks them. Each file is written atomically, the index last: an interrupted run
    leaves no index naming a file that is not there. ``progress(done, total)`` counts the
    input files' bytes, over all of them (one bar).
    """
    # (imported here: hb.load, which imports this module with the package, never writes)
    from .safetensors_io import hurray_to_safetensors, safetensors_to_hurray

    index, paths, src_dir = _resolve(src)
    _check_files_exist(index, paths)
    formats = {p: _sniff(p) for p in paths}
    dst_fmt = _target_format(src, index, paths, formats, to)
    names = {}
    for p in paths:
        with _in_shard(p, index):
            names[p] = _names_in(p, formats[p])
    _check_names(index, names)
    out_dir, index_name, outputs = _outputs(src, dst, src_dir, index, paths, formats, dst_fmt)
    sizes = {p: os.stat(p).st_size for p in paths}
    total, base = sum(sizes.values()), 0
    tensors = 0
    for p in paths:
        step = _share(progress, base, sizes[p], total)
        with _in_shard(p, index):
            if dst_fmt == "hurray":
                tensors += safetensors_to_hurray(p, outputs[p], checksums=checksums,
                                                 fsync=fsync, progress=step,
                                                 alignment=alignment or BUFFER_ALIGNMENT)
            else:
                tensors += hurray_to_safetensors(p, outputs[p], fsync=fsync, progress=step,
                                                 verify=verify)
        base += sizes[p]
        if progress is not None:
            progress(base, total)
    written = len(paths)
    if index is not None and index_name is not None:
        doc = dict(index.document)
        doc["weight_map"] = {k: os.path.basename(outputs[os.path.join(src_dir, v)])
                             for k, v in index.weight_map.items()}
        with atomic_output(os.path.join(out_dir, index_name), fsync=fsync) as fd:
            _write_all(fd, _index_text(doc).encode("utf-8"))
        written += 1
    return written, tensors


def _target_format(src: object, index: CheckpointIndex | None, paths: list[str],
                   formats: dict[str, str], to: str | None) -> str:
    """The format a checkpoint converts to: ``to``, or the one its files are not; refused
    where that cannot be told or a file is in it already."""
    src_fmt = index.format if index is not None and index.format else None
    if src_fmt is None:
        kinds = set(formats.values())
        src_fmt = kinds.pop() if len(kinds) == 1 else None
    dst_fmt = to or {"safetensors": "hurray", "hurray": "safetensors"}.get(src_fmt or "")
    if dst_fmt not in FORMATS:
        raise UnsupportedError(
            f"cannot tell which format to convert {src} to (its files are "
            f"{', '.join(sorted(set(formats.values())))}); say it: to='hurray' or "
            "to='safetensors' (hurray convert --to)")
    same = [p for p in paths if formats[p] == dst_fmt]
    if same:
        raise UnsupportedError(f"{same[0]} is {dst_fmt} already; a checkpoint converts from "
                               "one format to the other (convert its files one by one to "
                               "re-lay out Hurray files)")
    return dst_fmt


def _outputs(src: object, dst: str | os.PathLike[str], src_dir: str,
             index: CheckpointIndex | None, paths: list[str], formats: dict[str, str],
             dst_fmt: str) -> tuple[str, str | None, dict[str, str]]:
    """Where a converted checkpoint goes: (its folder, made if need be; its index's name,
    None without an index; each input file's output path). Refused where the folder
    would hold two checkpoints or two files would get one name."""
    out_dir = _fspath(dst, "dst")
    os.makedirs(out_dir, exist_ok=True)
    if os.path.samefile(out_dir, src_dir):
        raise UnsupportedError(
            f"{out_dir} is the input's own folder: the converted checkpoint would sit beside "
            "the input, a folder of two checkpoints; write it to another folder")
    index_name = (None if index is None
                  else _renamed(os.path.basename(index.path), index.format, dst_fmt))
    others = [n for n in sorted(os.listdir(out_dir)) if n != index_name
              and n.endswith(_INDEX) and _format_of(n) is not None]
    if others:
        raise UnsupportedError(
            f"{out_dir} holds another checkpoint's index ({', '.join(others)}): a folder of "
            "two checkpoints is refused by the reader; write to an empty folder, or remove it")
    outputs = {p: os.path.join(out_dir, _renamed(os.path.basename(p), formats[p], dst_fmt))
               for p in paths}
    if len(set(outputs.values())) != len(outputs):
        raise UnsupportedError(f"two shard files of {src} convert to one name ({dst_fmt} "
                               "suffix): rename one")
    return out_dir, index_name, outputs


def _share(progress: _Progress | None, base: int, size: int, total: int) -> _Progress | None:
    """One file's progress as its share of the whole conversion's."""
    if progress is None:
        return None

    def step(done: int, of: int) -> None:
        progress(base + (done * size // of if of else size), total)
    return step
