"""Sharded tensors in files: the entries ``NAME[0]``, ``NAME[1]`` ... of a sharded tensor.

A sharded tensor NAME is stored as one ordinary entry per shard, each with its shard
section (container.md §4.1): nothing in the format changes, and a reader that does not
group them still reads every shard. Readers group them into one ``hb.ShardedTensor``
(:func:`grouped`); writers check the sets before they write a byte
(:func:`check_shard_entries`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..descriptor import Descriptor
from ..errors import FormatError
from ..shards import ShardedTensor, check_set
from ..tensor import Tensor
from .tensor_file import TensorFile

__all__ = ["check_shard_entries", "check_shard_names", "grouped", "shard_group", "sharded_tensor"]



# ----------------------------------------------------------- sharded entries
# A sharded tensor NAME is stored as one ordinary entry per shard, NAME[0], NAME[1] ...,
# each with its shard section (container.md §4.1): nothing in the format changes, and a
# reader that does not group them still reads every shard.
_SHARD_NAME = re.compile(r"(.+)\[(0|[1-9][0-9]*)\]", re.DOTALL)


def shard_group(name: str, d: Descriptor) -> str | None:
    """The sharded tensor an entry belongs to, or ``None`` for an entry of its own."""
    if name[-1:] != "]" or d.shard is None:
        return None
    m = _SHARD_NAME.fullmatch(name)
    return None if m is None else m[1]


def check_shard_names(entries: Mapping[str, Descriptor]) -> None:
    """Refuse a file in which a sharded tensor's name is also an entry of its own."""
    for name, d in entries.items():
        group = shard_group(name, d)
        if group is not None and group in entries and shard_group(group, entries[group]) is None:
            raise FormatError(
                f"entry {group!r} and the shard entry {name!r} both claim the name {group!r} "
                "(entries NAME[k] with shard sections are the shards of NAME); rename one",
                field="name")


def _global(first: Descriptor) -> Descriptor:
    """The global descriptor of the set that a shard entry opens."""
    assert first.shard is not None
    return Descriptor(first.shard.global_shape, first.dtype, padded=first.padded)


def _set_error(group: str, labels: list[str], exc: FormatError) -> FormatError:
    """A shard-set refusal with the entries (and files) in place of ``shards[i]``."""
    message = str(exc)
    if exc.field and message.startswith(exc.field + ": "):
        message = message[len(exc.field) + 2:]
    message = re.sub(r"shards\[(\d+)\]", lambda m: labels[int(m[1])], message)
    return FormatError(f"sharded tensor {group!r}: {message}", field="shards")


def sharded_tensor(group: str, shards: list[Tensor], labels: list[str],
                   partial: bool) -> ShardedTensor:
    """The shards of one group as a ShardedTensor; errors name the entries (and files)."""
    try:
        return ShardedTensor(_global(shards[0].descriptor), shards, partial=partial)
    except FormatError as exc:
        raise _set_error(group, labels, exc) from None


def check_shard_entries(entries: Mapping[str, Descriptor]) -> None:
    """Refuse what a grouping reader refuses in one file (container.md §4.1), from the
    descriptors alone: a name that is a sharded tensor and an entry, and each group's
    shard set (partial sets allowed, as in one process's file). Writers call it before
    they write a byte, so that none writes a file its own reader rejects; ``verify`` calls
    it so that it rejects what ``load`` does."""
    check_shard_names(entries)
    groups: dict[str, list[str]] = {}
    for name, d in entries.items():
        group = shard_group(name, d) if name[-1:] == "]" else None
        if group is not None:
            groups.setdefault(group, []).append(name)
    for group, names in groups.items():
        descs = [entries[n] for n in names]
        try:
            check_set(_global(descs[0]), descs, partial=True)
        except FormatError as exc:
            raise _set_error(group, [f"entry {n!r}" for n in names], exc) from None


def grouped(tensors: TensorFile) -> TensorFile:
    """``tensors`` with each sharded tensor's entries replaced by one partial ShardedTensor,
    at the place of its first shard (``tensors`` itself when there are none)."""
    groups: dict[str, list[str]] = {}
    for name, t in tensors.items():
        # The name first: most entries are decided without reading their descriptor.
        group = shard_group(name, t.descriptor) if name[-1:] == "]" else None
        if group is not None:
            groups.setdefault(group, []).append(name)
    if not groups:
        return tensors
    check_shard_names({name: t.descriptor for name, t in tensors.items()})
    out: dict[str, Tensor | ShardedTensor] = {}
    for name, t in tensors.items():
        group = shard_group(name, t.descriptor)
        if group is None:
            out[name] = t
        elif group not in out:
            names = groups[group]
            # (a ShardedTensor's own descriptor has no shard section: it is never grouped)
            out[group] = sharded_tensor(
                group, [t for n in names if isinstance(t := tensors[n], Tensor)],
                [f"entry {n!r}" for n in names], partial=True)
    return TensorFile(out, tensors.metadata, tensors.alignment)
