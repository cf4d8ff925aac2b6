"""Hurray files: the names this module held before :mod:`hurray_bridge.files` split it.

Every name here is re-exported from the module of ``hurray_bridge/files/`` that holds it,
unchanged, so code written against ``hurray_bridge.container`` keeps working; nothing is
deprecated. New code may import from here or from ``hurray_bridge.files.<module>``: the
format in ``format``, reading in ``reading``, writing in ``writing``, conversion in
``convert``, file-system rules in ``disk`` (``docs/README.md`` maps them all).

Beside ``__all__``, the names written ``X as X`` stay importable from here as before:
the limit ``hurray convert --alignment`` is checked against, the metadata reader (the
torch checkpoint backend), what the other processes of a save need (the Dask adapter);
and the plan and write that ``hurray convert`` of a NumPy file calls through this
module (a test replaces ``_write_plan`` here to watch it).
"""

from __future__ import annotations

from .files.convert import rewrite
from .files.disk import SUFFIX_FORMATS, atomic_output, check_suffix, stale_temporaries
from .files.format import (
    BUFFER_ALIGNMENT,
    HEADER_SIZE,
    MAGIC,
    PAGE_ALIGNMENT,
    VERSION,
    EntryInfo,
    FileIndex,
    read_index,
)
from .files.format import FLAG_DATA_CHECKSUMS as FLAG_DATA_CHECKSUMS
from .files.format import MAX_BUFFER_ALIGNMENT as MAX_BUFFER_ALIGNMENT
from .files.format import MAX_KEY_BYTES as MAX_KEY_BYTES
from .files.format import MAX_METADATA_BYTES as MAX_METADATA_BYTES
from .files.format import MAX_NAME_BYTES as MAX_NAME_BYTES
from .files.format import load_metadata as load_metadata
from .files.mapping import file_stamp as file_stamp
from .files.mapping import mapped_file_origin as mapped_file_origin
from .files.plan import plan_items as _plan  # noqa: F401
from .files.plan import plan_tensors as _plan_tensors  # noqa: F401
from .files.reading import load, loads, verify
from .files.tensor_file import TensorFile
from .files.writing import dumps, save
from .files.writing import write_box as write_box
from .files.writing import write_plan as _write_plan  # noqa: F401

__all__ = [
    "BUFFER_ALIGNMENT",
    "HEADER_SIZE",
    "MAGIC",
    "PAGE_ALIGNMENT",
    "VERSION",
    "EntryInfo",
    "FileIndex",
    "TensorFile",
    "dumps",
    "load",
    "loads",
    "read_index",
    "rewrite",
    "save",
    "stale_temporaries",
    # from files.disk: the file-system rules every writer follows
    "SUFFIX_FORMATS",
    "atomic_output",
    "check_suffix",
    "verify",
]
