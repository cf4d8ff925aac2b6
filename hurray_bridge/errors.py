"""The exception hierarchy: one base class, each subclass also a built-in.

Every error the bridge raises derives from :class:`HurrayError` and from the
built-in exception a caller would naturally catch (``ValueError``,
``TypeError``, ``BufferError``, ``ImportError``), as pyarrow does, so code
written against plain Python or the DLPack standard keeps working.
"""

from __future__ import annotations

__all__ = [
    "BackendNotAvailableError",
    "ClosedFileError",
    "CopyRequiredError",
    "CopyWarning",
    "DynamicShapeError",
    "FormatError",
    "HurrayError",
    "NotFoundError",
    "TransportError",
    "UnsupportedError",
]


class HurrayError(Exception):
    """Base class of every error raised by hurray_bridge."""


class FormatError(HurrayError, ValueError):
    """A descriptor, file or message violates the Hurray format.

    ``field`` names the offending field when one can be named; ``rule`` names the
    descriptor rule it breaks (an entry of ``hurray_bridge.descriptor.RULES``) when one
    of them refused it, else ``None``.
    """

    def __init__(self, message: str, *, field: str | None = None,
                 rule: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.rule = rule


class UnsupportedError(HurrayError, TypeError, BufferError):
    """A type, layout or device that a framework or path cannot represent.

    Also a ``BufferError``: the array API standard asks ``__dlpack__`` to raise
    that when a tensor cannot be exported, and consumers catch it.
    """


class DynamicShapeError(HurrayError, ValueError):
    """A size, stride or byte count was asked of a shape with a dynamic dimension."""


class CopyRequiredError(HurrayError, BufferError):
    """``copy=False`` was requested but the hand-off needs a copy."""


class ClosedFileError(HurrayError, ValueError):
    """A tensor was asked of a loaded file after its ``close()`` (a ``ValueError``, as
    Python's own files raise for an operation on a closed file)."""


class NotFoundError(HurrayError, KeyError):
    """A name asked of a store or server that holds nothing under it (a ``KeyError``)."""

    def __str__(self) -> str:
        # KeyError's own str() quotes its argument, which suits a bare key, not a sentence.
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class TransportError(HurrayError, ConnectionError):
    """The channel carrying tensors failed: the peer went away or refused the transfer.

    The message says how many tensors had arrived whole; none after them was handed out.
    """


class CopyWarning(UserWarning):
    """A conversion with ``copy=None`` had to copy the data (it says why)."""


class BackendNotAvailableError(HurrayError, ImportError):
    """A framework (or an optional helper package) is not installed.

    ``extra`` is the pip extra that installs it.
    """

    def __init__(self, framework: str, extra: str | None = None, detail: str = "") -> None:
        extra = extra or framework
        msg = (
            f"{framework} is not installed{': ' + detail if detail else ''}; "
            f"install it with: pip install 'hurray-bridge[{extra}]'"
        )
        super().__init__(msg, name=framework)
        self.framework = framework
        self.extra = extra


def not_a_tensor(t: object, target: str) -> UnsupportedError:
    """The error every adapter's ``from_hurray`` raises for an argument that is no hb.Tensor."""
    return UnsupportedError(f"from_hurray() takes an hb.Tensor, got {type(t).__name__} "
                            f"{t!r:.60}; hb.convert(x, {target!r}) takes native objects")
