"""hb.load's compiled reader of safetensors headers (``_speedups_c/st_header.c``) and the
Python reader agree: on a table of good and bad headers, and on mutated ones, the two give
the same tensors (names, order, shapes, types, offsets, bytes, descriptors, metadata,
alignment) or the same refusal. The compiled reader is used where it reads a header, and
declines (to the Python reader, which names the defect) wherever it does not."""

from __future__ import annotations

import json
import os
import pathlib
import struct
import sys
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hurray_bridge as hb
from hurray_bridge.files import safetensors_header as sh
from hurray_bridge.files.format import BUFFER_ALIGNMENT

compiled = pytest.mark.skipif(sh._compiled is None,
                              reason="hurray_bridge._speedups not built: no compiled reader")


def _entry(dtype: str, shape: list[int], begin: int, end: int) -> str:
    return json.dumps({"dtype": dtype, "shape": shape, "data_offsets": [begin, end]},
                      separators=(",", ":"))


def _writer(entries: dict[str, tuple[str, list[int], int, int]],
            meta: dict[str, str] | None = None) -> bytes:
    """A header as safetensors' writer lays it out (compact, __metadata__ first)."""
    parts = []
    if meta is not None:
        parts.append('"__metadata__":' + json.dumps(meta, separators=(",", ":")))
    parts += [json.dumps(k, ensure_ascii=False) + ":" + _entry(*v) for k, v in entries.items()]
    return ("{" + ",".join(parts) + "}").encode("utf-8")


_AB = {"a": ("F32", [2, 2], 0, 16), "b": ("U8", [], 16, 17)}

# (header, data bytes): headers the compiled reader reads itself
READ = {
    "writer form": (_writer(_AB), 17),
    "metadata first": (_writer(_AB, {"format": "pt", "k": ""}), 17),
    "metadata last": (_writer(_AB)[:-1] + b',"__metadata__":{"x":"y"}}', 17),
    "empty metadata": (_writer(_AB, {}), 17),
    "spaces between members and after": (
        b'{ "a" :' + _entry(*_AB["a"]).encode() + b' ,\n"b"\t:'
        + _entry(*_AB["b"]).encode() + b' }   ', 17),
    "metadata with spaces": (b'{"__metadata__" : { "k" : "v" , "l":"w" },'
                             + _writer(_AB)[1:], 17),
    "empty tensors": (_writer({"e": ("F64", [0, 3], 5, 5), "z": ("I8", [5], 0, 5),
                               "f": ("U8", [3, 0], 5, 5)}), 5),
    "shared type and shape": (_writer({f"w{i}": ("F16", [3], 6 * i, 6 * i + 6)
                                       for i in range(5)}), 30),
    "data out of order": (_writer({"a": ("I16", [2], 4, 8), "b": ("I32", [1], 0, 4)}), 8),
    "many types": (_writer({"h": ("BF16", [2], 0, 4), "q": ("F4", [4], 4, 6),
                            "o": ("BOOL", [2], 6, 8), "c": ("C64", [1], 8, 16),
                            "u": ("U64", [1], 16, 24)}), 24),
    "utf-8 names": (_writer({"é": ("U8", [1], 0, 1), "名前🙂": ("U8", [1], 1, 2)}), 2),
    "unaligned": (_writer({"a": ("U8", [3], 0, 3), "b": ("F32", [1], 3, 7)}), 7),
    "dimension of zero beside a huge one": (
        _writer({"e": ("F32", [0, 2**63 - 1], 0, 0), "a": ("U8", [1], 0, 1)}), 1),
}

# good headers the compiled reader declines: the Python reader reads them
DECLINED = {
    "escaped name": (b'{"a\\u00e9":' + _entry("U8", [1], 0, 1).encode() + b"}", 1),
    "spaces inside an entry": (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                               1),
    "members in another order": (b'{"a":{"shape":[1],"dtype":"U8","data_offsets":[0,1]}}', 1),
    "escaped metadata": (b'{"__metadata__":{"k":"\\n"},' + _writer(_AB)[1:], 17),
    "dimension of zero beside one past int64": (
        _writer({"e": ("F32", [0, 2**63], 0, 0), "a": ("U8", [1], 0, 1)}), 1),
}

# headers both readers refuse
BAD = {
    "unknown dtype": (_writer({"a": ("X9", [1], 0, 1)}), 1),
    "size does not match shape": (_writer({"a": ("F32", [2], 0, 4)}), 4),
    "offsets past the data": (_writer({"a": ("U8", [4], 0, 4)}), 3),
    "begin after end": (_writer({"a": ("U8", [0], 2, 1), "b": ("U8", [2], 0, 2)}), 2),
    "overlap": (_writer({"a": ("U8", [2], 0, 2), "b": ("U8", [2], 1, 3)}), 3),
    "hole": (_writer({"a": ("U8", [2], 0, 2), "b": ("U8", [2], 3, 5)}), 5),
    "data not all covered": (_writer({"a": ("U8", [2], 0, 2)}), 3),
    "duplicate name": (b'{"a":' + _entry("U8", [1], 0, 1).encode() + b',"a":'
                       + _entry("U8", [1], 1, 2).encode() + b"}", 2),
    "duplicate metadata": (b'{"__metadata__":{},"__metadata__":{},' + _writer(_AB)[1:], 17),
    "metadata duplicate key": (b'{"__metadata__":{"k":"a","k":"b"},' + _writer(_AB)[1:], 17),
    "metadata value not a string": (b'{"__metadata__":{"k":1},' + _writer(_AB)[1:], 17),
    "metadata as a tensor": (b'{"__metadata__":' + _entry("U8", [1], 0, 1).encode() + b"}", 1),
    "garbage after the header": (_writer(_AB) + b" x", 17),
    "no closing brace": (_writer(_AB)[:-1] + b"  ", 17),
    "dynamic dimension": (_writer({"a": ("U8", [0, 2**64 - 1], 0, 0)}), 1),
    "dimension past 64 bits": (b'{"a":{"dtype":"U8","shape":[0,18446744073709551616],'
                               b'"data_offsets":[0,0]}}', 0),
    "element count past 64 bits": (_writer({"a": ("U8", [2**32, 2**32], 0, 1)}), 1),
    "byte count past int64": (_writer({"a": ("I16", [2**62], 0, 4)}), 4),
    "rank 65": (_writer({"a": ("U8", [1] * 65, 0, 1)}), 1),
    "leading zero": (b'{"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}}', 1),
    "F4 of an odd count": (_writer({"a": ("F4", [3], 0, 2)}), 2),
    "control character in a name": (b'{"a\x01":' + _entry("U8", [1], 0, 1).encode() + b"}", 1),
    "invalid UTF-8 in a name": (b'{"a\xff":' + _entry("U8", [1], 0, 1).encode() + b"}", 1),
    "byte order mark": (b"\xef\xbb\xbf" + _writer(_AB), 17),
    "negative offset": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}', 1),
    "float offset": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1.0]}}', 1),
    "no tensors, stray data": (b"{}", 3),
}


def _file(folder: str, header: bytes, data_size: int) -> str:
    path = os.path.join(folder, "t.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(range(256)) * (data_size // 256)
                + bytes(range(data_size % 256)))
    return path


def _facts(t: Any) -> tuple[Any, ...]:
    """Every fact of a loaded tensor (of each shard of a sharded one), its addresses as
    offsets into its map."""
    if isinstance(t, hb.ShardedTensor):
        return ("sharded", t.descriptor, t.is_complete, tuple(_facts(s) for s in t.shards))
    at = t.owner.address if t.nbytes else 0
    return (t.shape, t.dtype, t.strides, t.nbytes, t.readonly, t.copied, t.device,
            type(t.owner), t.descriptor, t.data_ptr - at if t.nbytes else None,
            tuple((b.role, b.ptr - at if b.nbytes else None, b.nbytes,
                   bytes(t.memoryview(b.role)) if b.nbytes else b"") for b in t.buffers))


def _outcome(path: str) -> tuple[Any, ...]:
    """What hb.load gives: every fact of every tensor, or the refusal."""
    try:
        f = hb.load(path)
    except Exception as exc:  # the type and the message are what must agree
        return ("refused", type(exc), str(exc))
    return ("loaded", [(name, _facts(t)) for name, t in f.items()], f.metadata, f.alignment,
            type(f))


def _python(path: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    with monkeypatch.context() as m:
        m.setattr(sh, "_compiled", None)
        return _outcome(path)


@compiled
@pytest.mark.parametrize("case", sorted(READ))
def test_the_compiled_reader_reads_the_writers_form_as_python_does(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(str(tmp_path), *READ[case])
    with monkeypatch.context() as m:
        def no_python(*args: Any) -> None:
            raise AssertionError("the Python reader ran")
        m.setattr(sh, "_parse", no_python)
        got = _outcome(path)
    assert got[0] == "loaded", got
    assert got == _python(path, monkeypatch)


@compiled
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_forms_the_compiled_reader_declines_load_by_python_alike(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header, size = DECLINED[case]
    raw = sh.header_bytes(struct.pack("<Q", len(header)) + header, 8 + len(header) + size)
    assert sh.compiled_tensors(raw, size, 1 << 20, None, BUFFER_ALIGNMENT) is None
    path = _file(str(tmp_path), header, size)
    got = _outcome(path)
    assert got[0] == "loaded", got
    assert got == _python(path, monkeypatch)


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_header_is_refused_at_load_the_same_way(
        case: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(str(tmp_path), *BAD[case])
    got = _outcome(path)
    assert got[0] == "refused", got
    assert issubclass(got[1], hb.HurrayError)
    assert got == _python(path, monkeypatch)


@compiled
def test_entries_of_one_type_and_shape_share_a_checked_descriptor(
        tmp_path: pathlib.Path) -> None:
    f = hb.load(_file(str(tmp_path), *READ["shared type and shape"]))
    ts = list(f.values())
    assert all(t._desc is ts[0]._desc is not None for t in ts)  # type: ignore[union-attr]
    assert ts[0].descriptor == hb.Descriptor((3,), hb.dtypes.float16)


@compiled
def test_the_checkpoint_runs_as_often_in_both_readers(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n = 2049
    path = _file(str(tmp_path), _writer({f"t{i}": ("U8", [1], i, i + 1) for i in range(n)}), n)
    calls: list[bool] = []
    for off in (False, True):
        with monkeypatch.context() as m:
            m.setattr(sh, "checkpoint", lambda off=off: calls.append(off))
            if off:
                m.setattr(sh, "_compiled", None)
            assert len(hb.load(path)) == n
    assert calls == [False] * 3 + [True] * 3  # at 0, 1,024 and 2,048 entries, each reader


@compiled
def test_an_interrupt_in_the_checkpoint_stops_the_compiled_reader(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(str(tmp_path), _writer({f"t{i}": ("U8", [1], i, i + 1) for i in range(1500)}),
                 1500)

    def stop() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sh, "checkpoint", stop)
    with pytest.raises(KeyboardInterrupt):
        hb.load(path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("case", ["hole", "metadata duplicate key", "unknown dtype"])
def test_a_refused_file_is_left_unmapped(case: str, tmp_path: pathlib.Path) -> None:
    path = _file(str(tmp_path), *BAD[case])
    with pytest.raises(hb.HurrayError):
        hb.load(path)
    with open("/proc/self/maps") as maps:
        assert path not in maps.read()


# One byte of a good header replaced: the compiled and Python readers still agree.
_GOOD = _writer({"a": ("F32", [2, 2], 0, 16), "b": ("U8", [], 16, 17),
                 "c": ("I16", [0, 3], 17, 17)}, {"k": "v"})


@settings(max_examples=150, deadline=None)
@given(at=st.integers(0, len(_GOOD) - 1), byte=st.sampled_from(b'0123456789,:[]{}" \\aF-.e'))
def test_mutated_headers_load_or_fail_alike(at: int, byte: int) -> None:
    header = _GOOD[:at] + bytes([byte]) + _GOOD[at + 1:]
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as m:
        path = _file(folder, header, 17)
        assert _outcome(path) == _python(path, m)


@pytest.mark.parametrize("built", [True, False])
def test_a_load_maps_the_file_once_with_or_without_the_compiled_reader(
        built: bool, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_bridge.files import reading

    if built and sh._compiled is None:
        pytest.skip("hurray_bridge._speedups not built: no compiled reader")
    if not built:
        monkeypatch.setattr(sh, "_compiled", None)
    maps: list[str] = []
    real = reading.map_file
    monkeypatch.setattr(reading, "map_file", lambda f, size, path, *a, **kw: maps.append(path)
                        or real(f, size, path, *a, **kw))
    path = _file(str(tmp_path), *READ["writer form"])
    assert len(hb.load(path)) == 2
    assert maps == [path]
