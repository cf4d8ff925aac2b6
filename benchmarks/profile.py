"""Where a hand-off's time goes: per-stage timings and a cProfile summary per pair.

``python -m benchmarks.profile [SRC->TARGET ...] [--top N]``, e.g.
``python -m benchmarks.profile torch->jax jax->numpy``; no pair means every CPU pair.

For each pair (1000 float32, as in the handoff suite) it prints the median time of
``hb.convert(x, target)`` and whether a learned shortcut served it
(``hurray_bridge._shortcuts``); of the full path (``hb.convert.general``), split
into the source adapter's ``to_hurray(x)``, the target adapter's
``from_hurray(t)`` and the remainder (dispatch in ``hb.convert`` and
``hb.asarray``); the target's direct import; and the functions with the most own
time under cProfile (which inflates small Python functions, and does not see the
compiled front: read it for ranks, not for absolute numbers). Not a suite: it
prints, it measures no goal.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import warnings
from typing import Any

import hurray_bridge as hb
from hurray_bridge import _shortcuts
from hurray_bridge._registry import get_adapter

from . import _frameworks as fw
from ._timing import measure

N = 1000


def profile_pair(src: str, target: str, x: Any, top: int = 8) -> str:
    to_a, from_a = get_adapter(src), get_adapter(target)
    t = to_a.to_hurray(x)
    dname, dfn = fw.direct(target)
    try:
        dfn(x)
    except Exception:
        fb = fw.direct_fallback(target)
        dname, dfn = fb if fb is not None else (dname, None)
    general = hb.convert.general  # type: ignore[attr-defined]
    hb.convert(x, target)  # the full path runs once and learns the pair
    entry = _shortcuts.TABLE.get(type(x), {}).get(target)
    served = entry is not None and _shortcuts.serves(x, target)
    how = f"shortcut {getattr(entry[0], '__qualname__', entry[0])}" if served else "full path"
    total = measure("convert", lambda: hb.convert(x, target), repeat=9).median_us
    full = measure("general", lambda: general(x, target), repeat=9).median_us
    to_us = measure("to", lambda: to_a.to_hurray(x), repeat=9).median_us
    from_us = measure("from", lambda: from_a.from_hurray(t), repeat=9).median_us
    direct_us = measure("direct", lambda: dfn(x), repeat=9).median_us if dfn else float("nan")
    lines = [
        f"{src}->{target}: hb.convert {total:.2f} us ({how}); {dname} {direct_us:.2f} us "
        f"(ratio {total / direct_us:.2f})",
        f"    full path {full:.2f} us = {src}.to_hurray {to_us:.2f} + {target}.from_hurray "
        f"{from_us:.2f} + dispatch {full - to_us - from_us:.2f}",
    ]
    n = 3000
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        hb.convert(x, target)
    pr.disable()
    stats = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (path, line, func), (_cc, nc, tt, ct, _callers) in rows:
        where = path.split("site-packages/")[-1]
        for marker in ("/hurray_bridge/", "/adapters/"):
            if marker in where:
                where = marker.strip("/") + "/" + where.split(marker, 1)[1]
        lines.append(f"    {tt / n * 1e6:6.2f} us own {ct / n * 1e6:7.2f} us cum {nc // n:>3}x "
                     f"{func} ({where}:{line})")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    p.add_argument("pairs", nargs="*", help="SRC->TARGET, e.g. torch->jax")
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    srcs = fw.native_sources(N)
    pairs = [tuple(pp.split("->")) for pp in args.pairs] or [
        (s, t) for s in srcs for t in srcs if s != t]
    warnings.simplefilter("ignore")
    for src, target in pairs:
        print(profile_pair(src, target, srcs[src], args.top))


if __name__ == "__main__":
    main()
