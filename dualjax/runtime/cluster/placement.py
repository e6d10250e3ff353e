"""Placement: which node runs which rank of a run, in which role.

A node has one role, as in the paper: each node of a hostfile (or of a SLURM allocation) runs one
engine, a prefill engine (PE) or a decode engine (DE), on all of its devices. The nodes are taken
in the order listed: the first P are the PEs, the next D the DEs, and the scheduler (rank 0) runs
on the first node, beside its PE when the list has no node to spare for it (it needs no device).
A node listed as `name:N` runs N engines (the single-machine case: `localhost:3`), each on its
share of the node's devices (`dualjax.runtime.cluster.devices`).

Roles are given explicitly, never by the order in which a launcher numbers its ranks: every rank
says which host it is on (its hostname), `Placement.assign` matches the ranks of each host to the
seats placed there, and the run renumbers its ranks in placement order (rank 0 the scheduler,
then the PEs, then the DEs), which is what `ClusterSpec.role` reads.

The node list comes from a hostfile (Hydra's format: one `host[:N]` per line, `#` comments) or,
given as `slurm`, from SLURM_JOB_NODELIST, expanded here (`expand_hostlist`) so that neither SLURM
nor its `scontrol` is needed. This module is plain Python: no MPI, JAX or files beyond the hostfile.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re

from dualjax.core.config import ClusterSpec, ConfigError


class PlacementError(ConfigError):
    """A node list that cannot hold the cluster, or ranks that do not match it; says which host."""


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    slots: int = 1  # engines this node runs


@dataclasses.dataclass(frozen=True)
class Seat:
    """One rank's place: its rank in the run (placement order), role, host, and its share of the host:
    it is engine `local_index` of the `local_engines` engines placed on `host`."""

    rank: int
    role: str
    host: str
    local_index: int
    local_engines: int


def _expand_one(name: str) -> list[str]:
    """`n[01-03,7]x[1-2]` -> n01x1, n01x2, ..., n7x2: the cartesian product of every bracket's ranges;
    a range keeps the zero padding of its lower bound (`01-10`: 01 ... 10)."""
    parts, choices = re.split(r"(\[[^\]]*\])", name), []
    for part in parts:
        if not part.startswith("["):
            choices.append([part])
            continue
        values = []
        for item in part[1:-1].split(","):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
            if not m:
                raise PlacementError(f"bad host range {item!r} in {name!r}: expected N or N-M")
            lo, hi = m.group(1), m.group(2) or m.group(1)
            if int(hi) < int(lo):
                raise PlacementError(f"bad host range {item!r} in {name!r}: {hi} < {lo}")
            values += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
        choices.append(values)
    return ["".join(p) for p in itertools.product(*choices)]


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list (`gpu[01-03,07],login1`, as in SLURM_JOB_NODELIST) as names, in
    order. Raises PlacementError on unbalanced brackets or a bad range."""
    names, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth < 0 or depth > 1:
            raise PlacementError(f"bad host list {text!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            if item := text[start:i].strip():
                names += _expand_one(item)
            start = i + 1
    if depth:
        raise PlacementError(f"bad host list {text!r}: unbalanced brackets")
    return names


def parse_hostfile(text: str, source: str = "hostfile") -> list[Node]:
    """Nodes of a hostfile: one `host[:N]` per line (Hydra's format); blank lines and `#` comments
    are skipped. A host listed twice is an error (one role per node)."""
    nodes: list[Node] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?::(\d+))?", line)
        if not m or (m.group(2) is not None and int(m.group(2)) < 1):
            raise PlacementError(f"{source}, line {number}: expected HOST or HOST:N (N >= 1), got {line!r}")
        nodes.append(Node(m.group(1), int(m.group(2) or 1)))
    names = [n.name for n in nodes]
    if dup := next((n for n in names if names.count(n) > 1), None):
        raise PlacementError(f"{source}: host {dup} is listed twice; give it once, as {dup}:N for N engines")
    if not nodes:
        raise PlacementError(f"{source} lists no hosts")
    return nodes


def read_nodes(spec: str, environ=None, flag: str = "--hostfile") -> tuple[list[Node], str]:
    """(nodes, where they came from) for `--hostfile spec` (errors name `flag`): a file, or `slurm` for
    SLURM_JOB_NODELIST."""
    environ = os.environ if environ is None else environ
    if spec == "slurm":
        text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        if not text:
            raise PlacementError(f"{flag} slurm: SLURM_JOB_NODELIST is not set (run inside an allocation)")
        return [Node(n) for n in expand_hostlist(text)], f"the allocation (SLURM_JOB_NODELIST={text})"
    try:
        with open(spec) as f:
            text = f.read()
    except OSError as e:
        raise PlacementError(f"{flag} {spec}: {e.strerror}") from None
    return parse_hostfile(text, f"hostfile {spec}"), f"hostfile {spec}"


def short(host: str) -> str:
    return host.split(".", 1)[0]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Every rank's seat, in placement order, and the listed nodes left unused."""

    cluster: ClusterSpec
    seats: tuple[Seat, ...]
    spare: tuple[str, ...] = ()

    @classmethod
    def plan(cls, cluster: ClusterSpec, nodes: list[Node], source: str = "the node list") -> "Placement":
        """Engines fill the nodes' slots in order, PEs first; rank 0 takes a slot of the first node if
        the nodes have one to spare, else runs beside the first engine. Raises PlacementError when the
        nodes hold fewer engines than the cluster has."""
        engines = cluster.prefill + cluster.decode
        slots = [n.name for n in nodes for _ in range(n.slots)]
        if len(slots) < engines:
            raise PlacementError(
                f"{source} has {len(nodes)} node{'s' * (len(nodes) != 1)} with {len(slots)} engine slot"
                f"{'s' * (len(slots) != 1)}; cluster {cluster.name} needs {engines} (one per PE and DE; "
                f"the scheduler shares the first node)")
        own = len(slots) > engines  # a slot to spare: the scheduler's own
        hosts = slots[int(own):int(own) + engines]
        roles = ["prefill"] * cluster.prefill + ["decode"] * cluster.decode
        seats = [Seat(0, "scheduler", nodes[0].name, 0, hosts.count(nodes[0].name))]
        seats += [Seat(r, role, h, hosts[:r - 1].count(h), hosts.count(h))
                  for r, (role, h) in enumerate(zip(roles, hosts), 1)]
        used = {s.host for s in seats}
        return cls(cluster, tuple(seats), tuple(n.name for n in nodes if n.name not in used))

    @classmethod
    def one_host(cls, cluster: ClusterSpec, host: str) -> "Placement":
        """Every rank on `host` (a single-machine run)."""
        return cls.plan(cluster, [Node(host, cluster.size)], f"host {host}")

    def hosts(self) -> list[tuple[str, int]]:
        """(host, ranks placed there) in order of first rank."""
        counts: dict[str, int] = {}
        for s in self.seats:
            counts[s.host] = counts.get(s.host, 0) + 1
        return list(counts.items())

    def hydra_hosts(self) -> str:
        """mpiexec's `-hosts` argument (`a:2,b:1,...`): Hydra numbers ranks host by host in this order,
        so its ranks come out in placement order (`assign` checks it either way)."""
        return ",".join(f"{h}:{n}" for h, n in self.hosts())

    def assign(self, hostnames: list[str]) -> list[int]:
        """The placement rank of each launched rank, given each one's hostname (MPI rank order): the
        ranks on a host take its seats in rank order. A host name matches exactly, else by its short
        name (`gpu01.cluster` is `gpu01`). Raises PlacementError naming the first host whose ranks do
        not match its seats."""
        placed = [s.host for s in self.seats]
        key = {h: h for h in placed} | {short(h): h for h in placed}

        def where(name: str) -> str | None:
            return key.get(name) or key.get(short(name))
        if len(hostnames) != len(self.seats):
            raise PlacementError(f"cluster {self.cluster.name} needs {len(self.seats)} ranks "
                                 f"({self.describe_hosts()}); the launcher started {len(hostnames)}")
        for name in hostnames:
            if where(name) is None:
                raise PlacementError(f"host {name} runs a rank but is not in the placement ({self.describe_hosts()})")
        for host, n in self.hosts():
            got = sum(where(name) == host for name in hostnames)
            if got != n:
                raise PlacementError(f"host {host} runs {got} rank{'s' * (got != 1)}; the placement puts {n} there "
                                     f"({self.describe_hosts()})")
        free = {h: [s.rank for s in self.seats if s.host == h] for h, _ in self.hosts()}
        return [free[where(name)].pop(0) for name in hostnames]

    def describe_hosts(self) -> str:
        return ", ".join(f"{h}:{n}" for h, n in self.hosts())

    def report(self) -> dict:
        """What report.json says of the placement: which host is the scheduler, each PE and each DE."""
        by_role = {role: [s.host for s in self.seats if s.role == role] for role in ("prefill", "decode")}
        return {"scheduler": self.seats[0].host, **by_role, "spare": list(self.spare)}
