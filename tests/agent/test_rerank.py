"""A standing stall is ranked again only when what its ranking rests on moved."""
from stallscope.agent.parts import rerank

SEC = 1_000_000_000
NOW = 1000 * SEC
LOADER = {"num_workers": 8, "prefetch_factor": 4, "pin_memory": False}


def basis(since_s=900.0, share=0.78, loader=LOADER, signals=("cfs_throttled_ratio", "psi_io_some_ratio")):
    return rerank.Basis.of(int(since_s * SEC), share, loader, signals)


def test_a_steady_stall_stands_until_its_basis_is_a_minute_old():
    old = basis()
    assert rerank.unchanged(old, basis(share=0.80, since_s=900.8), 15.0, NOW)
    assert not rerank.unchanged(old, basis(), rerank.MAX_AGE_S, NOW)
    assert not rerank.unchanged(None, basis(), 1.0, NOW)


def test_a_moved_share_a_new_signal_new_settings_or_another_stall_are_new_inputs():
    old = basis()
    assert not rerank.unchanged(old, basis(share=0.78 * 1.11 + 0.001), 15.0, NOW)
    assert not rerank.unchanged(old, basis(share=0.6), 15.0, NOW)
    assert not rerank.unchanged(old, basis(signals=("cfs_throttled_ratio",)), 15.0, NOW)
    assert not rerank.unchanged(old, basis(loader=dict(LOADER, num_workers=16)), 15.0, NOW)
    # a stall 100 s old whose start moved 30 s later: another segment, analysed again
    assert not rerank.unchanged(old, basis(since_s=930.0), 15.0, NOW)


def test_a_small_share_moves_by_the_absolute_slack():
    old = basis(share=0.05)
    assert rerank.unchanged(old, basis(share=0.05 + rerank.SHARE_ABS * 0.9), 5.0, NOW)
    assert not rerank.unchanged(old, basis(share=0.05 + rerank.SHARE_ABS * 1.1), 5.0, NOW)
