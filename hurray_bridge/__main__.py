"""The ``hurray`` command line (also ``python -m hurray_bridge``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .errors import FormatError, HurrayError

__all__ = ["main"]


def _cmd_matrix(args: argparse.Namespace) -> int:
    from .dtypes import dtype_from_name
    from .matrix import available_frameworks, build_report, format_report

    frameworks = list(dict.fromkeys(args.frameworks or available_frameworks()))
    if not frameworks:
        print("hurray: error: no supported framework is installed; "
              "pip install 'hurray-bridge[all]'", file=sys.stderr)
        return 2
    dtypes = [dtype_from_name(d) for d in args.dtypes] if args.dtypes else None
    if sys.stderr.isatty():  # the run takes seconds: say what it is doing
        print(f"hurray matrix: measuring {', '.join(frameworks)}...", file=sys.stderr, flush=True)
    report = build_report(frameworks, dtypes, n=args.size, repeat=args.repeat)
    print(format_report(report, args.format))
    if args.json:
        with open(args.json, "w") as f:
            f.write(format_report(report, "json") + "\n")
    return 1 if any(c.outcome == "wrong" for c in report.cells) else 0


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


# ------------------------------------------------------------ files: helpers
_FORMATS = ("hurray", "safetensors", "npy", "npz")
_PROGRESS_MIN_BYTES = 64 << 20  # smaller conversions finish before a bar would help


def _count(n: int, one: str, many: str = "") -> str:
    """``1 entry``, ``2 entries``: the count and the noun that agrees with it."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _alignment(text: str) -> int:
    """An argparse type for ``--alignment``: a power of two from 64 to 2 MiB."""
    from .files.format import BUFFER_ALIGNMENT, MAX_BUFFER_ALIGNMENT

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not BUFFER_ALIGNMENT <= value <= MAX_BUFFER_ALIGNMENT or value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two from {BUFFER_ALIGNMENT} to {MAX_BUFFER_ALIGNMENT} "
            f"(64, 128, ..., 4096, ...), got {text!r}")
    return value


def _shown(text: object) -> str:
    """``text`` safe to print on a terminal, as one line: every character that is not
    printable (C0 and C1 controls, DEL, CR and LF, line and paragraph separators, bidi and
    other format characters, lone surrogates) becomes the escape Python writes for it.

    Names, metadata and paths come from files and folders that anyone may have made: printed
    raw, an escape sequence in a name could set the terminal's title or clear it, a CR or LF
    could forge a line of output (``other.hurray: OK``), and a lone surrogate could not be
    encoded at all. A backslash stands for itself."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fail(path: object, exc: BaseException) -> int:
    """Report bad input on stderr; status 2 (as argparse does for a bad command line)."""
    if isinstance(exc, OSError) and exc.strerror:
        msg = exc.strerror
    else:
        msg = str(exc)
    print(_shown(f"hurray: error: {path}: {msg}"), file=sys.stderr)
    return 2


def _sniff(path: str) -> str:
    """The format of an input file: its magic bytes first, its suffix as a fallback."""
    from .files.disk import open_regular as _open_regular
    from .files.safetensors_header import looks_like_safetensors

    with _open_regular(path) as f:  # a FIFO or device is refused, never waited on
        head = f.read(16)
    if head[:4] == b"HRYF":
        return "hurray"
    if head[:6] == b"\x93NUMPY":
        return "npy"
    if looks_like_safetensors(head):  # first: its header length may begin with "PK\3\4"
        return "safetensors"
    if head[:4] == b"PK\x03\x04":
        return "npz"
    return _suffix_format(path) or "hurray"  # let the Hurray reader name the defect


def _suffix_format(path: str) -> str | None:
    from .files.disk import SUFFIX_FORMATS

    return SUFFIX_FORMATS.get(os.path.splitext(path)[1].lower())


class _ProgressBar:
    """A one-line progress bar on stderr, drawn only for a terminal and a large job."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = _shown(label)
        self.enabled = enabled and sys.stderr.isatty()
        self.last = -1
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < _PROGRESS_MIN_BYTES:
            return
        pct = done * 100 // total if total else 100
        if pct == self.last:
            return
        self.last = pct
        width = 30
        fill = width * pct // 100
        try:
            sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {pct:3d}% "
                             f"{done >> 20}/{total >> 20} MiB")
            sys.stderr.flush()
        except (OSError, ValueError):  # the terminal went away: the conversion goes on
            self.enabled = False
            return
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.drawn = False
            try:
                sys.stderr.write("\n")
                sys.stderr.flush()
            except (OSError, ValueError):
                pass


def _layout_text(d: object) -> str:
    from .descriptor import Descriptor
    from .layout import Layout

    assert isinstance(d, Descriptor)
    if d.layout == Layout.ROW_MAJOR:
        text = "row-major"
    elif d.layout == Layout.STRIDED:
        text = f"strided {list(d.strides or ())}"
    elif d.layout == Layout.TILED:
        text = f"tiled {list(d.tile or ())}"
    else:
        sp = d.sparse
        assert sp is not None
        text = (f"{d.layout.name.lower()} nnz={sp.nnz} {sp.index_dtype.name}"
                + (" canonical" if sp.canonical else ""))
    if d.padded:
        text += " padded"
    if d.shard is not None:
        text += f" shard@{list(d.shard.offsets)}/{list(d.shard.global_shape)}"
    return text


def _quant_text(d: object) -> str:
    from .descriptor import Descriptor
    from .layout import QuantScheme

    assert isinstance(d, Descriptor)
    q = d.quantization
    if q is None:
        return "-"
    name = q.scheme.name.lower().replace("_", "-")
    if q.scheme == QuantScheme.PER_AXIS:
        name += f"(axis={q.axis})"
    elif q.scheme == QuantScheme.PER_BLOCK:
        name += f"(axis={q.axis}, block={q.block_size})"
    text = f"{name} scale={q.scale_dtype.name}"
    if q.zero_point_dtype is not None:
        text += f" zero_point={q.zero_point_dtype.name}"
    return text


def _rows_of(path: str, verify: bool = False,
             ) -> tuple[str, list[dict[str, object]], dict[str, str], str]:
    """(summary line, one row per entry, metadata, checksums) for a Hurray or safetensors
    file; ``checksums`` is "verified", "not checked" or "none" (the file has none).
    ``verify`` reads every byte (files.reading.verify); otherwise the index only."""
    if _sniff(path) == "safetensors":
        from .files.safetensors_header import read_header

        idx = read_header(path)  # the header and every tensor's offsets, as verify checks
        rows = [{"name": e.name, "dtype": e.dtype.name, "shape": list(e.shape),
                 "layout": "row-major", "bytes": e.end - e.begin, "quantization": "-"}
                for e in idx.entries]
        summary = (f"{_shown(path)}: safetensors, {_count(len(rows), 'tensor')}, "
                   f"{_count(idx.file_size - idx.data_start, 'byte')} of data, no checksums "
                   "(the format has none; header and offsets checked)")
        return summary, rows, dict(idx.metadata), "none"
    from .files.format import read_index

    if verify:
        from .files.reading import verify as verify_file

        fi = verify_file(path)
    else:
        fi = read_index(path)
    rows = [{"name": e.name, "dtype": e.descriptor.dtype.name,
             "shape": list(e.descriptor.shape), "layout": _layout_text(e.descriptor),
             "bytes": e.nbytes, "quantization": _quant_text(e.descriptor)}
            for e in fi.entries]
    # Said either way: "CRC-32 data checksums" alone read as a file found sound.
    checksums = "none" if not fi.has_checksums else "verified" if verify else "not checked"
    summary = (f"{_shown(path)}: Hurray {fi.version[0]}.{fi.version[1]}, "
               f"{_count(len(rows), 'entry', 'entries')}, "
               f"{_count(fi.data_length, 'byte')} of data, {fi.alignment}-byte alignment, "
               + {"none": "no data checksums",
                  "verified": "CRC-32 data checksums, verified",
                  "not checked": "CRC-32 data checksums, not checked (hurray inspect --verify "
                                 "checks them)"}[checksums])
    return summary, rows, dict(fi.metadata), checksums


def _table(rows: list[dict[str, object]]) -> str:
    cols = ("name", "dtype", "shape", "layout", "bytes", "quantization")
    cells = [[_shown(r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) if c == "bytes" else c.ljust(w)
                       for c, w in zip(cols, widths, strict=True))]
    for row in cells:
        lines.append("  ".join(v.rjust(w) if cols[i] == "bytes" else v.ljust(w)
                               for i, (v, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(line.rstrip() for line in lines)


# ------------------------------------------------------------- files: commands
def _cmd_inspect(args: argparse.Namespace) -> int:
    try:
        summary, rows, metadata, checksums = _rows_of(args.file, args.verify)
    except (HurrayError, OSError) as exc:
        return _fail(args.file, exc)
    if args.json:
        print(json.dumps({"summary": summary, "checksums": checksums, "entries": rows,
                          "metadata": metadata}, indent=1))
        return 0
    print(summary)
    if rows:
        print(_table(rows))
    if metadata:
        print("metadata:")
        for k, v in metadata.items():
            shown = _shown(v if len(v) <= 200 else v[:200]) + (
                f"... ({len(v)} characters)" if len(v) > 200 else "")
            print(f"  {_shown(k)} = {shown}")
    return 0


def _report_stale(path: str) -> None:
    """Warn about temporaries that killed saves of ``path`` left (container.md §7)."""
    from .files.disk import TEMP_NAME as _TEMP
    from .files.disk import stale_temporaries

    for tmp in stale_temporaries(path):
        m = _TEMP.search(os.path.basename(tmp))
        try:
            size = f", {_count(os.lstat(tmp).st_size, 'byte')}"
        except OSError:
            continue
        print(_shown(f"hurray: warning: {tmp}: temporary file of an interrupted save of "
                     f"{path} (its writer, pid {m['pid'] if m else '?'}, is gone{size}); delete "
                     "it, or the next save into that folder will"), file=sys.stderr)


def _cmd_verify(args: argparse.Namespace) -> int:
    status = 0
    for path in args.files:
        _report_stale(path)
        try:
            if _sniff(path) == "safetensors":
                from .files.safetensors_header import read_header

                idx = read_header(path)
                print(f"{_shown(path)}: OK (safetensors: {_count(len(idx.entries), 'tensor')}, "
                      "header "
                      "and offsets "
                      "checked; the format has no checksums)")
                continue
            from .files.reading import verify

            fi = verify(path)
        except (HurrayError, OSError) as exc:
            status = _fail(path, exc)
            continue
        what = ("data checksums and padding verified" if fi.has_checksums
                else "no data checksums: structure and padding verified")
        print(f"{_shown(path)}: OK ({_count(len(fi.entries), 'entry', 'entries')}, "
              f"{_count(fi.data_length, 'byte')} of data, {what})")
    return status


def _numpy_tensors(path: str, fmt: str, name: str | None) -> dict[str, object]:
    """The arrays of a ``.npy`` or ``.npz`` input (:mod:`hurray_bridge.files.numpy_files`,
    imported only when one is converted)."""
    from .files.numpy_files import numpy_tensors

    return numpy_tensors(path, fmt, name)


def _file_regions(path: str, tensors: dict[str, object]
                  ) -> contextlib.AbstractContextManager[
                      tuple[list[Any], Callable[[Sequence[int]], None]] | None]:
    """The plan items of those arrays that lie in the file as they are, and the check of an
    archive's checksums (:func:`hurray_bridge.files.numpy_files.file_regions`)."""
    from .files.numpy_files import file_regions

    return file_regions(path, tensors)


class _Annotated(Exception):
    """An error's message with a sentence added (for :func:`_fail`)."""

    def __init__(self, exc: BaseException, note: str) -> None:
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        super().__init__(f"{text}; {note}")


class _Stopped(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived (raised at the conversion's next checkpoint): unwinds
    like KeyboardInterrupt, so temporaries are removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _signals_flag() -> tuple[list[int], Callable[[], None]]:
    """Make SIGINT, SIGTERM and SIGHUP note their number in a list instead of acting at
    once; returns the list and what restores the handlers.

    Their default actions end the process on the spot (the temporary file of the
    conversion stays) or raise wherever the main thread is: inside a weak-reference
    or collector callback, where Python prints the exception and goes on (the
    conversion then ran to its end under a SIGTERM), or inside a lock of the standard
    library. So the signal is noted, and :class:`_Stopped` is raised at once only when
    it interrupts one of the package's own blocking reads, writes or flushes (a slow
    write ends at once), else at the conversion's next checkpoint (``files.disk.checkpoint``:
    every data read and write, every 1024 entries planned, and before the rename);
    unwinding removes the temporary. A signal this process inherited as ignored
    (``nohup``, a background job's SIGINT) stays ignored.
    """
    import signal

    from .files import disk as _disk

    got: list[int] = []

    def note(signum: int, frame: Any) -> None:
        got.append(signum)
        if _disk.interrupted_in_io(frame):
            raise _Stopped(signum)

    def check() -> None:
        if got:
            raise _Stopped(got[0])

    old: dict[int, Any] = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None or signal.getsignal(sig) is signal.SIG_IGN:
            continue
        try:
            old[sig] = signal.signal(sig, note)
        except ValueError:  # not the main thread: signals cannot be handled here
            break
    _disk.set_checkpoint(check)

    def restore() -> None:
        _disk.set_checkpoint(None)
        for sig, handler in old.items():
            signal.signal(sig, handler)

    return got, restore


# What a failure after the rename says (``files.disk.atomic_output`` marks it ``output_replaced``).
_WRITTEN_UNFLUSHED = "the output was written in full, but its folder may not be flushed to disk"
_NOT_WRITTEN = "the output was not written (an earlier file of that name is unchanged)"


def _not_written(output: str) -> str:
    """What a failure before the rename says: "unchanged" only of a file that is there."""
    folder = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(folder):
        if os.path.lexists(folder):
            return f"the output was not written: its folder {folder} is not a folder"
        return (f"the output was not written: its folder {folder} does not exist (create it "
                f"first: mkdir -p {shlex.quote(folder)})")
    if not os.path.lexists(output):
        return "the output was not written (no file of that name was there before)"
    return _NOT_WRITTEN


def _convert_interrupted(output: str, signum: int, what: str, when: str = "") -> int:
    import signal

    print(_shown(f"hurray: error: {output}: interrupted by {signal.Signals(signum).name}"
                 f"{when}; {what}"), file=sys.stderr)
    return 128 + signum  # what a shell reports for a command stopped by that signal


def _cmd_convert_checkpoint(args: argparse.Namespace) -> int:
    """``hurray convert DIR OUT``: a checkpoint folder (or its index), every shard file and the
    index, under one progress bar (checkpoint_dir.convert_checkpoint)."""
    from .checkpoint_dir import convert_checkpoint

    if args.name is not None:
        return _fail(args.input, FormatError("--name names the entry of a .npy input; a "
                                             "checkpoint's names come from its files: drop it"))
    bar = _ProgressBar(f"converting {args.input}", not args.quiet)
    signals, restore_signals = _signals_flag()
    try:
        files, n = convert_checkpoint(args.input, args.output, args.to_format,
                                      alignment=args.alignment,
                                      checksums=not args.no_checksums,
                                      verify=not args.no_verify, fsync=not args.no_fsync,
                                      progress=bar)
    except (HurrayError, OSError) as exc:
        bar.close()
        if signals:
            return _convert_interrupted(args.output, signals[0], _CHECKPOINT_STOPPED)
        return _fail(getattr(exc, "filename", None) or args.input, exc)
    except (KeyboardInterrupt, _Stopped) as exc:
        import signal

        bar.close()
        signum = exc.signum if isinstance(exc, _Stopped) else signal.SIGINT
        return _convert_interrupted(args.output, signum, _CHECKPOINT_STOPPED)
    finally:
        restore_signals()
    bar.close()
    if signals:
        return _convert_interrupted(args.output, signals[0], "the checkpoint was written in full",
                                    " as the conversion ended")
    if not args.quiet:
        print(f"{_shown(args.input)} -> {_shown(args.output)}: {_count(files, 'file')}, "
              f"{_count(n, 'tensor')}")
    return 0


# Files already converted stay (each was written whole); the index, written last, is not there.
_CHECKPOINT_STOPPED = "the output folder has no index yet: run the conversion again"


def _cmd_convert(args: argparse.Namespace) -> int:
    from .checkpoint_dir import is_checkpoint_path

    if is_checkpoint_path(args.input):
        return _cmd_convert_checkpoint(args)
    formats = _convert_formats(args)
    if isinstance(formats, int):
        return formats
    src_fmt, dst_fmt, alignment = formats
    bar = _ProgressBar(f"converting {args.input}", not args.quiet)
    signals, restore_signals = _signals_flag()
    try:
        n = _convert_file(args, src_fmt, dst_fmt, alignment, bar)
        if n is None:
            bar.close()
            return _fail(args.input, FormatError(
                f"converting {src_fmt} to {dst_fmt} is not supported (supported: safetensors "
                "<-> hurray, npy/npz/hurray -> hurray)"))
    except (HurrayError, OSError) as exc:
        bar.close()
        return _convert_failed(args, src_fmt, exc, signals)
    except (KeyboardInterrupt, _Stopped) as exc:
        import signal

        bar.close()
        signum = exc.signum if isinstance(exc, _Stopped) else signal.SIGINT
        replaced = getattr(exc, "output_replaced", False)
        return _convert_interrupted(args.output, signum,
                                    _WRITTEN_UNFLUSHED if replaced
                                    else _not_written(args.output))
    finally:
        restore_signals()
    bar.close()
    if signals:  # it came after the rename: nothing was left to stop
        return _convert_interrupted(args.output, signals[0], "the output was written in full",
                                    " as the conversion ended")
    if not args.quiet:
        print(f"{_shown(args.input)} ({src_fmt}) -> {_shown(args.output)} ({dst_fmt}): "
              f"{_count(n, 'tensor')}")
    return 0


def _convert_formats(args: argparse.Namespace) -> tuple[str, str, int] | int:
    """The formats a file conversion reads and writes, and the output's buffer alignment;
    or the exit status where they cannot be told, or the options contradict them."""
    from . import container

    try:
        src_fmt = args.from_format or _sniff(args.input)
    except (HurrayError, OSError) as exc:
        return _fail(args.input, exc)
    dst_fmt = args.to_format or _suffix_format(args.output)
    if dst_fmt is None:
        return _fail(args.output, FormatError(
            "cannot tell the output format from the file name; use --to "
            f"{{{','.join(f for f in _FORMATS if f in ('hurray', 'safetensors'))}}}"))
    if args.alignment is not None and dst_fmt != "hurray":
        return _fail(args.output, FormatError(
            f"--alignment {args.alignment} applies to a Hurray output; {dst_fmt} has no "
            "buffer alignment to set (it stores tensors back to back): drop --alignment"))
    try:
        container.check_suffix(args.output, dst_fmt)  # a name never claims another format
    except FormatError as exc:
        return _fail(args.output, exc)
    return src_fmt, dst_fmt, args.alignment or container.BUFFER_ALIGNMENT


def _convert_file(args: argparse.Namespace, src_fmt: str, dst_fmt: str, alignment: int,
                  bar: _ProgressBar) -> int | None:
    """Write the conversion of one file by the pair of formats: the number of tensors, or
    None for a pair the command does not convert."""
    from . import container, safetensors_io

    verify = not args.no_verify  # what is read is checked, checksums included
    fsync = not args.no_fsync  # durable unless asked: atomic either way
    if src_fmt == "safetensors" and dst_fmt == "hurray":
        return safetensors_io.safetensors_to_hurray(args.input, args.output,
                                                    checksums=not args.no_checksums,
                                                    fsync=fsync, progress=bar,
                                                    alignment=alignment)
    if src_fmt == "hurray" and dst_fmt == "safetensors":
        return safetensors_io.hurray_to_safetensors(args.input, args.output, fsync=fsync,
                                                    progress=bar, verify=verify)
    if src_fmt == "hurray" and dst_fmt == "hurray":
        return container.rewrite(args.input, args.output, alignment=alignment,
                                 checksums=not args.no_checksums, fsync=fsync,
                                 verify=verify, progress=bar)
    if dst_fmt != "hurray" or src_fmt not in ("npy", "npz"):
        return None
    tensors = _numpy_tensors(args.input, src_fmt, args.name)
    with _file_regions(args.input, tensors) as regions:
        if regions is None:
            plan = container._plan_tensors(tensors, None, alignment, not args.no_checksums)
            container._write_plan(args.output, plan, fsync=fsync, progress=bar)
        else:
            items, check = regions
            plan = container._plan(items, None, alignment, not args.no_checksums,
                                   list(tensors.values()))
            container._write_plan(args.output, plan, fsync=fsync, progress=bar,
                                  check=check, sums=True)
    return len(tensors)


def _convert_failed(args: argparse.Namespace, src_fmt: str, exc: HurrayError | OSError,
                    signals: list[int]) -> int:
    """The exit status of a file conversion that failed, and what its message says was
    written: a stop asked for first is what is reported."""
    if signals:
        replaced = getattr(exc, "output_replaced", False)
        return _convert_interrupted(args.output, signals[0],
                                    _WRITTEN_UNFLUSHED if replaced
                                    else _not_written(args.output))
    where = getattr(exc, "filename", None) or args.input
    if getattr(exc, "output_replaced", False):
        return _fail(args.output, _Annotated(exc, _WRITTEN_UNFLUSHED))
    if where == args.output:
        return _fail(where, _Annotated(exc, _not_written(args.output)))
    if src_fmt == "hurray" and ("checksum" in str(getattr(exc, "field", "")) or
                                "padding" in str(exc)):
        return _fail(where, _Annotated(exc, "nothing was written (hurray convert "
                                            "--no-verify converts a damaged file as it is)"))
    return _fail(where, exc)


def _add_file_commands(sub: argparse._SubParsersAction) -> None:
    i = sub.add_parser(
        "inspect", help="list the entries of a Hurray (or safetensors) file",
        description="Print a table of a file's entries (name, dtype, shape, layout, bytes, "
                    "quantization) and its metadata. Reads the header and table only, and "
                    "says the data checksums were not checked; --verify checks them.")
    i.add_argument("file", help="a .hurray or .safetensors file")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.add_argument("--verify", action="store_true",
                   help="also read every byte and check the data checksums and padding, as "
                        "hurray verify does (exit 2 naming the entry on a mismatch)")
    i.set_defaults(func=_cmd_inspect)

    c = sub.add_parser(
        "convert", help="convert safetensors <-> hurray (files and checkpoint folders), "
                        "and .npy/.npz -> hurray",
        description="Convert a file bit-exactly: safetensors -> hurray, hurray -> safetensors, "
                    ".npy/.npz -> hurray (and hurray -> hurray to re-lay out a file). A folder "
                    "(or a checkpoint index, *.index.json) converts the whole checkpoint into "
                    "the folder OUTPUT: each shard file, then the index with its file names "
                    "changed (model.safetensors.index.json <-> model.hurray.index.json). The "
                    "output is written atomically and, unless --no-fsync, durably (the file and "
                    "its folder are flushed to the disk). Formats come from the input's magic "
                    "bytes and the output's suffix unless given.")
    c.add_argument("input", help="the file, checkpoint folder or index to convert")
    c.add_argument("output", help="the file to write (.hurray or .safetensors), or the folder "
                                  "for a checkpoint")
    c.add_argument("--from", dest="from_format", choices=_FORMATS,
                   help="input format (default: detected)")
    c.add_argument("--to", dest="to_format", choices=("hurray", "safetensors"),
                   help="output format (default: from the output's suffix)")
    c.add_argument("--name", help="entry name for a .npy input (default: the file's stem)")
    c.add_argument("--alignment", type=_alignment, default=None,
                   help="buffer alignment in bytes for a Hurray output, from any input: a "
                        "power of two from 64 (the default) to 2097152")
    c.add_argument("--no-checksums", action="store_true",
                   help="do not store CRC-32 checksums of the data in a Hurray output")
    c.add_argument("--no-verify", action="store_true",
                   help="convert a Hurray input without checking its data checksums and padding "
                        "(by default they are checked as it is read, and a damaged input is "
                        "refused with nothing written)")
    c.add_argument("--no-fsync", action="store_true",
                   help="do not flush the output to the disk before and after renaming it into "
                        "place: faster, still atomic, but a crash soon after may lose the new "
                        "file (the old one, or nothing, is then left under its name)")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary")
    c.set_defaults(func=_cmd_convert)

    v = sub.add_parser(
        "verify", help="check every byte of Hurray files (exit status 2 on the first defect)",
        description="Validate each file completely: header, entry table, descriptors, buffer "
                    "placement, metadata, data checksums and padding. Prints OK per file; "
                    "a defect is reported on stderr with the entry and field it concerns, and "
                    "the exit status is 2. safetensors files get their header checked.")
    v.add_argument("files", nargs="+", metavar="FILE", help="files to verify")
    v.set_defaults(func=_cmd_verify)


def _cmd_check(args: argparse.Namespace) -> int:
    from .dtypes import dtype_from_name
    from .testing import CHECKS, CONSUMER_CHECKS, check_consumer, check_producer, load_factory
    from .testing._consumer import validate_consumer

    only = args.only
    try:
        if args.factory is None and args.consumer is None:
            raise ValueError("name what to check: MODULE:FACTORY, --consumer or both (hurray "
                             "check mylib.testing:make_tensor --consumer mylib:from_dlpack)")
        unknown = [c for c in only or () if c not in CHECKS and c not in CONSUMER_CHECKS]
        if unknown:
            raise ValueError(f"unknown check(s) {', '.join(unknown)}; the producer checks are "
                             f"{', '.join(CHECKS)}; the consumer checks are "
                             f"{', '.join(CONSUMER_CHECKS)}")
        factory = load_factory(args.factory) if args.factory is not None else None
        dtype = dtype_from_name(args.dtype).name
        if args.consumer is not None:
            validate_consumer(args.consumer, args.write, args.timeout)
    except (ValueError, HurrayError) as exc:
        print(_shown(f"hurray: error: {exc}"), file=sys.stderr)
        return 2
    reports = []
    if factory is not None:
        names = None if only is None else [c for c in only if c in CHECKS]
        if names is None or names:
            reports.append(check_producer(factory, dtype=dtype, checks=names,
                                          label=args.factory))
    if args.consumer is not None:
        names = None if only is None else [c for c in only if c in CONSUMER_CHECKS]
        if names is None or names:
            try:
                reports.append(check_consumer(args.consumer, write=args.write, checks=names,
                                              timeout=args.timeout))
            except ValueError as exc:  # the consumer stopped importing since it was validated
                print(f"hurray: error: {exc}", file=sys.stderr)
                return 2
    print("\n\n".join(map(str, reports)))
    return 1 if any(r.failed for r in reports) else 0


def _add_check_command(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser(
        "check", help="run the DLPack producer and/or consumer checks (exit status 1 on a "
                      "failure)",
        description="Import FACTORY from MODULE and run hurray_bridge.testing.check_producer on "
                    "it: versioned and legacy capsules, names, deleter, empty/rank-0/rank-64 "
                    "tensors, strides, read-only flag, copy, dl_device, stream. With --consumer, "
                    "run hurray_bridge.testing.check_consumer on a from_dlpack function, in "
                    "child processes: READ_ONLY honoured over a write-protected page, deleter "
                    "called once, copy= honoured. Prints one line per check; exit status 1 if a "
                    "check fails, 2 for bad input.")
    k.add_argument("factory", metavar="MODULE:FACTORY", nargs="?",
                   help="FACTORY(shape, dtype_name) -> DLPack producer, or FACTORY() -> one "
                        "fixed producer (the current directory is importable)")
    k.add_argument("--dtype", default="float32", help="element type passed to the factory")
    k.add_argument("--consumer", metavar="MODULE:FUNCTION",
                   help="a from_dlpack function to run the consumer checks on")
    k.add_argument("--write", metavar="MODULE:FUNCTION",
                   help="how to write into one of the consumer's arrays: FUNCTION(x) (default: "
                        "x[...] = 7.0)")
    k.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="time limit of each consumer check, in its child process (default 60)")
    k.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    k.set_defaults(func=_cmd_check)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from ._registry import ADAPTERS
    from .matrix import FORMATS

    p = argparse.ArgumentParser(prog="hurray", description="Hurray tensor interchange tools.")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("matrix", help="compatibility report across the installed frameworks",
                       description="Hand one tensor per element type across every pair of "
                                   "installed frameworks and report zero-copy, copies and "
                                   "refusals with their reasons and timings.")
    in_matrix = tuple(n for n, a in ADAPTERS.items() if not a.not_in_matrix)
    m.add_argument("--frameworks", nargs="+", metavar="NAME", choices=in_matrix,
                   help=f"a subset of {' '.join(in_matrix)} (default: the installed CPU ones)")
    m.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="element types (default: all)")
    m.add_argument("--size", type=_at_least_one, default=1024,
                   help="elements per sample tensor (>= 1; default 1024)")
    m.add_argument("--repeat", type=_at_least_one, default=15,
                   help="timed calls per cell, of which the median is reported (>= 1; default 15)")
    m.add_argument("--format", choices=FORMATS, default="text",
                   help="text (fits 100 columns), markdown, json (every cell, versions and "
                        "settings) or html (a self-contained page with a colour grid)")
    m.add_argument("--json", metavar="FILE", help="also write the JSON form to FILE")
    m.set_defaults(func=_cmd_matrix)
    _add_file_commands(sub)
    _add_check_command(sub)
    return p


# The exit status after the reader of our output went away (``hurray matrix | head``):
# 128 + SIGPIPE, what a shell reports for a Unix tool that the broken pipe stopped.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            args = build_parser().parse_args(argv)
            status = int(args.func(args))
        except HurrayError as exc:
            print(_shown(f"hurray: error: {exc}"), file=sys.stderr)
            status = 2
        except SystemExit:  # --help, --version and usage errors print too
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # a closed pipe shows here, not at exit where it cannot be caught
    except KeyboardInterrupt:  # where a command does not say more itself: no traceback
        return _interrupted()
    except BrokenPipeError:
        # Python's documented recipe (the signal module's notes on SIGPIPE): point stdout
        # at devnull so the interpreter's final flush does not raise again, and end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (a test's capture)
            pass
        finally:
            os.close(devnull)
        return EXIT_BROKEN_PIPE
    return status


def _interrupted() -> int:
    import signal

    try:  # a second Ctrl-C must not interrupt the message with a traceback
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # main() called off the main thread
        old = None
    try:
        print("hurray: interrupted", file=sys.stderr)
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)
    return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
