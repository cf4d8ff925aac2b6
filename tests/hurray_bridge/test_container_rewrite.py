"""``container.rewrite``: a Hurray file written again, read in chunks (``hurray convert``
of a Hurray input).

The output must be what loading the file and saving it again writes, byte for byte;
memory must not follow the file's size; and with ``verify`` every defect that
``container.verify`` reports is refused with the same error before the output exists.
"""

from __future__ import annotations

import io
import pathlib
import struct
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge.container import HEADER_SIZE
from hurray_bridge.files import format as file_format
from hurray_bridge.files import plan as planning
from hurray_bridge.files import writing
from tests.hurray_bridge.test_container_corruption import DATA, H, reseal
from tests.vectors.generate_files import HERE as VECTORS

np = pytest.importorskip("numpy")

FILES = sorted(VECTORS.glob("*.hurray"))


def _through_load(src: pathlib.Path, dst: pathlib.Path, alignment: int, checksums: bool) -> None:
    """The way a Hurray input was converted before: load (mapped), plan, write."""
    loaded = container.load(src, verify=True)
    plan = planning.plan_tensors(loaded, loaded.metadata or None, alignment, checksums)
    writing.write_plan(dst, plan, fsync=False)


@pytest.mark.parametrize("alignment", [64, 4096])
@pytest.mark.parametrize("checksums", [True, False], ids=["checksums", "none"])
@pytest.mark.parametrize("src", [*FILES, None], ids=[p.stem for p in FILES] + ["small_file"])
def test_rewrite_writes_what_load_and_save_write(tmp_path: pathlib.Path, src: pathlib.Path | None,
                                                 alignment: int, checksums: bool) -> None:
    if src is None:
        src = tmp_path / "small.hurray"
        src.write_bytes(DATA)
    want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
    _through_load(src, want, alignment, checksums)
    n = container.rewrite(src, got, alignment=alignment, checksums=checksums, fsync=False)
    assert n == len(container.read_index(src).entries)
    assert got.read_bytes() == want.read_bytes()
    container.verify(got)


def test_rewrite_of_safetensors_content_converts_it_as_load_reads_it(
        tmp_path: pathlib.Path) -> None:
    from hurray_bridge import safetensors_io as sio

    st = tmp_path / "st.safetensors"
    sio.save(st, {"w": np.arange(6, dtype=np.float32)}, {"k": "v"}, fsync=False)
    want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
    sio.safetensors_to_hurray(st, want, fsync=False)
    assert container.rewrite(st, got, fsync=False) == 1  # what `--from hurray` asks for
    assert got.read_bytes() == want.read_bytes()


def test_rewrite_of_the_same_settings_is_the_same_file(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "small.hurray"
    src.write_bytes(DATA)
    out = tmp_path / "again.hurray"
    container.rewrite(src, out, alignment=H.alignment)
    assert out.read_bytes() == DATA


def _damage(tmp_path: pathlib.Path, change: str) -> pathlib.Path:
    """DATA with one defect that only a read of the data region finds."""
    bad = bytearray(DATA)
    index = file_format.parse_index(H, memoryview(DATA[HEADER_SIZE:H.index_end]))[0]
    by_name = {e.name: e for e in index}
    if change == "data byte":
        b = by_name["dense"].buffers[0]
        bad[H.data_offset + b.offset + 3] ^= 0x10
    elif change == "head padding":
        bad[H.index_end] = 1
    elif change == "padding between buffers":
        first_end = min(b.offset + b.length for e in index for b in e.buffers if b.length)
        bad[H.data_offset + first_end] = 7
    elif change == "trailing bits, checksum resealed":
        e = by_name["int4"]
        b = e.buffers[0]
        at = H.data_offset + b.offset + b.length - 1
        bad[at] |= 0xF0  # five int4 elements: the high half of the last byte is padding
        assert e.checksum is not None
        stored = struct.pack("<I", e.checksum)
        assert DATA.count(stored, HEADER_SIZE, H.index_end) == 1
        pos = DATA.index(stored, HEADER_SIZE, H.index_end)
        struct.pack_into("<I", bad, pos, zlib.crc32(bytes(bad[H.data_offset + b.offset:at + 1])))
        bad = bytearray(reseal(bad))
    path = tmp_path / "bad.hurray"
    path.write_bytes(bytes(bad))
    return path


def _refused_alike(reference: Callable[[pathlib.Path], object], src: pathlib.Path,
                   out: pathlib.Path) -> hb.FormatError:
    """``rewrite(src, out)`` refuses ``src`` with the error ``reference(src)`` raises, and
    writes nothing."""
    with pytest.raises(hb.FormatError) as want:
        reference(src)
    with pytest.raises(hb.FormatError) as got:
        container.rewrite(src, out)
    assert str(got.value) == str(want.value)
    assert not out.exists()
    return want.value


@pytest.mark.parametrize("change", ["data byte", "head padding", "padding between buffers",
                                    "trailing bits, checksum resealed"])
def test_rewrite_refuses_what_verify_refuses(tmp_path: pathlib.Path, change: str) -> None:
    bad = _damage(tmp_path, change)
    out = tmp_path / "out.hurray"
    _refused_alike(container.verify, bad, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.hurray"]
    container.rewrite(bad, out, verify=False)  # on purpose: written as it is
    assert out.exists()


def test_every_data_byte_change_is_refused_as_verify_refuses_it(tmp_path: pathlib.Path) -> None:
    src, out = tmp_path / "bad.hurray", tmp_path / "out.hurray"
    for i in range(H.index_end, len(DATA), 7):
        bad = bytearray(DATA)
        bad[i] ^= 0xFF
        src.write_bytes(bytes(bad))
        try:
            container.verify(src)
            want = None
        except hb.FormatError as exc:
            want = str(exc)
        try:
            container.rewrite(src, out, fsync=False)
            got = None
        except hb.FormatError as exc:
            got = str(exc)
        assert got == want, i
        assert out.exists() == (want is None), i
        out.unlink(missing_ok=True)


def test_peak_memory_does_not_follow_the_file_size(
        tmp_path: pathlib.Path, peak_growth: Callable[[Callable[[], object]], int]) -> None:
    n = 96 << 20
    src = tmp_path / "big.hurray"
    piece = np.frombuffer(bytes(range(256)) * 4096, np.uint8)
    hb.save(src, {f"w{k}": piece for k in range(n // piece.nbytes)}, fsync=False)
    grew = peak_growth(lambda: container.rewrite(src, tmp_path / "out.hurray", alignment=4096,
                                                 fsync=False))
    assert grew < 32 << 20, grew >> 20  # a few 4 MiB buffers, not the 96 MiB file
    assert container.verify(tmp_path / "out.hurray").alignment == 4096


# ------------------------------------------------------------- hurray convert of a .npy
NPY_CASES = {
    "c order": lambda: np.arange(60, dtype=np.float32).reshape(3, 4, 5),
    "fortran order": lambda: np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
    "rank 0": lambda: np.array(7.5),
    "bool": lambda: np.array([True, False, True]),
    "float16": lambda: np.linspace(0, 1, 9, dtype=np.float16),
    # NumPy's bytes are swapped into a new array: the file's bytes are not the tensor's
    "big-endian": lambda: np.arange(10, dtype=">f4"),
    "big-endian fortran": lambda: np.asfortranarray(np.arange(6, dtype=">i2").reshape(2, 3)),
    "big-endian rank 0": lambda: np.array(2.5, dtype=">f8"),
}


@pytest.mark.parametrize("case", list(NPY_CASES))
def test_convert_of_a_npy_writes_what_load_and_save_write(tmp_path: pathlib.Path,
                                                          case: str) -> None:
    from hurray_bridge.__main__ import main

    a = NPY_CASES[case]()
    src = tmp_path / "x.npy"
    np.save(src, a)
    want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
    hb.save(want, {"x": np.load(src)}, alignment=128, fsync=False)
    assert main(["convert", "-q", "--no-fsync", "--alignment", "128", str(src), str(got)]) == 0
    assert got.read_bytes() == want.read_bytes()
    np.testing.assert_array_equal(np.asarray(hb.load(got)["x"]), a)


def test_convert_of_a_npy_does_not_map_the_file(
        tmp_path: pathlib.Path, peak_growth: Callable[[Callable[[], object]], int]) -> None:
    from hurray_bridge.__main__ import main

    src = tmp_path / "big.npy"
    np.save(src, np.zeros(96 << 20, np.uint8) + 3)
    argv = ["convert", "-q", "--no-fsync", str(src), str(tmp_path / "big.hurray")]
    grew = peak_growth(lambda: main(argv))
    assert grew < 32 << 20, grew >> 20
    assert int(np.asarray(hb.load(tmp_path / "big.hurray")["big"])[-1]) == 3


def _npz_arrays() -> dict[str, Any]:
    rng = np.random.default_rng(5)
    return {"w": rng.standard_normal((300, 70)).astype(np.float32),
            "scalar": np.array(3.5),
            "empty": np.zeros((0, 3), np.int8),
            "fortran": np.asfortranarray(rng.integers(0, 9, (40, 30)).astype(np.int16)),
            "mask": rng.integers(0, 2, 1001).astype(bool),
            "big_endian": np.arange(10, dtype=">i4")}


def _mixed_npz(path: pathlib.Path, arrays: dict[str, Any]) -> None:
    """An archive whose members alternate between stored and deflated."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for k, (name, a) in enumerate(arrays.items()):
            raw = io.BytesIO()
            np.save(raw, a)
            z.writestr(name + ".npy", raw.getvalue(),
                       zipfile.ZIP_STORED if k % 2 else zipfile.ZIP_DEFLATED)


@pytest.mark.parametrize("kind", ["savez", "savez_compressed", "mixed"])
def test_convert_of_an_npz_writes_what_saving_its_arrays_writes(
        tmp_path: pathlib.Path, kind: str) -> None:
    """Stored members are read from the archive in chunks, compressed ones whole: the file
    is the same either way, and the same as ``hb.save`` of the arrays."""
    from hurray_bridge.__main__ import main

    arrays = _npz_arrays()
    src = tmp_path / "a.npz"
    if kind == "mixed":
        _mixed_npz(src, arrays)
    else:
        getattr(np, kind)(src, **arrays)
    want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
    hb.save(want, dict(np.load(src)), alignment=128, fsync=False)
    assert main(["convert", "-q", "--alignment", "128", str(src), str(got)]) == 0
    assert got.read_bytes() == want.read_bytes()
    loaded = hb.load(got)
    for name, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(loaded[name]), a)


def test_convert_of_an_npz_does_not_hold_its_members(
        tmp_path: pathlib.Path, peak_growth: Callable[[Callable[[], object]], int]) -> None:
    from hurray_bridge.__main__ import main

    src = tmp_path / "big.npz"
    np.savez(src, a=np.zeros(48 << 20, np.uint8) + 3, b=np.zeros(12 << 20, np.float32) + 2)
    argv = ["convert", "-q", "--no-fsync", str(src), str(tmp_path / "big.hurray")]
    grew = peak_growth(lambda: main(argv))
    assert grew < 32 << 20, grew >> 20  # 96 MiB of members
    loaded = hb.load(tmp_path / "big.hurray")
    assert int(np.asarray(loaded["a"])[-1]) == 3 and float(np.asarray(loaded["b"])[-1]) == 2


def _stored_npz(tmp_path: pathlib.Path) -> tuple[pathlib.Path, bytearray, int]:
    src = tmp_path / "d.npz"
    a = np.arange(100_000, dtype=np.int32)
    np.savez(src, a=a, b=np.ones(10))
    raw = bytearray(src.read_bytes())
    return src, raw, raw.find(a.tobytes()[:64])


@pytest.mark.parametrize("where", ["data", "npy header", "data, no checksums"])
def test_convert_of_a_damaged_stored_member_leaves_no_output(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    """The member's bytes are not read by zipfile, which would check its CRC-32: the
    conversion checks it from the checksums it computes on the way, before the output
    replaces anything."""
    from hurray_bridge.__main__ import main

    src, raw, data = _stored_npz(tmp_path)
    at = data + 40_000 if where.startswith("data") else raw.find(b"'descr'") + 2
    raw[at] ^= 0x01 if where.startswith("data") else 0x00  # the header: a byte NumPy ignores
    if where == "npy header":
        raw[raw.find(b"}", at) + 1] = ord("\t")  # padding space -> tab: same header, new CRC
    src.write_bytes(bytes(raw))
    out = tmp_path / "o.hurray"
    extra = ["--no-checksums"] if where.endswith("no checksums") else []
    assert main(["convert", "-q", *extra, str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "archive member 'a.npy' is damaged" in err and "CRC-32" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz"]


def test_convert_of_a_stored_member_shorter_than_its_header_says_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    import zipfile

    from hurray_bridge.__main__ import main

    src = tmp_path / "s.npz"
    raw = io.BytesIO()
    np.save(raw, np.arange(5000, dtype=np.int64))
    with zipfile.ZipFile(src, "w") as z:
        z.writestr("a.npy", raw.getvalue()[:-8], zipfile.ZIP_STORED)
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hurray: error: {src}: input: cannot read npz: archive member "
                          "'a.npy' holds 39992 bytes after its .npy header"), err
    assert "(40000 bytes)" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz"]


def _npy(descr: str, shape: str, data: bytes) -> bytes:
    """A version 1.0 .npy of a header written as given (NumPy's writer would not write
    some of these)."""
    head = f"{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}"
    head += " " * (-(10 + len(head) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + data


def _zip_of(path: pathlib.Path, members: dict[str, bytes], method: int) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w", method) as z:
        for name, body in members.items():
            z.writestr(name, body)


def test_a_stored_member_with_bytes_after_its_array_converts_as_numpy_reads_it(
        tmp_path: pathlib.Path) -> None:
    """NumPy reads the array and leaves the rest, stored or compressed; so does convert."""
    import zipfile

    from hurray_bridge.__main__ import main

    raw = io.BytesIO()
    np.save(raw, np.arange(5000, dtype=np.int64))
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        src, out = tmp_path / f"s{method}.npz", tmp_path / f"s{method}.hurray"
        _zip_of(src, {"a.npy": raw.getvalue() + b"\0" * 8}, method)
        assert main(["convert", "-q", str(src), str(out)]) == 0
        np.testing.assert_array_equal(np.asarray(hb.load(out)["a"]), np.load(src)["a"])


def _numpy_refuses(tmp_path: pathlib.Path, case: str) -> tuple[pathlib.Path, pathlib.Path]:
    """An archive, stored and compressed, of one member that NumPy refuses to read."""
    import zipfile

    if case.startswith("sub-array"):  # NumPy writes no such header, and reads none
        descr = {"sub-array >i4": "('>i4', (2,))", "sub-array <i4": "('<i4', (2,))",
                 "sub-array empty": "('<i4', (0,))"}[case]
        body = _npy(descr, "(10000,)", np.arange(20000, dtype=">i4").tobytes())
    elif case == "negative dimension":
        body = _npy("'<i4'", "(-1,)", b"")
    else:
        body = b""
    stored, deflated = tmp_path / "stored.npz", tmp_path / "deflated.npz"
    if case == "sizes disagree":
        # The directory gives the stored member fewer bytes than it holds, with the CRC-32
        # of all of them: zipfile reads what the sizes say, and refuses the CRC.
        buf = io.BytesIO()
        np.save(buf, np.arange(1100, dtype="<i4"))
        _zip_of(stored, {"a.npy": buf.getvalue()}, zipfile.ZIP_STORED)
        raw = bytearray(stored.read_bytes())
        struct.pack_into("<I", raw, raw.find(b"PK\x01\x02") + 20, 4200)  # central csize
        struct.pack_into("<I", raw, 18, 4200)  # the local header's
        stored.write_bytes(bytes(raw))
        return stored, stored
    _zip_of(stored, {"a.npy": body}, zipfile.ZIP_STORED)
    _zip_of(deflated, {"a.npy": body}, zipfile.ZIP_DEFLATED)
    return stored, deflated


@pytest.mark.parametrize("case", ["sub-array >i4", "sub-array <i4", "sub-array empty",
                                  "negative dimension", "sizes disagree"])
def test_a_stored_member_numpy_refuses_is_refused_as_the_compressed_one_is(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    """A member is read from the archive only where NumPy would read it the same way."""
    from hurray_bridge.__main__ import main

    stored, deflated = _numpy_refuses(tmp_path, case)
    for src in (stored, deflated):
        with pytest.raises(Exception):  # noqa: B017 (whatever NumPy raises for it)
            dict(np.load(src))
        out = tmp_path / "o.hurray"
        assert main(["convert", "-q", str(src), str(out)]) == 2, src.name
        err = capsys.readouterr().err
        assert err.startswith(f"hurray: error: {src}: input: cannot read npz"), err
        assert err.count("\n") == 1 and not out.exists()


def test_a_sub_array_member_damaged_is_refused(tmp_path: pathlib.Path) -> None:
    from hurray_bridge.__main__ import main

    src, _ = _numpy_refuses(tmp_path, "sub-array >i4")
    raw = bytearray(src.read_bytes())
    raw[raw.find(b"\n", 40) + 5000] ^= 0xFF
    src.write_bytes(bytes(raw))
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2


@pytest.mark.parametrize("where", ["past the end", "negative"])
def test_a_member_whose_local_header_is_outside_the_file_is_named(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], where: str) -> None:
    import zipfile

    from hurray_bridge.__main__ import main

    src = tmp_path / "s.npz"
    buf = io.BytesIO()
    np.save(buf, np.arange(100, dtype="<i4"))
    _zip_of(src, {"a.npy": buf.getvalue()}, zipfile.ZIP_STORED)
    raw = bytearray(src.read_bytes())
    if where == "past the end":
        struct.pack_into("<I", raw, raw.find(b"PK\x01\x02") + 42, len(raw) + 100)
    else:  # the end record places the directory later than it is: zipfile shifts offsets
        end = raw.rfind(b"PK\x05\x06")
        offset = struct.unpack_from("<I", raw, end + 16)[0]
        struct.pack_into("<I", raw, end + 16, offset + 1000)
    src.write_bytes(bytes(raw))
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hurray: error: {src}: input: cannot read npz: archive member "
                          "'a.npy' has its local header at offset "), err
    assert "outside the file" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["d/", "notes.txt"])
def test_a_member_that_is_no_npy_is_named(tmp_path: pathlib.Path,
                                          capsys: pytest.CaptureFixture[str], name: str) -> None:
    import zipfile

    from hurray_bridge.__main__ import main

    src = tmp_path / "s.npz"
    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    _zip_of(src, {"a.npy": buf.getvalue(), name: b"" if name.endswith("/") else b"hello"},
            zipfile.ZIP_STORED)
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2
    err = capsys.readouterr().err
    assert err == (f"hurray: error: {src}: input: cannot read npz: archive member {name!r} "
                   "is not a .npy array (np.savez writes only those)\n"), err


_FEW_DESCRIPTORS = """
import resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
from hurray_bridge.__main__ import main
sys.exit(main(["convert", "-q", sys.argv[1], sys.argv[2]]))
"""


def test_convert_of_an_npz_of_many_stored_members_needs_few_file_descriptors(
        tmp_path: pathlib.Path) -> None:
    """The members are read through one handle on the archive, not one each (a process
    limited to 64 open files converts 200 members; run in a subprocess)."""
    import subprocess
    import sys

    src, out = tmp_path / "many.npz", tmp_path / "many.hurray"
    arrays = {f"a{i}": np.full(3, i, np.int16) for i in range(200)}
    np.savez(src, **arrays)
    proc = subprocess.run([sys.executable, "-c", _FEW_DESCRIPTORS, str(src), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = hb.load(out)
    assert len(loaded) == 200 and int(np.asarray(loaded["a199"])[0]) == 199


_CUT_AFTER_MAP = """
import os, sys
import numpy as np
path, out = sys.argv[1], sys.argv[2]
real = np.load
def load(*args, **kw):
    got = real(*args, **kw)
    if kw.get("mmap_mode"):  # the file is cut once its header has been read
        os.truncate(path, 256)
    return got
np.load = load
from hurray_bridge.__main__ import main
sys.exit(main(["convert", "-q", path, out]))
"""


def test_a_big_endian_npy_cut_during_its_conversion_is_an_error_not_a_crash(
        tmp_path: pathlib.Path) -> None:
    """Its bytes are swapped into memory: read from the file, not through the memory map
    of its header's reading, which a cut file turns into SIGBUS (run in a subprocess)."""
    import subprocess
    import sys

    src = tmp_path / "be.npy"
    np.save(src, np.arange(1 << 20, dtype=">i4"))
    proc = subprocess.run([sys.executable, "-c", _CUT_AFTER_MAP, str(src),
                           str(tmp_path / "o.hurray")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"hurray: error: {src}: input: cannot read npy"), proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["be.npy"]


def test_rewrite_of_shard_entries_writes_what_load_and_save_write(tmp_path: pathlib.Path) -> None:
    a = np.arange(96, dtype=np.float32).reshape(8, 12)
    src = tmp_path / "w.hurray"
    hb.save(src, {"bias": np.ones(3), "w": hb.split(a, hb.grid_boxes(a.shape, (2, 3))),
                  "b": np.zeros(5, np.int8)}, {"k": "v"}, fsync=False)
    for alignment in (64, 4096):
        want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
        _through_load(src, want, alignment, True)
        assert container.rewrite(src, got, alignment=alignment, fsync=False) == 3  # as loaded
        assert got.read_bytes() == want.read_bytes()


def _overlapping_shards(tmp_path: pathlib.Path) -> pathlib.Path:
    """Entries that are shards by their names and sections, written as they are by a
    writer that does not check them (hb.save refuses): one box twice (which load refuses)."""
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    st = hb.split(a, hb.grid_boxes(a.shape, (2, 1)))
    src = tmp_path / "w.hurray"
    items = [(n, st.shards[0].descriptor, [st.shards[0].memoryview()]) for n in ("w[0]", "w[1]")]
    src.write_bytes(planning.serialise(planning.plan_items(items, None, 64, True, [])))
    return src


def test_rewrite_of_an_overlapping_shard_set_is_refused_as_load_refuses_it(
        tmp_path: pathlib.Path) -> None:
    _refused_alike(container.load, _overlapping_shards(tmp_path), tmp_path / "o.hurray")


_CUT_WHEN_WRITING = """
import os, sys
import numpy as np
import hurray_bridge as hb
from hurray_bridge import container
path, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
a = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
if kind == "shards":
    hb.save(path, {"w": hb.split(a, hb.grid_boxes(a.shape, (2, 1)))}, fsync=False)
else:  # safetensors content, converted as a Hurray input (--from hurray)
    from hurray_bridge import safetensors_io
    safetensors_io.save(path, {"w": a}, fsync=False)
from hurray_bridge.files import convert
real = convert.write_plan
def write_plan(*args, **kw):
    os.truncate(path, 4096)  # the input is cut as the output is about to be written
    return real(*args, **kw)
convert.write_plan = write_plan
from hurray_bridge.__main__ import main
sys.exit(main(["convert", "-q", "--from", "hurray", path, out]))
"""


@pytest.mark.parametrize("kind", ["shards", "safetensors content"])
def test_an_input_loaded_before_cut_during_its_conversion_is_an_error_not_a_crash(
        tmp_path: pathlib.Path, kind: str) -> None:
    """Their bytes are read from the file in chunks like any entry's, not through a memory
    map, which a cut file turns into SIGBUS (run in a subprocess)."""
    import subprocess
    import sys

    src = tmp_path / ("w.hurray" if kind == "shards" else "w.safetensors")
    proc = subprocess.run([sys.executable, "-c", _CUT_WHEN_WRITING, str(src),
                           str(tmp_path / "o.hurray"), kind], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"hurray: error: {src}: "), proc.stderr
    assert "truncated" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]


@pytest.mark.parametrize("method", ["stored", "deflated"])
def test_a_damaged_member_with_bytes_after_its_array_is_refused(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], method: str) -> None:
    """NumPy reads such a member's array and stops before its end, where zipfile checks
    the CRC-32: the conversion reads on to the end."""
    import zipfile

    from hurray_bridge.__main__ import main

    buf = io.BytesIO()
    np.save(buf, np.arange(5000, dtype=np.int64))
    good = buf.getvalue() + b"\0" * 100
    bad = bytearray(good)
    bad[len(good) - 100 - 8 * 4999] ^= 0xFF  # a byte of a[1]
    src = tmp_path / "s.npz"
    with zipfile.ZipFile(src, "w") as z:  # the CRC-32 of the good bytes, over the bad ones
        z.writestr(zipfile.ZipInfo("a.npy"), good)
    raw = bytearray(src.read_bytes())
    raw[raw.find(good):raw.find(good) + len(good)] = bad
    if method == "deflated":
        import zlib

        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        body = comp.compress(bytes(bad)) + comp.flush()
        with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("a.npy", bytes(bad))
        raw = bytearray(src.read_bytes())
        for at in (14, raw.find(b"PK\x01\x02") + 16):  # both headers' CRC: the good bytes'
            struct.pack_into("<I", raw, at, zlib.crc32(good))
        assert body in raw
    src.write_bytes(bytes(raw))
    with pytest.raises(Exception, match="CRC"):
        zipfile.ZipFile(src).read("a.npy")
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2
    err = capsys.readouterr().err
    assert "CRC-32" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.npz"]


def _shard_file(tmp_path: pathlib.Path, layout: str) -> pathlib.Path:
    """Shard entries saved under the names and in the order given (as another writer, or
    one rank's file, may hold them)."""
    a = np.arange(96, dtype=np.float32).reshape(8, 12)
    sh = hb.split(a, hb.grid_boxes(a.shape, (2, 2))).shards
    v = hb.split(a[:4], hb.grid_boxes((4, 12), (1, 2))).shards
    entries: dict[str, Any] = {
        "interleaved": {"w[0]": sh[0], "b": np.ones(3), "w[1]": sh[1], "w[2]": sh[2],
                        "w[3]": sh[3]},
        "numbers with gaps": {"w[1]": sh[1], "w[3]": sh[3]},
        "reversed": {"w[3]": sh[3], "w[2]": sh[2], "w[1]": sh[1], "w[0]": sh[0]},
        "two groups interleaved": {"w[0]": sh[0], "v[0]": v[0], "w[1]": sh[1], "v[1]": v[1],
                                   "w[2]": sh[2], "w[3]": sh[3]},
    }[layout]
    src = tmp_path / "s.hurray"
    hb.save(src, entries, {"k": "v"}, fsync=False)
    return src


@pytest.mark.parametrize("layout", ["interleaved", "numbers with gaps", "reversed",
                                    "two groups interleaved"])
@pytest.mark.parametrize("alignment", [64, 4096])
def test_rewrite_of_shard_entries_in_any_order_writes_what_load_and_save_write(
        tmp_path: pathlib.Path, layout: str, alignment: int) -> None:
    src = _shard_file(tmp_path, layout)
    want, got = tmp_path / "want.hurray", tmp_path / "got.hurray"
    for checksums in (True, False):
        _through_load(src, want, alignment, checksums)
        n = container.rewrite(src, got, alignment=alignment, checksums=checksums, fsync=False)
        assert n == len(container.load(src))
        assert got.read_bytes() == want.read_bytes(), (layout, checksums)


def _checksum_damage_comes_first(src: pathlib.Path, entry: int, mask: int,
                                 out: pathlib.Path) -> None:
    """Flip ``mask`` in the first byte of entry ``entry``'s first buffer: ``rewrite``
    refuses the file as load(verify=True) does, with the checksum mismatch."""
    idx = container.read_index(src)
    raw = bytearray(src.read_bytes())
    raw[idx.data_offset + idx.entries[entry].buffers[0].offset] ^= mask
    src.write_bytes(bytes(raw))
    want = _refused_alike(lambda p: container.load(p, verify=True), src, out)
    assert want.field.endswith("checksum"), want.field


def test_rewrite_of_damaged_overlapping_shards_reports_the_damage_first(
        tmp_path: pathlib.Path) -> None:
    """As load(verify=True) does: the bytes are checked before the shard sets."""
    _checksum_damage_comes_first(_overlapping_shards(tmp_path), 1, 0x01, tmp_path / "o.hurray")


def test_an_npz_cut_between_its_listing_and_its_map_is_called_truncated(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_bridge.__main__ import main

    src = tmp_path / "s.npz"
    np.savez(src, a=np.arange(100_000), b=np.ones(5))
    real = np.lib.format.read_array_header_1_0

    def cut_then_read(*args: Any, **kw: Any) -> Any:  # once the archive's size is known
        os.truncate(src, 40_000)
        return real(*args, **kw)

    import os

    monkeypatch.setattr(np.lib.format, "read_array_header_1_0", cut_then_read)
    assert main(["convert", "-q", str(src), str(tmp_path / "o.hurray")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hurray: error: {src}: input: cannot read npz: archive member "
                          "'a.npy' ends past the end of the file (truncated"), err


@pytest.mark.skipif(not pathlib.Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_a_refused_shard_set_leaves_no_map_of_the_file_behind(tmp_path: pathlib.Path) -> None:
    import gc

    src = _overlapping_shards(tmp_path)
    gc.disable()  # reference counting alone must release it
    try:
        with pytest.raises(hb.FormatError) as kept:
            container.rewrite(src, tmp_path / "o.hurray")
        assert str(src) not in pathlib.Path("/proc/self/maps").read_text(), kept.value
    finally:
        gc.enable()


@pytest.mark.parametrize("kind", ["plain", "shards"])
def test_a_damaged_bool8_byte_is_reported_as_verify_reports_it(
        tmp_path: pathlib.Path, kind: str) -> None:
    """A byte that is no bool8 value is refused as the output is planned; in a file with
    checksums, the damage verify finds is the error, as load(verify=True) reports it."""
    a = np.array([True, False, True, True])
    halves = hb.split(a, hb.grid_boxes((4,), (2,))).shards
    src = tmp_path / "b.hurray"
    hb.save(src, {"x": np.ones(3, np.float32), "b": a} if kind == "plain"
            else {"w[2]": halves[0], "w[5]": halves[1]}, fsync=False)
    first_bool8 = next(e.position for e in container.read_index(src).entries
                       if e.descriptor.dtype.name == "bool8")
    _checksum_damage_comes_first(src, first_bool8, 0x40, tmp_path / "o.hurray")  # 0x01 -> 0x41


def test_a_name_clash_made_by_renumbering_is_reported_after_the_damage(
        tmp_path: pathlib.Path) -> None:
    """Shards w[3], w[7] are written as w[0], w[1] (as load then save number them), which
    a plain entry w[0] already holds: refused, but damage elsewhere is the first error,
    as load(verify=True) reports it before any save."""
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    st = hb.split(a, hb.grid_boxes(a.shape, (2, 1)))
    src = tmp_path / "d.hurray"
    hb.save(src, {"x": np.arange(3, dtype=np.float32), "w[3]": st.shards[0],
                  "w[0]": np.ones(2, np.int8), "w[7]": st.shards[1]}, fsync=False)
    with pytest.raises(hb.FormatError, match="duplicate entry name 'w\\[0\\]'"):
        container.rewrite(src, tmp_path / "o.hurray", fsync=False)
    _checksum_damage_comes_first(src, 0, 0x01, tmp_path / "o.hurray")
