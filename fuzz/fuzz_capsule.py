#!/usr/bin/env python3
"""Fuzz target: foreign DLPack capsules, through ``hb.from_dlpack`` to every CPU consumer.

Each input is read as the fields of one capsule (see :func:`decode`): versioned or
legacy, its name, version, flags, ``ndim``, shape, strides, ``byte_offset``, dtype
code/bits/lanes, device, what ``__dlpack_device__`` answers, and where ``data``
points. A :class:`tests.broken_producers.Forged` producer hands that capsule to
``hb.from_dlpack``. The rules:

* a refusal is a ``hb.HurrayError``, and the producer's deleter has run (or runs
  within the next inputs, for a capsule the bridge never consumed); anything else
  is a finding;
* an accepted tensor is what the capsule said (shape, dtype), its ``.descriptor``
  builds and round-trips through the wire encoding, and its bytes lie in the
  64-bit address space: ``data`` is not NULL when there are elements, the span is
  at most 2**63 - 1 bytes;
* where the memory is real (below), the tensor goes on to NumPy, torch, JAX and
  Arrow through ``hb.convert``; each answers or raises a ``hb.HurrayError``, and
  what it returns holds the same values (``hb.canonical_bytes``, against the
  harness's own gather from the backing memory);
* every deleter runs exactly once (a second call lands in
  ``broken_producers.STRAY_RELEASES``), and no export stays alive once its
  consumers are gone.

The memory a capsule points at is kept real: ``data`` points into one backing
buffer, placed so that every byte the fields describe lies inside it, whenever
they describe a span that fits. Otherwise (a span too large, NULL, an unmapped
address, the top of the address space, device memory) the bridge either
refuses, or accepts a tensor the harness checks but never hands on: nothing may
read it. Device memory (CUDA, ROCm, ...) always points at an unmapped address
and does go to the consumers: on a machine without those devices each must
refuse it, without reading it.

    python fuzz/fuzz_capsule.py fuzz/corpus/capsule -max_total_time=300
    python fuzz/fuzz_capsule.py --no-atheris        # mutation loop, HB_FUZZ_SECONDS

See ``fuzz/README.md``.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import deque
from math import prod
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.broken_producers
import _harness

NAME = "capsule"

BACKING = 1 << 16  # bytes of real memory the in-bounds capsules point into
COPY_CAP = 1 << 14  # an accepted tensor of more bytes (a broadcast) is not handed on
FAKE = 0x7F3A_C000_0000  # never mapped here (tests/producers.py): a read crashes
TARGETS = ("numpy", "torch", "jax", "arrow")
_HOST = (1, 3, 11, 13)  # kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged: host-readable
# Released by the consumers of an input after it returns (XLA may let go later, on its
# own threads): checked for each producer this many inputs later.
_LATER = 256

_DIMS = (2**31, 2**32, 2**40, 2**61, 2**62, 2**63 - 1, -1, -(2**63), 255, 4096, 2**31 - 1)
_STRIDES = (0, -1, 2**31, 2**32, 2**61, 2**62, 2**63 - 1, -(2**62), -(2**63) + 1, -(2**63),
            4096)
_OFFSETS = (2**64 - 1, 2**64 - 8, 2**63, 2**32, 1, 3, 7)
_NDIMS = (-1, -(2**31), 65, 2**31 - 1, 64, 5, 6, 8)
_DEVICES = ((4, 0), (7, 0), (8, 0), (10, 0), (12, 0), (14, 0), (15, 0), (16, 0), (17, 0),
            (18, 0), (99, 0), (2, 1), (2, 2**31 - 1), (10, 3), (-1, 0), (2**31 - 1, 0),
            (1, -1), (1, 2**31 - 1))
# Capsule names no consumer takes, per layout (module constants: a capsule keeps the
# pointer). The first of each is one broken_producers._destroy still releases.
_WRONG_NAMES = {True: (b"dltensor_version", b"used_dltensor_versioned", b"DLTENSOR"),
                False: (b"used_dltensor", b"dltensor_legacy")}
_RELEASED_ANYWAY = (b"dltensor_version",)
_VERSIONS = ((0, 9), (2, 0), (1, 0), (1, 255), (255, 255), (2**32 - 1, 0))


class _Reader:
    """Reads fields off the input; past its end every read is 0 (as libFuzzer's)."""

    __slots__ = ("data", "i")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.i = 0

    def u(self, n: int) -> int:
        v = int.from_bytes(self.data[self.i:self.i + n], "little")
        self.i += n
        return v

    def u8(self) -> int:
        return self.u(1)

    def pick(self, seq: Any) -> Any:
        return seq[self.u8() % len(seq)]

    def s64(self) -> int:
        v = self.u(8)
        return v - (1 << 64) if v >> 63 else v


def decode(data: bytes, valid_dtypes: list[tuple[int, int]]) -> dict[str, Any]:
    """The capsule fields an input stands for (one byte or more per field)."""
    from hurray_bridge._dlpack import (
        FLAG_IS_COPIED,
        FLAG_IS_SUBBYTE_TYPE_PADDED,
        FLAG_READ_ONLY,
    )

    r = _Reader(data)
    mode = r.u8()
    f: dict[str, Any] = {"versioned": not mode & 1}
    if mode & 0x0E == 0x0E:
        # Names a consumer refuses. Never the other layout's name: a struct read with the
        # wrong layout hands the consumer a garbage deleter, and no consumer can tell.
        f["name"] = r.pick(_WRONG_NAMES[f["versioned"]])
    f["version"] = r.pick(_VERSIONS) if mode & 0x10 else (1, 3)
    f["flags"] = r.pick((0, 0, 0, FLAG_READ_ONLY, FLAG_IS_COPIED, FLAG_IS_SUBBYTE_TYPE_PADDED,
                         FLAG_READ_ONLY | FLAG_IS_SUBBYTE_TYPE_PADDED, 2**64 - 1))
    b = r.u8()
    ndim = b % 5 if b < 224 else r.pick(_NDIMS)
    rank = ndim if 0 <= ndim <= 64 else r.u8() % 3  # entries in the shape array
    shape = []
    for _ in range(rank):
        b = r.u8()
        shape.append(b % 7 if b < 200 else 1 if b < 216 else r.pick(_DIMS))
    f["ndim"] = ndim
    f["shape"] = None if rank and mode & 0x20 and r.u8() < 64 else tuple(shape)
    smode = r.u8() % 8
    if smode < 2 or not rank:
        strides = None
    elif smode < 5:
        strides = []
        acc = 1
        for d in reversed(shape):
            strides.append(acc)
            acc = (acc * max(d, 1)) & (2**64 - 1)
        strides = [s - (1 << 64) if s >> 63 else s for s in reversed(strides)]
        if smode == 4:
            strides[r.u8() % rank] = r.pick(_STRIDES) if r.u8() & 1 else r.u8() % 17 - 8
    elif smode < 7:
        strides = [r.u8() % 17 - 8 for _ in range(rank)]
    else:
        strides = [r.pick(_STRIDES) if r.u8() & 1 else r.s64() for _ in range(rank)]
    f["strides"] = None if strides is None else tuple(strides)
    b = r.u8()
    f["byte_offset"] = 0 if b < 192 else r.u(2) if b < 240 else r.pick(_OFFSETS)
    b = r.u8()
    code, bits = r.pick(valid_dtypes) if b < 240 else (r.u8(), r.u8())
    f["code"], f["bits"] = code, bits
    f["lanes"] = 1 if r.u8() < 250 else r.pick((0, 2, 4, 65535))
    b = r.u8()
    device = ((1, 0) if b < 200 else (2, 0) if b < 215 else (3, 0) if b < 222
              else (13, 0) if b < 226 else (1, r.u8() % 4) if b < 232 else r.pick(_DEVICES))
    f["device"] = device
    b = r.u8()
    f["reported"] = (device if b < 220 else (device[0], None) if b < 232 else (1, 0) if b < 238
                     else (2, 0) if b < 244 else r.pick(((1, None), (2, None), (1,), (1, 0, 0),
                                                         (1, -1), (2**70, 0), (13, 0))))
    b = r.u8()
    f["where"] = ("inside" if b < 224 else "null" if b < 236 else "fake" if b < 244
                  else "top" if b < 250 else "random")
    f["place"] = r.u(4)
    f["random"] = r.u(8)
    return f


def _extent(shape: tuple[int, ...], strides: tuple[int, ...] | None,
            isz: int) -> tuple[int, int]:
    """(first, end) of the bytes a non-empty tensor covers, relative to element [0..0]."""
    if strides is None:
        return 0, prod(shape) * isz
    lo = sum((d - 1) * s for d, s in zip(shape, strides) if s < 0)
    hi = sum((d - 1) * s for d, s in zip(shape, strides) if s > 0)
    return lo * isz, (hi + 1) * isz


def load_check() -> _harness.Check:
    import pickle
    import warnings

    import numpy as np

    import hurray_bridge as hb
    from hurray_bridge.dtypes import all_dtypes
    from tests import broken_producers as bp

    HurrayError = hb.HurrayError
    Finding = _harness.Finding
    convert = hb.convert
    from hurray_bridge.tensor import canonical_bytes as canonical
    valid = sorted({d.dlpack for d in all_dtypes() if d.dlpack is not None})
    backing = np.frombuffer(np.random.default_rng(0).bytes(BACKING), np.uint8).copy()
    base = backing.ctypes.data
    pending: deque[Any] = deque()
    counted = [0]

    for target in TARGETS:  # import each framework once, outside any input's time
        convert(np.zeros(3, np.float32), target, copy=True)  # a copy is expected: say nothing

    def gather(p: int, shape: tuple[int, ...], strides: tuple[int, ...] | None,
               isz: int) -> bytes:
        """The harness's own compact bytes of the tensor at ``p`` (whole-byte types)."""
        if strides is None:
            strides = tuple(prod(shape[i + 1:]) for i in range(len(shape)))
        view = np.lib.stride_tricks.as_strided(
            backing[p - base:], shape=(*shape, isz),
            strides=(*(s * isz for s in strides), 1), writeable=False)
        return view.tobytes()

    def settle(producer: Any) -> None:
        if producer.name not in (None, *_RELEASED_ANYWAY):
            # Refused unconsumed under a name its destructor does not know: it leaks by
            # the protocol (a 'used_' capsule belongs to whoever renamed it).
            for p, token in producer.exports:
                if bp.LIVE.get(p, (None,))[-1] is token:
                    del bp.LIVE[p]
            return
        if producer.live():
            gc.collect()
            if producer.live():
                raise Finding(f"{producer!r}: an export was never released")

    def check(data: bytes) -> None:
        with warnings.catch_warnings():
            # CopyWarning, torch's read-only notice: not findings (pytest resets filters).
            warnings.simplefilter("ignore")
            _check(data)

    def _check(data: bytes) -> None:
        f = decode(data, valid)
        shape, strides = f["shape"], f["strides"]
        isz = (f["bits"] + 7) >> 3 or 1
        device = f["device"]
        host = device[0] in _HOST
        sane = shape is not None and f["ndim"] == len(shape) and min(shape, default=0) >= 0
        n = prod(shape) if sane else 0
        where = f["where"]
        offset = f["byte_offset"]
        real = False  # whether the consumers may read what it describes
        if where == "inside" and host:
            addr = base  # the address of element [0..0]
            if sane and n:
                first, end = _extent(shape, strides, isz)
                if end - first <= BACKING:  # every byte in the backing buffer
                    addr = base - first + f["place"] % (BACKING - (end - first) + 1)
                    real = n * isz <= COPY_CAP
            data_field = (addr - offset) % 2**64  # data + byte_offset = addr, or wraps
        else:
            data_field = {"null": 0, "top": 2**64 - 1 - f["place"] % 64,
                          "random": f["random"]}.get(where, FAKE)
            if not host and where == "inside":
                data_field = FAKE
        if sane and (n == 0 or not host):
            real = True  # nothing to read, or device memory nothing here can read
        producer = bp.Forged(
            data=data_field, shape=shape, strides=strides, byte_offset=offset, code=f["code"],
            bits=f["bits"], lanes=f["lanes"], device=device, reported=f["reported"],
            versioned=f["versioned"], version=f["version"], flags=f["flags"], ndim=f["ndim"],
            name=f.get("name"), keep=backing)
        try:
            t = hb.from_dlpack(producer)
        except HurrayError:
            t = None
        except Exception as e:
            raise Finding(f"from_dlpack raised {type(e).__name__}: {e} for {producer!r}") from e
        if t is not None:
            _accepted(t, producer, f, n, isz, real, host, data_field + offset)
        del t
        pending.append(producer)
        if len(pending) > _LATER:
            settle(pending.popleft())
        if bp.STRAY_RELEASES:
            stray = list(bp.STRAY_RELEASES)
            bp.STRAY_RELEASES.clear()
            raise Finding(f"a deleter ran for a struct that was not live {stray} "
                          f"(a second release?), around {producer!r}")
        counted[0] += 1

    def _accepted(t: Any, producer: Any, f: dict[str, Any], n: int, isz: int, real: bool,
                  host: bool, p: int) -> None:
        shape = t.shape
        if shape != f["shape"] or t.dtype.dlpack != (f["code"], f["bits"]):
            raise Finding(f"accepted as {t!r}, not what the capsule said: {producer!r}")
        d = t.descriptor  # whatever the descriptor refuses, the import must have refused
        if hb.Descriptor.from_bytes(d.to_bytes()) != d:
            raise Finding(f"{d!r} does not round-trip through the wire encoding")
        if n:
            b = t.buffers[0]
            if not t.data_ptr or not b.ptr or b.nbytes > 2**63 - 1 or b.ptr + b.nbytes > 2**64:
                raise Finding(f"accepted {t!r} over bytes [0x{b.ptr:x}, +{b.nbytes}) for "
                              f"{producer!r}")
            if t.data_ptr != p:
                raise Finding(f"element [0..0] at 0x{t.data_ptr:x}, the capsule says 0x{p:x}")
        if not real:
            return  # nothing may read that memory
        ref = None
        if host and n:
            ref = canonical(t)
            if t.dtype.bits >= 8 and t.dtype.bits % 8 == 0 and len(shape) < 64:
                own = gather(p, shape, t.strides, isz)
                if own != ref:
                    raise Finding(f"canonical_bytes differ from the memory for {producer!r}")
            if len(t.memoryview()) != t.buffers[0].nbytes or canonical(t.copy()) != ref:
                raise Finding(f"t.copy() holds other values for {producer!r}")
            try:
                pickled = pickle.dumps(t, protocol=5)
            except hb.FormatError as e:  # a writer refuses bool8 bytes other than 0 and 1
                if not (t.dtype == hb.bool8 and e.field == "data" and max(ref, default=0) > 1):
                    raise Finding(f"pickle refused {t!r} from {producer!r}: {e}") from e
            else:
                if canonical(pickle.loads(pickled)) != ref:
                    raise Finding(f"pickle round trip changes values for {producer!r}")
        for target in TARGETS:
            try:
                out = convert(t, target)
            except HurrayError:
                continue
            except Exception as e:
                raise Finding(f"hb.convert(t, {target!r}) raised {type(e).__name__}: {e} "
                              f"for {t!r} from {producer!r}") from e
            if ref is None:
                continue
            try:
                back = hb.asarray(out)
            except HurrayError:
                continue
            if back.shape != shape and target != "arrow":
                raise Finding(f"{target} result has shape {back.shape}, not {shape}")
            got = canonical(back) if back.shape == shape else None
            if got is not None and _norm(t, got) != _norm(t, ref):
                raise Finding(f"{target} holds other values than {t!r} from {producer!r}")

    def _norm(t: Any, raw: bytes) -> bytes:
        # A byte bool other than 0/1 may come back as 1 from a framework that normalises.
        if t.dtype.name in ("bool8", "bool"):
            return bytes(b != 0 for b in raw)
        return raw

    check.counted = counted  # type: ignore[attr-defined]
    return check


def encode(*, versioned: bool = True, shape: tuple[int, ...] = (), strides: str = "null",
           small: tuple[int, ...] = (), offset: int = 0, dtype: int = 0, lanes: int = 1,
           device: int = 0, reported: int = 0, where: int = 0, place: int = 0,
           flags: int = 0) -> bytes:
    """An input that :func:`decode` reads as these fields (the common ones only).

    ``shape``: dimensions 0..6; ``strides``: ``"null"``, ``"compact"`` or ``"small"``
    (``small``: one stride per dimension, -8..8, in elements); ``offset`` < 2**16;
    ``dtype``: an index into the valid (code, bits) pairs; ``device``, ``reported``,
    ``where``: the raw byte of that field (0: CPU, the same device, inside the backing
    memory); ``flags``: an index into decode's flag choices.
    """
    out = bytearray([0 if versioned else 1, flags, len(shape)])
    out += bytes(shape)
    out.append({"null": 0, "compact": 2, "small": 5}[strides])
    if strides == "small":
        out += bytes((s + 8) % 256 for s in small)
    out += bytes([200]) + offset.to_bytes(2, "little") if offset else bytes([0])
    out += bytes([0, dtype]) + (bytes([0]) if lanes == 1 else bytes([250, (0, 2, 4).index(lanes)]))
    out += bytes([device, reported, where])
    return bytes(out) + place.to_bytes(4, "little") + bytes(8)


def seeds(valid: list[tuple[int, int]]) -> dict[str, bytes]:
    """The committed corpus's seeds (``make_corpus.py`` writes them): one per kind."""
    f32, i4, bf16 = valid.index((2, 32)), valid.index((0, 4)), valid.index((4, 16))
    return {
        "compact-f32": encode(shape=(2, 3), dtype=f32),
        "legacy-compact-strides": encode(versioned=False, shape=(3, 4), strides="compact",
                                         dtype=f32),
        "transposed": encode(shape=(3, 4), strides="small", small=(1, 3), dtype=f32),
        "negative-strides": encode(shape=(3, 4), strides="small", small=(-4, 1), dtype=bf16,
                                   place=4096),
        "broadcast": encode(shape=(5, 6), strides="small", small=(0, 0), dtype=f32),
        "rank0": encode(dtype=f32),
        "empty": encode(shape=(3, 0, 5), dtype=f32),
        "packed-int4": encode(shape=(5,), dtype=i4),
        "padded-int4": encode(shape=(5,), dtype=i4, flags=5),
        "read-only": encode(shape=(4,), dtype=f32, flags=3),
        "byte-offset": encode(shape=(4,), dtype=f32, offset=12),
        "null-data": encode(shape=(4,), dtype=f32, where=230),
        "unmapped-data": encode(shape=(4,), dtype=f32, where=240),
        "cuda": encode(shape=(4,), dtype=f32, device=205),
        "device-id-none": encode(shape=(4,), dtype=f32, reported=225),
        "vector-lanes": encode(shape=(4,), dtype=f32, lanes=4),
    }


if __name__ == "__main__":
    os.environ.setdefault("HB_FUZZ_TRACE_EVERY", "0")  # see fuzz/README.md: frameworks allocate
    _harness.main(NAME, load_check)
