"""Checkpoints of many small tensors cost what their bytes cost: counts, not timings.

The work per tensor is held to what it needs: no automatic garbage collection
while a save or load builds its per-tensor objects (each full collection walks
the whole heap), each descriptor of a safetensors file built once, and the
bytes of many small tensors written in a few system calls. Large writes are cut
at huge-page boundaries of the file. Timings are in benchmarks/many_tensors.py.
"""

from __future__ import annotations

import gc
import os
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import safetensors_io
from hurray_bridge.descriptor import Descriptor, dense_descriptor
from hurray_bridge.files import engine
from hurray_bridge.files import plan as planning
from hurray_bridge.files import safetensors as files_safetensors
from hurray_bridge.files import safetensors_header as _safetensors_header

np = pytest.importorskip("numpy")

N = 5_000


def _state_dict(n: int) -> dict[str, Any]:
    return {f"layers.{i}.p": np.full((i % 5 + 1, 3), i, np.float32) for i in range(n)}


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every garbage collection that starts while the test runs
    (with the default thresholds, so the count means what it does in a program)."""
    started: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    old = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.collect()
    gc.callbacks.append(note)
    try:
        yield started
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*old)


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_save_and_load_of_many_tensors_start_almost_no_collection(
        tmp_path: pathlib.Path, collections: list[int], fmt: str) -> None:
    # Each tensor leaves a dozen or more live objects: unpaused, the save of N tensors
    # started ~N/50 young collections and some full ones (about 270 and 2 at 10,000).
    sd = _state_dict(N)
    path = tmp_path / f"m.{fmt}"
    save = hb.save if fmt == "hurray" else safetensors_io.save
    save(path, _state_dict(2), fsync=False)  # the modules a first save and load import
    hb.load(path)
    before = len(collections)  # (making the tensors started some)
    save(path, sd, fsync=False)
    saved = len(collections)
    loaded = hb.load(path)
    loading = len(collections)
    assert len(loaded) == N
    assert np.array_equal(hb.convert(loaded[f"layers.{N - 1}.p"], "numpy"),
                          sd[f"layers.{N - 1}.p"])
    assert saved - before <= 3, collections[before:]
    assert loading - saved <= 3, collections[saved:]
    assert gc.isenabled()


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_save_leaves_its_objects_to_no_collection(tmp_path: pathlib.Path, fmt: str) -> None:
    # Collection resumes once the save's per-tensor objects are gone: resumed while the
    # plan lived, the first collection after the pause walked every one of them (a dozen
    # a tensor, ~1 us). One may still start (freed objects kept for reuse stay counted),
    # and then finds next to nothing young to walk.
    sd = _state_dict(N)
    save = hb.save if fmt == "hurray" else safetensors_io.save
    save(tmp_path / f"warm.{fmt}", _state_dict(2), fsync=False)  # (its imports)
    young: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] < 2:
            young.append(len(gc.get_objects(generation=0)))

    gc.collect()
    gc.callbacks.append(note)
    try:
        save(tmp_path / f"m.{fmt}", sd, fsync=False)
    finally:
        gc.callbacks.remove(note)
    assert len(young) <= 1, young
    assert all(n < N // 10 for n in young), young
    assert gc.isenabled()


def test_a_large_write_resumes_collection_before_its_bytes(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Past PAUSED_WRITE_BYTES, collection is on again while the bytes are written.
    from hurray_bridge import _gc
    from hurray_bridge.files import writing

    seen: list[bool] = []
    real = writing.write_plan

    def spy(*args: Any, **kwargs: Any) -> None:
        seen.append(gc.isenabled())
        real(*args, **kwargs)

    monkeypatch.setattr(writing, "write_plan", spy)
    monkeypatch.setattr(planning, "_small", None)  # (the compiled planner's files are small)
    sd = _state_dict(10)
    hb.save(tmp_path / "a.hurray", sd, fsync=False)
    monkeypatch.setattr(_gc, "PAUSED_WRITE_BYTES", 1000)
    hb.save(tmp_path / "b.hurray", sd, fsync=False)
    assert seen == [False, True]
    assert (tmp_path / "a.hurray").read_bytes() == (tmp_path / "b.hurray").read_bytes()


def test_collection_stays_as_the_caller_left_it(tmp_path: pathlib.Path) -> None:
    sd = _state_dict(10)
    gc.disable()
    try:
        hb.save(tmp_path / "a.hurray", sd, fsync=False)
        hb.load(tmp_path / "a.hurray")
        assert not gc.isenabled()  # off stays off
    finally:
        gc.enable()
    with pytest.raises(hb.UnsupportedError):  # a refusal while planning, collection paused
        hb.save(tmp_path / "b.hurray", {**sd, "bad": object()})
    with pytest.raises(hb.UnsupportedError):
        safetensors_io.save(tmp_path / "b.safetensors", {**sd, "bad": object()})
    assert gc.isenabled()  # on is back on, after an error too



def _count_descriptors(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-item list counting the descriptors built from now on (the shared per-shape
    cache emptied first, so that each build shows)."""
    dense_descriptor.cache_clear()
    built = [0]
    init = Descriptor.__post_init__

    def counting(self: Descriptor) -> None:
        built[0] += 1
        init(self)

    monkeypatch.setattr(Descriptor, "__post_init__", counting)
    return built

def test_a_safetensors_load_builds_each_descriptor_once(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    n = 300
    # Distinct shapes, no other test's: the caches of descriptors by (shape, type) (the
    # header's, and the compiled reader's, which lasts) never hit.
    sd = {f"t{i}": np.zeros((i + 1, 3, 1, 7), np.float32) for i in range(n)}
    path = tmp_path / "d.safetensors"
    safetensors_io.save(path, sd, fsync=False)
    _safetensors_header._descriptor.cache_clear()
    _safetensors_header.describe.cache_clear()
    built = _count_descriptors(monkeypatch)
    out = hb.load(path)
    assert {k: v.shape for k, v in out.items()} == {k: v.shape for k, v in sd.items()}
    assert built[0] == n
    hb.load(path)  # and loading it again builds none
    assert built[0] == n


def test_many_small_tensors_are_written_in_few_calls(tmp_path: pathlib.Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sd = _state_dict(2_000)
    calls: list[str] = []
    for name in ("write", "writev", "pwrite", "pwritev"):
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, counted)
    hb.save(tmp_path / "w.hurray", sd, fsync=False)
    hurray_calls = len(calls)
    safetensors_io.save(tmp_path / "w.safetensors", sd, fsync=False)
    monkeypatch.undo()
    # ~100 KiB of data in 2,000 pieces and their padding: batches of up to 1,024 views,
    # and the head (one call each unpaused: 2,000 or more)
    assert hurray_calls <= 8, calls
    assert len(calls) - hurray_calls <= 8, calls
    back = hb.load(tmp_path / "w.hurray", verify=True)  # the checksums cover what was written
    again = hb.load(tmp_path / "w.safetensors")
    for k, v in sd.items():
        assert np.array_equal(hb.convert(back[k], "numpy"), v)
        assert np.array_equal(hb.convert(again[k], "numpy"), v)


def test_chunk_lengths_end_on_huge_pages() -> None:
    mib = 1 << 20
    cap = engine.CHUNK
    # A buffer's worth from offset 1 MiB + 4 KiB ends at 4 MiB, then each ends on 2 MiB.
    at, n, ends = mib + 4096, 13 * mib, []
    while n:
        k = engine._chunk_length(at, n, cap)
        assert 0 < k <= cap
        at, n = at + k, n - k
        ends.append(at)
    assert all(e % (2 * mib) == 0 for e in ends[:-1]), ends
    assert ends[-1] == mib + 4096 + 13 * mib
    assert engine._chunk_length(3 * mib, 100, cap) == 100  # the rest of a piece
    assert engine._chunk_length(5, 10 * mib, 65536) == 65536  # a small file's buffer


def test_large_writes_end_on_huge_pages(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # A big tensor after a small one: its bytes start off any 2 MiB boundary.
    sd = {"small": np.ones(1000, np.uint8), "big": np.arange(3 << 20, dtype=np.int32)}
    ends: list[int] = []
    real = os.write

    def write(fd: int, data: Any) -> int:
        n = real(fd, data)
        ends.append(os.lseek(fd, 0, os.SEEK_CUR))
        return n

    monkeypatch.setattr(os, "write", write)
    hb.save(tmp_path / "big.hurray", sd, fsync=False, checksums=False)
    monkeypatch.undo()
    size = os.path.getsize(tmp_path / "big.hurray")
    data_ends = [e for e in ends if e > 1 << 20 and e != size]  # (not the head's, nor the last)
    assert data_ends and all(e % (2 << 20) == 0 for e in data_ends), ends
    out = hb.load(tmp_path / "big.hurray")
    assert np.array_equal(hb.convert(out["big"], "numpy"), sd["big"])


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_loaded_file_holds_few_objects_per_tensor(tmp_path: pathlib.Path, fmt: str) -> None:
    # A tensor, its name and its buffer (descriptors of one shape and type are shared);
    # a safetensors load held 12 when it built each descriptor a second time.
    sd = _state_dict(2_000)
    path = tmp_path / f"o.{fmt}"
    (hb.save if fmt == "hurray" else safetensors_io.save)(path, sd, fsync=False)
    hb.load(path)  # (caches filled: of descriptors, of the adapters)
    gc.collect()
    before = len(gc.get_objects())
    loaded = hb.load(path)
    gc.collect()
    per_tensor = (len(gc.get_objects()) - before) / len(loaded)
    assert len(loaded) == len(sd)
    assert per_tensor <= 4, per_tensor


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_save_builds_a_descriptor_per_shape_and_type_not_per_tensor(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    sd = _state_dict(3_000)  # 5 shapes, one type
    built = _count_descriptors(monkeypatch)
    (hb.save if fmt == "hurray" else safetensors_io.save)(tmp_path / f"s.{fmt}", sd,
                                                            fsync=False)
    monkeypatch.undo()
    assert built[0] <= 5
    back = hb.load(tmp_path / f"s.{fmt}")
    assert all(back[k].shape == v.shape for k, v in sd.items())


def _mixed() -> dict[str, Any]:
    """Arrays the dense fast path takes (plain, C-contiguous, whole-byte, native) and
    arrays it leaves to the general path, which builds an hb.Tensor for each."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ro = np.arange(7, dtype=np.int32)
    ro.flags.writeable = False
    fast = {"f32": np.arange(16, dtype=np.float32), "f16": np.ones((3, 3), np.float16),
            "i64 0-d": np.array(5, np.int64), "u8": np.arange(5, dtype=np.uint8),
            "c64": np.ones(2, np.complex64), "read-only": ro,
            "f64 3-D": np.arange(24.0).reshape(2, 3, 4)}
    general = {"bool": np.array([True, False, True]),
               "bfloat16": np.ones(4, ml_dtypes.bfloat16),
               "int4": np.arange(5).astype(ml_dtypes.int4),
               "empty": np.ones((0, 2), np.float32),
               "column slice": np.ones((4, 4), np.float32)[:, :2],
               "big-endian": np.ones(3, ">f4"),
               "masked": np.ma.masked_array(np.ones(2, np.float32)),
               "scalar": np.float32(2.5)}
    return {**fast, **general, "after": np.arange(9, dtype=np.int16)}


@pytest.fixture
def tensors_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One item per hb.Tensor built (by either constructor) while the test runs."""
    from hurray_bridge.tensor import Tensor

    built: list[int] = []
    dense, init = Tensor._dense.__func__, Tensor.__init__  # type: ignore[attr-defined]

    def counting_dense(cls: type, *args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return dense(cls, *args, **kwargs)

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Tensor, "_dense", classmethod(counting_dense))
    monkeypatch.setattr(Tensor, "__init__", counting_init)
    return built


def test_a_save_of_plain_arrays_builds_no_tensor(tmp_path: pathlib.Path,
                                                 tensors_built: list[int]) -> None:
    sd = _state_dict(2_000)
    hb.save(tmp_path / "a.hurray", sd, fsync=False)
    safetensors_io.save(tmp_path / "a.safetensors", sd, fsync=False)
    assert tensors_built == []
    # Only the eight values the fast path leaves build a tensor, one each.
    hb.save(tmp_path / "b.hurray", _mixed(), fsync=False)
    assert len(tensors_built) == 8, len(tensors_built)
    del tensors_built[:]
    back = hb.load(tmp_path / "a.hurray")
    assert all(np.array_equal(hb.convert(back[k], "numpy"), v) for k, v in sd.items())


@pytest.mark.parametrize("checksums", [True, False])
@pytest.mark.parametrize("alignment", [64, 4096])
def test_the_fast_path_writes_the_bytes_of_the_general_path(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, checksums: bool,
        alignment: int) -> None:
    sd = {**_state_dict(300), **_mixed()}
    fast, general = tmp_path / "fast.hurray", tmp_path / "general.hurray"
    hb.save(fast, sd, fsync=False, checksums=checksums, alignment=alignment,
            metadata={"k": "v"})
    monkeypatch.setattr(planning, "dense_reader", lambda: None)
    hb.save(general, sd, fsync=False, checksums=checksums, alignment=alignment,
            metadata={"k": "v"})
    assert fast.read_bytes() == general.read_bytes()
    back = hb.load(fast)
    assert np.array_equal(hb.convert(back["read-only"], "numpy"), sd["read-only"])
    assert np.array_equal(hb.convert(back["f64 3-D"], "numpy"), sd["f64 3-D"])


def test_the_fast_path_refuses_as_the_general_path(tmp_path: pathlib.Path) -> None:
    ok = np.ones(3, np.float32)
    for bad, message in [({"": ok}, "entry name"), ({"a\x00b": ok}, "NUL"),
                         ({"x" * 70_000: ok}, "bytes of UTF-8"),
                         ({"a": ok, "b": np.array([0, 2], np.uint8).view(np.bool_)}, "'b'")]:
        with pytest.raises(hb.HurrayError, match=message):
            hb.save(tmp_path / "bad.hurray", bad, fsync=False)
        assert not (tmp_path / "bad.hurray").exists()


def test_a_file_tensor_reaches_numpy_by_the_shortcut(tmp_path: pathlib.Path) -> None:
    from hurray_bridge import _shortcuts

    sd = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.int8)}
    hb.save(tmp_path / "s.hurray", sd, fsync=False)
    back = hb.load(tmp_path / "s.hurray")
    first = hb.convert(back["a"], "numpy")  # the full path, which learns the pair
    assert _shortcuts.serves(back["b"], "numpy")
    out = hb.convert(back["b"], "numpy")
    assert out.ctypes.data == back["b"].data_ptr  # the file's memory, no copy
    assert not out.flags.writeable and not first.flags.writeable  # as mapped: read-only
    assert np.array_equal(out, sd["b"]) and np.array_equal(first, sd["a"])
    # What the view cannot give exactly, the full path does (declined, not mishandled).
    strided = hb.asarray(np.arange(8, dtype=np.float32)[::2])
    assert not _shortcuts.serves(strided, "numpy")
    assert np.array_equal(hb.convert(strided, "numpy"), [0, 2, 4, 6])


def test_a_safetensors_save_writes_the_bytes_of_the_general_path(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kept = ("f32", "f16", "i64 0-d", "u8", "read-only", "f64 3-D", "bool", "bfloat16",
            "empty", "column slice", "big-endian", "scalar", "after")
    mixed = _mixed()
    sd = {**_state_dict(300), **{k: mixed[k] for k in kept}}
    fast, general = tmp_path / "fast.safetensors", tmp_path / "general.safetensors"
    safetensors_io.save(fast, sd, fsync=False, metadata={"k": "v"})
    monkeypatch.setattr(files_safetensors, "dense_reader", lambda: None)
    safetensors_io.save(general, sd, fsync=False, metadata={"k": "v"})
    assert fast.read_bytes() == general.read_bytes()
    monkeypatch.undo()
    # The refusals name the entry, as the general path's do.
    with pytest.raises(hb.UnsupportedError, match="'c128' is complex128"):
        safetensors_io.save(tmp_path / "c.safetensors",
                            {"a": np.ones(2, np.float32), "c128": np.ones(2, np.complex128)},
                            fsync=False)
    with pytest.raises(hb.FormatError, match="__metadata__"):
        safetensors_io.save(tmp_path / "m.safetensors",
                            {"a": np.ones(2, np.float32), "__metadata__": np.ones(2, np.float32)},
                            fsync=False)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_runs_of_small_tensors_write_the_bytes_of_one_call_each(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, split: bool, fmt: str) -> None:
    # Small arrays go to the writer in runs (DataWriter.put_run), among entries that break
    # a run (an array of a buffer's size or more, empty, bool8, sub-byte) and across the
    # cut of a split write: the file is the one written an entry at a time (put_at).
    monkeypatch.setattr(engine, "_SPLIT_BYTES", 0 if split else None)
    monkeypatch.setattr(engine, "RUN", 7)  # runs end among the 600, not at its end only
    sd: dict[str, Any] = {}
    extra = _mixed() if fmt == "hurray" else {"bool": np.array([True, False]),
                                              "empty": np.ones((0, 2), np.float32)}
    for i, (k, v) in enumerate(_state_dict(600).items()):
        sd[k] = v
        if i % 37 == 5:  # (17 of 280 KB: the buffer is 4 MiB, and the data more)
            sd[f"big{i}"] = np.full(70_000, i, np.float32)
        if i == 300:
            sd.update(extra)
    path, one = tmp_path / f"runs.{fmt}", tmp_path / f"one.{fmt}"
    save = hb.save if fmt == "hurray" else safetensors_io.save
    seen: list[int] = []
    real = engine.DataWriter.put_run

    def counting(self: engine.DataWriter, ats: Any, srcs: Any, first: Any) -> None:
        seen.append(len(srcs))
        real(self, ats, srcs, first)

    monkeypatch.setattr(engine.DataWriter, "put_run", counting)
    save(path, sd, fsync=False)
    assert seen and max(seen) == 7 and sum(seen) >= 600, seen

    def one_at_a_time(self: engine.DataWriter, ats: Any, srcs: Any, first: Any) -> None:
        for k, (at, src) in enumerate(zip(ats, srcs, strict=True)):
            self.put_at(at, src, None if first is None else first + k)

    monkeypatch.setattr(engine.DataWriter, "put_run", one_at_a_time)
    save(one, sd, fsync=False)
    assert path.read_bytes() == one.read_bytes()
    if fmt == "hurray":
        assert path.read_bytes() == hb.dumps(sd)
    back = hb.load(path, verify=fmt == "hurray")  # the checksums are those of the bytes
    for k in ("layers.0.p", "big5", "layers.599.p"):
        assert np.array_equal(hb.convert(back[k], "numpy"), sd[k])


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_small_file_is_written_in_one_call(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    # Under a buffer of data, all of it views in memory: head and data in one writev (the
    # checksums computed first), not the data, a seek and the head. The bytes and the
    # checksums are those of the general writer's file (which a progress callback takes).
    from hurray_bridge.files import disk

    sd = _state_dict(100)
    path = tmp_path / f"s.{fmt}"
    save = hb.save if fmt == "hurray" else safetensors_io.save
    calls: list[str] = []
    for name in ("write", "writev", "pwrite", "pwritev", "lseek"):
        real = getattr(os, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, counted)
    save(path, sd, fsync=False)
    monkeypatch.undo()
    assert calls == ["writev"], calls
    if fmt == "hurray":
        assert path.read_bytes() == hb.dumps(sd)
        hb.load(path, verify=True)
    else:
        general = tmp_path / "g.safetensors"
        safetensors_io.save(general, sd, fsync=False, progress=lambda done, total: None)
        assert path.read_bytes() == general.read_bytes()
    # The write is a checkpoint, as each of the general writer's is: a stop asked there
    # leaves the old file and no temporary.
    before = path.read_bytes()
    stops: list[str] = []

    def stop() -> None:
        caller = sys._getframe(2).f_code.co_name  # (1 is disk.checkpoint)
        stops.append(caller)
        if caller == "write_vectors":
            raise KeyboardInterrupt

    disk.set_checkpoint(stop)
    try:
        with pytest.raises(KeyboardInterrupt):
            save(path, _state_dict(3), fsync=False)
    finally:
        disk.set_checkpoint(None)
    assert stops[-1] == "write_vectors", stops
    assert path.read_bytes() == before
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["s.hurray"] if fmt == "hurray" else ["g.safetensors", "s.safetensors"])


def test_the_kept_descriptors_and_heads_stay_right_when_emptied(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A save keeps the descriptors and encoded heads of the shapes and types it met for
    # the next (planning._DESCRIPTORS, _HEADS); emptied when full, as here every few
    # entries, each entry still gets its own shape's head.
    monkeypatch.setattr(planning, "_CACHED", 3)
    monkeypatch.setattr(planning, "_small", None)  # (its own cache is in C)
    sd = {f"t{i}": np.full((i % 11 + 1,) * (i % 3 + 1), i, (np.float32, np.int8)[i % 2])
          for i in range(60)}
    for _ in range(2):
        hb.save(tmp_path / "k.hurray", sd, fsync=False)
        assert len(planning._DESCRIPTORS) <= 3 and len(planning._HEADS) <= 3
    monkeypatch.setattr(planning, "dense_reader", lambda: None)  # the general path
    hb.save(tmp_path / "g.hurray", sd, fsync=False)
    assert (tmp_path / "k.hurray").read_bytes() == (tmp_path / "g.hurray").read_bytes()


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_small_save_makes_a_fixed_few_system_calls(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    fmt: str) -> None:
    # The fixed work of a save over an existing file, counted: what the target is (lstat,
    # before and again before the rename), one scan of the folder for stale temporaries,
    # the temporary created, its mode kept, one write, close, rename. No more with 10
    # tensors than with 1, nor with 500.
    path = tmp_path / f"f.{fmt}"
    save = hb.save if fmt == "hurray" else safetensors_io.save
    save(path, _state_dict(1), fsync=False)
    names = ("lstat", "stat", "fstat", "scandir", "listdir", "open", "close", "fchmod",
             "fchown", "write", "writev", "pwrite", "pwritev", "lseek", "replace", "rename",
             "unlink", "fsync")
    counts: list[dict[str, int]] = []
    from hurray_bridge.files import disk

    for n in (1, 10, 500):
        calls: dict[str, int] = {}
        monkeypatch.setattr(disk, "_SCANS", {})  # (a folder slow to scan is scanned less)
        for name in names:
            real = getattr(os, name)

            def counted(*args: Any, _real: Any = real, _name: str = name,
                        _calls: dict[str, int] = calls, **kw: Any) -> Any:
                _calls[_name] = _calls.get(_name, 0) + 1
                return _real(*args, **kw)

            monkeypatch.setattr(os, name, counted)
        save(path, _state_dict(n), fsync=False)
        monkeypatch.undo()
        counts.append(calls)
    assert counts[0] == counts[1] == counts[2], counts
    assert counts[0] == {"lstat": 2, "listdir": 1, "open": 1, "fchmod": 1, "writev": 1,
                         "close": 1, "replace": 1}, counts[0]
