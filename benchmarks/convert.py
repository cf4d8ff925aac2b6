"""``hurray convert`` against a plain file copy of the same bytes (both directions).

One safetensors checkpoint (default 1 GiB, ``--small`` 64 MiB; the tensors of
``benchmarks.files``) is converted to Hurray and back, and each direction is
timed against ``shutil.copyfile`` of its input, in the same run, interleaved
round by round. Every output is removed before its timed call (untimed), so
no side pays for freeing a previous file's blocks.

- ``safetensors_to_hurray`` and ``hurray_to_safetensors`` as ``hurray convert``
  calls them (durable: fsync of the file and its directory; CRC-32 checksums
  written, or checked on the way back) against ``shutil.copyfile`` + fsync of
  the same input (durable, no checksums), and with ``fsync=False``
  (``hurray convert --no-fsync``) against plain ``shutil.copyfile``;
- the ``hurray convert`` command itself (a new interpreter per call);
- peak resident memory of ``hurray convert`` (the child's ``VmHWM``) at the
  full size and at a quarter of it: memory that follows the file size shows as
  a ratio near 4.

The time goals are judged on *quiet* calls: on a VM whose kernel hands free memory
back to the host (free page reporting, counted in ``reported_kib``), a call that
such a burst overlaps is slow whatever it does; it is run again, and every round's
first call is reported beside (``all_rounds_*``). See :func:`_rounds`.

``--baseline DIR`` (or ``HURRAY_BENCH_BASELINE``) also times the library calls
of another checkout (say ``git worktree add /tmp/base HEAD~1``) in a child
interpreter, in the same rounds, and its peak memory: before and after in one run.

``python -m benchmarks convert [--small]``;
``python -m benchmarks.convert --size 1.5GiB [--baseline DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, NamedTuple

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


_SERVE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import hurray_bridge
from hurray_bridge import safetensors_io as sio
print(hurray_bridge.__file__, flush=True)
import resource
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
for line in sys.stdin:
    fn, src, dst, fsync = json.loads(line)
    c0 = cpu()
    getattr(sio, fn)(src, dst, fsync=fsync)
    print(cpu() - c0, flush=True)
"""


class _Baseline:
    """The library of another checkout, in a child interpreter that runs one call per line."""

    def __init__(self, tree: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, tree], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, cwd=tree)
        assert self.proc.stdout is not None
        self.module = self.proc.stdout.readline().strip()
        if not self.module.startswith(os.path.abspath(tree)):
            self.close()
            raise RuntimeError(f"the baseline imported {self.module}, not {tree}'s hurray_bridge")

    def call(self, fn: str, src: str, dst: str, fsync: bool) -> float:
        """Run ``sio.fn(src, dst, fsync=fsync)`` there; its CPU seconds."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([fn, src, dst, fsync]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if not line:
            raise RuntimeError(f"the baseline's {fn} failed")
        return float(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _write(path: str, size: int, count: int = 200) -> int:
    from safetensors.numpy import save_file

    from .files import _checkpoint

    tensors = _checkpoint(size, count)
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


def _stages(src: str, out: str, repeat: int) -> dict[str, float]:
    """Median ms of each stage of a copy with checksums, alone: reading ``src`` into one 4 MiB
    buffer (os.preadv), CRC-32 of it from that buffer (zlib's, and the one the writers use:
    the compiled one where built), writing as many bytes to a new file."""
    import zlib

    from hurray_bridge.files import checksums

    size = os.path.getsize(src)
    buf = memoryview(bytearray(4 << 20))
    times: dict[str, list[float]] = {"read": [], "crc32 (zlib)": [], "crc32 (as written)": [],
                                     "write": []}
    for _ in range(repeat):
        fd = os.open(src, os.O_RDONLY)
        t0 = time.perf_counter()
        off = 0
        while off < size:
            off += os.preadv(fd, [buf[:min(len(buf), size - off)]], off)
        t1 = time.perf_counter()
        crc = 0
        for _ in range(size // len(buf)):
            crc = zlib.crc32(buf, crc)
        t2 = time.perf_counter()
        crc = 0
        for _ in range(size // len(buf)):
            crc = checksums.crc32(buf, crc)
        t2b = time.perf_counter()
        os.close(fd)
        os.sync()
        _fresh(out)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        t3 = time.perf_counter()
        off = 0
        while off < size:
            off += os.write(fd, buf[:min(len(buf), size - off)])
        t4 = time.perf_counter()
        os.close(fd)
        for k, v in (("read", t1 - t0), ("crc32 (zlib)", t2 - t1), ("crc32 (as written)", t2b - t2),
                     ("write", t4 - t3)):
            times[k].append(v * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children, every thread counted."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_REPORTED = "/sys/module/page_reporting/parameters/reported_kib"
_RETRIES = 3  # runs again of a call the host disturbed


def _reported_kib() -> int | None:
    """KiB of free memory this guest has handed back to its host so far (Linux's free page
    reporting, as in Firecracker VMs), or None where the kernel does not say."""
    try:
        with open(_REPORTED) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


class _Rounds(NamedTuple):
    timings: list[Timing]  # median and IQR of every round
    cpu_us: dict[str, float]  # median CPU time (all threads, children waited for)
    best_us: dict[str, float]  # the fastest round
    quiet_us: dict[str, float | None]  # median of the calls the host reclaimed nothing in
    quiet_rounds: dict[str, int]  # the rounds with such a call


def _rounds(cases: dict[str, tuple[Callable[[], object], str]], repeat: int,
            quiet_kib: int, retries: int = _RETRIES) -> _Rounds:
    """Each case ``repeat`` times, interleaved per round (every other round in reverse).

    Besides the median of all rounds, the median CPU seconds (on a shared machine the wall
    clock of a parallel copy depends on the cores others leave free, its CPU time much less)
    and the fastest round, it reports the median of the *quiet* rounds: those during which
    the guest handed no more than ``quiet_kib`` of memory back to its host. On a VM with
    free page reporting the kernel does that in bursts, whichever process freed the memory,
    and a 1 GiB copy overlapped by one takes 2-4x as long (~0.35 s against 0.7-1.8 s: the
    reporting thread takes a core and the pages it reported must be backed again). The
    counter says which rounds that was; where the kernel has no counter every round is quiet.
    A disturbed call is run again, up to ``retries`` times, for a quiet sample of its round;
    the other figures are of each round's first call. A case whose call returns a float
    reports its own CPU seconds."""
    samples: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    quiet: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeat):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fn, out = cases[name]
            for attempt in range(1 + retries):
                os.sync()  # everyone starts with nothing dirty to write back
                # Deleted only now, right before the call: memory freed a second or more
                # before it (an unlink followed by a long sync) has been handed back to the
                # host, so the call's page cache must be backed again (a 1 GiB copy: ~0.4 s
                # just after the unlink, 2.4-4.8 s 3 s after it).
                k0 = _reported_kib()
                _fresh(out)
                c0 = _cpu()
                t0 = time.perf_counter()
                got = fn()
                dt = time.perf_counter() - t0
                k1 = _reported_kib()
                if attempt == 0:
                    samples[name].append(dt)
                    cpu[name].append(got if isinstance(got, float) else _cpu() - c0)
                if k0 is None or k1 is None or k1 - k0 <= quiet_kib:
                    quiet[name].append(dt)
                    break
    out_t = []
    for name, s in samples.items():
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0], s[0], s[0]]
        out_t.append(Timing(name, statistics.median(s) * 1e6, (q[2] - q[0]) * 1e6, 1))
    return _Rounds(out_t, {k: statistics.median(v) * 1e6 for k, v in cpu.items()},
                   {k: min(v) * 1e6 for k, v in samples.items()},
                   {k: statistics.median(v) * 1e6 if v else None for k, v in quiet.items()},
                   {k: len(v) for k, v in quiet.items()})


def _peak_rss(*argv: str, tree: str | None = None) -> int:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.path.abspath(tree)
    res = subprocess.run([sys.executable, "-c", _PEAK, *argv], capture_output=True, text=True,
                         timeout=600, check=True, env=env, cwd=tree)
    return int(res.stdout.split()[-1])


def run(size: int | None = None, small: bool = False, directory: str | None = None,
        baseline: str | None = None, repeat: int | None = None,
        tensors: int = 200) -> dict[str, Any]:
    from hurray_bridge import safetensors_io as sio

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    baseline = baseline or os.environ.get("HURRAY_BENCH_BASELINE") or None
    repeat = repeat or (9 if small else 7)
    tmp = tempfile.mkdtemp(prefix="hurray-convert-", dir=directory)
    st, hr = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "in.hurray")
    st_out, hr_out = os.path.join(tmp, "out.safetensors"), os.path.join(tmp, "out.hurray")
    copy_out = os.path.join(tmp, "copy.bin")
    cli = [sys.executable, "-m", "hurray_bridge", "convert", "-q"]
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    base = _Baseline(baseline) if baseline else None
    try:
        nbytes = _write(st, size, tensors)
        sio.safetensors_to_hurray(st, hr)
        assert sio.hurray_to_safetensors(hr, st_out) and _same(st, st_out)

        def copy(src: str, durable: bool) -> Callable[[], None]:
            def call() -> None:
                shutil.copyfile(src, copy_out)
                if durable:
                    _fsync_file(copy_out)
            return call

        mib = nbytes >> 20
        cases: dict[str, tuple[Callable[[], object], str]] = {
            f"shutil.copyfile of the safetensors input ({mib} MiB)": (copy(st, False), copy_out),
            "shutil.copyfile + fsync of it (durable, no checksums)": (copy(st, True), copy_out),
            "shutil.copyfile of the Hurray input": (copy(hr, False), copy_out),
            "shutil.copyfile + fsync of it": (copy(hr, True), copy_out),
            "safetensors -> hurray (fsync, checksums written)": (
                lambda: sio.safetensors_to_hurray(st, hr_out), hr_out),
            "safetensors -> hurray, fsync=False": (
                lambda: sio.safetensors_to_hurray(st, hr_out, fsync=False), hr_out),
            "hurray -> safetensors (fsync, checksums checked)": (
                lambda: sio.hurray_to_safetensors(hr, st_out), st_out),
            "hurray -> safetensors, fsync=False": (
                lambda: sio.hurray_to_safetensors(hr, st_out, fsync=False), st_out),
            "safetensors -> hurray, fsync=False, no checksums (the copy alone)": (
                lambda: sio.safetensors_to_hurray(st, hr_out, fsync=False, checksums=False),
                hr_out),
            "hurray -> safetensors, fsync=False, verify=False (the copy alone)": (
                lambda: sio.hurray_to_safetensors(hr, st_out, fsync=False, verify=False),
                st_out),
            "hurray convert safetensors -> hurray (new process)": (
                lambda: subprocess.run([*cli, st, hr_out], check=True), hr_out),
            "hurray convert hurray -> safetensors (new process)": (
                lambda: subprocess.run([*cli, hr, st_out], check=True), st_out),
        }
        if base is not None:
            b = base
            results["notes"].append(f"baseline: {b.module}")
            cases.update({
                "baseline: safetensors -> hurray (fsync)": (
                    lambda: b.call("safetensors_to_hurray", st, hr_out, True), hr_out),
                "baseline: safetensors -> hurray, fsync=False": (
                    lambda: b.call("safetensors_to_hurray", st, hr_out, False), hr_out),
                "baseline: hurray -> safetensors (fsync)": (
                    lambda: b.call("hurray_to_safetensors", hr, st_out, True), st_out),
                "baseline: hurray -> safetensors, fsync=False": (
                    lambda: b.call("hurray_to_safetensors", hr, st_out, False), st_out),
            })
        # A round is quiet if the host took back no more than 1% of the file during it.
        rounds = _rounds(cases, repeat, quiet_kib=nbytes // 100 >> 10)
        timings, cpu, best = rounds.timings, rounds.cpu_us, rounds.best_us
        results["timings"] = [t.as_dict() for t in timings]
        results["cpu_us"] = cpu
        results["best_us"] = best
        results["quiet_us"] = rounds.quiet_us
        results["quiet_rounds"] = rounds.quiet_rounds
        counted = _reported_kib() is not None
        results["notes"].append(
            "quiet rounds (the host reclaimed <= 1% of the file's size during a call; a "
            f"disturbed call is run again, up to {_RETRIES} times), per case: "
            + ", ".join(str(n) for n in rounds.quiet_rounds.values()) + f" of {repeat}"
            if counted else "this kernel does not count reclaimed memory: every round counts")
        stages = _stages(st, copy_out, repeat)
        results["stages_ms"] = stages
        results["notes"].append(
            "stages alone (safetensors input, 4 MiB buffer): " + ", ".join(
                f"{k} {v:.1f} ms" for k, v in stages.items()))
        us = [t.median_us for t in timings]
        cp_st, cp_st_sync, cp_hr, cp_hr_sync, to_h, _, to_s, _ = us[:8]
        copy_to, copy_back, cli_to, cli_back = us[8:12]
        r = results["ratios"]

        def ratio(name: str, value: float, goal: str = "informational") -> None:
            r[name] = {"value": value, "goal": goal}

        names = list(cases)
        enough = max(3, (repeat + 1) // 2)

        def goal_ratio(name: str, num: int, den: int) -> None:
            """The goal on the quiet rounds' medians where both cases have enough of them
            (half the rounds, three at least), else on every round's; the other beside it."""
            a, b = names[num], names[den]
            qa, qb = rounds.quiet_us[a], rounds.quiet_us[b]
            every = us[num] / us[den]
            quiet_ok = (counted and qa is not None and qb is not None
                        and min(rounds.quiet_rounds[a], rounds.quiet_rounds[b]) >= enough)
            if quiet_ok:
                assert qa is not None and qb is not None
                ratio(name, qa / qb, "<= 1.2")
                ratio(f"all_rounds_{name}", every)
            else:
                ratio(name, every, "<= 1.2")
                if counted:
                    results["notes"].append(f"{name}: too few quiet rounds "
                                            f"({rounds.quiet_rounds[a]}, "
                                            f"{rounds.quiet_rounds[b]} of {repeat}), judged on all")

        goal_ratio("safetensors_to_hurray_vs_durable_copy", 4, 1)
        goal_ratio("hurray_to_safetensors_vs_durable_copy", 6, 3)
        goal_ratio("safetensors_to_hurray_no_fsync_vs_copyfile", 5, 0)
        goal_ratio("hurray_to_safetensors_no_fsync_vs_copyfile", 7, 2)
        b = list(best.values())
        ratio("best_round_safetensors_to_hurray_vs_durable_copy", b[4] / b[1])
        ratio("best_round_hurray_to_safetensors_vs_durable_copy", b[6] / b[3])
        ratio("best_round_safetensors_to_hurray_no_fsync_vs_copyfile", b[5] / b[0])
        ratio("best_round_hurray_to_safetensors_no_fsync_vs_copyfile", b[7] / b[2])
        ratio("safetensors_to_hurray_durable_vs_copyfile", to_h / cp_st)
        ratio("hurray_to_safetensors_durable_vs_copyfile", to_s / cp_hr)
        c = list(cpu.values())
        ratio("cpu_safetensors_to_hurray_no_fsync_vs_copyfile", c[5] / c[0])
        ratio("cpu_hurray_to_safetensors_no_fsync_vs_copyfile", c[7] / c[2])
        ratio("copy_alone_safetensors_to_hurray_vs_copyfile", copy_to / cp_st)
        ratio("copy_alone_hurray_to_safetensors_vs_copyfile", copy_back / cp_hr)
        ratio("cli_safetensors_to_hurray_vs_durable_copy", cli_to / cp_st_sync)
        ratio("cli_hurray_to_safetensors_vs_durable_copy", cli_back / cp_hr_sync)
        if base is not None:
            b_to, b_to_nosync, b_back, b_back_nosync = us[12:16]
            ratio("baseline_best_round_safetensors_to_hurray_no_fsync_vs_copyfile",
                  b[13] / b[0])
            ratio("baseline_best_round_hurray_to_safetensors_no_fsync_vs_copyfile",
                  b[15] / b[2])
            ratio("baseline_safetensors_to_hurray_vs_durable_copy", b_to / cp_st_sync)
            ratio("baseline_hurray_to_safetensors_vs_durable_copy", b_back / cp_hr_sync)
            ratio("baseline_safetensors_to_hurray_no_fsync_vs_copyfile", b_to_nosync / cp_st)
            ratio("baseline_hurray_to_safetensors_no_fsync_vs_copyfile", b_back_nosync / cp_hr)
            ratio("baseline_cpu_safetensors_to_hurray_no_fsync_vs_copyfile", c[13] / c[0])
            ratio("baseline_cpu_hurray_to_safetensors_no_fsync_vs_copyfile", c[15] / c[2])
        if os.path.exists("/proc/self/status"):
            trees: list[tuple[str, str | None]] = [("", None)]
            if baseline:
                trees.append(("baseline_", baseline))
            for prefix, tree in trees:
                peaks = {}
                for label, n in (("full", size), ("quarter", size // 4)):
                    src = os.path.join(tmp, f"{label}.safetensors")
                    _write(src, n)
                    mid = os.path.join(tmp, f"{label}.hurray")
                    back_path = os.path.join(tmp, "back.safetensors")
                    _fresh(mid)
                    to = _peak_rss("convert", "-q", src, mid, tree=tree)
                    _fresh(back_path)
                    back = _peak_rss("convert", "-q", mid, back_path, tree=tree)
                    peaks[label] = (to, back, os.path.getsize(src))
                    os.unlink(src)
                    os.unlink(mid)
                (f_to, f_back, f_n), (q_to, q_back, q_n) = peaks["full"], peaks["quarter"]
                results["notes"].append(
                    f"{prefix.replace('_', ': ')}peak RSS of hurray convert: safetensors -> "
                    f"hurray {f_to >> 20} MiB at {f_n >> 20} MiB, {q_to >> 20} MiB at "
                    f"{q_n >> 20} MiB; back {f_back >> 20} / {q_back >> 20} MiB")
                goal = "informational" if prefix else "<= 1.2"
                ratio(f"{prefix}peak_rss_full_vs_quarter_to_hurray", f_to / q_to, goal)
                ratio(f"{prefix}peak_rss_full_vs_quarter_to_safetensors", f_back / q_back, goal)
        for v in r.values():
            goal = str(v["goal"])
            if goal.startswith("<= "):
                v["met"] = v["value"] <= float(goal[3:])
    finally:
        if base is not None:
            base.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def _same(a: str, b: str) -> bool:
    import filecmp

    return filecmp.cmp(a, b, shallow=False)


def main() -> int:
    from ._timing import parse_size as _size

    p = argparse.ArgumentParser(prog="python -m benchmarks.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=_size, default=None, help="checkpoint size, e.g. 1.5GiB")
    p.add_argument("--small", action="store_true", help=f"{SMALL_SIZE >> 20} MiB, quickly")
    p.add_argument("--dir", default=None, help="where to write the files (default: $TMPDIR)")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="also time the library of the checkout in DIR, in the same rounds")
    p.add_argument("--repeat", type=int, default=None, help="rounds (default 7; 9 with --small)")
    p.add_argument("--tensors", type=int, default=200,
                   help="tensors in the file (default 200; 1: one tensor holds it all)")
    args = p.parse_args()
    if args.tensors < 1:
        p.error(f"--tensors must be 1 or more, got {args.tensors}")
    res = run(args.size, args.small, args.dir, args.baseline, args.repeat, args.tensors)
    for note in res["notes"]:
        print(f"  note: {note}")
    for t in res["timings"]:
        cpu = res["cpu_us"][t["name"]] / 1e3
        quiet = res["quiet_us"][t["name"]]
        quiet_s = "-" if quiet is None else f"{quiet / 1e3:.1f}"
        print(f"  {t['name']:<66} {t['median_us'] / 1e3:8.1f} ms  (IQR {t['iqr_us'] / 1e3:6.1f}"
              f", best {res['best_us'][t['name']] / 1e3:6.1f}, quiet {quiet_s} in "
              f"{res['quiet_rounds'][t['name']]})  CPU {cpu:7.1f} ms")
    for k, r in res["ratios"].items():
        met = {True: "met", False: "NOT MET"}.get(r.get("met"), "")  # type: ignore[arg-type]
        print(f"  ratio {k:<44} {r['value']:8.3f}   goal {r['goal']} {met}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
