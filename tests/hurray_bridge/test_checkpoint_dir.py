"""Checkpoints of several files (container.md §12): ``hb.load`` of a folder or its index gives
one mapping over every shard, zero-copy in each file's map; the files are checked against the
index; ``hurray convert DIR OUT`` converts the folder both ways, byte-identical on the way back.

The checkpoints come from huggingface_hub's ``save_torch_state_dict`` and torch's
``HuggingFaceStorageWriter`` where those are installed, and are written by hand (shards by
``safetensors_io.save``, the index as huggingface_hub writes it) for everything else.
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import pathlib
import re
import sys
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import checkpoint_dir, safetensors_io
from hurray_bridge.__main__ import main
from hurray_bridge.checkpoint_dir import CheckpointFile, convert_checkpoint, read_checkpoint_index

np = pytest.importorskip("numpy")

INDEX = "model.safetensors.index.json"


def write_index(folder: pathlib.Path, weight_map: dict[str, str], name: str = INDEX,
                **metadata: Any) -> pathlib.Path:
    path = folder / name
    path.write_text(json.dumps({"metadata": {"total_size": 0, **metadata},
                                "weight_map": weight_map}, indent=2))
    return path


@pytest.fixture
def hand(tmp_path: pathlib.Path) -> pathlib.Path:
    """Two safetensors shards and their index, written without torch."""
    d = tmp_path / "hand"
    d.mkdir()
    safetensors_io.save(d / "model-00001-of-00002.safetensors",
                        {"a": np.arange(12, dtype=np.float32).reshape(3, 4),
                         "b": np.arange(5, dtype=np.int8)}, {"format": "np", "part": "1"})
    safetensors_io.save(d / "model-00002-of-00002.safetensors",
                        {"c": np.ones((2, 2), np.float64), "d": np.zeros((0, 3), np.int16)},
                        {"format": "np", "part": "2"})
    write_index(d, {"a": "model-00001-of-00002.safetensors",
                    "c": "model-00002-of-00002.safetensors",
                    "b": "model-00001-of-00002.safetensors",
                    "d": "model-00002-of-00002.safetensors"}, note="hand")
    return d


HAND = {"a": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.arange(5, dtype=np.int8),
        "c": np.ones((2, 2), np.float64), "d": np.zeros((0, 3), np.int16)}


def state_dict() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    sd: dict[str, Any] = {f"layers.{i}.weight": torch.randn(32, 32, generator=g)
                          for i in range(5)}
    sd["embed.bf16"] = torch.randn(7, 3, generator=g).to(torch.bfloat16)
    sd["norm.f16"] = torch.randn(9, generator=g).to(torch.float16)
    sd["steps"] = torch.arange(10, dtype=torch.int64)
    sd["mask"] = torch.tensor([True, False, True])
    return sd


@pytest.fixture
def hub_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, Any]]:
    pytest.importorskip("torch")
    hub = pytest.importorskip("huggingface_hub")
    d = tmp_path / "hub"
    d.mkdir()
    sd = state_dict()
    hub.save_torch_state_dict(sd, d, max_shard_size=9000, metadata={"note": "hub"})
    return d, sd


@pytest.fixture
def dcp_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, dict[str, Any]]:
    pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    if not hasattr(dcp, "HuggingFaceStorageWriter"):
        pytest.skip("this torch has no torch.distributed.checkpoint.HuggingFaceStorageWriter")
    d = tmp_path / "dcp"
    sd = state_dict()
    writer = dcp.HuggingFaceStorageWriter(
        path=str(d), fqn_to_index_mapping={k: 1 + i % 3 for i, k in enumerate(sd)})
    with pytest.warns(UserWarning, match="single process"):  # no process group: one writer
        dcp.save(sd, storage_writer=writer, no_dist=True)
    return d, sd


def shard_files(d: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in d.iterdir() if p.suffix == ".safetensors")


def check_zero_copy(f: CheckpointFile, folder: pathlib.Path) -> None:
    """Every tensor points into the map of the file the index names, at its place there."""
    assert f.index is not None
    owners = {}
    for name, file in f.index.weight_map.items():
        t = f[name]
        assert isinstance(t, hb.Tensor) and t.readonly, name
        if not t.nbytes:
            continue
        path = folder / file
        entry = {e.name: e for e in safetensors_io.read_header(path).entries}[name]
        start = safetensors_io.read_header(path).data_start
        owner: Any = t.owner
        assert owner.path == str(path), name
        assert t.data_ptr == owner.address + start + entry.begin, name
        owners[file] = owner
    assert len(owners) == len(f.index.files) > 1  # one map per file, several files


def torch_bytes(x: Any) -> bytes:
    import torch

    return x.reshape(-1).view(torch.uint8).numpy().tobytes()


# ------------------------------------------------------------------- loading
@pytest.mark.parametrize("through", ["folder", "index"])
def test_a_huggingface_hub_checkpoint_loads_as_one_zero_copy_mapping(
        hub_dir: tuple[pathlib.Path, dict[str, Any]], through: str) -> None:
    d, sd = hub_dir
    assert len(shard_files(d)) >= 3  # the small max_shard_size made several
    f = hb.load(d if through == "folder" else d / INDEX)
    assert isinstance(f, CheckpointFile) and isinstance(f, hb.container.TensorFile)
    assert list(f) == list(sd)  # the index's order, which is the state dict's
    for name, x in sd.items():
        t = f[name]
        assert isinstance(t, hb.Tensor) and t.shape == tuple(x.shape), name
        assert bytes(t.memoryview()) == torch_bytes(x), name
    check_zero_copy(f, d)
    # the index's metadata over the files' common items; each file's own kept by name
    assert f.metadata == {"format": "pt", "total_size": str(sum(
        x.numel() * x.element_size() for x in sd.values())), "note": "hub"}
    assert set(f.file_metadata) == {p.name for p in shard_files(d)}
    assert all(m == {"format": "pt"} for m in f.file_metadata.values())


def test_a_torch_hugging_face_storage_writer_checkpoint_loads_as_one_mapping(
        dcp_dir: tuple[pathlib.Path, dict[str, Any]]) -> None:
    import torch

    d, sd = dcp_dir
    f = hb.load(d)
    assert isinstance(f, CheckpointFile) and sorted(f) == sorted(sd)
    for name, x in sd.items():
        y = hb.convert(f[name], "torch")
        assert y.dtype == x.dtype and torch.equal(y, x), name
    check_zero_copy(f, d)
    # torch's files each say which tensors they hold: that item differs, and is dropped
    assert "DCP_SHARDING_INFO" not in f.metadata and f.metadata["DCP_VERSION"] == "1.0"
    assert all("DCP_SHARDING_INFO" in m for m in f.file_metadata.values())


def test_closing_the_mapping_releases_every_files_map(hand: pathlib.Path) -> None:
    with hb.load(hand) as f:
        maps = {id(t.owner): weakref.ref(t.owner) for t in f.values()
                if isinstance(t, hb.Tensor) and t.nbytes}
        kept = f["a"]
        assert len(maps) == 2  # one per file
    with pytest.raises(hb.ClosedFileError):
        f["c"]
    gc.collect()
    alive = [r for r in maps.values() if r() is not None]
    assert alive == [weakref.ref(kept.owner)]  # a tensor still held keeps its own file's map
    np.testing.assert_array_equal(np.asarray(kept), HAND["a"])
    del kept
    gc.collect()
    assert all(r() is None for r in maps.values())


def test_a_hand_written_checkpoint_loads_in_index_order_with_merged_metadata(
        hand: pathlib.Path) -> None:
    f = hb.load(hand / INDEX)
    assert list(f) == ["a", "c", "b", "d"]
    for name, want in HAND.items():
        np.testing.assert_array_equal(np.asarray(f[name]), want)
    # "part" differs between the files: only the agreed "format" stays, then the index's
    assert f.metadata == {"format": "np", "total_size": "0", "note": "hand"}
    assert f.file_metadata["model-00001-of-00002.safetensors"]["part"] == "1"
    copied = hb.load(hand, mmap=False)
    assert not copied["a"].readonly and copied["a"].data_ptr % 64 == 0
    np.testing.assert_array_equal(np.asarray(copied["c"]), HAND["c"])


def test_a_folder_without_an_index_loads_its_files_and_refuses_a_name_in_two(
        tmp_path: pathlib.Path) -> None:
    safetensors_io.save(tmp_path / "x.safetensors", {"a": np.ones(2)})
    hb.save(tmp_path / "y.hurray", {"b": np.zeros(3, np.int32)}, {"k": "v"})
    (tmp_path / "config.json").write_text("{}")  # not read: no checkpoint index
    f = hb.load(tmp_path)
    assert isinstance(f, CheckpointFile) and f.index is None and list(f) == ["a", "b"]
    assert f.file_metadata == {"x.safetensors": {}, "y.hurray": {"k": "v"}}
    safetensors_io.save(tmp_path / "z.safetensors", {"a": np.ones(2)})
    with pytest.raises(hb.FormatError, match=r"z\.safetensors: entry 'a' and .*x\.safetensors: "
                                             r"entry 'a' both claim the name 'a'"):
        hb.load(tmp_path)


def test_a_folder_of_every_ranks_file_loads_each_sharded_tensor_whole(
        tmp_path: pathlib.Path) -> None:
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    st = hb.split(a, hb.grid_boxes(a.shape, (2, 2)))
    for rank, keep in enumerate([[3, 0], [2], [1]]):  # each file numbers its shards from 0
        part = hb.ShardedTensor(st.descriptor, [st.shards[i] for i in keep], partial=True)
        hb.save(tmp_path / f"rank{rank}.hurray", {"w": part}, {"run": "x", "rank": str(rank)},
                fsync=False)
    f = hb.load(tmp_path)
    w = f["w"]
    assert isinstance(w, hb.ShardedTensor) and w.is_complete
    np.testing.assert_array_equal(np.asarray(hb.assemble(w)), a)
    assert f.metadata == {"run": "x"}  # what every file agrees on
    assert f.file_metadata["rank2.hurray"] == {"run": "x", "rank": "2"}
    (tmp_path / "rank2.hurray").unlink()
    with pytest.raises(hb.FormatError, match="is in no file given"):
        hb.load(tmp_path)


def test_a_damaged_shard_is_named(tmp_path: pathlib.Path, hand: pathlib.Path) -> None:
    shard = hand / "model-00002-of-00002.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[9:13] = b"!!!!"  # inside the JSON header
    shard.write_bytes(bytes(raw))
    for call in (lambda: hb.load(hand), lambda: convert_checkpoint(hand, tmp_path / "o")):
        with pytest.raises(hb.FormatError) as e:
            call()
        msg = str(e.value)
        assert f"{shard} (a shard of the checkpoint index {hand / INDEX}): " in msg, msg
    assert not (tmp_path / "o").exists()


def test_a_hub_cache_snapshot_of_links_to_blobs_loads(tmp_path: pathlib.Path,
                                                      hand: pathlib.Path) -> None:
    # huggingface_hub's cache: snapshots/<rev>/<name> are links to blobs/<hash>
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for p in hand.iterdir():
        blob = blobs / hashlib.sha256(p.read_bytes()).hexdigest()
        p.rename(blob)
        (snap / p.name).symlink_to(blob)
    f = hb.load(snap)
    np.testing.assert_array_equal(np.asarray(f["c"]), HAND["c"])
    blob = (snap / "model-00001-of-00002.safetensors").resolve()
    blob.unlink()  # a link to a blob never fetched
    with pytest.raises(hb.FormatError, match=r"model-00001-of-00002\.safetensors is missing"):
        hb.load(snap)


def test_verify_reaches_every_shard(tmp_path: pathlib.Path, hand: pathlib.Path) -> None:
    out = tmp_path / "h"
    convert_checkpoint(hand, out, fsync=False)
    shard = out / "model-00002-of-00002.hurray"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of the data region: c's last element
    shard.write_bytes(bytes(raw))
    hb.load(out)  # unchecked, as hb.load of one file
    with pytest.raises(hb.FormatError, match="checksum"):
        hb.load(out, verify=True)


# ------------------------------------------------------------- refusals
def test_a_missing_shard_file_names_it_and_the_index(hand: pathlib.Path) -> None:
    (hand / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(hb.FormatError) as e:
        hb.load(hand)
    msg = str(e.value)
    assert "model-00002-of-00002.safetensors is missing" in msg and str(hand / INDEX) in msg
    assert "2 tensors" in msg and "'c'" in msg and e.value.field == "weight_map['c']"


def test_an_index_placing_a_tensor_in_the_wrong_file_names_both(hand: pathlib.Path) -> None:
    index = json.loads((hand / INDEX).read_text())
    index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    (hand / INDEX).write_text(json.dumps(index))
    with pytest.raises(hb.FormatError) as e:
        hb.load(hand)
    msg = str(e.value)
    assert re.search(r"tensor 'b': the checkpoint index .* places it in "
                     r"model-00002-of-00002\.safetensors, but it is in .*"
                     r"model-00001-of-00002\.safetensors", msg), msg
    assert e.value.field == "weight_map['b']"


def test_two_files_holding_one_name_are_named_both(hand: pathlib.Path) -> None:
    safetensors_io.save(hand / "model-00002-of-00002.safetensors",
                        {"c": np.ones((2, 2)), "d": np.zeros((0, 3), np.int16),
                         "a": np.ones(1)})
    with pytest.raises(hb.FormatError, match=r"tensor 'a' is in two files, .*"
                                             r"model-00001-of-00002\.safetensors and .*"
                                             r"model-00002-of-00002\.safetensors"):
        hb.load(hand)


def test_a_tensor_absent_from_the_index_is_refused(hand: pathlib.Path) -> None:
    index = json.loads((hand / INDEX).read_text())
    del index["weight_map"]["d"]
    (hand / INDEX).write_text(json.dumps(index))
    with pytest.raises(hb.FormatError, match=r"tensor 'd' is in .*model-00002-of-00002"
                                             r"\.safetensors but not in the checkpoint index"):
        hb.load(hand)


def test_an_index_naming_a_tensor_no_file_holds_is_refused(hand: pathlib.Path) -> None:
    index = json.loads((hand / INDEX).read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    (hand / INDEX).write_text(json.dumps(index))
    with pytest.raises(hb.FormatError, match=r"tensor 'ghost': the checkpoint index .* places "
                                             r"it in .*model-00001-of-00002\.safetensors, which "
                                             "does not hold it"):
        hb.load(hand)


@pytest.mark.parametrize(("text", "field", "excerpt"), [
    ("not json", "index", "not JSON"),
    ('[1, 2]', "index", "expected a JSON object, got list"),
    ('{"metadata": {}}', "weight_map", "got nothing"),
    ('{"weight_map": []}', "weight_map", "got list"),
    ('{"weight_map": {}, "metadata": 3}', "metadata", "expected an object, got int"),
    ('{"weight_map": {"a": 1}}', "weight_map['a']", "got int 1"),
    ('{"weight_map": {"a": "../x.safetensors"}}', "weight_map['a']", "file name alone"),
    ('{"weight_map": {"a": "/etc/passwd"}}', "weight_map['a']", "file name alone"),
    ('{"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}}', "'a'", "appears twice"),
    ('{"weight_map": {"a": "x.safetensors"}, "metadata": {"n": NaN}}', "index",
     "NaN is no JSON value"),
    ("[" * 100_000, "index", "nested too deeply"),
    ('\ufeff{"weight_map": {}}', "index", "not JSON"),
])
def test_a_bad_index_is_refused_naming_the_field(tmp_path: pathlib.Path, text: str, field: str,
                                                 excerpt: str) -> None:
    path = tmp_path / INDEX
    path.write_text(text, encoding="utf-8")
    with pytest.raises(hb.FormatError) as e:
        hb.load(path)
    assert e.value.field == field and excerpt in str(e.value) and str(path) in str(e.value)


def test_an_index_that_is_not_utf8_or_too_large_is_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / INDEX
    path.write_bytes(b'{"weight_map": {"\xff": "x"}}')
    with pytest.raises(hb.FormatError, match="not UTF-8"):
        read_checkpoint_index(path)
    path.write_text('{"weight_map": {}}')
    monkeypatch.setattr(checkpoint_dir, "MAX_INDEX_BYTES", 8)
    with pytest.raises(hb.FormatError, match="18 bytes, over the limit of 8"):
        hb.load(path)


def test_a_folder_of_two_indexes_or_of_none_is_refused(tmp_path: pathlib.Path,
                                                      hand: pathlib.Path) -> None:
    convert_checkpoint(hand, tmp_path / "h", fsync=False)
    (tmp_path / "h" / INDEX).write_text((hand / INDEX).read_text())
    with pytest.raises(hb.FormatError, match=r"holds 2 checkpoint indexes "
                                             r"\(model\.hurray\.index\.json, "
                                             r"model\.safetensors\.index\.json\); pass the one"):
        hb.load(tmp_path / "h")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "pytorch_model.bin.index.json").write_text("{}")  # never read
    with pytest.raises(hb.FormatError, match="holds no checkpoint"):
        hb.load(tmp_path / "empty")


# ------------------------------------------------------------- converting
def digests(d: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def round_trip(capsys: pytest.CaptureFixture[str], d: pathlib.Path,
               tmp_path: pathlib.Path) -> pathlib.Path:
    """``hurray convert`` there and back; the Hurray folder."""
    mid, back = tmp_path / "as-hurray", tmp_path / "back"
    n = len(shard_files(d)) + 1
    assert main(["convert", str(d), str(mid), "--no-fsync"]) == 0
    assert f": {n} files, " in capsys.readouterr().out
    assert main(["convert", str(mid / "model.hurray.index.json"), str(back), "--no-fsync"]) == 0
    assert f"{n} files" in capsys.readouterr().out
    assert digests(back) == digests(d)  # every file, byte for byte
    assert sorted(p.name for p in mid.iterdir()) == sorted(
        [p.with_suffix(".hurray").name for p in shard_files(d)] + ["model.hurray.index.json"])
    return mid


def test_a_huggingface_hub_checkpoint_converts_both_ways_byte_identical(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
        hub_dir: tuple[pathlib.Path, dict[str, Any]]) -> None:
    d, sd = hub_dir
    mid = round_trip(capsys, d, tmp_path)
    f = hb.load(mid)
    index = read_checkpoint_index(mid / "model.hurray.index.json")
    assert index.format == "hurray" and index.metadata == read_checkpoint_index(d / INDEX).metadata
    for name, x in sd.items():
        assert bytes(f[name].memoryview()) == torch_bytes(x), name
        assert index.weight_map[name].endswith(".hurray")
        t = f[name]
        assert isinstance(t, hb.Tensor) and t.data_ptr % 64 == 0  # aligned now


def test_a_torch_storage_writer_checkpoint_converts_both_ways_byte_identical(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
        dcp_dir: tuple[pathlib.Path, dict[str, Any]]) -> None:
    d, sd = dcp_dir
    mid = round_trip(capsys, d, tmp_path)
    assert sorted(hb.load(mid)) == sorted(sd)


def test_a_hand_written_checkpoint_converts_both_ways_byte_identical(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, hand: pathlib.Path) -> None:
    mid = round_trip(capsys, hand, tmp_path)
    assert hb.load(mid).metadata == hb.load(hand).metadata
    assert convert_checkpoint(mid, tmp_path / "again", fsync=False) == (3, 4)


def test_convert_draws_one_progress_bar_over_all_files(
        tmp_path: pathlib.Path, hand: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hurray_bridge.__main__ as cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(cli, "_PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(["convert", str(hand), str(tmp_path / "out"), "-q"]) == 0
    assert tty.getvalue() == ""  # -q: no bar
    assert main(["convert", str(hand), str(tmp_path / "out2")]) == 0
    text = tty.getvalue()
    monkeypatch.undo()
    assert text.count("\n") == 1 and text.endswith("\n")  # one bar, ended once
    label = f"converting {hand}"
    draws = text.rstrip("\n").split("\r")[1:]
    assert draws and all(s.startswith(label) for s in draws)
    pcts = [int(re.search(r"\] +(\d+)%", s)[1]) for s in draws]  # type: ignore[index]
    assert pcts == sorted(pcts) and pcts[-1] == 100 and len(set(pcts)) == len(pcts)
    total = sum(p.stat().st_size for p in shard_files(hand))
    assert all(s.endswith(f"/{total >> 20} MiB") for s in draws)


def test_convert_refuses_a_broken_checkpoint_before_writing_anything(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, hand: pathlib.Path) -> None:
    index = json.loads((hand / INDEX).read_text())
    index["weight_map"]["d"] = "model-00001-of-00002.safetensors"
    (hand / INDEX).write_text(json.dumps(index))
    out = tmp_path / "out"
    assert main(["convert", str(hand), str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hurray: error: ") and "tensor 'd'" in err
    assert "model-00001-of-00002.safetensors" in err and "model-00002-of-00002" in err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("case", ["own folder", "same format", "--name", "other index"])
def test_convert_refusals(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
                          hand: pathlib.Path, case: str) -> None:
    if case == "other index":
        (tmp_path / "o").mkdir()
        (tmp_path / "o" / "old.safetensors.index.json").write_text('{"weight_map": {}}')
    argv: dict[str, list[str]] = {
        "other index": [str(hand), str(tmp_path / "o")],
        "own folder": [str(hand), str(hand)],
        "same format": [str(hand), str(tmp_path / "o"), "--to", "safetensors"],
        "--name": [str(hand), str(tmp_path / "o"), "--name", "x"],
    }
    before = digests(hand)
    assert main(["convert", *argv[case]]) == 2
    err = capsys.readouterr().err
    want: dict[str, str] = {"own folder": "the input's own folder",
                            "same format": "is safetensors already",
                            "--name": "--name names the entry of a .npy input",
                            "other index": "holds another checkpoint's index "
                                           "(old.safetensors.index.json)"}
    assert want[case] in err and err.count("\n") == 1
    assert digests(hand) == before  # nothing of the input touched
    written = list((tmp_path / "o").iterdir()) if (tmp_path / "o").exists() else []
    assert [p.name for p in written] in ([], ["old.safetensors.index.json"])


def test_renamed_swaps_the_format_suffix() -> None:
    rename: Callable[[str, str | None, str], str] = checkpoint_dir._renamed
    assert rename("model-00001-of-00002.safetensors", "safetensors", "hurray") == \
        "model-00001-of-00002.hurray"
    assert rename("model.safetensors.index.json", "safetensors", "hurray") == \
        "model.hurray.index.json"
    assert rename("weights.bin", "safetensors", "hurray") == "weights.bin.hurray"
    assert rename("odd.index.json", None, "safetensors") == "odd.safetensors.index.json"


def test_an_interrupted_convert_leaves_the_shards_written_and_no_index(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, hand: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = safetensors_io.safetensors_to_hurray
    calls: list[str] = []

    def second_interrupted(src: Any, dst: Any, **kw: Any) -> int:
        calls.append(str(src))
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C while the second shard converts
        return real(src, dst, **kw)

    monkeypatch.setattr(safetensors_io, "safetensors_to_hurray", second_interrupted)
    out = tmp_path / "out"
    assert main(["convert", str(hand), str(out), "--no-fsync"]) == 130
    err = capsys.readouterr().err
    assert err == (f"hurray: error: {out}: interrupted by SIGINT; the output folder has no "
                   "index yet: run the conversion again\n")
    assert sorted(p.name for p in out.iterdir()) == ["model-00001-of-00002.hurray"]
    monkeypatch.undo()
    assert main(["convert", str(hand), str(out), "--no-fsync"]) == 0  # again, in full
    assert list(hb.load(out)) == ["a", "c", "b", "d"]  # the index's order
