"""The copy policy, in one place: what ``copy=True``, ``False`` and ``None`` mean.

Every conversion that would have to copy asks this module what to do:

* ``copy=False`` refuses: :class:`CopyRequiredError`, saying why a copy was needed;
* ``copy=None`` copies and says so: a :class:`CopyWarning` at the user's own line
  (the first frame outside this package and its adapters);
* ``copy=True`` copies silently.

Anything else as ``copy`` is refused before any work (``copy="no"`` would otherwise
read as true).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from functools import cache
from typing import Any

from .errors import CopyRequiredError, CopyWarning, UnsupportedError

__all__ = ["CopyWarning", "alignment_note", "check_copy", "require_copy", "user_stacklevel",
           "warn_copy"]


def check_copy(copy: Any) -> None:
    """Refuse a ``copy`` that is not True, False or None (``copy="no"`` would mean True)."""
    if copy is not None and copy is not True and copy is not False and copy not in (0, 1):
        raise UnsupportedError(f"copy must be True, False or None, got {copy!r}")


def require_copy(copy: bool | None, target: str | None, why: str, *,
                 refusal: str | None = None) -> None:
    """Apply the policy to a copy about to be made for ``target``, because ``why``.

    ``copy=False`` raises :class:`CopyRequiredError` (``refusal`` if given, else
    ``why`` with "which is a copy, but copy=False"); ``copy=None`` warns, unless
    ``target`` is None because the caller's caller reports the copy; ``copy=True``
    returns.
    """
    if copy is False:
        raise CopyRequiredError(refusal if refusal is not None
                                else f"{why}, which is a copy, but copy=False")
    if copy is None and target is not None:
        warn_copy(target, why)


@cache
def _own_dirs() -> tuple[str, ...]:
    """Source folders whose frames a warning skips: the package and its adapters, wherever
    the install put them, so a warning names the user's line however deep it was raised
    (through hb.convert, a shortcut, or an adapter called directly). Found on the first
    warning, not at import."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    spec = importlib.util.find_spec("hurray_bridge.adapters")
    origin = spec.origin if spec is not None else None
    return (here,) if origin is None else (here, os.path.dirname(os.path.abspath(origin)) + os.sep)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called here that names the first frame
    outside hurray_bridge (warnings count its caller as 1)."""
    own = _own_dirs()
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def warn_copy(target: str, reason: str) -> None:
    """Report a copy made under ``copy=None``, at the caller's line."""
    warnings.warn(f"copied for {target}: {reason}", CopyWarning, stacklevel=user_stacklevel())


def alignment_note(t: Any) -> str:
    """What a copy made because ``t`` is not aligned should add to its reason: where the
    owner of ``t``'s memory knows (a loaded safetensors file, whose tensors sit back to
    back), "; " and how many of the file's tensors share the fate and the fix; else "".
    The same text for every tensor of one file, so the warnings stay one per line."""
    note = getattr(getattr(t, "owner", None), "alignment_note", None)
    return f"; {note}" if note else ""
