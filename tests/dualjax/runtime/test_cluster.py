"""Runs across hosts: ranks take the roles of their hosts whatever order a launcher numbers them in,
engines sharing a node split its devices, KV crosses hosts bit-exact and over the network, and a
host that differs from rank 0's (too few nodes, another store, another dualjax, other weights) is
refused before any work with one line naming it.

Hosts are Linux namespaces on this machine (`dualjax.runtime.cluster.netns`; root, else those tests skip);
every test that starts MPI ranks is `slow`."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

import models
from dualjax.runtime.cluster.netns import Hosts, unavailable
from dualjax.runtime.cluster.runner import mpiexec
from dualjax.runtime.verify import tokens_of, verify
from kvstore import BlockStore, local_spec
from tests.dualjax.runtime.test_runtime import BASE, REPO

RUN = [sys.executable, "-m", "dualjax.cli.main", "run", "--quiet", "--model", "tiny", "--agents", "2", "--turns", "2"]
NO_HOSTS = unavailable()
needs_hosts = pytest.mark.skipif(NO_HOSTS is not None, reason=f"no namespaced hosts here: {NO_HOSTS}")


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def _mpi(n: str, ranks: str, *args: str, env=None) -> subprocess.CompletedProcess:
    """`mpiexec -n RANKS python -m mpi4py ARGS` on this machine."""
    return subprocess.run([mpiexec(), n, ranks, sys.executable, "-m", "mpi4py", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)


def _hostfile(tmp_path, names) -> str:
    path = tmp_path / "hostfile"
    path.write_text("".join(f"{n}\n" for n in names))
    return str(path)


def test_too_few_nodes_are_refused_before_launch(tmp_path):
    hostfile = _hostfile(tmp_path, ["a", "b", "c"])
    proc = subprocess.run([*RUN, "--cluster", "2p2d", "--out", str(tmp_path / "o"), "--hostfile", hostfile],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert _errors(proc.stderr) == [f"dualjax run: error: hostfile {hostfile} has 3 nodes with 3 engine slots; "
                                    "cluster 2p2d needs 4 (one per PE and DE; the scheduler shares the first node)"]


@pytest.mark.slow
def test_a_short_slurm_allocation_is_refused_under_the_users_launcher(tmp_path):
    env = os.environ | {"SLURM_JOB_NODELIST": "gpu[1-2]"}
    proc = _mpi("-n", "4", "-m", "launch.main", "--cluster", "1p2d", "--hostfile", "slurm",
                "--out", str(tmp_path / "o"), env=env)
    assert proc.returncode == 2
    assert _errors(proc.stderr) == ["dualjax: error: the allocation (SLURM_JOB_NODELIST=gpu[1-2]) has 2 nodes with 2 "
                                    "engine slots; cluster 1p2d needs 3 (one per PE and DE; the scheduler shares the "
                                    "first node)"]


@pytest.mark.slow
def test_packed_strided_kv_arrives_bit_exact():
    proc = _mpi("-n", "2", "tests/dualjax/runtime/mpi_packed_kv.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


@pytest.mark.slow
def test_engines_sharing_a_node_split_its_cpu_devices(tmp_path):
    """4 CPU devices on the node: the PE and the DE get 2 each (one mesh each), the scheduler runs on
    the CPU; the tokens are the embedded run's."""
    env = os.environ | {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = tmp_path / "mpi"
    proc = subprocess.run([*RUN, "--cluster", "1p1d", "--out", str(out)], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads((out / "report.json").read_text())["runtime"]["placement"]["ranks"]
    assert [(r["role"], r["platform"], r["local_index"], r["local_engines"]) for r in ranks] == [
        ("scheduler", "cpu", 0, 2), ("prefill", "cpu", 0, 2), ("decode", "cpu", 1, 2)]
    assert [r["devices"] for r in ranks[1:]] == [2, 2]
    embedded = BASE.replace(agents=2, turns=2, out=str(tmp_path / "embedded"))
    from dualjax.runtime.cluster.runner import run_embedded
    run_embedded(embedded, progress=False)
    assert tokens_of(str(out)) == tokens_of(embedded.out)


def _on_hosts(hosts: Hosts, tmp_path, *flags: str) -> subprocess.CompletedProcess:
    return hosts.run([*RUN, "--hostfile", hosts.hostfile, "--out", str(tmp_path / "o"), *flags],
                     capture_output=True, text=True, timeout=300, cwd=REPO)


@needs_hosts
@pytest.mark.slow
def test_roles_follow_the_hostfile_not_the_launchers_rank_order(tmp_path):
    """The user's mpiexec numbers ranks from node2; the hostfile says node0 runs the scheduler and the PE."""
    with Hosts(3) as hosts:
        cmd = [mpiexec(), "-hosts", "node2:1,node1:1,node0:2", "-n", "4", sys.executable, "-m", "mpi4py", "-m",
               "launch.main", "--cluster", "1p2d", "--hostfile", hosts.hostfile, "--out", str(tmp_path / "o"),
               "--agents", "2", "--turns", "2", "--policy", "de-only", "--quiet"]
        proc = hosts.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    placement = json.loads((tmp_path / "o" / "report.json").read_text())["runtime"]["placement"]
    roles = (placement["scheduler"], placement["prefill"], placement["decode"])
    assert roles == ("node0", ["node0"], ["node1", "node2"])
    # MPI shares memory only within a host: node0's two ranks, nobody else
    assert {r["rank"]: r["shared_memory_with"] for r in placement["ranks"]} == {0: [0, 1], 1: [0, 1], 2: [2], 3: [3]}


@needs_hosts
@pytest.mark.slow
def test_a_host_that_sees_another_store_is_refused(tmp_path):
    """node1 has a store of its own at the store's path (same layout, a local disk): only the probe
    tells it apart."""
    from dualjax.runtime.store import run_layout
    shared, local = tmp_path / "shared-store", tmp_path / "node1-disk"
    shared.mkdir()
    BlockStore(local_spec(str(local)), run_layout(BASE)).close()
    with Hosts(2, binds={1: [(str(local), str(shared))]}) as hosts:
        proc = _on_hosts(hosts, tmp_path, "--cluster", "1p1d", "--store", str(shared))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _errors(proc.stderr) == [f"dualjax: error: host node1 (rank 2, decode) does not see the store at {shared}: "
                                    "the probe rank 0 wrote there is not in it; rank 0 runs on node0: give --store a "
                                    "directory that every host shares"]


@needs_hosts
@pytest.mark.slow
def test_a_host_that_cannot_see_a_url_store_is_refused(tmp_path):
    """--store as a kvstore URL: node1's path to it is an empty disk of its own."""
    shared, empty = tmp_path / "shared-store", tmp_path / "node1-disk"
    shared.mkdir()
    empty.mkdir()
    with Hosts(2, binds={1: [(str(empty), str(shared))]}) as hosts:
        proc = _on_hosts(hosts, tmp_path, "--cluster", "1p1d", "--store", f"file://{shared}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _errors(proc.stderr) == [f"dualjax: error: host node1 (rank 2, decode) has no store at file://{shared} (no "
                                    "dualjax_store.json); rank 0 runs on node0: give --store a store that every host "
                                    "reaches"]


def _version_file() -> str:
    """The file dualjax's version is read from: an installed wheel's METADATA, or the PKG-INFO of the
    egg-info an editable install leaves in the checkout (found first from the repository's directory)."""
    try:
        where = str(importlib.metadata.distribution("dualjax")._path)  # a PathDistribution's directory
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("dualjax is not installed: no version to compare")
    return os.path.join(where, "PKG-INFO" if where.endswith(".egg-info") else "METADATA")


@needs_hosts
@pytest.mark.slow
def test_a_host_with_another_dualjax_is_refused(tmp_path):
    original = _version_file()
    metadata = tmp_path / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", "Version: 9.9.9", open(original).read()))
    with Hosts(2, binds={1: [(str(metadata), original)]}) as hosts:
        proc = _on_hosts(hosts, tmp_path, "--cluster", "1p1d")
    assert proc.returncode == 2, proc.stderr[-3000:]
    from dualjax.runtime.cluster.preflight import dualjax_version
    assert _errors(proc.stderr) == [f"dualjax: error: host node1 (rank 2, decode) runs dualjax 9.9.9, rank 0 on node0 "
                                    f"runs {dualjax_version()}"]


@needs_hosts
@pytest.mark.slow
def test_a_host_with_other_weights_is_refused(tiny, tmp_path):
    cfg, params = tiny
    ours, theirs = str(tmp_path / "ckpt"), str(tmp_path / "node1-ckpt")
    models.save_checkpoint(ours, params, cfg)
    models.save_checkpoint(theirs, models.init_params(cfg, seed=1), cfg)
    with Hosts(2, binds={1: [(theirs, ours)]}) as hosts:
        proc = _on_hosts(hosts, tmp_path, "--cluster", "1p1d", "--model", ours)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = _errors(proc.stderr)
    want, other = models.resolve_model(ours).describe, models.resolve_model(theirs).describe.replace(theirs, ours)
    assert re.fullmatch(rf"dualjax: error: host node1 \(rank 2, decode\) has model fingerprint \w+ \(model "
                        rf"{re.escape(other)}\); rank 0 on node0 has \w+ \(model {re.escape(want)}\)", line), line


@needs_hosts
@pytest.mark.slow
def test_verify_on_hosts_gives_the_reference_tokens_over_the_network(tmp_path):
    result = verify(str(tmp_path), quick=True, hosts=4)
    assert result["identical"] and result["mismatches"] == []
    runs = result["hosts"]
    assert set(runs) == {"de-layerwise-1p2d-hosts", "dualpath-layerwise-2p2d-hosts"}
    assert all(r["over_network"] for r in runs.values())
    assert runs["de-layerwise-1p2d-hosts"]["scheduler"] == "node0" and runs["de-layerwise-1p2d-hosts"]["prefill"] == [
        "node1"]  # a spare node: the scheduler's own
    assert runs["dualpath-layerwise-2p2d-hosts"]["prefill"] == ["node0", "node1"]
