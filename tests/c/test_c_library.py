"""The C library (c/): built with make, checked against the Python reference.

The C side prints what it decoded, read or wrote; the assertions here compare that with
what hurray_bridge computes for the same bytes, so every check is a comparison of two
implementations of docs/spec/metadata.md and docs/spec/container.md:

* the golden vectors, descriptors byte for byte and files field for field;
* the decoder and the file parser on thousands of mutated inputs, field name for field name;
* Python -> C -> Python (`hurray-c copy` of files that hb.save wrote) and C -> Python (files
  the C writer built from its own API), for every element type, layout, empty tensors,
  scalars and rank 64;
* the same C tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
* the libFuzzer targets for a bounded time, when clang is installed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container, wire
from hurray_bridge.files import plan as planning
from tests.hurray_bridge.test_container import assert_data_region_rule
from tests.hurray_bridge.test_wire import with_index_type

ROOT = pathlib.Path(__file__).resolve().parents[2]
CDIR = ROOT / "c"
VECTORS = ROOT / "tests" / "vectors"
FILES = VECTORS / "files"
CC = shutil.which("cc") or shutil.which("gcc")
CLANG = shutil.which("clang")
MAKE = shutil.which("make")

pytestmark = [
    pytest.mark.skipif(CC is None, reason="no C compiler"),
    pytest.mark.skipif(MAKE is None, reason="no make (the C library builds with make)"),
]

np = pytest.importorskip("numpy")
FUZZ_SECONDS = int(os.environ.get("HURRAY_C_FUZZ_SECONDS", "20"))
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:abort_on_error=0",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


# ------------------------------------------------------------------------------ builds
def _make(build: pathlib.Path, *targets: str, **variables: str) -> None:
    args = [MAKE or "make", "-C", str(CDIR), f"BUILD={build}", *targets,
            *(f"{k}={v}" for k, v in variables.items())]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


def _sanitizers_available(tmp: pathlib.Path) -> bool:
    src = tmp / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    proc = subprocess.run([CC or "cc", "-fsanitize=address,undefined", str(src), "-o",
                           str(tmp / "probe")], capture_output=True)
    return proc.returncode == 0


# c_build (tests/conftest.py): `make -C c all test example`, once per session.


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    tmp = tmp_path_factory.mktemp("c-asan")
    if not _sanitizers_available(tmp):
        pytest.skip("the C compiler has no AddressSanitizer/UBSan runtime")
    _make(tmp / "build", "test", SAN="1")
    return tmp / "build"


@pytest.fixture(params=["plain", "asan"])
def driver(request: pytest.FixtureRequest) -> Iterator[tuple[pathlib.Path, dict[str, str]]]:
    """The C test driver, plain and sanitized, with the environment to run it in."""
    if request.param == "plain":
        build = request.getfixturevalue("c_build")
        env = dict(os.environ)
    else:
        build = request.getfixturevalue("asan_build")
        env = {**os.environ, **SAN_ENV}
    yield build / "test_hurray", env


def _run(exe: pathlib.Path | str, *args: str, stdin: str | None = None,
         env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    assert "runtime error" not in proc.stderr and "Sanitizer" not in proc.stderr, proc.stderr
    return proc.stdout


# ------------------------------------------------------------------------------ build
def test_make_builds_the_library_the_shared_library_and_the_tool(c_build: pathlib.Path) -> None:
    for name in ("libhurray.a", "libhurray.so", "hurray-c"):
        assert (c_build / name).exists(), name
    lib = ctypes.CDLL(str(c_build / "libhurray.so"))
    lib.hry_library_version.restype = ctypes.c_uint32
    assert lib.hry_library_version() == 0x020000
    # the C CRC-32 is zlib's
    lib.hry_crc32.restype = ctypes.c_uint32
    lib.hry_crc32.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]
    data = bytes(random.Random(1).randrange(256) for _ in range(10_007))
    assert lib.hry_crc32(0, data, len(data)) == zlib.crc32(data)
    # only the API is exported
    proc = subprocess.run(["nm", "-D", "--defined-only", str(c_build / "libhurray.so")],
                          capture_output=True, text=True)
    if proc.returncode == 0:
        names = {ln.split()[-1] for ln in proc.stdout.splitlines() if ln.strip()}
        api = {n for n in names if re.fullmatch(r"hry_[a-z0-9_]+", n) and "__" not in n}
        assert "hry_decode" in api and not {n for n in names if n.startswith("hry__")}


@pytest.mark.skipif(CLANG is None, reason="clang is not installed (gcc is tested above)")
def test_clang_builds_everything_without_a_warning(tmp_path: pathlib.Path) -> None:
    _make(tmp_path / "build", "all", "test", "example", CC=CLANG or "clang")
    out = _ok(_run(tmp_path / "build" / "test_hurray", "unit", str(tmp_path)))
    assert out.strip().endswith(" 0 failures")


def test_c_unit_checks(driver: tuple[pathlib.Path, dict[str, str]],
                       tmp_path: pathlib.Path) -> None:
    exe, env = driver
    out = _ok(_run(exe, "unit", str(tmp_path), env=env))
    m = re.fullmatch(r"(\d+) checks, (\d+) failures\n", out)
    assert m is not None, out
    n, failed = map(int, m.groups())
    assert failed == 0 and n > 1000


# ------------------------------------------------------------------------------ vectors
def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_descriptor_vectors_byte_for_byte(driver: tuple[pathlib.Path, dict[str, str]]) -> None:
    exe, env = driver
    rows = {r["name"]: r for r in _lines(_ok(_run(exe, "vectors", str(VECTORS), env=env)))}
    names = sorted(p.stem for p in VECTORS.glob("*.bin"))
    assert sorted(rows) == names
    for name in names:
        row = rows[name]
        assert "error" not in row, (name, row)
        expected = json.loads((VECTORS / f"{name}.json").read_text())
        assert row["fields"] == expected, name
        raw = (VECTORS / f"{name}.bin").read_bytes()
        assert bytes.fromhex(row["canonical"]) == raw, name
        assert row["layout"] == [[r, n] for r, _, n in expected["buffers"]], name
        if expected["dynamic"]:
            assert row["resolved_with_0"] is True


def _dlpack_expected(e: container.EntryInfo, data_offset: int) -> dict[str, Any]:
    """What the C hand-out must give for an entry, from the Python reading of the file."""
    d = e.descriptor
    if d.layout not in (hb.Layout.ROW_MAJOR, hb.Layout.STRIDED) or d.quantization is not None:
        return {"error": 2, "field": f"entries[{e.position}].layout"}
    if d.dtype.dlpack is None:
        return {"error": 2, "field": f"entries[{e.position}].dtype"}
    strides = list(d.strides_or_compact)
    item = d.dtype.itemsize
    origin = sum((n - 1) * -s for n, s in zip(d.shape, strides, strict=True) if s < 0)
    data = None if d.is_empty else data_offset + e.buffers[0].offset + origin * item
    return {"ndim": d.rank, "code": int(d.dtype.dlpack[0]), "bits": d.dtype.dlpack[1],
            "lanes": 1, "flags": 1 | (4 if d.padded else 0), "device": [1, 0],
            "byte_offset": 0, "version": [1, 3], "data": data, "shape": list(d.shape),
            "strides": strides}


def test_file_vectors(driver: tuple[pathlib.Path, dict[str, str]]) -> None:
    exe, env = driver
    rows = {r["name"]: r for r in _lines(_ok(_run(exe, "files", str(FILES), env=env)))}
    names = sorted(p.stem for p in FILES.glob("*.hurray"))
    assert sorted(rows) == names
    for name in names:
        row = rows[name]
        assert "error" not in row, (name, row)
        expected = json.loads((FILES / f"{name}.json").read_text())
        report = row["report"]
        dl = [entry.pop("dlpack") for entry in report["entries"]]
        assert report == expected, name
        assert row["reserialized_identical"] is True, name  # the C writer = hb.save
        assert row["memory_open_ok"] is True, name
        idx = container.read_index(FILES / f"{name}.hurray")
        assert dl == [_dlpack_expected(e, idx.data_offset) for e in idx.entries], name


# ------------------------------------------------------------------------------ decoder
def _random_descriptor(rng: random.Random) -> hb.Descriptor | None:
    """A valid descriptor with every kind of section, or None when the draw overflows."""
    dtypes = hb.dtypes.all_dtypes()
    rank = rng.choice([0, 1, 2, 3, 4, rng.randint(0, 64)])
    layout = rng.choice(list(hb.Layout)) if rank else hb.Layout.ROW_MAJOR
    if layout in (hb.Layout.CSR, hb.Layout.CSC):
        rank = 2
    dtype = rng.choice(dtypes)
    padded = dtype.is_subbyte and rng.random() < 0.5
    dynamic_ok = layout != hb.Layout.STRIDED and rng.random() < 0.3

    def dim() -> int:
        r = rng.random()
        if dynamic_ok and r < 0.15:
            return hb.DYNAMIC
        if r < 0.3:
            return 0
        return rng.choice([1, 2, 3, 5, 7, 64, 1000, 2**20])

    shape = [dim() for _ in range(rank)] if rank <= 8 else [
        rng.choice([1, 1, 1, 2]) for _ in range(rank)]
    kw: dict[str, Any] = {}
    if layout == hb.Layout.STRIDED:
        padded = padded or dtype.is_subbyte
        kw["strides"] = [rng.randint(-40, 40) for _ in range(rank)]
    elif layout == hb.Layout.TILED:
        k = rng.randint(1, rank)
        kw["tile"] = [rng.randint(1, 9) for _ in range(k)]
    elif layout.is_sparse:
        kw["sparse"] = hb.Sparse(rng.choice([0, 1, 3, 17]),
                                 rng.choice([hb.int8, hb.int32, hb.int64, hb.uint16, hb.uint64]),
                                 False)
    quantizable = dtype.kind in (hb.dtypes.Kind.INT, hb.dtypes.Kind.UINT) or (
        dtype.kind == hb.dtypes.Kind.FLOAT and dtype.bits <= 8 and dtype is not hb.float8_e8m0fnu)
    static_axes = [i for i, d in enumerate(shape) if d != hb.DYNAMIC]
    if quantizable and rng.random() < 0.4:
        scheme = rng.choice(list(hb.QuantScheme))
        scale = rng.choice([hb.float32, hb.float16, hb.bfloat16, hb.float8_e8m0fnu])
        zp = rng.choice([None, hb.int8, hb.uint8, hb.int32, hb.float16])
        if scheme == hb.QuantScheme.PER_TENSOR:
            kw["quantization"] = hb.Quantization(scheme, scale, zp)
        elif static_axes:
            kw["quantization"] = hb.Quantization(
                scheme, scale, zp, rng.choice(static_axes),
                rng.choice([1, 2, 32, 1000]) if scheme == hb.QuantScheme.PER_BLOCK else None)
    if hb.DYNAMIC not in shape and rng.random() < 0.3:
        offsets = [rng.randint(0, 3) for _ in shape]
        glob = [o + n + rng.randint(0, 2) for o, n in zip(offsets, shape, strict=True)]
        kw["shard"] = hb.Shard(tuple(glob), tuple(offsets), rng.randint(0, 9), rng.choice([1, 2]),
                               rng.randint(0, 3))
    try:
        return hb.Descriptor(tuple(shape), dtype, layout, padded=padded, **kw)
    except hb.FormatError:
        return None


_INTERESTING64 = [0, 1, 2, 7, 8, 63, 64, 65, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 2,
                  2**64 - 1]


def _mutations(raw: bytes, rng: random.Random, budget: int) -> Iterator[bytes]:
    """Single-byte changes, interesting words at 8-byte boundaries, cuts, extensions."""
    n = len(raw)
    for _ in range(budget):
        kind = rng.random()
        buf = bytearray(raw)
        if kind < 0.45 and n:
            i = rng.randrange(n)
            buf[i] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF, buf[i] ^ 1, buf[i] ^ 0x80,
                                 rng.randrange(256)])
        elif kind < 0.75 and n >= 8:
            i = rng.randrange(n // 8) * 8
            width = rng.choice([1, 2, 4, 8])
            value = rng.choice(_INTERESTING64) & ((1 << (8 * width)) - 1)
            at = i + rng.choice([0, 4]) if width == 4 else i
            buf[at:at + width] = value.to_bytes(width, "little")
            del buf[n:]
        elif kind < 0.9:
            del buf[rng.randrange(n + 1):]
        else:
            buf += bytes(rng.choice([8, 24, 16]))
        yield bytes(buf)


def _py_decode(raw: bytes, prefix: bool) -> str:
    try:
        if prefix:
            d, table, size = wire.decode_prefix(raw)
        else:
            wire.decode(raw)
            d, table, size = wire.decode_prefix(raw)
    except hb.FormatError as exc:
        return f"err {exc.field}"
    return f"ok {size} {wire.encode(d, [b.offset for b in table]).hex()}"


@pytest.fixture(scope="module")
def decoder_inputs() -> list[bytes]:
    rng = random.Random(20240521)
    seeds = [p.read_bytes() for p in sorted(VECTORS.glob("*.bin"))]
    made = 0
    while made < 300:
        d = _random_descriptor(rng)
        if d is not None:
            seeds.append(d.to_bytes())
            made += 1
    inputs = list(seeds)
    for raw in seeds[:20]:  # the golden vectors: every byte, three ways
        for i in range(len(raw)):
            for v in {0, 0xFF, raw[i] ^ 1}:
                inputs.append(raw[:i] + bytes([v]) + raw[i + 1:])
        inputs += [raw[:k] for k in range(len(raw))]
    for raw in seeds:
        inputs += list(_mutations(raw, rng, 40))
    inputs += [bytes(rng.randrange(256) for _ in range(rng.choice([31, 32, 56, 100])))
               for _ in range(300)]
    return inputs


@pytest.mark.parametrize("prefix", [False, True], ids=["strict", "prefix"])
def test_decoder_agrees_with_python_field_for_field(
        driver: tuple[pathlib.Path, dict[str, str]], decoder_inputs: list[bytes],
        prefix: bool) -> None:
    exe, env = driver
    stdin = "".join(raw.hex() + "\n" for raw in decoder_inputs)
    got = _ok(_run(exe, "decode", *(["prefix"] if prefix else []), stdin=stdin,
                   env=env)).splitlines()
    assert len(got) == len(decoder_inputs)
    accepted = 0
    for raw, c_line in zip(decoder_inputs, got, strict=True):
        py = _py_decode(raw, prefix)
        assert c_line == py, f"input {raw.hex()}: C says {c_line!r}, Python {py!r}"
        accepted += py.startswith("ok")
    assert 300 < accepted < len(decoder_inputs) - 1000  # both outcomes well exercised


def test_an_index_type_too_narrow_is_refused_as_python_refuses_it(
        driver: tuple[pathlib.Path, dict[str, str]]) -> None:
    """memory-layout.md §5.1: INDPTR ends at nnz and an index reaches a dimension's size - 1;
    a type that cannot hold them is refused (field sparse.index_dtype), by both decoders."""
    exe, env = driver
    cases = [(hb.Layout.CSR, [2, 2], 200, hb.int8), (hb.Layout.CSR, [2, 2], 127, hb.int8),
             (hb.Layout.CSC, [2, 2], 256, hb.uint8), (hb.Layout.CSC, [2, 2], 255, hb.uint8),
             (hb.Layout.CSR, [2, 129], 1, hb.int8), (hb.Layout.CSR, [129, 128], 1, hb.int8),
             (hb.Layout.CSC, [300, 2], 1, hb.uint8), (hb.Layout.COO, [3, 2**15 + 1], 1, hb.int16),
             (hb.Layout.COO, [3, 2**15], 1, hb.int16), (hb.Layout.COO, [300], 0, hb.int8),
             (hb.Layout.COO, [2**63 + 1], 1, hb.int64), (hb.Layout.COO, [2**63 + 1], 1, hb.uint64),
             (hb.Layout.CSR, [3, hb.DYNAMIC], 2, hb.int8)]
    inputs = []
    for layout, shape, nnz, itype in cases:
        wide = hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(nnz, hb.uint64))
        inputs.append(with_index_type(wide, itype))  # as a writer that does not check has it
    got = _ok(_run(exe, "decode", stdin="".join(r.hex() + "\n" for r in inputs),
                   env=env)).splitlines()
    want = [_py_decode(r, False) for r in inputs]
    assert got == want
    assert [w.split()[0] for w in want] == ["err", "ok", "err", "ok", "err", "ok", "err", "err",
                                            "ok", "ok", "err", "ok", "ok"]
    assert {w for w in want if w.startswith("err")} == {"err sparse.index_dtype"}


# ------------------------------------------------------------------------------ files
def _reseal(data: bytes) -> bytes:
    """Recompute the header and index CRCs: the container fuzz target's own resealer."""
    from tests.fuzz.test_fuzz_readers import _load

    resealed: bytes = _load("container").reseal(data)
    return resealed


def _py_check(data: bytes) -> str:
    try:
        hb.loads(data, verify=True)
    except hb.FormatError as exc:
        return f"err {exc.field}"
    return "ok"


def _file_mutations(rng: random.Random) -> list[bytes]:
    out = []
    for path in sorted(FILES.glob("*.hurray")):
        raw = path.read_bytes()
        index_end = 128 + struct.unpack_from("<Q", raw, 24)[0] + struct.unpack_from(
            "<Q", raw, 40)[0]
        out.append(raw)
        for m in _mutations(raw[:index_end], rng, 60):
            out.append(_reseal(m + raw[index_end:]) if len(m) == index_end else _reseal(m))
        for _ in range(6):  # data and padding bytes (found by verify only)
            i = rng.randrange(len(raw))
            out.append(raw[:i] + bytes([raw[i] ^ 0x40]) + raw[i + 1:])
    return out


def test_file_parser_agrees_with_python_field_for_field(
        driver: tuple[pathlib.Path, dict[str, str]], tmp_path: pathlib.Path) -> None:
    exe, env = driver
    files = _file_mutations(random.Random(7))
    paths = []
    for k, data in enumerate(files):
        p = tmp_path / f"m{k}.hurray"
        p.write_bytes(data)
        paths.append(str(p))
    got = _ok(_run(exe, "check-files", stdin="".join(p + "\n" for p in paths),
                   env=env)).splitlines()
    assert len(got) == len(files)
    for data, path, c_line in zip(files, paths, got, strict=True):
        assert not c_line.startswith("mismatch"), (path, c_line)  # path and memory agree
        assert c_line == _py_check(data), (path, c_line)
    assert sum(line == "ok" for line in got) >= 17


def _shard_files() -> list[bytes]:
    """Files of shard entries NAME[k], each written as it is (by a writer that does not check
    the sets): valid sets and every rule of a set broken."""
    a = np.arange(48, dtype=np.float32).reshape(6, 8)
    halves = hb.split(a, hb.grid_boxes(a.shape, (2, 1))).shards
    top = hb.split(a, [((0, 0), (4, 8)), ((4, 0), (2, 8))]).shards[0]
    bottom = hb.split(a, [((0, 0), (3, 8)), ((3, 0), (3, 8))]).shards[1]
    narrow = hb.split(a[:, :4], hb.grid_boxes((6, 4), (2, 1))).shards[1]
    wide = hb.split(a.astype(np.float64), hb.grid_boxes(a.shape, (2, 1))).shards[1]
    replicas = hb.split(a, [((0, 0), (6, 8))] * 2).shards
    empty = hb.split(a, [((0, 0), (6, 8)), ((0, 0), (0, 8)), ((0, 0), (0, 8))]).shards
    scalar = hb.split(np.float32(3), [((), ())]).shards[0]
    sets: list[list[tuple[str, hb.Tensor]]] = [
        [("w[0]", halves[0]), ("w[1]", halves[1])],              # complete
        [("w[1]", halves[1])],                                    # partial
        [("w[0]", replicas[0]), ("w[1]", replicas[1])],          # two replica ids
        [("w[0]", empty[0]), ("w[1]", empty[1]), ("w[2]", empty[2])],  # empty twice
        [("w[0]", halves[0]), ("w[1]", halves[0])],              # one box twice
        [("w[0]", scalar), ("w[1]", scalar)],                    # a scalar twice
        [("w[0]", top), ("w[1]", bottom)],                        # overlap
        [("w[0]", halves[0]), ("w[1]", narrow)],                  # another global shape
        [("w[0]", halves[0]), ("w[1]", wide)],                    # another element type
        [("w", halves[0]), ("w[0]", halves[1])],                  # a name taken twice
        [("w[01]", halves[0]), ("w[1]", halves[0])],              # w[01] is no shard name
        [("v[0]", halves[0]), ("w[0]", halves[0]), ("w[1]", halves[1]), ("v[1]", halves[0])],
        [("x[0][0]", halves[0]), ("x[0][1]", halves[0])],         # the group is x[0]
    ]
    out = []
    for entries in sets:
        items = [(n, t.descriptor, [t.memoryview()]) for n, t in entries]
        out.append(planning.serialise(planning.plan_items(items, None, 64, True, [])))
    return out


def test_verify_refuses_the_shard_sets_python_refuses(
        driver: tuple[pathlib.Path, dict[str, str]], tmp_path: pathlib.Path) -> None:
    exe, env = driver
    files = _shard_files()
    paths = []
    for k, data in enumerate(files):
        p = tmp_path / f"s{k}.hurray"
        p.write_bytes(data)
        paths.append(str(p))
    got = _ok(_run(exe, "check-files", stdin="".join(p + "\n" for p in paths),
                   env=env)).splitlines()
    want = [_py_check(data) for data in files]
    assert got == want
    assert want == ["ok"] * 4 + ["err shards"] * 5 + ["err name", "ok", "err shards",
                                                       "err shards"]


def test_every_truncation_is_refused(driver: tuple[pathlib.Path, dict[str, str]],
                                     tmp_path: pathlib.Path) -> None:
    exe, env = driver
    raw = (FILES / "metadata.hurray").read_bytes()
    paths = []
    for n in range(len(raw)):
        p = tmp_path / f"t{n}"
        p.write_bytes(raw[:n])
        paths.append(str(p))
    got = _ok(_run(exe, "check-files", stdin="".join(p + "\n" for p in paths),
                   env=env)).splitlines()
    assert got == ["err header"] * 128 + ["err file_size"] * (len(raw) - 128)


# ------------------------------------------------------------------------------ tool
def _python_set() -> dict[str, Any]:
    """Tensors of every element type, layout and section, empty ones, scalars, rank 64."""
    from tests.vectors.generate_files import every_dtype, vectors

    out: dict[str, Any] = {f"dtype/{k}": v for k, v in every_dtype().items()}
    for name, (tensors, _, _) in vectors().items():
        for k, v in tensors.items():
            out.setdefault(f"vector/{name}/{k}", v)
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    out.update({
        "numpy/float32": a,
        "numpy/transposed": a.transpose(2, 0, 1),
        "numpy/negative_steps": a[::-1, :, ::-2],
        "numpy/int64": np.arange(-5, 5, dtype=np.int64),
        "numpy/complex128": np.array([1 + 2j, -3.5j]),
        "numpy/bool8": np.array([[True, False], [False, True]]),
        "numpy/empty": np.zeros((4, 0, 3), np.float64),
        "numpy/empty_uint16": np.zeros((0,), np.uint16),
        "numpy/scalar": np.array(2.5, np.float64),
        "numpy/scalar_int8": np.array(-7, np.int8),
        "numpy/rank64": np.arange(2, dtype=np.int16).reshape((1,) * 63 + (2,)),
        "numpy/rank64_empty": np.zeros((1,) * 62 + (0, 3), np.float32),
        "名前/ünïcode": np.array([1, 2, 3], np.uint8),
    })
    return out


@pytest.mark.parametrize("options", [{}, {"alignment": 4096}, {"checksums": False}],
                         ids=["default", "alignment_4096", "no_checksums"])
def test_python_to_c_to_python(c_build: pathlib.Path, tmp_path: pathlib.Path,
                               options: dict[str, Any]) -> None:
    tool = c_build / "hurray-c"
    src, dst = tmp_path / "py.hurray", tmp_path / "c.hurray"
    meta = {"source": "hb.save", "note": "grüße ✓", "empty": ""}
    hb.save(src, _python_set(), meta, **options)
    _ok(_run(tool, "verify", str(src)))
    _ok(_run(tool, "copy", str(src), str(dst)))
    # the C writer makes the file hb.save made: the Python writer is deterministic
    assert dst.read_bytes() == src.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["c.hurray", "py.hurray"]  # no temporary left
    a, b = hb.load(src), hb.load(dst)
    assert b.metadata == meta and list(b) == list(a)
    for name in a:
        assert b[name].descriptor == a[name].descriptor, name
        assert [bytes(b[name].memoryview(x.role)) for x in b[name].buffers] == [
            bytes(a[name].memoryview(x.role)) for x in a[name].buffers], name
    container.verify(dst)


def test_inspect_json_matches_python(c_build: pathlib.Path, tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.hurray"
    hb.save(path, _python_set())
    rows = _lines(_ok(_run(c_build / "hurray-c", "inspect", "--json", str(path))))
    idx = container.read_index(path)
    data = path.read_bytes()
    assert [r["name"] for r in rows] == [e.name for e in idx.entries]
    for row, e in zip(rows, idx.entries, strict=True):
        d = e.descriptor
        bufs = [data[idx.data_offset + b.offset:idx.data_offset + b.offset + b.length]
                for b in e.buffers]
        assert row["dtype"] == d.dtype.name and row["type_tag"] == d.dtype.tag
        assert row["shape"] == list(d.shape)
        assert row["layout"] == d.layout.name and row["flags"] == int(d.flags)
        assert row["nbytes"] == e.nbytes == sum(map(len, bufs))
        assert row["sha256"] == hashlib.sha256(b"".join(bufs)).hexdigest()
        assert [(x["role"], x["offset"], x["length"], x["sha256"]) for x in row["buffers"]] == [
            (b.role.name, b.offset, b.length, hashlib.sha256(raw).hexdigest())
            for b, raw in zip(e.buffers, bufs, strict=True)]
        assert row["checksum"] == e.checksum
        assert bytes.fromhex(row["descriptor"]) == wire.encode(d, [b.offset for b in e.buffers])
        if d.strides is not None:
            assert row["strides"] == list(d.strides)


def test_c_to_python(driver: tuple[pathlib.Path, dict[str, str]], tmp_path: pathlib.Path) -> None:
    """Files the C writer built from the C API alone read back in Python, bit for bit."""
    from tests.vectors.generate_files import pattern, tensor

    exe, env = driver
    manifest = json.loads(_ok(_run(exe, "make-files", str(tmp_path), env=env)))
    dt = {d.name: d for d in hb.dtypes.all_dtypes()}
    kinds = set()
    for spec in manifest["files"]:
        path = tmp_path / spec["file"]
        container.verify(path)
        assert_data_region_rule(path.read_bytes())
        tf = hb.load(path)
        assert tf.metadata == spec["metadata"]
        assert list(tf) == [e["name"] for e in spec["entries"]]
        expected = {}
        for e in spec["entries"]:
            kw: dict[str, Any] = {"padded": e["padded"]}
            if "strides" in e:
                kw["strides"] = e["strides"]
            if "tile" in e:
                kw["tile"] = e["tile"]
            if "sparse" in e:
                nnz, idx, canonical = e["sparse"]
                kw["sparse"] = hb.Sparse(nnz, dt[idx], canonical)
            if "quantization" in e:
                scheme, scale, zp, axis, block = e["quantization"]
                kw["quantization"] = hb.Quantization(
                    hb.QuantScheme(scheme), dt[scale], dt[zp] if zp else None,
                    None if axis == -1 else axis, block or None)
            if "shard" in e:
                glob, offsets, replica, dev_type, dev_id = e["shard"]
                kw["shard"] = hb.Shard(glob, offsets, replica, dev_type, dev_id)
            d = hb.Descriptor(e["shape"], dt[e["dtype"]], hb.Layout[e["layout"]], **kw)
            t = tf[e["name"]]
            assert t.descriptor == d, e["name"]
            # the C driver fills buffer j with generate_files.pattern(length, seed + j)
            raws = [pattern(s.nbytes, e["seed"] + j) for j, s in enumerate(d.buffer_layout())]
            if d.dtype == hb.dtypes.bool8 and raws:  # only 0 and 1 are bool8 bytes
                raws[0] = bytes(b & 1 for b in raws[0])
            if d.trailing_bits and raws[0]:  # written as zero by the C writer, as by hb.save
                raws[0] = raws[0][:-1] + bytes([raws[0][-1] & (0xFF >> d.trailing_bits)])
            if d.padded and raws:  # so are padded elements' high bits (element-types.md §4.3)
                raws[0] = bytes(b & ((1 << d.dtype.bits) - 1) for b in raws[0])
            assert [bytes(t.memoryview(b.role)) for b in t.buffers] == raws, e["name"]
            expected[e["name"]] = tensor(d, *raws)
            kinds.add((d.layout, d.rank == 0, d.rank == 64, d.is_empty, d.quantization is not None,
                       d.shard is not None))
        # and hb.save would have written exactly the same file
        again = hb.dumps(expected, spec["metadata"], alignment=spec["alignment"],
                         checksums=spec["checksums"])
        assert again == path.read_bytes(), spec["file"]
    assert {k[0] for k in kinds} == set(hb.Layout)
    assert any(k[1] for k in kinds) and any(k[2] for k in kinds) and any(k[3] for k in kinds)


def test_tool_reports_defects_and_keeps_old_maps_valid(c_build: pathlib.Path,
                                                       tmp_path: pathlib.Path) -> None:
    tool = c_build / "hurray-c"
    src = tmp_path / "a.hurray"
    hb.save(src, {"x": np.arange(1000, dtype=np.float64)})
    raw = src.read_bytes()
    ok = _ok(_run(tool, "verify", str(src)))
    assert ok.startswith(f"{src}: OK")
    # a flipped data bit: verify names the entry's checksum, copy refuses to launder it
    bad = tmp_path / "bad.hurray"
    bad.write_bytes(raw[:5000] + bytes([raw[5000] ^ 1]) + raw[5001:])
    proc = _run(tool, "verify", str(bad))
    assert proc.returncode == 2 and "entries[0].checksum" in proc.stderr
    proc = _run(tool, "copy", str(bad), str(tmp_path / "out.hurray"))
    assert proc.returncode == 2 and not (tmp_path / "out.hurray").exists()
    # truncated, and bytes appended
    for cut in (0, 100, 128, 4095, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        proc = _run(tool, "verify", str(bad))
        assert proc.returncode == 2 and ("file_size" in proc.stderr or "header" in proc.stderr)
    bad.write_bytes(raw + b"\0")
    proc = _run(tool, "verify", str(bad))
    assert proc.returncode == 2 and "file_size: 1 bytes follow" in proc.stderr
    assert _run(tool, "verify", str(tmp_path / "missing")).returncode == 2
    assert _run(tool, "frobnicate").returncode == 1
    # copying over a file that is mapped: the old map stays valid (a new inode)
    target = tmp_path / "t.hurray"
    hb.save(target, {"y": np.full(512, 7, np.int32)})
    old = hb.load(target)
    inode = os.stat(target).st_ino
    _ok(_run(tool, "copy", str(src), str(target)))
    assert os.stat(target).st_ino != inode
    assert bytes(old["y"].memoryview()) == np.full(512, 7, np.int32).tobytes()
    assert target.read_bytes() == raw


def test_example_prints_a_tensor_saved_by_hb_save(c_build: pathlib.Path,
                                                  tmp_path: pathlib.Path) -> None:
    path = tmp_path / "w.hurray"
    hb.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                   "t": np.arange(12, dtype=np.int16).reshape(3, 4).T,
                   "e": np.zeros((0, 3))})
    out = _ok(_run(c_build / "print_tensor", str(path), "w"))
    assert out.splitlines()[-1] == "[[0, 1, 2], [3, 4, 5]]"
    out = _ok(_run(c_build / "print_tensor", str(path), "t"))
    assert out.splitlines()[-1] == "[[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]"
    out = _ok(_run(c_build / "print_tensor", str(path), "e"))
    assert "data = NULL" in out.splitlines()[-1]


def _printed_numbers(line: str) -> list[float]:
    """The numbers of print_tensor's nested-list line, as Python floats (exact: the C side
    prints each value with enough digits to round-trip)."""
    return [float(tok) for tok in re.findall(r"-?inf|nan|-?[0-9][0-9.eE+-]*", line)]


def test_example_prints_one_entry_and_narrow_floats_as_decimals(c_build: pathlib.Path,
                                                                 tmp_path: pathlib.Path) -> None:
    """`print_tensor FILE NAME` looks the entry up: no line for the entries before it; and
    bfloat16, float16 and the float8 types print as the decimal values Python reads."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits16 = np.array([0x0000, 0x8000, 0x3F80, 0xBDCD, 0x7F7F, 0x0001, 0x807F, 0x7F80,
                       0xFF80, 0x4049, 0x3EAB, 0x0080], dtype=np.uint16).reshape(2, 6)
    tensors = {"first": np.arange(3, dtype=np.int32), "second": np.ones(2, np.float32),
               "bf": bits16.view(ml_dtypes.bfloat16),
               "f16": np.array([0x0001, 0x03FF, 0x3C00, 0xC000, 0x7BFF, 0x7C00, 0x3555],
                               np.uint16).view(np.float16)}
    all8 = np.arange(256, dtype=np.uint8)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                 "float8_e8m0fnu"):
        # every bit pattern: 32 rows of 8 (print_tensor elides rows past 8, so shape 8 x 32
        # would hide some; 32 x 8 keeps every element of the first 6 and last 2 rows)
        tensors[f"t_{name}"] = all8.view(getattr(ml_dtypes, name)).reshape(32, 8)
    path = tmp_path / "narrow.hurray"
    hb.save(path, tensors)
    for name, array in tensors.items():
        out = _ok(_run(c_build / "print_tensor", str(path), name)).splitlines()
        others = [n for n in tensors if n != name]
        assert not [ln for ln in out for n in others if re.search(rf"\b{n}\b", ln)], out
        assert out[0].startswith(f"{name} [") and len(out) == 2, out
        printed = _printed_numbers(out[1])
        expected = [float(v) for v in np.asarray(array, dtype=np.float64).ravel()]
        if array.shape[0] > 8:  # the rows print_tensor shows: 0..5 and the last two
            rows = [*range(6), array.shape[0] - 2, array.shape[0] - 1]
            expected = [float(v) for r in rows for v in np.asarray(array[r], np.float64)]
        assert len(printed) == len(expected), (name, out[1][:200])
        for got, want in zip(printed, expected, strict=True):
            assert (got == want and str(got)[0] == str(want)[0]) or (got != got and
                                                                     want != want), \
                (name, got, want)


# ------------------------------------------------------------------------------ dlpack.h
def _dlpack_block() -> str:
    """The DLPack struct definitions hurray.h carries (between its guard lines)."""
    text = (CDIR / "include" / "hurray.h").read_text()
    m = re.search(r"#define DLPACK_MINOR_VERSION \d+\n(.*?)\n#endif /\* DLPACK_DLPACK_H_ \*/",
                  text, re.S)
    assert m is not None, "hurray.h no longer carries its DLPack definitions"
    return m.group(1)


def _compile_with_dlpack_first(tmp_path: pathlib.Path,
                               dlpack_h: str) -> subprocess.CompletedProcess:
    (tmp_path / "dlpack").mkdir(exist_ok=True)
    (tmp_path / "dlpack" / "dlpack.h").write_text(dlpack_h)
    src = tmp_path / "tu.c"
    src.write_text("#include <dlpack/dlpack.h>\n#include \"hurray.h\"\n"
                   "int main(void) { DLManagedTensorVersioned *m = 0; return m != 0; }\n")
    return subprocess.run([CC or "cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic",
                           f"-I{tmp_path}", f"-I{CDIR / 'include'}", "-fsyntax-only", str(src)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("version,found", [
    ("#define DLPACK_VERSION 80\n#define DLPACK_ABI_VERSION 1\n", "older than 1.0"),
    ("#define DLPACK_MAJOR_VERSION 1\n#define DLPACK_MINOR_VERSION 0\n", "is DLPack 1.0"),
    ("#define DLPACK_MAJOR_VERSION 2\n#define DLPACK_MINOR_VERSION 0\n", "major version above 1"),
])
def test_an_older_dlpack_h_included_first_is_a_compile_error(
        tmp_path: pathlib.Path, version: str, found: str) -> None:
    """hurray.h hands out DLPack 1.1 type codes and flags: a dlpack.h without them, included
    first, must stop the build with both versions named, not silently replace its own."""
    # 1.0 has the structs hurray.h declares with: only the check can refuse it
    structs = _dlpack_block() if "MAJOR" in version else ""
    proc = _compile_with_dlpack_first(
        tmp_path, f"#ifndef DLPACK_DLPACK_H_\n#define DLPACK_DLPACK_H_\n#include <stdint.h>\n"
                  f"{version}{structs}\n#endif\n")
    assert proc.returncode != 0
    assert "needs DLPack 1.1 or later" in proc.stderr and found in proc.stderr, proc.stderr
    assert "include a dlpack.h of version 1.1 or later" in proc.stderr, proc.stderr


@pytest.mark.parametrize("minor", [1, 3, 9])
def test_a_compatible_dlpack_h_included_first_is_used(tmp_path: pathlib.Path, minor: int) -> None:
    header = ("#ifndef DLPACK_DLPACK_H_\n#define DLPACK_DLPACK_H_\n"
              f"#include <stdint.h>\n#define DLPACK_MAJOR_VERSION 1\n"
              f"#define DLPACK_MINOR_VERSION {minor}\n{_dlpack_block()}\n#endif\n")
    proc = _compile_with_dlpack_first(tmp_path, header)
    assert proc.returncode == 0, proc.stderr


def test_the_upstream_dlpack_h_works_before_and_after_hurray_h(tmp_path: pathlib.Path) -> None:
    found = sorted(pathlib.Path(sys.prefix).glob("lib/python*/site-packages/*/include/dlpack"))
    if not found:
        pytest.skip("no upstream dlpack/dlpack.h installed (tvm_ffi and torch ship one)")
    for order in ("#include <dlpack/dlpack.h>\n#include \"hurray.h\"\n",
                  "#include \"hurray.h\"\n#include <dlpack/dlpack.h>\n"):
        src = tmp_path / "tu.c"
        src.write_text(order + "int main(void) { return (int)sizeof(DLManagedTensorVersioned)"
                       " != 8 + 2 * (int)sizeof(void *) + 8 + (int)sizeof(DLTensor); }\n")
        proc = subprocess.run([CC or "cc", "-std=c11", "-Wall", "-Wextra", "-Werror",
                               f"-I{found[0].parent}", f"-I{CDIR / 'include'}", str(src), "-o",
                               str(tmp_path / "tu")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert subprocess.run([str(tmp_path / "tu")]).returncode == 0


# ------------------------------------------------------------------------------ ABI growth
ABI_CALLER = r"""
#include "hurray.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 2.x caller: reads every entry of argv[1] through the descriptor API, writes them again
 * through the writer into argv[2]. Built against the header of its time (GROWN: a later
 * 2.1 whose hry_descriptor and hry_file_info have one more field). */
static int fail(const char *what, const hry_error *e)
{
    printf("%s: %s: %s: %s\n", what, hry_status_name(e->status), e->field, e->message);
    return 2;
}

int main(int argc, char **argv)
{
    hry_error err;
    hry_file *f;
    printf("version_check=%d\n", hry_version_check());
    if (argc != 3 || hry_file_open(argv[1], HRY_OPEN_VERIFY, &f, &err) != HRY_OK) {
        return argc != 3 ? 1 : fail("open", &err);
    }
    hry_file_info info;
    hry_file_info_init(&info);
    if (hry_file_get_info(f, &info, &err) != HRY_OK) {
        return fail("info", &err);
    }
    printf("info: struct_size %s, %u entries, alignment %u, %llu bytes\n",
           info.struct_size == sizeof info ? "kept" : "CHANGED", info.n_entries,
           info.alignment, (unsigned long long)info.file_size);
    hry_writer *w;
    if (hry_writer_new(info.alignment, (info.flags & HRY_FILE_FLAG_DATA_CHECKSUMS) != 0, &w,
                       &err) != HRY_OK) {
        return fail("writer", &err);
    }
    for (uint32_t i = 0; i < hry_file_entry_count(f); i++) {
        const hry_entry *e = hry_file_entry(f, i);
        hry_descriptor d;
        hry_descriptor_init(&d);
#ifdef GROWN
        d.grown_field = 0x5555; /* a decoder must clear what its library does not know */
#endif
        uint64_t nbytes = 0;
        uint8_t enc[HRY_MAX_DESCRIPTOR_SIZE];
        size_t n = 0;
        if (hry_entry_descriptor(e, &d, &err) != HRY_OK ||
            hry_descriptor_nbytes(&d, &nbytes, &err) != HRY_OK ||
            hry_encode(&d, NULL, 0, enc, sizeof enc, &n, &err) != HRY_OK) {
            return fail(e->name, &err);
        }
        hry_descriptor again;
        hry_descriptor_init(&again);
        if (hry_decode(enc, n, &again, NULL, &err) != HRY_OK) {
            return fail("decode", &err);
        }
        printf("%s: rank %u %s, %llu bytes, flags %u, encoded %zu, equal %d, struct_size %s\n",
               e->name, d.rank, hry_dtype(d.dtype)->name, (unsigned long long)nbytes,
               hry_descriptor_flags(&d), n, hry_descriptor_equal(&d, &again),
               d.struct_size == sizeof d ? "kept" : "CHANGED");
#ifdef GROWN
        printf("grown_field after decode: %llu\n", (unsigned long long)d.grown_field);
#endif
        const void *bufs[HRY_MAX_BUFFERS];
        for (uint32_t j = 0; j < e->buffers.count; j++) {
            bufs[j] = hry_file_buffer(f, e, j);
        }
        if (hry_writer_add(w, e->name, e->name_length, &d, bufs, e->buffers.count, &err) !=
            HRY_OK) {
            return fail("add", &err);
        }
    }
    if (hry_writer_save(w, argv[2], HRY_SAVE_NO_FSYNC, &err) != HRY_OK) {
        return fail("save", &err);
    }
    hry_writer_free(w);
    hry_file_close(f);
    /* refusals: a size below 2.0's; a newer caller's field that this library lacks */
    hry_descriptor d;
    hry_descriptor_init(&d);
    d.dtype = HRY_FLOAT32;
    d.layout = HRY_ROW_MAJOR;
    d.struct_size = 8;
    hry_status s = hry_descriptor_check(&d, &err);
    printf("struct_size 8: %s: %s: %s\n", hry_status_name(s), err.field, err.message);
    hry_file_info_init(&info);
    info.struct_size = 4;
    hry_file_open(argv[2], 0, &f, NULL);
    s = hry_file_get_info(f, &info, &err);
    printf("info struct_size 4: %s: %s: %s\n", hry_status_name(s), err.field, err.message);
    hry_file_close(f);
#ifdef GROWN
    hry_descriptor_init(&d);
    d.dtype = HRY_FLOAT32;
    d.layout = HRY_ROW_MAJOR;
    d.grown_field = 1;
    s = hry_descriptor_check(&d, &err);
    printf("grown_field set: %s: %s: %s\n", hry_status_name(s), err.field, err.message);
#endif
    return 0;
}
"""


def _grown_copy(tmp: pathlib.Path) -> pathlib.Path:
    """c/include and c/src as a later 2.1 would have them: one field appended to
    hry_descriptor and to hry_file_info, the minor version bumped; the code unchanged."""
    root = tmp / "grown"
    shutil.copytree(CDIR / "src", root / "src")
    shutil.copytree(CDIR / "include", root / "include")
    header = root / "include" / "hurray.h"
    text = header.read_text()
    for name in ("hry_descriptor", "hry_file_info"):
        end = f"\n}} {name};\n"
        assert text.count(end) == 1, name
        text = text.replace(end, f"\n    uint64_t grown_field;\n}} {name};\n")
    text, n = re.subn(r"#define HRY_LIB_VERSION_MINOR \d+", "#define HRY_LIB_VERSION_MINOR 1",
                      text)
    assert n == 1
    header.write_text(text)
    return root


def test_a_caller_built_against_another_struct_size_works(tmp_path: pathlib.Path) -> None:
    """struct_size lets the structs grow: a caller compiled against the 2.0 header runs on a
    2.1 library whose hry_descriptor and hry_file_info are longer (and the other way round),
    with the same results, nothing read or written past the caller's struct (ASan), and the
    refusals naming struct_size."""
    grown = _grown_copy(tmp_path)
    flags = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1"]
    env = dict(os.environ)
    if _sanitizers_available(tmp_path):
        flags += ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
        env.update(SAN_ENV)
    (tmp_path / "caller.c").write_text(ABI_CALLER)
    libs = {"2.0": (CDIR / "include", CDIR / "src"), "2.1": (grown / "include", grown / "src")}

    def build(name: str, header: str, library: str, *defines: str) -> pathlib.Path:
        inc, src = libs[library]
        lib_objs = []
        for c in sorted(src.glob("*.c")):  # the library, compiled with its own header
            obj = tmp_path / f"{library}-{c.stem}.o"
            if not obj.exists():
                proc = subprocess.run([CC or "cc", *flags, "-fvisibility=hidden", f"-I{inc}",
                                       f"-I{src}", "-c", str(c), "-o", str(obj)],
                                      capture_output=True, text=True)
                assert proc.returncode == 0, proc.stderr
            lib_objs.append(str(obj))
        exe = tmp_path / name
        proc = subprocess.run([CC or "cc", *flags, *defines, f"-I{libs[header][0]}",
                               str(tmp_path / "caller.c"), *lib_objs, "-lpthread", "-o",
                               str(exe)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return exe

    src = tmp_path / "in.hurray"
    hb.save(src, {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                  "t": np.arange(12, dtype=np.int16).reshape(3, 4).T,
                  "s": np.float64(2.5), "e": np.zeros((0, 3), np.uint8)})

    def run(exe: pathlib.Path) -> list[str]:
        out = tmp_path / f"{exe.name}.hurray"
        proc = _run(exe, str(src), str(out), env=env)
        assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, \
            proc.stderr
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert out.read_bytes() == src.read_bytes(), exe.name
        return proc.stdout.splitlines()

    same = run(build("old_on_old", "2.0", "2.0"))
    old_caller = run(build("old_on_new", "2.0", "2.1"))
    new_caller = run(build("new_on_old", "2.1", "2.0", "-DGROWN"))
    assert same[0] == "version_check=1" and old_caller[0] == "version_check=1"
    assert new_caller[0] == "version_check=0"  # built for 2.1, linked with 2.0: it says so
    assert old_caller == same, (old_caller, same)
    entries = [ln for ln in same if ln.startswith(("w:", "t:", "s:", "e:"))]
    assert len(entries) == 4 and all("equal 1, struct_size kept" in ln for ln in entries)
    assert "info: struct_size kept, 4 entries" in same[1]
    # a newer caller on the older library: what the library fills is the same, and the
    # field it does not know reads as zero after a decode
    assert [ln for ln in new_caller if ln in entries] == entries
    assert new_caller.count("grown_field after decode: 0") == 4
    for out in (same, new_caller):
        small = next(ln for ln in out if ln.startswith("struct_size 8:"))
        assert "argument" in small and ": struct_size: hry_descriptor.struct_size is 8" in small
        assert "hry_descriptor_init" in small
        info = next(ln for ln in out if ln.startswith("info struct_size 4:"))
        assert ": struct_size: hry_file_info.struct_size is 4" in info
    grown_set = next(ln for ln in new_caller if ln.startswith("grown_field set:"))
    assert "unsupported" in grown_set and ": struct_size: " in grown_set
    assert "hry_version_check" in grown_set and "2.0.0" in grown_set


# ------------------------------------------------------------------------------ install
PKG_CONFIG = shutil.which("pkg-config")
INSTALLED = ["include/hurray.h", "lib/libhurray.so.2.0.0", "lib/libhurray.so.2",
             "lib/libhurray.so", "lib/libhurray.a", "lib/pkgconfig/hurray.pc", "bin/hurray-c"]


def _pkg_config(prefix: pathlib.Path, *args: str) -> list[str]:
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig"),
           "PKG_CONFIG_LIBDIR": str(prefix / "lib" / "pkgconfig")}
    proc = subprocess.run([PKG_CONFIG or "pkg-config", *args, "hurray"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _needed(exe: pathlib.Path) -> list[str]:
    readelf = shutil.which("readelf")
    if readelf is None:
        return []
    out = subprocess.run([readelf, "-d", str(exe)], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", out)


@pytest.mark.skipif(PKG_CONFIG is None, reason="pkg-config is not installed")
def test_make_install_gives_a_library_programs_build_against(c_build: pathlib.Path,
                                                             tmp_path: pathlib.Path) -> None:
    """`make install PREFIX=...`: the header, the versioned shared library with its soname
    links, the static library, a pkg-config file naming that prefix and the tool; a program
    built with `pkg-config --cflags --libs hurray` against that copy (shared and static)
    prints what the in-tree build prints and what Python reads; `make uninstall` removes it
    all; DESTDIR stages without changing the prefix the files name."""
    prefix = tmp_path / "prefix"
    _make(tmp_path / "build", "install", PREFIX=str(prefix))
    got = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if not p.is_dir())
    assert got == sorted(INSTALLED)
    lib = prefix / "lib"
    assert os.readlink(lib / "libhurray.so") == "libhurray.so.2"
    assert os.readlink(lib / "libhurray.so.2") == "libhurray.so.2.0.0"
    assert _pkg_config(prefix, "--modversion") == ["2.0.0"]
    assert _pkg_config(prefix, "--variable=prefix") == [str(prefix)]
    cflags_libs = _pkg_config(prefix, "--cflags", "--libs")
    assert f"-I{prefix}/include" in cflags_libs and "-lhurray" in cflags_libs

    data = tmp_path / "w.hurray"
    ml_dtypes = pytest.importorskip("ml_dtypes")
    hb.save(data, {"w": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
                   "bf": np.array([1.5, -0.1, 3e38, 1e-40], ml_dtypes.bfloat16)})
    program = ROOT / "examples" / "c" / "print_tensor.c"
    warn = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
    shared = tmp_path / "print_shared"
    static = tmp_path / "print_static"
    for exe, link in ((shared, [*cflags_libs, f"-Wl,-rpath,{lib}"]),
                      (static, [*_pkg_config(prefix, "--cflags"), f"-L{lib}", "-Wl,-Bstatic",
                                "-lhurray", "-Wl,-Bdynamic",
                                *[f for f in _pkg_config(prefix, "--static", "--libs-only-l")
                                  if f != "-lhurray"]])):
        proc = subprocess.run([CC or "cc", *warn, str(program), *link, "-o", str(exe)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    if shutil.which("readelf"):
        assert "libhurray.so.2" in _needed(shared)
        assert not [n for n in _needed(static) if "hurray" in n]
    for name, values in (("w", np.arange(6, dtype=np.float64) / 4),
                         ("bf", np.array([1.5, -0.1, 3e38, 1e-40], ml_dtypes.bfloat16))):
        outs = {str(exe.name): _ok(_run(exe, str(data), name)) for exe in (shared, static)}
        outs["in-tree"] = _ok(_run(c_build / "print_tensor", str(data), name))
        assert len(set(outs.values())) == 1, outs
        printed = _printed_numbers(outs["print_shared"].splitlines()[1])
        assert printed == [float(v) for v in np.asarray(values, np.float64).ravel()]
    # without an rpath, from LD_LIBRARY_PATH alone, as a system install is found
    plain = tmp_path / "print_env"
    proc = subprocess.run([CC or "cc", *warn, str(program), *cflags_libs, "-o", str(plain)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib)}
    assert _ok(_run(plain, str(data), "bf", env=env)) == _ok(_run(shared, str(data), "bf"))
    assert _run(plain, str(data), "bf", env={**os.environ, "LD_LIBRARY_PATH": ""}).returncode \
        != 0  # it does load the installed copy
    assert "OK" in _ok(_run(prefix / "bin" / "hurray-c", "verify", str(data)))

    _make(tmp_path / "build", "uninstall", PREFIX=str(prefix))
    assert not [p for p in prefix.rglob("*") if not p.is_dir()]

    stage = tmp_path / "stage"
    _make(tmp_path / "build", "install", PREFIX="/opt/hurray", DESTDIR=str(stage))
    got = sorted(str(p.relative_to(stage / "opt" / "hurray"))
                 for p in stage.rglob("*") if not p.is_dir())
    assert got == sorted(INSTALLED)
    pc = (stage / "opt" / "hurray" / "lib" / "pkgconfig" / "hurray.pc").read_text()
    assert "prefix=/opt/hurray\n" in pc and str(stage) not in pc


# ------------------------------------------------------------------------------ fuzzing
@pytest.fixture(scope="module")
def fuzz_build(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    if CLANG is None:
        pytest.skip("clang is not installed: the libFuzzer targets need it "
                    "(apt-get install clang)")
    build = tmp_path_factory.mktemp("c-fuzz")
    _make(build, "fuzz", CC=CLANG)
    return build


@pytest.mark.parametrize("target,corpus,extra", [
    ("descriptor", "descriptor", []),
    ("file", "file", ["-max_len=20000"]),
])
def test_fuzz_target_runs_clean(fuzz_build: pathlib.Path, tmp_path: pathlib.Path, target: str,
                                corpus: str, extra: list[str]) -> None:
    """A bounded coverage-guided run from the committed corpus: no crash, leak or hang."""
    work = tmp_path / "new"
    work.mkdir()
    proc = subprocess.run(
        [str(fuzz_build / f"fuzz_{target}"), str(work), str(ROOT / "fuzz" / "c" / corpus),
         f"-max_total_time={FUZZ_SECONDS}", "-timeout=10", "-rss_limit_mb=2048",
         "-print_final_stats=1", f"-artifact_prefix={tmp_path}/", *extra],
        capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("leak-*"))
    m = re.search(r"stat::number_of_executed_units: (\d+)", proc.stderr)
    assert m is not None, proc.stderr[-2000:]
    assert int(m.group(1)) > 1000


# ------------------------------------------------------------------------------ _speedups
def _speedups_or_skip() -> Any:
    try:
        from hurray_bridge import _speedups
    except ImportError:
        pytest.skip("hurray_bridge._speedups was not built (no C compiler at install time)")
    return _speedups


def test_the_compiled_dense_decoder_is_the_c_librarys() -> None:
    """_speedups' dense fast path calls c/src/descriptor.c: one copy of the rules in C."""
    sp = _speedups_or_skip()
    assert wire._decode_dense is sp.decode_dense
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "--defined-only", sp.__file__], capture_output=True,
                         text=True).stdout
    assert re.search(r"\bhry_decode_prefix\b", out) and re.search(r"\bhry_dtype\b", out)


def test_the_two_element_type_tables_are_checked_to_agree() -> None:
    """A dtypes.py table that differs from the C library's turns the compiled decoder off
    (with a warning): the general Python decoder then answers, never the other table."""
    _speedups_or_skip()
    code = (
        "import warnings\n"
        "import hurray_bridge as hb\n"
        "from hurray_bridge import wire, _speedups\n"
        "from hurray_bridge.descriptor import Descriptor\n"
        "from hurray_bridge.dtypes import _BY_TAG\n"
        "dts = [_BY_TAG.get(t) for t in range(256)]\n"
        "bits = [d.bits if d is not None else 0 for d in dts]\n"
        "slots = tuple(Descriptor.__dict__[f] for f in ('shape', 'dtype', 'layout', 'strides',"
        " 'tile', 'sparse', 'quantization', 'shard', 'padded'))\n"
        "raw = hb.Descriptor([3], hb.float32).to_bytes()\n"
        "print('on', _speedups.decode_dense(raw, len(raw)) is not None)\n"
        "bits[23] = 8\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    _speedups.dense_decoder_setup(Descriptor, dts, bits, wire._ROW_MAJOR,"
        " wire._STRIDED, slots)\n"
        "print('warned', [str(x.message) for x in w])\n"
        "print('off', _speedups.decode_dense(raw, len(raw)) is None)\n"
        "print('decodes', hb.Descriptor.from_bytes(raw) == hb.Descriptor([3], hb.float32))\n"
        "bits[23] = 4\n"
        "_speedups.dense_decoder_setup(Descriptor, dts, bits, wire._ROW_MAJOR, wire._STRIDED,"
        " slots)\n"
        "print('on again', _speedups.decode_dense(raw, len(raw)) is not None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "on True" and "tag 23 differs" in lines[1]
    assert lines[2:] == ["off True", "decodes True", "on again True"]


def test_the_compiled_crc32_is_zlibs_by_every_way_this_cpu_has() -> None:
    """crc32.c's ways (the table, 128-, 256- and 512-bit carry-less folding) give zlib.crc32's
    value for every length around their step sizes, at every alignment, from any start."""
    sp = _speedups_or_skip()
    assert sp.CRC32_WAYS >= 1 and sp.CRC32_CLMUL == (sp.CRC32_WAYS > 1)
    rng = random.Random(5)
    data = rng.randbytes(1 << 17)
    lengths = [*range(0, 700), 1023, 4095, 4096, 4097, 65535, 65536, 65536 + 272, 100_003]
    for way in range(sp.CRC32_WAYS):
        for n in lengths:
            for off in (0, 1, 7, 16, 63):
                start = rng.getrandbits(32)
                view = memoryview(data)[off:off + n]
                assert sp.crc32_by(way, view, start) == zlib.crc32(view, start), (way, n, off)
    whole = rng.randbytes(3 << 20)
    assert sp.crc32(whole) == zlib.crc32(whole) and sp.crc32(b"123456789") == 0xCBF43926
    crc = 0
    for k in range(0, len(whole), 1 << 20):  # chained as _DataWriter chains its chunks
        crc = sp.crc32(memoryview(whole)[k:k + (1 << 20)], crc)
    assert crc == zlib.crc32(whole)


def test_the_compiled_crc32_takes_what_zlib_takes() -> None:
    sp = _speedups_or_skip()
    data = bytes(range(256)) * 40
    for buf in (data, bytearray(data), memoryview(data), memoryview(bytearray(data))[3:]):
        assert sp.crc32(buf) == zlib.crc32(buf)
    assert sp.crc32(data, 1 << 32 | 5) == zlib.crc32(data, 5)  # the start's low 32 bits
    assert sp.crc32(b"") == 0 and sp.crc32(b"", 7) == 7
    with pytest.raises(TypeError):
        sp.crc32("text")
    with pytest.raises(TypeError):
        sp.crc32()
    with pytest.raises(BufferError):  # not contiguous, as zlib.crc32 refuses it
        sp.crc32(memoryview(bytes(16)).cast("B", (4, 4))[::2])
    with pytest.raises(ValueError, match="way 9 is not available"):
        sp.crc32_by(9, data, 0)
