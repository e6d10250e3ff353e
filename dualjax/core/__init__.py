"""The NumPy-only core: run settings, workloads, the scheduler, policies, batching, records and
report maths. Imports no JAX, MPI or TensorStore (tests/test_architecture.py enforces it), so the
simulator, notebooks and the real runtime all run this same code."""

# the field's load-or-recompute baselines add themselves to policies.POLICIES: importing them here makes
# every built-in name resolve wherever dualjax.core is imported, without policies.py importing them
from dualjax.core import field_policies  # noqa: E402, F401
