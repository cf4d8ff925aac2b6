"""Sharded tensors (docs/spec/sharding.md): split, assemble, the shard-set rules, and JAX.

The JAX tests need 8 CPU devices, which XLA only creates when
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` is set before JAX is
imported. ``test_run_the_jax_cases_in_a_subprocess`` therefore runs this file again in
a fresh pytest process with that flag and ``HB_SHARDS_JAX_CHILD=1``; only there
are the ``test_jax_*`` cases below defined.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import DYNAMIC, Buffer, BufferRole, Descriptor, Shard
from hurray_bridge.shards import Box, ShardedTensor, _copy_strided, assemble, grid_boxes, split
from tests.frameworks import need, not_installed, optional
from tests.hurray_bridge.test_pickle_shm import make

np = pytest.importorskip("numpy", reason="numpy is not installed")

ROOT = Path(__file__).resolve().parents[2]
IN_JAX_CHILD = os.environ.get("HB_SHARDS_JAX_CHILD") == "1"


def ml(name: str) -> Any:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    return getattr(ml_dtypes, name)


DTYPES = ["float32", "int8", "uint16", "float64", "complex64", "bool", "bfloat16",
          "float8_e4m3fn"]


def sample(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (*shape, 16), dtype=np.uint8)
    dt = np.dtype(ml(dtype)) if dtype in ("bfloat16", "float8_e4m3fn") else np.dtype(dtype)
    if dt == np.bool_:
        return (raw[..., 0] & 1).astype(np.bool_)
    return np.ascontiguousarray(raw[..., : dt.itemsize]).view(dt).reshape(shape)


def bits(a: Any) -> bytes:
    return np.ascontiguousarray(np.asarray(a)).tobytes()  # NaN-safe equality


def inside(ptr: int, a: np.ndarray) -> bool:
    lo = a.__array_interface__["data"][0]
    return lo <= ptr < lo + max(a.nbytes, 1)


LAYOUTS = {
    "whole": (1, 1),
    "rows_3_uneven": (3, 1),
    "grid_3x2": (3, 2),
    "cols_4": (1, 4),
    "more_parts_than_rows": (9, 1),  # trailing empty shards
}


# --------------------------------------------------------------- split/assemble
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_views_and_assemble_bit_exact(dtype: str, layout: str) -> None:
    a = sample((7, 5), dtype)
    st = split(a, grid_boxes(a.shape, LAYOUTS[layout]))
    assert st.shape == (7, 5) and st.dtype == hb.asarray(a).dtype
    for box, t in zip(st.boxes, st.shards):
        sh = t.descriptor.shard
        assert sh is not None and sh.global_shape == (7, 5) and sh.offsets == box.offsets
        assert t.shape == box.sizes and not t.copied
        if box.is_empty:
            assert t.buffers[0].ptr == 0 and t.nbytes == 0
        else:
            # A view: element [0, 0] of the shard is element `offsets` of the source.
            want = a[box.slices()].__array_interface__["data"][0]
            assert t.data_ptr == want and inside(t.buffers[0].ptr, a)
            assert bits(t) == bits(a[box.slices()])
    out = assemble(st)
    assert isinstance(out, np.ndarray) and out.flags.c_contiguous and out.dtype == a.dtype
    assert bits(out) == bits(a)
    assert not np.shares_memory(out, a)  # assembly is an explicit copy


def test_row_boxes_are_row_major_views_column_boxes_strided() -> None:
    a = sample((6, 4), "float32")
    rows = split(a, grid_boxes(a.shape, (2, 1)))
    assert all(t.layout == hb.Layout.ROW_MAJOR for t in rows)
    cols = split(a, grid_boxes(a.shape, (1, 2)))
    assert all(t.layout == hb.Layout.STRIDED and t.strides == (4, 1) for t in cols)


@pytest.mark.parametrize("view", ["transposed", "negative", "every_other"])
def test_split_strided_sources(view: str) -> None:
    base = sample((8, 6), "int32")
    a = {"transposed": base.T, "negative": base[::-1, ::-2], "every_other": base[::2]}[view]
    st = split(a, grid_boxes(a.shape, (2, 2)))
    for box, t in zip(st.boxes, st.shards):
        assert bits(t) == bits(a[box.slices()])
        assert inside(t.data_ptr, base)
    assert bits(assemble(st)) == bits(a)


def test_irregular_boxes_and_slices() -> None:
    a = sample((5, 6), "float64")
    boxes = [
        (slice(0, 2), slice(None)),  # a tuple of slices
        Box((2, 0), (3, 1)),
        ((2, 1), (3, 5)),  # (offsets, sizes)
    ]
    st = split(a, boxes)
    assert [b.sizes for b in st.boxes] == [(2, 6), (3, 1), (3, 5)]
    assert bits(assemble(st)) == bits(a)


def test_rank_zero_and_empty_global_shapes() -> None:
    s = split(np.float32(2.5), [((), ())])
    assert len(s) == 1 and s.shards[0].shape == ()
    assert float(assemble(s)) == 2.5
    e = split(np.zeros((0, 4), np.int8), [((0, 0), (0, 4)), ((0, 0), (0, 2))])
    out = assemble(e)
    assert out.shape == (0, 4)
    assert assemble(e, to="hurray").buffers[0].ptr == 0  # nothing allocated
    grid = split(np.zeros((3, 0, 5)), grid_boxes((3, 0, 5), (3, 1, 1)))
    assert assemble(grid).shape == (3, 0, 5)


def test_replicas() -> None:
    a = sample((4, 3), "int16")
    top, bottom = ((0, 0), (2, 3)), ((2, 0), (2, 3))
    st = split(a, [top, bottom, top, top])
    assert [t.descriptor.shard.replica_id for t in st] == [0, 0, 1, 2]
    assert len(st.primary_shards()) == 2
    assert bits(assemble(st)) == bits(a)
    st2 = split(a, [top, bottom, top], replica_ids=[3, 0, 1])
    assert {t.descriptor.shard.replica_id for t in st2.primary_shards()} == {0, 1}
    with pytest.raises(hb.FormatError, match="both hold box \\[0:2, 0:3\\] as replica 0"):
        split(a, [top, bottom, top], replica_ids=[0, 0, 0])


def test_devices_are_recorded_in_the_shard_section() -> None:
    a = sample((4, 2), "float32")
    st = split(a, grid_boxes(a.shape, (2, 1)), devices=[(2, 0), (2, 1)])
    assert [(t.descriptor.shard.device_type, t.descriptor.shard.device_id) for t in st] == [
        (2, 0), (2, 1)]
    assert all(t.device == hb.CPU for t in st)  # the memory stays where it is


def test_copy_true_makes_compact_aligned_copies() -> None:
    a = sample((6, 6), "float32")
    st = split(a, grid_boxes(a.shape, (2, 3)), copy=True)
    for box, t in zip(st.boxes, st.shards):
        assert t.copied and t.strides is None and not inside(t.buffers[0].ptr, a)
        assert t.buffers[0].ptr % 64 == 0
        assert bits(t) == bits(a[box.slices()])


def test_views_keep_the_source_alive() -> None:
    a = sample((4, 4), "float64")
    expected = bits(a[2:])
    ref = weakref.ref(a)
    st = split(a, grid_boxes(a.shape, (2, 1)))
    del a
    gc.collect()
    assert ref() is not None
    assert bits(st.shards[1]) == expected
    del st
    gc.collect()
    assert ref() is None


def test_read_only_source_gives_read_only_shards() -> None:
    a = sample((4, 4), "int8")
    a.flags.writeable = False
    st = split(a, grid_boxes(a.shape, (2, 2)))
    assert all(t.readonly for t in st)


def test_assemble_to_torch_and_hurray() -> None:
    torch = pytest.importorskip("torch")
    a = sample((5, 3), "float32")
    st = split(a, grid_boxes(a.shape, (2, 2)))
    t = assemble(st, to="torch")
    assert isinstance(t, torch.Tensor) and t.is_contiguous()
    assert bits(t.numpy()) == bits(a)
    h = st.assemble(to="hurray")
    assert isinstance(h, hb.Tensor) and h.copied and h.buffers[0].ptr % 64 == 0


def test_sharded_tensor_pickles() -> None:
    a = sample((6, 2), "uint16")
    st = split(a, grid_boxes(a.shape, (4, 1)))
    back = pickle.loads(pickle.dumps(st, protocol=5))
    assert back.boxes == st.boxes and back.descriptor == st.descriptor
    assert bits(assemble(back)) == bits(a)
    assert "ShardedTensor(shape=[6, 2], dtype=uint16, shards=4, boxes=4)" in repr(back)


def test_grid_boxes_follow_array_split() -> None:
    boxes = grid_boxes((7,), (3,))
    assert [b.sizes[0] for b in boxes] == [len(c) for c in np.array_split(np.arange(7), 3)]
    assert [b.sizes[0] for b in grid_boxes((2,), (4,))] == [1, 1, 0, 0]
    with pytest.raises(hb.FormatError):
        grid_boxes((2, 2), (1,))
    with pytest.raises(hb.FormatError):
        grid_boxes((2,), (0,))


# ---------------------------------------------------------- packed sub-byte
def packed_int4(shape: tuple[int, ...]) -> tuple[hb.Tensor, np.ndarray]:
    n = int(np.prod(shape))
    codes = (np.arange(n) * 5 % 16).astype(np.uint8)
    from hurray_bridge._subbyte import pack as pack_subbyte

    return make(Descriptor(shape, hb.int4), pack_subbyte(codes, 4)), codes.reshape(shape)


def unpacked(t: hb.Tensor) -> np.ndarray:
    from hurray_bridge._subbyte import unpack as unpack_subbyte

    return unpack_subbyte(np.frombuffer(t.memoryview(), np.uint8), int(np.prod(t.shape)),
                          4).reshape(t.shape)


def test_packed_int4_byte_aligned_rows_are_views() -> None:
    t, codes = packed_int4((4, 6))  # 6 nibbles = 3 bytes per row
    st = split(t, grid_boxes(t.shape, (2, 1)))
    assert [s.copied for s in st] == [False, False]
    assert st.shards[1].buffers[0].ptr == t.buffers[0].ptr + 6
    for box, s in zip(st.boxes, st.shards):
        assert (unpacked(s) == codes[box.slices()]).all()
    out = assemble(st, to="hurray")
    assert bytes(out.memoryview()) == bytes(t.memoryview())


def test_packed_int4_unaligned_boxes_are_copied_and_say_so() -> None:
    t, codes = packed_int4((3, 5))  # rows start mid-byte
    st = split(t, grid_boxes(t.shape, (3, 2)))
    assert any(s.copied for s in st)
    for box, s in zip(st.boxes, st.shards):
        assert (unpacked(s) == codes[box.slices()]).all()
    assert bytes(assemble(st, to="hurray").memoryview()) == bytes(t.memoryview())
    with pytest.raises(hb.CopyRequiredError, match="packed int4"):
        split(t, grid_boxes(t.shape, (3, 1)), copy=False)


# -------------------------------------------------------------------- errors
def test_overlapping_boxes() -> None:
    a = sample((4, 4), "float32")
    with pytest.raises(hb.FormatError, match=r"overlap in \[1:2, 0:4\]"):
        split(a, [((0, 0), (2, 4)), ((1, 0), (3, 4))])


def test_gaps() -> None:
    a = sample((4, 4), "float32")
    with pytest.raises(hb.FormatError, match=r"cover 12 of the 16 .* index \[3, 0\] is in no box"):
        split(a, [((0, 0), (3, 4))])
    with pytest.raises(hb.FormatError, match="cover 0 of the 16"):
        split(a, [])


def test_boxes_outside_the_global_shape() -> None:
    a = sample((4, 4), "float32")
    with pytest.raises(hb.FormatError, match=r"spans \[2, 5\), outside the global size 4"):
        split(a, [((0, 0), (2, 4)), ((2, 0), (3, 4))])
    with pytest.raises(hb.FormatError, match="negative"):
        split(a, [((-1, 0), (4, 4))])
    with pytest.raises(hb.FormatError, match="rank 2"):
        split(a, [((0,), (4,))])
    with pytest.raises(hb.FormatError, match="step 2"):
        split(a, [(slice(0, 4, 2), slice(None))])


def test_dynamic_dims_refused() -> None:
    with pytest.raises(hb.FormatError, match="dynamic dimension"):
        ShardedTensor(Descriptor([DYNAMIC, 4], hb.float32), [])
    # ... and in a shard's own descriptor (data-model rule: shards are static).
    with pytest.raises(hb.FormatError, match="dynamic"):
        Descriptor([DYNAMIC, 4], hb.float32, shard=Shard((8, 4), (0, 0)))
    with pytest.raises(hb.FormatError, match="dynamic"):
        Shard((DYNAMIC, 4), (0, 0))


def _hand_shard(a: np.ndarray, offsets: tuple[int, ...], gshape: tuple[int, ...],
                replica: int = 0, dtype: Any = hb.float32) -> hb.Tensor:
    d = Descriptor(a.shape, dtype, shard=Shard(gshape, offsets, replica))
    return hb.Tensor(d, [Buffer(BufferRole.DATA, a.ctypes.data if a.nbytes else 0, a.nbytes)],
                     owner=a)


def test_hand_built_uneven_set() -> None:
    g = np.arange(10, dtype=np.float32)
    parts = [(g[0:4].copy(), (0,)), (g[4:10].copy(), (4,)), (np.zeros(0, np.float32), (10,))]
    st = ShardedTensor(Descriptor([10], hb.float32),
                       [_hand_shard(p, o, (10,)) for p, o in parts])
    assert bits(assemble(st)) == bits(g)


def test_set_level_mismatches() -> None:
    a = np.zeros(4, np.float32)
    gd = Descriptor([4], hb.float32)
    with pytest.raises(hb.FormatError, match="no shard section"):
        ShardedTensor(gd, [hb.asarray(a)])
    with pytest.raises(hb.FormatError, match="global shape \\[5\\]"):
        ShardedTensor(gd, [_hand_shard(a, (0,), (5,))])
    with pytest.raises(hb.FormatError, match="holds int32"):
        ShardedTensor(gd, [_hand_shard(a.view(np.int32), (0,), (4,), dtype=hb.int32)])
    with pytest.raises(TypeError, match=r"not an hb\.Tensor"):
        ShardedTensor(gd, [a])  # type: ignore[list-item]
    with pytest.raises(hb.FormatError, match="plain row-major"):
        ShardedTensor(Descriptor([4], hb.float32, shard=Shard((4,), (0,))), [])


def test_non_dense_shards_are_kept_but_not_assembled() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_TENSOR)
    d = Descriptor([2], hb.int8, quantization=q, shard=Shard((2,), (0,)))
    t = make(d, np.array([1, 2], np.int8), np.array([0.5], np.float32))
    st = ShardedTensor(Descriptor([2], hb.int8), [t])
    with pytest.raises(hb.UnsupportedError, match="quantized shard"):
        assemble(st)
    with pytest.raises(hb.UnsupportedError, match="dense tensors"):
        split(t, [((0,), (2,))])


def test_assemble_refuses_device_memory() -> None:
    a = np.arange(4, dtype=np.float32)
    t = hb.asarray(a)
    dev = hb.Tensor(t.descriptor, t.buffers, device=(2, 0), owner=t)
    st = split(dev, [((0,), (2,)), ((2,), (2,))])  # views work on any device
    assert all(s.device == hb.Device(2, 0) for s in st)
    with pytest.raises(hb.UnsupportedError, match="host memory only"):
        assemble(st)


def test_copy_strided_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The core copies without NumPy too (run-by-run memmove); hide it from the module.
    src = np.arange(24, dtype=np.int32).reshape(4, 6)
    dst = np.zeros((2, 3), np.int32)
    dst_ptr, src_ptr = dst.ctypes.data, src.ctypes.data + (1 * 6 + 2) * 4
    monkeypatch.setitem(sys.modules, "numpy", None)
    _copy_strided(dst_ptr, (3, 1), src_ptr, (6, 1), (2, 3), 4)
    _copy_strided(dst_ptr, (3, 1), src_ptr, (6, 1), (0, 3), 4)  # empty: nothing happens
    monkeypatch.undo()
    assert dst.tolist() == src[1:3, 2:5].tolist()


# --------------------------------------------- hb.asarray / hb.convert of a shard set
def test_asarray_of_a_sharded_tensor_is_itself_or_a_copy() -> None:
    a = sample((6, 4), "float32")
    st = split(a, grid_boxes(a.shape, (3, 2)))
    assert hb.asarray(st) is st and hb.asarray(st, copy=False) is st
    c = hb.asarray(st, copy=True)
    assert isinstance(c, ShardedTensor) and c.boxes == st.boxes
    for t, u in zip(st.shards, c.shards):
        assert u.copied and u.strides is None and not inside(u.data_ptr, a)
        assert u.descriptor.shard == t.descriptor.shard and bits(u) == bits(t)


@pytest.mark.parametrize("to", ["numpy", "torch", "arrow"])
def test_convert_a_sharded_tensor_to_a_single_device_framework(to: str) -> None:
    pytest.importorskip({"numpy": "numpy", "torch": "torch", "arrow": "pyarrow"}[to])
    a = sample((6, 4), "float32")
    st = split(a, grid_boxes(a.shape, (3, 2)))
    with pytest.warns(hb.CopyWarning, match=f"copied for {to}: a sharded tensor \\(6 shards of "
                      "6 distinct boxes on 1 device\\) is assembled into one array"):
        out = hb.convert(st, to)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        silent = hb.convert(st, to, copy=True)
    for got in (out, silent):
        assert bits(hb.convert(got, "numpy")) == bits(a)
    with pytest.raises(hb.CopyRequiredError, match="copy=False; pass copy=None or copy=True"):
        hb.convert(st, to, copy=False)


def test_code_that_takes_one_tensor_names_the_way_out() -> None:
    st = split(sample((4, 2), "float32"), grid_boxes((4, 2), (2, 1)))
    with pytest.raises(hb.UnsupportedError, match=r"a shared-memory block holds one tensor, and "
                       r"this is a sharded tensor \(2 shards .*hb\.convert\(x, 'numpy'\)"):
        hb.shm.share(st)


def test_readme_sharded_jax_block_runs_as_written() -> None:
    """The README's sharded jax.Array lines in a fresh interpreter: each "True" comment
    holds, the copy=False line raises, and the last line warns."""
    pytest.importorskip("jax")
    from tests.examples.test_examples import _readme_block

    lines = _readme_block("import os; os.environ[\"XLA_FLAGS\"]").splitlines()
    code = ["import warnings"]
    for ln in lines:
        stmt = ln.split("  #")[0].rstrip()
        if "raises CopyRequiredError" in ln:
            code += ["try:", f"    {stmt}", "except hb.CopyRequiredError:", "    pass",
                     "else:", "    raise SystemExit('the copy=False line did not raise')"]
        elif ln.rstrip().endswith("# True"):
            code.append(f"assert {stmt}")
        elif ln.startswith("hb.convert(x, \"numpy\")"):
            code += ["with warnings.catch_warnings(record=True) as caught:",
                     "    warnings.simplefilter('always')", f"    {stmt}",
                     "assert any('assembled' in str(w.message) for w in caught), caught"]
        else:
            code.append(ln)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    res = subprocess.run([sys.executable, "-c", "\n".join([*code, "print('ok')"])],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=dict(env, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0 and res.stdout.endswith("ok\n"), res.stdout + res.stderr


# ----------------------------------------------------------------------- JAX
def test_run_the_jax_cases_in_a_subprocess() -> None:
    if IN_JAX_CHILD:
        pytest.skip("this is the child run")
    pytest.importorskip("jax")
    env = dict(os.environ, HB_SHARDS_JAX_CHILD="1",
               XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
         "-k", "test_jax_", str(Path(__file__))],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert " passed" in lines[-1], lines[-1]
    # Every JAX case runs in the child; the only skips allowed are those of a framework this
    # machine lacks (the cases convert to torch and Arrow too), each naming it.
    lacking = tuple(not_installed(m) for m in ("torch", "pyarrow") if optional(m) is None)
    skips = [ln for ln in lines if ln.startswith("SKIPPED")]
    assert all(ln.endswith(lacking) for ln in skips), skips


if IN_JAX_CHILD:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from hurray_bridge.shards import from_jax, to_jax

    assert len(jax.devices()) == 8, "run with XLA_FLAGS=--xla_force_host_platform_device_count=8"
    MESH = jax.make_mesh((4, 2), ("x", "y"))
    SPECS = {
        "rows": P("x", None),
        "grid": P("x", "y"),
        "cols": P(None, "y"),
        "replicated": P(),
        "flat_rows": P(("x", "y"), None),
    }
    JAX_DTYPES = ["float32", "bfloat16", "int8", "int4", "bool", "float8_e4m3fn", "uint16"]

    def jax_array(spec: str, dtype: str, shape: tuple[int, int] = (8, 6)) -> Any:
        if dtype == "int4":
            host = (np.arange(np.prod(shape)) % 16 - 8).astype(ml("int4")).reshape(shape)
        else:
            host = sample(shape, dtype, seed=3)
        return jax.device_put(host, NamedSharding(MESH, SPECS[spec])), host

    @pytest.mark.parametrize("dtype", JAX_DTYPES)
    @pytest.mark.parametrize("spec", sorted(SPECS))
    def test_jax_from_jax_zero_copy(spec: str, dtype: str) -> None:
        x, host = jax_array(spec, dtype)
        st = from_jax(x)
        assert st.shape == x.shape and len(st) == len(x.addressable_shards) == 8
        boxes = x.sharding.devices_indices_map(x.shape)
        for t, s in zip(st.shards, x.addressable_shards):
            assert t.data_ptr == s.data.unsafe_buffer_pointer()  # zero-copy
            sh = t.descriptor.shard
            assert sh.replica_id == s.replica_id
            assert (sh.device_type, sh.device_id) == (1, s.device.id) == tuple(t.device)
            want = boxes[s.device]
            assert Box(sh.offsets, t.shape).slices() == tuple(
                slice(w.start or 0, w.stop if w.stop is not None else n)
                for w, n in zip(want, x.shape))
            assert t.readonly and not t.copied
        assert not st.descriptor.padded  # jax 0.10 packs int4 two per byte, as Hurray does
        whole = hb.get_adapter("numpy").from_hurray(assemble(st, to="hurray"), copy=True)
        assert bits(whole) == bits(host)

    @pytest.mark.parametrize("dtype", JAX_DTYPES)
    @pytest.mark.parametrize("spec", sorted(SPECS))
    def test_jax_round_trip_same_sharding(spec: str, dtype: str) -> None:
        x, host = jax_array(spec, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            y = to_jax(from_jax(x), x.sharding)
        assert y.sharding == x.sharding and y.shape == x.shape and y.dtype == x.dtype
        for a, b in zip(x.addressable_shards, y.addressable_shards):
            assert a.device == b.device
            assert a.data.unsafe_buffer_pointer() == b.data.unsafe_buffer_pointer()
        assert bits(y) == bits(host)

    def aligned_copy(a: np.ndarray) -> np.ndarray:
        buf = np.empty(a.nbytes + 64, np.uint8)
        off = -buf.ctypes.data % 64
        out = buf[off: off + a.nbytes].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    @pytest.mark.parametrize("spec", ["rows", "flat_rows"])
    def test_jax_numpy_shards_to_jax_zero_copy(spec: str) -> None:
        host = aligned_copy(sample((8, 16), "float32"))  # rows of 64 bytes: every box aligned
        sharding = NamedSharding(MESH, SPECS[spec])
        idx = sharding.devices_indices_map(host.shape)
        boxes = sorted({tuple((s.start, s.stop) for s in v) for v in idx.values()})
        st = split(host, [tuple(slice(*b) for b in box) for box in boxes])
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            y = to_jax(st, sharding) if spec == "flat_rows" else None
        if spec == "rows":
            # Each box lives on two devices (replicated over y): one buffer per device.
            with pytest.warns(hb.CopyWarning, match="4 of 8 shards: box .* would back two"):
                y = to_jax(st, sharding)
            with pytest.raises(hb.CopyRequiredError):
                to_jax(st, sharding, copy=False)
        ptrs = {t.data_ptr for t in st}
        direct = [s for s in y.addressable_shards if s.data.unsafe_buffer_pointer() in ptrs]
        assert len(direct) == len(boxes)  # every numpy box reached JAX without a copy
        assert bits(y) == bits(host)

    def test_jax_copies_are_reported() -> None:
        sharding = NamedSharding(MESH, P("x", "y"))
        host = sample((8, 6), "float32")
        st = split(host, grid_boxes(host.shape, (4, 2)))  # strided views of unaligned memory
        with pytest.warns(hb.CopyWarning, match="copied for jax: 8 of 8 shards") as rec:
            y = to_jax(st, sharding)
        assert bits(y) == bits(host)
        assert rec[0].filename == __file__  # the caller's line, not the library's
        with pytest.raises(hb.CopyRequiredError, match="row-major"):
            to_jax(st, sharding, copy=False)
        y2 = to_jax(st, sharding, copy=True)  # asked for: no warning needed
        assert bits(y2) == bits(host)

    def test_jax_resharding_copies() -> None:
        x, host = jax_array("rows", "float32")
        target = NamedSharding(MESH, P(None, "y"))
        with pytest.warns(hb.CopyWarning, match="resharding"):
            y = to_jax(from_jax(x), target)
        assert y.sharding == target and bits(y) == bits(host)
        uneven = split(sample((8, 6), "float32"), grid_boxes((8, 6), (3, 1)))
        with pytest.warns(hb.CopyWarning, match="not a box of the shards"):
            z = to_jax(uneven, NamedSharding(MESH, P("x", None)))
        assert bits(z) == bits(assemble(uneven))

    def test_jax_shards_outlive_the_array() -> None:
        x, host = jax_array("grid", "float32")
        st = from_jax(x)
        del x
        gc.collect()
        assert bits(assemble(st)) == bits(host)
        assert bits(np.asarray(st.shards[3])) == bits(host[2:4, 3:6])

    def test_jax_64_bit_types_need_x64() -> None:
        st = split(np.arange(8, dtype=np.int64), grid_boxes((8,), (8,)))
        with pytest.raises(hb.UnsupportedError, match="jax_enable_x64"):
            to_jax(st, NamedSharding(MESH, P(("x", "y"))))

    def test_jax_errors() -> None:
        with pytest.raises(TypeError, match=r"jax\.Array"):
            from_jax(np.zeros(3))
        with pytest.raises(TypeError, match="ShardedTensor"):
            to_jax(np.zeros(3), NamedSharding(MESH, P()))  # type: ignore[arg-type]

    def test_jax_single_device_array() -> None:
        x = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
        st = from_jax(x)
        assert len(st) == 1 and st.boxes[0] == Box((0, 0), (3, 4))
        y = to_jax(st, x.sharding)
        assert y.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()

    # -------------------------------------------------- hb.asarray / hb.convert
    # The meshes of the issue: 2x2 and 4x1 over four devices, fully and partially replicated.
    MESH_2X2 = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4])
    MESH_4X1 = jax.make_mesh((4, 1), ("x", "y"), devices=jax.devices()[4:])
    CASES = {
        "2x2": (MESH_2X2, P("x", "y")),
        "4x1": (MESH_4X1, P("x", "y")),
        "replicated": (MESH_2X2, P()),
        "partly_replicated": (MESH_2X2, P("x", None)),
        "cols_partly_replicated": (MESH_2X2, P(None, "y")),
        "all_8_flat": (MESH, P(("x", "y"), None)),
    }

    def sharded(case: str, dtype: str = "float32", shape: tuple[int, int] = (8, 8)) -> Any:
        mesh, spec = CASES[case]
        if dtype == "int4":
            host = (np.arange(np.prod(shape)) % 16 - 8).astype(ml("int4")).reshape(shape)
        else:
            host = sample(shape, dtype, seed=5)
        return jax.device_put(host, NamedSharding(mesh, spec)), host

    def same_placement(a: Any, b: Any, shape: tuple[int, ...]) -> bool:
        return bool(a.devices_indices_map(shape) == b.devices_indices_map(shape))

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int4", "bool"])
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_jax_asarray_views_every_device_buffer(case: str, dtype: str) -> None:
        x, host = sharded(case, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            st = hb.asarray(x)
            again = hb.asarray(x, copy=False)
        assert isinstance(st, hb.ShardedTensor) and len(st) == len(x.addressable_shards)
        for t, u, s in zip(st.shards, again.shards, x.addressable_shards):
            # Zero-copy: each shard is the device buffer itself.
            assert t.data_ptr == u.data_ptr == s.data.unsafe_buffer_pointer()
            assert t.descriptor.shard.replica_id == s.replica_id and not t.copied
            assert Box(t.descriptor.shard.offsets, t.shape) == Box(
                tuple(i.start or 0 for i in s.index),
                tuple((i.stop if i.stop is not None else n) - (i.start or 0)
                      for i, n in zip(s.index, x.shape)))
        whole = hb.convert(st, "numpy", copy=True)
        assert bits(whole if dtype != "int4" else whole.view(np.uint8) & 15) == bits(
            host if dtype != "int4" else host.view(np.uint8) & 15)

    def test_jax_asarray_copy_true_copies_every_shard() -> None:
        x, host = sharded("partly_replicated")
        st = hb.asarray(x, copy=True)
        ptrs = {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
        assert all(t.copied and t.data_ptr not in ptrs and not t.readonly for t in st)
        assert bits(assemble(st)) == bits(host)

    @pytest.mark.parametrize("to", ["numpy", "torch", "arrow"])
    @pytest.mark.parametrize("case", sorted(CASES))
    def test_jax_convert_to_one_device_frameworks(case: str, to: str) -> None:
        need(to)
        x, host = sharded(case)
        n, boxes = len(x.addressable_shards), len({str(s.index) for s in x.addressable_shards})
        with pytest.warns(hb.CopyWarning, match=(
                f"copied for {to}: a sharded tensor \\({n} shards of {boxes} distinct box"
                f"(es)? on {n} devices\\) is assembled into one array, as {to} holds")) as rec:
            out = hb.convert(x, to)
        assert rec[0].filename == __file__
        assert bits(hb.convert(out, "numpy")) == bits(host)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            assert bits(hb.convert(hb.convert(x, to, copy=True), "numpy")) == bits(host)
        with pytest.raises(hb.CopyRequiredError, match="but copy=False"):
            hb.convert(x, to, copy=False)

    @pytest.mark.parametrize("case", ["replicated", "partly_replicated"])
    def test_jax_assembly_reads_each_replica_once(case: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
        import hurray_bridge.shards as core

        x, host = sharded(case)
        reads: list[int] = []
        real = core._copy_strided

        def counting(dst: int, ds: Any, src: int, ss: Any, shape: Any, isz: int) -> None:
            reads.append(src)
            real(dst, ds, src, ss, shape, isz)

        monkeypatch.setattr(core, "_copy_strided", counting)
        out = hb.convert(x, "numpy", copy=True)
        assert bits(out) == bits(host)
        assert len(reads) == len({str(s.index) for s in x.addressable_shards})
        primary = {s.data.unsafe_buffer_pointer() for s in x.addressable_shards
                   if s.replica_id == 0}
        assert set(reads) <= primary  # the lowest replica of every box, nothing else

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_jax_convert_to_jax_keeps_the_sharding_without_copies(case: str) -> None:
        x, host = sharded(case)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            assert hb.convert(x, "jax") is x
            st = hb.asarray(x)
            assert hb.convert(st, "jax") is x  # the array the shards came from
            # A shard set that only knows its shard sections: the sharding is rebuilt.
            fresh = hb.shards.copy_shards(st)
            y = hb.convert(fresh, "jax")
        assert same_placement(y.sharding, x.sharding, x.shape)
        ptrs = {t.data_ptr for t in fresh}
        assert {s.data.unsafe_buffer_pointer() for s in y.addressable_shards} == ptrs
        assert bits(y) == bits(host)
        z = hb.convert(x, "jax", copy=True)  # copies, silently
        assert same_placement(z.sharding, x.sharding, x.shape) and bits(z) == bits(host)
        assert not {s.data.unsafe_buffer_pointer() for s in z.addressable_shards} & {
            s.data.unsafe_buffer_pointer() for s in x.addressable_shards}

    def test_jax_convert_numpy_shards_with_devices_rebuilds_the_mesh() -> None:
        host = aligned_copy(sample((8, 16), "float32"))
        devs = [(1, d.id) for d in MESH_2X2.devices.flat]
        boxes = grid_boxes(host.shape, (2, 2))  # column halves: strided views, JAX copies them
        st = split(host, boxes, devices=devs)
        with pytest.warns(hb.CopyWarning, match="copied for jax: 4 of 4 shards: JAX imports "
                          "row-major memory only"):
            y = hb.convert(st, "jax")
        assert bits(y) == bits(host)
        for s in y.addressable_shards:
            assert (1, s.device.id) == devs[boxes.index(_jax_box(s.index, host.shape))]
        rows = split(host, grid_boxes(host.shape, (4, 1)), devices=[(1, i) for i in range(4)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            y2 = hb.convert(rows, "jax", copy=False)  # 64-byte aligned rows: all zero-copy
        assert {s.data.unsafe_buffer_pointer() for s in y2.addressable_shards} == {
            t.data_ptr for t in rows}
        with pytest.raises(hb.CopyRequiredError, match="row-major"):
            hb.convert(st, "jax", copy=False)

    def _jax_box(index: Any, shape: tuple[int, ...]) -> Box:
        return Box(tuple(i.start or 0 for i in index),
                   tuple((i.stop if i.stop is not None else n) - (i.start or 0)
                         for i, n in zip(index, shape)))

    def test_jax_convert_with_a_sharding_or_one_device() -> None:
        x, host = sharded("2x2")
        target = NamedSharding(MESH_4X1, P("x", None))
        with pytest.warns(hb.CopyWarning, match="resharding"):
            y = hb.convert(x, "jax", device=target)
        assert y.sharding == target and bits(y) == bits(host)
        same = hb.convert(x, "jax", device=x.sharding)  # its own sharding: no copy
        assert [s.data.unsafe_buffer_pointer() for s in same.addressable_shards] == [
            s.data.unsafe_buffer_pointer() for s in x.addressable_shards]
        dev = jax.devices()[5]
        # Two copies, each said: the shards assembled on the host, then moved onto cpu:5
        # (JAX's DLPack import places CPU memory on cpu:0).
        with pytest.warns(hb.CopyWarning, match="moving from cpu:0 to cpu:5"), \
                pytest.warns(hb.CopyWarning, match="assembled into one array, as jax holds"):
            one = hb.convert(x, "jax", device=dev)
        assert one.devices() == {dev} and bits(one) == bits(host)
        with pytest.raises(hb.CopyRequiredError):
            hb.convert(x, "jax", device=dev, copy=False)

    def test_jax_one_device_shard_set_becomes_one_array() -> None:
        host = aligned_copy(sample((8, 16), "float32"))
        st = split(host, grid_boxes(host.shape, (2, 1)))  # every shard on CPU 0
        with pytest.warns(hb.CopyWarning, match="assembled into one array, as jax holds"):
            y = hb.convert(st, "jax")
        assert len(y.devices()) == 1 and bits(y) == bits(host)

    def test_jax_shard_sets_no_sharding_can_place() -> None:
        host = sample((8, 6), "float32")
        uneven = split(host, grid_boxes(host.shape, (3, 1)), devices=[(1, 0), (1, 1), (1, 2)])
        with pytest.raises(hb.UnsupportedError, match=r"no JAX sharding places this sharded "
                           r"tensor .*unequal parts.*device=sharding"):
            hb.convert(uneven, "jax")
        doubled = split(host, grid_boxes(host.shape, (2, 1)), devices=[(1, 0), (1, 0)])
        assert len(hb.convert(doubled, "jax", copy=True).devices()) == 1  # one device: one array
        two_on_one = split(host, grid_boxes(host.shape, (3, 1)), devices=[(1, 0), (1, 0), (1, 1)])
        with pytest.raises(hb.UnsupportedError, match="a device holds more than one shard"):
            hb.convert(two_on_one, "jax")
        ragged = split(host, [((0, 0), (4, 6)), ((4, 0), (4, 6)), ((0, 0), (4, 6))],
                       devices=[(1, 0), (1, 1), (1, 2)])
        with pytest.raises(hb.UnsupportedError, match="different replica counts"):
            hb.convert(ragged, "jax")
        nowhere = split(host, grid_boxes(host.shape, (2, 1)), devices=[(1, 0), (1, 99)])
        with pytest.raises(hb.UnsupportedError, match="cpu:99, which is no JAX device"):
            hb.convert(nowhere, "jax")
        # Sharded tensors may still be handed over with a sharding of the caller's choice.
        with pytest.warns(hb.CopyWarning, match="not a box of the shards"):
            z = hb.convert(uneven, "jax", device=NamedSharding(MESH, P("x", None)))
        assert bits(z) == bits(host)

    def test_jax_refusals_name_the_way_out() -> None:
        x, _ = sharded("2x2")
        with pytest.raises(hb.UnsupportedError, match=r"hb\.asarray\(x\) gives an "
                           r"hb\.ShardedTensor") as exc:
            hb.get_adapter("jax").to_hurray(x)  # the dense adapter alone
        assert "not implemented" not in str(exc.value)
        with pytest.raises(hb.UnsupportedError, match="a shared-memory block holds one tensor"):
            hb.shm.share(x)
        x.delete()
        with pytest.raises(hb.UnsupportedError, match="has been deleted"):
            hb.asarray(x)

    def test_jax_dense_shortcut_does_not_serve_sharded_arrays() -> None:
        dense = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)
        for _ in range(3):  # learn, then take the shortcut
            hb.convert(dense, "numpy")
            hb.convert(dense, "torch")
        x, host = sharded("2x2")
        for to in ("numpy", "torch"):
            with pytest.warns(hb.CopyWarning, match="assembled"):
                out = hb.convert(x, to)
            assert bits(hb.convert(out, "numpy")) == bits(host)

    def test_jax_one_device_named_sharding_stays_dense() -> None:
        mesh = jax.make_mesh((1,), ("x",), devices=jax.devices()[:1])
        x = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("x")))
        t = hb.asarray(x)
        assert isinstance(t, hb.Tensor) and t.data_ptr == x.unsafe_buffer_pointer()
        assert hb.convert(x, "numpy").ctypes.data == x.unsafe_buffer_pointer()

    def test_jax_sub_byte_shards_to_numpy() -> None:
        x, host = sharded("partly_replicated", "int4")
        with pytest.warns(hb.CopyWarning) as rec:
            out = hb.convert(x, "numpy")
        assert "assembled" in str(rec[0].message)
        assert out.dtype == host.dtype and bits(out.view(np.uint8) & 15) == bits(
            host.view(np.uint8) & 15)

    def test_jax_shard_set_pickled_to_another_process_is_placed_again() -> None:
        x, host = sharded("partly_replicated")
        back = pickle.loads(pickle.dumps(hb.asarray(x), protocol=5))
        assert [t.descriptor.shard for t in back] == [t.descriptor.shard for t in hb.asarray(x)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.CopyWarning)  # pickled bytes may be unaligned
            y = hb.convert(back, "jax")
        assert same_placement(y.sharding, x.sharding, x.shape) and bits(y) == bits(host)

    def test_jax_shards_module_speaks_the_shared_names() -> None:
        from hurray_bridge.adapters import jax as jax_adapter
        from hurray_bridge.adapters.jax import shards as js

        x, _host = sharded("partly_replicated")
        assert jax_adapter.special_kind(x) == "sharded"
        assert jax_adapter.special_kind(jnp.ones(3)) is None  # one device: dense
        st = js.to_hurray(x)
        assert js.from_hurray(st) is x  # the array the shards came from
        with pytest.raises(hb.UnsupportedError, match="several devices"):
            js.to_hurray(jnp.ones(3))
        with pytest.warns(DeprecationWarning, match="to_hurray"):
            old = js.to_sharded
        assert old(jnp.ones(3)) is None and len(old(x)) == len(st)
        with pytest.warns(DeprecationWarning, match="from_hurray"):
            assert js.from_sharded is js.from_hurray
