"""The NumPy-only core: run settings, workloads, the scheduler, policies, batching, records and
report maths. Imports no JAX, MPI or TensorStore (tests/test_architecture.py enforces it), so the
simulator, notebooks and the real runtime all run this same code."""
