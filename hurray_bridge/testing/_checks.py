"""The DLPack producer checks, one function each, registered in the order they run.

A check takes the :class:`~._context.Ctx` of the factory under test and returns a note
(a pass) or raises :class:`~._report.Fail` / :class:`~._report.Skip`. The checks read
the producer's struct before consumption (:mod:`._raw`), because they look at exactly
what a consumer normalises away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .._capsule import DLView, capsule_name, consume_capsule
from .._dlpack import FLAG_IS_COPIED, FLAG_READ_ONLY, MAX_NDIM, DLDeviceType
from ..dtypes import dtype_from_dlpack
from ..tensor import Device
from ._context import (
    REQUEST,
    Ctx,
    claims_readonly,
    device_of,
    host_bytes,
    request,
    request_legacy,
    same_device,
)
from ._raw import L_NAME, V_NAME, Raw, Watch, compact_strides, eventually, peek, take, validate
from ._report import FAIL, PASS, SKIP, CheckResult, Fail, Skip, short

_EMPTY_SHAPES: tuple[tuple[int, ...], ...] = ((0,), (3, 0, 5))
_RANK64_SHAPE: tuple[int, ...] = (1,) * 62 + (2, 3)


_CheckFn = Callable[[Ctx], str]
_REGISTRY: dict[str, tuple[_CheckFn, str]] = {}


def _check(name: str, description: str) -> Callable[[_CheckFn], _CheckFn]:
    def register(fn: _CheckFn) -> _CheckFn:
        _REGISTRY[name] = (fn, description)
        return fn

    return register


@_check("factory", "the factory makes an object with __dlpack__, for (shape, dtype_name) or "
                   "with no arguments")
def _factory(ctx: Ctx) -> str:
    if ctx.factory_error:
        raise Fail(ctx.factory_error)
    return "; ".join([ctx.form, *ctx.base_notes])


@_check("versioned_capsule", "__dlpack__(max_version=(1, 0)) and (1, 3) give a consumable "
                             "'dltensor_versioned' capsule of DLPack major version 1")
def _versioned_capsule(ctx: Ctx) -> str:
    legacy: list[tuple[int, int]] = []
    raw: Raw | None = None
    for mv in ((1, 0), REQUEST):
        obj = ctx.base()
        try:
            cap = obj.__dlpack__(max_version=mv)
        except TypeError as exc:
            raise Fail("does not accept max_version (a keyword of the 2023.12 array API): "
                        f"{short(exc)}") from None
        if capsule_name(cap) == L_NAME:
            legacy.append(mv)
            take(cap)
            continue
        raw, _view = take(cap)
    if legacy:
        raise Fail(f"answered max_version={', '.join(map(str, legacy))} with a legacy "
                    f"'{L_NAME}' capsule: no DLPack 1.x export, so no version and no "
                    "READ_ONLY / IS_COPIED flags reach the consumer")
    assert raw is not None and raw.version is not None
    return f"'{V_NAME}', DLPack {raw.version[0]}.{raw.version[1]}"


@_check("legacy_capsule", "__dlpack__() without max_version gives a consumable legacy "
                          "'dltensor' capsule")
def _legacy_capsule(ctx: Ctx) -> str:
    obj = ctx.base()
    try:
        cap, warned = request_legacy(obj)
    except BufferError as exc:
        raise Skip(f"refused a legacy export ({short(exc)}); the array API allows that since "
                    "2024.12, but consumers that never pass max_version (JAX) cannot import "
                    "it") from None
    if capsule_name(cap) == V_NAME:
        take(cap)
        raise Fail(f"answered a call without max_version with a '{V_NAME}' capsule; a "
                    "consumer that passes no max_version only reads the legacy struct")
    raw, _view = take(cap)
    note = f"'{raw.name}'"
    if warned:
        note += f"; warned {'; '.join(warned)}"
    return note


@_check("rename_on_consume", "once the consumer renames the capsule to used_*, dropping it "
                             "neither calls the deleter nor frees the memory")
def _rename_on_consume(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    cap = request(obj)
    raw = peek(cap)
    watch = Watch(raw)
    try:
        view = consume_capsule(cap)
        renamed = capsule_name(cap)
        before = host_bytes(view)
        del obj
        del cap
        calls = watch.calls
        after = host_bytes(view)
        del view
    finally:
        watch.close()
    if renamed != "used_" + raw.name:
        raise Fail(f"the capsule is named {renamed!r} after consumption")
    if calls:
        raise Fail(f"dropping the consumed ('used_') capsule called the deleter {calls} "
                    "time(s): the capsule destructor ignores the name, and the consumer's own "
                    "call then frees the tensor twice")
    if before != after:
        raise Fail("the tensor's bytes changed once the consumed capsule was dropped: the "
                    "memory was freed while the consumer still held it")
    return f"{raw.describe()} -> {renamed!r}"


@_check("deleter_once", "the consumer's release calls the deleter exactly once, and that "
                        "releases the producer's memory")
def _deleter_once(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref = ctx.tracker(obj)
    cap = request(obj)
    raw = peek(cap)
    watch = Watch(raw)
    try:
        view = consume_capsule(cap)
        del obj, cap
        held = ref is not None and ref() is not None
        early = watch.calls
        owner = view.owner
        del view
        owner.release()  # type: ignore[attr-defined]
        del owner
        eventually(lambda: watch.calls > 0)
        calls = watch.calls
        alive = held and not eventually(lambda: ref() is None)  # type: ignore[misc]
    finally:
        watch.close()
    if early:
        raise Fail(f"the deleter ran {early} time(s) before the consumer released the tensor")
    if calls != 1:
        raise Fail(f"one release called the deleter {calls} times (DLPack: exactly once)")
    if held and alive:
        raise Fail("the producer object is still alive after its deleter ran: the deleter "
                    "does not release it (a leak)")
    notes = ["called once"]
    if not raw.deleter:
        notes.append("the deleter is NULL (nothing to free)")
    if held:
        notes.append("producer object released")
    else:
        notes.append("the capsule does not keep the producer object alive, so only the call "
                     "count is observable")
    return "; ".join(notes)


@_check("unconsumed_capsule", "a capsule nobody consumed is released by its destructor, "
                              "once, without a crash")
def _unconsumed_capsule(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref = ctx.tracker(obj)
    cap = request(obj)
    raw = peek(cap)
    watch = Watch(raw)
    try:
        del obj
        held = ref is not None and ref() is not None
        del cap
        eventually(lambda: watch.calls > 0 or (held and ref() is None))  # type: ignore[misc]
        calls = watch.calls
        alive = held and not eventually(lambda: ref() is None)  # type: ignore[misc]
    finally:
        watch.close()
    if calls > 1:
        raise Fail(f"dropping one unconsumed capsule called the deleter {calls} times")
    if calls == 1:
        if held and alive:
            raise Fail("the capsule destructor called the deleter, but the producer object "
                        "stays alive: the deleter does not release it (a leak)")
        return "the capsule destructor called the deleter once"
    if held and not alive:
        return ("released by the capsule destructor (the producer object is gone) without "
                "calling the struct's deleter")
    if held:
        raise Fail("dropping an unconsumed capsule released nothing: its destructor never "
                    "calls the deleter and the producer object stays alive (a leak)")
    # The destructor may call the deleter function directly rather than through the
    # struct's field (jaxlib does); with no producer object to watch, nothing shows it.
    raise Skip("the capsule destructor did not call the deleter through the struct, and the "
                "capsule does not keep the producer object alive, so a release cannot be "
                "observed")


@_check("dlpack_device", "__dlpack_device__() returns (device_type, device_id) integers that "
                         "agree with the device in the capsules")
def _dlpack_device(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        raise Fail("no __dlpack_device__ method (the array API requires it next to __dlpack__)")
    answer = fn()
    try:
        t, i = answer
        reported = (int(t), int(i))
        if not (isinstance(t, int) and isinstance(i, int)):
            raise TypeError
    except (TypeError, ValueError):
        raise Fail(f"__dlpack_device__() returned {answer!r}, not a (device_type, device_id) "
                    "pair of integers") from None
    found = []
    raw, _v = take(request(obj))
    found.append(("max_version request", raw))
    try:
        cap, _w = request_legacy(obj)
        if capsule_name(cap) == L_NAME:
            found.append(("legacy request", take(cap)[0]))
    except Exception:
        pass  # reported by legacy_capsule
    for how, r in found:
        if not same_device(reported, r.device):
            raise Fail(f"__dlpack_device__() says {Device(*reported)} but the capsule of the "
                        f"{how} says {Device(*r.device)}")
    note = f"{Device(*reported)}"
    if reported != raw.device:
        note += f" (pinned host memory; the capsule says {Device(*raw.device)})"
    return note


@_check("shape_and_dtype", "the capsule describes the shape and dtype the factory was asked "
                           "for, lanes 1, non-NULL data for a non-empty tensor, no unknown flags")
def _shape_and_dtype(ctx: Ctx) -> str:
    ctx.gate()
    raw, _view = take(request(ctx.base()))
    problems, notes = validate(raw, ctx.expect_shape, ctx.expect_dtype)
    problems = [p for p in problems if "stride" not in p]
    if problems:
        raise Fail("; ".join(problems))
    dt = dtype_from_dlpack(raw.code, raw.bits, raw.lanes).name
    return "; ".join([f"shape {raw.shape}, {dt}, {raw.describe()}",
                      *(n for n in notes if "stride" not in n)])


@_check("strides", "strides are present (DLPack >= 1.2) and sane, and the versioned and legacy "
                   "exports describe the same memory")
def _strides(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    raw, view = take(request(obj))
    problems, notes = validate(raw)
    problems = [p for p in problems if "stride" in p]
    notes = [n for n in notes if "stride" in n]
    if raw.versioned:
        try:
            cap, _w = request_legacy(obj)
            other: tuple[Raw, DLView] | None = take(cap) if capsule_name(cap) == L_NAME else None
        except Exception as exc:
            other = None
            notes.append(f"no legacy export to compare ({short(exc)})")
        if other is not None:
            problems += _compare(raw, view, *other)
    if problems:
        raise Fail("; ".join(problems))
    shown = raw.strides if raw.strides is not None else "NULL"
    return "; ".join([f"strides {shown} for shape {raw.shape}", *notes])


def _effective(raw: Raw) -> tuple[int, ...]:
    assert raw.shape is not None
    return raw.strides if raw.strides is not None else compact_strides(raw.shape)


def _compare(a: Raw, av: DLView, b: Raw, bv: DLView) -> list[str]:
    out = []
    if (a.shape, a.code, a.bits, a.device) != (b.shape, b.code, b.bits, b.device):
        out.append(f"the versioned capsule says shape {a.shape}, dtype ({a.code}, {a.bits}), "
                   f"device {a.device}; the legacy one {b.shape}, ({b.code}, {b.bits}), {b.device}")
        return out
    if a.elements:
        if a.pointer != b.pointer:
            out.append(f"the versioned and legacy capsules point to different memory "
                       f"(0x{a.pointer:x} and 0x{b.pointer:x})")
        sa, sb = _effective(a), _effective(b)
        if any(x != y for d, x, y in zip(a.shape or (), sa, sb, strict=True) if d > 1):
            out.append(f"the versioned capsule has strides {sa}, the legacy one {sb}")
        elif host_bytes(av) != host_bytes(bv):
            out.append("the versioned and legacy capsules read different bytes")
    return out


def _shaped_check(ctx: Ctx, shapes: Sequence[tuple[int, ...]], what: str) -> str:
    """Export each shape, validate the struct, consume it, read it, count the deleter."""
    ctx.gate()
    done: list[str] = []
    skipped: list[str] = []
    problems: list[str] = []
    notes: dict[str, list[str]] = {}  # note -> the shapes it applies to
    for shape in shapes:
        try:
            obj = ctx.make(shape)
        except Skip as exc:
            skipped.append(str(exc))
            continue
        label = "rank 64" if len(shape) > 8 else str(shape)
        cap = request(obj)
        raw = peek(cap)
        found, seen = validate(raw, shape, ctx.dlpack_dtype)
        if raw.ndim < 0 or raw.shape is None or raw.ndim > MAX_NDIM:
            problems += [f"{label}: {p}" for p in found]
            continue
        watch = Watch(raw)
        try:
            view = consume_capsule(cap)
            data = host_bytes(view) if not found else None
            del view, cap, obj
            eventually(lambda: watch.calls > 0)  # noqa: B023 - called at once
            calls = watch.calls
        finally:
            watch.close()
        n = raw.elements
        if data is not None and n and len(data) != n * max(1, raw.bits // 8):
            found.append(f"read {len(data)} bytes for {n} element(s)")
        if calls != 1:
            found.append(f"the deleter ran {calls} times after one release (DLPack: exactly once"
                         "; NULL-data tensors are where producers forget it, pytorch#117058)")
        problems += [f"{label}: {p}" for p in found]
        for note in seen:
            notes.setdefault(note, []).append(label)
        done.append(label)
    if problems:
        raise Fail("; ".join(problems))
    if not done:
        raise Skip("; ".join(skipped))
    return "; ".join([f"{', '.join(done)} {what}",
                      *(f"{', '.join(where)}: {note}" for note, where in notes.items()),
                      *skipped])


@_check("empty_tensors", "shapes (0,) and (3, 0, 5) export consumable capsules with sane strides "
                         "(NULL data recommended) and a deleter called once")
def _empty_tensors(ctx: Ctx) -> str:
    return _shaped_check(ctx, _EMPTY_SHAPES, "ok")


@_check("rank_0", "a rank-0 tensor exports ndim 0 with non-NULL data for its one element")
def _rank_0(ctx: Ctx) -> str:
    return _shaped_check(ctx, [()], "ok")


@_check("rank_64", "a rank-64 tensor exports all 64 dimensions and strides")
def _rank_64(ctx: Ctx) -> str:
    return _shaped_check(ctx, [_RANK64_SHAPE], "ok")


@_check("read_only_flag", "READ_ONLY is set exactly when the producer says its memory must not "
                          "be written")
def _read_only_flag(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    claim: bool | None
    if ctx.readonly is not None:
        claim, how = ctx.readonly, f"check_producer(readonly={ctx.readonly})"
    else:
        claim, how = claims_readonly(obj)
    raw, _view = take(request(obj))
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if not raw.versioned:
        if claim:
            raise Fail(f"the memory is read-only ({how}) but the producer answers a legacy "
                        "capsule, which has no READ_ONLY flag: consumers get writable access")
        if claim is False:
            return f"legacy capsule (no flags): writable, matching {how}"
        raise Skip("legacy capsule (no flags), and nothing says whether the memory is "
                    "writable; pass readonly= to check_producer")
    flag = bool(raw.flags & FLAG_READ_ONLY)
    state = "set" if flag else "clear"
    if claim is None:
        raise Skip(f"READ_ONLY is {state}, but {kind} has no flags.writeable, readonly or "
                    "is_mutable to compare with; pass readonly= to check_producer")
    if flag != claim:
        said = "read-only" if claim else "writable"
        raise Fail(f"the memory is {said} ({how}) but READ_ONLY is {state}")
    note = f"READ_ONLY {state}, matching {how}"
    if claim:
        note += "; " + _legacy_of_read_only(obj, raw, how)
    return note


def _legacy_of_read_only(obj: Any, raw: Raw, how: str) -> str:
    """What a legacy request (no READ_ONLY flag to carry) gets of read-only memory: a
    refusal or a private copy pass; the memory itself fails (``raw``: its versioned export,
    still held, so a copy cannot land at the same address)."""
    try:
        cap, _w = request_legacy(obj)
    except BufferError as exc:
        return f"legacy request refused ({type(exc).__name__})"
    except Exception as exc:
        return f"legacy request raised {short(exc, 60)} (see legacy_capsule)"
    if capsule_name(cap) != L_NAME:
        take(cap)
        return "a legacy request gets a versioned capsule (see legacy_capsule)"
    lraw, _lview = take(cap)
    if lraw.elements and lraw.pointer == raw.pointer:
        raise Fail(f"the memory is read-only ({how}) but a legacy request (no max_version) "
                    f"gets a '{L_NAME}' capsule of that same memory, which has no READ_ONLY "
                    "flag: legacy-only consumers (apache-tvm-ffi, jax.numpy.from_dlpack) get "
                    "write access. Refuse it with BufferError (as NumPy does), or hand out a "
                    "private copy")
    return "a legacy request gets a private copy"


def _copy_reference(obj: Any) -> tuple[Raw, DLView, bytes | None]:
    raw, view = take(request(obj))
    return raw, view, host_bytes(view)


def _request_copy(obj: Any, copy: bool) -> object:
    """``obj.__dlpack__(max_version=..., copy=copy)``; a producer that does not take the
    keywords fails the check (a BufferError is the caller's to judge)."""
    try:
        return obj.__dlpack__(max_version=REQUEST, copy=copy)
    except TypeError as exc:
        raise Fail(f"does not accept max_version and copy (keywords of the 2023.12 array API): "
                    f"{short(exc)}") from None


@_check("copy_true", "__dlpack__(copy=True) gives different memory with the same bytes and "
                     "the IS_COPIED flag")
def _copy_true(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref, _ref_view, ref_bytes = _copy_reference(obj)
    try:
        cap = _request_copy(obj, True)
    except BufferError as exc:
        raise Fail(f"refused copy=True: {short(exc)}") from None
    raw, view = take(cap)
    problems = []
    if raw.elements and raw.pointer == ref.pointer:
        problems.append(f"copy=True shares the memory at 0x{raw.pointer:x}: no copy was made")
    got = host_bytes(view)
    if got is not None and ref_bytes is not None and got != ref_bytes:
        problems.append("the copy's bytes differ from the original's")
    if raw.versioned and not raw.flags & FLAG_IS_COPIED:
        problems.append("IS_COPIED is not set (DLPack requires it on a copy made for the "
                        "consumer)")
    if problems:
        raise Fail("; ".join(problems))
    if not raw.versioned:
        raise Skip("a legacy capsule cannot carry IS_COPIED; the data did move "
                    f"(0x{ref.pointer:x} -> 0x{raw.pointer:x}) with the same bytes")
    return f"IS_COPIED, 0x{ref.pointer:x} -> 0x{raw.pointer:x}"


@_check("copy_false", "__dlpack__(copy=False) shares the memory of the ordinary export and "
                      "never sets IS_COPIED")
def _copy_false(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    ref, _ref_view, _ = _copy_reference(obj)
    try:
        cap = _request_copy(obj, False)
    except BufferError as exc:
        if ref.flags & FLAG_IS_COPIED:
            return f"refused ({short(exc)}); the ordinary export is a copy too"
        raise Fail(f"refused copy=False although the ordinary export shares memory: "
                    f"{short(exc)}") from None
    raw, _view = take(cap)
    problems = []
    if raw.elements and raw.pointer != ref.pointer:
        problems.append(f"copy=False gave memory at 0x{raw.pointer:x}, the ordinary export "
                        f"0x{ref.pointer:x}: a copy")
    if raw.flags & FLAG_IS_COPIED:
        problems.append("IS_COPIED is set under copy=False")
    if problems:
        raise Fail("; ".join(problems))
    return f"shares 0x{raw.pointer:x}"


@_check("dl_device", "dl_device equal to __dlpack_device__() is accepted; a foreign device is "
                     "refused with BufferError (or served, on that device)")
def _dl_device(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    own = device_of(obj)
    if own is None:
        raise Skip("no __dlpack_device__ to take the device from (see 'dlpack_device')")
    problems, notes = [], []
    try:
        raw, _view = take(obj.__dlpack__(max_version=REQUEST, dl_device=own))
        if not same_device(own, raw.device):
            problems.append(f"dl_device={own} gave a capsule on {Device(*raw.device)}")
    except TypeError as exc:
        raise Fail(f"does not accept max_version and dl_device (keywords of the 2023.12 array "
                    f"API): {short(exc)}") from None
    except (Fail, Exception) as exc:
        problems.append(f"refused dl_device={own}, its own device: "
                        f"{exc if isinstance(exc, Fail) else short(exc)}")
    cuda, rocm = int(DLDeviceType.kDLCUDA), int(DLDeviceType.kDLROCM)
    foreign = (cuda, 0) if own[0] != cuda else (rocm, 0)  # ROCm for a CUDA producer
    for copy in (False, None):
        try:
            cap = obj.__dlpack__(max_version=REQUEST, dl_device=foreign, copy=copy)
        except BufferError:
            continue
        except Exception as exc:
            problems.append(f"dl_device={foreign}, copy={copy} raised {short(exc, 100)}; the "
                            "array API asks for BufferError")
            continue
        raw, _view = take(cap)
        if raw.device != foreign:
            problems.append(f"dl_device={foreign}, copy={copy} gave a capsule on "
                            f"{Device(*raw.device)}: dl_device was ignored")
        elif copy is None and raw.versioned and not raw.flags & FLAG_IS_COPIED:
            problems.append(f"moved to {Device(*foreign)} without IS_COPIED")
        else:
            notes.append(f"served {Device(*foreign)} with copy={copy}")
    if problems:
        raise Fail("; ".join(problems))
    head = f"own device {Device(*own)} accepted"
    if not notes:
        head += f"; {Device(*foreign)} refused with BufferError"
    return "; ".join([head, *notes])


@_check("stream_none", "__dlpack__(stream=None) is accepted (the default stream; the only "
                       "value a CPU producer must take)")
def _stream_none(ctx: Ctx) -> str:
    ctx.gate()
    obj = ctx.base()
    try:
        cap = obj.__dlpack__(stream=None, max_version=REQUEST)
    except TypeError:
        try:
            cap = obj.__dlpack__(stream=None)
        except Exception as exc:
            raise Fail(f"refused stream=None: {short(exc)}") from None
    except Exception as exc:
        raise Fail(f"refused stream=None: {short(exc)}") from None
    raw, _view = take(cap)
    return raw.describe()


CHECKS: dict[str, str] = {name: desc for name, (_fn, desc) in _REGISTRY.items()}
"""Every check's name and what it verifies, in the order the checks run."""


def run(ctx: Ctx, name: str) -> CheckResult:
    """The result of the check called ``name``; an exception it raises is a failure."""
    fn = _REGISTRY[name][0]
    try:
        why = fn(ctx)
        result = CheckResult(name, PASS, why)
    except Skip as exc:
        result = CheckResult(name, SKIP, str(exc))
    except Fail as exc:
        result = CheckResult(name, FAIL, str(exc))
    except Exception as exc:
        result = CheckResult(name, FAIL, f"raised {short(exc, 300)}")
    return result
