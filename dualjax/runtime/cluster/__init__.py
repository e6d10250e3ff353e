"""Cluster bring-up: which node runs which rank (placement), a rank's devices, the start-up checks across
hosts (preflight), hosts as Linux namespaces on one machine (netns), the MPI rank entry point (rank), and
the runner that runs a cluster's ranks in one process or under mpiexec (runner)."""
