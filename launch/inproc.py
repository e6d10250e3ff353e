"""In-process launcher for notebooks and scripts: the same hosts and messages, no MPI.

    from launch.inproc import run
    report = run(cluster="1p1d", model="tiny", workload="agentic-tiny", policy="dualpath", out="runs/nb")
"""

from __future__ import annotations

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.cluster.runner import run_embedded


def run(cluster: str = "1p1d", policy="dualpath", progress: bool = True, **fields) -> dict:
    """Run one embedded cluster. `policy` is a name or a Policy object (e.g. one written in a
    notebook); `fields` are RunConfig fields (model, workload, snic_mbps, out, ...)."""
    from dualjax.core.policies import Policy
    obj = policy if isinstance(policy, Policy) else None
    cfg = RunConfig(cluster=ClusterSpec.parse(cluster), policy=obj.name if obj else policy, **fields)
    return run_embedded(cfg, progress=progress, policy=obj)
