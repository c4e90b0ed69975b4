"""A prediction's settings and a marked change's are typed (issue 51); the codec writes
them as the objects the API always had and reads them back to the same values."""
import pytest

from stallscope.correlate import change, codec
from stallscope.correlate.model import Prediction, ProposedSettings, WatchedSettings
from stallscope.report import LoaderSettings


def test_a_predictions_settings_are_written_as_set_and_read_back():
    p = Prediction("cpu_throttle", "raise the CPU limit to 2.5 cores and num_workers from 4 to 6",
                   ProposedSettings(num_workers=6, cpu_limit_cores=2.5), 0.01, 0.2, 1.5, "replayed", "medium")
    body = codec.prediction(p)
    # only what the change sets, the CPU limit first (the order cpulimit.py always wrote)
    assert list(body["settings"].items()) == [("cpu_limit_cores", 2.5), ("num_workers", 6)]
    assert codec.decode_prediction(body) == p
    assert p.configured and not ProposedSettings()
    assert p.settings.names() == {"num_workers", "cpu_limit_cores"}
    with pytest.raises(codec.Malformed, match="unknown prefetch"):
        codec.decode_settings({"prefetch": 4})  # a setting no change sets is not dropped silently


def test_a_marked_change_names_what_changed_and_splits_after_the_new_workers_round():
    old = change.settings_of(LoaderSettings(num_workers=2, prefetch_factor=2), 1.0)
    new = change.settings_of(LoaderSettings(num_workers=4, prefetch_factor=2), 1.0)
    assert old == WatchedSettings(num_workers=2, prefetch_factor=2, cpu_quota_cores=1.0)
    marked = change.mark(old, new, 5, None)
    assert marked.what == "num_workers 2 -> 4"
    assert change.settings_of(None, None) == WatchedSettings()
    body = codec.change(change.view(marked, _no_batches()))
    assert body["from"] == {"num_workers": 2, "prefetch_factor": 2, "persistent_workers": None,
                            "pin_memory": None, "batch_size": None, "cpu_quota_cores": 1.0}
    assert codec.decode_change(body).mark.after_settings == new


def _no_batches():
    import numpy as np

    from stallscope.correlate.trace import RankTrace
    z = np.zeros(0, np.int64)
    return RankTrace.from_columns({}, None, z, z, z, None)
