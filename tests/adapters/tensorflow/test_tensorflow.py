"""The TensorFlow adapter: the quirks of tensorflow 2.21's DLPack, each pinned and handled.

Each quirk has two tests: one that pins what TensorFlow itself does (so an upgrade that
changes it names what to revisit) and one that shows the adapter handling it. What would
crash the interpreter without the handling (a string tensor's export, unaligned memory,
an in-place write into a read-only file mapping) runs in a child process.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import subprocess
import sys
import textwrap
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed")
np = pytest.importorskip("numpy", reason="numpy is not installed")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge import _capsule  # noqa: E402
from hurray_bridge._memory import aligned_zeros  # noqa: E402
from hurray_bridge.adapters import tensorflow as htf  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
tfd = tf.experimental.dlpack


def _ptr(x: Any) -> int:
    """A TensorFlow tensor's data address, read from its own DLPack export."""
    view = _capsule.consume_capsule(tfd.to_dlpack(x))
    return int(view.data)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)


def _aligned(values: Any, dtype: Any = np.float32) -> Any:
    a = aligned_zeros(np.shape(values), dtype)
    a[...] = values
    return a


def _unaligned(n: int, offset: int = 16) -> Any:
    """float32 values 0..n-1 at ``offset`` bytes past a 64-byte boundary."""
    raw = np.zeros(4 * n + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    a = raw[start:start + 4 * n].view(np.float32)
    a[:] = np.arange(n)
    return a


@pytest.fixture
def copies() -> Any:
    """The CopyWarnings raised inside the ``with`` block, as their messages."""
    class Record:
        def __enter__(self) -> list[str]:
            self._cm = warnings.catch_warnings(record=True)
            self.caught = self._cm.__enter__()
            warnings.simplefilter("always")
            self.messages: list[str] = []
            return self.messages

        def __exit__(self, *exc: Any) -> None:
            self.messages.extend(str(w.message) for w in self.caught
                                 if issubclass(w.category, hb.CopyWarning))
            self._cm.__exit__(*exc)

    return Record


# --------------------------------------------------------- export: legacy, immutable
def test_tf_exports_legacy_capsules_of_the_constants_own_memory() -> None:
    """Pins tensorflow: max_version is ignored (a legacy capsule comes back), and a write
    through the capsule changes the constant: its memory must not leave writable."""
    x = tf.constant([1.0, 2.0, 3.0])
    cap = x.__dlpack__(max_version=(1, 0))
    assert _capsule.capsule_name(cap) == "dltensor"
    view = _capsule.consume_capsule(cap)
    assert not view.versioned
    (ctypes.c_float * 3).from_address(view.data)[0] = 100.0
    assert float(tf.reduce_sum(x)) == 105.0
    for kw in ({"stream": -1}, {"copy": True}, {"dl_device": (1, 0)}):
        with pytest.raises(RuntimeError, match="does not support DLPack export"):
            x.__dlpack__(**kw)


def test_constant_converts_read_only_and_is_never_written() -> None:
    assert htf.LEGACY_EXPORTS_MUTABLE is False
    x = tf.constant([1.0, 2.0, 3.0])
    n = hb.convert(x, "numpy")
    assert not n.flags.writeable
    assert n.ctypes.data == _ptr(x)  # zero-copy
    with pytest.raises(ValueError, match="read-only"):
        n[0] = 100.0
    t = hb.asarray(x)
    assert t.readonly and not t.copied and t.data_ptr == _ptr(x)
    assert hb.from_dlpack(x).readonly  # the core reads TF's legacy capsule by the declaration
    assert not np.from_dlpack(t).flags.writeable  # READ_ONLY travels in a versioned capsule
    assert float(tf.reduce_sum(x)) == 6.0


def test_to_hurray_copy_true_gives_writable_fresh_memory() -> None:
    x = tf.constant([1.0, 2.0, 3.0])
    t = htf.to_hurray(x, copy=True)
    assert t.copied and not t.readonly and t.data_ptr != _ptr(x)
    with pytest.raises(hb.UnsupportedError, match="copy must be"):
        htf.to_hurray(x, copy="no")  # type: ignore[arg-type]


def test_tf_tensor_back_to_tf_is_the_same_tensor() -> None:
    x = tf.constant([[1, 2], [3, 4]])
    assert hb.convert(x, "tensorflow") is x
    y = hb.convert(x, "tensorflow", copy=True)
    assert _ptr(y) != _ptr(x) and y.numpy().tolist() == [[1, 2], [3, 4]]


# ------------------------------------------------------------- import: strides
def test_tf_refuses_strided_imports() -> None:
    """Pins tensorflow: any non-compact capsule is refused, a transpose included."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (a[:, ::2], a.T):
        with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid strides"):
            tfd.from_dlpack(view.__dlpack__())


def test_strided_source_reaches_tf_as_a_reported_copy(copies: Any) -> None:
    a = _aligned(np.arange(12).reshape(3, 4))
    with copies() as msgs:
        y = hb.convert(a[:, ::2], "tensorflow")
    assert y.numpy().tolist() == a[:, ::2].tolist()
    assert any("compact" in m for m in msgs), msgs
    with pytest.raises(hb.CopyRequiredError, match="compact"):
        hb.convert(a.T, "tensorflow", copy=False)
    with pytest.raises(hb.CopyRequiredError, match="compact"):
        hb.convert(a[::-1], "tensorflow", copy=False)  # negative strides too
    with copies() as msgs:
        assert hb.convert(a[::-1], "tensorflow").numpy().tolist() == a[::-1].tolist()
    assert msgs


# ----------------------------------------------------------- import: alignment
def test_tf_aliases_unaligned_memory_then_aborts_on_it() -> None:
    """Pins tensorflow: from_dlpack does not copy memory that is 16 but not 64-byte
    aligned (same address), and its first reduction aborts the process."""
    r = _run("""
        import numpy as np, tensorflow as tf
        from hurray_bridge import _capsule
        raw = np.zeros(256, np.uint8)
        a = raw[-raw.ctypes.data % 64 + 16:][:64].view(np.float32)
        y = tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        shared = _capsule.consume_capsule(tf.experimental.dlpack.to_dlpack(y)).data
        print("shared", shared == a.ctypes.data, flush=True)
        print(float(tf.reduce_sum(y)), flush=True)
    """)
    assert r.stdout.startswith("shared True"), (r.stdout, r.stderr[-2000:])
    assert r.returncode != 0 and "IsAligned" in r.stderr, (r.returncode, r.stderr[-2000:])


def test_alignment_is_the_wheels_eigen_alignment() -> None:
    assert "-DEIGEN_MAX_ALIGN_BYTES=64" in tf.sysconfig.get_compile_flags()
    assert htf._alignment() == 64


def test_unaligned_source_is_copied_and_tf_computes_on_it(copies: Any) -> None:
    a = _unaligned(16)
    with copies() as msgs:
        y = hb.convert(a, "tensorflow")
    assert _ptr(y) != a.ctypes.data and _ptr(y) % 64 == 0
    assert float(tf.reduce_sum(y)) == 120.0  # would abort the process on a's memory
    assert any("64-byte aligned" in m for m in msgs), msgs
    with pytest.raises(hb.CopyRequiredError, match="64-byte aligned"):
        hb.convert(a, "tensorflow", copy=False)


def test_aligned_writable_source_is_shared() -> None:
    a = _aligned(np.arange(16))
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        y = hb.convert(a, "tensorflow", copy=False)
    assert _ptr(y) == a.ctypes.data
    assert float(tf.reduce_sum(y)) == 120.0


# ------------------------------------------------------------ read-only sources
def test_tf_writes_into_imported_memory_in_place() -> None:
    """Pins tensorflow: InplaceUpdate writes into the buffer it is given, imported memory
    included; so read-only memory must not reach TensorFlow as it is."""
    a = _aligned(np.arange(4))
    y = tfd.from_dlpack(a.__dlpack__())
    tf.raw_ops.InplaceUpdate(x=y, i=[0], v=[77.0])
    assert a[0] == 77.0


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    safetensors_numpy = pytest.importorskip("safetensors.numpy",
                                            reason="safetensors is in the test extra")
    values = {"w": np.arange(64, dtype=np.float32)}
    out = {"hurray": tmp_path / "w.hurray", "safetensors": tmp_path / "w.safetensors"}
    hb.save(out["hurray"], values)
    safetensors_numpy.save_file(values, str(out["safetensors"]))
    return out


@pytest.mark.parametrize("kind", ["hurray", "safetensors"])
def test_loaded_file_reaches_tf_as_a_copy(kind: str, files: dict[str, Path],
                                          copies: Any) -> None:
    f = hb.load(files[kind])
    t = f["w"]
    assert t.readonly
    with copies() as msgs:
        y = hb.convert(t, "tensorflow")
    assert _ptr(y) != t.data_ptr
    assert y.numpy().tolist() == list(range(64))
    # One copy, whose reasons include read-only (a safetensors tensor may be unaligned too).
    assert len(msgs) == 1 and "read-only" in msgs[0], msgs
    with pytest.raises(hb.CopyRequiredError, match="read-only"):
        hb.convert(t, "tensorflow", copy=False)


@pytest.mark.parametrize("kind", ["hurray", "safetensors"])
def test_in_place_write_after_load_neither_crashes_nor_changes_the_file(
        kind: str, files: dict[str, Path]) -> None:
    path = files[kind]
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    r = _run(f"""
        import warnings, tensorflow as tf, hurray_bridge as hb
        warnings.simplefilter("ignore")
        f = hb.load({str(path)!r})
        y = hb.convert(f["w"], "tensorflow")
        z = tf.raw_ops.InplaceUpdate(x=y, i=[0], v=[42.0])  # SIGSEGV on the mapping itself
        print(float(y[0]), float(f["w"].memoryview().cast("f")[0]))
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split() == ["42.0", "0.0"], r.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_loads_bytes_are_a_private_copy_tf_may_share() -> None:
    raw = hb.dumps({"w": np.arange(16, dtype=np.float32)})
    t = hb.loads(raw)["w"]
    assert not t.readonly  # hb.loads copied the bytes: writable memory of its own
    y = hb.convert(t, "tensorflow", copy=False)
    assert _ptr(y) == t.data_ptr
    tf.raw_ops.InplaceUpdate(x=y, i=[0], v=[42.0])
    assert raw == hb.dumps({"w": np.arange(16, dtype=np.float32)})


def test_read_only_numpy_and_jax_sources_are_copied(copies: Any) -> None:
    a = _aligned(np.arange(8))
    a.flags.writeable = False
    with copies() as msgs:
        y = hb.convert(a, "tensorflow")
    assert _ptr(y) != a.ctypes.data and any("read-only" in m for m in msgs)
    jnp = pytest.importorskip("jax.numpy", reason="jax is not installed")
    j = jnp.arange(8, dtype=jnp.float32)
    with copies() as msgs:
        y = hb.convert(j, "tensorflow")
    assert _ptr(y) != j.unsafe_buffer_pointer() and any("read-only" in m for m in msgs)
    assert y.numpy().tolist() == list(range(8))


# ------------------------------------------------------------------ element types
@pytest.mark.parametrize("name", ["bool8", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                  "uint32", "uint64", "float16", "bfloat16", "float32",
                                  "float64", "complex64", "complex128"])
def test_element_type_round_trips_zero_copy(name: str) -> None:
    d = hb.dtypes.dtype_from_name(name)
    assert d in htf.native_dtypes()
    nd = htf.native_dtype(d).as_numpy_dtype
    values = np.arange(6).reshape(2, 3) % 2 if name == "bool8" else np.arange(6).reshape(2, 3)
    a = aligned_zeros((2, 3), nd)
    a[...] = values
    t = hb.asarray(a)
    y = htf.from_hurray(t, copy=False)
    assert y.dtype == htf.native_dtype(d) and _ptr(y) == a.ctypes.data
    u = htf.to_hurray(y)
    assert u.dtype is d and u.data_ptr == a.ctypes.data and u.readonly
    assert np.array_equal(hb.convert(u, "numpy"), a)


def test_tf_holds_float8_and_sub_byte_types_its_dlpack_refuses() -> None:
    """Pins tensorflow: float8, int4, int2 and float4 tensors exist, their DLPack export
    is refused, and __array__ gives a view of the buffer (the same address twice)."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    for name in ("float8_e4m3fn", "int4", "float4_e2m1fn"):
        x = tf.constant(np.arange(4).astype(getattr(ml_dtypes, name)))
        with pytest.raises(tf.errors.InvalidArgumentError, match="not supported by dlpack"):
            tfd.to_dlpack(x)
        a, b = np.asarray(x), np.asarray(x)
        assert a.ctypes.data == b.ctypes.data and a.nbytes == 4  # one element per byte


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "int4", "uint4", "int2", "uint2",
                                  "float4_e2m1fn"])
def test_types_outside_its_dlpack_export_zero_copy_and_import_by_copy(
        name: str, copies: Any) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    d = hb.dtypes.dtype_from_name(name)
    assert d in htf.native_dtypes() and d in htf.by_value()
    values = (np.arange(6) % (1 << d.bits if d.is_subbyte else 7)).astype(np.uint8)
    ref = values.view(getattr(ml_dtypes, name)) if d.is_subbyte else (
        values.astype(getattr(ml_dtypes, name)))
    x = tf.constant(ref)
    t = hb.asarray(x)
    assert t.dtype is d and t.readonly and not t.copied
    assert t.data_ptr == np.asarray(x).ctypes.data  # TensorFlow's own buffer
    assert t.descriptor.padded is d.is_subbyte
    assert hb.convert(x, "tensorflow") is x
    back = hb.convert(t, "numpy")
    assert not back.flags.writeable  # TensorFlow's own __array__ view is writable: not ours
    assert np.array_equal(back.view(np.uint8), ref.view(np.uint8))
    with copies() as msgs:
        y = hb.convert(ref, "tensorflow")
    assert y.dtype == htf.native_dtype(d)
    assert np.array_equal(np.asarray(y).view(np.uint8) & 0xFF, ref.view(np.uint8))
    assert any("tf.constant" in m for m in msgs), msgs
    with pytest.raises(hb.CopyRequiredError, match=r"tf\.constant"):
        hb.convert(ref, "tensorflow", copy=False)


def test_packed_and_dirty_padded_sub_byte_values_reach_tf() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    codes = np.array([1, 14, 7, 8, 0], np.uint8)  # int4: 1, -2, 7, -8, 0
    packed = hb.pack_subbyte(hb.asarray(codes.view(ml_dtypes.int4)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        y = hb.convert(packed, "tensorflow")
        # High bits set in the padded form are to be ignored (element-types.md 4.3).
        dirty = hb.convert((codes | 0xF0).view(ml_dtypes.int4), "tensorflow")
    assert y.numpy().tolist() == dirty.numpy().tolist() == [1, -2, 7, -8, 0]
    assert int(tf.reduce_sum(tf.cast(dirty, tf.int32))) == -2


def test_types_tf_lacks_are_refused_by_name() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    with pytest.raises(hb.UnsupportedError, match="float8_e8m0fnu"):
        hb.convert(np.zeros(4, ml_dtypes.float8_e8m0fnu), "tensorflow")
    with pytest.raises(hb.UnsupportedError, match="qint8"):
        hb.asarray(tf.constant([1], tf.qint8))
    assert hb.float8_e8m0fnu not in htf.native_dtypes()


def test_string_tensor_export_aborts_tf_and_is_refused_first() -> None:
    r = _run("""
        import tensorflow as tf
        tf.experimental.dlpack.to_dlpack(tf.constant(["a"]))
    """)
    assert r.returncode != 0 and "DataTypeCanUseMemcpy" in r.stderr, r.stderr[-2000:]
    r = _run("""
        import tensorflow as tf, hurray_bridge as hb
        try:
            hb.asarray(tf.constant(["a", "b"]))
        except hb.UnsupportedError as exc:
            print("refused:", exc)
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("refused:") and "string tensor" in r.stdout, r.stdout


def test_bool_bytes_above_one_are_normalised_in_a_copy(copies: Any) -> None:
    raw = _aligned([0, 1, 2, 255], np.uint8)
    y = tfd.from_dlpack(raw.view(np.bool_).__dlpack__())
    # Pins tensorflow: it counts the byte values, not the true elements.
    assert int(tf.math.count_nonzero(y)) == 258
    t = hb.asarray(raw.view(np.bool_))
    with copies() as msgs:
        z = hb.convert(t, "tensorflow")
    assert int(tf.math.count_nonzero(z)) == 3
    assert z.numpy().tolist() == [False, True, True, True]
    assert _ptr(z) != raw.ctypes.data and any("0x01" in m for m in msgs), msgs
    assert raw.tolist() == [0, 1, 2, 255]  # the source is untouched
    with pytest.raises(hb.CopyRequiredError, match="0x01"):
        hb.convert(t, "tensorflow", copy=False)


def test_packed_one_bit_bool_is_unpacked(copies: Any) -> None:
    t = hb.pack_subbyte(hb.asarray(np.array([True, False, True, True, False])))
    assert t.dtype is hb.bool
    with copies() as msgs:
        y = hb.convert(t, "tensorflow")
    assert y.dtype == tf.bool and y.numpy().tolist() == [True, False, True, True, False]
    assert any("unpacked" in m for m in msgs)
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(t, "tensorflow", copy=False)


# ------------------------------------------------------------ shapes and objects
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (3, 0, 2)], ids=str)
def test_empties_and_rank_zero(shape: tuple[int, ...]) -> None:
    x = tf.ones(shape)
    t = hb.asarray(x)
    assert t.shape == shape
    if 0 in shape:
        assert t.data_ptr == 0
    else:
        assert t.data_ptr == _ptr(x)
    a = aligned_zeros(shape, np.float32)
    y = hb.convert(a, "tensorflow", copy=False)
    assert tuple(y.shape) == shape and y.dtype == tf.float32


def test_variable_converts_as_a_read_only_snapshot_of_its_buffer() -> None:
    v = tf.Variable([1.0, 2.0, 3.0, 4.0])
    t = hb.asarray(v)
    assert t.readonly and t.data_ptr == _ptr(v.read_value())  # the variable's own buffer
    v.assign_add([10.0] * 4)  # copies on write: the buffer is shared with t
    assert hb.convert(t, "numpy").tolist() == [1.0, 2.0, 3.0, 4.0]
    assert v.numpy().tolist() == [11.0, 12.0, 13.0, 14.0]


def test_sparse_ragged_and_symbolic_tensors_are_refused_by_name() -> None:
    with pytest.raises(hb.UnsupportedError, match="SparseTensor"):
        htf.to_hurray(tf.sparse.SparseTensor([[0, 0]], [1.0], [2, 2]))
    with pytest.raises(hb.UnsupportedError, match="RaggedTensor"):
        htf.to_hurray(tf.ragged.constant([[1], [2, 3]]))
    seen = []

    @tf.function
    def f(z: Any) -> Any:
        try:
            htf.to_hurray(z)
        except hb.UnsupportedError as exc:
            seen.append(str(exc))
        return z

    f(tf.constant([1.0]))
    assert seen and "symbolic" in seen[0]
    with pytest.raises(hb.UnsupportedError, match="from_hurray"):
        htf.from_hurray(np.zeros(3))
    assert htf.special_kind(tf.constant([1.0])) is None


def test_device_argument() -> None:
    a = _aligned(np.arange(4))
    assert _ptr(htf.from_hurray(hb.asarray(a), device="CPU")) == a.ctypes.data
    assert _ptr(htf.from_hurray(hb.asarray(a), device="/device:CPU:0")) == a.ctypes.data
    assert _ptr(htf.from_hurray(hb.asarray(a), device=(1, 0))) == a.ctypes.data
    with pytest.raises(hb.UnsupportedError, match="not a TensorFlow device"):
        htf.from_hurray(hb.asarray(a), device="TPU:0")
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        htf.from_hurray(hb.asarray(a), device="GPU:0", copy=False)
    if not tf.config.list_logical_devices("GPU"):
        # tf.device("GPU:0") would silently place the copy on the CPU: refused instead.
        with pytest.raises(hb.UnsupportedError, match="0 GPU"):
            htf.from_hurray(hb.asarray(a), device="GPU:0")


# ---------------------------------------------------------------------- lifetimes
def test_hb_tensor_keeps_tf_memory_after_the_tensor_is_dropped() -> None:
    x = tf.constant(np.arange(1 << 14, dtype=np.float32))
    ref = weakref.ref(x)
    t = htf.to_hurray(x)
    del x
    gc.collect()
    junk = [tf.fill([1 << 14], 7.0) for _ in range(8)]  # reuse freed memory, if any
    assert np.array_equal(hb.convert(t, "numpy"), np.arange(1 << 14, dtype=np.float32))
    del t, junk
    gc.collect()
    assert ref() is None


def test_tf_tensor_keeps_the_source_array_alive() -> None:
    a = _aligned(np.arange(64))
    ref = weakref.ref(a)
    y = hb.convert(a, "tensorflow", copy=False)
    assert _ptr(y) == a.ctypes.data
    del a
    gc.collect()
    assert ref() is not None
    assert float(tf.reduce_sum(y)) == float(sum(range(64)))
    del y
    gc.collect()
    assert ref() is None
