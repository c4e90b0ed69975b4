"""Pure analysis over per-rank timelines (the correlator): functions over numpy arrays,
no threads, no agent. The agent's correlator part (stallscope/agent/parts/correlator.py)
builds the traces from its live state and publishes the results; the lab
(stallscope/lab/) feeds it synthetic and recorded traces with known answers.

- trace.py      one rank's batch events and signal samples as numpy arrays
- overlap.py    data-wait share, GPU-idle share, GPU-idle time overlapping data-wait
- period.py     which batches stall and the dominant stall period (batches, seconds)
- sawtooth.py   GPU dips vs the loader's stall cadence: a score and the best lag
- causes.py     cause scores from co-occurrence of signals with stalls, with evidence
- workers.py    too_few_workers: load time per worker vs compute, period = num_workers
- diagnosis.py  verdict, ranked causes, straggler: the /api/v1/diagnosis contract
"""
