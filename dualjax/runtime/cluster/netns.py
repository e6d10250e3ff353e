"""Hosts on one machine: Linux namespaces that MPI can only reach over a network (tests, `verify --hostfile N`).

`Hosts(n)` makes n "hosts" named node0 ... node<n-1>. Each is a network namespace with one veth
link (`eth0`, 10.77.0.<k+1>/24) into a bridge that lives in a namespace of its own, so no address
or interface is added outside them. A process enters host k through `ip netns exec` and `unshare`
into its own UTS (hostname node<k>), IPC, mount and PID namespaces, with a private /dev/shm and an
/etc/hosts that names the n hosts: MPI ranks on two hosts share no memory (no POSIX or System V
shared memory, no cross-memory attach into another PID namespace), MPICH sees two nodes, and
their bytes cross the veth links (`net_bytes` counts them). Everything else (the file system,
the Python environment) is the machine's, as on a cluster with a shared file system; `binds`
mounts a host's own directory over a path, for a host that sees something else there.

`run(cmd)` runs a command on node0 with Hydra's launcher set to a script that enters the host it
is given (`HYDRA_LAUNCHER=ssh`, `HYDRA_LAUNCHER_EXEC`), so `mpiexec -hosts node0:2,node1:1 ...`
(what `dualjax run --hostfile` builds) starts each rank on its host. Needs root; `unavailable()`
says why hosts cannot be made here. `close()` (or leaving the `with` block) kills what runs in the
hosts and deletes the namespaces, on failure too; namespaces left by a process that died are
removed by the next `Hosts`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile

PREFIX = "djx"
SUBNET = "10.77.0"
_seq = itertools.count()

# Enter host NAME (its namespaces, hostname, /etc/hosts and /dev/shm, its bind mounts), then run CMD.
ENTER = """#!/bin/sh
# enter NAME CMD...: run CMD on emulated host NAME
name=$1; shift
case "$name" in
{cases}
  *) echo "enter: no host $name" >&2; exit 2;;
esac
exec ip netns exec "$ns" unshare --uts --ipc --mount --pid --kill-child --mount-proc sh -c '
  hostname "$1"; mount --bind "$2" /etc/hosts; mount -t tmpfs tmpfs /dev/shm; binds=$3; shift 3
  for b in $binds; do mount --bind "${{b%%=*}}" "${{b#*=}}"; done
  exec "$@"' enter "$name" "{hosts}" "$binds" "$@"
"""
# Hydra's launcher: LAUNCH -x HOST CMD... (as it calls ssh; CMD quoted for a remote shell)
LAUNCH = """#!/bin/sh
[ "$1" = "-x" ] && shift
host=$1; shift
exec "{enter}" "$host" sh -c "$*"
"""


class NetnsError(RuntimeError):
    """Hosts cannot be made or entered here."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here (not root, no `ip` or `unshare`), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "hostname", "mount"):
        if not shutil.which(tool):
            return f"`{tool}` is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces that a `Hosts` of a process no longer running left; returns their names."""
    listed = _ip("netns", "list", check=False).stdout.split()
    stale = [n for n in listed if (m := re.fullmatch(rf"{PREFIX}(\d+)-\d+-\w+", n)) and not _alive(int(m.group(1)))]
    for name in stale:
        _kill_in(name)
        _ip("netns", "del", name, check=False)
    return stale


def _kill_in(ns: str) -> None:
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


class Hosts:
    """n emulated hosts (see the module docstring). `binds`: {host index: [(source dir, path)]},
    mounted in that host only."""

    def __init__(self, n: int, binds: dict[int, list[tuple[str, str]]] | None = None):
        if n < 1:
            raise ValueError(f"Hosts: n must be at least 1, got {n}")
        if why := unavailable():
            raise NetnsError(why)
        remove_stale()
        self.names = [f"node{k}" for k in range(n)]
        tag = f"{PREFIX}{os.getpid()}-{next(_seq)}"
        self.namespaces = [f"{tag}-h{k}" for k in range(n)]
        self.switch = f"{tag}-sw"
        self.dir = tempfile.mkdtemp(prefix="dualjax-hosts-")
        self.enter, self.launcher = os.path.join(self.dir, "enter"), os.path.join(self.dir, "launch")
        self.hostfile = os.path.join(self.dir, "hostfile")
        try:
            self._write_files(binds or {})
            self._make_network()
        except BaseException:
            self.close()
            raise

    def _write_files(self, binds: dict[int, list[tuple[str, str]]]) -> None:
        hosts = os.path.join(self.dir, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{SUBNET}.{k + 1} {h}\n" for k, h in enumerate(self.names)))
        for k, pairs in binds.items():
            for src, dst in pairs:
                if any(c.isspace() or c == "=" for c in src + dst):
                    raise ValueError(f"Hosts: bind paths must not hold spaces or '=': {src!r} -> {dst!r}")
        cases = "\n".join(f"  {h}) ns={ns}; binds='{' '.join(f'{s}={d}' for s, d in binds.get(k, []))}';;"
                          for k, (h, ns) in enumerate(zip(self.names, self.namespaces)))
        for path, text in ((self.enter, ENTER.format(cases=cases, hosts=hosts)),
                           (self.launcher, LAUNCH.format(enter=self.enter))):
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)
        with open(self.hostfile, "w") as f:
            f.write("".join(f"{h}\n" for h in self.names))

    def _make_network(self) -> None:
        sw = self.switch
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for k, ns in enumerate(self.namespaces):
            _ip("netns", "add", ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{k}", "netns", sw)
            _ip("-n", sw, "link", "set", f"p{k}", "master", "br0")
            _ip("-n", sw, "link", "set", f"p{k}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{k + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def env(self) -> dict[str, str]:
        """Hydra's settings that start a remote rank through `enter` (for mpiexec on node0)."""
        return {"HYDRA_LAUNCHER": "ssh", "HYDRA_LAUNCHER_EXEC": self.launcher}

    def command(self, cmd: list[str], host: int = 0) -> list[str]:
        """`cmd` run on host `host`, with Hydra's launcher set (see `env`)."""
        return [self.enter, self.names[host], "env", *(f"{k}={v}" for k, v in self.env().items()), *cmd]

    def run(self, cmd: list[str], host: int = 0, **kwargs) -> subprocess.CompletedProcess:
        """subprocess.run of `cmd` on host `host` (kwargs as subprocess.run's)."""
        return subprocess.run(self.command(cmd, host), **kwargs)

    def net_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each host received and sent on its link so far: {name: {"rx": .., "tx": ..}}."""
        out = {}
        for name, ns in zip(self.names, self.namespaces):
            link = json.loads(_ip("-j", "-s", "-n", ns, "link", "show", "eth0").stdout)[0]["stats64"]
            out[name] = {"rx": link["rx"]["bytes"], "tx": link["tx"]["bytes"]}
        return out

    def close(self) -> None:
        """Kill every process in the hosts, delete the namespaces (the links go with them) and files."""
        for ns in [*self.namespaces, self.switch]:
            _kill_in(ns)
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
