"""What :func:`hurray_bridge.load` and :func:`hurray_bridge.loads` return: the tensors
of a file by name, with its metadata and the alignment its buffers are known to have."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ClosedFileError
from ..shards import ShardedTensor
from ..tensor import Tensor
from .format import BUFFER_ALIGNMENT

__all__ = ["TensorFile"]




class TensorFile(dict[str, "Tensor | ShardedTensor"]):
    """What :func:`load` and :func:`loads` return: ``{name: hb.Tensor}`` plus the file's facts.

    ``metadata`` is the file's string metadata; ``alignment`` is the alignment
    (in bytes) that every non-empty buffer's address is known to have. A sharded
    tensor's entries (``NAME[k]``, see :func:`load`) are one ``hb.ShardedTensor``.
    """

    metadata: dict[str, str]
    alignment: int

    def __init__(self, tensors: Mapping[str, Tensor | ShardedTensor] | None = None,
                 metadata: dict[str, str] | None = None, alignment: int = BUFFER_ALIGNMENT):
        super().__init__(tensors or {})
        self.metadata = {} if metadata is None else metadata
        self.alignment = alignment

    _closed_with: int | None = None  # how many tensors close() dropped; None while open

    def close(self) -> None:
        """Drop this object's tensors. A file's map is unmapped once no tensor taken
        from it is alive (tensors still held stay valid); closing twice is fine. A
        lookup afterwards raises :class:`hb.ClosedFileError`."""
        if self._closed_with is None:
            self._closed_with = len(self)
        self.clear()

    def __getitem__(self, name: str) -> Tensor | ShardedTensor:
        try:
            return super().__getitem__(name)
        except KeyError:
            if self._closed_with is None:
                raise
        raise ClosedFileError(
            f"{name!r}: this file was closed (close(), or the end of its with block), which "
            "dropped its tensors; keep a tensor before closing, or hb.load the file again")

    def __repr__(self) -> str:
        if self._closed_with is None:
            return super().__repr__()
        n = self._closed_with
        # A closed file is empty: printing {} read as a file with no tensors.
        return f"<hb.TensorFile, closed (it held {n} tensor{'s' * (n != 1)})>"

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
