"""Run a command on N hosts made as Linux namespaces on this machine (`dualjax.runtime.cluster.netns`; root).

    python -m dualjax.cli.hosts 3 -- dualjax run --hostfile {hostfile} --cluster 1p2d --out runs/h3
    python -m dualjax.cli.hosts 2 -- dualjax bench relay --hostfile {hostfile} --json relay.json

The command runs on node0 with Hydra's launcher set to enter the other hosts, so the mpiexec it
starts places ranks on node0 ... node<N-1>, between which MPI can only use the network. `{hostfile}`
in the command is the hosts' hostfile (one per line). When the command ends, the hosts are removed
and one JSON line on stderr says how many bytes each host's link received and sent. Exit code: the
command's (2 with one line where hosts cannot be made here).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

from dualjax.core.config import number


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dualjax.cli.hosts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("n", type=number(1, kind=int, low_ok=True), help="number of hosts")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... ({hostfile}: the hostfile)")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command given (after --)")
    from dualjax.runtime.cluster.netns import Hosts, NetnsError
    try:
        hosts = Hosts(args.n)
    except NetnsError as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # so the hosts are removed
    with hosts:
        rc = hosts.run([a.replace("{hostfile}", hosts.hostfile) for a in command]).returncode
        print(json.dumps({"hosts": hosts.names, "link_bytes": hosts.net_bytes()}), file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
