"""The report cadences: the contract between the hook and the agent (issue 50), declared
once, read by both ends: the hook's channel, the agent's ingest and correlator. The
analysis (correlate/) reads none of it: it reasons from the times the reports were
sent, kept in the trace (the worker_report_pid signal; correlate/slow_worker.py). A
module of its own, standard library only and importing nothing, because the hook in
every training process reads it: from the vocabulary package, ``import stallscope``
loaded every metric, signal and cause (~20 ms; the house rule: a trainer loads only the
hook)."""

# Declared once here: the hook (hook/channel.py) sends by them and the agent (its idle
# timeout, its re-judging) reads them. Each message costs the agent a
# fixed ~0.1-0.4 ms whatever it holds, and at 8 ranks x 8 workers messages were most of
# its ingest CPU (issue 15: 48 messages/s, 1.1 % of a core; issue 31: 16 -> 12/s): a
# stream's batches go when they are news, and on these beats otherwise.
#
# The hook's flush thread looks this often (seconds; env STALLSCOPE_FLUSH_INTERVAL).
FLUSH_INTERVAL_S = 1.0
# A trainer's batches go every TRAINER_FLUSH_S while its wait share holds steady, at once
# when it moves (a stall that begins or ends) or a next() has been blocked
# BLOCKED_REPORT_S (a hang must show before its batch comes); a new iterator's first
# TRAINER_PROMPT_REPORTS reports go each flush (its start is news).
TRAINER_FLUSH_S = 2.0
TRAINER_PROMPT_REPORTS = 3
BLOCKED_REPORT_S = 1.0
# A stream with nothing new still says it is alive this often (a trainer's heartbeat).
HEARTBEAT_S = 5.0
# A loader worker's batches go 1, 2, 4, 8 s apart after its first reports, then every
# WORKER_FLUSH_S (at once when its load time moves): the loader is sized from a minute of
# load times (agent/parts/loader.py WINDOW_S), which 16 s leaves each worker's in 3-4 times; a
# worker's death is its connection's close, not a missed report (issue 31: the workers'
# reports were 8 of the agent's 12 messages a second at 8 s).
WORKER_FLUSH_S = 16.0


def worker_gap(sent: int) -> float:
    """Seconds from a worker's report to its next, after ``sent`` reports: 1, 2, 4, 8,
    then WORKER_FLUSH_S. A new loader's load times reach the agent within seconds (its
    sizing and a start-up stall's cause need a few rounds of them: 4 reports in the
    first 7 s), and a steady one costs a message every 16 s."""
    return min(WORKER_FLUSH_S, 2.0 ** max(0, sent - 1))


# The longest any live stream goes without a message: the agent's idle timeout on a
# hook connection must exceed it (agent/table/ingest.py IDLE_S).
LONGEST_SILENCE_S = max(HEARTBEAT_S, WORKER_FLUSH_S)
