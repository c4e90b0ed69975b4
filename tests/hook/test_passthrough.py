"""A watched loader is read as the loader itself (hook/passthrough.py, issue 19): the same
answers as the original for reads, writes, misses, methods, properties and the class's
own checks, with its attributes found without the proxy's Python __getattr__."""
import importlib

import pytest

import stallscope
from stallscope.hook import passthrough

watch = importlib.import_module("stallscope.hook.watch")  # the module (the package exports the function)


def test_a_watched_dataloader_answers_as_the_dataloader():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dl = DataLoader(list(range(12)), batch_size=4)
    w = stallscope.watch(dl)
    assert type(w) in passthrough.SUBCLASSES and isinstance(w, DataLoader)
    assert w.__class__ is DataLoader and repr(w) == repr(dl)
    assert not hasattr(w, "state_dict") and hasattr(dl, "state_dict") is False
    assert w.batch_size == 4 and w.dataset is dl.dataset and len(w) == 3
    assert w.multiprocessing_context is None  # a property, run on the shared state
    w.pin_memory_device = "x"  # a write through the watched loader lands on the original
    assert dl.pin_memory_device == "x"
    with pytest.raises(ValueError, match="batch_size"):
        w.batch_size = 8  # DataLoader's own check, as on the original
    assert dl.batch_size == 4
    assert [b.tolist() for b in w] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert stallscope.watch(w) is w and stallscope.unwatch(w) is dl


def test_the_attribute_reads_go_through_no_python_frame():
    """The property checked, not a time: the proxy's __getattr__ is never called for the
    reads a framework makes per batch (accelerate's hasattr(loader, "state_dict"))."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    calls = []
    original = watch._Watched.__getattr__

    def counting(self, name):
        calls.append(name)
        return original(self, name)

    watch._Watched.__getattr__ = counting
    try:
        w = stallscope.watch(DataLoader(list(range(4))))
        hasattr(w, "state_dict"), w.dataset, w.num_workers, w.check_worker_number_rationality
        generic = stallscope.watch(iter([1]))  # an iterator: the generic proxy
        hasattr(generic, "no_such_attribute")
    finally:
        watch._Watched.__getattr__ = original
    assert "state_dict" not in calls and "dataset" not in calls, calls
    assert calls, "the generic proxy still answers class attributes through __getattr__"


def test_type_of_a_watched_loader_builds_a_plain_one():
    """Lightning and accelerate rebuild a loader with type(loader)(...): what they get
    iterates as a plain DataLoader, unwatched, rather than failing."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    w = stallscope.watch(DataLoader(list(range(6)), batch_size=3))
    rebuilt = type(w)(list(range(4)), batch_size=2)
    assert [b.tolist() for b in rebuilt] == [[0, 1], [2, 3]]
    assert w.__class__(list(range(2))).__class__ is DataLoader


def test_a_loader_class_with_slots_of_its_own_keeps_the_generic_proxy():
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    class Slotted(DataLoader):
        __slots__ = ("extra",)

    dl = Slotted(list(range(4)), batch_size=2)
    dl.extra = 5
    w = stallscope.watch(dl)
    assert type(w) in watch._PROXY_TYPES  # a slot would not be shared by a subclass' instance
    assert w.extra == 5 and w.batch_size == 2 and isinstance(w, Slotted)
    assert [b.tolist() for b in w] == [[0, 1], [2, 3]]


def test_the_shared_dict_is_not_used_where_a_property_shadows_a_key():
    class Odd:
        def __init__(self):
            self.__dict__["size"] = "from the dict"  # hidden on Odd by the property

        @property
        def size(self):
            return "from the property"

        def __iter__(self):
            return iter([1, 2])

    o = Odd()
    w = stallscope.watch(o)
    assert w.size == o.size == "from the property"
    assert list(w) == [1, 2]


def test_the_generic_proxy_shares_the_objects_attributes_both_ways():
    class Loader:
        def __init__(self):
            self.epoch = 0

        def __iter__(self):
            return iter([self.epoch])

    orig = Loader()
    w = stallscope.watch(orig)
    w.epoch = 3
    assert orig.epoch == 3
    orig.seed = 7  # set on the original after it was watched
    assert w.seed == 7 and list(w) == [3]
    del w.seed
    assert not hasattr(orig, "seed") and not hasattr(w, "seed")


def test_a_miss_on_the_generic_proxy_says_what_the_object_would():
    class Loader:
        def __iter__(self):
            return iter([])

    w = stallscope.watch(Loader())
    with pytest.raises(AttributeError, match="'Loader' object has no attribute 'batchsize'"):
        w.batchsize  # noqa: B018


def test_loader_classes_past_the_bound_get_the_generic_proxy(monkeypatch):
    """Classes made per call (a factory) must not grow the proxy classes without end."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    monkeypatch.setattr(passthrough, "_SUBCLASSES", {})
    monkeypatch.setattr(passthrough, "_BOUND", 2)
    made = len(passthrough.SUBCLASSES)
    kinds = [type(stallscope.watch(type("L%d" % i, (DataLoader,), {})(list(range(4)))))
             for i in range(5)]
    assert len(passthrough.SUBCLASSES) - made == 2
    assert all(k in watch._PROXY_TYPES for k in kinds[2:])
