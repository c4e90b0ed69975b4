"""What a loader process is doing, from one py-spy stack: fetch, decode, collate,
ipc_wait, idle, or other.

Three kinds of clue, strongest first:
1. the source line of the innermost Python frame: py-spy shows Python frames only, so
   a worker blocked in ``f.read()`` or ``Image.open()`` shows the caller's line, which
   names the C call it is in;
2. library modules (socket, ssl, botocore, fsspec → fetch; PIL, cv2, torchvision
   transforms, tokenizers → decode; torch's collate.py → collate; multiprocessing
   queues and connections, threading waits → a wait);
3. the words in the function names of the user's own code (``download_shard`` →
   fetch, ``decode_jpeg`` → decode, ``my_collate`` → collate).
The scan runs from the innermost frame outwards and stops at the loader's boundary
(``_worker_loop`` in a worker, ``DataLoader.__next__`` in the main process): what lies
beyond is the worker's dispatch loop or the training loop, not loader work (for a
plain iterable, stallscope's own ``watch`` ``__next__`` marks the boundary). A wait
found first does not end the scan (``requests`` blocks in ``selectors``); it decides
only when nothing stronger is found: a worker waiting straight under ``_worker_loop``
has no work (idle); the main process waiting under the DataLoader waits for a batch
(ipc_wait). A main thread with no DataLoader frame is ``outside_loader`` (the training
step); a worker in its dataset's own code that no clue names is ``other``.
"""
from __future__ import annotations

import linecache
import os
import re
from collections.abc import Mapping
from typing import Any

CLASSES = ("fetch", "decode", "collate", "ipc_wait", "idle", "outside_loader", "other")

LIBRARIES = (  # (substring of the frame's filename, class); first match wins
    ("torch/utils/data/_utils/collate.py", "collate"),
    ("webdataset/autodecode", "decode"),
    ("PIL/", "decode"), ("cv2/", "decode"), ("torchvision/transforms", "decode"),
    ("torchvision/io", "decode"), ("torchaudio/", "decode"), ("decord/", "decode"),
    ("/av/", "decode"), ("soundfile", "decode"), ("librosa/", "decode"),
    ("tokenizers/", "decode"), ("transformers/tokenization", "decode"),
    ("sentencepiece", "decode"), ("albumentations/", "decode"), ("kornia/", "decode"),
    ("imageio/", "decode"), ("skimage/", "decode"), ("nvidia/dali", "decode"),
    ("json/decoder.py", "decode"), ("/pickle.py", "decode"), ("msgpack/", "decode"),
    ("/gzip.py", "decode"), ("/bz2.py", "decode"), ("/lzma.py", "decode"),
    ("/_compression.py", "decode"), ("/base64.py", "decode"),
    ("/socket.py", "fetch"), ("/ssl.py", "fetch"), ("http/client.py", "fetch"),
    ("urllib3/", "fetch"), ("requests/", "fetch"), ("botocore/", "fetch"),
    ("boto3/", "fetch"), ("s3transfer/", "fetch"), ("google/cloud/storage", "fetch"),
    ("google/resumable_media", "fetch"), ("azure/storage", "fetch"), ("fsspec/", "fetch"),
    ("s3fs/", "fetch"), ("gcsfs/", "fetch"), ("adlfs/", "fetch"), ("smart_open/", "fetch"),
    ("huggingface_hub/", "fetch"), ("webdataset/", "fetch"), ("/tarfile.py", "fetch"),
    ("/zipfile.py", "fetch"), ("/shutil.py", "fetch"), ("h5py/", "fetch"),
    ("pyarrow/", "fetch"), ("/pathlib.py", "fetch"),
    ("multiprocessing/queues.py", "wait"), ("multiprocessing/connection.py", "wait"),
    ("multiprocessing/synchronize.py", "wait"), ("multiprocessing/resource_sharer.py", "wait"),
    ("torch/multiprocessing/reductions.py", "wait"), ("/queue.py", "wait"),
    ("/selectors.py", "wait"), ("/threading.py", "wait"),
    ("torch/utils/data/_utils/pin_memory.py", "wait"),
)
FRAMEWORK = ("torch/utils/data/", "stallscope/")   # no name clues: torch's fetcher is not I/O

LINE_RULES = (  # the innermost frame's source line: the C call it is blocked in
    ("decode", re.compile(r"\.decode\(|Image\.open\(|\.convert\(|imdecode\(|imread\(|\.loads\(|"
                          r"decompress\(|tokeni[sz]e|\.transform\(")),
    ("fetch", re.compile(r"\.(read|readinto|readline|readlines|recv|recv_into|recvfrom|"
                         r"read_bytes|read_text|get_object|download_file)\(|\bopen\(|os\.p?read\(|"
                         r"urlopen\(|\.seek\(")),
    ("collate", re.compile(r"collate")),
)
NAME_WORDS = {
    "fetch": ("fetch", "download", "read", "recv", "request", "s3", "gcs", "blob", "shard", "stream"),
    "decode": ("decode", "decompress", "transform", "augment", "resize", "crop", "tokenize",
               "tokenise", "tokenizer", "deserialize", "parse", "preprocess", "normalize",
               "unpickle", "jpeg", "png", "image", "audio", "video"),
    "collate": ("collate",),
}


def _words(name: str) -> list[str]:
    """Lower-case words of a function name: snake_case, camelCase, dotted qualnames."""
    last = name.rsplit(".", 1)[-1]
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def by_name(name: str) -> str | None:
    words = _words(name)
    for cls in ("collate", "decode", "fetch"):
        if any(w.startswith(k) for w in words for k in NAME_WORDS[cls]):
            return cls
    return None


def _stdlib(filename: str) -> bool:
    f = filename.replace("\\", "/")
    return "/lib/python3" in f and "-packages/" not in f


def by_frame(frame: Mapping[str, Any]) -> str | None:
    f = (frame.get("filename") or "").replace("\\", "/")
    for part, cls in LIBRARIES:
        if part in f:
            return cls
    if _stdlib(f) or any(p in f for p in FRAMEWORK):
        return None
    return by_name(frame.get("name") or "")


def source_line(frame: Mapping[str, Any], pid: int | None = None) -> str:
    filename, line = frame.get("filename"), frame.get("line")
    if not filename or not line:
        return ""
    candidates = [filename]
    if pid:  # the target's own filesystem: a container's files are not ours
        candidates.insert(0, "/proc/%d/root%s" % (pid, filename))
    for path in candidates:
        text = linecache.getline(path, line) if os.path.exists(path) else ""
        if text:
            return text.strip()
    return ""


def by_line(text: str) -> str | None:
    for cls, rx in LINE_RULES:
        if rx.search(text):
            return cls
    return None


def _boundary(frame: Mapping[str, Any]) -> bool:
    f = frame.get("filename") or ""
    name = frame.get("name") or ""
    return ((name.endswith("_worker_loop") and "torch/utils/data/_utils/worker.py" in f)
            or (name.endswith("__next__") and ("torch/utils/data/dataloader.py" in f
                                               or "stallscope/hook/watch.py" in f)))


def where(frame: Mapping[str, Any]) -> str:
    return "%s (%s:%s)" % (frame.get("name"), frame.get("short_filename") or frame.get("filename"),
                           frame.get("line"))


def _user(frame: Mapping[str, Any]) -> bool:
    f = frame.get("filename") or ""
    return not _stdlib(f) and not any(p in f for p in FRAMEWORK) and by_frame(frame) is None


def classify(thread: Mapping[str, Any], role: str,
             pid: int | None = None) -> tuple[str, dict[str, Any] | None, str]:
    """(class, the frame that decided it or None, the innermost source line)."""
    frames: list[dict[str, Any]] = thread.get("frames") or []  # py-spy's JSON frames
    line = source_line(frames[0], pid) if frames else ""
    in_loader = any(_boundary(f) or "torch/utils/data/" in (f.get("filename") or "") for f in frames)
    if role == "main" and not in_loader:
        return "outside_loader", frames[0] if frames else None, line
    cls = by_line(line) if line else None
    if cls:
        return cls, frames[0], line
    waiting = None
    inside = []  # frames up to the loader boundary
    for frame in frames:
        if _boundary(frame):
            break
        inside.append(frame)
        c = by_frame(frame)
        if c in ("fetch", "decode", "collate"):
            return c, frame, line
        if c == "wait" and waiting is None:
            waiting = frame
    users = [f for f in inside if _user(f)]
    if waiting is not None:
        if role == "worker" and not users:
            return "idle", waiting, line          # straight under _worker_loop: no work
        return "ipc_wait", waiting, line          # a worker's dataset, or the loop, waits
    if users:
        return "other", users[0], line            # in the dataset, doing something unnamed
    if not thread.get("active", True):
        return "idle", frames[0] if frames else None, line
    return "other", frames[0] if frames else None, line
