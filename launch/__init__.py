"""Entry points: `python -m mpi4py -m launch.main ...` under mpirun; `launch.inproc` for notebooks."""
