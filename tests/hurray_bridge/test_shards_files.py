"""Sharded tensors in Hurray files (docs/spec/container.md §4.1, sharding.md §9).

A ShardedTensor ``NAME`` is saved as one entry per shard, ``NAME[k]``, each with its
shard section; ``hb.load`` groups them back into a ShardedTensor of zero-copy views.
A file may hold one process's shards only (a partial set); ``hb.load([files])``
merges every rank's file and refuses a missing or overlapping box by name.
"""

from __future__ import annotations

import collections
import ctypes
import pathlib
import pickle
import re

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge.__main__ import main
from hurray_bridge.files import plan as planning
from tests.hurray_bridge.test_pickle_shm import make

np = pytest.importorskip("numpy")

A = np.arange(48, dtype=np.float32).reshape(6, 8)


def _partial(st: hb.ShardedTensor, keep: list[int]) -> hb.ShardedTensor:
    return hb.ShardedTensor(st.descriptor, [st.shards[i] for i in keep], partial=True)


def _rank_files(tmp_path: pathlib.Path, st: hb.ShardedTensor,
                parts: list[list[int]]) -> list[pathlib.Path]:
    """One file per "rank", each with the shards ``parts[rank]`` (as a process would save)."""
    paths = []
    for r, keep in enumerate(parts):
        p = tmp_path / f"rank{r}.hurray"
        hb.save(p, {"w": _partial(st, keep)}, {"run": "x", "rank": str(r)}, fsync=False)
        paths.append(p)
    return paths


# -------------------------------------------------------------- one file
def test_save_writes_one_entry_per_shard_and_load_groups_them(tmp_path: pathlib.Path) -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 2)))
    path = tmp_path / "w.hurray"
    hb.save(path, {"w": st, "bias": np.ones(3)})
    idx = container.read_index(path)
    assert [e.name for e in idx.entries] == ["w[0]", "w[1]", "w[2]", "w[3]", "bias"]
    for e, t in zip(idx.entries, st.shards):
        assert e.descriptor.shard == t.descriptor.shard  # the shard sections, as they were
    f = hb.load(path)
    assert list(f) == ["w", "bias"]
    w = f["w"]
    assert isinstance(w, hb.ShardedTensor) and w.is_complete and w.boxes == st.boxes
    assert all(t.readonly for t in w.shards)  # views into the read-only map
    assert np.array_equal(hb.assemble(w), A)
    assert np.array_equal(hb.assemble(hb.load(path, mmap=False)["w"]), A)


def test_loaded_shards_are_views_into_the_buffer(tmp_path: pathlib.Path) -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (3, 1)))
    path = tmp_path / "w.hurray"
    hb.save(path, {"w": st}, fsync=False)
    idx = container.read_index(path)  # where the index says each shard's bytes are
    buf = bytearray(path.read_bytes())
    base = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    f = hb.loads(buf)
    for e, t in zip(idx.entries, f["w"].shards):
        assert t.data_ptr == base + idx.data_offset + e.buffers[0].offset
    assert np.array_equal(hb.assemble(f["w"]), A)


@pytest.mark.parametrize("case", ["strided", "int4", "replicas", "empty", "scalar"])
def test_every_kind_of_shard_round_trips(case: str) -> None:
    if case == "strided":  # column boxes of a row-major tensor are strided views
        st = hb.split(A, [((0, 0), (6, 3)), ((0, 3), (6, 5))])
        assert st.shards[0].strides is not None
    elif case == "int4":  # packed, two per byte: rows of 6 are whole bytes
        packed = np.arange(12, dtype=np.uint8) * 17
        st = hb.split(make(hb.Descriptor((4, 6), hb.uint4), packed), hb.grid_boxes((4, 6), (2, 1)))
        assert not any(t.copied for t in st)
    elif case == "replicas":
        st = hb.split(A, [((0, 0), (6, 8)), ((0, 0), (6, 8))])
    elif case == "empty":
        st = hb.split(A, hb.grid_boxes(A.shape, (8, 1)))  # two trailing empty boxes
    else:
        st = hb.split(np.float32(3.5), [((), ())])
    back = hb.loads(hb.dumps({"w": st}))["w"]
    assert back.boxes == st.boxes and back.dtype == st.dtype
    assert [t.descriptor.shard for t in back] == [t.descriptor.shard for t in st]
    assert bytes(hb.assemble(back, "hurray").memoryview()) == bytes(
        hb.assemble(st, "hurray").memoryview())


def test_one_ranks_file_loads_as_a_partial_set(tmp_path: pathlib.Path) -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 2)))
    f0, _ = _rank_files(tmp_path, st, [[0, 1], [2, 3]])
    w = hb.load(f0)["w"]
    assert not w.is_complete and "partial" in repr(w) and w.boxes == st.boxes[:2]
    with pytest.raises(hb.FormatError, match=re.escape("box [3:6, 0:4] is in no shard")):
        hb.assemble(w)
    back = pickle.loads(pickle.dumps(w))
    assert not back.is_complete and back.boxes == w.boxes


def test_plain_entries_keep_their_meaning() -> None:
    # A single tensor with a shard section under its own name stays a tensor, and a name
    # like "w[0]" without a shard section is an ordinary entry.
    one = hb.split(A, hb.grid_boxes(A.shape, (2, 1))).shards[1]
    out = hb.loads(hb.dumps({"shard": one, "w[0]": A}))
    assert isinstance(out["shard"], hb.Tensor) and out["shard"].descriptor == one.descriptor
    assert isinstance(out["w[0]"], hb.Tensor) and out["w[0]"].descriptor.shard is None


def test_a_name_is_a_sharded_tensor_or_an_entry_not_both() -> None:
    one = hb.split(A, hb.grid_boxes(A.shape, (1, 1))).shards[0]
    with pytest.raises(hb.FormatError, match="'w' and the shard entry 'w\\[0\\]' both claim"):
        hb.dumps({"w": A, "w[0]": one})
    # A file written without that check (another writer) is refused on load as well.
    items = [(n, t.descriptor, [t.memoryview()]) for n, t in
             [("w", hb.asarray(A)), ("w[0]", one)]]
    raw = planning.serialise(planning.plan_items(items, None, 64, True, []))
    with pytest.raises(hb.FormatError, match="both claim the name 'w'"):
        hb.loads(raw)


def test_a_damaged_set_in_one_file_names_its_entries() -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 1)))
    other = hb.split(A[:, :4], hb.grid_boxes((6, 4), (2, 1))).shards[0]
    items = [(n, t.descriptor, [t.memoryview()]) for n, t in
             [("w[0]", st.shards[0]), ("w[1]", other)]]
    raw = planning.serialise(planning.plan_items(items, None, 64, True, []))
    with pytest.raises(hb.FormatError, match="sharded tensor 'w': entry 'w\\[1\\]' belongs to "
                                             "a global shape \\[6, 4\\]"):
        hb.loads(raw)


def _two_shards_of_one_box() -> dict[str, hb.Tensor]:
    """Entries w[0], w[1]: the same box of the same global tensor, both replica 0."""
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 1)))
    return {"w[0]": st.shards[0], "w[1]": st.shards[0]}


def test_no_writer_writes_a_shard_set_its_reader_refuses(tmp_path: pathlib.Path) -> None:
    entries = _two_shards_of_one_box()
    assert entries["w[1]"].descriptor == entries["w[0]"].descriptor
    rule = "sharded tensor 'w': entry 'w\\[1\\]' and entry 'w\\[0\\]' both hold box"
    # what the reader says of such a file (one written without the check)...
    items = [(n, t.descriptor, [t.memoryview()]) for n, t in entries.items()]
    raw = planning.serialise(planning.plan_items(items, None, 64, True, []))
    with pytest.raises(hb.FormatError, match=rule) as read:
        hb.loads(raw)
    assert read.value.field == "shards"
    # ... every writer says before it writes a byte
    with pytest.raises(hb.FormatError, match=rule) as e:
        hb.dumps(entries)
    assert e.value.field == "shards" and str(e.value) == str(read.value)
    out = tmp_path / "w.hurray"
    with pytest.raises(hb.FormatError, match=rule):
        hb.save(out, entries, fsync=False)
    assert not out.exists()
    # other rules of the set too: another global shape, another element type, an overlap
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 1)))
    other = hb.split(A[:, :4], hb.grid_boxes((6, 4), (2, 1))).shards[0]
    halves = (hb.split(A, [((0, 0), (4, 8)), ((4, 0), (2, 8))]).shards[0],
              hb.split(A, [((0, 0), (3, 8)), ((3, 0), (3, 8))]).shards[1])
    wide = hb.split(A.astype(np.float64), hb.grid_boxes(A.shape, (2, 1))).shards[1]
    for bad, words in (({"w[0]": st.shards[0], "w[1]": other}, "belongs to a global shape"),
                       ({"w[0]": halves[0], "w[1]": halves[1]}, "overlap"),
                       ({"w[0]": st.shards[0], "w[1]": wide}, "holds float64")):
        with pytest.raises(hb.FormatError, match=words) as e:
            hb.dumps(bad)
        assert e.value.field == "shards"
    # replicas (distinct replica ids) and one process's partial set are written
    rep = hb.split(A, [((0, 0), (6, 8))] * 2)
    assert len(hb.loads(hb.dumps({"w": rep}))["w"].shards) == 2
    assert not hb.loads(hb.dumps({"w": _partial(st, [1])}))["w"].is_complete


def test_verify_refuses_a_shard_set_the_reader_refuses(tmp_path: pathlib.Path) -> None:
    entries = _two_shards_of_one_box()
    items = [(n, t.descriptor, [t.memoryview()]) for n, t in entries.items()]
    path = tmp_path / "w.hurray"
    path.write_bytes(planning.serialise(planning.plan_items(items, None, 64, True, [])))
    with pytest.raises(hb.FormatError, match="both hold box") as e:
        container.verify(path)
    assert e.value.field == "shards"
    assert main(["verify", str(path)]) == 2


def test_save_refuses_a_sharded_tensor_without_shards() -> None:
    with pytest.raises(hb.UnsupportedError, match="'w' is a sharded tensor without shards"):
        hb.dumps({"w": hb.ShardedTensor(hb.Descriptor([0], hb.float32), [])})


# ------------------------------------------------------------ many files
def test_every_ranks_file_together_is_the_tensor(tmp_path: pathlib.Path) -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 2)))
    paths = _rank_files(tmp_path, st, [[3, 0], [2], [1]])
    hb.save(tmp_path / "extra.hurray", {"step": np.array([5])}, {"run": "x"}, fsync=False)
    f = hb.load([*paths, tmp_path / "extra.hurray"])
    assert list(f) == ["w", "step"] and f.metadata == {"run": "x"}  # "rank" disagrees
    w = f["w"]
    assert w.is_complete and len(w) == 4 and sorted(w.boxes) == sorted(st.boxes)
    assert np.array_equal(hb.assemble(w), A)
    assert all(t.readonly for t in w.shards)  # still views into each file's map
    # ... and re-shard: any other box layout, copied out of the loaded shards.
    rows = hb.split(hb.assemble(w, "hurray"), hb.grid_boxes(A.shape, (3, 1)))
    assert np.array_equal(hb.assemble(rows), A)


def test_a_missing_box_is_named(tmp_path: pathlib.Path) -> None:
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 2)))
    paths = _rank_files(tmp_path, st, [[0, 1], [3]])
    with pytest.raises(hb.FormatError, match=re.escape(
            "sharded tensor 'w': box [3:6, 0:4] of global shape [6, 8] is in no file given")):
        hb.load(paths)


def test_overlapping_and_duplicate_boxes_name_both_files(tmp_path: pathlib.Path) -> None:
    top = hb.split(A, [((0, 0), (4, 8)), ((4, 0), (2, 8))])
    bottom = hb.split(A, [((0, 0), (3, 8)), ((3, 0), (3, 8))])
    a = tmp_path / "a.hurray"
    b = tmp_path / "b.hurray"
    hb.save(a, {"w": _partial(top, [0])}, fsync=False)
    hb.save(b, {"w": _partial(bottom, [1])}, fsync=False)
    with pytest.raises(hb.FormatError, match=(
            f"{re.escape(str(a))}: entry 'w\\[0\\]' \\(box \\[0:4, 0:8\\]\\) and "
            f"{re.escape(str(b))}: entry 'w\\[0\\]' \\(box \\[3:6, 0:8\\]\\) overlap in "
            "\\[3:4, 0:8\\]")):
        hb.load([a, b])
    with pytest.raises(hb.FormatError, match="both hold box \\[0:4, 0:8\\] as replica 0"):
        hb.load([a, a])


def test_files_must_agree_on_the_tensor(tmp_path: pathlib.Path) -> None:
    a, b, c = (tmp_path / f"{n}.hurray" for n in "abc")
    hb.save(a, {"w": _partial(hb.split(A, hb.grid_boxes(A.shape, (2, 1))), [0]), "x": A},
            fsync=False)
    hb.save(b, {"w": _partial(hb.split(A[:4], hb.grid_boxes((4, 8), (2, 1))), [1])},
            fsync=False)
    hb.save(c, {"x": A, "w": A}, fsync=False)
    with pytest.raises(hb.FormatError, match="belongs to a global shape \\[4, 8\\]"):
        hb.load([a, b])
    with pytest.raises(hb.FormatError, match=(
            f"{re.escape(str(c))}: entry 'x' and {re.escape(str(a))}: entry 'x' both claim")):
        hb.load([a, c])
    with pytest.raises(hb.FormatError, match=r"entry 'w\[0\]' and .*entry 'w' both claim"):
        hb.load([a, c][::-1])
    with pytest.raises(hb.UnsupportedError, match="at least one path"):
        hb.load([])



def test_any_sequence_of_paths_is_many_files(tmp_path: pathlib.Path) -> None:
    # What the annotation promises (a Sequence of paths, so that a list[str] or a
    # list[Path] type-checks), not only list and tuple; a str, bytes or PathLike is one path.
    st = hb.split(A, hb.grid_boxes(A.shape, (2, 1)))
    paths = _rank_files(tmp_path, st, [[0], [1]])
    merged = hb.load(collections.deque(paths))
    assert np.array_equal(hb.assemble(merged["w"]), A)
    one = hb.load(bytes(paths[0]))  # a bytes path is still one file: its partial set
    assert not one["w"].is_complete
    for bad in (bytearray(bytes(paths[0])), memoryview(bytes(paths[0]))):
        with pytest.raises(TypeError, match=r"expected str, bytes or os\.PathLike"):
            hb.load(bad)  # a byte buffer is no list of paths


# ------------------------------------------------------- other consumers
def test_safetensors_conversion_refuses_a_sharded_tensor(tmp_path: pathlib.Path) -> None:
    from hurray_bridge import safetensors_io

    src = tmp_path / "w.hurray"
    hb.save(src, {"w": hb.split(A, hb.grid_boxes(A.shape, (2, 1)))}, fsync=False)
    with pytest.raises(hb.UnsupportedError, match=r"'w\[0\]' is a shard; safetensors"):
        safetensors_io.hurray_to_safetensors(src, tmp_path / "w.safetensors")
    # The same tensor in memory, saved straight to safetensors, is refused by its name.
    with pytest.raises(hb.UnsupportedError, match=r"'w'.* this is a sharded tensor"):
        safetensors_io.save(tmp_path / "m.safetensors",
                            {"w": hb.split(A, hb.grid_boxes(A.shape, (2, 1)))})
    assert not (tmp_path / "m.safetensors").exists()


def test_hurray_convert_keeps_the_shard_entries(tmp_path: pathlib.Path) -> None:
    src, dst = tmp_path / "a.hurray", tmp_path / "b.hurray"
    hb.save(src, {"w": hb.split(A, hb.grid_boxes(A.shape, (2, 2)))}, fsync=False)
    assert main(["convert", "-q", str(src), str(dst)]) == 0
    assert dst.read_bytes() == src.read_bytes()
