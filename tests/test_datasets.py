"""Specification of `maskedrnn.datasets`.

Oracles:
- the vendored Japanese Vowels files are checked byte for byte against the
  aeon 1.6.0 wheel (SHA-256 of `aeon/datasets/data/JapaneseVowels/*.ts`),
  re-read with a separate throwaway parser (`str.split` + `numpy.fromstring`),
  and checked against the numbers published with the data set (UCI
  description, see `UCI_TEST_COUNTS`);
- `parse_ts` on hand-written `.ts` texts whose values are written out in the
  test;
- `pad_batch` against `keras.utils.pad_sequences` (which is NumPy code, the same
  on every backend);
- `make_distance_to_end_task` against a count of the valid tokens at or after
  each position, computed with a reversed cumulative sum.
"""

import hashlib
import math
import pathlib

import keras
import numpy as np
import pytest

from maskedrnn import datasets
from maskedrnn.datasets import (
    load_japanese_vowels,
    make_distance_to_end_task,
    pad_batch,
    parse_ts,
)

DATA_DIR = pathlib.Path(datasets.__file__).parent / "data"

# SHA-256 of the files inside aeon 1.6.0's py3-none-any wheel (PyPI), at
# aeon/datasets/data/JapaneseVowels/JapaneseVowels_{TRAIN,TEST}.ts.
AEON_1_6_0_SHA256 = {
    "JapaneseVowels_TRAIN.ts": (
        "68a430eabd919cc77f40b1f5f3bc0dcafacc1486bca9260785aeb7d262cc78cd"
    ),
    "JapaneseVowels_TEST.ts": (
        "b3d41d6a0ca3bcad3afb9ca7d4365382aa51341e2e58bae2a574babdda5b9462"
    ),
}

# UCI Machine Learning Repository, "Japanese Vowels" description
# (https://archive.ics.uci.edu/ml/datasets/Japanese+Vowels, file
# JapaneseVowels.data.html; the same text is reproduced as the description of
# OpenML data set 375): "Training: 270 (30 utterances by 9 speakers)",
# "Testing: 370 (24-88 utterances by the same 9 speakers ...)", "In ae.test,
# speakers 1 to 9 have the corresponding number of blocks: 31 35 88 44 29 24
# 40 50 29", "Length of Time Series: 7 - 29", "Degree of LPC coefficients: 12".
UCI_TRAIN_COUNTS = [30] * 9
UCI_TEST_COUNTS = [31, 35, 88, 44, 29, 24, 40, 50, 29]
# OpenML data set 375 (the UCI files flattened to one row per frame, train and
# test together) has 9961 instances, i.e. 9961 frames in all.
OPENML_TOTAL_FRAMES = 9961


def _simple_read(path):
    """Throwaway oracle parser: everything after '@data', split on ':'."""
    lines = path.read_text().splitlines()
    start = [line.strip() for line in lines].index("@data") + 1
    xs, ys = [], []
    for line in lines[start:]:
        if not line.strip():
            continue
        *dims, label = line.split(":")
        xs.append(np.stack([np.fromstring(d, sep=",") for d in dims], axis=1))
        ys.append(int(label) - 1)
    return xs, np.array(ys)


# --------------------------------------------------------------------------
# Vendored Japanese Vowels data
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(AEON_1_6_0_SHA256))
def test_vendored_files_are_the_aeon_1_6_0_files(name):
    digest = hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest()
    assert digest == AEON_1_6_0_SHA256[name]


def test_license_file_is_shipped_next_to_the_data():
    text = (DATA_DIR / "JapaneseVowels_LICENSE.md").read_text()
    for fact in ("CC BY 4.0", "10.24432/C5NS47", "Kudo", "aeon", "1.6.0"):
        assert fact in text


@pytest.mark.parametrize(
    "split, counts", [("train", UCI_TRAIN_COUNTS), ("test", UCI_TEST_COUNTS)]
)
def test_japanese_vowels_matches_uci_description(split, counts):
    x, y = load_japanese_vowels(split)
    assert len(x) == len(y) == sum(counts)
    assert y.dtype == np.int32
    # Speakers are consecutive blocks of utterances, speaker "1" first.
    np.testing.assert_array_equal(y, np.repeat(np.arange(9), counts))
    for seq in x:
        assert seq.dtype == np.float32
        assert seq.ndim == 2 and seq.shape[1] == 12
        assert 7 <= seq.shape[0] <= 29
        assert np.isfinite(seq).all()


def test_japanese_vowels_totals():
    x_train, _ = load_japanese_vowels("train")
    x_test, _ = load_japanese_vowels("test")
    lengths = [len(s) for s in x_train + x_test]
    assert len(lengths) == 640
    assert min(lengths) == 7 and max(lengths) == 29
    assert sum(lengths) == OPENML_TOTAL_FRAMES


@pytest.mark.parametrize("split", ["train", "test"])
def test_japanese_vowels_values_match_independent_parse(split):
    x, y = load_japanese_vowels(split)
    ref_x, ref_y = _simple_read(DATA_DIR / f"JapaneseVowels_{split.upper()}.ts")
    np.testing.assert_array_equal(y, ref_y)
    assert len(x) == len(ref_x)
    for got, ref in zip(x, ref_x):
        np.testing.assert_array_equal(got, ref.astype(np.float32))


def test_japanese_vowels_metadata_from_parse_ts():
    _, labels, meta = parse_ts(DATA_DIR / "JapaneseVowels_TRAIN.ts")
    assert meta == {
        "problem_name": "JapaneseVowels",
        "timestamps": False,
        "missing": False,
        "univariate": False,
        "dimensions": 12,
        "equal_length": False,
        "class_label": True,
        "class_labels": [str(i) for i in range(1, 10)],
    }
    assert sorted(set(labels)) == [str(i) for i in range(1, 10)]


def test_load_japanese_vowels_rejects_unknown_split():
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        load_japanese_vowels("validation")


# --------------------------------------------------------------------------
# parse_ts on hand-written texts
# --------------------------------------------------------------------------

MULTIVARIATE = """\
# A comment line, then the header (tags are case-insensitive).
@problemName tiny problem
@timeStamps false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true yes no
@DATA

1.5,2,?:-3,4e-1,5:yes
# comments may appear between cases
?:7:no
"""


def test_parse_ts_multivariate_missing_unequal_lengths():
    series, labels, meta = parse_ts(MULTIVARIATE)
    assert len(series) == 2
    expected0 = np.array([[1.5, -3.0], [2.0, 0.4], [math.nan, 5.0]], np.float32)
    np.testing.assert_array_equal(series[0], expected0)  # NaN == NaN here
    np.testing.assert_array_equal(series[1], np.array([[math.nan, 7.0]], np.float32))
    assert all(s.dtype == np.float32 for s in series)
    np.testing.assert_array_equal(labels, np.array(["yes", "no"]))
    assert meta == {
        "problem_name": "tiny problem",
        "timestamps": False,
        "missing": True,
        "univariate": False,
        "dimensions": 2,
        "equal_length": False,
        "class_label": True,
        "class_labels": ["yes", "no"],
    }


def test_parse_ts_univariate_without_labels_and_crlf():
    text = (
        "@problemName uni\r\n@univariate true\r\n@equalLength true\r\n"
        "@seriesLength 3\r\n@classLabel false\r\n@data\r\n1,2,3\r\n4,5,6\r\n"
    )
    series, labels, meta = parse_ts(text)
    assert labels is None
    np.testing.assert_array_equal(series[0], [[1.0], [2.0], [3.0]])
    np.testing.assert_array_equal(series[1], [[4.0], [5.0], [6.0]])
    assert meta["series_length"] == 3 and meta["class_labels"] == []


def test_parse_ts_regression_targets():
    text = "@univariate true\n@targetLabel true\n@data\n1,2:0.25\n3:-1\n"
    series, targets, meta = parse_ts(text)
    np.testing.assert_array_equal(targets, np.array([0.25, -1.0], np.float32))
    assert targets.dtype == np.float32 and meta["target_label"] is True
    np.testing.assert_array_equal(series[0], [[1.0], [2.0]])


def test_parse_ts_reads_paths(tmp_path):
    path = tmp_path / "tiny.ts"
    path.write_text(MULTIVARIATE)
    from_text = parse_ts(MULTIVARIATE)
    for source in (path, str(path)):
        series, labels, meta = parse_ts(source)
        np.testing.assert_array_equal(labels, from_text[1])
        assert meta == from_text[2]
        for a, b in zip(series, from_text[0]):
            np.testing.assert_array_equal(a, b)


def test_parse_ts_rejects_non_text():
    with pytest.raises(TypeError, match="path .* or the file's text"):
        parse_ts(b"@data\n1,2\n")


HEAD = "@dimensions 2\n@classLabel true a b\n@data\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("1,2:3,4:a\n@data\n", r"Line 1: data found before the @data line"),
        (HEAD + "1:2:a\n@dimensions 2\n", r"Line 5: header line '@dimensions'"),
        (HEAD + "1:2:a\n1:2:3:a\n", r"Line 5: found 3 dimensions, but "),
        ("@classLabel true a\n@data\n1:2:a\n1:a\n", r"Line 4: found 1 dim.*earlier"),
        ("@univariate true\n@classLabel false\n@data\n1:2\n", r"Line 4: .*univariate"),
        (HEAD + "1:x:a\n", r"Line 4, dimension 1: 'x' is not a number"),
        (HEAD + "1,,2:1,2,3:a\n", r"Line 4, dimension 0: '' is not a number"),
        (HEAD + ":1:a\n", r"Line 4, dimension 0: no values"),
        (HEAD + "1,2:3:a\n", r"Line 4: dimensions have different lengths \[2, 1\]"),
        (HEAD + "1:2:c\n", r"Line 4: class label 'c' is not one of"),
        (HEAD + "1,2\n", r"Line 4: expected values followed by ':<label>'"),
        ("@classLabel true\n@data\n1:a\n", r"Line 1: @classLabel true must list"),
        ("@classLabel false a\n@data\n1\n", r"Line 1: @classLabel false takes no"),
        ("@classLabel true a a\n@data\n1:a\n", r"Line 1: @classLabel lists a label"),
        ("@missing maybe\n@data\n1\n", r"Line 1: @missing must be followed by"),
        ("@dimensions two\n@data\n1\n", r"Line 1: @dimensions takes one positive"),
        ("@problemName\n@data\n1\n", r"Line 1: @problemName needs a name"),
        ("\n@colour blue\n@data\n1\n", r"Line 2: unknown header tag '@colour'"),
        ("@data extra\n1\n", r"Line 1: @data must stand alone"),
        ("@targetLabel true\n@data\n1:x\n", r"Line 3: regression target 'x'"),
        (
            "@equalLength true\n@classLabel false\n@data\n1,2\n1,2,3\n",
            r"Line 5: case has 3 time steps but the first case has 2",
        ),
        (
            "@equalLength true\n@seriesLength 3\n@data\n1,2\n",
            r"Line 4: case has 2 time steps but @seriesLength is 3",
        ),
        ("@problemName p\n", r"No @data line found"),
        ("@problemName p\n@data\n\n", r"no cases after it"),
        ("@timeStamps true\n@data\n(1,2)\n", r"does not support timestamped"),
        ("@classLabel true a\n@targetLabel true\n@data\n1:a\n", r"both @classLabel"),
    ],
)
def test_parse_ts_malformed_input_names_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_ts(text)


# --------------------------------------------------------------------------
# pad_batch
# --------------------------------------------------------------------------

RAGGED_1D = [[1, 2, 3], [], [4], [5, 6, 7, 8, 9]]


@pytest.mark.parametrize("padding", ["pre", "post"])
@pytest.mark.parametrize("maxlen", [None, 5, 8])
@pytest.mark.parametrize("dtype, value", [("int32", -1), ("float32", 0.5)])
def test_pad_batch_matches_keras_pad_sequences_1d(padding, maxlen, dtype, value):
    padded, lengths = pad_batch(
        RAGGED_1D, maxlen=maxlen, padding=padding, value=value, dtype=dtype
    )
    expected = keras.utils.pad_sequences(
        RAGGED_1D, maxlen=maxlen, padding=padding, value=value, dtype=dtype
    )
    assert padded.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(padded, expected)
    np.testing.assert_array_equal(lengths, [3, 0, 1, 5])
    assert lengths.dtype == np.int32


@pytest.mark.parametrize("padding", ["pre", "post"])
def test_pad_batch_matches_keras_pad_sequences_with_features(padding):
    rng = np.random.default_rng(0)
    seqs = [rng.normal(size=(n, 3)) for n in (4, 1, 7, 2)]
    padded, lengths = pad_batch(seqs, maxlen=9, padding=padding, value=-2.0)
    expected = keras.utils.pad_sequences(
        seqs, maxlen=9, padding=padding, value=-2.0, dtype="float32"
    )
    assert padded.shape == (4, 9, 3) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded, expected)
    np.testing.assert_array_equal(lengths, [4, 1, 7, 2])


def test_pad_batch_on_japanese_vowels_keeps_every_frame():
    x, _ = load_japanese_vowels("test")
    padded, lengths = pad_batch(x, padding="pre")
    assert padded.shape == (370, 29, 12)
    for i, seq in enumerate(x):
        np.testing.assert_array_equal(padded[i, 29 - lengths[i] :], seq)
        assert not padded[i, : 29 - lengths[i]].any()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(padding="both"), r"padding must be 'pre' or 'post'"),
        (dict(maxlen=-1), r"maxlen must be >= 0"),
        (dict(maxlen=2.5), r"maxlen must be a non-negative int or None"),
        (dict(maxlen=True), r"maxlen must be a non-negative int or None"),
        (dict(maxlen=2), r"sequences\[1\] has 3 steps, more than maxlen=2"),
        (dict(dtype="no-such-dtype"), r"dtype 'no-such-dtype' is not a NumPy"),
    ],
)
def test_pad_batch_checks_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pad_batch([[1, 2], [1, 2, 3]], **kwargs)


def test_pad_batch_checks_sequences():
    with pytest.raises(ValueError, match="sequences is empty"):
        pad_batch([])
    with pytest.raises(ValueError, match=r"sequences\[1\] is a scalar"):
        pad_batch([[1.0], 2.0])
    with pytest.raises(ValueError, match=r"sequences\[1\] has feature shape \(4,\)"):
        pad_batch([np.zeros((2, 3)), np.zeros((2, 4))])


# --------------------------------------------------------------------------
# make_distance_to_end_task
# --------------------------------------------------------------------------


def _distance_oracle(valid, n_classes):
    """Valid tokens at or after each position, minus one; -1 at padding."""
    after = np.cumsum(valid[:, ::-1], axis=1)[:, ::-1] - 1
    return np.where(valid, np.minimum(after, n_classes - 1), -1)


@pytest.mark.parametrize("padding", ["pre", "post"])
def test_distance_to_end_labels(padding):
    n, maxlen, vocab, classes = 300, 20, 7, 6
    ids, labels, lengths = make_distance_to_end_task(
        n, maxlen, vocab_size=vocab, n_classes=classes, padding=padding, seed=3
    )
    assert ids.shape == labels.shape == (n, maxlen) and lengths.shape == (n,)
    assert ids.dtype == labels.dtype == lengths.dtype == np.int32
    steps = np.arange(maxlen)
    if padding == "post":
        valid = steps[None, :] < lengths[:, None]
    else:
        valid = steps[None, :] >= maxlen - lengths[:, None]
    # Tokens 1..vocab-1 exactly where the sequence is, 0 elsewhere.
    np.testing.assert_array_equal(ids != 0, valid)
    assert ids.max() == vocab - 1 and ids[valid].min() == 1
    np.testing.assert_array_equal(labels, _distance_oracle(valid, classes))
    # Lengths uniform in [maxlen // 5, maxlen]: both ends are reached.
    assert lengths.min() == maxlen // 5 and lengths.max() == maxlen


def test_distance_to_end_is_reproducible_and_padding_only_moves_labels():
    a = make_distance_to_end_task(50, 12, seed=7)
    b = make_distance_to_end_task(50, 12, seed=7)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    c = make_distance_to_end_task(50, 12, seed=8)
    assert not np.array_equal(a[0], c[0])
    _, pre_labels, pre_lengths = make_distance_to_end_task(
        50, 12, padding="pre", seed=7
    )
    np.testing.assert_array_equal(pre_lengths, a[2])
    for i, length in enumerate(a[2]):
        np.testing.assert_array_equal(pre_labels[i], np.roll(a[1][i], 12 - length))


def test_distance_to_end_min_length():
    _, labels, lengths = make_distance_to_end_task(
        100, 10, min_length=10, n_classes=30, seed=0
    )
    np.testing.assert_array_equal(lengths, 10)
    np.testing.assert_array_equal(labels, np.tile(np.arange(9, -1, -1), (100, 1)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0), r"n must be an int >= 1"),
        (dict(maxlen=0), r"maxlen must be an int >= 1"),
        (dict(vocab_size=1), r"vocab_size must be an int >= 2"),
        (dict(n_classes=0), r"n_classes must be an int >= 1"),
        (dict(min_length=0), r"min_length must be an int >= 1"),
        (dict(min_length=11), r"min_length=11 is larger than maxlen=10"),
        (dict(padding="left"), r"padding must be 'pre' or 'post'"),
        (dict(n=2.0), r"n must be an int >= 1"),
    ],
)
def test_distance_to_end_checks_arguments(kwargs, message):
    args = dict(n=4, maxlen=10)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        make_distance_to_end_task(**args)


def test_spoken_digits_frames_spell_the_labels():
    x, labels, lengths = datasets.make_spoken_digits_task(
        50, max_digits=4, features=6, noise=0.0, padding="pre", seed=1
    )
    assert x.shape == (50, lengths.max(), 6) and labels.shape == (50, 4)
    assert x.dtype == np.float32 and labels.dtype == np.int32
    # Padding is exactly zero and in front ("pre"); silence is zero too
    # without noise, so the non-silent runs of frames spell the digits.
    prototypes = {}
    for row, n, label in zip(x, lengths, labels):
        assert not row[: len(row) - n].any()
        spoken = []
        for frame in row[len(row) - n :]:
            if not frame.any():
                spoken.append(None)
                continue
            # A digit's frames are positive multiples of its prototype.
            unit = frame / np.linalg.norm(frame)
            key = next(
                (k for k, v in prototypes.items() if np.allclose(unit, v, atol=1e-5)),
                len(prototypes),
            )
            prototypes.setdefault(key, unit)
            spoken.append(key)
        runs = [
            k
            for i, k in enumerate(spoken)
            if k is not None and (i == 0 or spoken[i - 1] != k)
        ]
        digits = label[label > 0]
        assert len(runs) == len(digits)
        assert 1 <= len(digits) <= 4
    # With noise, real frames are never all-zero (Masking keeps them).
    x, _, lengths = datasets.make_spoken_digits_task(20, seed=2)
    valid = np.arange(x.shape[1])[None] < lengths[:, None]
    assert np.all(np.any(x != 0, axis=-1) == valid)
    with pytest.raises(ValueError, match="max_digits must be an int >= 1; got max_"):
        datasets.make_spoken_digits_task(3, max_digits=0)
