"""The MLX adapter against MLX's own behaviour, measured on the installed version.

Each quirk is tested twice where that helps: once as MLX's own fact (what ``mx.array``,
``mx.from_dlpack`` or the buffer protocol do), so a new MLX that changes it fails here
and the adapter is looked at again, and once through the bridge, which must handle it:
every import copies (reported, refused under ``copy=False``), float64 is kept (MLX
narrows it on its own), negative strides reach MLX compact, bool8 bytes other than 0/1
reach it as 0/1, lazy arrays are evaluated before their memory is taken, exports share
the array's own memory, writable as MLX documents, and read-only memory (a loaded file,
bytes) never reaches MLX to be written. The shared contract suite
(``tests/adapters/test_contract_suite.py``) holds the adapter to the contract.

Writes through an export of a mapped file run in a child process: on a read-only map a
write is a SIGSEGV, which must fail a test, not kill the suite.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge._capsule import capsule_name
from hurray_bridge.layout import BufferRole

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (extra 'mlx')")
np = pytest.importorskip("numpy", reason="numpy is not installed")

from hurray_bridge.adapters import mlx as mlx_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _addr(a: Any) -> int:
    """The data address of an evaluated MLX array, read through NumPy's DLPack import."""
    return int(np.from_dlpack(a).__array_interface__["data"][0])


def _ev(a: Any) -> Any:
    """``a`` evaluated (MLX arrays are lazy)."""
    mx.eval(a)
    return a


def _np_addr(a: Any) -> int:
    return int(a.__array_interface__["data"][0])


def _convert(x: Any, to: str, **kw: Any) -> tuple[Any, list[str]]:
    """hb.convert, and the CopyWarnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = hb.convert(x, to, **kw)
    return y, [str(w.message) for w in caught if issubclass(w.category, hb.CopyWarning)]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


# ------------------------------------------------------- MLX's own behaviour
def test_mlx_copies_every_cpu_import() -> None:
    """What makes from_hurray copy: no MLX entry point aliases foreign CPU memory."""
    x = np.arange(4096, dtype=np.float32)
    with pytest.raises(ValueError, match="without a copy"):
        mx.from_dlpack(x, copy=False)
    for src in (x, memoryview(x), x.__dlpack__(), hb.asarray(x)):
        m = mx.array(src)
        mx.eval(m)
        assert _addr(m) != _np_addr(x), type(src)
    assert _addr(mx.from_dlpack(x)) != _np_addr(x)


def test_mlx_narrows_float64_and_complex128_unless_told() -> None:
    x = np.array([1 / 3, 2.0**60 + 1], np.float64)
    assert mx.array(x).dtype == mx.float32
    assert mx.array(x.__dlpack__()).dtype == mx.float32
    assert mx.array(x, dtype=mx.float64).dtype == mx.float64  # MLX holds float64 on the CPU
    assert mx.array(np.ones(2, np.complex128)).dtype == mx.complex64
    assert not hasattr(mx, "complex128")


def test_mlx_refuses_negative_strides() -> None:
    with pytest.raises(ValueError, match="negative strides"):
        mx.array(np.arange(4, dtype=np.float32)[::-1])


def test_mlx_misreads_bool_bytes_other_than_0_and_1() -> None:
    raw = np.array([0, 1, 2, 255], np.uint8).view(np.bool_)
    assert mx.sum(mx.array(raw)).item() == 258  # each byte counted as its number


def test_mlx_exports_legacy_capsules_of_memory_it_writes_itself() -> None:
    """LEGACY_EXPORTS_MUTABLE, measured: MLX answers a versioned request with a legacy
    capsule, hands its memory out writable through the buffer protocol, and writes it in
    place itself (an earlier view sees a[0] = 7)."""
    a = mx.arange(8, dtype=mx.float32)
    mx.eval(a)
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor"
    view = np.asarray(memoryview(a))
    assert view.flags.writeable and _np_addr(view) == _addr(a)
    a[0] = 7.0
    mx.eval(a)
    assert view[0] == 7.0
    assert mlx_adapter.LEGACY_EXPORTS_MUTABLE is True


def test_mlx_frees_memory_under_its_own_buffer_views_but_not_under_dlpack() -> None:
    """Why to_hurray keeps a DLPack capsule: an update that gives an array new memory
    (int32 += float64 makes float64) frees the old memory under a buffer-protocol view
    (np.array(a, copy=False) then reads freed memory, or crashes), while a DLPack export
    holds it. Each way runs in a child process."""
    code = """
        import numpy as np, mlx.core as mx
        N = 1 << 20
        w = mx.arange(N, dtype=mx.int32); mx.eval(w)
        view = {view}
        w += mx.ones((N,), dtype=mx.float64); mx.eval(w)
        junk = [mx.full((N,), 7, dtype=mx.int32) for _ in range(20)]; mx.eval(*junk)
        print(view[:3].tolist(), int(view[-1]))
    """
    held = _run(code.format(view="np.from_dlpack(w)"))
    assert held.returncode == 0 and held.stdout == f"[0, 1, 2] {(1 << 20) - 1}\n", held
    loose = _run(code.format(view="np.array(w, copy=False)"))
    assert loose.returncode != 0 or loose.stdout != held.stdout, "MLX now holds the memory"


def test_an_export_outlives_an_update_that_moves_the_array() -> None:
    """The bridge's exports (the tensor, and NumPy and torch views of it) keep the old
    memory and its values when MLX gives the array new memory (child process: a
    regression reads freed memory, or crashes)."""
    r = _run("""
        import mlx.core as mx, hurray_bridge as hb
        N = 1 << 20
        w = mx.arange(N, dtype=mx.int32); mx.eval(w)
        t = hb.asarray(w)
        n = hb.convert(w, "numpy")
        n2 = hb.convert(w, "numpy")  # the shortcut, learned by the call before
        w += mx.ones((N,), dtype=mx.float64); mx.eval(w)
        del t
        junk = [mx.full((N,), 7, dtype=mx.int32) for _ in range(20)]; mx.eval(*junk)
        print(n[:3].tolist(), int(n[-1]), n2[:3].tolist(), int(n2[-1]), w.dtype)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    last = (1 << 20) - 1
    assert r.stdout == f"[0, 1, 2] {last} [0, 1, 2] {last} mlx.core.float64\n", r.stdout


# --------------------------------------------------------------- the element types
def test_element_types_are_the_ones_mlx_has() -> None:
    names = {d.name for d in mlx_adapter.native_dtypes()}
    assert names == {"bool8", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                     "uint64", "float16", "bfloat16", "float32", "float64", "complex64"}
    for d, native in mlx_adapter.native_dtypes().items():
        assert mx.zeros((2,), native).dtype == native, d  # each one can be made


@pytest.mark.parametrize("dtype", [hb.complex128, hb.float8_e4m3fn, hb.int4])
def test_a_type_mlx_lacks_is_refused_naming_the_fix(dtype: hb.DType) -> None:
    with pytest.raises(hb.UnsupportedError, match=f"MLX has no dtype for {dtype.name}") as e:
        mlx_adapter.native_dtype(dtype)
    assert "convert it to numpy, torch or jax" in str(e.value)
    if dtype is hb.complex128:
        assert "cast it to complex64" in str(e.value)


# ------------------------------------------------------------------- export
def test_export_shares_the_arrays_memory_writable() -> None:
    a = mx.arange(1024, dtype=mx.float32)
    mx.eval(a)
    t = hb.asarray(a)
    assert t.data_ptr == _addr(a) and not t.readonly and not t.copied
    n, copies = _convert(a, "numpy")
    assert not copies and _np_addr(n) == _addr(a) and n.flags.writeable
    n[1] = -5.0  # as np.array(a, copy=False) does, a write MLX sees
    assert a[1].item() == -5.0


def test_export_of_bfloat16_shares_memory_through_dlpack() -> None:
    a = mx.array([1.5, -2.25, 3.0], dtype=mx.bfloat16)
    mx.eval(a)
    t = hb.asarray(a)
    # (NumPy reads no bfloat16 DLPack: the address is read through a uint16 view of a)
    assert t.dtype is hb.bfloat16 and t.data_ptr == _addr(a.view(mx.uint16))
    assert not t.readonly
    assert np.asarray(hb.convert(t, "numpy")).astype(np.float32).tolist() == [1.5, -2.25, 3.0]


def test_a_lazy_array_is_evaluated_before_its_memory_is_taken() -> None:
    a = mx.arange(6, dtype=mx.float32)
    b = a * 2 + 1  # a graph node: no memory yet
    t = hb.asarray(b)
    assert np.asarray(hb.convert(t, "numpy")).tolist() == [1, 3, 5, 7, 9, 11]
    c = mx.exp(mx.zeros((3,), mx.bfloat16))  # the DLPack route, lazy as well
    assert np.asarray(hb.convert(c, "numpy")).astype(np.float32).tolist() == [1, 1, 1]


def test_strided_mlx_views_export_their_strides_zero_copy() -> None:
    a = mx.arange(12, dtype=mx.int32).reshape(3, 4)
    mx.eval(a)
    for view, strides, ref in ((a.T, (1, 4), np.arange(12).reshape(3, 4).T),
                               (a[::-1], (-4, 1), np.arange(12).reshape(3, 4)[::-1]),
                               (a[:, ::2], (4, 2), np.arange(12).reshape(3, 4)[:, ::2])):
        t = hb.asarray(view)
        assert t.strides == strides
        assert t.buffers[0].ptr >= _addr(a) and not t.copied
        assert np.asarray(hb.convert(t, "numpy")).tolist() == ref.tolist()


def test_export_to_torch_is_zero_copy() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    a = mx.arange(64, dtype=mx.float32)
    mx.eval(a)
    y, copies = _convert(a, "torch")
    assert isinstance(y, torch.Tensor) and not copies and y.data_ptr() == _addr(a)


def test_export_to_jax_copies_because_mlx_aligns_to_8_bytes() -> None:
    """MLX's CPU allocator places arrays 8 or 24 bytes past a 64-byte boundary; JAX
    aliases only 64-byte aligned memory, so it copies, and says why."""
    pytest.importorskip("jax", reason="jax is not installed")
    a = mx.arange(4096, dtype=mx.float32)
    mx.eval(a)
    assert _addr(a) % 64
    y, copies = _convert(a, "jax")
    assert y.unsafe_buffer_pointer() != _addr(a)
    assert copies and "64-byte aligned" in copies[0]


def test_to_hurray_copy_true_and_the_memory_outlives_the_array() -> None:
    a = mx.arange(100, dtype=mx.float32)
    mx.eval(a)
    c = mlx_adapter.to_hurray(a, copy=True)
    assert c.copied and c.data_ptr != _addr(a)
    t = hb.asarray(a)
    n = hb.convert(a, "numpy")
    gone = weakref.ref(a)
    del a
    gc.collect()
    # the export holds the array (its memory), so it must not be gone before the views
    assert gone() is not None
    assert np.asarray(hb.convert(t, "numpy"))[99] == 99.0 and n[50] == 50.0
    del t, n
    gc.collect()
    assert gone() is None, "the views released, the array must be freed"


def test_only_mlx_arrays_and_the_cpu_are_taken() -> None:
    with pytest.raises(hb.UnsupportedError, match=r"converts mlx\.core\.array"):
        mlx_adapter.to_hurray(np.zeros(3))
    t = hb.asarray(np.zeros(3, np.float32))
    with pytest.raises(hb.UnsupportedError, match="imports to the CPU only"):
        mlx_adapter.from_hurray(t, device="gpu")
    for cpu in (None, "cpu", mx.cpu, mx.Device(mx.cpu), (1, 0), hb.CPU):
        assert mlx_adapter.from_hurray(t, device=cpu, copy=True).shape == (3,)
    with pytest.raises(hb.UnsupportedError, match=r"takes an hb\.Tensor"):
        mlx_adapter.from_hurray(np.zeros(3))


# ------------------------------------------------------------------- import
def test_import_copies_and_says_so() -> None:
    x = np.arange(10, dtype=np.float32)
    m, copies = _convert(x, "mlx")
    assert isinstance(m, mx.array) and np.asarray(m).tolist() == x.tolist()
    assert _addr(m) != _np_addr(x)
    assert copies and "MLX copies every import of host memory" in copies[0]
    with pytest.raises(hb.CopyRequiredError, match="MLX would have to copy"):
        hb.convert(x, "mlx", copy=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # copy=True asked for it: no warning
        assert np.asarray(hb.convert(x, "mlx", copy=True)).tolist() == x.tolist()


def test_the_copy_is_taken_at_once() -> None:
    """MLX is lazy, but its import must not be: the source may change or go right after."""
    x = np.arange(8, dtype=np.float32)
    m = hb.convert(x, "mlx", copy=True)
    x[:] = -1
    del x
    gc.collect()
    assert np.asarray(m).tolist() == list(range(8))


def test_float64_stays_float64() -> None:
    x = np.array([1 / 3, 2.0**60 + 1, -1e300], np.float64)
    m = hb.convert(x, "mlx", copy=True)
    assert m.dtype == mx.float64 and np.asarray(m).tolist() == x.tolist()
    for dt in (np.int64, np.uint64):
        big = np.array([2**62 + 1, 3], dt)
        assert np.asarray(hb.convert(big, "mlx", copy=True)).tolist() == big.tolist()


def test_complex128_is_refused_not_narrowed() -> None:
    with pytest.raises(hb.UnsupportedError, match="cast it to complex64"):
        hb.convert(np.ones(3, np.complex128), "mlx", copy=True)


def test_negative_strides_reach_mlx_compact() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[::-1, ::-2]
    m, copies = _convert(x, "mlx")
    assert np.asarray(m).tolist() == x.tolist()
    assert "negative" in copies[0] and "made compact first" in copies[0]
    with pytest.raises(hb.CopyRequiredError, match="negative"):
        hb.convert(x, "mlx", copy=False)


def test_gaps_and_transposes_arrive_in_order() -> None:
    x = np.arange(24, dtype=np.int16).reshape(4, 6)
    for view in (x.T, x[:, ::3], x[1:3].T):
        assert np.asarray(hb.convert(view, "mlx", copy=True)).tolist() == view.tolist()


def test_bool8_bytes_other_than_0_and_1_arrive_as_true() -> None:
    raw = np.array([0, 1, 2, 255, 0], np.uint8)
    t = hb.Tensor(hb.Descriptor([5], hb.bool8), [(BufferRole.DATA, raw.ctypes.data, 5)],
                  owner=raw)
    m = hb.convert(t, "mlx", copy=True)
    assert m.dtype == mx.bool_ and mx.sum(m).item() == 3
    assert np.asarray(m).view(np.uint8).tolist() == [0, 1, 1, 1, 0]


def test_packed_bool_arrives_unpacked() -> None:
    bits = np.array([True, False, True, True, False, False, False, True, True])
    packed = hb.quant.pack_subbyte(hb.asarray(bits))
    assert packed.dtype is hb.bool
    m, copies = _convert(packed, "mlx")
    assert m.dtype == mx.bool_ and np.asarray(m).tolist() == bits.tolist()
    assert "packed 1-bit bool unpacked" in copies[0]


@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2)])
def test_rank_0_and_empty(shape: tuple[int, ...]) -> None:
    x = np.full(shape, 3, np.float32)
    m, copies = _convert(x, "mlx")
    assert m.shape == shape and m.dtype == mx.float32
    assert np.asarray(m).tolist() == x.tolist()
    assert bool(copies) == bool(x.size), "an empty array copies nothing, so reports nothing"
    t = hb.asarray(m)
    assert t.shape == shape and (t.data_ptr == 0) == (x.size == 0)
    if not x.size:
        assert mlx_adapter.from_hurray(hb.asarray(x), copy=False).shape == shape


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "complex64", "bool_", "uint64",
                                   "int8"])
def test_each_type_round_trips_with_numpy(dtype: str) -> None:
    mdt = getattr(mx, dtype)
    a = mx.array([0, 1, 2, 3], dtype=mdt) if dtype != "bool_" else mx.array([True, False])
    mx.eval(a)
    t = hb.asarray(a)
    assert t.data_ptr == _addr(a.view(mx.uint8) if dtype == "bfloat16" else a)
    back = hb.convert(t, "mlx")  # a whole view of a: a itself
    assert back is a
    b = hb.convert(hb.convert(t, "numpy"), "mlx", copy=True)  # through NumPy: a copy
    assert b.dtype == mdt and mx.array_equal(a, b).item()


def test_a_whole_view_comes_back_as_the_array_and_a_part_is_copied() -> None:
    a = mx.arange(12, dtype=mx.float32).reshape(3, 4)
    mx.eval(a)
    t = hb.asarray(a)
    assert mlx_adapter.from_hurray(t, copy=False) is a
    assert mlx_adapter.from_hurray(t, copy=True) is not a  # copy=True: fresh memory
    n = hb.convert(a, "numpy")
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(n[1:], "mlx", copy=False)  # a part of a: not a's whole view
    assert np.asarray(hb.convert(n[1:], "mlx", copy=True)).tolist() == n[1:].tolist()


def test_an_array_moved_to_new_memory_is_not_given_back_for_the_old() -> None:
    """MLX makes an update it cannot make in place (v[0] = 99 on a view of another array,
    any update while an export lives) in new memory: the old export still describes the
    old values, so converting it must copy those, not hand back the array."""
    a = _ev(mx.arange(6, dtype=mx.float32))
    v = _ev(a[2:])
    t = hb.asarray(v)
    v[0] = 99.0
    mx.eval(v)
    assert v[0].item() == 99.0 and hb.convert(t, "numpy")[0] == 2.0
    m, copies = _convert(t, "mlx")
    assert m is not v and np.asarray(m).tolist() == [2.0, 3.0, 4.0, 5.0] and copies
    # While an export lives MLX makes every update in new memory (the export holds the
    # old memory: see to_hurray), in place or not.
    w = _ev(mx.arange(4, dtype=mx.float32))
    u = hb.asarray(w)
    assert hb.convert(u, "mlx") is w
    w += 1
    w[3] = 9.0
    mx.eval(w)
    assert np.asarray(w).tolist() == [1, 2, 3, 9]
    assert hb.convert(u, "numpy").tolist() == [0, 1, 2, 3]
    back, copies = _convert(u, "mlx")
    assert back is not w and np.asarray(back).tolist() == [0, 1, 2, 3] and copies


# ----------------------------------------------------------- read-only memory
def _sources(tmp_path: Path) -> dict[str, hb.Tensor]:
    from hurray_bridge import safetensors_io

    x = np.arange(16, dtype=np.float32)
    hb.save(tmp_path / "w.hurray", {"w": x})
    safetensors_io.save(tmp_path / "w.safetensors", {"w": x})
    return {"hurray": hb.load(tmp_path / "w.hurray")["w"],
            "safetensors": hb.load(tmp_path / "w.safetensors")["w"],
            "bytes": hb.loads(hb.dumps({"w": x}))["w"]}


def test_read_only_sources_reach_mlx_as_its_own_copy(tmp_path: Path) -> None:
    for name, t in _sources(tmp_path).items():
        assert t.readonly or name == "bytes", name  # hb.loads copies what it is given
        with pytest.raises(hb.CopyRequiredError):
            hb.convert(t, "mlx", copy=False)
        m, copies = _convert(t, "mlx")
        assert copies, name
        assert _addr(m) != t.data_ptr and np.asarray(m).tolist() == list(range(16)), name


@pytest.mark.parametrize("kind", ["hurray", "safetensors"])
def test_writing_through_mlx_after_load_leaves_the_file_alone(tmp_path: Path,
                                                              kind: str) -> None:
    path = tmp_path / f"w.{kind}"
    r = _run(f"""
        import numpy as np, mlx.core as mx, hurray_bridge as hb
        from hurray_bridge import safetensors_io
        x = np.arange(16, dtype=np.float32)
        path = {str(path)!r}
        (hb.save if path.endswith(".hurray") else safetensors_io.save)(path, {{"w": x}})
        t = hb.load(path)["w"]
        m = hb.convert(t, "mlx", copy=True)
        m[0] = 100.0          # MLX writes its own array in place
        m += 1                # and computes on it
        mx.eval(m)
        n = hb.convert(m, "numpy")
        n[1] = -7.0           # a write through MLX's shared export
        print(np.asarray(m)[:2].tolist(), hb.convert(t, "numpy")[:2].tolist())
    """)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout == "[101.0, -7.0] [0.0, 1.0]\n", r.stdout
    reread = hb.load(path)["w"]
    assert hb.convert(reread, "numpy", copy=True).tolist() == list(range(16))


# ------------------------------------------------------------------- the README
def test_the_readme_mlx_lines_run_as_written(tmp_path: Path) -> None:
    """The README's MLX block in a fresh interpreter (in a scratch folder, for its file):
    the copy=False line raises CopyRequiredError, the import of n copies with a
    CopyWarning, and the comments' claims hold."""
    pytest.importorskip("torch", reason="torch is not installed")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in text.split("```python\n")[1:]
                 if b.startswith("import hurray_bridge as hb\nimport mlx.core as mx\n"))
    lines = block.split("```", 1)[0].splitlines()
    at = next(i for i, ln in enumerate(lines) if '"mlx", copy=False)' in ln)
    assert "raises CopyRequiredError" in lines[at]
    code = "\n".join([
        "import warnings", "import numpy as np",
        "warnings.simplefilter('error')",
        "with warnings.catch_warnings(record=True) as caught:",
        "    warnings.simplefilter('always')",
        *("    " + ln for ln in lines[:at]),
        "try:", "    " + lines[at], "except hb.CopyRequiredError:", "    pass",
        "else:", "    raise AssertionError('copy=False did not raise')",
        "with warnings.catch_warnings():",
        "    warnings.simplefilter('ignore', hb.CopyWarning)",
        *("    " + ln for ln in lines[at + 1:]),
        "assert [str(w.message) for w in caught if w.category is hb.CopyWarning] == "
        "['copied for mlx: MLX copies every import of host memory (mx.array and "
        "mx.from_dlpack take no foreign CPU memory)']",
        "assert a[0].item() == 5 and a[1].item() == 2",
        "assert t.data_ptr() == n.__array_interface__['data'][0]",
        "assert m[0].item() == 5 and w[0].item() == 5 and w.dtype == mx.float32",
        "print('ok')"])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and res.stdout == "ok\n", res.stdout + res.stderr
