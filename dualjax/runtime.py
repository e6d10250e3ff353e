"""Running a cluster: every rank's role, in one process (embedded) or one process per rank (MPI).

`run_embedded(cfg)` runs all hosts as threads over the in-process transport, with the same
classes and messages as a real run; `run_rank(transport, cfg)` is what each MPI rank runs
(`launch/main.py`). Both write `requests.jsonl` and `report.json` on rank 0.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import models
from dualjax.config import RunConfig
from dualjax.decode import DecodeHost, decode_capacity
from dualjax.driver import Driver
from dualjax.layout import open_store, run_layout
from dualjax.policies import Policy, get_policy
from dualjax.prefill import PrefillHost
from dualjax.profile import prefill_tokens_per_s, thresholds
from dualjax.workload import load_workload, slo_for
from dualjax.report import write_run
from dualjax.transport import HostFailure, InProcFabric, Transport

log = logging.getLogger(__name__)


def make_host(rank: int, transport: Transport, cfg: RunConfig, params=None):
    role = cfg.cluster.role(rank)
    return (PrefillHost if role == "prefill" else DecodeHost)(transport, cfg, params)


def drive(transport: Transport, cfg: RunConfig, progress: bool, policy: Policy | None = None) -> dict:
    """Rank 0's part: drive the workload, then write the outputs."""
    model_cfg = models.get_config(cfg.model)
    store = open_store(cfg)
    layout = run_layout(cfg)
    policy = policy or get_policy(cfg.policy)
    agents = load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps)
    th = thresholds(cfg)
    driver = Driver(transport, cfg, agents, layout, store, policy, th,
                    cfg.decode_slots * decode_capacity(cfg, model_cfg), progress)
    records, hosts = driver.run()
    return write_run(cfg.out, records, hosts, cfg, policy.name, slo_for(cfg.workload),
                     {"thresholds": dataclasses.asdict(th), "prefill_tokens_per_s": prefill_tokens_per_s(cfg.model)})


def run_rank(transport: Transport, cfg: RunConfig, progress: bool = True) -> dict | None:
    """One MPI rank: rank 0 drives and returns the report; the others serve until shutdown."""
    if transport.rank == 0:
        return drive(transport, cfg, progress)
    make_host(transport.rank, transport, cfg).run()
    return None


def run_embedded(cfg: RunConfig, progress: bool = True, policy: Policy | None = None) -> dict:
    """All ranks in this process (threads). `policy` (an object, e.g. from a notebook) overrides
    `cfg.policy`. Raises HostFailure with the failing host's traceback."""
    open_store(cfg)  # fail fast on a fingerprint mismatch, before any host starts
    fabric = InProcFabric(cfg.cluster.size)
    params = models.init_params(models.get_config(cfg.model), cfg.param_seed)
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
