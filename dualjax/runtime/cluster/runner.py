"""Running a cluster: every rank's role, in one process (embedded) or one process per rank (MPI).

`run_embedded(cfg)` runs all hosts as threads over the in-process transport, with the same
classes and messages as a real run; `run_rank(transport, cfg)` is what each MPI rank runs
(`launch/main.py`). Both write the run's outputs (`dualjax.outputs`, docs/report.md) on rank 0.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback

from dualjax.core.batching import AttentionFit
from dualjax.core.config import ConfigError, RunConfig
from dualjax.core.policies import Policy, PolicyError, get_policy
from dualjax.core.report import build_report
from dualjax.core.workload import load_workload, slo_for, workload_report
from dualjax.outputs import real_columns, unwritable_dir, write_run
from dualjax.runtime.cluster.placement import Placement, read_nodes
from dualjax.runtime.decode_host import DecodeHost, decode_capacity
from dualjax.runtime.driver import Driver
from dualjax.runtime.host import keep_failure
from dualjax.runtime.prefill_host import PrefillHost
from dualjax.runtime.startup import thresholds
from dualjax.runtime.store import open_store, run_layout, run_location, run_model
from dualjax.runtime.transport import HostFailure, InProcFabric, Transport
from dualjax.runtime.warmup import startup_report, wait_warm

log = logging.getLogger(__name__)


def make_host(rank: int, transport: Transport, cfg: RunConfig, params=None):
    role = cfg.cluster.role(rank)
    return (PrefillHost if role == "prefill" else DecodeHost)(transport, cfg, params)


def drive(transport: Transport, cfg: RunConfig, progress: bool, policy: Policy | None = None,
          placement: dict | None = None) -> dict:
    """Rank 0's part: wait until every host is warm, drive the workload, then write the outputs
    (`placement`, which host runs which rank, goes into the report as it is)."""
    t_start = time.perf_counter()
    model_cfg = run_model(cfg).config  # the config alone: rank 0 never loads the weights
    store = open_store(cfg)
    layout = run_layout(cfg)
    policy = policy or get_policy(cfg.policy)
    agents = load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps,
                           cfg.think_time, model_cfg.max_seq_len)
    warm = wait_warm(transport, cfg.cluster.size - 1)
    rate = statistics.median(w.prefill_tokens_per_s for w in warm.values() if w.prefill_tokens_per_s)
    th = thresholds(cfg, rate)
    startup = startup_report(warm, time.perf_counter() - t_start)
    fits = {r: AttentionFit(*w.pack_fit) for r, w in warm.items() if w.pack_fit is not None}
    driver = Driver(transport, cfg, agents, layout, store, policy, th,
                    cfg.decode_slots * decode_capacity(cfg, model_cfg), progress, fits)
    try:
        cols, hosts = real_columns(*driver.run())
    except PolicyError as e:  # the policy author's mistake: one line here, its traceback in the run's directory
        keep_failure(cfg.out, 0, "scheduler", traceback.format_exc())
        raise PolicyError(f"{e} (traceback: {os.path.join(cfg.out, 'failed-rank0.txt')})") from e
    workload = workload_report(cfg.workload, cfg.agents, cfg.workload_seed, model_cfg.max_seq_len, cfg.block_tokens)
    own = {"thresholds": dataclasses.asdict(th), "prefill_tokens_per_s": rate, "startup": startup,
           "placement": placement}
    report = build_report("real", cols, hosts, cfg, policy.name, slo_for(cfg.workload), workload, own)
    write_run(cfg.out, cols, report)
    return report


def run_rank(transport: Transport, cfg: RunConfig, progress: bool = True, placement: dict | None = None) -> dict | None:
    """One MPI rank: rank 0 drives and returns the report; the others serve until shutdown."""
    if transport.rank == 0:
        return drive(transport, cfg, progress, placement=placement)
    make_host(transport.rank, transport, cfg).run()
    return None


def run_embedded(cfg: RunConfig, progress: bool = True, policy: Policy | None = None) -> dict:
    """All ranks in this process (threads). `policy` (an object, e.g. from a notebook) overrides
    `cfg.policy`. Raises HostFailure with the failing host's traceback."""
    open_store(cfg)  # fail fast on a fingerprint mismatch, before any host starts
    clear_failures(cfg.out)
    fabric = InProcFabric(cfg.cluster.size)
    params = run_model(cfg).load_params()
    hosts = [make_host(r, fabric.transport(r), cfg, params) for r in range(1, cfg.cluster.size)]
    threads = [threading.Thread(target=h.run, name=f"rank{h.rank}", daemon=True) for h in hosts]
    for t in threads:
        t.start()
    try:
        return drive(fabric.transport(0), cfg, progress, policy)
    except HostFailure:
        raise
    except BaseException as e:
        fabric.transport(0).abort(f"[rank 0 scheduler] {e!r}")
        raise
    finally:
        for h in hosts:
            h.stop.set()
        for t in threads:
            t.join(timeout=10)


def check_run(cfg: RunConfig, embedded: bool = False) -> None:
    """Fail fast, before any process starts: the output directory can be written, the hostfile holds
    the cluster, presets and policy resolve, the workload loads, buffers hold a block, the store
    matches (here: each host checks its own at start-up, `dualjax.runtime.cluster.preflight`)."""
    why = unwritable_dir(cfg.out)
    if why:
        raise ConfigError(f"--out: {why}")
    if cfg.hostfile:
        if embedded:
            raise ConfigError("--hostfile starts ranks on other hosts under mpiexec; it cannot run --embedded")
        Placement.plan(cfg.cluster, *read_nodes(cfg.hostfile))
    from dualjax.runtime.buffers import HostBuffer
    model_cfg = run_model(cfg).config
    if cfg.block_tokens > model_cfg.max_seq_len:
        raise ConfigError(f"block_tokens {cfg.block_tokens} exceeds {model_cfg.name}'s context of "
                          f"{model_cfg.max_seq_len} tokens: no request could fill one block")
    layout = run_layout(cfg)
    get_policy(cfg.policy)
    load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps, cfg.think_time,
                  model_cfg.max_seq_len)
    HostBuffer("PE", int(cfg.pe_buffer_mb * 2**20)).check_fits(layout.block_bytes)
    HostBuffer("DE", int(cfg.de_buffer_mb * 2**20)).check_fits(layout.block_bytes)
    if cfg.use_store and not embedded:
        run_location(cfg, processes=True)  # a store MPI's processes cannot share, before it is asked for a budget
    open_store(cfg)


def mpiexec() -> str:
    """The mpiexec beside this Python (the `mpich` wheel's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if not found:
        raise SystemExit("mpiexec not found: `pip install mpich` (a dependency of dualjax) provides it")
    return found


def mpiexec_cmd(cfg: RunConfig, quiet: bool = False) -> list[str]:
    """`mpiexec [-hosts H:N,...] -n 1+P+D python -m mpi4py -m dualjax.runtime.cluster.rank FLAGS` (the flags
    rebuilt from `cfg`); with `cfg.hostfile`, the hosts of its placement, each with the ranks placed
    there (Hydra starts them through its launcher: ssh, or srun inside a SLURM allocation)."""
    from dualjax.core.config import to_argv
    hosts = []
    if cfg.hostfile:
        nodes, source = read_nodes(cfg.hostfile)
        hosts = ["-hosts", Placement.plan(cfg.cluster, nodes, source).hydra_hosts()]
    argv = to_argv(cfg) + (["--quiet"] if quiet else [])
    return [mpiexec(), *hosts, "-n", str(cfg.cluster.size), sys.executable, "-m", "mpi4py", "-m",
            "dualjax.runtime.cluster.rank", *argv]


def launch_mpi(cfg: RunConfig, quiet: bool = False) -> int:
    """Run `cfg` under mpiexec (`mpiexec_cmd`); returns mpiexec's exit code (REFUSED: the ranks refused
    to start and rank 0 said why in one line)."""
    clear_failures(cfg.out)
    return subprocess.run(mpiexec_cmd(cfg, quiet)).returncode


def describe_placement(placement: Placement, ranks: list[dict]) -> str:
    """One line: which host is the scheduler, the PEs and the DEs, with each engine's devices."""
    def engine(r: dict) -> str:
        return f"{r['host']} ({r['devices']} {r['platform']})"
    roles = [f"scheduler {ranks[0]['host']}"]
    for role, name in (("prefill", "PE"), ("decode", "DE")):
        roles.append(f"{name} " + ", ".join(engine(r) for r in ranks if r["role"] == role))
    spare = f"; unused: {', '.join(placement.spare)}" if placement.spare else ""
    return f"{placement.cluster.name} on {len(placement.hosts())} host(s): {'; '.join(roles)}{spare}"


def clear_failures(out: str) -> None:
    """Remove the tracebacks an earlier run in directory `out` left (`failed_hosts`)."""
    for path in failed_hosts(out):
        os.remove(path)


def failed_hosts(out: str) -> list[str]:
    """The tracebacks failing hosts left in run directory `out` (`failed-rank<r>.txt`), rank order."""
    ranks = {int(m.group(1)): p for p in glob.glob(os.path.join(glob.escape(out), "failed-rank*.txt"))
             if (m := re.fullmatch(r"failed-rank(\d+)\.txt", os.path.basename(p)))}
    return [ranks[r] for r in sorted(ranks)]


def summary_line(report: dict) -> str:
    c = report["config"]["cluster"]
    return (f"{c['prefill']}p{c['decode']}d {report['policy']}: {report['requests']} requests  "
            f"JCT {report['jct_s']:.2f} s  {report['tokens_per_s']:.1f} tok/s  hit {report['hit_rate']:.1%}  "
            f"paths {report['paths']}  relay {report['relay_bytes'] / 2**20:.1f} MiB")
