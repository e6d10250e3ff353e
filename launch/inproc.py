"""In-process launcher for notebooks and scripts: the same hosts and messages, no MPI.

    from launch.inproc import run
    report = run(cluster="1p1d", model="tiny", workload="agentic-tiny", path="de", out="runs/nb")
"""

from __future__ import annotations

from dualjax.config import ClusterSpec, RunConfig
from dualjax.runtime import run_embedded


def run(cluster: str = "1p1d", progress: bool = True, **fields) -> dict:
    """Run one embedded cluster; `fields` are RunConfig fields (model, workload, path, out, ...)."""
    return run_embedded(RunConfig(cluster=ClusterSpec.parse(cluster), **fields), progress=progress)
