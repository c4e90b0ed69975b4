"""WebDataset: every shard URL opened through ``webdataset.gopen.gopen`` (what
``WebDataset(urls)``, ``url_opener`` and its cache use) is returned as a TimedFile, so
the open and the reads done while its samples are iterated count as one shard read.
The tier follows the URL: its scheme (http, s3, gcs, pipe ...) or, for paths, the mount.
"""
import sys
from time import perf_counter_ns

from .. import files, tiers


def install():
    module = sys.modules["webdataset.gopen"]
    original = module.gopen
    if getattr(original, "_stallscope", False):
        return

    def gopen(url, mode="rb", bufsize=8192, **kw):
        start = perf_counter_ns()
        stream = original(url, mode, bufsize, **kw)
        if mode != "rb":
            return stream
        try:
            return files.TimedFile(stream, url, tiers.bounded(tiers.of_url(url)),
                                   perf_counter_ns() - start)
        except Exception:
            return stream

    gopen._stallscope = True
    gopen.__wrapped__ = original
    module.gopen = gopen
    package = sys.modules.get("webdataset")
    if package is not None and getattr(package, "gopen", None) is original:
        package.gopen = gopen
