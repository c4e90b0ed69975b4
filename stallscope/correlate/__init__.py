"""Pure analysis over per-rank timelines (the correlator), and its wiring into the agent.

- trace.py      one rank's batch events and signal samples as numpy arrays
- overlap.py    data-wait share, GPU-idle share, GPU-idle time overlapping data-wait
- period.py     which batches stall and the dominant stall period (batches, seconds)
- sawtooth.py   GPU dips vs the loader's stall cadence: a score and the best lag
- causes.py     cause scores from co-occurrence of signals with stalls, with evidence
- workers.py    too_few_workers: load time per worker vs compute, period = num_workers
- diagnosis.py  verdict, ranked causes, straggler: the /api/v1/diagnosis contract
- service.py    in the agent: schedule, metrics, the diagnosis route
- synth.py, evaluate.py   synthetic timelines and the labelled evaluation set

The agent calls ``install(agent)``; everything else is pure functions over traces.
"""


def install(agent):
    from .service import install as _install

    return _install(agent)
