"""Length bucketing (`maskedrnn.bucketing`) against independent oracles.

- Batches: every sequence once per epoch, padded exactly as
  `keras.utils.pad_sequences` pads it to the bucket's boundary (`pre` and
  `post`), labels padded with `label_pad_value`, lengths as a numpy count.
- Training: `model.fit` on a `BucketedDataset` (a MaskedBidirectional model,
  `MaskedLoss`) gives the losses and weights of Keras' masked
  `Bidirectional(LSTM(use_cudnn=False))` trained with `train_on_batch` on the
  same batches padded to the global maximum length.
- `evaluate`'s `MaskedAccuracy` equals a numpy count on the oracle's
  predictions; `BucketedDataset.predict` returns the oracle's predictions in
  the caller's order (trimmed, re-padded, or one per sequence).
- Compilation: the batch shapes the train step is traced for, the same as
  for Keras' masked layer's model on the same batches (JAX: one per distinct
  batch shape, i.e. per boundary with `drop_remainder`; TensorFlow: one).
"""

import inspect

import keras
import numpy as np
import pytest

import maskedrnn
from maskedrnn.bucketing import (
    BucketBatchSampler,
    BucketedDataset,
    quantile_boundaries,
)
from tests.helpers import BACKEND

VOCAB, CLASSES, UNITS = 12, 4, 4


def token_data(n=37, low=1, high=15, seed=0, lengths=None):
    """Unpadded token-id sequences and per-step labels (distance to the end,
    clipped), plus one label per sequence (length parity)."""
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = rng.integers(low, high + 1, n)
    x = [rng.integers(1, VOCAB, k).astype("int32") for k in lengths]
    y_steps = [np.minimum(np.arange(k)[::-1], CLASSES - 1) for k in lengths]
    y_steps = [y.astype("int32") for y in y_steps]
    y_seq = (lengths % 2).astype("int32")
    return x, y_steps, y_seq, lengths


# ----------------------------------------------------------------- sampler


def test_sampler_covers_every_index_once_in_its_bucket():
    lengths = np.random.default_rng(1).integers(0, 50, 203)
    sampler = BucketBatchSampler(lengths, 16, boundaries=[10, 25, 49], seed=3)
    for epoch in range(3):
        batches = sampler.batches(epoch=epoch)
        assert len(batches) == len(sampler)
        flat = np.concatenate(batches)
        np.testing.assert_array_equal(np.sort(flat), np.arange(len(lengths)))
        for b in batches:
            assert 1 <= len(b) <= 16
            t = sampler.boundary_of(b)
            # The smallest boundary that holds every row, and one bucket only.
            assert lengths[b].max() <= t
            lower = {10: -1, 25: 10, 49: 25}[t]
            assert (lengths[b] > lower).all()
    assert [sampler.padded_length(n) for n in (0, 10, 11, 49)] == [10, 10, 25, 49]
    with pytest.raises(
        ValueError, match="longer than the last boundary 49; got length=50"
    ):
        sampler.padded_length(50)
    # Per bucket: ceil(size / 16) batches.
    sizes = [(lengths <= 10).sum(), ((lengths > 10) & (lengths <= 25)).sum()]
    sizes.append(len(lengths) - sum(sizes))
    assert len(sampler) == sum(-(-s // 16) for s in sizes)


def test_sampler_shuffles_by_seed_and_epoch():
    lengths = np.arange(100) % 40
    a = BucketBatchSampler(lengths, 8, num_buckets=3, seed=7)
    b = BucketBatchSampler(lengths, 8, num_buckets=3, seed=7)
    c = BucketBatchSampler(lengths, 8, num_buckets=3, seed=8)
    assert a.batches(epoch=0) == b.batches(epoch=0)
    assert a.batches(epoch=0) != a.batches(epoch=1)
    assert a.batches(epoch=0) != c.batches(epoch=0)
    # Iterating yields the current epoch and advances it (DataLoader protocol).
    assert list(a) == b.batches(epoch=0) and a.epoch == 1
    assert list(a) == b.batches(epoch=1)
    # Without shuffling: buckets in order, indices in their original order,
    # except that two batches differing in length and size lead: here no
    # batch differs from the first in both, so the first such pair moves up
    # (the short bucket's 4-row batch and the long bucket's first batch).
    plain = BucketBatchSampler(lengths, 8, boundaries=[19, 39], shuffle=False)
    expected = []
    for members in (np.flatnonzero(lengths <= 19), np.flatnonzero(lengths > 19)):
        expected += [list(members[i : i + 8]) for i in range(0, len(members), 8)]
    assert [len(b) for b in expected] == [8] * 7 + [4] + [8] * 5
    expected = expected[7:9] + expected[:7] + expected[9:]
    assert plain.batches() == expected


def test_first_two_batches_differ_in_length_and_size():
    # Keras' TensorFlow adapter takes its tensor spec from the first two
    # batches; they must differ wherever the epoch's batches differ.
    lengths = np.random.default_rng(0).integers(1, 30, 90)
    for shuffle in (True, False):
        sampler = BucketBatchSampler(
            lengths, 16, boundaries=[10, 20, 29], seed=0, shuffle=shuffle
        )
        for epoch in range(10):
            first, second = sampler.batches(epoch=epoch)[:2]
            assert sampler.boundary_of(first) != sampler.boundary_of(second)
            assert len(first) != len(second)


def test_drop_remainder_keeps_only_full_batches():
    lengths = np.random.default_rng(2).integers(1, 30, 90)
    sampler = BucketBatchSampler(lengths, 16, boundaries=[10, 29], drop_remainder=True)
    batches = sampler.batches()
    assert all(len(b) == 16 for b in batches)
    small = (lengths <= 10).sum()
    assert len(batches) == small // 16 + (90 - small) // 16
    assert len(sampler.batches(drop_remainder=False)) > len(batches)


def test_carry_remainder_fills_every_batch_but_the_last():
    lengths = np.random.default_rng(4).integers(1, 50, 203)
    bounds = [10, 25, 49]
    for drop in (False, True):
        sampler = BucketBatchSampler(
            lengths,
            16,
            boundaries=bounds,
            seed=5,
            carry_remainder=True,
            drop_remainder=drop,
        )
        for epoch in range(3):
            batches = sampler.batches(epoch=epoch)
            assert len(batches) == len(sampler) == (12 if drop else 13)
            assert sorted(len(b) for b in batches) == ([] if drop else [11]) + [16] * 12
            flat = np.concatenate(batches)
            assert len(set(flat.tolist())) == len(flat)
            if not drop:
                np.testing.assert_array_equal(np.sort(flat), np.arange(203))
            for b in batches:
                t = sampler.boundary_of(b)
                assert lengths[b].max() <= t
                # Rows come from this bucket or, carried, from the one below.
                lower = {10: -1, 25: -1, 49: 10}[t]
                assert (lengths[b] > lower).all()
    # Without shuffling, bucket by bucket, the carried rows first.
    plain = BucketBatchSampler(
        [3, 9, 4, 8, 2], 2, boundaries=[4, 9], shuffle=False, carry_remainder=True
    )
    assert plain.batches() == [[0, 2], [3], [4, 1]]
    assert [plain.boundary_of(b) for b in plain.batches()] == [4, 9, 9]


def test_quantile_boundaries_split_the_lengths_evenly():
    lengths = np.random.default_rng(4).integers(20, 101, 1000)
    bounds = quantile_boundaries(lengths, 4)
    assert len(bounds) == 4 and bounds[-1] == lengths.max()
    for i, b in enumerate(bounds):
        # At least the quantile's share of sequences fits, and b occurs.
        assert (lengths <= b).mean() >= (i + 1) / 4 and b in lengths
        assert (lengths < b).mean() < (i + 1) / 4
    assert quantile_boundaries([5, 5, 5, 6], 4) == [5, 6]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"boundaries": [10, 5]}, "strictly increasing"),
        ({"boundaries": [3, 8]}, "add a boundary >= 9"),
        ({"batch_size": 0}, "batch_size must be an int >= 1; got batch_size=0"),
        ({"batch_size": 50, "drop_remainder": True}, "leaves no batch"),
        ({"num_buckets": 0}, "num_buckets must be an int >= 1"),
    ],
)
def test_sampler_errors_name_the_argument(kwargs, message):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        BucketBatchSampler([1, 5, 9, 2], **args)


def test_dataset_errors_name_the_argument():
    x, y_steps, _, _ = token_data(6)
    with pytest.raises(TypeError, match="x must be a list of arrays"):
        BucketedDataset(np.zeros((6, 4)), batch_size=2)
    with pytest.raises(ValueError, match="y has 5 rows but x has 6"):
        BucketedDataset(x, np.zeros(5), batch_size=2)
    bad = list(y_steps)
    bad[2] = bad[2][:-1]
    with pytest.raises(ValueError, match=r"y\[2\] has .* steps but x\[2\]"):
        BucketedDataset(x, bad, batch_size=2)
    with pytest.raises(ValueError, match="padding must be 'pre' or 'post'; got 'mid'"):
        BucketedDataset(x, padding="mid")


# -------------------------------------------------------------- batches


@pytest.mark.parametrize("padding", ["pre", "post"])
def test_batches_are_padded_like_pad_sequences_to_the_boundary(padding):
    x, y_steps, y_seq, lengths = token_data()
    ds = BucketedDataset(
        x,
        y_steps,
        batch_size=8,
        boundaries=[5, 10, 15],
        padding=padding,
        return_lengths=True,
        seed=0,
    )
    seq_ds = BucketedDataset(
        x, y_seq, batch_size=8, boundaries=[5, 10, 15], padding=padding, seed=0
    )
    assert len(ds) == len(seq_ds)
    for i, indices in enumerate(ds.batch_indices):
        (ids, n), labels = ds[i]
        t = min(b for b in (5, 10, 15) if b >= lengths[indices].max())
        want = keras.utils.pad_sequences(
            [x[j] for j in indices], maxlen=t, padding=padding, value=0
        )
        want_y = keras.utils.pad_sequences(
            [y_steps[j] for j in indices], maxlen=t, padding=padding, value=-1
        )
        np.testing.assert_array_equal(ids, want)
        np.testing.assert_array_equal(labels, want_y)
        np.testing.assert_array_equal(n, lengths[indices])
        assert ids.dtype == np.int32 and n.dtype == np.int32
        seq_x, seq_y = seq_ds[i]
        np.testing.assert_array_equal(seq_x, want)
        np.testing.assert_array_equal(seq_y, y_seq[indices])


def test_feature_sequences_keep_their_feature_axes():
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(k, 3)).astype("float32") for k in (2, 7, 3, 6)]
    ds = BucketedDataset(x, batch_size=2, boundaries=[3, 7], shuffle=False)
    (first,), (second,) = ds[0], ds[1]
    assert first.shape == (2, 3, 3) and second.shape == (2, 7, 3)
    np.testing.assert_array_equal(first[0, :2], x[0])
    np.testing.assert_array_equal(first[0, 2:], 0)
    np.testing.assert_array_equal(second[1, :6], x[3])


# ------------------------------------------------------------- training


def build(kind, return_sequences=True):
    """Embedding(mask_zero) -> bidirectional LSTM -> Dense softmax."""
    ids = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 5, mask_zero=True)(ids)
    lstm = keras.layers.LSTM(UNITS, return_sequences=return_sequences, use_cudnn=False)
    if kind == "ours":
        h = maskedrnn.MaskedBidirectional(lstm)(h)
    else:
        h = keras.layers.Bidirectional(lstm)(h)
    out = keras.layers.Dense(CLASSES, activation="softmax")(h)
    model = keras.Model(ids, out)
    model.compile(
        optimizer=keras.optimizers.SGD(0.5),
        loss=maskedrnn.MaskedLoss("sparse_categorical_crossentropy", pad_value=-1),
        metrics=[maskedrnn.MaskedAccuracy(pad_value=-1)],
    )
    return model


@pytest.mark.on_backends("torch")
@pytest.mark.slow  # jit compilations of two models, several shapes
@pytest.mark.parametrize("padding", ["pre", "post"])
def test_fit_on_buckets_equals_keras_masked_on_global_padding(padding):
    # 16 sequences in each of two buckets: two batch shapes (few compilations).
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 8, 16), rng.integers(8, 16, 16)])
    lengths[-1] = 15
    x, y_steps, _, _ = token_data(lengths=rng.permutation(lengths))
    ds = BucketedDataset(
        x, y_steps, batch_size=8, boundaries=[7, 15], padding=padding, seed=5
    )
    keras.utils.set_random_seed(0)
    ours, oracle = build("ours"), build("keras")
    oracle.set_weights(ours.get_weights())
    used, weights = [], []
    record = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: used.append(ds.batch_indices),
        on_epoch_end=lambda epoch, logs: weights.append(ours.get_weights()),
    )
    # shuffle=False: Keras would otherwise reorder the dataset's batches.
    ours.fit(ds, epochs=2, verbose=0, shuffle=False, callbacks=[record])
    assert used[0] != used[1]  # a new seeded order each epoch

    t = int(lengths.max())
    ids = keras.utils.pad_sequences(x, maxlen=t, padding=padding)
    labels = keras.utils.pad_sequences(y_steps, maxlen=t, padding=padding, value=-1)
    for epoch in range(2):
        # The same batches, in the same order, padded to the longest sequence.
        for b in used[epoch]:
            oracle.train_on_batch(ids[b], labels[b])
        for a, b in zip(weights[epoch], oracle.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    # evaluate: the accuracy over all valid steps, counted in numpy.
    probs = oracle.predict(ids, verbose=0)
    valid = labels != -1
    want = (probs.argmax(-1) == labels)[valid].mean()
    # Unshuffled: on TensorFlow, Keras' spec comes from batches 0 and 1.
    plain = BucketedDataset(
        x, y_steps, batch_size=8, boundaries=[7, 15], padding=padding, shuffle=False
    )
    result = ours.evaluate(plain, verbose=0, return_dict=True)
    np.testing.assert_allclose(result["masked_accuracy"], want, rtol=1e-6)

    # predict, in the caller's order: valid steps, or re-padded to the max.
    rows = plain.predict(ours)
    assert len(rows) == len(x)
    for i, row in enumerate(rows):
        want_row = probs[i, valid[i]]
        np.testing.assert_allclose(row, want_row, atol=1e-5)
    padded = plain.predict(ours, pad_to_max=True)
    assert padded.shape == probs.shape
    np.testing.assert_allclose(padded[valid], probs[valid], atol=1e-5)
    assert not padded[~valid].any()


@pytest.mark.on_backends("torch")
@pytest.mark.slow
def test_lengths_input_and_per_sequence_outputs_in_original_order():
    x, _, y_seq, lengths = token_data(29, seed=1)
    tokens = keras.Input((None,), dtype="int32")
    n_valid = keras.Input((), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 5)(tokens)  # no Keras mask: lengths only
    h = maskedrnn.MaskedBidirectional(keras.layers.GRU(UNITS))(h, lengths=n_valid)
    model = keras.Model([tokens, n_valid], keras.layers.Dense(1)(h))
    model.compile(optimizer="adam", loss="mse")

    y = y_seq[:, None].astype("float32")
    ds = BucketedDataset(
        x, y, batch_size=6, boundaries=[6, 11, 15], return_lengths=True, seed=2
    )
    model.fit(ds, epochs=1, verbose=0)
    ids = keras.utils.pad_sequences(x, padding="post")
    want = model.predict([ids, lengths.astype("int32")], verbose=0)
    got = ds.predict(model)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    # model.predict(ds) concatenates in batch order: `batch_indices` undoes it.
    order = np.concatenate(ds.batch_indices)
    np.testing.assert_allclose(model.predict(ds, verbose=0), want[order], atol=1e-5)


# ---------------------------------------------------------- compilation


@pytest.mark.skipif(
    BACKEND == "torch", reason="Keras runs torch eagerly: no train step to compile"
)
@pytest.mark.slow
def test_compilations_are_bounded_by_the_boundaries():
    x, y_steps, _, _ = token_data(80, seed=3)

    def traces_of_fit(kind):
        """The batch shapes the train step was traced for, over 3 epochs."""
        traces = []

        class Counting(keras.Model):
            def train_step(self, *args):
                # Python runs here only while jax.jit / tf.function traces.
                traces.append(tuple(keras.tree.flatten(args[-1])[0].shape))
                return super().train_step(*args)

        inner = build(kind)
        model = Counting(inner.inputs, inner.outputs)
        model.compile(
            optimizer="sgd",
            loss=maskedrnn.MaskedLoss("sparse_categorical_crossentropy", pad_value=-1),
        )
        ds = BucketedDataset(
            x,
            y_steps,
            batch_size=8,
            boundaries=[4, 8, 12, 15],
            drop_remainder=True,
            seed=0,
        )
        model.fit(ds, epochs=3, verbose=0)
        return ds, sorted(traces)

    ds, ours = traces_of_fit("ours")
    _, keras_masked = traces_of_fit("keras")
    shapes = {(len(b), ds.sampler.boundary_of(b)) for b in ds.batch_indices}
    assert len(shapes) == 4 and len(ds) >= 8  # more batches than shapes
    # No more traces than Keras' masked layer on the same batches ...
    assert ours == keras_masked
    # ... and no more than the batch shapes need.
    if BACKEND == "jax":
        # One jit compilation per padded length, none more in later epochs.
        assert ours == sorted(shapes)
    else:
        # TensorFlow: the dataset's spec leaves the time axis free (the first
        # two batches differ), so the tf.function is traced once.
        assert len(ours) == 1 and ours[0][1] is None


def test_to_tf_dataset_yields_the_batches_with_a_full_batch_size_in_its_spec():
    pytest.importorskip("tensorflow")
    x, y_steps, y_seq, _ = token_data(64, seed=5)

    def dataset(**kwargs):
        return BucketedDataset(
            x, y_steps, batch_size=8, boundaries=[5, 10, 15], seed=1, **kwargs
        )

    ds = dataset(carry_remainder=True)  # 64 rows: every batch has 8
    tf_ds = ds.to_tf_dataset()
    x_spec, y_spec = tf_ds.element_spec
    assert x_spec.shape.as_list() == [8, None] == y_spec.shape.as_list()
    for epoch in range(2):  # each pass is one epoch, then the epoch advances
        expected = [ds.make_batch(b) for b in ds.sampler.batches(epoch=epoch)]
        got = list(tf_ds.as_numpy_iterator())
        assert len(got) == len(expected) == 8 and ds.sampler.epoch == epoch + 1
        for (gx, gy), (ex, ey) in zip(got, expected):
            np.testing.assert_array_equal(gx, ex)
            np.testing.assert_array_equal(gy, ey)
    # An incomplete batch leaves the batch axis free; lengths and
    # per-sequence labels keep their shapes.
    short = BucketedDataset(
        x[:61],
        y_seq[:61],
        batch_size=8,
        boundaries=[5, 10, 15],
        seed=1,
        return_lengths=True,
    )
    (xs, ls), ys = short.to_tf_dataset().element_spec
    assert xs.shape.as_list() == [None, None]
    assert ls.shape.as_list() == [None] == ys.shape.as_list()
    # `fit` on it trains exactly as `train_on_batch` on epochs 0 and 1.
    reference = build("ours")
    model = build("ours")
    model.set_weights(reference.get_weights())
    oracle = dataset(carry_remainder=True)
    for epoch in range(2):
        for b in oracle.sampler.batches(epoch=epoch):
            reference.train_on_batch(*oracle.make_batch(b))
    tf_fit = dataset(carry_remainder=True).to_tf_dataset()
    model.fit(tf_fit, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- demo


@pytest.mark.on_backends("torch")
@pytest.mark.slow  # two quick trainings
def test_demo_bucket_with_masked_rnn(capsys):
    from maskedrnn import demo

    results = demo.run_bucket_demo(
        quick=True, epochs=1, num_buckets=2, verbose=1, layer="rnn"
    )
    assert "s/epoch" in capsys.readouterr().out
    for name in ("bucketed", "padded"):
        assert 0.0 <= results[name]["accuracy"] <= 1.0


@pytest.mark.on_backends("torch")
@pytest.mark.slow  # two quick trainings (one jit compilation per boundary)
def test_demo_bucket_prints_seconds_per_epoch_with_and_without(capsys, monkeypatch):
    from maskedrnn import datasets, demo

    results = demo.run_bucket_demo(quick=True, epochs=1, num_buckets=2, verbose=1)
    out = capsys.readouterr().out
    assert "s/epoch" in out and "padded to 29" in out
    assert f"bucketed, boundaries {results['boundaries']}" in out
    lengths = [len(s) for s in datasets.load_japanese_vowels("train")[0]]
    assert results["boundaries"] == quantile_boundaries(lengths, 2)
    for name in ("bucketed", "padded"):
        assert len(results[name]["epoch_s"]) == 1
        assert 0.0 <= results[name]["accuracy"] <= 1.0

    # The command line passes what run_bucket_demo accepts (a stand-in with
    # its real signature: `python -m maskedrnn --bucket` once failed on an
    # argument it did not take).
    calls = []
    signature = inspect.signature(demo.run_bucket_demo)
    monkeypatch.setattr(
        demo.cli, "run_bucket_demo",
        lambda **kw: calls.append(signature.bind(**kw).arguments),
    )
    assert demo.main(["--bucket", "--quick", "--task", "distance"]) == 0
    assert calls[0]["task"] == "distance" and calls[0]["quick"]
    assert demo.main(["--bucket", "--quick", "--layer", "rnn"]) == 0
    assert calls[1]["layer"] == "rnn"
    with pytest.raises(SystemExit):
        demo.main(["--bucket", "--save", "x.keras"])
