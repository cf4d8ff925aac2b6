"""The compiled planners of small files of plain dense arrays (``_speedups_c/small_files.c``)
and the Python ones agree byte for byte (hb.save's: ``plan_tensors`` and ``Plan.head``,
what ``hb.dumps`` writes; safetensors_io.save's: ``_write_safetensors``); where they
decline (any value, name or size the Python path treats otherwise) the save writes what
the Python path writes and raises what it raises; the pieces keep the arrays' memory; an
interrupt inside a planner is never swallowed."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import safetensors_io
from hurray_bridge.files import plan as file_plan
from hurray_bridge.files import safetensors as st_file
from hurray_bridge.files.engine import CHUNK

np = pytest.importorskip("numpy")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

compiled = pytest.mark.skipif(file_plan._small is None,
                              reason="hurray_bridge._speedups not built: no compiled planner")

DTYPES = ("float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8",
          "uint16", "uint32", "uint64", "complex64", "complex128")


def _joined(pieces: list[Any]) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def _python_file(mapping: dict[str, Any], metadata: dict[str, str] | None = None,
                 **kw: Any) -> bytes:
    return hb.dumps(mapping, metadata, **kw)  # plan_tensors and serialise: all Python


def _same_outcome(compiled: bytes | BaseException, python: bytes | BaseException) -> None:
    """The same bytes written, or the same error raised."""
    if isinstance(python, BaseException):
        assert type(compiled) is type(python)
        assert str(compiled) == str(python)
    else:
        assert compiled == python


Outcome = bytes | BaseException


def _outcomes(save: Any, planner: Any, folder: pathlib.Path, suffix: str,
              monkeypatch: pytest.MonkeyPatch, *args: Any,
              catch: type[BaseException] = hb.HurrayError, **kw: Any) -> tuple[Outcome, Outcome]:
    """What ``save(path, *args, **kw)`` writes (or raises, of ``catch``) with the compiled
    planner of the module ``planner``, then with its Python path."""
    out: list[Outcome] = []
    for name in ("c", "p"):
        path = folder / f"{name}{suffix}"
        try:
            save(path, *args, fsync=False, **kw)
            out.append(path.read_bytes())
        except catch as exc:
            out.append(exc)
        monkeypatch.setattr(planner, "_small", None)
    return out[0], out[1]


def _saved(tmp_path: pathlib.Path, name: str, mapping: Any, **kw: Any) -> bytes:
    path = tmp_path / name
    hb.save(path, mapping, fsync=False, **kw)
    return path.read_bytes()


@compiled
@pytest.mark.parametrize("alignment", [64, 128, 4096, 8192])
@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt", "ü": "名前", "k": ""}])
def test_the_compiled_plan_is_the_python_file(alignment: int, checksums: bool,
                                              metadata: dict[str, str] | None) -> None:
    arrays = {f"layer.{i}.{dt}": np.arange(1 + 7 * i, dtype=dt).reshape(-1)
              for i, dt in enumerate(DTYPES)}
    arrays.update({"scalar": np.array(3.5, np.float32), "grid": np.ones((3, 4, 5), np.int16),
                   "名前/ü": np.arange(6, dtype=np.uint8).reshape(2, 3)})
    pieces = file_plan.small_dense_file(arrays, metadata, alignment, checksums, CHUNK)
    assert pieces is not None
    assert _joined(pieces) == _python_file(arrays, metadata, alignment=alignment,
                                           checksums=checksums)


@compiled
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12).filter(lambda s: "\0" not in s),
                          st.sampled_from(DTYPES),
                          st.lists(st.integers(1, 5), max_size=3)),
                min_size=1, max_size=12, unique_by=lambda t: t[0]),
       st.sampled_from([64, 256, 4096]), st.booleans())
def test_any_dict_of_plain_arrays_is_planned_as_python_plans_it(
        specs: list[tuple[str, str, list[int]]], alignment: int, checksums: bool) -> None:
    arrays = {}
    for k, (name, dt, shape) in enumerate(specs):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:  # (a lone surrogate: the compiled planner declines it)
            continue
        arrays[name] = (np.arange(int(np.prod(shape)), dtype=dt) + k).reshape(shape)
    assume(arrays)
    pieces = file_plan.small_dense_file(arrays, None, alignment, checksums, CHUNK)
    assert pieces is not None
    assert _joined(pieces) == _python_file(arrays, alignment=alignment, checksums=checksums)


def _declined_cases() -> list[tuple[str, Any]]:
    base = np.arange(16, dtype=np.float32).reshape(4, 4)

    class Sub(np.ndarray):
        pass

    class Duck:  # a dtype and a shape, no buffer
        dtype = np.dtype(np.float32)
        shape = (3,)

    class Unhashable:  # a shape that is a list
        dtype = np.dtype(np.float32)

        def __init__(self) -> None:
            self.shape = [3]

    return [
        ("an empty array", {"a": base, "e": np.zeros((2, 0), np.float32)}),
        ("a non-contiguous array", {"a": base, "t": base.T}),
        ("a strided view", {"a": base[:, ::2]}),
        ("a bool array", {"a": base, "m": np.ones(4, bool)}),
        ("a big-endian array", {"a": base, "be": np.arange(3, dtype=">i4")}),
        ("an ndarray subclass", {"a": base.view(Sub)}),
        ("a NumPy scalar", {"a": base, "s": np.float32(2.0)}),
        ("a list", {"a": base, "l": [1.0, 2.0]}),
        ("an object with a dtype and a shape", {"a": base, "d": Duck()}),
        ("an unhashable shape", {"a": base, "u": Unhashable()}),
        ("an hb.Tensor", {"a": hb.asarray(base)}),
        ("a name with NUL", {"a\0b": base}),
        ("a name past the limit", {"n" * 5000: base}),
        ("a lone surrogate name", {"\udcff": base}),
        ("an empty name", {"": base}),
        ("a non-str name", {1: base}),
    ]


@compiled
@pytest.mark.parametrize(("case", "mapping"), _declined_cases(),
                         ids=[c for c, _ in _declined_cases()])
def test_the_planner_declines_what_python_plans_otherwise(
        case: str, mapping: dict[Any, Any], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert file_plan.small_dense_file(mapping, None, 64, True, CHUNK) is None
    _same_outcome(*_outcomes(hb.save, file_plan, tmp_path, ".hurray", monkeypatch, mapping))


@compiled
def test_data_of_the_limit_or_more_is_left_to_the_data_writer() -> None:
    arrays = {"a": np.zeros(1000, np.uint8), "b": np.zeros(1000, np.uint8)}
    assert file_plan.small_dense_file(arrays, None, 64, True, 1024 + 1000) is None
    assert file_plan.small_dense_file(arrays, None, 64, True, 4097) is not None


@compiled
def test_a_head_of_the_limit_or_more_is_left_to_the_data_writer() -> None:
    arrays = {"n" * 3000 + str(i): np.zeros(1, np.uint8) for i in range(3)}  # a 9 KB head
    assert file_plan.small_dense_file(arrays, None, 64, True, 8192) is None
    assert file_plan.small_dense_file(arrays, None, 64, True, 12289) is not None


def test_a_small_file_is_always_written_with_collection_paused() -> None:
    # What the compiled planner gives is under a CHUNK of data and one of head: covered.
    from hurray_bridge._gc import covers_write

    assert covers_write(2 * CHUNK)


@compiled
@pytest.mark.parametrize("alignment", [32, 96, 1 << 22, True])
def test_an_alignment_python_refuses_is_left_to_python(alignment: Any,
                                                       tmp_path: pathlib.Path) -> None:
    arrays = {"a": np.ones(3, np.float32)}
    assert file_plan.small_dense_file(arrays, None, alignment, True, CHUNK) is None
    with pytest.raises(hb.FormatError, match="alignment"):
        hb.save(tmp_path / "a.hurray", arrays, alignment=alignment, fsync=False)


@compiled
@pytest.mark.parametrize("metadata", [{"k": 1}, {"": "v"}, {"k\0": "v"}, ["k"]])
def test_bad_metadata_is_refused_as_the_python_path_refuses_it(
        metadata: Any, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = {"a": np.ones(3, np.float32)}
    with pytest.raises(hb.HurrayError) as compiled_err:
        hb.save(tmp_path / "a.hurray", arrays, metadata, fsync=False)
    monkeypatch.setattr(file_plan, "_small", None)
    with pytest.raises(hb.HurrayError) as python_err:
        hb.save(tmp_path / "a.hurray", arrays, metadata, fsync=False)
    assert type(compiled_err.value) is type(python_err.value)
    assert str(compiled_err.value) == str(python_err.value)
    assert not (tmp_path / "a.hurray").exists()


@compiled
def test_a_save_takes_the_compiled_plan_and_writes_the_python_bytes(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = {f"p{i}": np.full((i + 1, 3), i, np.float32) for i in range(10)}
    calls = []
    real = file_plan._small
    assert real is not None
    monkeypatch.setattr(file_plan, "_small", lambda *a: calls.append(1) or real(*a))
    compiled_bytes = _saved(tmp_path, "c.hurray", arrays, metadata={"m": "1"})
    assert calls == [1]
    monkeypatch.setattr(file_plan, "_small", None)
    assert compiled_bytes == _saved(tmp_path, "p.hurray", arrays, metadata={"m": "1"})
    back = hb.load(tmp_path / "c.hurray", verify=True)
    for name, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(hb.convert(back[name], "numpy")), a)


@compiled
def test_the_pieces_hold_the_arrays_memory() -> None:
    arrays = {"a": np.arange(1000, dtype=np.float64), "b": np.arange(7, dtype=np.int8)}
    expected = _python_file(arrays)
    pieces = file_plan.small_dense_file(arrays, None, 64, True, CHUNK)
    assert pieces is not None
    del arrays
    assert _joined(pieces) == expected
    assert all(len(p) == memoryview(p).nbytes for p in pieces)  # bytes each: what writev takes


@compiled
def test_an_error_in_describe_goes_on() -> None:
    assert file_plan._small is not None

    class Fresh(np.ndarray):  # a type no answer is kept for: describe is asked
        pass

    arrays = {"a": np.ones(3, np.float32).view(Fresh)}

    def interrupted(value: Any) -> Any:
        raise KeyboardInterrupt

    def broken(value: Any) -> Any:
        raise ValueError("no")

    with pytest.raises(KeyboardInterrupt):
        file_plan._small(arrays, 64, True, b"", 0, CHUNK, interrupted)
    with pytest.raises(ValueError, match="no"):
        file_plan._small(arrays, 64, True, b"", 0, CHUNK, broken)
    with pytest.raises(TypeError, match="describe's answer"):
        file_plan._small(arrays, 64, True, b"", 0, CHUNK, lambda v: ("not", "a", "form"))


@compiled
def test_a_describe_that_empties_the_dict_does_not_crash_it() -> None:
    assert file_plan._small is not None
    arrays = {f"n{i}" * 3: np.ones(i + 1, np.float32).reshape(1, 1, 1, i + 1)
              for i in range(5)}

    def emptying(value: Any) -> Any:
        arrays.clear()
        return file_plan._describe_array(value)

    got = file_plan._small(arrays, 64, True, b"", 0, CHUNK, emptying)
    assert got is None or isinstance(got, list)


# ------------------------------------------------------------------ safetensors
st_compiled = pytest.mark.skipif(st_file._small is None,
                                 reason="hurray_bridge._speedups not built: no compiled planner")


@st_compiled
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet=st.characters(blacklist_categories=("Cs",)),
                                  max_size=10),
                          st.sampled_from(("float32", "float16", "int64", "uint8", "int8",
                                           "float64", "int32", "uint16")),
                          st.lists(st.integers(1, 4), max_size=3)),
                min_size=1, max_size=10, unique_by=lambda t: t[0]),
       st.one_of(st.none(), st.dictionaries(st.text(min_size=1, max_size=6).filter(
           lambda k: "\0" not in k), st.text(max_size=6), max_size=3)))
def test_any_dict_of_plain_arrays_is_written_to_safetensors_as_python_writes_it(
        specs: list[tuple[str, str, list[int]]], metadata: dict[str, str] | None) -> None:
    arrays = {name: (np.arange(int(np.prod(shape)), dtype=dt) + k).reshape(shape)
              for k, (name, dt, shape) in enumerate(specs) if name != "__metadata__"}
    assume(arrays)
    import tempfile

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        got = _outcomes(safetensors_io.save, st_file, pathlib.Path(folder), ".safetensors", mp,
                        arrays, metadata)
    assert isinstance(got[0], bytes) == isinstance(got[1], bytes)
    if isinstance(got[0], bytes):
        assert got[0] == got[1]
        assert st_file._small_pieces(arrays, metadata) is not None
    else:
        assert str(got[0]) == str(got[1])


def _st_declined_cases() -> list[tuple[str, Any]]:
    base = np.arange(6, dtype=np.float32)
    return [
        ("the metadata key as a name", {"__metadata__": base}),
        ("a bool array", {"a": base, "m": np.ones(3, bool)}),
        ("an empty array", {"a": base, "e": np.zeros(0, np.float32)}),
        ("a non-contiguous array", {"a": np.ones((3, 3), np.float32).T}),
        ("a big-endian array", {"a": np.arange(3, dtype=">f4")}),
        ("an hb.Tensor", {"a": hb.asarray(base)}),
        ("a non-str name", {1: base}),
        ("a lone surrogate name", {"\udcff": base}),
    ]


@st_compiled
@pytest.mark.parametrize(("case", "mapping"), _st_declined_cases(),
                         ids=[c for c, _ in _st_declined_cases()])
def test_the_safetensors_planner_declines_what_python_writes_otherwise(
        case: str, mapping: dict[Any, Any], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert st_file._small_pieces(mapping, None) is None
    _same_outcome(*_outcomes(safetensors_io.save, st_file, tmp_path, ".safetensors",
                             monkeypatch, mapping))


@st_compiled
def test_a_safetensors_save_takes_the_compiled_plan(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    arrays = {f"p{i}": np.full((i + 1, 2), i, np.float16) for i in range(10)}
    calls = []
    real = st_file._small
    assert real is not None
    monkeypatch.setattr(st_file, "_small", lambda *a: calls.append(1) or real(*a))
    assert safetensors_io.save(tmp_path / "c.safetensors", arrays, {"m": "1"}, fsync=False) == 10
    assert calls == [1]
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    back = safetensors_numpy.load_file(str(tmp_path / "c.safetensors"))
    assert back.keys() == arrays.keys()
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
    # a progress callback is the general writer's
    calls.clear()
    safetensors_io.save(tmp_path / "g.safetensors", arrays, {"m": "1"}, fsync=False,
                        progress=lambda done, total: None)
    assert calls == []
    assert (tmp_path / "g.safetensors").read_bytes() == (tmp_path / "c.safetensors").read_bytes()


@compiled
@pytest.mark.parametrize("first", ["non-contiguous", "strided view"])
def test_an_array_declined_for_its_memory_leaves_its_kind_planned(first: str) -> None:
    # What is kept per (type, dtype, shape) does not depend on one array's memory: a
    # transposed array declined once, the next contiguous one of its kind is planned.
    shape = (5, 7)  # (a kind no other test saves first)
    base = np.arange(35, dtype=np.int32).reshape(7, 5)
    declined = base.T if first == "non-contiguous" else np.arange(70, dtype=np.int32
                                                                   ).reshape(5, 14)[:, ::2]
    assert declined.shape == shape
    assert file_plan.small_dense_file({"x": declined}, None, 64, True, CHUNK) is None
    assert st_file._small_pieces({"x": declined}, None) is None
    contiguous = {"x": np.ascontiguousarray(declined)}
    pieces = file_plan.small_dense_file(contiguous, None, 64, True, CHUNK)
    assert pieces is not None and _joined(pieces) == _python_file(contiguous)
    assert st_file._small_pieces(contiguous, None) is not None


@compiled
@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_big_mapping_is_declined_at_the_limit_not_after_every_array(fmt: str) -> None:
    # A checkpoint of 100,000 tensors was looked at whole (every array's buffer and
    # answer) before its size declined it: a tenth of the save.
    planner = file_plan._small if fmt == "hurray" else st_file._small
    assert planner is not None
    asked: list[tuple[int, ...]] = []

    def counting(value: Any) -> Any:
        asked.append(value.shape)
        describe = file_plan._describe_array if fmt == "hurray" else st_file._describe_array
        return describe(value)

    # distinct shapes (describe is asked once for each), 1 KB and more each
    arrays = {f"a{i}": np.zeros(250 + i, np.uint32) for i in range(200)}
    if fmt == "hurray":
        got = planner(arrays, 64, True, b"", 0, 4096, counting)
    else:
        got = planner(arrays, b"", 100_000, 4096, counting)
    assert got is None
    assert 1 <= len(asked) <= 5, len(asked)


# ------------------------------------------------------------ what an attacker tried
@compiled
@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_dict_changed_while_it_is_planned_gives_a_consistent_file(
        fmt: str, tmp_path: pathlib.Path) -> None:
    # The planner reads a snapshot of the items: a dict changed under it (another thread,
    # a signal handler; here a profile hook at describe's call) never yields a name twice.
    import sys

    d = {"a": np.arange(11, dtype=np.int16).reshape(11, 1, 1, 1, 1),
         "b": np.arange(11, dtype=np.int16).reshape(1, 11, 1, 1, 1),
         "c": np.zeros(3, np.int16).reshape(1, 1, 3, 1, 1)}  # (kinds no other test saves)
    changed: list[int] = []

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_describe_array" and not changed:
            changed.append(1)
            del d["a"], d["b"]
            d["a"] = np.ones(2, np.int16)

    path = tmp_path / f"x.{fmt}"
    save = hb.save if fmt == "hurray" else safetensors_io.save
    sys.setprofile(hook)
    try:
        save(path, d, fsync=False)
    finally:
        sys.setprofile(None)
    assert changed == [1]
    loaded = hb.load(path)
    assert sorted(loaded) == ["a", "b", "c"]  # the dict as the save found it
    np.testing.assert_array_equal(np.asarray(hb.convert(loaded["b"], "numpy")),
                                  np.arange(11, dtype=np.int16).reshape(1, 11, 1, 1, 1))


def test_nothing_half_built_is_reachable_while_a_file_is_planned() -> None:
    # A value's dtype property may run any code, gc.get_referrers included: the planner's
    # own containers must never be seen with empty slots (it read one and crashed).
    code = """
import gc, numpy as np, hurray_bridge as hb
name = "".join(["uniq", "ue"])
seen = 0
class Buf(bytearray):
    shape = (4,)
    @property
    def dtype(self):
        global seen
        for r in gc.get_referrers(name):
            if type(r) in (tuple, list):
                seen += 1
                [x for x in r]
        return np.dtype("f4")
import tempfile, os
with tempfile.TemporaryDirectory() as d:
    try:
        hb.save(os.path.join(d, "y.hurray"), {name: np.ones(4, np.float32), "z": Buf(16)},
                fsync=False)
    except hb.HurrayError:
        pass
print("ok", seen > 0)
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), (r.returncode, r.stderr[-2000:])


@compiled
@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_no_is_kept_with_the_type_and_dtype_it_was_said_of(fmt: str) -> None:
    # A kept "no" holds its dtype and type, as a "yes" does: no other dtype or type can
    # take their addresses and be declined (or planned) by an answer meant for another.
    describe = file_plan._describe_array if fmt == "hurray" else st_file._describe_array
    be = np.arange(3, dtype=">f4")
    no = describe(be)
    assert no[0] is None and no[3] is be.dtype and no[4] is np.ndarray
    yes = describe(np.arange(3, dtype="<f4"))
    assert isinstance(yes[0], bytes) and yes[4] is np.ndarray


@compiled
def test_a_type_that_claims_to_equal_ndarray_gets_no_answer_of_it(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Liar(type):
        def __eq__(cls, other: object) -> bool:
            return True

        def __hash__(cls) -> int:
            return hash(np.ndarray)

    class Fake(bytearray, metaclass=Liar):
        pass

    a = np.arange(4, dtype=np.float32)
    assert file_plan.small_dense_file({"a": a}, None, 64, True, CHUNK) is not None
    assert st_file._small_pieces({"a": a}, None) is not None
    fake = Fake(b"ABCDEFGHIJKLMNOP")
    fake.dtype = a.dtype  # type: ignore[attr-defined]
    fake.shape = (4,)  # type: ignore[attr-defined]
    assert file_plan.small_dense_file({"a": fake}, None, 64, True, CHUNK) is None
    assert st_file._small_pieces({"a": fake}, None) is None


class _BadTruth:
    def __bool__(self) -> bool:
        raise ValueError("no truth")


class _BadStr(str):
    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        raise ValueError("enc")


@compiled
@pytest.mark.parametrize(("mapping", "metadata", "checksums"), [
    ({1: np.ones(2)}, None, _BadTruth()),
    ({"a": np.ones(2)}, None, _BadTruth()),
    ({1: np.ones(2)}, {"k": _BadStr("v")}, True),
], ids=["bad checksums, bad name", "bad checksums", "bad metadata, bad name"])
def test_odd_options_are_left_to_the_python_path_and_its_errors(
        mapping: Any, metadata: Any, checksums: Any, tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert file_plan.small_dense_file(mapping, metadata, 64, checksums, CHUNK) is None
    # (the Python path's own error, whatever it is)
    got = _outcomes(hb.save, file_plan, tmp_path, ".hurray", monkeypatch, mapping, metadata,
                    catch=Exception, checksums=checksums)
    assert type(got[0]) is type(got[1]) and str(got[0]) == str(got[1])


@compiled
def test_more_entries_than_a_small_file_holds_go_straight_to_python(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (at 64 bytes an entry at least, 65,537 cannot fit 4 MiB: no snapshot of them is made)
    monkeypatch.setattr(file_plan, "SMALL_ENTRIES", 3)  # (both formats' bound)
    arrays = {f"a{i}": np.ones(2, np.float32) for i in range(4)}
    calls: list[int] = []
    real, st_real = file_plan._small, st_file._small
    monkeypatch.setattr(file_plan, "_small", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(st_file, "_small", lambda *a: calls.append(1) or st_real(*a))
    assert file_plan.small_dense_file(arrays, None, 64, True, CHUNK) is None
    assert st_file._small_pieces(arrays, None) is None
    assert calls == []
    del arrays["a3"]
    assert file_plan.small_dense_file(arrays, None, 64, True, CHUNK) is not None
    assert st_file._small_pieces(arrays, None) is not None
    assert calls == [1, 1]
