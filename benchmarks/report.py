"""Markdown tables from the JSON that ``python -m benchmarks`` writes (for docs/benchmarks.md).

``python -m benchmarks.report benchmarks/results/latest.json [--before OLD.json]``
prints one table of ratios per suite (with a "before" column when given) and the
hand-off times per pair.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _fmt(v: Any) -> str:
    return "n/a" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def _status(r: dict[str, Any]) -> str:
    met = r.get("met")
    return {True: "met", False: "**not met**", None: ""}[met]


def ratios_table(after: dict[str, Any], before: dict[str, Any] | None, suite: str) -> str:
    res = after.get(suite)
    if not res or not res.get("ratios"):
        return ""
    old = (before or {}).get(suite, {}).get("ratios", {})
    head = "| ratio | " + ("before | " if before else "") + "now | goal | |"
    rule = "|---|" + ("---:|" if before else "") + "---:|---|---|"
    rows = [head, rule]
    for name, r in res["ratios"].items():
        cells = [name]
        if before:
            cells.append(_fmt(old.get(name, {}).get("value")))
        cells += [_fmt(r.get("value")), str(r.get("goal")), _status(r)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def handoff_times(after: dict[str, Any]) -> str:
    res = after.get("handoff")
    if not res:
        return ""
    rows = ["| pair | hb.convert (us) | direct (us) | direct path |", "|---|---:|---:|---|"]
    ts = res["timings"]
    for a, b in zip(ts[::2], ts[1::2], strict=True):
        pair = a["name"].split()[-1]
        direct = b["name"].rsplit(" ", 1)[0]
        rows.append(f"| {pair} | {a['median_us']:.2f} | {b['median_us']:.2f} | `{direct}` |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report")
    p.add_argument("after")
    p.add_argument("--before")
    args = p.parse_args()
    with open(args.after) as f:
        after = json.load(f)
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    print("machine:", json.dumps(after.get("machine", {})))
    for suite in ("handoff", "size", "statedict", "codec", "files", "peers"):
        table = ratios_table(after, before, suite)
        if table:
            print(f"\n### {suite}\n\n{table}")
    times = handoff_times(after)
    if times:
        print(f"\n### handoff times\n\n{times}")


if __name__ == "__main__":
    main()
