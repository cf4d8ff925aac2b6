"""hb.load's compiled reader of Hurray entry tables (``_speedups_c/hry_index.c``) and
``parse_index`` agree: on files of plain dense tensors, on files it declines (other
layouts, shards) and on every byte of an index changed and resealed (what a hostile
writer would do), the two give the same tensors or the same refusal. The compiled
reader is used where it reads a table; a corrupt entry is refused by hb.load itself,
never later at an access."""

from __future__ import annotations

import os
import pathlib
import random
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge.files import format as file_format
from hurray_bridge.files.format import HEADER_SIZE

np = pytest.importorskip("numpy")

from tests.hurray_bridge.test_container_corruption import (  # noqa: E402
    CRC12,
    DATA12,
    F12,
    build,
    desc,
    reseal,
    small_file,
)
from tests.hurray_bridge.test_safetensors_compiled import _outcome  # noqa: E402
from tests.vectors.generate_files import tensor  # noqa: E402

compiled = pytest.mark.skipif(file_format._compiled is None,
                              reason="hurray_bridge._speedups not built: no compiled reader")


def _plain(checksums: bool = True, alignment: int | None = None) -> bytes:
    """Plain dense tensors only: what the compiled reader reads."""
    tensors = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5, dtype=np.int8),
        "e": np.zeros((3, 0, 5), np.float64),
        "s": np.array(7, np.int64),
        "w2": np.arange(12, dtype=np.float32).reshape(3, 4) + 1,  # same descriptor as w
        "int4": tensor(hb.Descriptor([5], hb.int4), b"\x21\x43\x05"),
        "ü名": np.ones(3, np.uint16),
    }
    kw: dict[str, Any] = {"checksums": checksums}
    if alignment is not None:
        kw["alignment"] = alignment
    return hb.dumps(tensors, {"format": "test", "k": ""}, **kw)


def _write(folder: str, data: bytes) -> str:
    path = os.path.join(folder, "t.hurray")
    with open(path, "wb") as f:
        f.write(data)
    return path


def _python(path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    with monkeypatch.context() as m:
        m.setattr(file_format, "_compiled", None)
        return _outcome(path)


READ = {
    "plain, with checksums": lambda: _plain(),
    "plain, without checksums": lambda: _plain(checksums=False),
    "plain, aligned to 4096": lambda: _plain(alignment=4096),
    "one entry": lambda: build([(b"a", desc(F12), CRC12)], [(b"k", b"v")], DATA12),
    "out of order in the data": lambda: build(
        [(b"a", desc(F12, [64]), CRC12), (b"b", desc(F12, [0]), CRC12)],
        data=DATA12 + bytes(52) + DATA12),
}

DECLINED = {
    "every kind of entry": small_file,
    "a strided entry among plain ones": lambda: hb.dumps(
        {"s": np.arange(6, dtype=np.int16)[::-2], "d": np.ones(3)}),
    "a sharded tensor": lambda: hb.dumps({"w": hb.split(
        np.arange(48, dtype=np.float32).reshape(6, 8), hb.grid_boxes((6, 8), (2, 2))),
        "bias": np.ones(3)}),
}

BAD = {
    "offset past the end": lambda: build([(b"w", desc(F12, [64]), CRC12)], data=DATA12),
    "offset at 2**64 - 64": lambda: build([(b"w", desc(F12, [2**64 - 64]), CRC12)],
                                          data=DATA12),
    "overlap": lambda: build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [0]), CRC12)],
                             data=DATA12),
    "gap": lambda: build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [128]), CRC12)],
                         data=DATA12 + bytes(116) + DATA12),
    "bytes after the last buffer": lambda: build([(b"a", desc(F12), CRC12)],
                                                 data=DATA12 + bytes(4)),
    "misaligned": lambda: build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [12]), CRC12)],
                                data=DATA12 * 2),
    "length disagrees": lambda: build([(b"a", desc(F12, lengths=[8]), CRC12)], data=DATA12[:8]),
    "duplicate names": lambda: build(
        [(b"a", desc(F12, [0]), CRC12), (b"a", desc(F12, [64]), CRC12)],
        data=DATA12 + bytes(52) + DATA12),
    "NUL in a name": lambda: build([(b"a\x00", desc(F12), CRC12)], data=DATA12),
    "name not UTF-8": lambda: build([(b"a\xff", desc(F12), CRC12)], data=DATA12),
    "checksum in a file without": lambda: build([(b"a", desc(F12), CRC12)], data=DATA12,
                                                flags=0),
    "metadata duplicate key": lambda: build([(b"a", desc(F12), CRC12)],
                                            [(b"k", b"v"), (b"k", b"w")], DATA12),
}


@compiled
@pytest.mark.parametrize("case", sorted(READ))
def test_the_compiled_reader_reads_plain_tables_as_parse_index_does(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(str(tmp_path), READ[case]())
    with monkeypatch.context() as m:
        def no_python(*args: Any) -> None:
            raise AssertionError("parse_index ran")
        m.setattr(file_format, "_parse_entries", no_python)
        got = _outcome(path)
    assert got[0] == "loaded", got
    assert got == _python(path, monkeypatch)


@compiled
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_tables_the_compiled_reader_declines_load_alike(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = DECLINED[case]()
    h = file_format.parse_header(data[:HEADER_SIZE], len(data))
    index = memoryview(data)[HEADER_SIZE:h.index_end]
    assert file_format.compiled_tensors(h, index, 1 << 20, None) is None
    path = _write(str(tmp_path), data)
    got = _outcome(path)
    assert got[0] == "loaded", got
    assert got == _python(path, monkeypatch)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_table_is_refused_at_load_the_same_way(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(str(tmp_path), BAD[case]())
    got = _outcome(path)
    assert got[0] == "refused" and issubclass(got[1], hb.FormatError), got
    assert got == _python(path, monkeypatch)


def test_every_index_byte_changed_and_resealed_loads_or_fails_alike(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _plain()
    h = file_format.parse_header(data[:HEADER_SIZE], len(data))
    rng = random.Random(11)
    loaded = refused = 0
    read_in_c = []
    real = file_format._compiled
    if real is not None:  # count the tables the compiled reader took
        monkeypatch.setattr(file_format, "_compiled", lambda *a: read_in_c.append(
            got := real(*a)) or got)
    for i in range(HEADER_SIZE, h.index_end):
        for mask in (1 << (i % 8), 0xFF, rng.randrange(1, 256)):
            bad = bytearray(data)
            bad[i] ^= mask
            path = _write(str(tmp_path), reseal(bad))
            got = _outcome(path)
            assert got == _python(path, monkeypatch), (i, mask)
            loaded += got[0] == "loaded"
            refused += got[0] == "refused"
    assert loaded and refused  # both kinds of outcome were compared
    assert real is None or any(t is not None for t in read_in_c)


@pytest.mark.parametrize("built", [True, False])
def test_a_load_maps_the_file_once_with_or_without_the_compiled_reader(
        built: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_bridge.files import reading

    if built and file_format._compiled is None:
        pytest.skip("hurray_bridge._speedups not built: no compiled reader")
    if not built:
        monkeypatch.setattr(file_format, "_compiled", None)
    maps: list[str] = []
    real = reading.map_file
    monkeypatch.setattr(reading, "map_file", lambda f, size, path, *a, **kw: maps.append(path)
                        or real(f, size, path, *a, **kw))
    path = _write(str(tmp_path), _plain())
    assert len(hb.load(path)) == 7
    assert maps == [path]
