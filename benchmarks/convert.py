"""``hurray convert`` against a plain file copy of the same bytes (both directions).

One safetensors checkpoint (default 1 GiB, ``--small`` 64 MiB; the tensors of
``benchmarks.files``) is converted to Hurray and back, and each direction is
timed against ``shutil.copyfile`` of its input, in the same run, interleaved
round by round. Every output is removed before its timed call (untimed), so
no side pays for freeing a previous file's blocks.

- ``safetensors_to_hurray`` and ``hurray_to_safetensors`` as ``hurray convert``
  calls them (durable: fsync of the file and its directory; CRC-32 checksums
  written, or checked on the way back), against ``shutil.copyfile`` (neither)
  and ``shutil.copyfile`` + fsync (durable, no checksums);
- the ``hurray convert`` command itself (a new interpreter per call);
- peak resident memory of ``hurray convert`` (the child's ``VmHWM``) at the
  full size and at a quarter of it: memory that follows the file size shows as
  a ratio near 4.

``python -m benchmarks convert [--small]``; ``python -m benchmarks.convert --size 1.5GiB``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ._timing import Timing

DEFAULT_SIZE = 1 << 30
SMALL_SIZE = 64 << 20

_PEAK = """
import sys
from hurray_bridge.__main__ import main
status = main(sys.argv[1:])
with open("/proc/self/status") as f:
    hwm = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
print(hwm * 1024)
sys.exit(status)
"""


def _write(path: str, size: int) -> int:
    from safetensors.numpy import save_file

    from .files import _checkpoint

    tensors = _checkpoint(size, 200)
    save_file(tensors, path, {"bench": "convert"})
    return os.path.getsize(path)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fresh(out: str) -> None:
    if os.path.exists(out):
        os.unlink(out)


def _rounds(cases: dict[str, tuple[Callable[[], object], str]], repeat: int) -> list[Timing]:
    """Median seconds of each case over ``repeat`` rounds, cases interleaved per round."""
    samples: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeat):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fn, out = cases[name]
            _fresh(out)
            os.sync()  # everyone starts with nothing dirty to write back
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    out_t = []
    for name, s in samples.items():
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0], s[0], s[0]]
        out_t.append(Timing(name, statistics.median(s) * 1e6, (q[2] - q[0]) * 1e6, 1))
    return out_t


def _peak_rss(*argv: str) -> int:
    res = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True,
                         timeout=600, check=True)
    return int(res.stdout.split()[-1])


def run(size: int | None = None, small: bool = False,
        directory: str | None = None) -> dict[str, Any]:
    from hurray_bridge import safetensors_io as sio

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    repeat = 5 if small else 3
    tmp = tempfile.mkdtemp(prefix="hurray-convert-", dir=directory)
    st, hr = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "in.hurray")
    st_out, hr_out = os.path.join(tmp, "out.safetensors"), os.path.join(tmp, "out.hurray")
    copy_out = os.path.join(tmp, "copy.bin")
    cli = [sys.executable, "-m", "hurray_bridge", "convert", "-q"]
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    try:
        nbytes = _write(st, size)
        sio.safetensors_to_hurray(st, hr)
        assert sio.hurray_to_safetensors(hr, st_out) and _same(st, st_out)

        def copy_st() -> None:
            shutil.copyfile(st, copy_out)

        def copy_st_fsync() -> None:
            shutil.copyfile(st, copy_out)
            _fsync_file(copy_out)

        def copy_hr() -> None:
            shutil.copyfile(hr, copy_out)

        mib = nbytes >> 20
        names = (f"shutil.copyfile of the safetensors input ({mib} MiB)",
                 "shutil.copyfile + fsync (durable, no checksums)",
                 "shutil.copyfile of the Hurray input",
                 "safetensors -> hurray (fsync, checksums written)",
                 "hurray -> safetensors (fsync, checksums checked)",
                 "hurray convert safetensors -> hurray (new process)",
                 "hurray convert hurray -> safetensors (new process)")
        calls: tuple[tuple[Callable[[], object], str], ...] = (
            (copy_st, copy_out), (copy_st_fsync, copy_out), (copy_hr, copy_out),
            (lambda: sio.safetensors_to_hurray(st, hr_out), hr_out),
            (lambda: sio.hurray_to_safetensors(hr, st_out), st_out),
            (lambda: subprocess.run([*cli, st, hr_out], check=True), hr_out),
            (lambda: subprocess.run([*cli, hr, st_out], check=True), st_out))
        timings = _rounds(dict(zip(names, calls)), repeat)
        results["timings"] = [t.as_dict() for t in timings]
        cp_st, cp_sync, cp_hr, to_h, to_s, cli_to, cli_back = (t.median_us for t in timings)
        r = results["ratios"]
        r["safetensors_to_hurray_vs_copyfile"] = {"value": to_h / cp_st, "goal": "<= 1.2"}
        r["hurray_to_safetensors_vs_copyfile"] = {"value": to_s / cp_hr, "goal": "<= 1.2"}
        r["safetensors_to_hurray_vs_durable_copy"] = {"value": to_h / cp_sync,
                                                      "goal": "informational"}
        r["hurray_to_safetensors_vs_durable_copy"] = {"value": to_s / cp_sync,
                                                      "goal": "informational"}
        r["cli_safetensors_to_hurray_vs_copyfile"] = {"value": cli_to / cp_st,
                                                      "goal": "informational"}
        r["cli_hurray_to_safetensors_vs_copyfile"] = {"value": cli_back / cp_hr,
                                                      "goal": "informational"}
        if os.path.exists("/proc/self/status"):
            peaks = {}
            for label, n in (("full", size), ("quarter", size // 4)):
                src = os.path.join(tmp, f"{label}.safetensors")
                _write(src, n)
                mid = os.path.join(tmp, f"{label}.hurray")
                _fresh(mid)
                to = _peak_rss("convert", "-q", src, mid)
                _fresh(os.path.join(tmp, "back.safetensors"))
                back = _peak_rss("convert", "-q", mid, os.path.join(tmp, "back.safetensors"))
                peaks[label] = (to, back, os.path.getsize(src))
                os.unlink(src)
                os.unlink(mid)
            (f_to, f_back, f_n), (q_to, q_back, q_n) = peaks["full"], peaks["quarter"]
            results["notes"].append(
                f"peak RSS of hurray convert: safetensors -> hurray {f_to >> 20} MiB at "
                f"{f_n >> 20} MiB, {q_to >> 20} MiB at {q_n >> 20} MiB; back "
                f"{f_back >> 20} / {q_back >> 20} MiB")
            r["peak_rss_full_vs_quarter_to_hurray"] = {"value": f_to / q_to, "goal": "<= 1.2"}
            r["peak_rss_full_vs_quarter_to_safetensors"] = {"value": f_back / q_back,
                                                            "goal": "<= 1.2"}
        for v in r.values():
            goal = str(v["goal"])
            if goal.startswith("<= "):
                v["met"] = v["value"] <= float(goal[3:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _same(a: str, b: str) -> bool:
    import filecmp

    return filecmp.cmp(a, b, shallow=False)


def main() -> int:
    from .files import _size

    p = argparse.ArgumentParser(prog="python -m benchmarks.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=_size, default=None, help="checkpoint size, e.g. 1.5GiB")
    p.add_argument("--small", action="store_true", help=f"{SMALL_SIZE >> 20} MiB, quickly")
    p.add_argument("--dir", default=None, help="where to write the files (default: $TMPDIR)")
    args = p.parse_args()
    res = run(args.size, args.small, args.dir)
    for note in res["notes"]:
        print(f"  note: {note}")
    for t in res["timings"]:
        print(f"  {t['name']:<58} {t['median_us'] / 1e3:10.1f} ms  (IQR {t['iqr_us'] / 1e3:.1f})")
    for k, r in res["ratios"].items():
        met = {True: "met", False: "NOT MET"}.get(r.get("met"), "")  # type: ignore[arg-type]
        print(f"  ratio {k:<44} {r['value']:8.3f}   goal {r['goal']} {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
