"""The lab: scenarios with known answers, run live on one machine or synthesised, and
the evaluation set that scores the analysis against them (``stallscope lab ...``,
``stallscope demo``). Nothing here runs inside the agent.

What a run is:
- commands.py     the ``stallscope lab ...`` and ``stallscope demo`` commands (cli.py parses)
- scenarios.py    every scenario with a known answer, in one table
- runner.py       ``lab run``: one scenario end to end in a session of its own
- session.py      a work directory, an agent, optionally Prometheus, and the jobs in it
- job.py          one training job: N ranks of trainer.py, the fault on the last rank
- nodes.py        several lab "nodes" on one machine, each with its own agent
- pods.py         each rank as a pod: a mount namespace and a cgroup of its own
- needs.py        what a scenario needs from the machine, one line each when missing
- faults/         the fault injectors (faults/__init__.py has their map)
- findings.py     what stallscope found in a run, against the scenario's answer
- agreement.py    does the headline alert agree with diagnose's verdicts
- report.py       what a run prints while it runs and after
- demo.py, applyfix.py, scoreboard.py   the demo, ``--apply-fix``, the scoreboard

Inside a lab rank (its training process and its loader workers):
- trainer.py      one rank: ``python -m stallscope.lab.trainer PLAN.json``
- dataset.py      what its DataLoader loads, per the plan
- sources.py      where its samples come from, read in the loader workers
- growth.py, survive.py, handover.py   a worker that grows until killed, a rank that
                  outlives it, a per-batch cost in the trainer's share of the transfer

Helpers a scenario starts as processes of their own:
- objstore.py     a tiny HTTP object store over a directory
- slowfs.py       a read-only FUSE filesystem with injected latency
- checkpointer.py checkpoint bursts against the object store

The evaluation set (no live run):
- synth.py        synthetic timelines with known answers
- synthetic.py    the synthetic recipe of each scenario that has one
- traces.py       labelled traces (tests/data/traces), written from the scenario table
- evaluate.py     the confusion table of expected vs found (``--check`` in CI)
- sampler.py      scenarios drawn at random from a seed (``lab sample``)
- draws.py        drawn scenarios run live, recorded, replayed and scored per class

What may import what (tests/layout/test_imports.py): the lab may use every package of
stallscope (it drives them), but nothing outside the lab imports it but cli.py, not
even ``stallscope run`` (they share stallscope.processes). The modules a lab rank runs
(trainer, dataset, sources, growth, survive, handover) import no other part of the lab
than each other and no package but the hook's, so a training process stays light.
"""
