"""safetensors <-> Hurray files: the names of :mod:`hurray_bridge.files.safetensors`.

The module moved into ``hurray_bridge/files/`` with the rest of the file code; this one
re-exports its names unchanged, so ``from hurray_bridge import safetensors_io`` keeps
working (nothing is deprecated).
"""

from __future__ import annotations

from .files.safetensors import (
    MAX_HEADER_SIZE,
    SafetensorsEntry,
    SafetensorsIndex,
    hurray_to_safetensors,
    parse_header,
    read_header,
    safetensors_to_hurray,
    save,
)
from .files.safetensors import load_open as load_open  # the reader of an open file

__all__ = [
    "MAX_HEADER_SIZE",
    "SafetensorsEntry",
    "SafetensorsIndex",
    "hurray_to_safetensors",
    "parse_header",
    "read_header",
    "safetensors_to_hurray",
    "save",
]
