"""dualjax: DualPath over a prefill mesh and a decode mesh (see README and docs/architecture.md).

Sub-packages, lowest first; each imports only from those above it in this list:

* `dualjax.core`: run settings, workloads, the scheduler, policies, batching, records and report
  maths (NumPy only: no JAX, MPI or TensorStore);
* `dualjax.sim`: the discrete-event simulator (core and model configs only);
* `dualjax.runtime`: the hosts, messages, transports, buffers and driver of a real run;
* `dualjax.bench`: benchmarks, each with its baseline in the same run;
* `dualjax.cli`: the `dualjax` command.
"""
