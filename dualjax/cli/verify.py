"""`dualjax verify`: bit-identical tokens across read paths, plans, deadlines, layerwise modes and launchers
(`dualjax.runtime.verify` runs and compares them); `--hostfile` across hosts. It prints a line per run as
it ends (`--quiet`: none) and the comparison's summary, one JSON object."""

from __future__ import annotations

import json
import os
import sys

from dualjax.core.config import ConfigError
from dualjax.outputs import write_json
from dualjax.runtime.verify import verify


def hosts_arg(text: str | None) -> int | str | None:
    """`--hostfile`: a number of namespaced hosts (>= 2), or a hostfile (or `slurm`), whose hosts are read
    now: a hostfile that lists none is refused before the reference runs."""
    from dualjax.runtime.cluster.placement import read_nodes
    if text is None:
        return text
    if not text.isdigit():
        if text != "slurm" and not os.path.isfile(text):
            raise ConfigError(f"--hostfile: {text} is neither a number of hosts nor a hostfile")
        read_nodes(text)  # PlacementError (a ConfigError) naming what is wrong
        return text
    if int(text) < 2:
        raise ConfigError(f"--hostfile: at least 2 hosts, got {text}")
    return int(text)


def main(args) -> int:
    from dualjax.runtime.cluster.netns import NetnsError
    try:
        result = verify(args.out, quick=args.quick, model=args.model, hosts=hosts_arg(args.hostfile),
                        progress=not args.quiet)
    except NetnsError as e:
        print(f"dualjax verify: error: --hostfile: {e}", file=sys.stderr)
        return 2
    if args.json:
        write_json(args.json, result)
    summary = {k: v for k, v in result.items() if k != "mismatches"} | {"mismatches": len(result["mismatches"])}
    print(json.dumps(summary))
    networked = all(r.get("over_network", True) for r in result.get("hosts", {}).values())
    return 0 if result["identical"] and networked else 1
