"""The `dualjax` command line: demo, benchmarks (and, as they land, run/verify/report/sim/plan)."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES = {"model": "benchmarks.model", "kvstore": "benchmarks.kvstore"}


def _bench(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: dualjax bench {{{','.join(BENCHES)}}} [--json FILE] [--quick] ...", file=sys.stderr)
        return 2
    importlib.import_module(BENCHES[argv[0]]).main(argv[1:])
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="dualjax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a small agentic workload on an embedded cluster")
    demo.add_argument("--quick", action="store_true", help="fewer agents and turns (CI smoke run)")
    demo.add_argument("--out", default=None, help="output directory (default: a temp dir)")
    sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCHES)}", add_help=False)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dualjax.demo import main as demo_main
        return demo_main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
