"""Memory maps of files and their ownership: the last tensor's death unmaps the file.

A loaded file's tensors point into one copy-on-write map (container.md §8.2), owned by a
:class:`MapOwner` that every tensor keeps alive; :func:`mapped_file_origin` tells another
process where a mapped tensor's bytes lie in its file.
"""

from __future__ import annotations

import mmap as _mmap
import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from .._memory import buffer_address
from ..errors import FormatError
from ..layout import Layout
from ..tensor import CPU, Buffer, Tensor
from .format import BUFFER_ALIGNMENT, EntryInfo

__all__ = ["MapOwner", "file_stamp", "map_file", "mapped_file_origin", "pow2_alignment",
           "tensors_over", "unmap"]





def pow2_alignment(address: int, cap: int) -> int:
    """Largest power of two (up to ``cap``) dividing ``address``."""
    if address == 0:
        return cap
    return min(cap, address & -address)


# -------------------------------------------------------------------- memory
class MapOwner:
    """Owner of a mapped (or borrowed) buffer: the last tensor's death releases it.

    For a file, ``view`` is the only export of the mmap; when this object dies
    the view is released, then the mmap, which unmaps the file and closes its
    file descriptor.
    """

    __slots__ = ("__weakref__", "address", "mm", "path", "stamp", "unaligned", "view")

    def __init__(self, view: memoryview, mm: _mmap.mmap | None = None, path: str | None = None,
                 stamp: tuple[int, int, int, int] | None = None):
        self.view = view
        self.mm = mm
        self.path = path
        self.stamp = stamp  # the mapped file's (device, inode, size, mtime_ns) when mapped
        self.address = buffer_address(view)[0]  # view pins the memory
        # (how many of the file's tensors are not BUFFER_ALIGNMENT-aligned, of how many)
        self.unaligned = (0, 0)

    @property
    def alignment_note(self) -> str | None:
        """Why many of this file's tensors are unaligned, and the fix (``None`` when all
        are aligned): what a copy made for that reason adds to its warning
        (``_copy_policy.alignment_note``). Written when a warning asks for it, not at
        each load: one text for every tensor of the file, so the copy warnings it joins
        stay identical and the default filter shows them once per line, with the count a
        single one lacks."""
        unaligned, count = self.unaligned
        if not unaligned or self.path is None:
            return None
        path = self.path
        out = shlex.quote(os.path.splitext(path)[0] + ".hurray")
        return (f"{os.path.basename(path)} stores its tensors back to back: {unaligned} of "
                f"its {count} tensors are not {BUFFER_ALIGNMENT}-byte aligned, and each of "
                f"those is copied too; `hurray convert {shlex.quote(path)} {out}` (or hb.save "
                f"of the loaded file to a .hurray path) aligns them all, once")

    def __repr__(self) -> str:
        try:
            size = f"{len(self.view)} bytes"
        except ValueError:  # released by unmap: a repr must not raise (tracebacks show it)
            size = "closed"
        return f"<hurray mapping of {self.path or 'a buffer'}, {size}>"


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one file from its replacement or a rewrite: device, inode, size and
    modification time (ns)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def mapped_file_origin(t: Tensor) -> tuple[str, int, tuple[int, int, int, int]] | None:
    """``(path, file offset of its first byte, the file's stamp when mapped)`` for a tensor
    that points into a file :func:`load` mapped, so that another process can map the same
    bytes (and tell whether the file under ``path`` is still that one); else ``None``."""
    owner = t.owner
    if (type(owner) is not MapOwner or owner.mm is None or owner.path is None
            or owner.stamp is None or not t.nbytes):
        return None
    return owner.path, t.data_ptr - owner.address, owner.stamp


_DENSE = (Layout.ROW_MAJOR, Layout.STRIDED)


def tensors_over(entries: Sequence[EntryInfo], base: int, owner: object,
                 readonly: bool) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for e in entries:
        d = e.descriptor
        if d.layout in _DENSE and d.quantization is None and d.shard is None:
            # The descriptor was validated when the file was read: the fast dense
            # constructor derives the same single DATA buffer without re-deriving
            # the buffer layout (a checkpoint has hundreds of entries).
            (b,) = e.buffers
            ptr = 0
            if b.length:
                ptr = base + b.offset
                if d.strides is not None:  # the buffer is the span; [0, ..., 0] may be inside
                    ptr += d.dtype.itemsize * sum((n - 1) * -st for n, st in
                                                  zip(d.shape, d.strides, strict=True) if st < 0)
            t = Tensor._dense(ptr, d.shape, d.dtype, strides=d.strides, padded=d.padded,
                              device=CPU, owner=owner, readonly=readonly, copied=False)
            t._desc = d
            out[e.name] = t
            continue
        bufs = [Buffer(b.role, base + b.offset if b.length else 0, b.length) for b in e.buffers]
        out[e.name] = Tensor(d, bufs, device=CPU, owner=owner, readonly=readonly)
    return out


# ------------------------------------------------------------------- reading
# (the index is read and checked by files.format: read_index, read_head)
def _map(f: Any, size: int) -> _mmap.mmap:
    """The open file ``f`` mapped copy-on-write (``MAP_PRIVATE``; container.md §8.2).

    The tensors over it are read-only, but torch has no read-only tensors and ignores
    DLPack's READ_ONLY flag: a write through a read-only map would kill the process
    (SIGSEGV), one through a shared writable map would change the file. A private map
    costs the same to read; a written page becomes this map's own copy.
    """
    try:
        mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_COPY)
    except ValueError:  # "cannot mmap an empty file": emptied since its header was read
        raise FormatError("the file changed size while it was opened",
                          field="file_size") from None
    if len(mm) != size:
        mm.close()
        raise FormatError("the file changed size while it was opened", field="file_size")
    return mm


def map_file(f: Any, size: int, path: str,
             check: Callable[[memoryview], None] | None = None,
             st: os.stat_result | None = None) -> MapOwner:
    """The open file ``f`` mapped (:func:`_map`) as the owner of views into it, after ``check``
    of the whole map (if given); on any failure the map is closed again. ``st``: the open
    file's stat, where the caller has it (its stamp is the owner's)."""
    mm = _map(f, size)
    view = memoryview(mm)
    try:
        if check is not None:
            check(view)
        return MapOwner(view, mm, path, file_stamp(os.fstat(f.fileno()) if st is None else st))
    except BaseException:
        _close(view, mm)
        raise


def unmap(owner: MapOwner) -> None:
    """Close the map of ``owner`` now, when no tensor over it was handed out (a load that
    gave up after :func:`map_file`): its file descriptor too, not at a later collection."""
    if owner.mm is not None:
        _close(owner.view, owner.mm)


def _close(view: memoryview, mm: _mmap.mmap) -> None:
    view.release()
    try:
        mm.close()
    except BufferError:  # still exported (an interrupt inside buffer_address): the
        pass  # map goes with its last reference; the first error is the one to see
