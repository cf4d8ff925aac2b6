"""``python -m benchmarks [--json FILE] [suite ...]``: print a table, write JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys

SUITES = ("codec",)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("suites", nargs="*", default=list(SUITES), help=f"any of {SUITES}")
    p.add_argument("--json", default="benchmarks/results/latest.json")
    args = p.parse_args()
    out: dict[str, object] = {"machine": {"python": sys.version.split()[0],
                                          "platform": platform.platform(),
                                          "processor": platform.processor()}}
    for name in args.suites:
        res = importlib.import_module(f"benchmarks.{name}").run()
        out[name] = res
        print(f"== {name}")
        for t in res["timings"]:
            print(f"  {t['name']:<48} {t['median_us']:10.2f} us  (IQR {t['iqr_us']:.2f})")
        for k, r in res["ratios"].items():
            print(f"  ratio {k:<42} {r['value']:10.3f}   goal {r['goal']}")
    import os

    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
