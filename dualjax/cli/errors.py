"""The errors the CLI reports in one line (bad input); anything else is a bug and keeps its traceback."""

from __future__ import annotations


def user_errors() -> tuple[type[Exception], ...]:
    """The project's own error types for bad input: the CLI reports these in one line."""
    from dualjax.core.config import ConfigError
    from dualjax.core.planner import HardwareError
    from dualjax.core.policies import PolicyError
    from dualjax.core.workload import WorkloadError
    from dualjax.outputs import OutputError
    from dualjax.sim.profiles import ProfileError
    from dualjax.sim.resources import SimError
    from kvstore import StoreError
    from models.checkpoint import CheckpointError
    from models.config import ModelConfigError
    return (ConfigError, HardwareError, PolicyError, WorkloadError, ProfileError, SimError, StoreError,
            CheckpointError, ModelConfigError, OutputError)
