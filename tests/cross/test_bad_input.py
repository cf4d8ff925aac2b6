"""Bad input to every public function (issue 9): a table of cases.

Each case calls one public function with a wrong type, an out-of-range value,
a NaN or negative size, rank 65, a producer that lies in ``__dlpack_device__``
or returns a garbage capsule, and says what must happen: the error class (a
``hb.HurrayError`` subclass, or for a few the documented built-in, marked
``builtin``) and excerpts the message must contain -- the argument, the value
and the rule.

A case whose fix belongs to a module another engineer owns right now is
``xfail(strict=True)`` with the reason; the exact patch is in the issue-9
report. ``docs/impl/robustness.md`` holds this table; regenerate it with
``python -m tests.cross.test_bad_input > docs/impl/robustness.md`` (a test checks
that every case is there).
"""

from __future__ import annotations

import ctypes
import functools
import io
import math
import pathlib
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule, shm
from hurray_bridge import matrix as hb_matrix
from hurray_bridge import safetensors_io as sio
from hurray_bridge import testing as hbt

np = pytest.importorskip("numpy")

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "impl" / "robustness.md"

D = hb.Descriptor
F32 = hb.float32
DYN = hb.DYNAMIC
Q = hb.QuantScheme
STRIDED, TILED, COO = hb.Layout.STRIDED, hb.Layout.TILED, hb.Layout.COO

# Fix owners for the strict xfails (the issue-9 report has each patch). Applying an
# owner's patch = removing it from PENDING (its cases then pass, and must).
PENDING: set[str] = set()
DESC = "descriptor.py (not this task's file): "
TENSOR = "tensor.py (performance work in progress): "
REG = "_registry.py (sparse work in progress): "
ADAPT = "adapters (rewritten by the performance work right now): "
QUANT = "quant.py (sparse work in progress): "


class Case(NamedTuple):
    id: str
    input: str  # what is passed, for the table
    call: Callable[[], Any]
    error: type[BaseException]
    words: tuple[str, ...]  # the message must contain each
    builtin: bool = False  # a documented built-in error, not a HurrayError
    xfail: str = ""  # why it fails today (strict)


# ------------------------------------------------------------------ fixtures
def _array() -> Any:
    return np.arange(6, dtype=np.float32)


def _tensor() -> hb.Tensor:
    return hb.asarray(_array())


_A = np.zeros(4, np.float32)
_D4 = D([4], F32)
_B4 = hb.Buffer(hb.BufferRole.DATA, _A.ctypes.data, 16)
_S = D([DYN, 3], F32)


def _closed_writer() -> hb.StreamWriter:
    w = hb.StreamWriter(io.BytesIO(), _S)
    w.close()
    return w


def _sharded() -> hb.ShardedTensor:
    return hb.split(np.zeros(4), [((0,), (2,)), ((2,), (2,))])


class LyingDevice:
    """``__dlpack_device__`` returns ``dev`` (or raises it); the capsule is NumPy's, on the CPU."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.a = np.arange(4.0)

    def __dlpack_device__(self) -> Any:
        if isinstance(self.dev, BaseException):
            raise self.dev
        return self.dev

    def __dlpack__(self, **kw: Any) -> object:
        return self.a.__dlpack__(**kw)


_PyCapsule_New = _capsule._PyCapsule_New
_RANDOM_NAME = b"random_name"  # capsule names must outlive the capsule


def _used_capsule() -> object:
    c = np.zeros(3).__dlpack__()
    _capsule.consume_capsule(c).owner.release()
    return c


class Garbage:
    """``__dlpack__`` returns ``what()`` (or raises it), ``__dlpack_device__`` says CPU."""

    def __init__(self, what: Any) -> None:
        self.what = what

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, **kw: Any) -> object:
        if isinstance(self.what, BaseException):
            raise self.what
        return self.what()


_U_FORMAT = ctypes.create_string_buffer(b"u")  # an Arrow format no tensor has (utf8)


def _arrow_metadata(items: dict[bytes, bytes]) -> Any:
    """An ArrowSchema ``metadata`` blob (int32 count, then length-prefixed keys and values)."""
    out = [struct.pack("=i", len(items))]
    for k, v in items.items():
        out += [struct.pack("=i", len(k)), k, struct.pack("=i", len(v)), v]
    return ctypes.create_string_buffer(b"".join(out))


# A fixed_shape_tensor of no elements whose other size no descriptor holds.
_FST_HUGE = _arrow_metadata({b"ARROW:extension:name": b"arrow.fixed_shape_tensor",
                             b"ARROW:extension:metadata": b'{"shape": [0, 18446744073709551615]}'})


class ArrowDoctored:
    """``__arrow_c_array__`` of a float32 tensor's export with one field of its
    ``ArrowArray`` (or, with ``schema=True``, ``ArrowSchema``) rewritten: a producer bug."""

    def __init__(self, field: str, value: Any, schema: bool = False,
                 t: Any = None) -> None:
        self.field, self.value, self.schema, self.t = field, value, schema, t

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        from hurray_bridge import _arrow_c

        s, a = (self.t if self.t is not None else _tensor()).__arrow_c_array__()
        if self.schema:
            struct_ = _arrow_c.ArrowSchema.from_address(
                _capsule._PyCapsule_GetPointer(s, b"arrow_schema"))
        else:
            struct_ = _arrow_c.ArrowArray.from_address(
                _capsule._PyCapsule_GetPointer(a, b"arrow_array"))
        setattr(struct_, self.field, self.value)
        return s, a


class ArrowSchemaCycle:
    """``__arrow_c_array__`` of a 2-D tensor whose ``fixed_size_list`` schema names itself
    as its child: a cycle a recursive reader would follow without end."""

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        from hurray_bridge import _arrow_c

        s, a = hb.asarray(np.zeros((2, 2), np.float32)).__arrow_c_array__()
        p = _capsule._PyCapsule_GetPointer(s, b"arrow_schema")
        self.children = (ctypes.c_void_p * 1)(p)  # held by the producer while it is read
        _arrow_c.ArrowSchema.from_address(p).children = ctypes.addressof(self.children)
        return s, a


class ArrowReturns:
    """``__arrow_c_array__`` returns ``what()``."""

    def __init__(self, what: Any) -> None:
        self.what = what

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.what()


def _adapter(name: str) -> Any:
    return hb.get_adapter(name)


def _native(name: str) -> Any:
    a = _array()
    if name == "numpy":
        return a
    if name == "torch":
        return pytest.importorskip("torch").from_numpy(a)
    if name == "jax":
        return pytest.importorskip("jax.numpy").asarray(a)
    return pytest.importorskip("pyarrow").array(a)


def _st(header: str) -> Any:
    import struct

    h = header.encode()
    h += b" " * (-len(h) % 8)
    raw = struct.pack("<Q", len(h)) + h + bytes(16)
    return sio.parse_header(raw, len(raw))


def _fake_cuda() -> Any:
    from tests.producers import FakeCUDAProducer

    return FakeCUDAProducer()


# ----------------------------------------------------------------------- cases
CASES: list[Case] = [
    # -- hb.Descriptor: shape
    Case("descriptor-shape-none", "Descriptor(None, float32)", lambda: D(None, F32),
         hb.FormatError, ("shape", "None", "sequence of integers")),
    Case("descriptor-shape-int", "Descriptor(3, float32)", lambda: D(3, F32),
         hb.FormatError, ("shape", "3", "sequence of integers")),
    Case("descriptor-shape-str", "Descriptor('abc', float32)", lambda: D("abc", F32),
         hb.FormatError, ("shape", "'abc'", "sequence of integers")),
    Case("descriptor-shape-float", "shape=[2.0]", lambda: D([2.0], F32),
         hb.FormatError, ("shape[0]", "2.0", "must be an integer")),
    Case("descriptor-shape-nan", "shape=[nan]", lambda: D([math.nan], F32),
         hb.FormatError, ("shape[0]", "nan", "must be an integer")),
    Case("descriptor-shape-numpy-nan", "shape=[np.float64(nan)]",
         lambda: D([np.float64("nan")], F32), hb.FormatError, ("shape[0]", "nan", "integer")),
    Case("descriptor-shape-inf", "shape=[inf]", lambda: D([math.inf], F32),
         hb.FormatError, ("shape[0]", "inf", "must be an integer")),
    Case("descriptor-shape-negative", "shape=[-1]", lambda: D([-1], F32),
         hb.FormatError, ("shape[0] = -1", "cannot be negative")),
    Case("descriptor-shape-negative-numpy", "shape=[np.int64(-3)]",
         lambda: D([np.int64(-3)], F32), hb.FormatError, ("shape[0] = -3", "cannot be negative")),
    Case("descriptor-shape-too-big", "shape=[2**64]", lambda: D([2**64], F32),
         hb.FormatError, ("shape[0] = 18446744073709551616", "out of range")),
    Case("descriptor-rank-65", "shape=[1] * 65", lambda: D([1] * 65, F32),
         hb.FormatError, ("rank 65", "maximum rank 64")),
    Case("descriptor-size-overflow", "shape=[2**40, 2**40], float32",
         lambda: D([2**40, 2**40], F32), hb.FormatError, ("shape", "overflows 64 bits")),
    Case("descriptor-shape-bool", "shape=[True]", lambda: D([True], F32),
         hb.FormatError, ("shape[0]", "True", "must be an integer"),
         xfail=DESC + "_as_uint_tuple lets bool through via __index__"),
    # -- hb.Descriptor: the other fields
    Case("descriptor-dtype-none", "dtype=None", lambda: D([2], None),
         hb.FormatError, ("dtype", "None", "hb.DType or a type name")),
    Case("descriptor-dtype-numpy-type", "dtype=np.float32", lambda: D([2], np.float32),
         hb.FormatError, ("dtype", "numpy.float32", "hb.DType or a type name")),
    Case("descriptor-dtype-unknown-name", "dtype='float33'", lambda: D([2], "float33"),
         hb.UnsupportedError, ("'float33'", "known: bool")),
    Case("descriptor-layout-unknown", "layout=99", lambda: D([2], F32, 99),
         hb.FormatError, ("layout", "unknown layout 99")),
    Case("descriptor-strides-missing", "layout=STRIDED, no strides",
         lambda: D([2], F32, STRIDED), hb.FormatError, ("strides", "needs strides")),
    Case("descriptor-strides-nan", "strides=[nan]",
         lambda: D([2], F32, STRIDED, strides=[math.nan]), hb.FormatError,
         ("strides[0]", "nan", "must be an integer")),
    Case("descriptor-strides-length", "strides=[1, 1] for rank 1",
         lambda: D([2], F32, STRIDED, strides=[1, 1]), hb.FormatError, ("2 strides for rank 1",)),
    Case("descriptor-strides-too-big", "strides=[2**63]",
         lambda: D([2], F32, STRIDED, strides=[2**63]), hb.FormatError,
         ("strides[0] = 9223372036854775808", "outside")),
    Case("descriptor-strides-int", "strides=3 (not a sequence)",
         lambda: D([2], F32, STRIDED, strides=3), hb.FormatError,
         ("strides", "3", "sequence of integers"), xfail=DESC + "tuple(3) raises TypeError"),
    Case("descriptor-tile-zero", "tile=[0]", lambda: D([2], F32, TILED, tile=[0]),
         hb.FormatError, ("tile", "(0,)", "positive static sizes")),
    Case("descriptor-tile-nan", "tile=[nan]", lambda: D([2], F32, TILED, tile=[math.nan]),
         hb.FormatError, ("tile[0]", "nan", "must be an integer")),
    Case("descriptor-sparse-missing", "layout=COO, no Sparse", lambda: D([2], F32, COO),
         hb.FormatError, ("sparse", "COO", "needs a Sparse section")),
    Case("descriptor-padded-str", "padded='no'", lambda: D([2], hb.int4, padded="no"),
         hb.FormatError, ("padded", "'no'"), xfail=DESC + "bool('no') is True: silently padded"),
    Case("sparse-nnz-negative", "Sparse(-1)", lambda: hb.Sparse(-1),
         hb.FormatError, ("sparse.nnz", "-1", "cannot be negative")),
    Case("sparse-nnz-nan", "Sparse(nan)", lambda: hb.Sparse(math.nan),
         hb.FormatError, ("sparse.nnz", "nan", "must be an integer")),
    Case("sparse-nnz-bool", "Sparse(True)", lambda: hb.Sparse(True),
         hb.FormatError, ("sparse.nnz", "True", "must be an integer"),
         xfail=DESC + "_as_uint_tuple lets bool through via __index__"),
    Case("sparse-index-float", "Sparse(1, float32)", lambda: hb.Sparse(1, F32),
         hb.FormatError, ("sparse.index_dtype", "float32", "integer type")),
    Case("quant-scheme-unknown", "Quantization(9)", lambda: hb.Quantization(9),
         hb.FormatError, ("quantization.scheme", "9")),
    Case("quant-axis-str", "Quantization(PER_AXIS, axis='0')",
         lambda: hb.Quantization(Q.PER_AXIS, axis="0"), hb.FormatError,
         ("quantization.axis", "'0'", "integer axis")),
    Case("quant-axis-nan", "Quantization(PER_AXIS, axis=nan)",
         lambda: hb.Quantization(Q.PER_AXIS, axis=math.nan), hb.FormatError,
         ("quantization.axis", "nan", "integer axis")),
    Case("quant-block-zero", "Quantization(PER_BLOCK, axis=0, block_size=0)",
         lambda: hb.Quantization(Q.PER_BLOCK, axis=0, block_size=0), hb.FormatError,
         ("quantization.block_size", "got 0", ">= 1")),
    Case("quant-scale-int", "Quantization(PER_TENSOR, scale_dtype=int8)",
         lambda: hb.Quantization(Q.PER_TENSOR, hb.int8), hb.FormatError,
         ("quantization.scale_dtype", "int8", "float type")),
    Case("quant-float32-storage", "Descriptor([2], float32, quantization=...)",
         lambda: D([2], F32, quantization=hb.Quantization(Q.PER_TENSOR)), hb.FormatError,
         ("quantization", "float32", "integer, float8 or float4")),
    Case("quant-axis-out-of-range", "PER_AXIS axis=3 on rank 1",
         lambda: D([2], hb.int8, quantization=hb.Quantization(Q.PER_AXIS, axis=3)),
         hb.FormatError, ("quantization.axis", "axis 3", "out of range for rank 1")),
    Case("quant-not-a-quantization", "quantization='x'",
         lambda: D([2], hb.int8, quantization="x"), hb.FormatError,
         ("quantization", "'x'", "expected a Quantization")),
    Case("shard-offset-negative", "Shard([2], [-1])", lambda: hb.Shard([2], [-1]),
         hb.FormatError, ("shard.offsets[0] = -1", "cannot be negative")),
    Case("shard-outside", "Shard([2], [1]) on shape [2]",
         lambda: D([2], hb.int8, shard=hb.Shard([2], [1])), hb.FormatError,
         ("shard.offsets", "[1, 3)", "global size 2")),
    Case("shard-replica-bool", "Shard(replica_id=True)",
         lambda: hb.Shard([2], [0], replica_id=True), hb.FormatError,
         ("shard.replica_id", "True", "integer in [0, 4294967295]")),
    Case("shard-global-nan", "Shard([nan], [0])", lambda: hb.Shard([math.nan], [0]),
         hb.FormatError, ("shard.global_shape[0]", "nan", "must be an integer")),
    # -- Descriptor.resolve / sizes / bytes
    Case("resolve-negative", "resolve([-1])", lambda: D([DYN], hb.int8).resolve([-1]),
         hb.DynamicShapeError, ("size -1", "axis 0", "out of range")),
    Case("resolve-nan", "resolve([nan])", lambda: D([DYN], hb.int8).resolve([math.nan]),
         hb.DynamicShapeError, ("axis 0", "nan", "must be an integer")),
    Case("resolve-bool", "resolve([True])", lambda: D([DYN], hb.int8).resolve([True]),
         hb.DynamicShapeError, ("axis 0", "True", "must be an integer")),
    Case("resolve-dynamic", "resolve([DYNAMIC])", lambda: D([DYN], hb.int8).resolve([DYN]),
         hb.DynamicShapeError, ("18446744073709551615", "out of range [0, 2**64 - 2]")),
    Case("resolve-static-axis", "resolve({0: 3}) on a static axis",
         lambda: D([3], hb.int8).resolve({0: 3}), hb.DynamicShapeError,
         ("axis 0 is static", "only dynamic dimensions")),
    Case("resolve-count", "resolve([1, 2]) for one dynamic dim",
         lambda: D([DYN], hb.int8).resolve([1, 2]), hb.DynamicShapeError,
         ("2 sizes for 1 dynamic dimension",)),
    Case("resolve-axis-str", "resolve({'a': 1})", lambda: D([DYN], hb.int8).resolve({"a": 1}),
         hb.DynamicShapeError, ("axis 'a'", "out of range for rank 1")),
    Case("resolve-none", "resolve(None)", lambda: D([DYN], hb.int8).resolve(None),
         hb.DynamicShapeError, ("sizes", "None"), xfail=DESC + "list(None) raises TypeError"),
    Case("element-count-dynamic", "element_count of shape [DYNAMIC]",
         lambda: D([DYN], hb.int8).element_count, hb.DynamicShapeError,
         ("element_count", "dimension(s) [0] are dynamic", "resolve()")),
    Case("from-bytes-none", "Descriptor.from_bytes(None)", lambda: D.from_bytes(None),
         hb.FormatError, ("input", "expected bytes", "NoneType")),
    Case("from-bytes-str", "Descriptor.from_bytes('HRYD')", lambda: D.from_bytes("HRYD"),
         hb.FormatError, ("input", "expected bytes", "str")),
    Case("from-bytes-strided-view", "from_bytes(memoryview(...)[::2])",
         lambda: D.from_bytes(memoryview(bytes(80))[::2]), hb.FormatError,
         ("input", "expected bytes", "memoryview")),
    Case("from-bytes-rank-65", "a header claiming rank 65",
         lambda: D.from_bytes(b"HRYD\x01\x00\x00\x00\x41\x00\x00\x00\x0d\x01\x00\x00"
                              + (32 + 8 * 65).to_bytes(8, "little") + bytes(8 + 8 * 65)),
         hb.FormatError, ("rank", "rank 65", "maximum rank 64")),
    # -- hb.Tensor
    Case("tensor-descriptor-none", "Tensor(None, [buffer])", lambda: hb.Tensor(None, [_B4]),
         hb.UnsupportedError, ("descriptor", "NoneType", "hb.Descriptor"),
         xfail=TENSOR + "raises a plain TypeError"),
    Case("tensor-buffers-none", "Tensor(desc, None)", lambda: hb.Tensor(_D4, None),
         hb.UnsupportedError, ("buffers", "None"), xfail=TENSOR + "tuple(None): TypeError"),
    Case("tensor-buffer-length", "a 15-byte buffer for [4] float32",
         lambda: hb.Tensor(_D4, [hb.Buffer(hb.BufferRole.DATA, _A.ctypes.data, 15)]),
         hb.FormatError, ("buffers[0]", "15 bytes", "16 bytes")),
    Case("tensor-buffer-null", "16 bytes at NULL",
         lambda: hb.Tensor(_D4, [hb.Buffer(hb.BufferRole.DATA, 0, 16)]),
         hb.FormatError, ("buffers[0]", "16 bytes", "NULL pointer")),
    Case("tensor-buffer-role-unknown", "buffer role 99",
         lambda: hb.Tensor(_D4, [(99, _A.ctypes.data, 16)]), hb.FormatError,
         ("buffers[0]", "99", "role"), xfail=TENSOR + "BufferRole(99) raises ValueError"),
    Case("tensor-device-str", "Tensor(..., device='cpu')",
         lambda: hb.Tensor(_D4, [_B4], device="cpu"), hb.UnsupportedError,
         ("device", "'cpu'", "(device_type, device_id)"),
         xfail=TENSOR + "Device(*'cpu') raises TypeError"),
    Case("tensor-missing-buffer", "t.memoryview(SCALES) on a dense tensor",
         lambda: _tensor().memoryview(hb.BufferRole.SCALES), KeyError,
         ("no SCALES buffer",), builtin=True),
    Case("dlpack-stream-on-cpu", "t.__dlpack__(stream=5)",
         lambda: _tensor().__dlpack__(stream=5), hb.UnsupportedError,
         ("stream must be None", "cpu:0", "5")),
    Case("dlpack-dl-device-cuda", "t.__dlpack__(dl_device=(2, 0))",
         lambda: _tensor().__dlpack__(dl_device=(2, 0)), hb.UnsupportedError,
         ("cpu:0", "cuda:0", "does not move data")),
    Case("dlpack-max-version-str", "t.__dlpack__(max_version='x')",
         lambda: _tensor().__dlpack__(max_version="x"), hb.UnsupportedError,
         ("max_version", "'x'"), xfail=TENSOR + "'x'[0] >= 1 raises TypeError"),
    Case("dlpack-dl-device-str", "t.__dlpack__(dl_device='cpu')",
         lambda: _tensor().__dlpack__(dl_device="cpu"), hb.UnsupportedError,
         ("dl_device", "'cpu'"), xfail=TENSOR + "Device(*'cpu') raises TypeError"),
    Case("dlpack-copy-str", "t.__dlpack__(copy='x')", lambda: _tensor().__dlpack__(copy="x"),
         hb.UnsupportedError, ("copy", "'x'", "True, False or None"),
         xfail=TENSOR + "any truthy copy means True"),
    # -- the Arrow PyCapsule interface: exports Arrow cannot hold, producers that lie
    Case("arrow-export-complex", "complex64 tensor.__arrow_c_array__()",
         lambda: hb.asarray(np.zeros(3, np.complex64)).__arrow_c_array__(), hb.UnsupportedError,
         ("no type for complex64", "convert the values")),
    Case("arrow-export-rank-0", "rank-0 tensor.__arrow_c_array__()",
         lambda: hb.asarray(np.float32(1)).__arrow_c_array__(), hb.UnsupportedError,
         ("rank-0", "shape (1,)")),
    Case("arrow-export-strided", "t[:, ::2].__arrow_c_array__()",
         lambda: hb.asarray(np.zeros((4, 4), np.float32)[:, ::2]).__arrow_c_array__(),
         hb.UnsupportedError, ("strides", "t.copy()")),
    Case("arrow-export-requested-schema", "t.__arrow_c_array__(requested_schema=<int64>)",
         lambda: _tensor().__arrow_c_array__(
             hb.asarray(np.zeros(2, np.int64)).__arrow_c_schema__()), hb.UnsupportedError,
         ("requested_schema asks for format 'l'", "float32", "without a cast")),
    Case("arrow-export-requested-schema-str", "t.__arrow_c_array__(requested_schema='f')",
         lambda: _tensor().__arrow_c_array__("f"), hb.UnsupportedError,
         ("requested_schema", "'arrow_schema' capsule", "str")),
    Case("arrow-device-keyword", "t.__arrow_c_device_array__(stream=5)",
         lambda: _tensor().__arrow_c_device_array__(stream=5), hb.UnsupportedError,
         ("does not know", "'stream': 5")),
    Case("arrow-import-not-a-pair", "__arrow_c_array__() -> 'x'",
         lambda: hb.asarray(ArrowReturns(lambda: "x")), hb.FormatError,
         ("__arrow_c_array__", "pair of capsules")),
    Case("arrow-import-not-capsules", "__arrow_c_array__() -> (1, 2)",
         lambda: hb.asarray(ArrowReturns(lambda: (1, 2))), hb.FormatError,
         ("__arrow_c_array__", "int", "'arrow_schema' capsule")),
    Case("arrow-import-nulls", "ArrowArray.null_count = 1",
         lambda: hb.asarray(ArrowDoctored("null_count", 1)), hb.UnsupportedError,
         ("holds nulls", "fill them first")),
    Case("arrow-import-null-count", "ArrowArray.null_count = -5",
         lambda: hb.asarray(ArrowDoctored("null_count", -5)), hb.FormatError,
         ("array.null_count", "-5", "outside -1..6")),
    Case("arrow-import-negative-length", "ArrowArray.length = -1",
         lambda: hb.asarray(ArrowDoctored("length", -1)), hb.FormatError,
         ("array.length", "-1", "must not be negative")),
    Case("arrow-import-offset-past-end", "ArrowArray.offset = 2**40",
         lambda: hb.asarray(ArrowDoctored("offset", 2**40, t=hb.asarray(
             np.zeros((2, 2), np.float32)))), hb.FormatError,
         ("children[0].length", "needs slots")),
    Case("arrow-import-offset-overflow", "ArrowArray.offset = 2**63 - 5",
         lambda: hb.asarray(ArrowDoctored("offset", 2**63 - 5)), hb.FormatError,
         ("array.offset", "past 2**63 - 1")),
    Case("arrow-import-offset-past-memory", "ArrowArray.offset = 2**62",
         lambda: hb.asarray(ArrowDoctored("offset", 2**62)), hb.FormatError,
         ("array.offset", "past the address space")),
    Case("arrow-import-schema-cycle", "ArrowSchema.children[0] = the schema itself",
         lambda: hb.asarray(ArrowSchemaCycle()), hb.FormatError,
         ("schema.children[0]", "nested over 64 levels", "own child")),
    Case("arrow-import-fst-dimension", "fixed_shape_tensor shape [0, 2**64 - 1] over +w:0",
         lambda: hb.asarray(ArrowDoctored("metadata", ctypes.addressof(_FST_HUGE), True,
                                          t=hb.asarray(np.zeros((2, 0), np.float32)))),
         hb.FormatError, ("metadata[ARROW:extension:metadata]", "0..2**63 - 1")),
    Case("arrow-import-buffers", "ArrowArray.n_buffers = 3",
         lambda: hb.asarray(ArrowDoctored("n_buffers", 3)), hb.FormatError,
         ("array.n_buffers", "3 buffers", "calls for 2")),
    Case("arrow-import-null-buffers", "ArrowArray.buffers = NULL",
         lambda: hb.asarray(ArrowDoctored("buffers", None)), hb.FormatError,
         ("array.buffers", "NULL buffers array")),
    Case("arrow-import-format", "ArrowSchema.format = 'u' (utf8)",
         lambda: hb.asarray(ArrowDoctored("format", ctypes.addressof(_U_FORMAT), True)),
         hb.UnsupportedError, ("format 'u'", "no tensor type")),
    Case("arrow-import-null-format", "ArrowSchema.format = NULL",
         lambda: hb.asarray(ArrowDoctored("format", None, True)), hb.FormatError,
         ("schema.format", "NULL format string")),
    Case("arrow-import-children", "ArrowSchema.n_children = 1 on a primitive",
         lambda: hb.asarray(ArrowDoctored("n_children", 1, True)), hb.FormatError,
         ("schema.n_children", "format 'f'", "expected 0")),
    # -- hb.from_dlpack: liars and garbage
    Case("from-dlpack-none", "hb.from_dlpack(None)", lambda: hb.from_dlpack(None),
         hb.UnsupportedError, ("NoneType", "not a DLPack producer", "__dlpack__")),
    Case("from-dlpack-copy-str", "hb.from_dlpack(x, copy='x')",
         lambda: hb.from_dlpack(LyingDevice((1, 0)), copy="x"), hb.UnsupportedError,
         ("copy", "'x'", "True, False or None"), xfail=TENSOR + "any truthy copy means True"),
    Case("device-lie-none", "__dlpack_device__() -> None",
         lambda: hb.from_dlpack(LyingDevice(None)), hb.FormatError,
         ("device", "__dlpack_device__", "None")),
    Case("device-lie-str", "__dlpack_device__() -> 'cpu'",
         lambda: hb.from_dlpack(LyingDevice("cpu")), hb.FormatError,
         ("device", "__dlpack_device__", "'cpu'"),
         xfail=TENSOR + "the message quotes Device()'s TypeError, not the value"),
    Case("device-lie-triple", "__dlpack_device__() -> (1, 0, 0)",
         lambda: hb.from_dlpack(LyingDevice((1, 0, 0))), hb.FormatError,
         ("device", "__dlpack_device__", "(1, 0, 0)"),
         xfail=TENSOR + "the message quotes Device()'s TypeError, not the value"),
    Case("device-lie-cuda", "__dlpack_device__() -> (2, 0), capsule on the CPU",
         lambda: hb.from_dlpack(LyingDevice((2, 0))), hb.FormatError,
         ("__dlpack_device__ says cuda:0", "capsule says cpu:0")),
    Case("device-lie-managed", "__dlpack_device__() -> (13, 0), capsule on the CPU",
         lambda: hb.from_dlpack(LyingDevice((13, 0))), hb.FormatError,
         ("__dlpack_device__ says", "capsule says cpu:0")),
    Case("device-lie-nan", "__dlpack_device__() -> (nan, 0)",
         lambda: hb.from_dlpack(LyingDevice((math.nan, 0))), hb.FormatError,
         ("__dlpack_device__", "nan")),
    Case("device-lie-negative", "__dlpack_device__() -> (-1, 0)",
         lambda: hb.from_dlpack(LyingDevice((-1, 0))), hb.FormatError,
         ("__dlpack_device__", "-1")),
    Case("device-lie-short", "__dlpack_device__() -> (1,)",
         lambda: hb.from_dlpack(LyingDevice((1,))), hb.FormatError,
         ("__dlpack_device__", "(1,)", "(device_type, device_id)"),
         xfail=TENSOR + "Device(1) fills in id 0"),
    Case("device-lie-negative-id", "__dlpack_device__() -> (1, -5)",
         lambda: hb.from_dlpack(LyingDevice((1, -5))), hb.FormatError,
         ("__dlpack_device__", "-5", "non-negative"),
         xfail=TENSOR + "CPU device ids are not compared (JAX), so -5 passes"),
    Case("device-lie-raises", "__dlpack_device__() raises RuntimeError",
         lambda: hb.from_dlpack(LyingDevice(RuntimeError("producer failed"))), RuntimeError,
         ("producer failed",), builtin=True),
    Case("capsule-none", "__dlpack__() -> None", lambda: hb.from_dlpack(Garbage(lambda: None)),
         hb.FormatError, ("capsule", "expected a DLPack capsule", "NoneType")),
    Case("capsule-int", "__dlpack__() -> 5", lambda: hb.from_dlpack(Garbage(lambda: 5)),
         hb.FormatError, ("capsule", "expected a DLPack capsule", "int")),
    Case("capsule-str", "__dlpack__() -> 'dltensor'",
         lambda: hb.from_dlpack(Garbage(lambda: "dltensor")), hb.FormatError,
         ("capsule", "expected a DLPack capsule", "str")),
    Case("capsule-array", "__dlpack__() -> an ndarray",
         lambda: hb.from_dlpack(Garbage(lambda: np.zeros(2))), hb.FormatError,
         ("capsule", "expected a DLPack capsule", "ndarray")),
    Case("capsule-random-name", "__dlpack__() -> capsule named 'random_name'",
         lambda: hb.from_dlpack(Garbage(lambda: _PyCapsule_New(1, _RANDOM_NAME, None))),
         hb.FormatError, ("capsule", "random_name", "'dltensor_versioned' or 'dltensor'")),
    Case("capsule-unnamed", "__dlpack__() -> capsule without a name",
         lambda: hb.from_dlpack(Garbage(lambda: _PyCapsule_New(1, None, None))),
         hb.FormatError, ("capsule", "name None", "'dltensor_versioned' or 'dltensor'")),
    Case("capsule-used", "__dlpack__() -> an already consumed capsule",
         lambda: hb.from_dlpack(Garbage(_used_capsule)), hb.FormatError,
         ("capsule", "already consumed", "only once")),
    Case("capsule-producer-raises", "__dlpack__() raises BufferError",
         lambda: hb.from_dlpack(Garbage(BufferError("cannot export"))), BufferError,
         ("cannot export",), builtin=True),
    Case("capsule-wrong-name-producer", "versioned capsule named 'dltensor_version'",
         lambda: hb.from_dlpack(__import__("tests.broken_producers", fromlist=["x"])
                                .WrongCapsuleName(np.arange(3.0))),
         hb.FormatError, ("capsule", "dltensor_version", "expected")),
    # -- hb.asarray / convert / get_adapter
    Case("asarray-none", "hb.asarray(None)", lambda: hb.asarray(None), hb.UnsupportedError,
         ("builtins.NoneType", "not an array of", "__dlpack__")),
    Case("asarray-list", "hb.asarray([1, 2])", lambda: hb.asarray([1, 2]), hb.UnsupportedError,
         ("builtins.list", "not an array of", "__dlpack__")),
    Case("asarray-object-array", "hb.asarray(np.array([object()]))",
         lambda: hb.asarray(np.array([object()])), hb.UnsupportedError,
         ("NumPy dtype object", "no Hurray element type")),
    Case("asarray-rank-65", "hb.asarray(a producer of rank 65)",
         lambda: hb.asarray(Garbage(lambda: _rank65_capsule())),
         hb.FormatError, ("rank 65", "64")),
    Case("asarray-copy-str-tensor", "hb.asarray(hb.Tensor, copy='yes')",
         lambda: hb.asarray(_tensor(), copy="yes"), hb.UnsupportedError,
         ("copy", "'yes'", "True, False or None"), xfail=REG + "any truthy copy means True"),
    Case("asarray-copy-str-numpy", "hb.asarray(ndarray, copy='yes')",
         lambda: hb.asarray(_array(), copy="yes"), hb.UnsupportedError,
         ("copy", "'yes'", "True, False or None"), xfail=REG + "any truthy copy means True"),
    Case("convert-target-none", "hb.convert(x, None)", lambda: hb.convert(_array(), None),
         hb.UnsupportedError, ("unknown target None", "choose one of numpy")),
    Case("convert-target-unknown", "hb.convert(x, 'theano')",
         lambda: hb.convert(_array(), "theano"), hb.UnsupportedError,
         ("unknown target 'theano'", "choose one of")),
    Case("convert-option-unknown", "hb.convert(x, 'numpy', chunks=2)",
         lambda: hb.convert(_array(), "numpy", chunks=2), hb.UnsupportedError,
         ("takes no chunks=", "only device= and copy=")),
    Case("convert-option-sparse", "hb.convert(scipy COO, 'arrow', kind='array')",
         lambda: hb.convert(pytest.importorskip("scipy.sparse").coo_array(np.eye(2)), "arrow",
                            kind="array"), hb.UnsupportedError,
         ("kind='array' applies to a dense tensor", "sparse")),
    Case("convert-list", "hb.convert([1, 2], 'torch')", lambda: hb.convert([1, 2], "numpy"),
         hb.UnsupportedError, ("builtins.list", "__dlpack__")),
    Case("convert-numpy-device", "hb.convert(x, 'numpy', device='cuda:0')",
         lambda: hb.convert(_array(), "numpy", device="cuda:0"), hb.UnsupportedError,
         ("device='cuda:0'", "CPU")),
    Case("convert-jax-device-int", "hb.convert(x, 'jax', device=12345)",
         lambda: hb.convert(_array(), "jax", device=12345), hb.UnsupportedError,
         ("device=12345", "not a JAX device")),
    Case("convert-torch-device-bogus", "hb.convert(x, 'torch', device='bogus:7')",
         lambda: hb.convert(_array(), "torch", device="bogus:7"), hb.UnsupportedError,
         ("device", "'bogus:7'"), xfail=ADAPT + "torch.device raises RuntimeError"),
    Case("convert-copy-false", "hb.convert(big-endian array, 'numpy', copy=False)",
         lambda: hb.convert(np.zeros(4, ">f4"), "numpy", copy=False), hb.CopyRequiredError,
         ("non-native byte order", "copy=False")),
    Case("get-adapter-list", "hb.get_adapter([])", lambda: hb.get_adapter([]),
         hb.UnsupportedError, ("unknown target []", "choose one of"),
         xfail=REG + "dict lookup of a list raises TypeError: unhashable"),
    Case("get-adapter-none", "hb.get_adapter(None)", lambda: hb.get_adapter(None),
         hb.UnsupportedError, ("unknown target None", "choose one of")),
]


def _rank65_capsule() -> object:
    """A versioned capsule of rank 65 over NumPy memory (built field by field)."""
    import ctypes

    from hurray_bridge import _dlpack as dl

    keep = _rank65_capsule.__dict__.setdefault("keep", [])
    a = np.zeros(1, np.float32)
    shape = (ctypes.c_int64 * 65)(*([1] * 65))
    m = dl.DLManagedTensorVersioned()
    m.version.major, m.version.minor = 1, 3
    t = m.dl_tensor
    t.data, t.ndim = a.ctypes.data, 65
    t.device.device_type = 1
    t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    keep.append((a, shape, m))  # no deleter: the test keeps the struct
    return _PyCapsule_New(ctypes.addressof(m), dl.DLTENSOR_VERSIONED_NAME, None)


# -- the adapters' own entry points
for _name in ("numpy", "torch", "jax", "arrow"):
    _xf = "" if _name == "arrow" else ADAPT + "t.is_dense on a non-Tensor: AttributeError"
    CASES += [
        Case(f"{_name}-from-hurray-none", f"adapters.{_name}.from_hurray(None)",
             lambda n=_name: _adapter(n).from_hurray(None), hb.UnsupportedError,
             ("NoneType",) + (("hb.Tensor",) if _name != "arrow" else ("__dlpack__",)),
             xfail=_xf),
        Case(f"{_name}-from-hurray-copy-str", f"adapters.{_name}.from_hurray(t, copy='no')",
             lambda n=_name: _adapter(n).from_hurray(_tensor(), copy="no"), hb.UnsupportedError,
             ("copy", "'no'", "True, False or None"),
             xfail=ADAPT + "any truthy copy means True"),
    ]
    if _name != "numpy":
        CASES.append(Case(
            f"{_name}-to-hurray-none", f"adapters.{_name}.to_hurray(None)",
            lambda n=_name: _adapter(n).to_hurray(None), hb.UnsupportedError, ("NoneType",)))
CASES += [
    Case("numpy-to-hurray-none", "adapters.numpy.to_hurray(None)",
         lambda: _adapter("numpy").to_hurray(None), hb.UnsupportedError,
         ("NumPy dtype object", "no Hurray element type")),
    Case("torch-to-hurray-ndarray", "adapters.torch.to_hurray(ndarray)",
         lambda: _adapter("torch").to_hurray(_array()), hb.UnsupportedError,
         ("expected a torch.Tensor", "numpy.ndarray")),
    Case("torch-from-hurray-device-int", "adapters.torch.from_hurray(t, device=12345)",
         lambda: _adapter("torch").from_hurray(_tensor(), device=12345), hb.UnsupportedError,
         ("device", "12345"), xfail=ADAPT + "torch.device(12345) raises RuntimeError"),
    Case("arrow-from-hurray-device", "adapters.arrow.from_hurray(t, device='bogus:7')",
         lambda: _adapter("arrow").from_hurray(_tensor(), device="bogus:7"),
         hb.UnsupportedError, ("device='bogus:7'", "host (CPU)")),
    Case("jax-from-hurray-device", "adapters.jax.from_hurray(t, device='bogus:7')",
         lambda: _adapter("jax").from_hurray(_tensor(), device="bogus:7"),
         hb.UnsupportedError, ("bogus", "backend")),
]



# -- TensorFlow (skipped by name where it is not installed)
def _tf() -> Any:
    return pytest.importorskip("tensorflow", reason="tensorflow is not installed")


def _aligned_array(values: Any, dtype: Any = np.float32, writeable: bool = True) -> Any:
    from hurray_bridge._memory import aligned_zeros

    a = aligned_zeros(np.shape(values), dtype)
    a[...] = values
    a.flags.writeable = writeable
    return a


def _to_tf(obj: Any, **kw: Any) -> Any:
    _tf()
    return hb.convert(obj, "tensorflow", **kw)


CASES += [
    Case("tensorflow-from-hurray-none", "adapters.tensorflow.from_hurray(None)",
         lambda: (_tf(), _adapter("tensorflow").from_hurray(None)), hb.UnsupportedError,
         ("NoneType", "hb.Tensor")),
    Case("tensorflow-from-hurray-copy-str", "adapters.tensorflow.from_hurray(t, copy='no')",
         lambda: (_tf(), _adapter("tensorflow").from_hurray(_tensor(), copy="no")),
         hb.UnsupportedError, ("copy", "'no'", "True, False or None")),
    Case("tensorflow-to-hurray-none", "adapters.tensorflow.to_hurray(None)",
         lambda: (_tf(), _adapter("tensorflow").to_hurray(None)), hb.UnsupportedError,
         ("NoneType", "tf.Tensor")),
    Case("tensorflow-string-tensor", "hb.asarray(tf.constant(['a']))",
         lambda: hb.asarray(_tf().constant(["a"])), hb.UnsupportedError,
         ("string tensor", "DLPack", "tf.cast")),
    Case("tensorflow-sparse-tensor", "hb.asarray(tf.SparseTensor(...))",
         lambda: hb.asarray(_tf().sparse.SparseTensor([[0, 0]], [1.0], [2, 2])),
         hb.UnsupportedError, ("tf.SparseTensor", "dense only", "tf.sparse.to_dense")),
    Case("tensorflow-ragged-tensor", "hb.asarray(tf.ragged.constant([[1], [2, 3]]))",
         lambda: hb.asarray(_tf().ragged.constant([[1], [2, 3]])), hb.UnsupportedError,
         ("tf.RaggedTensor", "to_tensor()")),
    Case("tensorflow-e8m0-target", "hb.convert(float8_e8m0fnu ndarray, 'tensorflow')",
         lambda: _to_tf(np.zeros(4, pytest.importorskip("ml_dtypes").float8_e8m0fnu)),
         hb.UnsupportedError, ("float8_e8m0fnu", "it holds bool8", "convert to numpy or jax")),
    Case("tensorflow-float8-copy-false", "hb.convert(float8 ndarray, 'tensorflow', copy=False)",
         lambda: _to_tf(np.zeros(4, pytest.importorskip("ml_dtypes").float8_e4m3fn),
                        copy=False), hb.CopyRequiredError,
         ("DLPack has no float8_e4m3fn", "tf.constant", "copy=False")),
    Case("tensorflow-device-bogus", "hb.convert(x, 'tensorflow', device='bogus:7')",
         lambda: _to_tf(_array(), device="bogus:7"), hb.UnsupportedError,
         ("device='bogus:7'", "'GPU:1'")),
    Case("tensorflow-device-absent-gpu", "hb.convert(x, 'tensorflow', device='GPU:99')",
         lambda: _to_tf(_aligned_array(np.ones(4)), device="GPU:99"), hb.UnsupportedError,
         ("GPU(s) here", "GPU:99", "device='CPU'")),
    Case("tensorflow-strided-copy-false", "hb.convert(a[:, ::2], 'tensorflow', copy=False)",
         lambda: _to_tf(_aligned_array(np.ones((2, 4)))[:, ::2], copy=False),
         hb.CopyRequiredError, ("strides (4, 2)", "compact", "copy=False", "copy=None")),
    Case("tensorflow-unaligned-copy-false", "hb.convert(16-byte aligned, 'tensorflow', copy=False)",
         lambda: _to_tf(_aligned_array(np.ones(8))[4:], copy=False), hb.CopyRequiredError,
         ("not 64-byte aligned", "abort", "copy=False")),
    Case("tensorflow-read-only-copy-false", "hb.convert(read-only array, 'tensorflow', copy=False)",
         lambda: _to_tf(_aligned_array(np.ones(8), writeable=False), copy=False),
         hb.CopyRequiredError, ("read-only", "InplaceUpdate", "copy=False")),
    Case("tensorflow-bool-bytes-copy-false",
         "hb.convert(bool bytes [0, 2], 'tensorflow', copy=False)",
         lambda: _to_tf(_aligned_array([0, 2], np.uint8).view(np.bool_), copy=False),
         hb.CopyRequiredError, ("0x01", "copy=False")),
    Case("tensorflow-packed-bool-copy-false", "hb.convert(1-bit bool, 'tensorflow', copy=False)",
         lambda: _to_tf(hb.pack_subbyte(hb.asarray(np.ones(8, np.bool_))), copy=False),
         hb.CopyRequiredError, ("1-bit packed bool", "tf.bool", "copy=False")),
]

CASES += [
    # -- files: hb.save / dumps / load / loads / read_index / verify
    Case("save-not-mapping", "hb.save(path, [array])",
         lambda: hb.dumps([_array()]), hb.UnsupportedError, ("mapping of names", "list")),
    Case("save-name-int", "hb.save(path, {1: array})", lambda: hb.dumps({1: _array()}),
         hb.UnsupportedError, ("entry names must be str", "int 1")),
    Case("save-name-empty", "hb.save(path, {'': array})", lambda: hb.dumps({"": _array()}),
         hb.FormatError, ("name", "''", "1 to 4096")),
    Case("save-name-nul", "hb.save(path, {'a\\0b': array})",
         lambda: hb.dumps({"a\0b": _array()}), hb.FormatError, ("name", "'a\\x00b'", "NUL")),
    Case("save-value-none", "hb.save(path, {'a': None})", lambda: hb.dumps({"a": None}),
         hb.UnsupportedError, ("entry 'a'", "NoneType")),
    Case("save-device-tensor", "hb.save(path, {'a': a CUDA tensor})",
         lambda: hb.dumps({"a": _fake_cuda()}), hb.UnsupportedError,
         ("entry 'a'", "cuda:0", "copy it to the CPU first")),
    Case("save-metadata-value-int", "metadata={'a': 1}",
         lambda: hb.dumps({"x": _array()}, {"a": 1}), hb.UnsupportedError,
         ("metadata value for 'a'", "must be a str", "int")),
    Case("save-metadata-list", "metadata=[1]", lambda: hb.dumps({"x": _array()}, [1]),
         hb.UnsupportedError, ("metadata", "mapping of str to str", "list")),
    Case("save-alignment-3", "alignment=3", lambda: hb.dumps({"x": _array()}, alignment=3),
         hb.FormatError, ("alignment", "power of two", "got 3")),
    Case("save-alignment-nan", "alignment=nan",
         lambda: hb.dumps({"x": _array()}, alignment=math.nan), hb.FormatError,
         ("alignment", "power of two", "got nan")),
    Case("save-alignment-bool", "alignment=True",
         lambda: hb.dumps({"x": _array()}, alignment=True), hb.FormatError,
         ("alignment", "power of two", "got True")),
    Case("save-path-none", "hb.save(None, {...})", lambda: hb.save(None, {"x": _array()}),
         TypeError, ("NoneType",), builtin=True),
    Case("save-missing-directory", "hb.save('/nonexistent/x.hurray', {...})",
         lambda: hb.save("/nonexistent/dir/x.hurray", {"x": _array()}), FileNotFoundError,
         ("/nonexistent/dir/x.hurray",), builtin=True),
    Case("load-path-none", "hb.load(None)", lambda: hb.load(None), TypeError,
         ("NoneType",), builtin=True),
    Case("load-path-bytearray", "hb.load(bytearray(b'x.hurray'))",
         lambda: hb.load(bytearray(b"x.hurray")), TypeError,  # a Sequence, but no paths
         ("bytearray",), builtin=True),
    Case("load-missing", "hb.load('/nonexistent.hurray')",
         lambda: hb.load("/nonexistent.hurray"), FileNotFoundError,
         ("/nonexistent.hurray",), builtin=True),
    Case("loads-none", "hb.loads(None)", lambda: hb.loads(None), hb.FormatError,
         ("input", "expected a bytes-like object", "NoneType")),
    Case("loads-str", "hb.loads('HRYF')", lambda: hb.loads("HRYF"), hb.FormatError,
         ("input", "expected a bytes-like object", "str")),
    Case("loads-empty", "hb.loads(b'')", lambda: hb.loads(b""), hb.FormatError,
         ("header", "truncated: 0 bytes", "128")),
    Case("loads-strided-view", "hb.loads(memoryview(data)[::2])",
         lambda: hb.loads(memoryview(bytes(512))[::2]), hb.FormatError,
         ("input", "contiguous")),
    Case("loads-descriptor-bytes", "hb.loads(a bare descriptor)",
         lambda: hb.loads(_D4.to_bytes() + bytes(128)), hb.FormatError,
         ("magic", "HRYD", "not a Hurray file (HRYF)")),
    Case("loads-read-only-copy-false", "hb.loads(bytes of a file with data, copy=False)",
         lambda: hb.loads(hb.dumps({"w": _A}), copy=False), hb.CopyRequiredError,
         ("read-only bytes", "must copy", "copy=False", "bytearray", "ACCESS_COPY")),
    Case("loads-copy-str", "hb.loads(bytearray(file), copy='no')",
         lambda: hb.loads(bytearray(hb.dumps({"w": _A})), copy="no"), hb.UnsupportedError,
         ("copy must be True, False or None", "'no'")),
    Case("dumps-none", "hb.dumps(None)", lambda: hb.dumps(None), hb.UnsupportedError,
         ("mapping of names to tensors", "NoneType")),
    # -- streams
    Case("writer-file-none", "StreamWriter(None, schema)", lambda: hb.StreamWriter(None, _S),
         hb.UnsupportedError, ("fileobj", "write()", "NoneType")),
    Case("writer-text-file", "StreamWriter(io.StringIO(), schema)",
         lambda: hb.StreamWriter(io.StringIO(), _S), hb.UnsupportedError,
         ("fileobj", "text stream", "binary mode ('wb')")),
    Case("writer-schema-none", "StreamWriter(file, None)",
         lambda: hb.StreamWriter(io.BytesIO(), None), hb.UnsupportedError,
         ("schema", "hb.Descriptor", "NoneType")),
    Case("writer-wrong-shape", "write(float32 [2, 4]) to schema [?, 3]",
         lambda: hb.StreamWriter(io.BytesIO(), _S).write(np.zeros((2, 4), np.float32)),
         hb.FormatError, ("axis 1 has size 4", "fixes it at 3")),
    Case("writer-wrong-dtype", "write(float64 [2, 3]) to a float32 schema",
         lambda: hb.StreamWriter(io.BytesIO(), _S).write(np.zeros((2, 3))), hb.FormatError,
         ("float64", "does not conform to the schema", "float32")),
    Case("writer-wrong-rank", "write(float32 [3]) to a rank-2 schema",
         lambda: hb.StreamWriter(io.BytesIO(), _S).write(np.zeros(3, np.float32)),
         hb.FormatError, ("rank 1", "rank 2")),
    Case("writer-none", "write(None)", lambda: hb.StreamWriter(io.BytesIO(), _S).write(None),
         hb.UnsupportedError, ("builtins.NoneType", "__dlpack__")),
    Case("writer-closed", "write() after close()",
         lambda: _closed_writer().write(np.zeros((1, 3), np.float32)), ValueError,
         ("write()", "closed StreamWriter"), builtin=True),
    Case("reader-file-none", "StreamReader(None)", lambda: hb.StreamReader(None),
         hb.UnsupportedError, ("fileobj", "read()", "NoneType")),
    Case("reader-bytes", "StreamReader(b'HRYS')", lambda: hb.StreamReader(b"HRYS"),
         hb.UnsupportedError, ("fileobj", "read()", "bytes")),
    Case("reader-text-file", "StreamReader(io.StringIO('HRYS'))",
         lambda: hb.StreamReader(io.StringIO("HRYS")), hb.UnsupportedError,
         ("fileobj", "text stream", "binary mode ('rb')")),
    Case("reader-max-str", "StreamReader(f, max_message_bytes='x')",
         lambda: hb.StreamReader(io.BytesIO(), max_message_bytes="x"), hb.UnsupportedError,
         ("max_message_bytes", "'x'", "integer")),
    Case("reader-max-nan", "max_message_bytes=nan",
         lambda: hb.StreamReader(io.BytesIO(), max_message_bytes=math.nan),
         hb.UnsupportedError, ("max_message_bytes", "nan", "integer")),
    Case("reader-max-float", "max_message_bytes=1.5",
         lambda: hb.StreamReader(io.BytesIO(), max_message_bytes=1.5), hb.UnsupportedError,
         ("max_message_bytes", "1.5", "integer")),
    Case("reader-max-negative", "max_message_bytes=-1",
         lambda: hb.StreamReader(io.BytesIO(), max_message_bytes=-1), hb.FormatError,
         ("max_message_bytes", "-1", ">= 0")),
    Case("reader-max-bool", "max_message_bytes=True",
         lambda: hb.StreamReader(io.BytesIO(), max_message_bytes=True), hb.UnsupportedError,
         ("max_message_bytes", "True", "integer")),
    Case("reader-empty", "StreamReader(io.BytesIO(b''))",
         lambda: hb.StreamReader(io.BytesIO(b"")), hb.FormatError,
         ("truncated stream header", "0 of its 16 bytes")),
    # -- shards
    Case("split-none", "hb.split(None, boxes)", lambda: hb.split(None, []),
         hb.UnsupportedError, ("builtins.NoneType", "__dlpack__")),
    Case("split-boxes-none", "hb.split(x, None)", lambda: hb.split(np.zeros(4), None),
         hb.UnsupportedError, ("boxes", "iterable of boxes", "NoneType")),
    Case("split-box-negative", "box ((-1,), (2,))",
         lambda: hb.split(np.zeros(4), [((-1,), (2,))]), hb.FormatError,
         ("boxes[0]", "offset -1", "neither may be negative")),
    Case("split-box-nan", "box ((nan,), (2,))",
         lambda: hb.split(np.zeros(4), [((math.nan,), (2,))]), hb.FormatError,
         ("boxes[0]", "nan", "must be integers")),
    Case("split-box-rank", "box of rank 2 for a rank-1 tensor",
         lambda: hb.split(np.zeros(4), [((0, 0), (2, 2))]), hb.FormatError,
         ("boxes[0]", "2 offsets and 2 sizes", "rank 1")),
    Case("split-not-tiling", "one box covering half the tensor",
         lambda: hb.split(np.zeros(4), [((0,), (2,))]), hb.FormatError,
         ("cover 2 of the 4 elements", "index [2] is in no box")),
    Case("split-device-str", "devices=['cuda']",
         lambda: hb.split(np.zeros(4), [((0,), (4,))], devices=["cuda"]), hb.UnsupportedError,
         ("devices[0]", "'cuda'", "(device_type, device_id)")),
    Case("split-replica-negative", "replica_ids=[-1]",
         lambda: hb.split(np.zeros(4), [((0,), (4,))], replica_ids=[-1]), hb.FormatError,
         ("replica_id", "-1", "[0, 4294967295]")),
    Case("grid-parts-zero", "grid_boxes([4], [0])", lambda: hb.grid_boxes([4], [0]),
         hb.FormatError, ("parts[0] = 0", ">= 1")),
    Case("grid-parts-nan", "grid_boxes([4], [nan])", lambda: hb.grid_boxes([4], [math.nan]),
         hb.UnsupportedError, ("parts[0]", "nan", "must be an integer")),
    Case("grid-shape-negative", "grid_boxes([-4], [2])", lambda: hb.grid_boxes([-4], [2]),
         hb.FormatError, ("shape[0] = -4", ">= 0")),
    Case("grid-shape-float", "grid_boxes([4.5], [2])", lambda: hb.grid_boxes([4.5], [2]),
         hb.UnsupportedError, ("shape[0]", "4.5", "must be an integer")),
    Case("grid-parts-str", "grid_boxes([4], 'a')", lambda: hb.grid_boxes([4], "a"),
         hb.UnsupportedError, ("parts", "'a'", "sequence of integers")),
    Case("grid-none", "grid_boxes(None, None)", lambda: hb.grid_boxes(None, None),
         hb.UnsupportedError, ("shape", "None", "sequence of integers")),
    Case("assemble-none", "hb.assemble(None)", lambda: hb.assemble(None), hb.UnsupportedError,
         ("assemble()", "hb.ShardedTensor", "NoneType")),
    Case("assemble-target", "hb.assemble(sharded, 'tf')", lambda: hb.assemble(_sharded(), "tf"),
         hb.UnsupportedError, ("unknown target 'tf'", "choose one of")),
    Case("sharded-descriptor-none", "hb.ShardedTensor(None, [])",
         lambda: hb.ShardedTensor(None, []), hb.UnsupportedError,
         ("descriptor", "hb.Descriptor", "NoneType")),
    Case("sharded-shard-array", "hb.ShardedTensor(desc, [ndarray])",
         lambda: hb.ShardedTensor(D([4], hb.float64), [np.zeros(4)]), hb.UnsupportedError,
         ("shards[0]", "ndarray", "not an hb.Tensor")),
    # -- shared memory
    Case("shm-share-none", "shm.share(None)", lambda: shm.share(None), hb.UnsupportedError,
         ("builtins.NoneType", "__dlpack__")),
    Case("shm-attach-str", "shm.attach('x')", lambda: shm.attach("x"), hb.UnsupportedError,
         ("attach()", "SharedTensorHandle", "str")),
    # -- quantization, sub-byte packing, sparse
    Case("quantize-none", "hb.quantize(None, ...)",
         lambda: hb.quantize(None, "int8", hb.Quantization(Q.PER_TENSOR), None),
         hb.UnsupportedError, ("builtins.NoneType", "__dlpack__")),
    Case("quantize-bad-quantization", "hb.quantize(x, 'int8', 'x', scales)",
         lambda: hb.quantize(np.zeros(4, np.float32), "int8", "x", np.ones(1, np.float32)),
         hb.FormatError, ("quantization", "'x'", "expected a Quantization")),
    Case("quantize-dtype-unknown", "hb.quantize(x, 'int99', ...)",
         lambda: hb.quantize(np.zeros(4, np.float32), "int99", hb.Quantization(Q.PER_TENSOR),
                             np.ones((), np.float32)),
         hb.UnsupportedError, ("'int99'", "known:")),
    Case("quantize-nan", "hb.quantize(x with NaN, ...)",
         lambda: hb.quantize(np.array([1.0, math.nan], np.float32), "int8",
                             hb.Quantization(Q.PER_TENSOR), np.ones((), np.float32)),
         hb.FormatError, ("NaN", "replace NaNs first"),
         xfail=QUANT + "raises a plain ValueError"),
    Case("dequantize-dense", "hb.dequantize(a float32 array)",
         lambda: hb.dequantize(np.zeros(4, np.float32)), hb.UnsupportedError,
         ("float32", "not quantized")),
    Case("pack-subbyte-float", "hb.pack_subbyte(a float32 array)",
         lambda: hb.pack_subbyte(np.zeros(4, np.float32)), hb.UnsupportedError,
         ("pack_subbyte()", "not float32")),
    Case("unpack-subbyte-float", "hb.unpack_subbyte(a float32 array)",
         lambda: hb.unpack_subbyte(np.zeros(4, np.float32)), hb.UnsupportedError,
         ("unpack_subbyte()", "not float32")),
    Case("densify-dense", "hb.densify(a dense array)", lambda: hb.densify(np.zeros(4)),
         hb.UnsupportedError, ("COO, CSR or CSC", "ROW_MAJOR")),
    # -- hb.testing
    Case("testing-dtype-unknown", "check_producer(f, dtype='float33')",
         lambda: hbt.check_producer(lambda s, d: np.zeros(s), dtype="float33"),
         hb.UnsupportedError, ("'float33'", "known:")),
    Case("testing-check-unknown", "check_producer(f, checks=['nope'])",
         lambda: hbt.check_producer(lambda s, d: np.zeros(s), checks=["nope"]), ValueError,
         ("unknown check(s) 'nope'", "the checks are"), builtin=True),
    Case("testing-check-str", "check_producer(f, checks='nope')",
         lambda: hbt.check_producer(lambda s, d: np.zeros(s), checks="nope"), ValueError,
         ("unknown check(s) 'nope';",), builtin=True),
    Case("testing-factory-none", "load_factory(None)", lambda: hbt.load_factory(None),
         ValueError, ("'MODULE:FACTORY'", "NoneType"), builtin=True),
    Case("testing-factory-spec", "load_factory('nomodule')",
         lambda: hbt.load_factory("nomodule"), ValueError,
         ("'nomodule'", "is not MODULE:FACTORY"), builtin=True),
    Case("testing-factory-not-callable", "load_factory('os:sep')",
         lambda: hbt.load_factory("os:sep"), ValueError, ("os:sep", "not a callable factory"),
         builtin=True),
    Case("testing-consumer-spec", "check_consumer('nomodule')",
         lambda: hbt.check_consumer("nomodule"), ValueError,
         ("'nomodule'", "is not MODULE:FUNCTION", "mylib:from_dlpack"), builtin=True),
    Case("testing-consumer-lambda", "check_consumer(lambda x: x)",
         lambda: hbt.check_consumer(lambda x: x), ValueError,
         ("not importable by name", "child process", "'MODULE:FUNCTION'"), builtin=True),
    Case("testing-consumer-check-unknown", "check_consumer('numpy:from_dlpack', checks=['nope'])",
         lambda: hbt.check_consumer("numpy:from_dlpack", checks=["nope"]), ValueError,
         ("unknown check(s) 'nope'", "the consumer checks are"), builtin=True),
    Case("testing-consumer-timeout", "check_consumer('numpy:from_dlpack', timeout=0)",
         lambda: hbt.check_consumer("numpy:from_dlpack", timeout=0), ValueError,
         ("timeout=0", "finite number above 0", "default is 60"), builtin=True),
    Case("round-trip-none", "assert_round_trip(None)", lambda: hbt.assert_round_trip(None),
         hb.UnsupportedError, ("builtins.NoneType", "__dlpack__")),
    Case("round-trip-via-unknown", "assert_round_trip(x, via=('tf',))",
         lambda: hbt.assert_round_trip(_array(), via=("tf",)), hb.UnsupportedError,
         ("via[0] = 'tf'", "not a framework", "choose from")),
    Case("round-trip-via-int", "assert_round_trip(x, via=5)",
         lambda: hbt.assert_round_trip(_array(), via=5), hb.UnsupportedError,
         ("via", "int 5", "framework name")),
    # -- safetensors headers
    Case("safetensors-none", "parse_header(None, 10)", lambda: sio.parse_header(None, 10),
         hb.FormatError, ("input", "expected bytes", "NoneType")),
    Case("safetensors-shape-nan", "shape [NaN]",
         lambda: _st('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "nan", "non-negative integers")),
    Case("safetensors-shape-negative", "shape [-1]",
         lambda: _st('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "-1", "non-negative integers")),
    Case("safetensors-shape-rank-65", "shape of 65 ones",
         lambda: _st('{"a":{"dtype":"F32","shape":[' + ",".join(["1"] * 65)
                     + '],"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "at most 64")),
    Case("safetensors-shape-dynamic", "shape [2**64 - 1]",
         lambda: _st('{"a":{"dtype":"F32","shape":[18446744073709551615],'
                     '"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "18446744073709551615", "2**64 - 1",
                          "dynamic")),
    Case("safetensors-offsets-negative", "data_offsets [-4, 0]",
         lambda: _st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}'),
         hb.FormatError, ("data_offsets", "[-4, 0]", "0 <= begin <= end")),
]


# -- hostile producers: every field of the capsule forged (tests.broken_producers.Forged)
_MEM = np.arange(64, dtype=np.float32)  # what the forged capsules point into
_AT = _MEM.ctypes.data
_FAKE_GPU = 0x7F3A_C000_0000  # never mapped here: a read of it crashes loudly


def _forged(**fields: Any) -> Any:
    from tests.broken_producers import Forged

    fields.setdefault("data", _AT)
    return Forged(keep=_MEM, **fields)


def _file_tensor(shape: list[int], dtype: Any = F32) -> hb.Tensor:
    """An empty entry of shape ``shape`` read back from a (valid, few hundred byte) file."""
    empty = hb.Tensor(D(shape, dtype), [hb.Buffer(hb.BufferRole.DATA, 0, 0)])
    return hb.loads(hb.dumps({"x": empty}))["x"]


def _without_cuda(name: str) -> None:
    if name == "torch" and pytest.importorskip("torch").cuda.is_available():
        pytest.skip("this machine has CUDA: the case is about a torch without it")
    if name == "jax" and any(d.platform == "gpu" for d in pytest.importorskip("jax").devices()):
        pytest.skip("this machine has a JAX GPU backend: the case is about JAX without one")


def _no_cuda(name: str) -> Any:
    """A CUDA capsule (at an address never mapped here) handed to ``name``."""
    _without_cuda(name)
    return hb.convert(_forged(shape=(4,), data=_FAKE_GPU, device=(2, 0)), name)


def _torch_to_cuda() -> Any:
    _without_cuda("torch")
    return hb.convert(_array(), "torch", device="cuda")


CASES += [
    Case("import-device-id-none-cuda", "__dlpack_device__() -> (2, None)",
         lambda: hb.from_dlpack(_forged(shape=(4,), device=(2, 0), reported=(2, None))),
         hb.FormatError, ("device", "(2, None)", "device_id None", "kDLCPU")),
    Case("import-null-data", "capsule: data NULL, shape (4,)",
         lambda: hb.from_dlpack(_forged(data=0, shape=(4,))), hb.FormatError,
         ("data", "NULL", "4 elements")),
    Case("import-null-data-offset", "capsule: data NULL, byte_offset 64, shape (4,)",
         lambda: hb.from_dlpack(_forged(data=0, byte_offset=64, shape=(4,))), hb.FormatError,
         ("data", "NULL", "byte_offset")),
    Case("import-byte-offset-wraps", "capsule: data + byte_offset >= 2**64",
         lambda: hb.from_dlpack(_forged(shape=(4,), byte_offset=2**64 - 8)), hb.FormatError,
         ("byte_offset", "2**64", "address space")),
    Case("import-strides-overflow", "capsule: shape (3, 3), strides (2**62, 2**62)",
         lambda: hb.from_dlpack(_forged(shape=(3, 3), strides=(2**62, 2**62))), hb.FormatError,
         ("strides", "(4611686018427387904, 4611686018427387904)", "2**63 - 1")),
    Case("import-stride-int64-min", "capsule: shape (2, 2), strides (-2**63, 1)",
         lambda: hb.from_dlpack(_forged(shape=(2, 2), strides=(-2**63, 1))), hb.FormatError,
         ("strides[0]", "-9223372036854775808", "-(2**63 - 1)")),
    Case("import-shape-bytes-overflow", "capsule: shape (2**62, 2**62), float32",
         lambda: hb.from_dlpack(_forged(shape=(2**62, 2**62))), hb.FormatError,
         ("shape", "(4611686018427387904, 4611686018427387904)", "2**63 - 1")),
    Case("import-span-below-zero", "capsule: data 0x10, shape (4,), strides (-8,)",
         lambda: hb.from_dlpack(_forged(data=0x10, shape=(4,), strides=(-8,))),
         hb.FormatError, ("strides", "below address 0", "address space")),
    Case("import-span-past-top", "capsule: data 2**64 - 8, shape (4,), float32",
         lambda: hb.from_dlpack(_forged(data=2**64 - 8, shape=(4,))), hb.FormatError,
         ("data", "past 2**64", "address space")),
    Case("import-broadcast-count-overflow", "capsule: shape (2**40, 2**40), strides (0, 0)",
         lambda: hb.from_dlpack(_forged(shape=(2**40, 2**40), strides=(0, 0))),
         hb.FormatError, ("shape", "1208925819614629174706176 elements", "2**64 - 1")),
    # -- device memory on a machine whose frameworks cannot reach it
    Case("convert-cuda-capsule-numpy", "hb.convert(a CUDA capsule, 'numpy'), no CUDA",
         lambda: _no_cuda("numpy"), hb.UnsupportedError,
         ("cuda:0", "NumPy", "host copy", "dl_device=(1, 0)")),
    Case("convert-cuda-capsule-arrow", "hb.convert(a CUDA capsule, 'arrow'), no CUDA",
         lambda: _no_cuda("arrow"), hb.UnsupportedError,
         ("cuda:0", "Arrow", "host copy", "dl_device=(1, 0)")),
    Case("convert-cuda-capsule-torch", "hb.convert(a CUDA capsule, 'torch'), no CUDA",
         lambda: _no_cuda("torch"), hb.UnsupportedError, ("cuda:0", "torch", "without CUDA")),
    Case("convert-cuda-capsule-jax", "hb.convert(a CUDA capsule, 'jax'), no CUDA",
         lambda: _no_cuda("jax"), hb.UnsupportedError, ("JAX has no cuda backend",)),
    Case("convert-opencl-capsule-torch", "hb.convert(a kDLOpenCL capsule, 'torch')",
         lambda: hb.convert(_forged(shape=(4,), data=_FAKE_GPU, device=(4, 0),
                                    versioned=False), "torch"),
         hb.UnsupportedError, ("opencl:0", "cannot become a torch tensor", "host, CUDA")),
    Case("convert-cpu1-capsule-jax", "hb.convert(a capsule on cpu:1, 'jax'), JAX has cpu:0",
         lambda: hb.convert(_forged(shape=(4,), device=(1, 1), reported=(1, 0)), "jax"),
         hb.UnsupportedError, ("JAX has no cpu device with hardware id 1",)),
    Case("convert-torch-device-cuda", "hb.convert(ndarray, 'torch', device='cuda'), no CUDA",
         _torch_to_cuda, hb.UnsupportedError, ("device='cuda'", "torch", "without CUDA")),
    # -- valid files whose empty entries no framework can hold
    Case("convert-empty-2e62-numpy", "hb.convert(empty file entry [2**62, 0] float32, 'numpy')",
         lambda: hb.convert(_file_tensor([2**62, 0]), "numpy"), hb.UnsupportedError,
         ("NumPy", "[4611686018427387904, 0]", "2**63 - 1")),
    Case("convert-empty-2e63-numpy", "hb.convert(empty file entry [2**63, 0], 'numpy')",
         lambda: hb.convert(_file_tensor([2**63, 0]), "numpy"), hb.UnsupportedError,
         ("NumPy", "9223372036854775808", "2**63 - 1")),
    Case("convert-empty-2e62-jax", "hb.convert(empty file entry [2**62, 0] float32, 'jax')",
         lambda: hb.convert(_file_tensor([2**62, 0]), "jax"), hb.UnsupportedError,
         ("JAX", "[4611686018427387904, 0]", "2**63 - 1")),
    Case("convert-empty-2e63-torch", "hb.convert(empty file entry [2**63, 0], 'torch')",
         lambda: hb.convert(_file_tensor([2**63, 0]), "torch"), hb.UnsupportedError,
         ("torch", "9223372036854775808", "int64")),
    Case("convert-empty-product-torch", "hb.convert(empty entry [2**40, 2**40, 0], 'torch')",
         lambda: hb.convert(_file_tensor([2**40, 2**40, 0]), "torch"), hb.UnsupportedError,
         ("torch", "[1099511627776, 1099511627776, 0]", "overflows 64 bits")),
    Case("convert-empty-stride-arrow", "hb.convert(empty entry [0, 2**62] float32, 'arrow')",
         lambda: hb.convert(_file_tensor([0, 2**62]), "arrow"), hb.UnsupportedError,
         ("Arrow", "[0, 4611686018427387904]", "64-bit")),
    Case("dlpack-empty-strides-overflow", "t.__dlpack__() of empty [0, 2**40, 2**40]",
         lambda: _file_tensor([0, 2**40, 2**40]).__dlpack__(), hb.UnsupportedError,
         ("strides", "int64")),
]


# -- the compatibility report (hurray matrix)
CASES += [
    Case("matrix-repeat-0", "run_matrix(['numpy'], repeat=0)",
         lambda: hb_matrix.run_matrix(["numpy"], repeat=0),
         hb.FormatError, ("repeat", ">= 1", "got 0")),
    Case("matrix-size-negative", "run_matrix(['numpy'], n=-1)",
         lambda: hb_matrix.run_matrix(["numpy"], n=-1),
         hb.FormatError, ("size", ">= 1", "got -1")),
    Case("matrix-unknown-framework", "run_matrix(['theano'])",
         lambda: hb_matrix.run_matrix(["theano"]),
         hb.UnsupportedError, ("'theano'", "numpy, torch, jax, arrow, cupy")),
    # -- short and cut files are named for what they are
    Case("loads-short-foreign", "hb.loads(b'hello')", lambda: hb.loads(b"hello"),
         hb.FormatError, ("magic", "not a Hurray file", "5 bytes")),
    Case("safetensors-header-past-end", "header length 64, file of 10 bytes",
         lambda: sio.parse_header(b"\x40" + bytes(7) + b"{}", 10),
         hb.FormatError, ("header_length", "truncated", "10 bytes")),
    Case("safetensors-offsets-past-end", "data_offsets [0, 400], 16 bytes of data",
         lambda: _st('{"a":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}}'),
         hb.FormatError, ("data_offsets", "truncated", "16 bytes of data")),
    Case("safetensors-shape-nested", "shape [[], [], ...] (checked at its first [)",
         lambda: _st('{"a":{"dtype":"F32","shape":[' + ",".join(["[]"] * 1000)
                     + '],"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "<an array, at byte 29>", "at most 64")),
    Case("safetensors-shape-object", "shape [{}]",
         lambda: _st('{"a":{"dtype":"F32","shape":[{}],"data_offsets":[0,4]}}'),
         hb.FormatError, ("tensors['a'].shape", "<an object", "non-negative integers")),
    Case("safetensors-name-lone-surrogate", 'name "\\ud800"',
         lambda: _st('{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'),
         hb.FormatError, ("header", "lone surrogate", "\\ud800", "safetensors refuses")),
    Case("safetensors-bom", "EF BB BF before the header's {",
         lambda: sio.parse_header(struct.pack("<Q", 5) + b"\xef\xbb\xbf{}", 13),
         hb.FormatError, ("header", "byte order mark", "EF BB BF", "remove")),
]


# -- read-only memory never goes out writable (docs/spec/buffer-protocol.md §6)
def _read_only() -> hb.Tensor:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False  # (hb.loads of bytes copies: its tensors are writable)
    return hb.asarray(a)


def _grad_to_torch_no_copy() -> Any:
    torch = pytest.importorskip("torch")
    return hb.convert(torch.ones(3, requires_grad=True), "torch", copy=False)


CASES += [
    Case("dlpack-legacy-read-only", "t.__dlpack__() of read-only t (a legacy request)",
         lambda: _read_only().__dlpack__(), hb.UnsupportedError,
         ("read-only", "legacy DLPack capsule", "hb.convert(t, 'jax')", "max_version=(1, 0)",
          "copy=True")),
    Case("dlpack-legacy-read-only-copy-false", "t.__dlpack__(copy=False) of read-only t",
         lambda: _read_only().__dlpack__(copy=False), hb.CopyRequiredError,
         ("read-only", "copy=False", "hb.convert(t, 'jax')", "max_version=(1, 0)")),
    Case("convert-requires-grad-torch-copy-false",
         "hb.convert(torch.ones(3, requires_grad=True), 'torch', copy=False)",
         _grad_to_torch_no_copy, hb.CopyRequiredError,
         ("requires grad", "read-only", "copy=False", "x.detach()")),
]


# -- streams whose channel fails part-way (docs/spec/interchange.md §6.5)
class _FailsAt(io.RawIOBase):
    """A pipe-like reader: ``data[:at]``, then one ``OSError``, then the rest (``at=-1``: never)."""

    def __init__(self, data: bytes, at: int) -> None:
        self._data, self._left = memoryview(data), at

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._left == 0:
            self._left = -1
            raise OSError("device error")
        n = min(len(b), len(self._data))
        if self._left > 0:
            n = min(n, self._left)
            self._left -= n
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def _u8_stream(*payloads: bytes, cut: int | None = None) -> bytes:
    f = io.BytesIO()
    with hb.StreamWriter(f, D([DYN], hb.uint8)) as w:
        for p in payloads:
            w.write(np.frombuffer(p, np.uint8))
    return f.getvalue()[:cut]


def _read_after_failed_read() -> Any:
    data = _u8_stream(bytes(200), b"next")
    r = hb.StreamReader(_FailsAt(data, 64 + 64 + 100))  # in the middle of the first payload
    with pytest.raises(OSError):
        r.read()
    return r.read()


class _DeadPeer(io.RawIOBase):
    """Takes every byte; once ``dead``, every flush fails as a closed pipe does."""

    dead = False

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        return len(b)

    def flush(self) -> None:
        if self.dead:
            raise BrokenPipeError("peer gone")

    def close(self) -> None:
        # The finaliser closes, and close flushes: a dead peer closes quietly, since from
        # Python 3.13 on an error there is reported (unraisable) in whichever test runs then.
        self.dead = False
        super().close()


def _write_after_failed_flush() -> Any:
    sink = _DeadPeer()
    w = hb.StreamWriter(sink, D([DYN], hb.uint8))
    sink.dead = True
    with pytest.raises(BrokenPipeError):
        w.write(np.zeros(3, np.uint8))
    return w.write(np.zeros(3, np.uint8))


def _pipe_claiming_1mib() -> Any:
    import struct

    data = bytearray(_u8_stream(bytes(10))[:128])  # stream header, schema, message header
    struct.pack_into("<Q", data, 64 + 16, 32 + (1 << 20) - 64)  # payload_size
    struct.pack_into("<Q", data, 64 + 32, (1 << 20) - 64)  # the one dynamic size
    return list(hb.StreamReader(_FailsAt(bytes(data), -1)))


CASES += [
    Case("reader-after-failed-read", "read() after a read that raised OSError mid-payload",
         _read_after_failed_read, hb.FormatError,
         ("unusable after an earlier error", "OSError: device error")),
    Case("writer-after-failed-flush", "write() after a write whose flush raised BrokenPipeError",
         _write_after_failed_flush, ValueError, ("earlier write() failed part-way",),
         builtin=True),
    Case("reader-pipe-claims-1mib", "128-byte pipe stream whose message claims 1 MiB - 64",
         _pipe_claiming_1mib, hb.FormatError,
         ("truncated buffers of message 0", "0 of its 1048512 bytes")),
]


# -- format rules on build, decode, import and write (metadata.md §8, memory-layout.md §5.1)
_CSR = hb.Layout.CSR


def _empty_csr_bytes() -> bytes:
    """A [0, 5] CSR descriptor claiming nnz = 3: a valid [1, 5] one, shape and lengths patched."""
    import struct

    raw = bytearray(D([1, 5], F32, _CSR, sparse=hb.Sparse(3)).to_bytes())
    struct.pack_into("<Q", raw, 32, 0)  # shape[0]
    table = len(raw) - 3 * 24
    struct.pack_into("<Q", raw, table + 16, 0)  # VALUES: what an empty shape implied
    struct.pack_into("<Q", raw, table + 24 + 16, 8)  # INDPTR: one entry for zero rows
    return bytes(raw)


def _dirty_bool_file() -> bytes:
    """A file holding bool [3] = [1, 0, 1] whose data byte has trailing bits set (0xfd)."""
    raw = hb.dumps({"x": hb.pack_subbyte(np.array([True, False, True]))}, checksums=False)
    at = len(raw) - 1  # the one data byte is the file's last
    assert raw[at] == 0x05
    return raw[:at] + b"\xfd"


def _dirty_padded_file() -> bytes:
    """A file holding padded int4 [3] = [-1, 1, 0] as the bytes ff f1 80 (high bits set)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    raw = hb.dumps({"x": np.array([-1, 1, 0], ml_dtypes.int4)}, checksums=False)
    assert raw[-3:] == b"\x0f\x01\x00"  # hb.dumps writes them as zero
    return raw[:-3] + b"\xff\xf1\x80"


def _one_shard() -> hb.Tensor:
    """Rows 0-1 of a [4, 3] float32 tensor, as a shard (replica 0)."""
    return hb.split(np.zeros((4, 3), np.float32), hb.grid_boxes((4, 3), (2, 1))).shards[0]


def _narrow_index_bytes() -> bytes:
    """A [2, 2] CSR descriptor with nnz = 200 and int8 indices, as an unchecking writer has it."""
    from tests.hurray_bridge.test_wire import with_index_type

    return with_index_type(D([2, 2], F32, _CSR, sparse=hb.Sparse(200, hb.uint64)), hb.int8)


CASES += [
    Case("descriptor-sparse-empty-shape-nnz", "Descriptor([0, 5], float32, CSR, Sparse(3))",
         lambda: D([0, 5], F32, _CSR, sparse=hb.Sparse(3)), hb.FormatError,
         ("sparse.nnz", "[0, 5]", "nnz must be 0", "nnz = 3")),
    Case("decode-sparse-empty-shape-nnz", "from_bytes([0, 5] CSR descriptor with nnz 3)",
         lambda: D.from_bytes(_empty_csr_bytes()), hb.FormatError,
         ("sparse.nnz", "[0, 5]", "nnz must be 0", "nnz = 3")),
    Case("make-sparse-empty-shape-nnz", "make_sparse('coo', (0, 5), 3 values, (2, 3) indices)",
         lambda: hb.sparse.make_sparse("coo", (0, 5), np.ones(3, np.float32),
                                       np.array([[0, 0, 0], [1, 2, 3]])), hb.FormatError,
         ("sparse.nnz", "[0, 5]", "nnz must be 0", "nnz = 3")),
    Case("encode-overlapping-offsets", "wire.encode(CSR [4, 5] nnz 3, offsets=[0, 0, 64])",
         lambda: hb.wire.encode(D([4, 5], F32, _CSR, sparse=hb.Sparse(3, hb.int32)),
                                [0, 0, 64]), hb.FormatError,
         ("buffers.offset", "buffers[1]", "overlaps buffers[0]", "canonical_offsets")),
    Case("encode-offset-past-2e64", "wire.encode(float32 [32], offsets=[2**64 - 128])",
         lambda: hb.wire.encode(D([32], F32), [2**64 - 128]), hb.FormatError,
         ("buffers.offset", "offset 18446744073709551488 + length 128", "2**64 - 1")),
    Case("loads-verify-trailing-bits", "loads(file: packed bool [3] as 0xfd, verify=True)",
         lambda: hb.loads(_dirty_bool_file(), verify=True), hb.FormatError,
         ("entries[0].buffers[0].trailing_bits", "0xfd", "mask 0xf8", "must be zero",
          "save it again")),
    Case("encode-offset-float", "wire.encode(float32 [4], offsets=[64.0])",
         lambda: hb.wire.encode(D([4], F32), [64.0]), hb.FormatError,  # type: ignore[list-item]
         ("buffers.offset", "buffers[0]", "must be an integer", "64.0")),
    Case("descriptor-sparse-index-too-narrow",
         "Descriptor([2, 2], float32, CSR, Sparse(200, int8))",
         lambda: D([2, 2], F32, _CSR, sparse=hb.Sparse(200, hb.int8)), hb.FormatError,
         ("sparse.index_dtype", "int8", "up to 127", "nnz = 200", "wider index type (int16")),
    Case("descriptor-coo-index-too-narrow", "Descriptor([3, 300], float32, COO, Sparse(1, uint8))",
         lambda: D([3, 300], F32, hb.Layout.COO, sparse=hb.Sparse(1, hb.uint8)), hb.FormatError,
         ("sparse.index_dtype", "uint8", "up to 255", "dimension 1 has size 300", "int16")),
    Case("decode-sparse-index-too-narrow", "from_bytes([2, 2] CSR, nnz 200, int8 indices)",
         lambda: D.from_bytes(_narrow_index_bytes()), hb.FormatError,
         ("sparse.index_dtype", "int8", "nnz = 200", "wider index type")),
    Case("loads-verify-padded-high-bits", "loads(file: padded int4 [3] as ff f1 80, verify=True)",
         lambda: hb.loads(_dirty_padded_file(), verify=True), hb.FormatError,
         ("entries[0].buffers[0].high_bits", "element 0", "0xff", "mask 0xf0", "must be zero",
          "save it again")),
    Case("dumps-one-shard-box-twice", "hb.dumps({'w[0]': s, 'w[1]': s}), s one shard",
         lambda: hb.dumps({"w[0]": _one_shard(), "w[1]": _one_shard()}), hb.FormatError,
         ("shards", "sharded tensor 'w'", "entry 'w[1]' and entry 'w[0]'", "replica 0",
          "distinct replica ids")),
]


# -- Arrow Flight (interchange.md §10)
def _flight() -> Any:
    pytest.importorskip("pyarrow.flight", reason="this pyarrow has no Flight")
    from hurray_bridge.adapters.arrow import flight

    return flight


_NO_SERVER = "grpc://127.0.0.1:1"  # port 1: nothing listens there


def _get_unknown_name() -> None:
    import threading

    F = _flight()
    srv = F.FlightTensorServer("grpc://127.0.0.1:0")
    th = threading.Thread(target=srv.serve, daemon=True)
    th.start()
    try:
        F.get(srv.location, "missing", timeout=30)
    finally:
        srv.shutdown()
        th.join(30)


def _padding_past_bound() -> None:
    import pyarrow as pa

    F = _flight()
    d = hb.Descriptor([6], hb.float32)
    head = F._MESSAGE_HEADER.pack(F.MESSAGE_MAGIC, F.KIND_TENSOR, 1, 1, 0, 24, 0)
    batch, _ = F._batch(hb.asarray(_array()), 0, F._arrow_schema(d), 0)
    F._check(d, 0, batch, pa.py_buffer(head + d.to_bytes() + bytes(128)))


def _metadata_only() -> None:
    import pyarrow as pa

    F = _flight()
    F._check(hb.Descriptor([6], hb.float32), 0, None, pa.py_buffer(F._end_metadata(0)))


CASES += [
    Case("flight-metadata-only-message", "Flight message: app_metadata, no record batch",
         _metadata_only, hb.FormatError, ("message[0].data", "no record batch", "every message")),
    Case("flight-padding-past-bound", "Flight message: descriptor + 128 zero bytes",
         _padding_past_bound, hb.FormatError,
         ("message[0].app_metadata", "128 bytes after the descriptor", "at most 127")),
    Case("flight-name-empty", "flight.put(uri, '', [x])",
         lambda: _flight().put(_NO_SERVER, "", [_array()]), hb.UnsupportedError,
         ("stream name", "non-empty str", "''")),
    Case("flight-location-int", "flight.get(8815, 's')", lambda: _flight().get(8815, "s"),
         hb.UnsupportedError, ("location must be", "Flight URI", "int 8815")),
    Case("flight-timeout-negative", "flight.get(uri, 's', timeout=-1)",
         lambda: _flight().get(_NO_SERVER, "s", timeout=-1), hb.FormatError,
         ("timeout", "positive", "-1")),
    Case("flight-put-empty-no-schema", "flight.put(uri, 's', [])",
         lambda: _flight().put(_NO_SERVER, "s", []), hb.UnsupportedError,
         ("no tensor to take a schema from", "schema=")),
    Case("flight-get-unknown-name", "flight.get(server, 'missing')", _get_unknown_name,
         hb.NotFoundError, ("no tensor stream named 'missing'", "put() it first")),
    Case("flight-list-prefix-bytes", "flight.list_streams(uri, b'a')",
         lambda: _flight().list_streams(_NO_SERVER, b"a"), hb.UnsupportedError,
         ("prefix must be a str", "bytes")),
    Case("flight-list-no-server", "flight.list_streams('grpc://127.0.0.1:1', timeout=10)",
         lambda: _flight().list_streams(_NO_SERVER, timeout=10), hb.TransportError,
         ("could not list the streams", "127.0.0.1:1")),
    Case("flight-get-no-server", "flight.get('grpc://127.0.0.1:1', 's', timeout=10)",
         lambda: _flight().get(_NO_SERVER, "s", timeout=10), hb.TransportError,
         ("'s'", "after 0 whole tensors")),
]


# -- memory from other producers (buffer-protocol.md §6.1, element-types.md on bool8)
class _LegacyOnly:
    """A producer of a framework no adapter knows (TensorFlow, mlx): legacy capsules only."""

    def __init__(self, a: Any) -> None:
        self.a = a

    def __dlpack__(self, stream: Any = None) -> object:
        return self.a.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def _write_legacy_import() -> None:
    n = hb.convert(_LegacyOnly(np.arange(3.0)), "numpy")
    n[0] = 99.0


def _resize_shared_torch() -> Any:
    torch = pytest.importorskip("torch")
    x = torch.arange(4.0)
    t = hb.asarray(x)
    return x.resize_(10_000_000), t


def _dcp_reader(plan: dict[str, Any] | None) -> Any:
    """HurrayStorageReader.read_metadata of a folder whose plan is ``plan`` (None: no plan)."""
    pytest.importorskip("torch.distributed.checkpoint")
    import json
    import tempfile

    from hurray_bridge.adapters.torch.checkpoint import (
        METADATA_FILE,
        METADATA_KEY,
        HurrayStorageReader,
    )

    d = tempfile.mkdtemp(prefix="hb-bad-dcp-")
    if plan is not None:
        hb.save(f"{d}/{METADATA_FILE}", {}, {METADATA_KEY: json.dumps(plan)})
    return HurrayStorageReader(d).read_metadata()


def _dcp_read(damage: str) -> Any:
    """One process's DCP load, step by step, of a checkpoint damaged after its save:
    the reader's own error, not DCP's wrapper of it."""
    pytest.importorskip("torch.distributed.checkpoint")
    import tempfile

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from hurray_bridge.adapters.torch.checkpoint import (
        HurrayStorageReader,
        HurrayStorageWriter,
        data_file,
    )

    d = tempfile.mkdtemp(prefix="hb-bad-dcp-")
    w = torch.arange(6, dtype=torch.float16)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's notice that it runs without a process group
        dcp.save({"w": w}, storage_writer=HurrayStorageWriter(d))
    path = f"{d}/{data_file(0)}"
    if damage == "dtype":
        hb.save(path, {"w": w.view(torch.bfloat16)})  # another save's file, same bytes
    elif damage == "entry":
        hb.save(path, {"v": w})
    else:
        idx = hb.container.read_index(path)
        with open(path, "r+b") as f:
            f.seek(idx.data_offset + idx.entries[0].buffers[0].offset)
            f.write(b"\xff")
    reader = HurrayStorageReader(d)
    md = reader.read_metadata()
    planner = DefaultLoadPlanner()
    planner.set_up_planner({"w": torch.zeros(6, dtype=torch.float16)}, md, True)
    reader.set_up_storage_reader(md, True)
    return reader.read_data(planner.create_local_plan(), planner)


def _dcp_planner_data() -> Any:
    pytest.importorskip("torch.distributed.checkpoint")
    import tempfile

    from torch.distributed.checkpoint.metadata import Metadata

    from hurray_bridge.adapters.torch.checkpoint import HurrayStorageWriter

    w = HurrayStorageWriter(tempfile.mkdtemp(prefix="hb-bad-dcp-"))
    return w.finish(Metadata({}, planner_data=object()), [])


def _dcp_entry_clash() -> Any:
    """A state dict with a plain tensor "a[0]" and a DTensor "a" (whose box is entry a[0])."""
    pytest.importorskip("torch.distributed.checkpoint")
    import tempfile

    import torch
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )

    from hurray_bridge.adapters.torch.checkpoint import HurrayStorageWriter

    def item(fqn: str, kind: WriteItemType, offsets: int, size: int) -> WriteItem:
        chunk = ChunkStorageMetadata(torch.Size([offsets]), torch.Size([2]))
        return WriteItem(MetadataIndex(fqn, [offsets]), kind, tensor_data=TensorWriteData(
            chunk, TensorProperties(torch.float32), torch.Size([size])))

    class Planner:
        def resolve_data(self, item: WriteItem) -> Any:
            return torch.zeros(2)

    w = HurrayStorageWriter(tempfile.mkdtemp(prefix="hb-bad-dcp-"))
    plan = SavePlan([item("a", WriteItemType.SHARD, 0, 4),
                     item("a[0]", WriteItemType.TENSOR, 0, 2)], storage_data="__0_0.hurray")
    return w.write_data(plan, Planner())  # type: ignore[arg-type]


def _dirty_bool8_to_jax() -> Any:
    pytest.importorskip("jax")
    from tests.dlpack_producers import DLPackOnly

    buf = np.empty(128, np.uint8)
    a = buf[(-buf.ctypes.data) % 64:][:4]  # 64-byte aligned: JAX would alias it
    a[:] = [0, 1, 2, 255]
    return hb.convert(DLPackOnly(a.view(np.bool_)), "jax", copy=False)


CASES += [
    Case("jax-bool8-other-bytes-copy-false",
         "hb.convert(bool8 bytes [0, 1, 2, 255] of a foreign producer, 'jax', copy=False)",
         _dirty_bool8_to_jax, hb.CopyRequiredError, ("0x00 and 0x01", "copy=False")),
    Case("legacy-import-unknown-producer-write",
         "hb.convert(legacy-only producer of no known framework, 'numpy')[0] = 99",
         _write_legacy_import, ValueError, ("read-only",), builtin=True),
    Case("torch-resize-after-export", "t = hb.asarray(x); x.resize_(10_000_000) (CPU tensor)",
         _resize_shared_torch, RuntimeError, ("storage that is not resizable",), builtin=True),
    Case("dcp-reader-no-plan", "HurrayStorageReader(folder without .metadata.hurray)"
         ".read_metadata()", functools.partial(_dcp_reader, None), hb.FormatError,
         (".metadata.hurray is missing", "holds no complete checkpoint", "did not finish")),
    Case("dcp-reader-plan-format", "a DCP plan of format 99",
         functools.partial(_dcp_reader, {"format": 99}), hb.FormatError,
         ("plan format 99", "this reader knows 1", "save the checkpoint again")),
    Case("dcp-reader-plan-file-outside", "a DCP plan naming file '../x.hurray'",
         functools.partial(_dcp_reader, {"format": 1, "items": {},
                                         "storage": [["w", [0], "../x.hurray", "w"]]}),
         hb.FormatError, ("'../x.hurray'", "not a file name in the checkpoint's folder")),
    Case("dcp-reader-plan-dtype", "a DCP plan with dtype 'float7'",
         functools.partial(_dcp_reader, {"format": 1, "items": {
             "w": {"dtype": "float7", "size": [2], "chunks": [[[0], [2]]]}}, "storage": []}),
         hb.FormatError, ("item 'w'", "'float7'", "does not have")),
    Case("dcp-reader-plan-chunk-outside", "a DCP plan with chunk [[1], [2]] of size [2]",
         functools.partial(_dcp_reader, {"format": 1, "items": {
             "w": {"dtype": "float32", "size": [2], "chunks": [[[1], [2]]]}}, "storage": []}),
         hb.FormatError, ("item 'w'", "[[1], [2]]", "outside its size [2]")),
    Case("dcp-reader-plan-modules", "a DCP plan with modules 5",
         functools.partial(_dcp_reader, {"format": 1, "items": {}, "storage": [],
                                         "modules": 5}),
         hb.FormatError, ("'modules' is 5", "not a list of module names")),
    Case("dcp-reader-entry-dtype", "a DCP rank file whose entry 'w' is bfloat16 where the "
         "plan says float16", functools.partial(_dcp_read, "dtype"), hb.FormatError,
         ("entry 'w' holds bfloat16", "the plan says torch.float16", "save the checkpoint")),
    Case("dcp-reader-entry-missing", "a DCP rank file without the plan's entry 'w'",
         functools.partial(_dcp_read, "entry"), hb.FormatError,
         ("names entry 'w'", "does not have", "different saves")),
    Case("dcp-reader-entry-checksum", "a DCP rank file with a byte of entry 'w' changed",
         functools.partial(_dcp_read, "checksum"), hb.FormatError,
         ("entry 'w'", "data checksum mismatch", "corrupt")),
    Case("dcp-writer-entry-clash", "dcp.save of a DTensor 'a' and a tensor 'a[0]' on one rank",
         _dcp_entry_clash, hb.UnsupportedError,
         ("'a' and 'a[0]' both become entry 'a[0]'", "rename one key")),
    Case("dcp-writer-planner-data", "HurrayStorageWriter.finish(planner_data=object())",
         _dcp_planner_data, hb.UnsupportedError,
         ("planner_data (object)", "no JSON form", "DefaultSavePlanner")),
]



# -- Dask arrays: computed copies, chunk grids, saves the workers write (container.md §7.1)
def _dask() -> Any:
    return pytest.importorskip("dask.array", reason="dask is not installed")


def _dask_unknown_chunks() -> Any:
    x = _dask().arange(10, chunks=5)
    return x[x > 3]


def _dask_lying_dtype() -> Any:
    x = _dask().ones((4, 4), chunks=2, dtype=np.float32)
    return x.map_blocks(lambda b: b.astype(np.float64), dtype=np.float32)


def _dask_save(value: Any) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        hb.save(pathlib.Path(d) / "x.hurray", {"x": value})


def _dask_replaced_file() -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "x.hurray"
        hb.save(path, {"x": np.zeros(8)})
        x = hb.get_adapter("dask").from_hurray(hb.load(path)["x"])
        hb.save(path, {"x": np.ones(8)})
        return x.compute()


CASES += [
    Case("dask-asarray-copy-false", "hb.asarray(dask_array, copy=False)",
         lambda: hb.asarray(_dask().ones(4, chunks=2), copy=False), hb.CopyRequiredError,
         ("gathers its chunks", "copy=False", "hb.save")),
    Case("dask-asarray-unknown-chunks", "hb.asarray(x[x > 3]) (chunk sizes unknown)",
         lambda: hb.asarray(_dask_unknown_chunks()), hb.UnsupportedError,
         ("unknown size", "x.compute_chunk_sizes()")),
    Case("dask-save-unknown-chunks", "hb.save(path, {'x': x[x > 3]})",
         lambda: _dask_save(_dask_unknown_chunks()), hb.UnsupportedError,
         ("hb.save", "unknown size", "x.compute_chunk_sizes()")),
    Case("dask-save-chunks-of-another-dtype",
         "hb.save(path, {'x': x.map_blocks(to float64, dtype=float32)})",
         lambda: _dask_save(_dask_lying_dtype()), hb.FormatError,
         ("float64", "planned from the Dask array's metadata", "float32", "dtype=")),
    Case("dask-convert-device", "hb.convert(t, 'dask', device='cuda')",
         lambda: hb.convert(np.zeros(3), "dask", device="cuda"), hb.UnsupportedError,
         ("host memory", "device='cuda'")),
    Case("matrix-dask", "run_matrix(['numpy', 'dask'])",
         lambda: hb_matrix.run_matrix(["numpy", "dask"]), hb.UnsupportedError,
         ("'dask' is not in the report", "lazy collection", "NumPy views")),
    Case("dask-file-entry-after-replace",
         "hb.convert(hb.load(p)['x'], 'dask'), p saved again, .compute()",
         _dask_replaced_file, hb.FormatError,
         ("changed after it was loaded", "load the file again")),
]

def _mlx() -> Any:
    """The MLX adapter, or this case skips saying mlx is absent (extra 'mlx')."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (extra 'mlx')")
    return _adapter("mlx")


def _to_mlx(x: Any, **kw: Any) -> Any:
    _mlx()
    return hb.convert(x, "mlx", **kw)


CASES += [
    Case("mlx-from-hurray-none", "adapters.mlx.from_hurray(None)",
         lambda: _mlx().from_hurray(None), hb.UnsupportedError, ("NoneType", "hb.Tensor")),
    Case("mlx-from-hurray-copy-str", "adapters.mlx.from_hurray(t, copy='no')",
         lambda: _mlx().from_hurray(_tensor(), copy="no"), hb.UnsupportedError,
         ("copy", "'no'", "True, False or None")),
    Case("mlx-to-hurray-ndarray", "adapters.mlx.to_hurray(ndarray)",
         lambda: _mlx().to_hurray(_array()), hb.UnsupportedError,
         ("mlx.core.array", "numpy.ndarray")),
    Case("mlx-from-hurray-device", "adapters.mlx.from_hurray(t, device='gpu')",
         lambda: _mlx().from_hurray(_tensor(), device="gpu"), hb.UnsupportedError,
         ("device='gpu'", "CPU only", "mx.cpu")),
    Case("mlx-copy-false", "hb.convert(ndarray, 'mlx', copy=False)",
         lambda: _to_mlx(_array(), copy=False), hb.CopyRequiredError,
         ("MLX copies every import of host memory", "copy=False", "copy=None or True")),
    Case("mlx-negative-strides-copy-false", "hb.convert(ndarray[::-1], 'mlx', copy=False)",
         lambda: _to_mlx(_array()[::-1], copy=False), hb.CopyRequiredError,
         ("strides (-1,)", "negative", "copy=False")),
    Case("mlx-complex128", "hb.convert(complex128 ndarray, 'mlx')",
         lambda: _to_mlx(np.ones(3, np.complex128)), hb.UnsupportedError,
         ("MLX has no dtype for complex128", "cast it to complex64")),
    Case("mlx-float8", "hb.convert(float8_e4m3fn tensor, 'mlx')",
         lambda: _to_mlx(hb.Tensor(D([4], hb.float8_e4m3fn), [_B4._replace(nbytes=4)],
                                   owner=_A)),
         hb.UnsupportedError, ("MLX has no dtype for float8_e4m3fn", "numpy, torch or jax")),
]


# ----------------------------------------------------------------------- the test
def _param(c: Case) -> Any:
    pending = c.xfail and c.xfail.split(" ", 1)[0] in PENDING
    marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if pending else []
    return pytest.param(c, id=c.id, marks=marks)


# ------------------------------------------------------------------ Paddle
def _to_paddle(a: Any, **kw: Any) -> Any:
    from tests.frameworks import need

    need("paddle")  # a skip naming why where Paddle is absent or cannot share the process
    return hb.convert(a, "paddle", **kw)


def _readonly_f32() -> Any:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    return a


def _paddle_device_bogus() -> Any:
    from tests.frameworks import need

    need("paddle")
    from hurray_bridge.adapters import paddle as pd_adapter

    return pd_adapter.from_hurray(hb.asarray(_array()), device="tpu:0")


def _kept_apart() -> Any:
    """get_adapter of a stand-in framework that cannot share a process with one imported
    already (the registry's not_with); the registry and sys.modules are restored."""
    import types

    from hurray_bridge import _registry

    spec = _registry.AdapterSpec("hb_beta", "hb_test_beta", "beta",
                                 not_with=(("numpy", "the two crash together"),))
    _registry.ADAPTERS["hb_beta"] = spec
    had_numpy = "numpy" in sys.modules
    sys.modules.setdefault("numpy", types.ModuleType("numpy"))
    try:
        return _registry.get_adapter("hb_beta")
    finally:
        del _registry.ADAPTERS["hb_beta"]
        if not had_numpy:
            del sys.modules["numpy"]


CASES += [
    Case("registry-kept-apart", "get_adapter(x) once a framework x cannot share a process "
         "with is imported", _kept_apart, hb.UnsupportedError,
         ("numpy is imported already", "the two crash together", "separate processes")),
    Case("paddle-uint32", "hb.convert(np.arange(3, dtype=np.uint32), 'paddle')",
         lambda: _to_paddle(np.arange(3, dtype=np.uint32)), hb.UnsupportedError,
         ("cannot hold uint32", "no kernels", "Cast the values")),
    Case("paddle-read-only-copy-false", "hb.convert(read-only array, 'paddle', copy=False)",
         lambda: _to_paddle(_readonly_f32(), copy=False), hb.CopyRequiredError,
         ("READ_ONLY", "copy=False")),
    Case("paddle-negative-strides-copy-false", "hb.convert(a[::-1], 'paddle', copy=False)",
         lambda: _to_paddle(np.arange(4, dtype=np.float32)[::-1], copy=False),
         hb.CopyRequiredError, ("negative strides", "copy=False")),
    Case("paddle-bool8-other-bytes-copy-false",
         "hb.convert(bool8 bytes [0, 1, 2, 255], 'paddle', copy=False)",
         lambda: _to_paddle(np.array([0, 1, 2, 255], np.uint8).view(np.bool_), copy=False),
         hb.CopyRequiredError, ("0x00 and 0x01", "copy=False")),
    Case("paddle-rank-10", "hb.convert(np.zeros((1,) * 10), 'paddle')",
         lambda: _to_paddle(np.zeros((1,) * 10, np.float32)), hb.UnsupportedError,
         ("at most 9 dimensions", "has 10", "reshape")),
    Case("paddle-device-bogus", "adapters.paddle.from_hurray(t, device='tpu:0')",
         _paddle_device_bogus, hb.UnsupportedError, ("device must be", "'tpu:0'")),
]


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]


@pytest.mark.filterwarnings("ignore::hurray_bridge.CopyWarning")
@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_bad_input(case: Case) -> None:
    with pytest.raises(case.error) as info:
        case.call()
    err = info.value
    if not case.builtin:
        assert isinstance(err, hb.HurrayError), f"{type(err).__name__} is not a HurrayError"
    msg = str(err)
    for word in case.words:
        assert word in msg, f"{word!r} not in the message: {msg}"


# ------------------------------------------------- hostile producers, beyond the table
@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize("reported", [(1, None), (3, None)])
def test_dlpack_device_id_none_on_the_host_means_device_0(versioned: bool,
                                                          reported: tuple[int, None]) -> None:
    # PaddlePaddle 3.3.1 reports its CPU tensors as (kDLCPU, None); NumPy and torch take it.
    p = _forged(shape=(2, 3), versioned=versioned, reported=reported)
    t = hb.from_dlpack(p)
    assert t.device == hb.Device(reported[0], 0)
    assert t.data_ptr == _AT  # zero-copy
    np.testing.assert_array_equal(hb.convert(t, "numpy"), _MEM[:6].reshape(2, 3))


_REFUSED = {
    "null-data": dict(data=0, shape=(4,)),
    "offset-wraps": dict(shape=(4,), byte_offset=2**64 - 8),
    "strides-2e62": dict(shape=(3, 3), strides=(2**62, 2**62)),
    "shape-2e62": dict(shape=(2**62, 2**62)),
    "below-zero": dict(data=0x10, shape=(4,), strides=(-8,)),
    "past-top": dict(data=2**64 - 8, shape=(4,)),
    "unknown-dtype": dict(shape=(4,), code=2, bits=24),
    "packed-strided": dict(shape=(4,), strides=(2,), code=0, bits=4),
    "device-lie": dict(shape=(4,), reported=(2, 0)),
}


@pytest.mark.parametrize("fields", _REFUSED.values(), ids=_REFUSED)
def test_a_refused_import_releases_the_capsule_at_once(fields: dict[str, Any]) -> None:
    p = _forged(**fields)
    with pytest.raises(hb.HurrayError) as info:
        hb.from_dlpack(p)
    assert p.exports and p.live() == 0, f"the deleter has not run while {info.value!r} is alive"


# Run in a child: before the import checks, these killed the interpreter (SIGSEGV on
# NULL data, SIGABRT from torch's C++ check on strides 2**62).
_CHILD = r"""
import pickle, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
import hurray_bridge as hb
from hurray_bridge import _shortcuts
from tests.broken_producers import Forged
from tests.cross.test_bad_input import _REFUSED, _MEM, _AT

uses = {
    "memoryview": lambda t: bytes(t.memoryview()),
    "pickle": lambda t: pickle.loads(pickle.dumps(t)),
    "copy": lambda t: t.copy(),
}
for front in sys.argv[1:]:
    convert = hb.convert
    if front == "python":  # the Python front instead of the compiled one
        convert = _shortcuts.front(hb.convert.__wrapped__, use_compiled=False)
    for name, fields in _REFUSED.items():
        fields = dict(fields)
        fields.setdefault("data", _AT)
        for use in ("import", *uses, "numpy", "torch", "jax", "arrow"):
            p = Forged(keep=_MEM, **fields)
            try:
                if use in uses:
                    uses[use](hb.from_dlpack(p))
                elif use == "import":
                    hb.asarray(p)
                else:
                    convert(p, use)
                print(front, name, use, "accepted", flush=True)
            except Exception as e:
                print(front, name, use, type(e).__name__, isinstance(e, hb.HurrayError),
                      flush=True)
"""
FRONTS = ("compiled", "python")


@functools.cache
def _hostile_child() -> subprocess.CompletedProcess[str]:
    """One child for both fronts: most of its time goes on importing torch, JAX and Arrow."""
    return subprocess.run([sys.executable, "-c", _CHILD, *FRONTS], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("front", FRONTS)
def test_hostile_capsules_never_reach_a_consumer(front: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    pytest.importorskip("pyarrow")
    r = _hostile_child()
    assert r.returncode == 0, f"the child died ({r.returncode}): {r.stdout[-2000:]}{r.stderr}"
    lines = [ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if ln.startswith(f"{front} ")]
    assert len(lines) == 8 * len(_REFUSED), r.stdout
    bad = [line for line in lines if not line.endswith(" True")]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("front", ["compiled", "python"])
def test_framework_limits_hold_on_the_shortcut_sources_too(front: str) -> None:
    # torch holds an empty [2**61, 0] float32; NumPy and JAX cannot. The torch -> JAX
    # shortcut hands it to XLA as it is: its refusal must end in the full path's error.
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    from hurray_bridge import _shortcuts

    convert = hb.convert
    if front == "python":
        convert = _shortcuts.front(hb.convert.__wrapped__, use_compiled=False)
    x = torch.empty((2**61, 0))
    for target, words in (("numpy", ("NumPy", "2**63 - 1")), ("jax", ("JAX", "int64"))):
        for _ in range(2):  # the second call may be served by a learned shortcut
            with pytest.raises(hb.UnsupportedError) as info:
                convert(x, target)
            assert all(w in str(info.value) for w in words), str(info.value)
    assert convert(x, "torch").shape == (2**61, 0)


@pytest.mark.parametrize("block_size", [2**64 - 2, 2**40, 3])
def test_dequantize_takes_any_valid_block_size(block_size: int) -> None:
    # A valid file: per-block int8 with a block size up to 2**64 - 2 (one block here).
    q = hb.Quantization(hb.QuantScheme.PER_BLOCK, axis=0, block_size=block_size)
    scales = np.array([0.5, 0.25, 2.0][: -(-6 // block_size)], np.float32)
    x = np.arange(6, dtype=np.float32) * scales[np.arange(6) // min(block_size, 6)]
    t = hb.loads(hb.dumps({"w": hb.quantize(x, "int8", q, scales)}))["w"]
    np.testing.assert_array_equal(hb.convert(hb.dequantize(t), "numpy"), x)


def markdown() -> str:
    rows = [
        "| Case | Input | Expected error | Message excerpt | Status |",
        "|---|---|---|---|---|",
    ]
    for c in CASES:
        err = c.error.__name__ if c.builtin else f"`hb.{c.error.__name__}`"
        if c.builtin:
            err = f"`{err}` (documented built-in)"
        words = " … ".join(w.replace("|", "\\|") for w in c.words)
        pending = c.xfail and c.xfail.split(" ", 1)[0] in PENDING
        status = f"xfail (strict): {c.xfail}" if pending else "passes"
        inp = c.input.replace("|", "\\|")
        rows.append(f"| `{c.id}` | `{inp}` | {err} | {words} | {status} |")
    return "\n".join(rows)


def test_robustness_doc_lists_every_case() -> None:
    text = DOC.read_text(encoding="utf-8")
    missing = [c.id for c in CASES if f"`{c.id}`" not in text]
    assert not missing, (f"docs/impl/robustness.md lacks {missing}; regenerate the table with "
                         "python -m tests.cross.test_bad_input")


if __name__ == "__main__":
    sys.stdout.write(markdown() + "\n")
