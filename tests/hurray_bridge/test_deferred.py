"""The core of saves whose entries other processes write (``_deferred.py`` and
``container.write_box``), without Dask: the byte ranges a chunk covers, and the checks a
writer in another process makes before it writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import hurray_bridge as hb
from hurray_bridge._deferred import FileTarget, Job, box_runs
from hurray_bridge.container import write_box

np = pytest.importorskip("numpy", reason="numpy is not installed")


def test_box_runs_cover_a_box_in_row_major_order() -> None:
    shape, item = (3, 4, 5), 2
    flat = np.arange(60).reshape(shape)
    for start, stop in [((0, 0, 0), (3, 4, 5)), ((1, 0, 0), (2, 4, 5)), ((0, 1, 2), (3, 3, 4)),
                        ((2, 3, 4), (3, 4, 5)), ((0, 2, 0), (3, 4, 5))]:
        runs = list(box_runs(shape, item, start, stop))
        got = np.concatenate([flat.reshape(-1)[o // item:(o + n) // item] for o, n in runs])
        box = tuple(slice(a, b) for a, b in zip(start, stop))
        np.testing.assert_array_equal(got, flat[box].reshape(-1))
    assert list(box_runs((3, 4, 5), 2, (0, 0, 0), (3, 4, 5))) == [(0, 120)]
    assert list(box_runs((), 8, (), ())) == [(0, 8)]


def test_write_box_refuses_a_file_that_is_not_the_planned_one(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(bytes(64))
    st = os.stat(other)
    job = Job(None, 0, hb.Descriptor((8,), hb.float64), "x")
    target = FileTarget(str(other), st.st_dev, st.st_ino + 1, 64)
    with pytest.raises(hb.UnsupportedError, match="not the save's temporary"):
        write_box(target, job, (0,), (8,), np.zeros(8), False)
    with pytest.raises(hb.UnsupportedError, match="cannot be opened here"):
        write_box(FileTarget(str(tmp_path / "gone"), 0, 0, 64), job, (0,), (8,),
                  np.zeros(8), False)
    assert other.read_bytes() == bytes(64)
    assert not (tmp_path / "gone").exists()  # opened by name, never created


def test_runs_that_do_not_tile_an_entry_are_refused() -> None:
    import zlib

    from hurray_bridge._deferred import Pending, Run
    from hurray_bridge.files.plan import PlanEntry as _PlanEntry
    from hurray_bridge.files.writing import _combined

    e = _PlanEntry(b"x", b"", (Pending(16),), (0,))
    data = bytes(range(16))
    whole = [Run(100, 6, zlib.crc32(data[:6])), Run(106, 10, zlib.crc32(data[6:]))]
    assert _combined(e, 100, whole[::-1]) == zlib.crc32(data)  # any order, combined in order
    with pytest.raises(hb.FormatError, match="leave a gap at file offset 106"):
        _combined(e, 100, [whole[0], Run(107, 9, 0)])
    with pytest.raises(hb.FormatError, match="overlap at file offset 105"):
        _combined(e, 100, [whole[0], Run(105, 11, 0)])
    with pytest.raises(hb.FormatError, match="end at file offset 106, the entry at 116"):
        _combined(e, 100, whole[:1])
