"""A Hurray or safetensors file written again as a Hurray file (``rewrite``,
``hurray convert``), its bytes read in chunks and never mapped, checked in the same pass."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import FormatError, UnsupportedError
from .data_checks import check_checksum, check_head_padding, check_padding_and_bits, verify_file
from .disk import check_suffix, open_regular
from .engine import Progress
from .format import BUFFER_ALIGNMENT, FLAG_DATA_CHECKSUMS, MAGIC, EntryInfo, read_head
from .plan import Plan, plan_items
from .pread import read_range
from .regions import Region, regions_crc
from .safetensors_header import looks_like_safetensors, read_header_and_descriptors
from .sharded import check_shard_entries, shard_group
from .writing import write_plan

__all__ = ["rewrite", "safetensors_plan"]



def rewrite(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
            alignment: int = BUFFER_ALIGNMENT, checksums: bool = True, fsync: bool = True,
            verify: bool = True, progress: Progress | None = None) -> int:
    """Write the Hurray file ``src`` again as ``dst`` with another buffer ``alignment``,
    with or without data checksums; returns the number of tensors, as :func:`load`
    counts them (a sharded tensor's entries count once).

    Names, descriptors, metadata and every tensor's bytes carry over, in the file's
    order. The data is read in chunks, never mapped, so memory stays flat whatever the
    file's size. With ``verify`` (the default) every byte of ``src`` is checked as
    :func:`verify` checks it, in the same pass as the copy, and a defect raises before
    ``dst`` is replaced. The shard sets of a file with sharded tensors are checked as
    :func:`load` checks them. A safetensors file (which :func:`load` knows by its
    content) is converted as ``safetensors_io.safetensors_to_hurray`` converts it.
    """
    check_suffix(dst, "hurray")
    if sys.byteorder != "little":
        raise UnsupportedError("Hurray files are little-endian; this host is big-endian")

    with open_regular(src, "src") as f:
        head = f.read(16)
        f.seek(0)
        if head[:4] != MAGIC and looks_like_safetensors(head):
            # Safetensors content (load reads a file by what it holds): converted as a
            # safetensors input is, its bytes read in chunks, never mapped.
            plan, count = safetensors_plan(f, alignment, checksums)
            write_plan(dst, plan, fsync=fsync, progress=progress)
            return count
        h, entries, meta = read_head(f)
        order, count = _as_loaded(entries)  # as load then save would write them
        shard_sets = None
        if any(shard_group(e.name, e.descriptor) is not None for e in entries):
            shard_sets = functools.partial(check_shard_entries,
                                           {e.name: e.descriptor for e in entries})
        fd = f.fileno()
        read = functools.partial(read_range, fd)
        regions = [[Region(fd, h.data_offset + b.offset, b.length) for b in e.buffers]
                   for e in entries]
        if shard_sets is not None and not verify:
            shard_sets()  # a load checks them whether or not it verifies
        try:
            plan = plan_items([(name, e.descriptor, regions[e.position]) for e, name in order],
                              meta or None, alignment, checksums, [])
        except FormatError:
            if verify:
                # The plan's refusals (a byte that is no bool8 value, which it reads; a name
                # that renumbered shards clash with) are a save's: what load(verify=True)
                # finds first (damage, then a bad shard set) is the error, as it reports it.
                verify_file(f, h, entries)
                if shard_sets is not None:
                    shard_sets()
            raise
        out = {e.position: i for i, (e, _) in enumerate(order)}  # input entry -> output
        sums = bool(h.flags & FLAG_DATA_CHECKSUMS)

        def check(crcs: Sequence[int]) -> None:  # in the order load(verify=True) checks
            if sums:
                for e in entries:
                    i, r = out[e.position], regions[e.position]
                    # A buffer written with bits cleared (trailing bits, padded high bits)
                    # was summed as written: the file's own bytes are summed again.
                    src = plan.entries[i].sources
                    same = len(src) == len(r) and all(a is b for a, b in zip(src, r))
                    crc = crcs[i] if same else regions_crc(r)
                    check_checksum(e, crc)
            check_padding_and_bits(read, h, entries)
            if shard_sets is not None:
                shard_sets()  # after the bytes, as a load checks them

        if verify:
            check_head_padding(read, h)
        write_plan(dst, plan, fsync=fsync, progress=progress,
                   check=check if verify else None, sums=verify and sums)
    return count


def safetensors_plan(f: Any, alignment: int, checksums: bool) -> tuple[Plan, int]:
    """The plan of the Hurray file that the open safetensors file ``f`` converts to (its
    tensors read from ``f`` in chunks when written), and its number of tensors."""
    idx, descriptors = read_header_and_descriptors(f)
    fd, start = f.fileno(), idx.data_start
    items = [(e.name, d, [Region(fd, start + e.begin, e.end - e.begin)])
             for e, d in zip(idx.entries, descriptors, strict=True)]
    return plan_items(items, idx.metadata, alignment, checksums, []), len(items)


def _as_loaded(entries: Sequence[EntryInfo]) -> tuple[list[tuple[EntryInfo, str]], int]:
    """The entries in the order and under the names that :func:`load` then :func:`save`
    give them (each sharded tensor's shards at the place of its first, in table order,
    numbered from 0), and the number of tensors that load counts."""
    groups: dict[str, list[EntryInfo]] = {}
    keys: list[str | EntryInfo] = []
    for e in entries:
        group = shard_group(e.name, e.descriptor)
        if group is None:
            keys.append(e)
        else:
            if group not in groups:
                groups[group] = []
                keys.append(group)
            groups[group].append(e)
    order: list[tuple[EntryInfo, str]] = []
    for k in keys:
        if isinstance(k, str):
            order += [(e, f"{k}[{i}]") for i, e in enumerate(groups[k])]
        else:
            order.append((k, k.name))
    return order, len(keys)
