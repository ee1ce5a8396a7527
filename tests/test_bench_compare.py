"""`maskedrnn.bench.compare`: a ratio before and after a change, flagged
MOVED only when its interval moved the slow kernel."""

from maskedrnn.bench.compare import compare


def _result(ours_ms, base_ms):
    ours = {"impl": "maskedrnn", "mode": "train", "times_ms": ours_ms}
    base = {"impl": "keras_masked", "mode": "train", "times_ms": base_ms}
    ratio = sum(ours_ms) / sum(base_ms)
    return {
        "ratios": {"train": {"maskedrnn/keras_masked": ratio}},
        "rows": [ours, base],
    }


def test_a_ratio_made_slower_beyond_its_interval_is_moved():
    [(line, slower)] = compare(
        _result([1.0] * 5, [1.0] * 5), _result([2.0] * 5, [1.0] * 5)
    )
    assert line.endswith("MOVED") and slower
    assert "train maskedrnn/keras_masked" in line


def test_overlapping_intervals_are_not_flagged():
    before = _result([1.0, 1.2, 0.9, 1.1, 1.0], [1.0] * 5)
    after = _result([1.1, 1.0, 1.2, 0.9, 1.0], [1.0] * 5)
    [(line, slower)] = compare(before, after)
    assert line.endswith("intervals overlap") and not slower


def test_a_ratio_made_faster_is_moved_but_not_slower():
    [(line, slower)] = compare(
        _result([2.0] * 5, [1.0] * 5), _result([1.0] * 5, [1.0] * 5)
    )
    assert line.endswith("MOVED") and not slower


def test_ratios_only_one_run_has_are_skipped():
    before = {"ratios": {}, "rows": []}
    assert compare(before, _result([1.0] * 5, [1.0] * 5)) == []
