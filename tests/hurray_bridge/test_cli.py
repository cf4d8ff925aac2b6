"""The ``hurray`` command line: inspect, convert, verify (container.md §10)."""

from __future__ import annotations

import io
import json
import os
import pathlib
import signal
import stat
import struct
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container, safetensors_io
from hurray_bridge.__main__ import _ProgressBar, main
from hurray_bridge.files import disk as _disk

np = pytest.importorskip("numpy")

from tests.vectors.generate_files import HERE as VECTORS  # noqa: E402


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def ckpt(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "c.hurray"
    hb.save(path, {"weight": np.ones((3, 4), np.float32), "bias.T": np.ones((4, 2)).T,
                   "empty": np.zeros((0, 5), np.int8)}, {"format": "np", "author": "me"})
    return path


# --------------------------------------------------------------------- inspect
def test_inspect_prints_a_table(capsys: pytest.CaptureFixture[str], ckpt: pathlib.Path) -> None:
    rc, out, err = run(capsys, "inspect", str(ckpt))
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert "Hurray 1.0, 3 entries" in lines[0] and "CRC-32" in lines[0]
    assert lines[1].split() == ["name", "dtype", "shape", "layout", "bytes", "quantization"]
    assert lines[2].split() == ["weight", "float32", "[3,", "4]", "row-major", "48", "-"]
    assert lines[3].split()[:4] == ["bias.T", "float64", "[2,", "4]"]
    assert "strided [1, 2]" in lines[3]
    assert lines[4].split() == ["empty", "int8", "[0,", "5]", "row-major", "0", "-"]
    assert "metadata:" in lines and "  format = np" in lines


def test_inspect_quantized_sparse_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "inspect", str(VECTORS / "per_axis_quant.hurray"))
    assert rc == 0 and "per-axis(axis=0) scale=float32 zero_point=int8" in out
    rc, out, _ = run(capsys, "inspect", str(VECTORS / "sparse_coo.hurray"))
    assert "coo nnz=3 int64 canonical" in out
    rc, out, _ = run(capsys, "inspect", "--json", str(VECTORS / "per_block_int4_e8m0.hurray"))
    doc = json.loads(out)
    assert doc["entries"] == [{"name": "w", "dtype": "int4", "shape": [4, 64],
                               "layout": "row-major", "bytes": 136,
                               "quantization": "per-block(axis=1, block=32) "
                                               "scale=float8_e8m0fnu"}]


def test_inspect_safetensors(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    save_file({"x": np.ones(3, np.float16)}, tmp_path / "s.safetensors", metadata={"k": "v"})
    rc, out, _ = run(capsys, "inspect", str(tmp_path / "s.safetensors"))
    assert rc == 0 and "safetensors, 1 tensor," in out and "float16" in out and "k = v" in out


# --------------------------------------------------------------------- convert
def test_convert_safetensors_both_ways(capsys: pytest.CaptureFixture[str],
                                       tmp_path: pathlib.Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    src = tmp_path / "a.safetensors"
    save_file({"x": np.arange(6, dtype=np.int32), "y": np.zeros((2, 0))}, src,
              metadata={"format": "np"})
    rc, out, err = run(capsys, "convert", str(src), str(tmp_path / "a.hurray"))
    assert rc == 0 and err == ""  # no progress bar: stderr is not a terminal
    assert "-> " in out and "2 tensors" in out
    rc, _, _ = run(capsys, "convert", "-q", str(tmp_path / "a.hurray"),
                   str(tmp_path / "b.safetensors"))
    assert rc == 0
    assert (tmp_path / "b.safetensors").read_bytes() == src.read_bytes()
    rc, out, _ = run(capsys, "convert", "--no-checksums", str(src), str(tmp_path / "c.hry"))
    assert rc == 0 and not container.read_index(tmp_path / "c.hry").has_checksums


def test_convert_npy_and_npz(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.save(tmp_path / "w.npy", a)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    np.savez(tmp_path / "z.npz", first=a, second=np.ones(2, np.uint8))
    assert run(capsys, "convert", str(tmp_path / "w.npy"), str(tmp_path / "w.hurray"))[0] == 0
    assert list(hb.load(tmp_path / "w.hurray")) == ["w"]
    np.testing.assert_array_equal(np.asarray(hb.load(tmp_path / "w.hurray")["w"]), a)
    assert run(capsys, "convert", "--name", "m", str(tmp_path / "f.npy"),
               str(tmp_path / "f.hurray"))[0] == 0
    f = hb.load(tmp_path / "f.hurray")["m"]
    assert f.layout == hb.Layout.STRIDED  # Fortran order is kept, as strides
    np.testing.assert_array_equal(np.asarray(f), a)
    assert run(capsys, "convert", str(tmp_path / "z.npz"), str(tmp_path / "z.hurray"))[0] == 0
    z = hb.load(tmp_path / "z.hurray")
    assert list(z) == ["first", "second"]
    np.testing.assert_array_equal(np.asarray(z["second"]), np.ones(2, np.uint8))


def test_convert_hurray_to_hurray_changes_alignment(capsys: pytest.CaptureFixture[str],
                                                    ckpt: pathlib.Path) -> None:
    out_path = ckpt.with_name("d.hurray")
    assert run(capsys, "convert", "--alignment", "4096", str(ckpt), str(out_path))[0] == 0
    idx = container.read_index(out_path)
    assert idx.alignment == 4096 and idx.metadata == {"format": "np", "author": "me"}


@pytest.mark.parametrize("argv, words", [
    (["convert", "{missing}", "{out}.hurray"], "No such file"),
    (["convert", "{ckpt}", "{out}.bin"], "--to"),
    (["convert", "{npy}", "{out}.safetensors"], "not supported"),
    (["convert", "{junk}", "{out}.hurray"], "magic"),
    (["convert", "{pickled}", "{out}.hurray"], "dtype object"),
    (["inspect", "{junk}"], "magic"),
    (["inspect", "{missing}"], "No such file"),
    (["verify", "{missing}"], "No such file"),
])
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str],
                                          tmp_path: pathlib.Path, ckpt: pathlib.Path,
                                          argv: list[str], words: str) -> None:
    (tmp_path / "junk.hurray").write_bytes(b"garbage" * 40)
    np.save(tmp_path / "a.npy", np.ones(2))
    np.save(tmp_path / "p.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    subs = {"missing": str(tmp_path / "nope.hurray"), "out": str(tmp_path / "out"),
            "ckpt": str(ckpt), "npy": str(tmp_path / "a.npy"),
            "junk": str(tmp_path / "junk.hurray"), "pickled": str(tmp_path / "p.npy")}
    rc, out, err = run(capsys, *[a.format(**subs) for a in argv])
    assert rc == 2 and out == ""
    assert err.startswith("hurray: error: ") and words in err and "Traceback" not in err
    assert not any(p.name.startswith("out") for p in tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["npy", "npz", "npz-compressed"])
def test_an_object_array_is_an_unsupported_type_not_a_malformed_file(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, kind: str) -> None:
    # NumPy's own error (objects need allow_pickle) read as "the file is malformed"; the
    # file is fine, its type is what no Hurray file holds.
    objects = np.array([1, "a", None], dtype=object)
    src = tmp_path / f"p.{kind[:3]}"
    if kind == "npy":
        np.save(src, objects, allow_pickle=True)
    else:
        (np.savez_compressed if kind.endswith("compressed") else np.savez)(
            src, w=np.ones(2), p=objects)
    rc, out, err = run(capsys, "convert", str(src), str(tmp_path / "out.hurray"))
    assert rc == 2 and out == "", err
    assert "malformed" not in err, err
    where = "the array" if kind == "npy" else "archive member 'p'"
    assert f"input: {where} has NumPy dtype object (Python objects)" in err, err
    assert "no Hurray element type" in err and "float32" in err, err  # the supported list
    assert "astype" in err, err  # the fix
    assert not (tmp_path / "out.hurray").exists()


@pytest.mark.parametrize("parent", ["missing", "a-file"])
def test_convert_into_a_missing_folder_says_so(capsys: pytest.CaptureFixture[str],
                                               tmp_path: pathlib.Path, parent: str) -> None:
    # It said "an earlier file of that name is unchanged" where there was none.
    np.save(tmp_path / "a.npy", np.ones(2))
    folder = tmp_path / "no" / "such" if parent == "missing" else tmp_path / "a.npy"
    out_path = folder / "out.hurray"
    rc, out, err = run(capsys, "convert", str(tmp_path / "a.npy"), str(out_path))
    assert rc == 2 and out == "", err
    assert "earlier file" not in err, err
    what = "does not exist" if parent == "missing" else "is not a folder"
    assert f"the output was not written: its folder {folder} {what}" in err, err
    if parent == "missing":
        assert f"mkdir -p {folder}" in err, err


def test_convert_over_an_existing_file_that_fails_keeps_it_and_says_so(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    np.save(tmp_path / "a.npy", np.ones(2))
    out_path = tmp_path / "out.hurray"
    out_path.write_bytes(b"old")

    def fail(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device", str(out_path))

    monkeypatch.setattr(hb.container, "_write_plan", fail)
    rc, _, err = run(capsys, "convert", str(tmp_path / "a.npy"), str(out_path))
    assert rc == 2 and "an earlier file of that name is unchanged" in err, err
    assert out_path.read_bytes() == b"old"


# ---------------------------------------------------------------------- verify
def test_verify_ok_and_failures(capsys: pytest.CaptureFixture[str], ckpt: pathlib.Path) -> None:
    rc, out, err = run(capsys, "verify", str(ckpt), str(VECTORS / "no_checksums.hurray"))
    assert rc == 0 and err == ""
    assert out.splitlines()[0] == (f"{ckpt}: OK (3 entries, 128 bytes of data, data checksums "
                                   "and padding verified)")
    assert "no data checksums" in out.splitlines()[1]
    data = bytearray(ckpt.read_bytes())
    data[4096 + 3] ^= 0x10  # a bit of "weight"
    bad = ckpt.with_name("bad.hurray")
    bad.write_bytes(data)
    rc, out, err = run(capsys, "verify", str(ckpt), str(bad))
    assert rc == 2 and "OK" in out
    assert err.strip() == (f"hurray: error: {bad}: entries[0].checksum: entry 'weight': data "
                           "checksum mismatch" + err.strip().split("mismatch", 1)[1])
    bad.write_bytes(data[:-5])
    rc, _, err = run(capsys, "verify", str(bad))
    assert rc == 2 and "file_size: truncated" in err


def test_verify_safetensors(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    save_file({"x": np.ones(3)}, tmp_path / "s.safetensors")
    rc, out, _ = run(capsys, "verify", str(tmp_path / "s.safetensors"))
    assert rc == 0 and "OK (safetensors: 1 tensor," in out
    raw = (tmp_path / "s.safetensors").read_bytes()
    (tmp_path / "s.safetensors").write_bytes(raw[:-1])
    rc, _, err = run(capsys, "verify", str(tmp_path / "s.safetensors"))
    assert rc == 2 and "data_offsets" in err


# ------------------------------------------------------------------ help & bars
@pytest.mark.parametrize("argv", [[], ["inspect"], ["convert"], ["verify"], ["matrix"]])
def test_help_everywhere(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hurray")
    if not argv:
        for cmd in ("inspect", "convert", "verify", "matrix"):
            assert cmd in out


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["inspect"])
    assert e.value.code == 2 and "usage:" in capsys.readouterr().err


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = _ProgressBar("converting x", True)
    for done in range(0, 101 << 20, 1 << 20):
        bar(done, 100 << 20)
    bar.close()
    text = tty.getvalue()
    assert "100%" in text and text.endswith("\n") and text.count("\r") == 101
    tty.seek(0)
    tty.truncate()
    small = _ProgressBar("x", True)
    small(1, 1 << 20)  # small jobs draw nothing
    quiet = _ProgressBar("x", False)
    quiet(1 << 30, 1 << 30)
    small.close()
    quiet.close()
    assert tty.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    piped = _ProgressBar("x", True)
    piped(1 << 30, 1 << 30)
    assert sys.stderr.getvalue() == ""


def test_module_entry_point(ckpt: pathlib.Path) -> None:
    res = subprocess.run([sys.executable, "-m", "hurray_bridge", "verify", str(ckpt)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "OK" in res.stdout and res.stderr == ""
    res = subprocess.run([sys.executable, "-m", "hurray_bridge", "inspect", str(ckpt) + "x"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("hurray: error:")


# ------------------------------------------------------ version & closed pipes
def _entry_point() -> list[str]:
    """The installed ``hurray`` script when there is one, else ``python -m hurray_bridge``."""
    script = pathlib.Path(sys.executable).with_name("hurray")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hurray_bridge"]


def test_version_prints_the_package_version() -> None:
    from importlib import metadata

    res = subprocess.run([*_entry_point(), "--version"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout == f"hurray {hb.__version__}\n"
    assert hb.__version__ == metadata.version("hurray-bridge")


@pytest.mark.parametrize("argv", [
    ["matrix", "--frameworks", "numpy", "--dtypes", "float32", "int8", "--repeat", "1"],
    ["inspect", "{ckpt}"],
    ["inspect", "--json", "{ckpt}"],
    ["verify", "{ckpt}"],
    ["--version"],
    ["--help"],
])
def test_output_into_a_closed_pipe_ends_quietly(ckpt: pathlib.Path, argv: list[str]) -> None:
    """``hurray matrix | head -n 1``: the reader has gone before the output comes. No
    traceback, no 'Exception ignored', and the status a shell gives a Unix tool that the
    broken pipe stopped (141 = 128 + SIGPIPE), or 0 when the output was already out."""
    args = [a.format(ckpt=ckpt) for a in argv]
    with subprocess.Popen([*_entry_point(), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:  # closes stderr at the end
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader exits before reading anything
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=300)
    assert err == "" and rc in (0, 141), (rc, err)
    if argv[0] in ("matrix", "inspect"):  # output only after seconds of imports: always late
        assert rc == 141


# ------------------------------------------- convert --alignment, errors, counts
def _hurray(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*_entry_point(), *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["safetensors", "hurray", "npy", "npz"])
def test_convert_honours_alignment_for_every_input(tmp_path: pathlib.Path, kind: str) -> None:
    a = np.arange(10, dtype=np.float32)
    b = np.ones(3, np.int8)
    src = tmp_path / f"in.{kind}"
    if kind == "safetensors":
        pytest.importorskip("safetensors")
        from safetensors.numpy import save_file

        save_file({"a": a, "b": b}, src)
    elif kind == "hurray":
        hb.save(src, {"a": a, "b": b})
    elif kind == "npy":
        np.save(src, a)
    else:
        np.savez(src, a=a, b=b)
    out = tmp_path / "out.hurray"
    res = _hurray("convert", "--alignment", "4096", str(src), str(out))
    assert res.returncode == 0, res.stderr
    idx = container.read_index(out)
    assert idx.alignment == 4096 and idx.data_offset % 4096 == 0
    offsets = [buf.offset for e in idx.entries for buf in e.buffers]
    assert offsets and all(o % 4096 == 0 for o in offsets), offsets
    np.testing.assert_array_equal(np.asarray(next(iter(hb.load(out).values()))), a)


@pytest.mark.parametrize("value", ["0", "100", "32", "63", "-64", "x", "1.5", str(1 << 22)])
def test_convert_refuses_an_alignment_that_is_not_a_power_of_two_from_64(
        tmp_path: pathlib.Path, ckpt: pathlib.Path, value: str) -> None:
    out = tmp_path / "out.hurray"
    res = _hurray("convert", "--alignment", value, str(ckpt), str(out))
    assert res.returncode == 2 and res.stdout == "" and "Traceback" not in res.stderr
    assert "argument --alignment" in res.stderr and "power of two" in res.stderr
    assert repr(value) in res.stderr or value in res.stderr
    assert not out.exists()


def test_convert_refuses_alignment_for_a_safetensors_output(tmp_path: pathlib.Path,
                                                            ckpt: pathlib.Path) -> None:
    out = tmp_path / "out.safetensors"
    res = _hurray("convert", "--alignment", "4096", str(ckpt), str(out))
    assert res.returncode == 2 and "--alignment" in res.stderr and "safetensors" in res.stderr
    assert not out.exists()
    hb.save(ckpt, {"w": np.ones(3, np.float32)})
    assert _hurray("convert", "-q", str(ckpt), str(out)).returncode == 0  # without: fine


def test_errors_name_truncation_and_foreign_files(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    good = tmp_path / "m.safetensors"
    save_file({"x": np.ones(300, np.float32)}, good)
    raw = good.read_bytes()
    cases = {
        "half.safetensors": (raw[:len(raw) // 2], "truncated"),
        "head.safetensors": (raw[:20], "truncated"),
        "note.txt": (b"hello, a short text file\n", "not a Hurray file"),
        "short.hurray": (b"hello", "not a Hurray file"),
        "start.hurray": (b"HRYF\x01", "truncated"),
    }
    for name, (data, words) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        for argv in (["inspect", str(path)], ["verify", str(path)],
                     ["convert", str(path), str(tmp_path / "o.hurray")]):
            res = _hurray(*argv)
            assert res.returncode == 2, (argv, res)
            assert words in res.stderr, (argv, res.stderr)
            if words == "not a Hurray file":
                assert "truncated" not in res.stderr, res.stderr


def test_counts_are_singular_for_one(tmp_path: pathlib.Path) -> None:
    one = tmp_path / "one.hurray"
    hb.save(one, {"w": np.ones(1, np.int8)})
    res = _hurray("inspect", str(one))
    assert "1 entry," in res.stdout and "1 byte of data" in res.stdout, res.stdout
    res = _hurray("verify", str(one))
    assert "(1 entry, 1 byte of data" in res.stdout, res.stdout
    res = _hurray("convert", str(one), str(tmp_path / "one.safetensors"))
    assert res.stdout.rstrip().endswith(": 1 tensor"), res.stdout
    for argv in (["inspect", str(tmp_path / "one.safetensors")],
                 ["verify", str(tmp_path / "one.safetensors")]):
        res = _hurray(*argv)
        assert "1 tensor," in res.stdout and "1 tensors" not in res.stdout, res.stdout
    two = tmp_path / "two.hurray"
    hb.save(two, {"a": np.ones(2, np.int8), "b": np.ones(2, np.int8)})
    assert "2 entries" in _hurray("inspect", str(two)).stdout


# ------------------------------------------------- convert and verify under attack
# (container.md §7 and §9: convert verifies what it reads; a failed or interrupted
# conversion names the output, leaves no temporary and no traceback.)
def _cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "hurray_bridge", *argv],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hurray {' '.join(argv)} hung for {timeout} s")


def _damaged(tmp_path: pathlib.Path) -> pathlib.Path:
    good = tmp_path / "good.hurray"
    hb.save(good, {"w": np.arange(1000, dtype=np.float32)})
    data = bytearray(good.read_bytes())
    data[container.read_index(good).data_offset + 10] ^= 0xFF
    bad = tmp_path / "bad.hurray"
    bad.write_bytes(data)
    return bad


def test_inspect_says_whether_checksums_were_checked_and_verify_checks_them(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    # A bit-flipped file: inspect read the index only, exited 0, and said "CRC-32 data
    # checksums" as if they had been checked.
    bad = _damaged(tmp_path)
    rc, out, err = run(capsys, "inspect", str(bad))
    assert rc == 0 and err == "", err
    assert out.splitlines()[0].endswith(
        "CRC-32 data checksums, not checked (hurray inspect --verify checks them)"), out
    rc, out, _ = run(capsys, "inspect", "--json", str(bad))
    assert rc == 0 and json.loads(out)["checksums"] == "not checked"
    rc, out, err = run(capsys, "inspect", "--verify", str(bad))
    assert rc == 2 and out == ""
    assert err.startswith(f"hurray: error: {bad}: entries[0].checksum: entry 'w': data "
                          "checksum mismatch"), err
    good = tmp_path / "good.hurray"
    rc, out, _ = run(capsys, "inspect", "--verify", str(good))
    assert rc == 0 and out.splitlines()[0].endswith("CRC-32 data checksums, verified"), out
    rc, out, _ = run(capsys, "inspect", "--verify", "--json", str(good))
    assert json.loads(out)["checksums"] == "verified"
    hb.save(tmp_path / "bare.hurray", {"w": np.ones(3)}, checksums=False)
    rc, out, _ = run(capsys, "inspect", "--verify", "--json", str(tmp_path / "bare.hurray"))
    assert rc == 0 and json.loads(out)["checksums"] == "none"
    rc, out, _ = run(capsys, "inspect", str(tmp_path / "bare.hurray"))
    assert out.splitlines()[0].endswith("no data checksums"), out


def test_inspect_verify_of_safetensors_checks_what_there_is(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    pytest.importorskip("safetensors")
    path = tmp_path / "m.safetensors"
    safetensors_io.save(path, {"w": np.ones(3, np.float32)})
    rc, out, _ = run(capsys, "inspect", "--verify", str(path))
    assert rc == 0 and out.splitlines()[0].endswith(
        "no checksums (the format has none; header and offsets checked)"), out
    rc, out, _ = run(capsys, "inspect", "--json", str(path))
    assert json.loads(out)["checksums"] == "none"


@pytest.mark.parametrize("suffix", [".hurray", ".safetensors"])
def test_convert_refuses_a_damaged_file(capsys: pytest.CaptureFixture[str],
                                        tmp_path: pathlib.Path, suffix: str) -> None:
    bad = _damaged(tmp_path)
    out = tmp_path / f"out{suffix}"
    rc, stdout, err = run(capsys, "convert", str(bad), str(out))
    assert rc == 2 and stdout == ""
    assert err.startswith(f"hurray: error: {bad}: entries[0].checksum") and "--no-verify" in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "bad.hurray", "good.hurray"]
    rc, _, err = run(capsys, "convert", "--no-verify", "-q", str(bad), str(out))
    assert rc == 0 and err == "" and out.exists()  # on purpose: converted as it is


@pytest.mark.parametrize("route", ["hurray->safetensors", "safetensors->hurray",
                                   "hurray->hurray", "npy->hurray"])
def test_convert_no_fsync_skips_the_flushes(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: pathlib.Path, ckpt: pathlib.Path,
                                            route: str) -> None:
    src_fmt, dst_fmt = route.split("->")
    src = {"hurray": ckpt, "safetensors": tmp_path / "in.safetensors",
           "npy": tmp_path / "in.npy"}[src_fmt]
    if src_fmt == "safetensors":
        safetensors_io.hurray_to_safetensors(ckpt, src)
    elif src_fmt == "npy":
        np.save(src, np.arange(10))
    out = tmp_path / f"out.{dst_fmt}"
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    assert run(capsys, "convert", "-q", "--no-fsync", str(src), str(out))[0] == 0
    assert synced == [] and out.exists()
    first = out.read_bytes()
    assert run(capsys, "convert", "-q", str(src), str(out))[0] == 0
    assert len(synced) == (2 if os.name == "posix" else 1)  # durable by default
    assert out.read_bytes() == first


def test_convert_refuses_an_output_named_for_another_format(
        capsys: pytest.CaptureFixture[str], ckpt: pathlib.Path, tmp_path: pathlib.Path) -> None:
    for argv in (["--to", "hurray", str(tmp_path / "x.safetensors")],
                 ["--to", "safetensors", str(tmp_path / "x.hurray")],
                 ["--to", "hurray", str(tmp_path / "x.npy")]):
        rc, _, err = run(capsys, "convert", str(ckpt), *argv[-1:], *argv[:-1])
        assert rc == 2 and err.startswith(f"hurray: error: {argv[-1]}: path: "), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.hurray"]


def _npy(tmp_path: pathlib.Path) -> bytes:
    np.save(tmp_path / "ok.npy", np.arange(10))
    return (tmp_path / "ok.npy").read_bytes()


def _npz(tmp_path: pathlib.Path, **kw: Any) -> bytes:
    np.savez(tmp_path / "ok.npz", a=np.arange(100))
    return (tmp_path / "ok.npz").read_bytes()


def _malformed(kind: str, tmp_path: pathlib.Path) -> tuple[str, bytes, str]:
    """(file name, bytes, a word of the defect's description)"""
    if kind == "npy-unterminated-header":  # tokenize.TokenError inside NumPy
        raw = _npy(tmp_path)
        n = int.from_bytes(raw[8:10], "little")
        return "t.npy", raw[:10] + raw[10:10 + n].replace(b"{", b"{'''", 1) + raw[10 + n:], "npy"
    if kind == "npz-not-a-zip":  # zipfile.BadZipFile
        return "t.npz", _npz(tmp_path)[:50], "zip"
    zip_ = bytearray(_npz(tmp_path))
    if kind == "npz-bad-crc":  # zipfile.BadZipFile while reading a member
        zip_[zip_.find(b"\x93NUMPY") + 200] ^= 0xFF
        return "t.npz", bytes(zip_), "CRC"
    central = zip_.rfind(b"PK\x01\x02")
    if kind == "npz-unknown-compression":  # NotImplementedError
        zip_[central + 10:central + 12] = (99).to_bytes(2, "little")
        return "t.npz", bytes(zip_), "compression"
    assert kind == "npz-encrypted"  # RuntimeError: password required
    zip_[central + 8] |= 1
    return "t.npz", bytes(zip_), "encrypted"


@pytest.mark.parametrize("kind", [
    "npy-unterminated-header",
    # np.load leaves a file it opened open when the bytes after a zip signature are no zip
    # (NpzFile's constructor raises); convert opens the file itself, so nothing is left to
    # the collector's ResourceWarning (an error in this suite).
    "npz-not-a-zip", "npz-bad-crc", "npz-unknown-compression", "npz-encrypted"])
def test_convert_of_malformed_numpy_files_is_a_format_error(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, kind: str) -> None:
    name, data, word = _malformed(kind, tmp_path)
    path = tmp_path / name
    path.write_bytes(data)
    out = tmp_path / "o.hurray"
    rc, stdout, err = run(capsys, "convert", str(path), str(out))  # a traceback fails here
    assert rc == 2 and stdout == "" and not out.exists()
    assert err.startswith(f"hurray: error: {path}: input: cannot read ") and word in err, err
    assert err.count("\n") == 1


def _npy_bytes(a: Any) -> bytes:
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


@pytest.mark.parametrize("names", [("a", "a.npy"), ("a.npy", "a.npy")])
def test_convert_refuses_an_npz_with_two_members_for_one_array(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path,
        names: tuple[str, str]) -> None:
    # np.load lists both as "a": one of the two arrays was dropped without a word.
    import warnings
    import zipfile

    path, out = tmp_path / "dup.npz", tmp_path / "o.hurray"
    with zipfile.ZipFile(path, "w") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        z.writestr(names[0], _npy_bytes(np.arange(3, dtype=np.int32)))
        z.writestr(names[1], _npy_bytes(np.arange(5.0)))
    rc, _, err = run(capsys, "convert", str(path), str(out))
    assert rc == 2 and not out.exists(), err
    assert "two members for the array 'a'" in err and err.count("\n") == 1, err


def test_an_npy_whose_shape_overflows_is_one_line(tmp_path: pathlib.Path) -> None:
    # NumPy printed its overflow RuntimeWarning (two lines) before refusing the size.
    path = tmp_path / "huge.npy"
    np.save(path, np.zeros(4, np.uint8))
    raw = path.read_bytes()
    n = int.from_bytes(raw[8:10], "little")
    head = raw[10:10 + n].replace(b"(4,)", b"(1099511627776, 1099511627776)").rstrip(b" \n")
    head += b" " * (-(10 + len(head) + 1) % 64) + b"\n"
    path.write_bytes(raw[:8] + len(head).to_bytes(2, "little") + head + raw[10 + n:])
    out = _cli("convert", str(path), str(tmp_path / "o.hurray"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "too big" in out.stderr and "Warning" not in out.stderr


def test_convert_with_the_wrong_numpy_from_names_the_right_one(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    # --from npy on an archive made an array of its member names (a "<U1" dtype error).
    np.savez(tmp_path / "two.npz", a=np.arange(3), b=np.ones(2))
    np.save(tmp_path / "one.npy", np.arange(3))
    out = tmp_path / "o.hurray"
    for src, wrong, right in (("two.npz", "npy", "npz"), ("one.npy", "npz", "npy")):
        rc, _, err = run(capsys, "convert", str(tmp_path / src), str(out), "--from", wrong)
        assert rc == 2 and not out.exists(), err
        assert f"--from {right} reads it" in err and err.count("\n") == 1, err


def test_a_safetensors_header_length_that_reads_pk_is_not_a_zip(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    # A header of 0x04034B50 bytes (under safetensors' 100 MB limit) begins the file with
    # "PK\3\4": convert took it for an .npz, verify for safetensors.
    n = 0x04034B50
    head = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    path, out = tmp_path / "pk.safetensors", tmp_path / "pk.hurray"
    path.write_bytes(struct.pack("<Q", n) + head + b" " * (n - len(head))
                     + np.array([1.5, 2.5], np.float32).tobytes())
    rc, _, err = run(capsys, "convert", str(path), str(out), "-q")
    assert rc == 0, err
    np.testing.assert_array_equal(np.asarray(hb.load(out)["a"]), [1.5, 2.5])


_CONVERT_WITH = """
import errno, sys
import numpy as np
import hurray_bridge as hb
from hurray_bridge import __main__ as cli
from hurray_bridge.files import disk as _disk
src, dst, what = sys.argv[1:4]
hb.save(src, {"new": np.arange(3.0)})
hb.save(dst, {"old": np.zeros(1)})
def fail(*args):
    raise KeyboardInterrupt if what.endswith("signal") else OSError(errno.EIO, "I/O error")
if what.startswith("folder flush"):  # after the rename: the new file is in place
    _disk._fsync_dir = fail
else:  # before anything is opened
    cli._sniff = fail
status = cli.main(["convert", src, dst, "-q"])
print(status, list(hb.load(dst)))
"""


@pytest.mark.parametrize("what", ["folder flush, signal", "folder flush, I/O error",
                                  "sniff, signal"])
def test_an_interrupted_or_failed_convert_says_whether_the_output_was_written(
        tmp_path: pathlib.Path, what: str) -> None:
    # A signal during the folder's fsync, after the rename, was reported as "the output
    # was not written" over a file that held the new content; one before the conversion
    # began ended in a traceback.
    src, dst = tmp_path / "in.hurray", tmp_path / "out.hurray"
    out = subprocess.run([sys.executable, "-c", _CONVERT_WITH, str(src), str(dst), what],
                         capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    status, names = out.stdout.split(" ", 1)
    if what.startswith("folder flush"):
        assert names.strip() == "['new']" and "written in full" in out.stderr, out.stderr
        assert int(status) == (130 if what.endswith("signal") else 2), out
    else:
        assert names.strip() == "['old']" and out.stderr == "hurray: interrupted\n"
        assert int(status) == 130


@pytest.mark.parametrize("kind", ["npy", "safetensors", "hurray", "hurray to safetensors"])
def test_convert_refuses_bool8_bytes_that_are_no_bool8_value(
        capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path, kind: str) -> None:
    # The file-to-file paths copy regions they never hold in memory: 0x02 and 0xff went
    # into the output, and hurray verify called it OK.
    to_st = kind == "hurray to safetensors"
    kind = "hurray" if to_st else kind
    src, out = tmp_path / f"b.{kind}", tmp_path / ("o.safetensors" if to_st else "o.hurray")
    if kind == "npy":
        np.save(src, np.frombuffer(bytes([0, 1, 2, 255]), dtype=np.bool_))
    elif kind == "safetensors":
        h = b'{"a":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}}'
        src.write_bytes(struct.pack("<Q", len(h)) + h + bytes([0, 1, 2, 255]))
    else:  # a Hurray file without checksums whose data was changed after it was written
        hb.save(src, {"a": np.array([False, True, True, True])}, checksums=False)
        raw = bytearray(src.read_bytes())
        at = container.read_index(src).data_offset
        assert raw[at:at + 4] == b"\x00\x01\x01\x01"
        raw[at + 2:at + 4] = b"\x02\xff"
        src.write_bytes(bytes(raw))
    rc, _, err = run(capsys, "convert", str(src), str(out))
    assert rc == 2 and not out.exists(), err
    assert "bool8 element 2 holds the byte 0x02" in err and err.count("\n") == 1, err


@pytest.mark.skipif(os.name != "posix", reason="FIFOs are POSIX")
def test_commands_refuse_a_fifo_instead_of_hanging(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "pipe.hurray"
    os.mkfifo(fifo)  # no writer: opening it to read would wait forever
    for argv in (["inspect", str(fifo)], ["verify", str(fifo)],
                 ["convert", str(fifo), str(tmp_path / "o.hurray")],
                 ["convert", str(fifo), str(tmp_path / "o.hurray"), "--from", "npy"],
                 ["convert", str(tmp_path / "pipe.hurray"), str(tmp_path / "x.safetensors")]):
        res = _cli(*argv, timeout=30)
        assert res.returncode == 2 and "FIFO" in res.stderr, (argv, res)
        assert "Traceback" not in res.stderr
    hb.save(tmp_path / "c.hurray", {"w": np.ones(2)})
    res = _cli("convert", str(tmp_path / "c.hurray"), str(fifo), "--to", "hurray", timeout=30)
    assert res.returncode == 2 and "FIFO" in res.stderr and str(fifo) in res.stderr, res
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 1 MiB tmpfs of the test's own, unmounted after it."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("route", ["safetensors->hurray", "hurray->hurray",
                                   "hurray->safetensors", "npy->hurray"])
def test_convert_onto_a_full_disk(tmp_path: pathlib.Path, small_disk: pathlib.Path,
                                  route: str) -> None:
    src_fmt, dst_fmt = route.split("->")
    big = np.arange(1 << 19, dtype=np.float32)  # 2 MiB: twice the disk
    src = tmp_path / f"in.{src_fmt}"
    if src_fmt == "npy":
        np.save(src, big)
    else:
        hb.save(tmp_path / "in.hurray", {"w": big})
        if src_fmt == "safetensors":
            safetensors_io.hurray_to_safetensors(tmp_path / "in.hurray", src)
    out = small_disk / f"o.{dst_fmt}"
    hb.save(small_disk / "o.hurray", {"old": np.ones(4)})
    if dst_fmt == "safetensors":
        safetensors_io.hurray_to_safetensors(small_disk / "o.hurray", out)
        (small_disk / "o.hurray").unlink()
    before = out.read_bytes()
    res = _cli("convert", str(src), str(out))
    assert res.returncode == 2, res
    assert res.stderr.startswith(f"hurray: error: {out}: No space left on device"), res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("\n") == 1
    assert out.read_bytes() == before  # the old output, intact
    assert sorted(p.name for p in small_disk.iterdir()) == [out.name]  # no temporary


SLOW_CONVERT = """
import os, sys, time
from hurray_bridge.files import disk as _disk
from hurray_bridge.__main__ import main
real, calls = os.write, [0]
def slow(fd, data):
    calls[0] += 1
    n = real(fd, data)
    if calls[0] == 2:
        print("writing", flush=True)
        time.sleep(60)
    return n
os.write = slow
_disk.interruptible(slow)  # it stands for os.write, blocked inside write_all
sys.exit(main(["convert", "-q", sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_convert_leaves_no_temporary(tmp_path: pathlib.Path, sig: int) -> None:
    hb.save(tmp_path / "in.hurray", {"w": np.arange(1 << 20, dtype=np.float32)})
    src = tmp_path / "in.safetensors"
    safetensors_io.hurray_to_safetensors(tmp_path / "in.hurray", src)
    out = tmp_path / "out.hurray"
    hb.save(out, {"old": np.ones(3)})
    before = out.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, str(src), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert err.startswith(f"hurray: error: {out}: interrupted by {signal.Signals(sig).name}")
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.hurray", "in.safetensors",
                                                          "out.hurray"]


SLOW_READ = """
import faulthandler, sys, time
faulthandler.dump_traceback_later(45, exit=True)  # a hang shows where it is (seen once in CI)
from hurray_bridge.files import engine
from hurray_bridge.__main__ import main
engine._THREADED_CRC_BYTES = 0  # the reads on their thread, even for a small file
engine.CHUNK = 1 << 16
real, calls = engine.pread_into, [0]
def slow(fd, view, offset):
    calls[0] += 1
    if calls[0] == 3:
        print("reading", flush=True)
        time.sleep(3)  # the main thread waits for this read when the signal comes
    return real(fd, view, offset)
engine.pread_into = slow
sys.exit(main(["convert", "-q", sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("direction", ["to hurray", "to safetensors"])
def test_a_convert_interrupted_while_a_helper_thread_reads_leaves_no_temporary(
        tmp_path: pathlib.Path, sig: int, direction: str) -> None:
    from hurray_bridge import safetensors_io

    hb.save(tmp_path / "in.hurray", {"w": np.arange(1 << 18, dtype=np.float32)})
    src = tmp_path / "in.hurray"
    out = tmp_path / "out.safetensors"
    if direction == "to hurray":
        src = tmp_path / "in.safetensors"
        safetensors_io.hurray_to_safetensors(tmp_path / "in.hurray", src)
        out = tmp_path / "out.hurray"
        hb.save(out, {"old": np.ones(3)})
    else:
        safetensors_io.save(out, {"old": np.ones(3)})
    before = out.read_bytes()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_READ, str(src), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "reading"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sys.stderr.write(err)  # whole in the report of a failure (the assertion's is cut short)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    assert err.startswith(f"hurray: error: {out}: interrupted by {signal.Signals(sig).name}")
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"in.hurray", src.name, out.name})


SIGNAL_IN_A_CALLBACK = """
import os, signal, sys, weakref
from hurray_bridge.files import engine
from hurray_bridge.__main__ import main
engine.CHUNK = 1 << 16
real, calls = engine.pread_into, [0]
class Thing:
    pass
def in_a_callback(_ref):
    os.kill(os.getpid(), int(sys.argv[3]))
    for _ in range(1000):  # the handler runs here, inside the callback
        pass
def read(fd, view, offset):
    calls[0] += 1
    if calls[0] == 3:
        thing = Thing()
        ref = weakref.ref(thing, in_a_callback)
        del thing  # the callback runs now, and the signal arrives inside it
    return real(fd, view, offset)
engine.pread_into = read
sys.exit(main(["convert", "-q", sys.argv[1], sys.argv[2]]))
"""


@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_that_arrives_inside_a_weakref_callback_still_stops_the_convert(
        tmp_path: pathlib.Path, sig: int) -> None:
    """A handler that raised at once raised there, where Python prints the exception and
    carries on: the conversion ran to its end and replaced the output (exit 0)."""
    from hurray_bridge import safetensors_io

    safetensors_io.save(tmp_path / "in.safetensors",
                        {"w": np.arange(1 << 18, dtype=np.float32)})
    out = tmp_path / "out.hurray"
    hb.save(out, {"old": np.ones(3)})
    before = out.read_bytes()
    proc = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_CALLBACK,
                           str(tmp_path / "in.safetensors"), str(out), str(int(sig))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + sig, (proc.returncode, proc.stderr)
    assert proc.stderr.startswith(
        f"hurray: error: {out}: interrupted by {signal.Signals(sig).name}"), proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors", "out.hurray"]


def test_a_signal_after_the_last_chunk_is_reported_with_the_output_written(
        tmp_path: pathlib.Path) -> None:
    """Noted too late to stop anything: the exit status says a signal came, the message
    that the output is complete."""
    code = ("import os, signal, sys\n"
            "from hurray_bridge.files import safetensors\n"
            "from hurray_bridge.__main__ import main\n"
            "real = safetensors.write_plan\n"
            "def write(*a, **k):\n"
            "    real(*a, **k)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    for _ in range(1000):\n"
            "        pass\n"
            "safetensors.write_plan = write\n"
            "sys.exit(main(['convert', '-q', sys.argv[1], sys.argv[2]]))\n")
    from hurray_bridge import safetensors_io

    safetensors_io.save(tmp_path / "in.safetensors", {"w": np.arange(8, dtype=np.float32)})
    out = tmp_path / "out.hurray"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.safetensors"),
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr)
    assert proc.stderr == (f"hurray: error: {out}: interrupted by SIGTERM as the conversion "
                           "ended; the output was written in full\n")
    assert np.array_equal(np.from_dlpack(hb.load(out)["w"]), np.arange(8, dtype=np.float32))


SELF_SIGNAL = """
import os, signal, sys
from hurray_bridge.files import convert, safetensors
from hurray_bridge.__main__ import main
if sys.argv[4] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a shell starts
module = {"convert": convert, "safetensors": safetensors}[sys.argv[3].split(".")[0]]
name = sys.argv[3].split(".")[1]
real = getattr(module, name)
def patched(*a, **k):
    os.kill(os.getpid(), int(sys.argv[5]))  # noted here: not one of the file calls
    for _ in range(1000):
        pass
    return real(*a, **k)
setattr(module, name, patched)
sys.exit(main(["convert", "-q", sys.argv[1], sys.argv[2]]))
"""


def _self_signal(src: pathlib.Path, out: pathlib.Path, where: str, sig: int,
                 ignored: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SELF_SIGNAL, str(src), str(out), where,
                           "ignored" if ignored else "handled", str(int(sig))],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_signal_while_a_file_of_empty_tensors_is_planned_stops_before_the_rename(
        tmp_path: pathlib.Path) -> None:
    """No data chunk, so no progress call: the planning loop and the rename are checkpoints.
    (Without them the conversion ran on, replaced the output, and said it had ended.)"""
    from hurray_bridge import safetensors_io

    safetensors_io.save(tmp_path / "in.safetensors",
                        {f"t{i}": np.zeros((0,), np.float32) for i in range(3000)})
    out = tmp_path / "out.hurray"
    hb.save(out, {"old": np.ones(3)})
    before = out.read_bytes()
    proc = _self_signal(tmp_path / "in.safetensors", out, "convert.plan_items", signal.SIGTERM)
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    assert proc.stderr == (f"hurray: error: {out}: interrupted by SIGTERM; the output was not "
                           "written (an earlier file of that name is unchanged)\n")
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors", "out.hurray"]


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_signal_before_an_input_error_is_reported_as_the_interruption(
        tmp_path: pathlib.Path) -> None:
    hb.save(tmp_path / "in.hurray", {"c": np.ones(3, np.complex128)})  # no safetensors type
    out = tmp_path / "out.safetensors"
    proc = _self_signal(tmp_path / "in.hurray", out, "safetensors.verify_file",
                        signal.SIGTERM)
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    assert "interrupted by SIGTERM; the output was not written" in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_signal_the_process_inherited_as_ignored_stays_ignored(tmp_path: pathlib.Path) -> None:
    """A shell starts a background job with SIGINT ignored (and nohup SIGHUP): the
    conversion must not start handling it."""
    from hurray_bridge import safetensors_io

    safetensors_io.save(tmp_path / "in.safetensors", {"w": np.arange(64, dtype=np.float32)})
    out = tmp_path / "out.hurray"
    proc = _self_signal(tmp_path / "in.safetensors", out, "convert.plan_items", signal.SIGINT,
                        ignored=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stderr == ""
    assert np.array_equal(np.from_dlpack(hb.load(out)["w"]), np.arange(64, dtype=np.float32))


def test_a_progress_bar_that_cannot_draw_does_not_stop_the_conversion(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, ckpt: pathlib.Path) -> None:
    import hurray_bridge.__main__ as cli

    class BrokenTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

        def write(self, s: str) -> int:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(cli, "_PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(sys, "stderr", BrokenTerminal())
    out = tmp_path / "o.safetensors"
    assert main(["convert", str(ckpt), str(out)]) == 0
    monkeypatch.undo()
    assert safetensors_io.read_header(out).entries


@pytest.mark.skipif(os.name != "posix", reason="process ids")
def test_verify_reports_the_temporary_of_a_killed_save(capsys: pytest.CaptureFixture[str],
                                                       ckpt: pathlib.Path, dead_pid: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The fixture's save scanned this folder; on a loaded machine that scan can take over a
    # millisecond, and saves then skip the folder for a while (by design). Forget it.
    monkeypatch.setattr(_disk, "_SCANS", {})
    pid = dead_pid
    stale = ckpt.parent / f".{ckpt.name}.{pid}-{_disk._host_tag()}-0123456789ab.tmp"
    stale.write_bytes(bytes(5000))
    rc, out, err = run(capsys, "verify", str(ckpt))
    assert rc == 0 and out.startswith(f"{ckpt}: OK")
    assert err.startswith(f"hurray: warning: {stale}: ") and f"pid {pid}" in err, err
    assert "5000 bytes" in err and stale.exists()  # reported, not removed: verify only reads
    hb.save(ckpt, {"w": np.ones(2)})  # the next save removes it
    assert not stale.exists()


# ------------------------------------------------- hostile names on a terminal
_HOSTILE_NAMES = [
    "title\x1b]0;pwned\x07",  # sets the terminal's title
    "clear\x1b[2J\x1b[H",  # clears the screen
    "forged\r\nother.hurray: OK (0 entries)",  # a line of its own
    "bidi\u202egnp.exe",  # right-to-left override
    "c1\x9b31m",  # a C1 control sequence introducer
    "del\x7f nbsp\xa0 lsep\u2028 psep\u2029 zwsp\u200b",
]


def _st_bytes(header: dict[str, Any] | bytes, data: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def _only_printable(text: str) -> None:
    for line in text.splitlines():
        assert line.isprintable(), repr(line)
    assert "\r" not in text


def test_every_human_readable_output_escapes_what_a_file_or_folder_name_holds(
        tmp_path: pathlib.Path) -> None:
    entries = {n: {"dtype": "U8", "shape": [1], "data_offsets": [i, i + 1]}
               for i, n in enumerate(_HOSTILE_NAMES)}
    header = {"__metadata__": {"key\x1b[2J": "value\r\nother.hurray: OK (0 entries)"},
              **entries}
    folder = tmp_path / "dir\x1b]0;x\x07"
    folder.mkdir()
    st = folder / "m\r\nother.hurray: OK.safetensors"
    st.write_bytes(_st_bytes(header, bytes(len(entries))))
    hy = folder / "h\x1b[2J.hurray"
    assert _cli("convert", "-q", str(st), str(hy)).returncode == 0
    for argv in (["inspect", str(st)], ["inspect", str(hy)], ["verify", str(st), str(hy)],
                 ["convert", str(st), str(folder / "o\x1b[2J.hurray")]):
        res = _cli(*argv)
        assert res.returncode == 0, res.stderr
        _only_printable(res.stdout)
        _only_printable(res.stderr)
        assert not any(line.startswith("other.hurray") for line in res.stdout.splitlines())
        if argv[0] == "inspect":
            assert "\\x1b]0;pwned\\x07" in res.stdout and "\\r\\nother.hurray" in res.stdout
            assert "\\u202e" in res.stdout and "\\x9b" in res.stdout
            assert "\\x7f nbsp\\xa0 lsep\\u2028 psep\\u2029 zwsp\\u200b" in res.stdout
            assert "key\\x1b[2J = value\\r\\nother.hurray: OK (0 entries)" in res.stdout
    # errors and warnings name the file as escapes too
    bad = folder / "bad\x1b[2J\r\nx.hurray"
    bad.write_bytes(b"garbage")
    hb.save(folder / "s.hurray", {"w": np.ones(1)})
    (folder / ".s.hurray.\x1b[2J.tmp").write_bytes(b"")
    for argv in (["inspect", str(bad)], ["verify", str(bad)], ["verify", str(folder / "s.hurray")],
                 ["convert", str(bad), str(tmp_path / "o.hurray")]):
        res = _cli(*argv)
        _only_printable(res.stdout)
        _only_printable(res.stderr)
        if argv[1] == str(bad):
            assert res.returncode == 2 and len(res.stderr.splitlines()) == 1, res.stderr
            assert "bad\\x1b[2J\\r\\nx.hurray" in res.stderr


@pytest.mark.parametrize("header, words", [
    (b'{"a\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "lone surrogate"),
    (b'{"__metadata__":{"k":"\\udfff"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
     "lone surrogate"),
    (b'\xef\xbb\xbf{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "byte order mark"),
])
def test_a_name_that_cannot_be_printed_or_a_bom_is_one_line_and_exit_2(
        tmp_path: pathlib.Path, header: bytes, words: str) -> None:
    path = tmp_path / "s.safetensors"
    path.write_bytes(_st_bytes(header, b"\0"))
    for argv in (["inspect", str(path)], ["verify", str(path)],
                 ["convert", str(path), str(tmp_path / "o.hurray")]):
        res = _cli(*argv)
        assert res.returncode == 2, (argv, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and words in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and "not a Hurray file" not in res.stderr
        _only_printable(res.stderr)
    assert not (tmp_path / "o.hurray").exists()
