"""The safetensors header: its parser and the index it describes (no framework, no
safetensors package).

A safetensors file is an 8-byte little-endian header length ``N``, ``N``
bytes of UTF-8 JSON (``{name: {"dtype", "shape", "data_offsets"}, ...,
"__metadata__": {str: str}}``) and the tensor bytes. The header is parsed here
with the checks the reference implementation makes (safetensors
``tensor.rs``): a 100 MB header cap, offsets inside the data, lengths that
match shape x dtype, and data that is covered exactly, with no hole and no
overlap. It is read member by member and refused at the first token that breaks
the format (container.md §9), so a hostile header costs a small multiple of its
size; lone surrogates and a byte order mark are refused as safetensors refuses
them. Type names come from the element-type table's ``safetensors`` column; a
type it lacks is an :class:`UnsupportedError` naming it.

Below both :mod:`hurray_bridge.files.reading`, whose ``load`` opens safetensors files
too, and :mod:`hurray_bridge.files.safetensors`, the converters and the writer, which
build on the Hurray file code.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

from ..descriptor import DYNAMIC, MAX_RANK, Descriptor, dense_descriptor
from ..dtypes import DType, all_dtypes
from ..errors import FormatError, UnsupportedError
from .disk import checkpoint, open_regular, readinto_full

MAX_HEADER_SIZE = 100_000_000  # safetensors' own limit (tensor.rs MAX_HEADER_SIZE)
LENGTH = struct.Struct("<Q")  # the header length N, before the JSON
METADATA_KEY = "__metadata__"  # the one key of the JSON that is no tensor
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


class SafetensorsEntry(NamedTuple):
    """One tensor of a safetensors file; ``begin``/``end`` are relative to its data."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(self.shape, self.dtype)


class SafetensorsIndex(NamedTuple):
    entries: tuple[SafetensorsEntry, ...]
    metadata: dict[str, str]
    data_start: int  # 8 + N: where the tensor bytes begin in the file
    file_size: int


@lru_cache(maxsize=1)
def _by_name() -> dict[str, DType]:
    return {d.safetensors: d for d in all_dtypes() if d.safetensors is not None}


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark, which JSON (RFC 8259 §8.1) does not allow


def looks_like_safetensors(head: bytes | memoryview) -> bool:
    """Whether a file's first bytes are safetensors' own: the 8-byte header length, then
    the ``{`` of its JSON header (how every reader here tells the format by content). A
    byte order mark before the ``{`` counts too, so that the parser names it."""
    return len(head) >= 9 and (bytes(head[8:9]) == b"{" or bytes(head[8:12]) == _BOM + b"{")


# The header is read member by member, never built whole: json.loads of a header whose
# shape is [[], [], ...] made an object per two bytes (27 times the header) before any
# check could run. Each member is one regular-expression match where it has the form
# safetensors' writer gives it; any other form is read token by token, at most three
# levels deep (the header, an entry, its arrays), an array of at most 65 numbers, and
# refused at its first token that breaks the format, before anything after it is read.
_WS = rb"[ \t\n\r]*"
_UINT = rb"(?:0|[1-9][0-9]{0,19})"
_FAST_ENTRY = re.compile(
    _WS + rb'"([^"\\\x00-\x1f]*)"' + _WS + rb":" + _WS
    + rb'\{"dtype":"([^"\\\x00-\x1f]*)","shape":\[(' + _UINT + rb"(?:," + _UINT
    + rb"){0,63})?\],\"data_offsets\":\[(" + _UINT + rb"),(" + _UINT + rb")\]\}" + _WS
    + rb"([,}])")
_SPACE = re.compile(_WS)
_STRING = re.compile(rb'"[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*"')
_SCALAR = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null"
                     rb"|NaN|-?Infinity")
_WORDS = {b"true": True, b"false": False, b"null": None, b"NaN": float("nan"),
          b"Infinity": float("inf"), b"-Infinity": float("-inf")}
_UTF8_STEP = 1 << 20  # the UTF-8 check decodes (and drops) this much at a time
_MAX_ARRAY = MAX_RANK + 1  # one more than a shape may hold: enough to refuse it


class _Cut:
    """What stands in an array in an error message for what was not read."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _syntax(what: str, at: int) -> FormatError:
    return FormatError(f"the header is not valid JSON: {what} at byte {at}", field="header")


def _check_utf8(raw: memoryview) -> None:
    """Refuse a header that is not UTF-8, as safetensors does, without holding it as a str
    (one of 4 bytes per character, where one character outside the BMP is enough)."""
    if len(raw) <= _UTF8_STEP:  # one step: the decoder in one call, without its object
        try:
            codecs.utf_8_decode(raw, "strict", True)
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc, exc.start) from None
        return
    dec = codecs.getincrementaldecoder("utf-8")()
    for at in range(0, len(raw), _UTF8_STEP):
        pending = len(dec.getstate()[0])
        try:
            dec.decode(raw[at:at + _UTF8_STEP], final=at + _UTF8_STEP >= len(raw))
        except UnicodeDecodeError as exc:
            raise _not_utf8(exc, at - pending + exc.start) from None


def _not_utf8(exc: UnicodeDecodeError, at: int) -> FormatError:
    return FormatError(f"the header is not valid UTF-8 ({exc.reason} at byte {at})",
                       field="header")


def _text(token: bytes, field: str) -> str:
    """A JSON string token's value; a lone surrogate (an unpaired ``\\ud800``-``\\udfff``
    escape), which is no character, is refused as safetensors refuses it."""
    if b"\\" not in token:
        return token[1:-1].decode("utf-8")
    text: str = json.loads(token)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FormatError(
            f"the string {json.dumps(text[:200])} holds a lone surrogate "
            f"\\u{ord(text[exc.start]):04x} (a UTF-16 escape with no partner), which is no "
            "Unicode character and cannot be printed or written; safetensors refuses it "
            "too: write the string as UTF-8 or as a surrogate pair", field=field) from None
    return text


class _Reader:
    """The header's bytes and a position in them, read a token at a time."""

    def __init__(self, raw: memoryview, data_size: int) -> None:
        self.raw = raw
        self.pos = 0
        self.data_size = data_size

    def skip(self) -> int:
        m = _SPACE.match(self.raw, self.pos)
        assert m is not None
        self.pos = m.end()
        return self.pos

    def peek(self) -> bytes:
        return bytes(self.raw[self.skip():self.pos + 1])

    def expect(self, char: bytes, what: str) -> None:
        if self.peek() != char:
            raise _syntax(f"expected {what}", self.pos)
        self.pos += 1

    def string(self, what: str, field: str) -> str:
        m = _STRING.match(self.raw, self.skip())
        if m is None:
            got = self.peek()
            if got == b'"':  # a string whose end or escapes are wrong
                raise _syntax(f"{what}: a string with a control character, a bad escape or "
                              "no closing quote", self.pos)
            raise _syntax(f"expected {what} (a string), got {got.decode('latin-1')!r}",
                          self.pos)
        self.pos = m.end()
        return _text(m.group(), field)

    def member_end(self) -> bool:
        """After a member: True at the ``}`` that closes the object, False at a ``,``."""
        got = self.peek()
        if got not in (b",", b"}"):
            raise _syntax("expected ',' or '}' after a member", self.pos)
        self.pos += 1
        return got == b"}"

    def value(self, key: str, field: str) -> Any:
        """The value of an entry's member ``key``: a string, a number or an array of numbers.

        Anything else is refused here, by ``key``'s own check, before it is read."""
        got = self.peek()
        if got == b'"':
            return self.string("a value", field)
        if got == b"[":
            at = self.pos
            self.pos += 1
            items: list[Any] = []
            if self.peek() == b"]":
                self.pos += 1
                return items
            while True:
                if len(items) == _MAX_ARRAY:
                    items.append(_Cut("..."))
                    break
                got = self.peek()
                if got in (b"[", b"{", b'"'):
                    kind = {b"[": "an array", b"{": "an object", b'"': "a string"}[got]
                    items.append(_Cut(f"<{kind}, at byte {self.pos}>"))
                    break
                items.append(self.scalar(field))
                if self.peek() == b"]":
                    self.pos += 1
                    return items
                self.expect(b",", "',' or ']' in an array")
            _CHECKS[key](items, field, self.data_size)
            raise AssertionError(f"the check of {key} took {items!r} from byte {at}")
        if got == b"{":
            _CHECKS[key](_Cut(f"<an object, at byte {self.pos}>"), field, self.data_size)
            raise AssertionError(f"the check of {key} took an object")
        return self.scalar(field)

    def scalar(self, field: str) -> Any:
        m = _SCALAR.match(self.raw, self.skip())
        if m is None:
            raise _syntax(f"expected a value, got {self.peek().decode('latin-1')!r}", self.pos)
        self.pos = m.end()
        token = m.group()
        if token in _WORDS:
            return _WORDS[token]
        if len(token) > 40:  # no size needs more digits: not converted (CPython's own cap)
            return _Cut(f"<a number of {len(token)} characters>")
        return int(token) if token.lstrip(b"-").isdigit() else float(token)

    def entry(self, name: str) -> dict[str, Any]:
        """An entry's object: at most its three members, each checked as it comes."""
        field = f"tensors[{_short(name)}]"
        if self.peek() != b"{":
            raise FormatError(f"must be an object with exactly {sorted(_ENTRY_KEYS)}",
                              field=field)
        self.pos += 1
        info: dict[str, Any] = {}
        if self.peek() == b"}":
            self.pos += 1
            return info
        while True:
            key = self.string("a key", field)
            if key in info:
                raise FormatError(f"duplicate key {key!r} in the JSON header", field="header")
            if key not in _ENTRY_KEYS:
                raise FormatError(f"must be an object with exactly {sorted(_ENTRY_KEYS)}, "
                                  f"not {key!r}"[:300], field=field)
            self.expect(b":", "':'")
            info[key] = self.value(key, f"{field}.{key}")
            if self.member_end():
                return info

    def metadata(self, build: bool) -> dict[str, str]:
        """``__metadata__``: string keys to string values, refused at the first other value;
        the dict is built only if ``build`` (a first pass checks without holding it)."""
        out: dict[str, str] = {}
        if self.peek() != b"{":
            raise FormatError("__metadata__ must map strings to strings", field=METADATA_KEY)
        self.pos += 1
        if self.peek() == b"}":
            self.pos += 1
            return out
        while True:
            key = self.string("a key", METADATA_KEY)
            self.expect(b":", "':'")
            if self.peek() != b'"':
                raise FormatError(f"__metadata__ must map strings to strings (the value of "
                                  f"{key!r} is not a string)"[:300], field=METADATA_KEY)
            value = self.string("a value", METADATA_KEY)
            if build:
                if key in out:
                    raise FormatError(f"duplicate key {key!r} in the JSON header",
                                      field="header")
                out[key] = value
            if self.member_end():
                return out


def _check_dtype(st: Any, field: str, data_size: int) -> None:
    if not isinstance(st, str):
        raise FormatError(f"dtype must be a string, got {st!r}"[:300], field=field)


def _check_shape(shape: Any, field: str, data_size: int) -> None:
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(map(_uint, shape)):
        raise FormatError(f"shape must be a list of at most {MAX_RANK} non-negative "
                          f"integers, got {shape!r}"[:300], field=field)
    if DYNAMIC in shape:  # (a descriptor would take it for an unknown size)
        raise FormatError(f"shape {shape!r} has a dimension of 2**64 - 1 elements, which "
                          "no file holds (Hurray reads that value as a dynamic "
                          "dimension; safetensors has none)"[:300], field=field)


def _check_offsets(offsets: Any, field: str, data_size: int) -> None:
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_uint, offsets))
            or offsets[0] > offsets[1] or offsets[1] > data_size):
        if (isinstance(offsets, list) and len(offsets) == 2 and all(map(_uint, offsets))
                and offsets[0] <= offsets[1]):  # well formed, past the end: a short file
            raise FormatError(f"truncated: data_offsets {offsets!r} end past the "
                              f"{data_size} bytes of data the file holds"[:300], field=field)
        raise FormatError(f"data_offsets {offsets!r} must be [begin, end] with "
                          f"0 <= begin <= end <= {data_size}"[:300], field=field)


_CHECKS = {"dtype": _check_dtype, "shape": _check_shape, "data_offsets": _check_offsets}


@lru_cache(maxsize=4096)
def _descriptor(shape: tuple[int, ...], st: str) -> tuple[Descriptor, int]:
    """The descriptor of a dense tensor of safetensors type ``st`` and its byte count (many
    entries share one: a cache keyed by strings and ints, which hash fast)."""
    d = dense_descriptor(shape, _by_name()[st])
    ((_, nbytes),) = d.buffer_layout()  # a dense tensor's one buffer: d.nbytes
    return d, nbytes


def parse_header(prefix: bytes | memoryview, file_size: int) -> SafetensorsIndex:
    """Parse a safetensors header; ``prefix`` holds at least the first ``8 + N`` bytes."""
    return _parse(prefix, file_size)[0]


def _parse(prefix: bytes | memoryview,
           file_size: int) -> tuple[SafetensorsIndex, list[Descriptor]]:
    """:func:`parse_header`, and the descriptor of each entry it checked them by."""
    raw = header_bytes(prefix, file_size)
    data_start = LENGTH.size + len(raw)
    data_size = file_size - data_start
    r = _Reader(raw, data_size)
    entries, descriptors, metadata_at = _members(r, raw, data_size)
    _check_coverage(entries, data_size)
    metadata: dict[str, str] = {}
    if metadata_at >= 0:  # checked already: now held, once the tensors are known good
        r.pos = metadata_at
        metadata = r.metadata(build=True)
    return SafetensorsIndex(tuple(entries), metadata, data_start, file_size), descriptors


def header_bytes(prefix: bytes | memoryview, file_size: int) -> memoryview:
    """The JSON header's bytes in ``prefix`` (a file's first ``8 + N`` bytes), once its
    length, its place in the file, its first byte and its UTF-8 are checked: what
    :func:`compiled_tensors` reads."""
    try:
        view = memoryview(prefix).cast("B")
    except TypeError:
        raise FormatError(f"expected bytes, got {type(prefix).__name__}", field="input") from None
    if file_size < LENGTH.size or len(view) < LENGTH.size:
        raise FormatError(f"truncated: {file_size} bytes, the header length alone needs 8",
                          field="header_length")
    (n,) = LENGTH.unpack_from(view, 0)
    if n > MAX_HEADER_SIZE:
        raise FormatError(f"header of {n} bytes exceeds the {MAX_HEADER_SIZE}-byte limit",
                          field="header_length")
    if n > file_size - LENGTH.size or len(view) < LENGTH.size + n:
        raise FormatError(f"truncated: the header of {n} bytes extends past the end of the "
                          f"file ({file_size} bytes)", field="header_length")
    raw = view[LENGTH.size:LENGTH.size + n]
    if bytes(raw[:3]) == _BOM:
        raise FormatError("the JSON header starts with a UTF-8 byte order mark (bytes EF BB "
                          "BF), which JSON does not allow and safetensors refuses: remove "
                          "those 3 bytes (and take 3 from the header length)", field="header")
    if bytes(raw[:1]) != b"{":
        raise FormatError("the JSON header must start with '{'", field="header")
    _check_utf8(raw)
    return raw


def _members(r: _Reader, raw: memoryview, data_size: int
             ) -> tuple[list[SafetensorsEntry], list[Descriptor], int]:
    """The header's members read and checked, in order: (the entries, their descriptors,
    where ``__metadata__``'s value starts, -1 without one). A member in the form
    safetensors writes takes the fast path; any other is read by the full JSON reader."""
    r.pos = 1
    metadata_at = -1
    names: set[str] = set()
    entries: list[SafetensorsEntry] = []
    descriptors: list[Descriptor] = []
    by_name = _by_name()
    fast = _FAST_ENTRY.match
    closed = r.peek() == b"}"
    if closed:
        r.pos += 1
    while not closed:
        if not len(entries) & 1023:
            checkpoint()  # a header of many tensors takes seconds
        m = fast(raw, r.pos)
        if m is not None and m.group(1) != b"__metadata__":
            # the form safetensors writes: no escape, so no decoding but UTF-8's
            name = str(raw[m.start(1):m.end(1)], "utf-8")
            st, sh, begin, end = m.group(2, 3, 4, 5)
            shape = tuple([int(x) for x in sh.split(b",")] if sh else ())
            r.pos = m.end()
            closed = m.group(6) == b"}"
            if name in names:
                raise FormatError(f"duplicate key {_short(name)} in the JSON header",
                                  field="header")
            names.add(name)
            fast_entry = _fast_entry(name, str(st, "utf-8"), shape, int(begin), int(end),
                                     data_size)
            if fast_entry is None:  # a defect: the full checks name it
                _check_entry(name, {"dtype": str(st, "utf-8"), "shape": list(shape),
                                    "data_offsets": [int(begin), int(end)]},
                             by_name, data_size)
                raise AssertionError(f"the checks took {_short(name)}")
            entries.append(fast_entry[0])
            descriptors.append(fast_entry[1])
            continue
        else:
            name = r.string("a tensor's name", "header")
            if name in names:  # before its value is read
                raise FormatError(f"duplicate key {_short(name)} in the JSON header",
                                  field="header")
            r.expect(b":", "':'")
            if name == METADATA_KEY:
                metadata_at = r.pos
                r.metadata(build=False)
                info = None
            else:
                info = r.entry(name)
            closed = r.member_end()
        names.add(name)
        if info is not None:
            entry, d = _check_entry(name, info, by_name, data_size)
            entries.append(entry)
            descriptors.append(d)
    if r.skip() != len(raw):
        raise _syntax("extra data after the closing '}' (only spaces may follow)", r.pos)
    return entries, descriptors, metadata_at


def _check_coverage(entries: list[SafetensorsEntry], data_size: int) -> None:
    """Like safetensors: sorted by offset, the tensors cover the data exactly."""
    pos = 0
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin != pos:
            what = "overlaps the previous tensor" if e.begin < pos else f"leaves a hole at {pos}"
            raise FormatError(f"tensor {_short(e.name)} at [{e.begin}, {e.end}) {what}",
                              field=f"tensors[{_short(e.name)}].data_offsets")
        pos = e.end
    if pos != data_size:
        raise FormatError(f"the tensors cover {pos} bytes of data, the file holds {data_size}",
                          field="data")


def _short(name: str) -> str:
    """``name`` as its repr, cut to 200 characters: a name may be megabytes long."""
    return repr(name) if len(name) <= 200 else repr(name[:200]) + f"... ({len(name)} characters)"


def _fast_entry(name: str, st: str, shape: tuple[int, ...], begin: int, end: int,
                data_size: int) -> tuple[SafetensorsEntry, Descriptor] | None:
    """The entry a well-formed member describes, or None if a check fails (the full checks
    of :func:`_check_entry` then say which): the same rules, without their messages."""
    described = describe(shape, st)
    if described is None or begin > end or end > data_size or end - begin != described[2]:
        return None
    d, shape, _, dtype = described
    return SafetensorsEntry(name, dtype, shape, begin, end), d


@lru_cache(maxsize=4096)
def describe(shape: tuple[int, ...], st: str
             ) -> tuple[Descriptor, tuple[int, ...], int, DType] | None:
    """``(descriptor, its shape, byte count, element type)`` of a dense tensor of
    safetensors type ``st``, checked as :func:`_check_entry` checks them, or ``None`` where
    a check fails (without its message). Also what the compiled reader
    (:func:`compiled_tensors`) asks once for each distinct type and shape of a header.
    Cached, as the descriptors are: checkpoints share a few shapes and types, and loading
    one again asks the same questions."""
    dtype = _by_name().get(st)
    if dtype is None or DYNAMIC in shape:
        return None
    try:
        d, nbytes = _descriptor(shape, st)
    except FormatError:
        return None
    if dtype.is_subbyte and (d.element_count * dtype.bits) % 8:
        return None
    return d, d.shape, nbytes, dtype


def _check_entry(name: str, info: dict[str, Any], by_name: dict[str, DType],
                 data_size: int) -> tuple[SafetensorsEntry, Descriptor]:
    field = f"tensors[{_short(name)}]"
    if set(info) != _ENTRY_KEYS:
        raise FormatError(f"must be an object with exactly {sorted(_ENTRY_KEYS)}", field=field)
    st = info["dtype"]
    shape = info["shape"]
    offsets = info["data_offsets"]
    _check_dtype(st, f"{field}.dtype", data_size)
    dtype = by_name.get(st)
    if dtype is None:
        raise UnsupportedError(
            f"tensor {_short(name)} has safetensors dtype {st!r}, which has no Hurray element "
            f"type (the table's safetensors column knows {', '.join(_by_name())})")
    _check_shape(shape, f"{field}.shape", data_size)
    _check_offsets(offsets, f"{field}.data_offsets", data_size)
    entry = SafetensorsEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
    try:
        d, nbytes = _descriptor(entry.shape, st)
    except FormatError as exc:
        raise FormatError(f"tensor {_short(name)}: {exc}", field=f"{field}.shape") from None
    if dtype.is_subbyte and (d.element_count * dtype.bits) % 8:
        raise FormatError(f"{d.element_count} {st} elements do not fill whole bytes",
                          field=f"{field}.shape")
    if entry.end - entry.begin != nbytes:
        raise FormatError(f"data_offsets span {entry.end - entry.begin} bytes, shape "
                          f"{list(shape)} of {st} needs {nbytes}",
                          field=f"{field}.data_offsets")
    return entry, d


def read_header(path: str | os.PathLike[str]) -> SafetensorsIndex:
    """Read and check a safetensors file's header (not its data)."""
    with open_regular(path) as f:
        return read_header_from(f)


def read_header_from(f: Any) -> SafetensorsIndex:
    """The checked header of a safetensors file open as ``f`` (at offset 0)."""
    return read_header_and_descriptors(f)[0]


def read_header_and_descriptors(f: Any) -> tuple[SafetensorsIndex, list[Descriptor]]:
    """:func:`read_header_from`, and each entry's descriptor (made once, for a converter)."""
    return _parse(*read_prefix(f))


def read_prefix(f: Any, size: int | None = None) -> tuple[memoryview, int]:
    """The first ``8 + N`` bytes of a safetensors file open as ``f`` (at offset 0), or as
    many as the file justifies reading, and the file's size (``size``: where the caller
    has its stat already): what :func:`parse_header` and :func:`header_bytes` take."""
    if size is None:
        size = os.fstat(f.fileno()).st_size
    head = f.read(LENGTH.size)
    if len(head) == LENGTH.size:
        (n,) = LENGTH.unpack(head)
        if n <= min(MAX_HEADER_SIZE, size - LENGTH.size):  # read only what the file justifies
            buf = bytearray(LENGTH.size + n)  # read into place: the header is held once
            buf[:LENGTH.size] = head
            view = memoryview(buf)
            return view[:LENGTH.size + readinto_full(f, view[LENGTH.size:])], size
    return memoryview(head), size


def read_metadata(raw: memoryview, at: int, data_size: int) -> dict[str, str]:
    """The ``__metadata__`` object whose value starts at byte ``at`` of the header ``raw``
    (the place :func:`compiled_tensors` gives), read and checked as :func:`parse_header`
    reads it."""
    r = _Reader(raw, data_size)
    r.pos = at
    return r.metadata(build=True)


# The compiled reader of headers in the writer's own form (_speedups_c/st_header.c), or
# None where hurray_bridge._speedups was not built (or built before it had one).
_compiled: Callable[..., tuple[dict[str, Any], int, int, int] | None] | None
try:
    from .._speedups import safetensors_tensors as _compiled
except ImportError:
    _compiled = None


def compiled_reader() -> bool:
    """Whether :func:`compiled_tensors` may read a file (the compiled module was built):
    without it a caller skips the steps that serve it alone (the map made first)."""
    return _compiled is not None


def compiled_tensors(raw: memoryview, data_size: int, base: int, owner: object, cap: int
                     ) -> tuple[dict[str, Any], int, int, int] | None:
    """hb.load's tensors of the header ``raw`` (:func:`header_bytes`) over the mapped data
    at address ``base``, read in C: ``({name: Tensor}, where __metadata__'s value starts
    or -1, the alignment every non-empty buffer has (at most ``cap``), how many buffers
    are not ``cap``-aligned)``.

    ``None`` when the compiled module is absent or the header is not entirely in the
    form safetensors' writer gives it, or has any defect: the Python reader
    (:func:`parse_header`) then reads it, and names the defect. Where both read a header
    they agree (tests/hurray_bridge/test_safetensors_compiled.py)."""
    if _compiled is None:
        return None
    return _compiled(raw, data_size, base, owner, describe, checkpoint, cap)
