"""Specification of `maskedrnn.metrics`.

Oracles:
- Keras' own `SparseCategoricalAccuracy`, `MeanAbsoluteError` and
  `MeanSquaredError` fed the same batches with the mask attached natively to
  `y_pred` (`keras.src.backend.set_keras_mask`; Keras' `MeanMetricWrapper`
  turns it into a sample weight). All batches there have the same number of
  time steps, where Keras' value is the mean over valid steps. Plain Keras 3
  rejects a `(batch,)` sample weight for per-step values, so its oracle gets
  that weight broadcast to `(batch, time)` by NumPy;
- NumPy: (sum over all batches of value * weight over valid steps) /
  (sum of the weights of valid steps), which also covers batches of different
  lengths;
- a model whose output carries a native mask (`Embedding(mask_zero=True)`),
  evaluated with Keras' `SparseCategoricalAccuracy`, for `compile`/`evaluate`.
"""

import keras
import numpy as np
import pytest
from keras import ops

from maskedrnn._keras_private import set_keras_mask
from maskedrnn.losses import MaskedLoss
from maskedrnn.metrics import (
    MaskedAccuracy,
    MaskedMeanAbsoluteError,
    MaskedMeanSquaredError,
)

B, T, C, F = 4, 6, 5, 3
rng = np.random.default_rng(99)


def make_mask(lengths, time=T):
    return np.arange(time)[None, :] < np.asarray(lengths)[:, None]


# Three batches with different numbers of valid steps (15, 6, 22 of 24).
MASKS = [
    make_mask([6, 5, 3, 1]),
    make_mask([1, 2, 2, 1]),
    np.array(
        [
            [1, 1, 1, 1, 1, 1],
            [0, 1, 1, 1, 1, 1],  # left-padded
            [1, 1, 1, 1, 1, 1],
            [1, 1, 0, 1, 1, 1],  # a hole
        ],
        dtype=bool,
    ),
]
LABELS = [rng.integers(0, C, size=(B, T)) for _ in MASKS]
LOGITS = [rng.normal(size=(B, T, C)).astype("float32") for _ in MASKS]
# Make the batches differ in accuracy: the second is right at every step.
LOGITS[1] = LOGITS[1] + 10.0 * np.eye(C, dtype="float32")[LABELS[1]]
REG_TRUE = [rng.normal(size=(B, T, F)).astype("float32") for _ in MASKS]
REG_PRED = [rng.normal(size=(B, T, F)).astype("float32") for _ in MASKS]
SW_SEQ = [rng.uniform(0.5, 2.0, size=(B,)).astype("float32") for _ in MASKS]
SW_STEP = [rng.uniform(0.0, 2.0, size=(B, T)).astype("float32") for _ in MASKS]

KERAS_METRIC = {
    "accuracy": keras.metrics.SparseCategoricalAccuracy,
    "mae": keras.metrics.MeanAbsoluteError,
    "mse": keras.metrics.MeanSquaredError,
}
MASKED_METRIC = {
    "accuracy": MaskedAccuracy,
    "mae": MaskedMeanAbsoluteError,
    "mse": MaskedMeanSquaredError,
}


def batches(kind):
    if kind == "accuracy":
        return list(zip(LABELS, LOGITS))
    return list(zip(REG_TRUE, REG_PRED))


def np_step_values(kind, y_true, y_pred):
    y_true = np.asarray(y_true, "float64")
    y_pred = np.asarray(y_pred, "float64")
    if kind == "accuracy":
        return (np.argmax(y_pred, -1) == y_true).astype("float64")
    if y_true.ndim == y_pred.ndim - 1:
        y_true = y_true[..., None]
    if kind == "mae":
        return np.abs(y_true - y_pred).mean(-1)
    return ((y_true - y_pred) ** 2).mean(-1)


def np_metric(kind, batch_list, masks, weights=None):
    """Sum of weighted values over valid steps / sum of their weights."""
    total = count = 0.0
    for i, ((y_true, y_pred), mask) in enumerate(zip(batch_list, masks)):
        w = mask.astype("float64")
        if weights is not None:
            sw = np.asarray(weights[i], "float64")
            w = w * (sw[:, None] if sw.ndim == 1 else sw)
        total += (np_step_values(kind, y_true, y_pred) * w).sum()
        count += w.sum()
    return total / count if count else 0.0


def with_native_mask(y_pred, mask):
    y_pred = ops.convert_to_tensor(y_pred)
    set_keras_mask(y_pred, ops.convert_to_tensor(mask))
    return y_pred


def padded(y_true, mask, pad_value=-1):
    y = np.array(y_true, dtype=np.result_type(y_true, np.asarray(pad_value)))
    y[~mask] = pad_value
    return y


def keras_weight(sample_weight):
    if sample_weight is not None and np.ndim(sample_weight) == 1:
        return np.broadcast_to(sample_weight[:, None], (B, T)).copy()
    return sample_weight


def weights_for(name):
    return {"none": None, "per_sequence": SW_SEQ, "per_step": SW_STEP}[name]


def result(metric):
    return float(ops.convert_to_numpy(metric.result()))


def test_batches_make_a_mean_of_batch_means_wrong():
    """Guards the data: a mean of per-batch accuracies would differ."""
    per_batch = [
        np_metric("accuracy", [b], [m]) for b, m in zip(batches("accuracy"), MASKS)
    ]
    overall = np_metric("accuracy", batches("accuracy"), MASKS)
    assert abs(np.mean(per_batch) - overall) > 0.05
    assert len({int(m.sum()) for m in MASKS}) == len(MASKS)


@pytest.mark.parametrize("sw", ["none", "per_sequence", "per_step"])
@pytest.mark.parametrize("kind", ["accuracy", "mae", "mse"])
def test_native_mask_accumulates_like_keras(kind, sw):
    weights = weights_for(sw)
    ours = MASKED_METRIC[kind]()
    theirs = KERAS_METRIC[kind]()
    for i, ((y_true, y_pred), mask) in enumerate(zip(batches(kind), MASKS)):
        w = None if weights is None else weights[i]
        ours.update_state(y_true, with_native_mask(y_pred, mask), sample_weight=w)
        theirs.update_state(y_true, with_native_mask(y_pred, mask), keras_weight(w))
    np.testing.assert_allclose(result(ours), result(theirs), rtol=1e-5)
    expected = np_metric(kind, batches(kind), MASKS, weights)
    np.testing.assert_allclose(result(ours), expected, rtol=1e-5)


@pytest.mark.parametrize("sw", ["none", "per_sequence", "per_step"])
@pytest.mark.parametrize("kind", ["accuracy", "mae", "mse"])
def test_pad_value_accumulates_like_keras_with_native_mask(kind, sw):
    weights = weights_for(sw)
    ours = MASKED_METRIC[kind](pad_value=-1)
    theirs = KERAS_METRIC[kind]()
    for i, ((y_true, y_pred), mask) in enumerate(zip(batches(kind), MASKS)):
        w = None if weights is None else weights[i]
        ours.update_state(padded(y_true, mask), y_pred, sample_weight=w)
        theirs.update_state(y_true, with_native_mask(y_pred, mask), keras_weight(w))
    np.testing.assert_allclose(result(ours), result(theirs), rtol=1e-5)


@pytest.mark.parametrize("kind", ["accuracy", "mae", "mse"])
def test_batches_of_different_lengths_average_over_valid_steps(kind):
    """Bucketed batches: still (sum over valid steps) / (number of valid steps)."""
    lengths = [[2, 1, 2, 2], [9, 4, 7, 1]]
    masks = [make_mask(ls, time=max(ls)) for ls in lengths]
    batch_list = []
    for mask in masks:
        time = mask.shape[1]
        if kind == "accuracy":
            y_true = rng.integers(0, C, size=(B, time))
            y_pred = rng.normal(size=(B, time, C)).astype("float32")
        else:
            y_true = rng.normal(size=(B, time, F)).astype("float32")
            y_pred = rng.normal(size=(B, time, F)).astype("float32")
        batch_list.append((y_true, y_pred))
    by_pad = MASKED_METRIC[kind](pad_value=-1)
    by_native = MASKED_METRIC[kind]()
    for (y_true, y_pred), mask in zip(batch_list, masks):
        by_pad.update_state(padded(y_true, mask), y_pred)
        by_native.update_state(y_true, with_native_mask(y_pred, mask))
    expected = np_metric(kind, batch_list, masks)
    np.testing.assert_allclose(result(by_pad), expected, rtol=1e-5)
    np.testing.assert_allclose(result(by_native), expected, rtol=1e-5)


def test_without_mask_is_the_mean_over_all_steps_like_keras():
    for kind in ("accuracy", "mae", "mse"):
        ours, theirs = MASKED_METRIC[kind](), KERAS_METRIC[kind]()
        for y_true, y_pred in batches(kind):
            ours.update_state(y_true, y_pred)
            theirs.update_state(y_true, y_pred)
        np.testing.assert_allclose(result(ours), result(theirs), rtol=1e-5)
        all_valid = [np.ones((B, T), bool)] * len(MASKS)
        expected = np_metric(kind, batches(kind), all_valid)
        np.testing.assert_allclose(result(ours), expected, rtol=1e-5)


def test_native_mask_and_pad_value_combine_with_and():
    y_true, y_pred = LABELS[0], LOGITS[0]
    pad_mask = MASKS[0]
    all_valid = np.ones((B, T), bool)
    m = MaskedAccuracy(pad_value=-1)
    m.update_state(padded(y_true, pad_mask), with_native_mask(y_pred, all_valid))
    expected = np_metric("accuracy", [(y_true, y_pred)], [pad_mask])
    np.testing.assert_allclose(result(m), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", ["mae", "mse"])
def test_errors_with_one_feature_and_targets_without_feature_axis(kind):
    """y_true (batch, time) against y_pred (batch, time, 1)."""
    masks = MASKS
    batch_list = [(t[..., 0], p[..., :1]) for t, p in batches(kind)]
    m = MASKED_METRIC[kind](pad_value=-1)
    for (y_true, y_pred), mask in zip(batch_list, masks):
        m.update_state(padded(y_true, mask), y_pred)
    np.testing.assert_allclose(result(m), np_metric(kind, batch_list, masks), rtol=1e-5)


def test_nan_pad_value_for_regression_targets():
    m = MaskedMeanSquaredError(pad_value=float("nan"))
    for (y_true, y_pred), mask in zip(batches("mse"), MASKS):
        m.update_state(padded(y_true, mask, np.nan), y_pred)
    expected = np_metric("mse", batches("mse"), MASKS)
    np.testing.assert_allclose(result(m), expected, rtol=1e-5)


@pytest.mark.parametrize("label_dtype", ["int32", "int64", "float32"])
@pytest.mark.parametrize("pred_dtype", ["float16", "float64"])
def test_accuracy_mixed_dtypes_match_keras(label_dtype, pred_dtype):
    ours = MaskedAccuracy(pad_value=-1)
    theirs = keras.metrics.SparseCategoricalAccuracy()
    for (y_true, y_pred), mask in zip(batches("accuracy"), MASKS):
        y_pred = y_pred.astype(pred_dtype)
        ours.update_state(padded(y_true, mask).astype(label_dtype), y_pred)
        theirs.update_state(y_true.astype(label_dtype), with_native_mask(y_pred, mask))
    np.testing.assert_allclose(result(ours), result(theirs), rtol=1e-6)


def test_labels_with_trailing_axis():
    m = MaskedAccuracy(pad_value=-1)
    for (y_true, y_pred), mask in zip(batches("accuracy"), MASKS):
        m.update_state(padded(y_true, mask)[..., None], y_pred)
    expected = np_metric("accuracy", batches("accuracy"), MASKS)
    np.testing.assert_allclose(result(m), expected, rtol=1e-6)


def test_reset_state_and_all_padding_batches():
    m = MaskedAccuracy(pad_value=-1)
    assert result(m) == 0.0
    m.update_state(np.full((B, T), -1), LOGITS[0])  # nothing valid
    assert result(m) == 0.0
    (y0, p0), (y1, p1) = batches("accuracy")[:2]
    m.update_state(padded(y0, MASKS[0]), p0)
    m.update_state(np.full((B, T), -1), LOGITS[1])  # changes nothing
    np.testing.assert_allclose(
        result(m), np_metric("accuracy", [(y0, p0)], MASKS[:1]), rtol=1e-6
    )
    m.reset_state()
    assert result(m) == 0.0
    m.update_state(padded(y1, MASKS[1]), p1)
    np.testing.assert_allclose(
        result(m), np_metric("accuracy", [(y1, p1)], MASKS[1:2]), rtol=1e-6
    )


def test_argument_errors():
    with pytest.raises(TypeError, match="pad_value"):
        MaskedAccuracy(pad_value="x")
    with pytest.raises(ValueError, match="integer labels"):
        MaskedAccuracy().update_state(np.eye(C)[LABELS[0]], LOGITS[0])
    with pytest.raises(ValueError, match="features axis"):
        MaskedMeanAbsoluteError().update_state(REG_TRUE[0][..., 0], REG_PRED[0])


@pytest.mark.parametrize(
    "cls", [MaskedAccuracy, MaskedMeanAbsoluteError, MaskedMeanSquaredError]
)
def test_serialization_round_trip(cls):
    m = cls(pad_value=-1, name="custom")
    config = m.get_config()
    assert config["pad_value"] == -1 and config["name"] == "custom"
    assert cls.from_config(config).get_config() == config
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(m)
    )
    assert type(revived) is cls and revived.get_config() == config
    registered = f"maskedrnn>{cls.__name__}"
    assert keras.saving.get_registered_object(registered) is cls


def test_directions_for_callbacks():
    assert MaskedAccuracy()._direction == "up"
    assert MaskedMeanAbsoluteError()._direction == "down"
    assert MaskedMeanSquaredError()._direction == "down"


# --------------------------------------------------------------------------
# In a model.

VOCAB, EMB, N = 7, 4, 12


def token_data():
    data_rng = np.random.default_rng(5)
    lengths = np.array([6, 3, 1, 5, 2, 6, 4, 1, 3, 5, 2, 6])
    valid = make_mask(lengths)
    x = np.where(valid, data_rng.integers(1, VOCAB, size=(N, T)), 0)
    y = data_rng.integers(0, C, size=(N, T))
    return x, y, valid


def tiny_model(mask_zero):
    keras.utils.set_random_seed(11)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, EMB, mask_zero=mask_zero)(inputs)
    return keras.Model(inputs, keras.layers.Dense(C)(h))


# Evaluation never builds the optimizer, so loading reports its missing slots.
@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")
def test_evaluate_matches_native_mask_model_and_survives_saving(tmp_path):
    x, y, valid = token_data()
    native = tiny_model(mask_zero=True)
    native.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
    )
    plain = tiny_model(mask_zero=False)
    plain.set_weights(native.get_weights())
    plain.compile(
        loss=MaskedLoss(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True), pad_value=-1
        ),
        metrics=[MaskedAccuracy(pad_value=-1, name="acc")],
    )
    y_pad = np.where(valid, y, -1)
    # batch_size 4: three batches with 15, 13 and 16 valid steps.
    want = native.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
    got = plain.evaluate(x, y_pad, batch_size=4, verbose=0, return_dict=True)
    np.testing.assert_allclose(got["acc"], want["acc"], rtol=1e-6)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    logits = plain.predict(x, verbose=0)
    expected = np_metric("accuracy", [(y, logits)], [valid])
    np.testing.assert_allclose(got["acc"], expected, rtol=1e-6)
    unmasked = np.mean(np.argmax(logits, -1) == y)
    assert abs(unmasked - expected) > 1e-3  # the mask matters for this data

    path = str(tmp_path / "model.keras")
    plain.save(path)
    loaded = keras.models.load_model(path)
    again = loaded.evaluate(x, y_pad, batch_size=4, verbose=0, return_dict=True)
    np.testing.assert_allclose(again["acc"], got["acc"], rtol=1e-6)
