"""Who sent a hook report: from the kernel (SO_PEERCRED, the sender's cgroup and process
tree) and the kubelet's pod map, never from what the message claims; and which names a
sender may speak as (threat model: docs/deploy.md).

- admission.py   ``admit(report, sender)``: identity as its own step before the rank
                 table folds a report; an ``Admission``, or ``Refused``
- peer.py        a connection's ``Source`` and its domain (pod, else cgroup and uid)
- pids.py        PIDs across PID namespaces (a trainer's view of its workers to ours)
- kubepods.py    the node's pods by UID, from the API server: vouches for pod names
- allowlist.py   ``--identity.allow``: names pinned to uids and cgroups
- names.py       who may report as a name no pod map vouches for (first come, bound)
- rankworkers.py a rank's loader workers as the agent's PID namespace numbers them, and
                 only those that descend from its trainer
- hooksocket.py  the hook socket file: the agent's, its permissions, watched
- refusal.py     ``Refused``: a report refused for who sent it (counted by reason)

Imports: stallscope.system and each other; no other room of the agent. The rank table
asks this room, never the other way round: what admission reads of the table, and the
fields of a rank's state that say who its workers are, are protocols declared here.
"""
