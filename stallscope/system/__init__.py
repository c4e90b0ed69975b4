"""What the kernel says, read in one place: procfs (``/proc/<pid>/stat``, ``status``,
``mountinfo``, ``cgroup`` ...) and cgroupfs (hierarchies, Kubernetes path shapes).
Every reader takes the procfs root as an argument (``--path.procfs``; /host/proc in a
DaemonSet), so tests point it at fixtures. Standard library only."""
