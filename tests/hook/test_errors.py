"""The hook reports the loader's own error once, bounded and sanitised, and the same
exception reaches the training loop (issue 32, item 4); it measures the first batch."""
import pytest

from stallscope.hook import errors
from stallscope.hook.channel import Stream
from stallscope.hook.identity import detect


class _Tensor:
    """What the walk reads of a torch.Tensor or a numpy array: ``nbytes``."""

    def __init__(self, n, size):
        self.nbytes = n * size


def _stream():
    s = Stream(detect(None, job="j", rank=0))
    s.loader = {"num_workers": 2}
    return s


def test_the_error_is_reported_once_bounded_and_without_control_characters():
    s = _stream()
    text = ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback:\n  File "
            "\"/home/other/secret/dataset.py\", line 3\nRuntimeError: line\x1b[31m two " + "x" * 5000)
    errors.note_error(RuntimeError(text), s, 42)
    e = s.loader["error"]
    assert e["type"] == "RuntimeError" and e["at_ns"] == 42
    # the first line and the last, each bounded, never the traceback's paths between them
    assert e["message"].startswith("Caught RuntimeError in DataLoader worker process 0. | "
                                   "RuntimeError: line[31m two xx")
    assert "/home/other" not in e["message"] and e["message"].isprintable()
    assert len(e["message"]) == len("Caught RuntimeError in DataLoader worker process 0.") + 3 + \
        errors.MAX_LINE_CHARS <= errors.MAX_MESSAGE_CHARS
    errors.note_error(ValueError("second"), s, 43)
    assert s.loader["error"]["type"] == "RuntimeError"  # once per stream
    errors.note_error(KeyboardInterrupt(), _stream(), 1)  # the user's, not the loader's


def test_an_error_whose_str_raises_is_still_reported():
    class Odd(Exception):
        def __str__(self):
            raise ValueError("no")
    s = _stream()
    errors.note_error(Odd(), s, 1)
    assert s.loader["error"]["message"] == "" and s.loader["error"]["type"].endswith("Odd")


def test_batch_bytes_walks_nested_batches_within_bounds():
    batch = {"x": _Tensor(1000, 4), "y": [_Tensor(10, 8), (_Tensor(5, 2),)], "name": "a"}
    assert errors.batch_bytes(batch) == 4000 + 80 + 10
    assert errors.batch_bytes({"name": "a", "n": [1, 2]}) is None  # no tensor: not measured
    # a list of 10**5 tensors: MAX_WALK objects looked at (the list itself is one)
    assert errors.batch_bytes([_Tensor(1, 1)] * 10 ** 5) == errors.MAX_WALK - 1


def test_a_watched_loader_passes_the_same_exception_and_reports_it():
    import stallscope
    boom = RuntimeError("unable to allocate shared memory(shm): No space left on device (28)")

    def batches():
        yield {"x": _Tensor(256, 4)}
        yield {"x": _Tensor(256, 4)}
        raise boom

    class Loader:
        def __iter__(self):
            return batches()

    it = iter(stallscope.watch(Loader(), job="j", rank=0))
    next(it)
    next(it)
    with pytest.raises(RuntimeError) as got:
        next(it)
    assert got.value is boom


def test_the_first_batch_of_each_iterator_is_measured_on_its_stream():
    torch = pytest.importorskip("torch")
    import stallscope

    # batch_size=None: the items are the batches, the first one 256 x 4 float32
    items = [{"x": torch.zeros(256, dtype=torch.float32)}, {"x": torch.zeros(1)}, {"x": torch.zeros(1)}]
    loader = torch.utils.data.DataLoader(items, batch_size=None, num_workers=0)
    it = iter(stallscope.watch(loader, job="j", rank=0))
    assert [len(b) for b in it] == [1, 1, 1]
    assert it._stream.loader["batch_bytes"] == 1024  # the first batch's, not a later one's
