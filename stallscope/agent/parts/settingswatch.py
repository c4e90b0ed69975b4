"""Changes of a rank's loader settings or CPU quota, each marked with the prediction its
diagnosis made before it, so that ``GET /api/v1/diagnosis`` can show what the change
bought against what was predicted (the proof afterwards: correlate/change.py). The
correlator part looks once a second.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ...correlate import change
from ...correlate.model import Mark, Prediction, WatchedSettings

# A change of the loader settings is judged against the last prediction of a modelled
# configuration change made up to this long before it: the diagnosis of the moment the
# change is seen may already hold the new iterator's start-up wait, which no cause of the
# old settings explains (unexplained, no settings), while the one a second before named
# the change the user made.
PREDICTION_KEPT_S = 60.0


class SettingsWatch:
    def __init__(self, lock: threading.Lock | threading.RLock) -> None:
        self.lock = lock  # the correlator's: the HTTP thread reads ``changes`` under it
        self.settings: dict[Any, WatchedSettings] = {}  # rank key -> loader settings and quota last seen
        self.changes: dict[Any, Mark] = {}   # rank key -> the latest change marked
        self.modelled: dict[Any, tuple[float, Prediction]] = {}  # rank key -> (when, prediction)
        self.last_look_ns = 0

    def look(self, ranks: list[Any], current: list[Any], quota_cores: Callable[[Any], float | None]) -> None:
        """Mark each rank whose settings changed since the last look. ``current``: the
        correlator's [(labels, diagnosis)]; ``quota_cores``: rank key -> CFS quota."""
        known = {tuple(sorted(labels.items())): d for labels, d in current}  # labels: a rank's
        # the change came after the previous look: batches since then count as "after"
        # (their iterator's first batch, the workers' start, is left out: change.py)
        now_ns, at_ns = time.monotonic_ns(), self.last_look_ns
        self.last_look_ns = now_ns
        for r in ranks:
            if r.loader is None:
                continue
            new = change.settings_of(r.loader, quota_cores(r.key))
            old = self.settings.get(r.key)
            self.settings[r.key] = new
            found = known.get(tuple(sorted(r.labels.items())))
            predicted = found.prediction if found is not None else None
            now = time.monotonic()
            if predicted is not None and predicted.configured:
                self.modelled[r.key] = (now, predicted)
            if old is not None and new != old:
                kept = self.modelled.get(r.key)
                if not (predicted is not None and predicted.configured) and kept \
                        and now - kept[0] <= PREDICTION_KEPT_S:
                    predicted = kept[1]
                with self.lock:
                    self.changes[r.key] = change.mark(old, new, at_ns or now_ns, predicted)
        live = {r.key for r in ranks}
        for key in [k for k in self.settings if k not in live]:
            self.settings.pop(key, None)
            self.changes.pop(key, None)
            self.modelled.pop(key, None)
