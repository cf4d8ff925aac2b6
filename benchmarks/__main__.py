"""``python -m benchmarks [--json FILE] [suite ...]``: print a table, write JSON."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import platform
import sys

SUITES = ("codec", "files")


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("suites", nargs="*", default=list(SUITES), help=f"any of {SUITES}")
    p.add_argument("--json", default="benchmarks/results/latest.json")
    p.add_argument("--small", action="store_true",
                   help="quick runs at reduced sizes (suites whose run() takes small=)")
    args = p.parse_args()
    out: dict[str, object] = {"machine": {"python": sys.version.split()[0],
                                          "platform": platform.platform(),
                                          "processor": platform.processor()}}
    for name in args.suites:
        run = importlib.import_module(f"benchmarks.{name}").run
        takes_small = "small" in inspect.signature(run).parameters
        res = run(small=True) if args.small and takes_small else run()
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
