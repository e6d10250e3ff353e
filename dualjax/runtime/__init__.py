"""The real runtime: messages, transports (in-process and MPI), host buffers, the prefill and
decode hosts, rank 0's driver, the start-up profile, warm start, and (`cluster/`) the bring-up
that places the ranks and runs them."""
