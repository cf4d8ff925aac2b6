"""The ``hurray`` command line (also ``python -m hurray_bridge``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .errors import HurrayError

__all__ = ["main"]


def _cmd_matrix(args: argparse.Namespace) -> int:
    from .dtypes import dtype_from_name
    from .matrix import available_frameworks, cells_as_dicts, format_report, run_matrix

    frameworks = args.frameworks or available_frameworks()
    if not frameworks:
        print("no supported framework is installed; pip install 'hurray-bridge[all]'",
              file=sys.stderr)
        return 2
    dtypes = [dtype_from_name(d) for d in args.dtypes] if args.dtypes else None
    print(f"frameworks: {', '.join(frameworks)}", flush=True)
    cells = run_matrix(frameworks, dtypes, n=args.size, repeat=args.repeat)
    print(format_report(cells))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(cells_as_dicts(cells), f, indent=1)
    return 1 if any(c.outcome == "wrong" for c in cells) else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hurray", description="Hurray tensor interchange tools.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("matrix", help="compatibility report across the installed frameworks",
                       description="Hand one tensor per element type across every pair of "
                                   "installed frameworks and report zero-copy, copies and "
                                   "refusals with their reasons and timings.")
    m.add_argument("--frameworks", nargs="+", metavar="NAME",
                   help="subset of numpy torch jax arrow cupy (default: all installed)")
    m.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="element types (default: all)")
    m.add_argument("--size", type=int, default=1024, help="elements per sample tensor")
    m.add_argument("--repeat", type=int, default=15, help="timed repetitions per cell")
    m.add_argument("--json", metavar="FILE", help="also write the cells as JSON")
    m.set_defaults(func=_cmd_matrix)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except HurrayError as exc:
        print(f"hurray: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
