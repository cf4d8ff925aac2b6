"""Hand a tensor to other processes through shared memory, without copying it per process.

:func:`share` copies a tensor's buffers once into a new
``multiprocessing.shared_memory`` segment and returns a small, picklable
:class:`SharedTensorHandle` (the segment's name and the tensor's descriptor,
whose buffer table gives each buffer's offset in the segment). Any process on
the machine turns the handle back into an ``hb.Tensor`` over that memory with
:func:`attach`: no copy, so writes through one mapping are seen through all.

Lifetime (docs/spec/interchange.md §7.2):

* The process that called :func:`share` **owns** the segment. It removes it
  with :meth:`SharedTensorHandle.unlink` (or by leaving a ``with handle:``
  block). If it exits without doing so, Python's resource tracker removes the
  segment when the owner's process tree exits, and warns about a leak.
* Unlinking removes the *name*: tensors already attached stay valid (POSIX
  keeps the memory mapped) until they are garbage-collected; later
  :func:`attach` calls fail with ``FileNotFoundError``.
* Consumers never unlink. :func:`attach` does not register the segment with
  the consumer's resource tracker (CPython before 3.13 does so in
  ``SharedMemory(name)``, so a consumer's exit removed the owner's segment:
  python/cpython#82300), so a consumer exiting never removes the segment.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ._memory import ALIGNMENT, buffer_address
from ._trailing import placed_pieces
from .descriptor import Descriptor
from .errors import FormatError, UnsupportedError
from .tensor import CPU, Buffer, Tensor
from .wire import canonical_offsets, decode_prefix, encode

__all__ = ["SharedTensorHandle", "attach", "share"]

# Segments this process created and has not unlinked. Holding the SharedMemory
# object keeps the segment alive on Windows, where it has no name of its own.
_OWNED: dict[str, Any] = {}


@dataclass(frozen=True)
class SharedTensorHandle:
    """What another process needs to map a shared tensor: pickle it, send it, :func:`attach`.

    ``name`` is the shared-memory segment (``None`` for a tensor without any
    bytes: nothing is allocated), ``descriptor`` the wire encoding of the
    tensor with each buffer's offset into the segment, ``nbytes`` the bytes
    in use, ``readonly`` whether consumers map it read-only, ``owner_pid``
    the process that must unlink it.
    """

    name: str | None
    descriptor: bytes
    nbytes: int
    readonly: bool
    owner_pid: int

    @property
    def tensor_descriptor(self) -> Descriptor:
        return decode_prefix(self.descriptor)[0]

    def unlink(self) -> None:
        """Remove the segment's name (idempotent). Attached tensors stay valid."""
        if self.name is None:
            return
        shm = _OWNED.pop(self.name, None)
        if shm is not None:
            # The owner: SharedMemory.unlink also tells the resource tracker.
            shm.close()
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
            return
        try:
            import _posixshmem  # type: ignore[import-not-found]  # CPython's, POSIX only
        except ImportError:  # Windows: the segment goes when its last handle closes
            return
        try:
            _posixshmem.shm_unlink("/" + self.name)
        except FileNotFoundError:
            pass

    def __enter__(self) -> SharedTensorHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.unlink()

    def __repr__(self) -> str:
        return (f"SharedTensorHandle(name={self.name!r}, {self.tensor_descriptor!r}, "
                f"nbytes={self.nbytes}{', readonly' if self.readonly else ''})")


def share(tensor: Any, *, readonly: bool = False) -> SharedTensorHandle:
    """Copy ``tensor`` (an hb.Tensor or native host array) once into new shared memory.

    Every layout travels as it is (strided, sparse, quantized: all buffers,
    each at a 64-byte aligned offset). ``readonly=True`` gives consumers
    read-only tensors over a copy-on-write map of the segment: a consumer that
    writes anyway changes its own pages, never the segment. This process owns the
    segment: see the module docstring for the lifetime rule.
    """
    from multiprocessing import shared_memory

    from .conversion import asarray_one

    t = asarray_one(tensor, what="a shared-memory block")
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"cannot share a {t.device} tensor through host shared memory; convert it to a "
            "host framework first"
        )
    lengths = [b.nbytes for b in t.buffers]
    offsets = canonical_offsets(lengths)
    end = max((o + n for o, n in zip(offsets, lengths) if n), default=0)
    desc_bytes = encode(t.descriptor, offsets)
    if end == 0:
        return SharedTensorHandle(None, desc_bytes, 0, readonly, os.getpid())
    shm = shared_memory.SharedMemory(create=True, size=end)
    try:
        _, _, _, view = buffer_address(shm.buf)
        try:
            # Packed sub-byte data goes in with its last byte's trailing bits zero.
            views = [t.memoryview(b.role) for b in t.buffers]
            for piece, at in zip(*placed_pieces(t.descriptor, views, offsets)):
                if len(piece):
                    view[at:at + len(piece)] = piece
        finally:
            view.release()
    except BaseException:
        shm.close()
        shm.unlink()
        raise
    _OWNED[shm.name] = shm
    return SharedTensorHandle(shm.name, desc_bytes, end, readonly, os.getpid())


class _Mapping:
    """Owns one mapping of a segment; unmaps it when the last tensor over it dies."""

    __slots__ = ("__weakref__", "_keep", "_mm", "_view")

    def __init__(self, mm: Any, view: memoryview, keep: Any = None) -> None:
        self._mm = mm
        self._view = view
        self._keep = keep

    def __del__(self) -> None:
        try:
            self._view.release()
            if self._keep is not None:
                self._keep.close()  # a SharedMemory object (Windows) owns the mapping
            else:
                self._mm.close()
        except (BufferError, ValueError):  # still exported somewhere: let the GC unmap it
            pass


def _map_segment(name: str, readonly: bool) -> tuple[Any, Any]:
    """Map segment ``name`` without registering it with this process's resource tracker."""
    try:
        import _posixshmem  # CPython's, POSIX only (see above)
    except ImportError:  # Windows: SharedMemory registers nothing there
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(name)
        return shm.buf, shm
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDONLY if readonly else os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shared-memory segment {name!r} no longer exists: its owner unlinked it or exited "
            "(attach before the owner calls unlink())"
        ) from None
    try:
        size = os.fstat(fd).st_size
        # Read-only handles map copy-on-write: a consumer that writes anyway (torch has no
        # read-only tensors) changes its own private pages, never the segment, and does
        # not die of SIGSEGV as it would on a read-only map (interchange.md §7.2).
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_COPY if readonly else mmap.ACCESS_WRITE)
    finally:
        os.close(fd)
    return mm, None


def attach(handle: SharedTensorHandle) -> Tensor:
    """An hb.Tensor over the shared segment of ``handle``, zero-copy.

    The tensor keeps the mapping open; it is read-only when the handle says so.
    Works in any process of the machine, the owner's included.
    """
    if not isinstance(handle, SharedTensorHandle):
        raise UnsupportedError(  # a TypeError too
            f"attach() takes a SharedTensorHandle, got {type(handle).__name__} {handle!r:.60}")
    d, entries, size = decode_prefix(handle.descriptor)
    if size != len(handle.descriptor):
        raise FormatError(f"{len(handle.descriptor) - size} trailing bytes after the descriptor",
                          field="handle.descriptor")
    if handle.name is None:
        if any(e.length for e in entries):
            raise FormatError("a handle without a segment describes non-empty buffers",
                              field="handle.name")
        return Tensor(d, [Buffer(e.role, 0, 0) for e in entries], device=CPU,
                      readonly=handle.readonly)
    mm, keep = _map_segment(handle.name, handle.readonly)
    base, length, _, view = buffer_address(mm)
    for i, e in enumerate(entries):
        if e.length and e.offset + e.length > length:
            view.release()
            raise FormatError(
                f"buffer {i} ({e.role.name}) spans [{e.offset}, {e.offset + e.length}) but the "
                f"segment {handle.name!r} has {length} bytes", field=f"buffers[{i}]",
            )
        if e.length and (base + e.offset) % ALIGNMENT:
            view.release()
            raise FormatError(f"buffer {i} is not 64-byte aligned in the segment",
                              field=f"buffers[{i}].offset")
    owner = _Mapping(mm, view, keep)
    bufs = [Buffer(e.role, base + e.offset if e.length else 0, e.length) for e in entries]
    return Tensor(d, bufs, device=CPU, owner=owner, readonly=handle.readonly)
