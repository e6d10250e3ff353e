"""Which local devices a rank uses, set in its environment before JAX starts.

Each engine runs one JAX mesh over the devices it is given (tensor parallel within the host). A
node running one engine gives it every device. A node running several (`host:N` in a hostfile, or
a single machine) gives engine k of n the k-th n-th of the node's GPUs through CUDA_VISIBLE_DEVICES
(with fewer GPUs than engines, engines share GPUs round-robin and each preallocates its share of
JAX's default 75 % of a GPU's memory, XLA_PYTHON_CLIENT_MEM_FRACTION), and on a CPU-only node the
k-th n-th of the CPU devices configured by `--xla_force_host_platform_device_count` in XLA_FLAGS
or JAX_NUM_CPU_DEVICES (what the tests check). The scheduler (rank 0) computes no model: it runs
JAX on the CPU (JAX_PLATFORMS=cpu), so it takes no device memory from an engine beside it.

What the user or the launcher set already wins: a CUDA_VISIBLE_DEVICES that SLURM's `--gpus-per-task`
gives each rank, a JAX_PLATFORMS, a memory fraction, XLA_PYTHON_CLIENT_PREALLOCATE=false.
"""

from __future__ import annotations

import math
import os
import re

from dualjax.runtime.cluster.placement import Seat

JAX_DEFAULT_FRACTION = 0.75  # what JAX preallocates of each GPU unless told otherwise
_CPU_FLAG = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def local_gpus(environ, proc: str = "/proc/driver/nvidia/gpus") -> list[str]:
    """The GPUs this rank may use: CUDA_VISIBLE_DEVICES if set (ids or UUIDs), else one id per GPU the
    NVIDIA driver lists (no JAX or CUDA call: this runs before JAX starts)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [g for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    try:
        return [str(i) for i in range(len(os.listdir(proc)))]
    except OSError:
        return []


def cpu_devices(environ) -> int | None:
    """CPU devices JAX will make (XLA_FLAGS' host platform count, else JAX_NUM_CPU_DEVICES), or None."""
    if m := _CPU_FLAG.search(environ.get("XLA_FLAGS", "")):
        return int(m.group(1))
    n = environ.get("JAX_NUM_CPU_DEVICES")
    return int(n) if n and n.isdigit() else None


def device_env(seat: Seat, environ=None, gpus: list[str] | None = None) -> dict[str, str]:
    """The environment settings that give `seat` its devices (to apply before JAX is imported);
    `gpus` defaults to `local_gpus(environ)`."""
    environ = os.environ if environ is None else environ
    if seat.role == "scheduler":
        return {} if "JAX_PLATFORMS" in environ else {"JAX_PLATFORMS": "cpu"}
    n, k = seat.local_engines, seat.local_index
    if n <= 1:
        return {}
    gpus = local_gpus(environ) if gpus is None else gpus
    if gpus:
        if len(gpus) >= n:
            share = gpus[k * len(gpus) // n:(k + 1) * len(gpus) // n]
            return {"CUDA_VISIBLE_DEVICES": ",".join(share)}
        env = {"CUDA_VISIBLE_DEVICES": gpus[k % len(gpus)]}
        sharing = math.ceil(n / len(gpus))  # engines on the busiest GPU
        preallocates = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
        if preallocates and "XLA_PYTHON_CLIENT_MEM_FRACTION" not in environ:
            env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{JAX_DEFAULT_FRACTION / sharing:.3f}"
        return env
    total = cpu_devices(environ)
    if not total or total <= 1:
        return {}
    share = str(max(1, total // n))
    flags = environ.get("XLA_FLAGS", "")
    if _CPU_FLAG.search(flags):
        return {"XLA_FLAGS": _CPU_FLAG.sub(f"--xla_force_host_platform_device_count={share}", flags)}
    return {"JAX_NUM_CPU_DEVICES": share}


def use_devices(seat: Seat) -> dict[str, str]:
    """Apply `device_env(seat)` to this process's environment (JAX must not be imported yet); returns it."""
    env = device_env(seat)
    os.environ.update(env)
    return env
