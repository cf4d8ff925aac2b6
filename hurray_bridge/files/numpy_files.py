"""``.npy`` and ``.npz`` files read for ``hurray convert``: their arrays, and the arrays
that lie in the file as they are (a ``.npy``'s, an archive's stored members) as regions
of it, read in chunks as they are written, each stored member's CRC-32 checked.

NumPy is reached through ``_numpy`` (the core's one door to it), on first use; nothing
here runs unless a NumPy file is converted.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..errors import FormatError, HurrayError, UnsupportedError

__all__ = ["file_regions", "numpy_tensors"]


def numpy_tensors(path: str, fmt: str, name: str | None) -> dict[str, object]:
    from .._numpy import NAME as NUMPY
    from .._registry import get_adapter

    get_adapter(NUMPY)  # BackendNotAvailableError, with the pip extra, when NumPy is missing
    from .._numpy import numpy
    from .disk import open_regular as _open_regular

    np = numpy()

    # A FIFO or device is refused here, not waited on by NumPy. The .npz is read through
    # this handle: np.load leaves a file it opened itself open when NpzFile refuses it.
    fh = _open_regular(path)
    try:
        if fmt == "npy":
            fh.close()  # a memory map of the path, which np.load opens and closes itself
            key = name or os.path.splitext(os.path.basename(path))[0] or "array"
            with open(path, "rb") as head:
                _refuse_objects(np, head, "the array")
            with warnings.catch_warnings():  # NumPy warns of the overflow, then raises
                warnings.filterwarnings("ignore", "overflow", RuntimeWarning)
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
            if not isinstance(arr, np.ndarray):  # an archive: np.load reads those too
                arr.close()
                raise FormatError("not a .npy file: it is a .npz archive (--from npz reads it)",
                                  field="input")
            if arr.dtype.byteorder == ">":
                # Swapped into memory either way: read, not through the map, which a file
                # cut meanwhile turns into SIGBUS; swapped in place, so held once.
                del arr
                with open(path, "rb") as f:
                    arr = np.load(f, allow_pickle=False)
                arr = arr.byteswap(inplace=True).view(arr.dtype.newbyteorder("="))
            return {key: arr}
        got = np.load(fh, allow_pickle=False)
        if isinstance(got, np.ndarray):
            raise FormatError("not a .npz archive: it is a .npy file (--from npy reads it)",
                              field="input")
        with got as npz:
            seen: set[str] = set()
            for k in npz.files:  # "a" and "a.npy" are both read as "a"
                if k in seen:
                    raise FormatError(f"the archive has two members for the array {k!r} "
                                      f"(one named {k!r}, one {k + '.npy'!r}, or the same name "
                                      "twice): which one is meant is unclear", field="input")
                seen.add(k)
            out: dict[str, object] = {}
            mapped: list[Any] = []

            def view() -> Any:  # one map of the archive for all its stored members
                if not mapped:
                    import mmap

                    try:
                        mapped.append(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
                    except ValueError:  # "cannot mmap an empty file"
                        raise FormatError("cannot read npz: the archive is empty now (it was "
                                          "cut while it was read)", field="input") from None
                return mapped[0]

            for info, k in zip(npz.zip.infolist(), npz.files, strict=True):
                stored = _stored_member(np, fh.fileno(), npz.zip, info, view)
                out[k] = stored if stored is not None else _numpy_member(np, npz.zip, info)
            return out
    except (OSError, HurrayError):
        raise
    except Exception as exc:  # NumPy and zipfile raise many kinds of error for bad bytes
        # ValueError (pickled objects, bad headers), tokenize.TokenError, EOFError,
        # zipfile.BadZipFile (not a zip, bad CRC-32), NotImplementedError (a compression
        # method), RuntimeError (an encrypted member), zlib.error...: all a defect of the file.
        raise FormatError(f"cannot read {fmt}: the file is malformed: {exc} "
                          f"({type(exc).__name__})", field="input") from None
    finally:
        fh.close()


def _numpy_member(np: Any, archive: Any, info: Any) -> Any:
    """The array of the member ``info``, read whole by NumPy as ``np.load`` reads it, then
    read on to the member's end: zipfile checks a member's CRC-32 when a read reaches its
    end, and NumPy stops at the array's last byte (a member may hold more)."""
    with archive.open(info) as member:
        if member.read(6) != b"\x93NUMPY":
            raise FormatError(f"cannot read npz: archive member {info.filename!r} is not a "
                              ".npy array (np.savez writes only those)", field="input")
    with archive.open(info) as member:
        _refuse_objects(np, member, f"archive member {os.path.splitext(info.filename)[0]!r}")
    with archive.open(info) as member:
        array = np.lib.format.read_array(member, allow_pickle=False)
        while member.read(1 << 20):
            pass
    return array


def _refuse_objects(np: Any, f: Any, where: str) -> None:
    """Refuse an array of Python objects by its type, read from its .npy header (``f`` at
    the header's start). NumPy's own refusal says only that it would need allow_pickle,
    which the generic handler reported as a malformed file; the file is fine."""
    from .._numpy import NAME as NUMPY
    from .._registry import get_adapter

    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
    except ValueError:
        return  # not a .npy (an archive given as one): np.load says what it is
    read = {(1, 0): fmt.read_array_header_1_0,
            (2, 0): fmt.read_array_header_2_0}.get(version)
    if read is None:
        return  # another header version: NumPy reads it, or says why not
    dtype = read(f)[2]
    if not dtype.hasobject:
        return
    try:
        get_adapter(NUMPY).dtype_of(dtype)  # raises, naming the types there are
        why = ""
    except UnsupportedError as exc:
        why = f": {exc}"
    raise UnsupportedError(
        f"input: {where} has NumPy dtype {dtype} (Python objects){why}; the file is "
        "well-formed, but the objects are stored pickled, which the bridge never loads: "
        "save a numeric array instead (e.g. arr.astype(np.float32))")


class _StoredMember:
    """An uncompressed ``.npz`` member: a view of its array in one memory map of the
    archive (never read through: only its descriptor is taken), where its data starts in
    the file, and what its CRC-32 must come to."""

    def __init__(self, name: str, array: Any, offset: int, crc: int, head_crc: int) -> None:
        self.name = name
        self.array = array
        self.offset = offset
        self.crc = crc  # the archive's, of the member's bytes: the .npy header, then the data
        self.head_crc = head_crc  # of the .npy header alone


def _stored_member(np: Any, fd: int, archive: Any, info: Any,
                   view: Callable[[], Any]) -> _StoredMember | None:
    """``info``'s array as a :class:`_StoredMember` where the archive stores it as it is
    (``np.savez``) and NumPy would read it the same way; None where it is left to NumPy,
    read whole (compressed, encrypted, sizes that disagree, not a plain little-endian
    .npy of a type the bridge takes over the file's bytes: NumPy then reads it or says
    why not). ``view()`` is the memory map of the archive, made on first use."""
    import io
    import math
    import struct
    import zipfile
    import zlib

    from ..conversion import asarray_one
    from .pread import pread_into

    if (info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 1
            or info.file_size < 10 or info.compress_size != info.file_size):
        return None  # zipfile reads compress_size bytes of a stored member, and checks them
    size = os.fstat(fd).st_size
    if not 0 <= info.header_offset <= size - 30:
        raise FormatError(f"cannot read npz: archive member {info.filename!r} has its local "
                          f"header at offset {info.header_offset}, outside the file "
                          f"({size} bytes)", field="input")
    local = bytearray(30)
    pread_into(fd, memoryview(local), info.header_offset)
    if local[:4] != b"PK\x03\x04":
        raise FormatError(f"cannot read npz: archive member {info.filename!r} has no local "
                          f"header at offset {info.header_offset}", field="input")
    name_len, extra_len = struct.unpack_from("<HH", local, 26)
    start = info.header_offset + 30 + name_len + extra_len
    with archive.open(info) as member:  # zipfile's checks of the local header (its name...)
        magic = member.read(12)
    if magic[:6] != b"\x93NUMPY" or magic[6:8] not in (b"\x01\x00", b"\x02\x00"):
        return None
    head = (10 + struct.unpack_from("<H", magic, 8)[0] if magic[6] == 1
            else 12 + struct.unpack_from("<I", magic, 8)[0])
    if head > info.file_size or start + head > size:
        return None
    # The header whose CRC-32 is checked is the one parsed: both from this one read.
    header = bytearray(head)
    pread_into(fd, memoryview(header), start)
    f = io.BytesIO(header)
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read(f)
    if (f.tell() != head or dtype.hasobject or dtype.fields is not None
            or dtype.subdtype is not None or dtype.byteorder == ">"
            or not all(shape) or min(shape, default=1) < 0):
        return None
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no wrap
    if info.file_size > head + nbytes:
        return None  # bytes after the array: NumPy reads the array and leaves them
    if info.file_size < head + nbytes:
        raise FormatError(f"cannot read npz: archive member {info.filename!r} holds "
                          f"{info.file_size - head} bytes after its .npy header (so says the "
                          f"archive's directory), which says {shape} {dtype} ({nbytes} "
                          "bytes)", field="input")
    if size < start + info.file_size:
        raise FormatError(f"cannot read npz: archive member {info.filename!r} ends past the "
                          "end of the file (truncated)", field="input")
    archive_map = view()
    if len(archive_map) < start + info.file_size:
        raise FormatError(f"cannot read npz: archive member {info.filename!r} ends past the "
                          "end of the file (truncated while it was read)", field="input")
    array = np.ndarray(shape, dtype, buffer=archive_map, offset=start + head,
                       order="F" if fortran else "C")
    t = asarray_one(array, what="a .npz member")  # its descriptor only: no byte read
    if len(t.buffers) != 1 or t.buffers[0].ptr != array.ctypes.data:
        return None  # not the file's bytes as they are: NumPy reads it whole
    return _StoredMember(info.filename, array, start + head, info.CRC, zlib.crc32(header))


@contextlib.contextmanager
def file_regions(path: str, tensors: dict[str, object]
                  ) -> Iterator[tuple[list[Any], Callable[[Sequence[int]], None]] | None]:
    """Plan items for the arrays of a ``.npy`` or ``.npz`` file, and the check of the
    archive's checksums. An array mapped from the file (the ``.npy``'s, a stored member's)
    is an item whose bytes are read from the file in chunks: a memory map that a
    conversion reads whole would grow the resident set by the file's size. Others (a
    compressed member, read whole) are items in memory. None where no array is mapped."""
    from .._numpy import numpy
    from ..conversion import asarray_one
    from .checksums import crc32_combine
    from .disk import open_regular as _open_regular
    from .plan import host_entries
    from .regions import Region
    from .sharded import check_shard_entries

    np = numpy()
    mapped = {k: v for k, v in tensors.items()
              if isinstance(v, _StoredMember) or (
                  isinstance(v, np.memmap) and isinstance(getattr(v, "offset", None), int))}
    if not mapped:
        yield None
        return
    with _open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        items: list[Any] = []
        sums: list[tuple[int, _StoredMember, int]] = []  # entry, member, data bytes
        for key, value in tensors.items():
            arr: Any = value.array if isinstance(value, _StoredMember) else value
            if key in mapped:
                t = asarray_one(arr, what="a .npy array")  # its descriptor only: no byte read
                offset = value.offset if isinstance(value, _StoredMember) else arr.offset
                if len(t.buffers) == 1 and t.buffers[0].ptr == arr.ctypes.data:
                    if size < offset + t.nbytes:
                        what = ("archive" if isinstance(value, _StoredMember)
                                else ".npy file")
                        raise FormatError(f"the {what} is shorter than its header says "
                                          "(truncated while it was read)", field="input")
                    if isinstance(value, _StoredMember):
                        sums.append((len(items), value, t.nbytes))
                    items.append((key, t.descriptor,
                                  [Region(fh.fileno(), offset, t.nbytes)]))
                    continue
                # _stored_member took only members read this way: its CRC-32 is checked
                assert not isinstance(value, _StoredMember), key
            items += [(name, t.descriptor, [t.memoryview(b.role) for b in t.buffers])
                      for name, t in host_entries(key, arr)]
        check_shard_entries({name: d for name, d, _ in items})

        def check(crcs: Sequence[int]) -> None:  # before the output replaces anything
            for entry, member, nbytes in sums:
                got = crc32_combine(member.head_crc, crcs[entry], nbytes)
                if got != member.crc:
                    raise FormatError(f"cannot read npz: archive member {member.name!r} is "
                                      f"damaged: its bytes have the CRC-32 {got:#010x}, the "
                                      f"archive says {member.crc:#010x}", field="input")

        yield items, check
