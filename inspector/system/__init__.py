"""The machine: memory limits (cgroup, Slurm, rlimit), RSS sampling, units."""
