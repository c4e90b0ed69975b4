"""The vocabulary against what a real agent emits and records: the golden run of
tests/golden (every exporter on, every hook-fed part fed, the correlator run; see
tests/helpers/golden.py). A metric emitted but not declared, a declared metric no part
emits, a metric or signal from another part than its declared producer, a signal
recorded but not declared, and a declared signal its producer never records all fail.

A part cannot build an undeclared family (stallscope.host.families raises KeyError),
so an undeclared metric shows here as that part failing to collect."""
import collections

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallscope import vocabulary
from tests.helpers import golden

DECLARED = {m.family_name: m for m in vocabulary.METRICS}


def none(found, what):
    """Fail, listing ``found``, unless it is empty."""
    if found:
        pytest.fail("%s:\n%s" % (what, "\n".join("  - %s" % f for f in sorted(found))), pytrace=False)


@pytest.fixture(scope="module")
def run():
    return golden.golden_run()


@pytest.fixture(scope="module")
def families(run):
    """{family name: [samples]} of the run's exposition."""
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(run.exposition)}


def test_every_emitted_metric_is_declared(run, families):
    none(run.failures, "parts failed to collect in the golden run (a KeyError names a metric "
                       "or signal that is not declared in stallscope.vocabulary)")
    none([n for n in families if n not in DECLARED],
         "emitted but not declared in stallscope.vocabulary")
    none(["%s is a %s, declared a %s" % (n, kind, DECLARED[n].kind)
          for n, (kind, _samples) in families.items() if kind != DECLARED[n].kind],
         "emitted with another type than declared")


def test_every_declared_metric_is_emitted(families):
    none([m.name for m in vocabulary.METRICS if not families.get(m.family_name, (None, []))[1]],
         "declared in stallscope.vocabulary but no part emitted a sample of them in the golden "
         "run (emit them, extend the run in tests/helpers/golden.py, or drop the declaration)")


def test_every_metric_comes_from_its_declared_producer(run):
    by = collections.defaultdict(set)
    for part, names in run.emitted_by.items():
        for name in names:
            by[name].add(part)
    none(["%s: declared from %s, emitted by %s" % (m.name, m.producer, ", ".join(sorted(by[m.family_name])))
          for m in vocabulary.METRICS if by[m.family_name] and by[m.family_name] != {m.producer}],
         "metrics emitted by another part than their declared producer")


def test_every_declared_signal_is_recorded_by_its_producer(run):
    stored = {sig for names in run.stored.values() for sig in names}
    producers = collections.defaultdict(set)
    for (_scope, sig), parts in run.recorded.items():
        producers[sig] |= parts
    none(["%s (producer %s)" % (s.name, s.producer) for s in vocabulary.SIGNALS if s.name not in stored],
         "signals declared in stallscope.vocabulary that no part recorded in the golden run's "
         "sample store")
    none(["%s: declared from %s, recorded by %s" % (s.name, s.producer, ", ".join(sorted(producers[s.name])))
          for s in vocabulary.SIGNALS if producers[s.name] != {s.producer}],
         "signals recorded by another part than their declared producer")


def test_every_recorded_signal_is_declared_for_its_scope(run):
    none({"%s (by %s)" % (sig, ", ".join(sorted(parts)))
          for (_scope, sig), parts in run.recorded.items() if sig not in vocabulary.SIGNAL},
         "signals recorded but not declared in stallscope.vocabulary")
    none({"%s at a %s scope (declared: %s)" % (sig, golden.scope_kind(scope),
                                               ", ".join(vocabulary.SIGNAL[sig].scopes))
          for (scope, sig) in run.recorded if golden.scope_kind(scope) not in vocabulary.SIGNAL[sig].scopes},
         "signals recorded at a kind of scope they do not declare")
    # The sample store holds what was recorded, under the scopes the run looked at.
    recorded = collections.defaultdict(set)
    for scope, sig in run.recorded:
        recorded[scope].add(sig)
    assert {sc: sorted(sigs) for sc, sigs in recorded.items()} == {
        sc: sigs for sc, sigs in run.stored.items() if sigs}
