"""Specification of `maskedrnn.losses`.

Oracles:
- Keras' own loss objects called on a `y_pred` that carries the same mask
  natively (`keras.src.backend.set_keras_mask`, which is what a masked model
  output carries), so `MaskedLoss` must reproduce `keras.losses.Loss.__call__`
  with a mask, every reduction included. Plain Keras 3 rejects a `(batch,)`
  sample weight for per-step losses, so its oracle gets that weight
  broadcast to `(batch, time)` by NumPy;
- NumPy formulas for each per-step loss and each reduction, written from the
  Keras documentation (sum over valid steps divided by the number of valid
  steps for "sum_over_batch_size", etc.), independent of Keras;
- a model whose output carries a native mask (`Embedding(mask_zero=True)`),
  trained with the plain Keras loss, for `compile`/`fit`.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

from maskedrnn._keras_private import set_keras_mask
from maskedrnn.losses import MaskedLoss, masked_loss

B, T, C, F = 4, 6, 5, 3
# Right-padded rows, a row with a single step, and a left-padded row.
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 0],
    ],
    dtype=bool,
)
REDUCTIONS = ["sum_over_batch_size", "sum", "mean", "mean_with_sample_weight", None]
KINDS = ["sparse_ce_logits", "sparse_ce", "categorical_ce", "mse", "mae", "binary_ce"]

rng = np.random.default_rng(1234)
LOGITS = rng.normal(size=(B, T, C)).astype("float32")
PROBS = (np.exp(LOGITS) / np.exp(LOGITS).sum(-1, keepdims=True)).astype("float32")
LABELS = rng.integers(0, C, size=(B, T))
ONE_HOT = np.eye(C, dtype="float32")[LABELS]
REG_TRUE = rng.normal(size=(B, T, F)).astype("float32")
REG_PRED = rng.normal(size=(B, T, F)).astype("float32")
BIN_TRUE = rng.integers(0, 2, size=(B, T, 1)).astype("float32")
BIN_PRED = rng.uniform(0.05, 0.95, size=(B, T, 1)).astype("float32")
SW_SEQ = np.array([1.0, 2.0, 0.5, 3.0], dtype="float32")
SW_STEP = rng.uniform(0.0, 2.0, size=(B, T)).astype("float32")


def keras_loss(kind, reduction="sum_over_batch_size"):
    """The Keras loss instance for `kind`."""
    return {
        "sparse_ce_logits": lambda: keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=reduction
        ),
        "sparse_ce": lambda: keras.losses.SparseCategoricalCrossentropy(
            reduction=reduction
        ),
        "categorical_ce": lambda: keras.losses.CategoricalCrossentropy(
            reduction=reduction
        ),
        "mse": lambda: keras.losses.MeanSquaredError(reduction=reduction),
        "mae": lambda: keras.losses.MeanAbsoluteError(reduction=reduction),
        "binary_ce": lambda: keras.losses.BinaryCrossentropy(reduction=reduction),
    }[kind]()


KERAS_NAMES = {
    "sparse_ce": "sparse_categorical_crossentropy",
    "categorical_ce": "categorical_crossentropy",
    "mse": "mean_squared_error",
    "mae": "mean_absolute_error",
    "binary_ce": "binary_crossentropy",
}


def data(kind):
    """(y_true, y_pred) of `kind`, with real labels at every step."""
    return {
        "sparse_ce_logits": (LABELS, LOGITS),
        "sparse_ce": (LABELS, PROBS),
        "categorical_ce": (ONE_HOT, PROBS),
        "mse": (REG_TRUE, REG_PRED),
        "mae": (REG_TRUE, REG_PRED),
        "binary_ce": (BIN_TRUE, BIN_PRED),
    }[kind]


def padded_labels(y_true, mask, pad_value=-1):
    """`y_true` with `pad_value` at every entry of the masked steps."""
    y = np.array(y_true, dtype=np.result_type(y_true, np.asarray(pad_value)))
    y[~mask] = pad_value
    return y


def np_step_loss(kind, y_true, y_pred):
    """Per-step loss values from the textbook formulas (float64)."""
    y_true = np.asarray(y_true, "float64")
    y_pred = np.asarray(y_pred, "float64")
    if kind == "sparse_ce_logits":
        lse = np.log(np.exp(y_pred).sum(-1))
        picked = np.take_along_axis(y_pred, y_true.astype(int)[..., None], -1)
        return lse - picked[..., 0]
    if kind == "sparse_ce":
        picked = np.take_along_axis(y_pred, y_true.astype(int)[..., None], -1)
        return -np.log(picked[..., 0])
    if kind == "categorical_ce":
        return -(y_true * np.log(y_pred)).sum(-1)
    if kind == "mse":
        return ((y_true - y_pred) ** 2).mean(-1)
    if kind == "mae":
        return np.abs(y_true - y_pred).mean(-1)
    if kind == "binary_ce":
        ll = y_true * np.log(y_pred) + (1 - y_true) * np.log(1 - y_pred)
        return -ll.mean(-1)
    raise AssertionError(kind)


def np_reduce(values, mask, sample_weight, reduction):
    """The Keras reductions of masked, weighted per-step values."""
    m = np.asarray(mask, "float64")
    w = np.ones_like(m) if sample_weight is None else np.asarray(sample_weight)
    if w.ndim == 1:
        w = w[:, None]
    weighted = values * m * w
    if reduction in (None, "none"):
        return weighted
    if reduction == "sum":
        return weighted.sum()
    if reduction in ("sum_over_batch_size", "mean"):
        return weighted.sum() / m.sum() if m.sum() else 0.0
    if reduction == "mean_with_sample_weight":
        denom = (m * w).sum()
        return weighted.sum() / denom if denom else 0.0
    raise AssertionError(reduction)


def with_native_mask(y_pred, mask):
    """`y_pred` as a tensor carrying `mask` as its Keras mask."""
    y_pred = ops.convert_to_tensor(y_pred)
    set_keras_mask(y_pred, ops.convert_to_tensor(mask))
    return y_pred


def sample_weight_for(name):
    return {"none": None, "per_sequence": SW_SEQ, "per_step": SW_STEP}[name]


def keras_sample_weight(sample_weight):
    """What plain Keras accepts: a `(batch,)` weight broadcast over time."""
    if sample_weight is not None and np.ndim(sample_weight) == 1:
        return np.broadcast_to(sample_weight[:, None], (B, T)).copy()
    return sample_weight


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(
        ops.convert_to_numpy(actual), np.asarray(expected), rtol=rtol, atol=atol
    )


# --------------------------------------------------------------------------
# Value: native Keras mask on y_pred.


@pytest.mark.parametrize("sw", ["none", "per_sequence", "per_step"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_native_mask_matches_keras_and_numpy(kind, reduction, sw):
    y_true, y_pred = data(kind)
    weight = sample_weight_for(sw)
    loss = MaskedLoss(keras_loss(kind), reduction=reduction)
    got = loss(y_true, with_native_mask(y_pred, MASK), sample_weight=weight)
    expected_keras = keras_loss(kind, reduction)(
        y_true, with_native_mask(y_pred, MASK), keras_sample_weight(weight)
    )
    assert_close(got, expected_keras)
    expected_np = np_reduce(np_step_loss(kind, y_true, y_pred), MASK, weight, reduction)
    assert_close(got, expected_np, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Value: pad_value in y_true, y_pred without a mask.


@pytest.mark.parametrize("sw", ["none", "per_sequence", "per_step"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kind", KINDS)
def test_pad_value_matches_keras_with_native_mask(kind, reduction, sw):
    y_true, y_pred = data(kind)
    weight = sample_weight_for(sw)
    loss = MaskedLoss(keras_loss(kind), pad_value=-1, reduction=reduction)
    got = loss(padded_labels(y_true, MASK), y_pred, sample_weight=weight)
    assert np.all(np.isfinite(ops.convert_to_numpy(got)))
    expected = keras_loss(kind, reduction)(
        y_true, with_native_mask(y_pred, MASK), keras_sample_weight(weight)
    )
    assert_close(got, expected)


@pytest.mark.parametrize(
    "kind", ["sparse_ce", "categorical_ce", "mse", "mae", "binary_ce"]
)
@pytest.mark.parametrize("form", ["string", "function", "instance"])
def test_string_function_and_instance_losses_agree_with_keras(kind, form):
    y_true, y_pred = data(kind)
    name = KERAS_NAMES[kind]
    spec = {
        "string": name,
        "function": getattr(keras.losses, name),
        "instance": keras_loss(kind),
    }[form]
    got = MaskedLoss(spec, pad_value=-1)(padded_labels(y_true, MASK), y_pred)
    expected = keras_loss(kind)(y_true, with_native_mask(y_pred, MASK))
    assert_close(got, expected)


def test_without_any_mask_equals_the_plain_keras_loss():
    for kind in KINDS:
        y_true, y_pred = data(kind)
        assert_close(
            MaskedLoss(keras_loss(kind))(y_true, y_pred),
            keras_loss(kind)(y_true, y_pred),
        )
        # pad_value that never occurs changes nothing either.
        assert_close(
            MaskedLoss(keras_loss(kind), pad_value=-7)(y_true, y_pred),
            keras_loss(kind)(y_true, y_pred),
        )


def test_wrapped_loss_reduction_is_ignored():
    """The wrapped loss is evaluated per step; MaskedLoss' reduction applies."""
    y_true, y_pred = LABELS, LOGITS
    inner = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="sum"
    )
    got = MaskedLoss(inner)(y_true, with_native_mask(y_pred, MASK))
    expected = np_reduce(
        np_step_loss("sparse_ce_logits", y_true, y_pred),
        MASK,
        None,
        "sum_over_batch_size",
    )
    assert_close(got, expected, rtol=1e-4)


def test_sparse_labels_with_trailing_axis_and_float_dtype():
    """Labels of shape (batch, time, 1) are padding where the label is pad_value."""
    y = padded_labels(LABELS, MASK).astype("float32")[..., None]
    got = MaskedLoss(keras_loss("sparse_ce_logits"), pad_value=-1)(y, LOGITS)
    expected = keras_loss("sparse_ce_logits")(LABELS, with_native_mask(LOGITS, MASK))
    assert_close(got, expected)


def test_regression_step_with_some_pad_valued_features_is_valid():
    """Only steps whose features are all pad_value are padding."""
    y_true = padded_labels(REG_TRUE, MASK)
    y_true[0, 0, 1] = -1.0  # a valid step that happens to hold -1 once
    got = MaskedLoss("mse", pad_value=-1)(y_true, REG_PRED)
    reference = REG_TRUE.copy()
    reference[0, 0, 1] = -1.0
    expected = keras_loss("mse")(reference, with_native_mask(REG_PRED, MASK))
    assert_close(got, expected)


def test_nan_pad_value_marks_nan_steps_and_gives_a_finite_loss():
    y_true = padded_labels(REG_TRUE, MASK, pad_value=np.nan)
    got = MaskedLoss("mse", pad_value=float("nan"))(y_true, REG_PRED)
    expected = keras_loss("mse")(REG_TRUE, with_native_mask(REG_PRED, MASK))
    assert_close(got, expected)


@pytest.mark.parametrize("label_dtype", ["int32", "int64", "float64"])
@pytest.mark.parametrize("pred_dtype", ["float16", "float32", "float64"])
def test_mixed_dtypes_match_keras(label_dtype, pred_dtype):
    """Inputs are converted to the loss dtype (floatx), as Keras does."""
    logits = LOGITS.astype(pred_dtype)
    y = padded_labels(LABELS, MASK).astype(label_dtype)
    loss = MaskedLoss(keras_loss("sparse_ce_logits"), pad_value=-1)
    got = loss(ops.convert_to_tensor(y), ops.convert_to_tensor(logits))
    assert keras.backend.standardize_dtype(got.dtype) == keras.backend.floatx()
    expected = keras_loss("sparse_ce_logits")(
        LABELS.astype(label_dtype),
        with_native_mask(ops.convert_to_tensor(logits), MASK),
    )
    assert_close(got, expected)


# --------------------------------------------------------------------------
# All-padding batches.


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_padding_gives_zero_like_keras(reduction):
    none_valid = np.zeros((B, T), bool)
    expected = keras_loss("sparse_ce_logits", reduction)(
        LABELS, with_native_mask(LOGITS, none_valid), SW_STEP
    )
    expected = ops.convert_to_numpy(expected)
    np.testing.assert_array_equal(expected, np.zeros_like(expected))
    by_pad = MaskedLoss(
        keras_loss("sparse_ce_logits"), pad_value=-1, reduction=reduction
    )(np.full((B, T), -1), LOGITS, SW_STEP)
    by_native = MaskedLoss(keras_loss("sparse_ce_logits"), reduction=reduction)(
        LABELS, with_native_mask(LOGITS, none_valid), SW_STEP
    )
    for got in (by_pad, by_native):
        np.testing.assert_array_equal(ops.convert_to_numpy(got), expected)


# --------------------------------------------------------------------------
# Several mask sources.


def test_native_mask_and_pad_value_combine_with_and():
    y_true = padded_labels(LABELS, MASK)
    # Consistent sources: exactly the Keras value.
    loss = MaskedLoss(keras_loss("sparse_ce_logits"), pad_value=-1)
    assert_close(
        loss(y_true, with_native_mask(LOGITS, MASK)),
        keras_loss("sparse_ce_logits")(LABELS, with_native_mask(LOGITS, MASK)),
    )
    # The Keras mask marks everything valid: the padded labels still do not count
    # (and -1 never reaches the cross-entropy).
    all_valid = np.ones((B, T), bool)
    assert_close(
        loss(y_true, with_native_mask(LOGITS, all_valid)),
        np_reduce(np_step_loss("sparse_ce_logits", LABELS, LOGITS), MASK, None, "mean"),
        rtol=1e-4,
    )
    # The Keras mask drops a step whose label is real: it does not count either.
    narrower = MASK.copy()
    narrower[0, :2] = False
    assert_close(
        loss(y_true, with_native_mask(LOGITS, narrower)),
        keras_loss("sparse_ce_logits")(LABELS, with_native_mask(LOGITS, narrower)),
    )


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_masked_loss_with_lengths_matches_keras(reduction):
    lengths = np.array([6, 3, 1, 0])
    right = np.arange(T)[None, :] < lengths[:, None]
    got = masked_loss(
        keras_loss("sparse_ce_logits"),
        LABELS,
        LOGITS,
        lengths=lengths,
        sample_weight=SW_SEQ,
        reduction=reduction,
    )
    expected = keras_loss("sparse_ce_logits", reduction)(
        LABELS, with_native_mask(LOGITS, right), keras_sample_weight(SW_SEQ)
    )
    assert_close(got, expected)


@pytest.mark.parametrize("mask_dtype", ["bool", "int32", "float32"])
def test_masked_loss_with_mask_matches_keras(mask_dtype):
    got = masked_loss("mse", REG_TRUE, REG_PRED, mask=MASK.astype(mask_dtype))
    expected = keras_loss("mse")(REG_TRUE, with_native_mask(REG_PRED, MASK))
    assert_close(got, expected)


def test_masked_loss_pad_value_and_forms():
    y = padded_labels(LABELS, MASK)
    expected = keras_loss("sparse_ce")(LABELS, with_native_mask(PROBS, MASK))
    for spec in (
        "sparse_categorical_crossentropy",
        keras.losses.sparse_categorical_crossentropy,
        keras.losses.SparseCategoricalCrossentropy(),
    ):
        assert_close(masked_loss(spec, y, PROBS, pad_value=-1), expected)


def test_masked_loss_rejects_mask_and_lengths_together():
    with pytest.raises(ValueError, match="either `mask` or `lengths`"):
        masked_loss("mse", REG_TRUE, REG_PRED, mask=MASK, lengths=[1, 2, 3, 4])


def test_call_returns_unreduced_values_zero_at_padding():
    loss = MaskedLoss(keras_loss("sparse_ce_logits"), pad_value=-1)
    got = loss.call(padded_labels(LABELS, MASK), LOGITS)
    expected = np_step_loss("sparse_ce_logits", LABELS, LOGITS) * MASK
    assert_close(got, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Argument checks.


def test_argument_errors_name_the_argument():
    with pytest.raises(TypeError, match="pad_value"):
        MaskedLoss("mse", pad_value="pad")
    with pytest.raises(TypeError, match="pad_value"):
        MaskedLoss("mse", pad_value=True)
    with pytest.raises(ValueError, match="reduction"):
        MaskedLoss("mse", reduction="average")
    with pytest.raises(TypeError, match="Instantiate"):
        MaskedLoss(keras.losses.MeanSquaredError)
    with pytest.raises(ValueError, match="already a MaskedLoss"):
        MaskedLoss(MaskedLoss("mse"))
    with pytest.raises(TypeError, match="`loss` must be"):
        MaskedLoss(42)
    with pytest.raises(ValueError, match="crossentropy_of_doom"):
        MaskedLoss("crossentropy_of_doom")


def test_shape_errors_explain_the_fix():
    loss = MaskedLoss("sparse_categorical_crossentropy", pad_value=-1)
    with pytest.raises(ValueError, match="rank of y_pred"):
        loss(LABELS[:, :, None, None], PROBS)
    with pytest.raises(ValueError, match="cannot occur in integer labels"):
        MaskedLoss("sparse_categorical_crossentropy", pad_value=-0.5)(LABELS, PROBS)
    # MSE of y_true (batch, time) against y_pred (batch, time, 1) averages over
    # time in Keras: there is no per-step value left to mask.
    with pytest.raises(ValueError, match="one value per step"):
        MaskedLoss("mse", pad_value=-1)(REG_TRUE[..., 0], REG_PRED[..., :1])


# --------------------------------------------------------------------------
# Serialization.


@pytest.mark.parametrize(
    "spec",
    [
        "sparse_categorical_crossentropy",
        keras.losses.sparse_categorical_crossentropy,
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        {
            "class_name": "SparseCategoricalCrossentropy",
            "config": {"from_logits": True},
        },
    ],
    ids=["string", "function", "instance", "dict"],
)
def test_config_round_trip(spec):
    loss = MaskedLoss(spec, pad_value=-1, reduction="sum", name="seq_loss")
    config = loss.get_config()
    clone = MaskedLoss.from_config(config)
    assert clone.get_config() == config
    revived = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(loss)
    )
    assert isinstance(revived, MaskedLoss)
    assert revived.get_config() == config
    y = padded_labels(LABELS, MASK)
    for other in (clone, revived):
        assert_close(other(y, LOGITS), loss(y, LOGITS))


def test_registered_under_the_maskedrnn_package():
    assert keras.saving.get_registered_object("maskedrnn>MaskedLoss") is MaskedLoss
    assert keras.saving.get_registered_name(MaskedLoss) == "maskedrnn>MaskedLoss"


# --------------------------------------------------------------------------
# In a model.

VOCAB, EMB, N = 7, 4, 12


def token_data():
    """Token ids (0 = padding, right-padded) and per-step class labels."""
    data_rng = np.random.default_rng(7)
    lengths = np.array([6, 3, 1, 5, 2, 6, 4, 1, 3, 5, 2, 6])
    valid = np.arange(T)[None, :] < lengths[:, None]
    x = np.where(valid, data_rng.integers(1, VOCAB, size=(N, T)), 0)
    y = data_rng.integers(0, C, size=(N, T))
    return x, y, valid


def tiny_model(mask_zero):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, EMB, mask_zero=mask_zero)(inputs)
    outputs = keras.layers.Dense(C)(h)
    return keras.Model(inputs, outputs)


def fit_step_losses(model, loss, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(float(logs["loss"]))
    )
    model.fit(
        x, y, batch_size=4, epochs=2, shuffle=False, verbose=0, callbacks=[record]
    )
    return np.array(seen)


def test_fit_without_masks_matches_native_mask_model():
    x, y, valid = token_data()
    native = tiny_model(mask_zero=True)
    plain = tiny_model(mask_zero=False)
    plain.set_weights(native.get_weights())
    # The native model's padded labels are ordinary classes: its mask hides them.
    native_losses = fit_step_losses(
        native, keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y
    )
    masked_losses = fit_step_losses(
        plain,
        MaskedLoss(
            keras.losses.SparseCategoricalCrossentropy(from_logits=True), pad_value=-1
        ),
        x,
        np.where(valid, y, -1),
    )
    assert len(native_losses) == 6
    np.testing.assert_allclose(masked_losses, native_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(plain.get_weights(), native.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The mask made a difference: an unmasked loss would not match.
    unmasked = tiny_model(mask_zero=False)
    unmasked_losses = fit_step_losses(
        unmasked, keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y
    )
    assert not np.allclose(unmasked_losses, native_losses, rtol=1e-3)


def test_model_save_and_load_keeps_the_loss(tmp_path):
    x, y, valid = token_data()
    y = np.where(valid, y, -1)
    model = tiny_model(mask_zero=False)
    loss = MaskedLoss(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), pad_value=-1
    )
    model.compile(optimizer="sgd", loss=loss)
    before = model.evaluate(x, y, batch_size=N, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.loss, MaskedLoss)
    assert loaded.loss.get_config() == loss.get_config()
    after = loaded.evaluate(x, y, batch_size=N, verbose=0)
    expected = np_reduce(
        np_step_loss(
            "sparse_ce_logits", np.where(valid, y, 0), model.predict(x, verbose=0)
        ),
        valid,
        None,
        "sum_over_batch_size",
    )
    assert math.isclose(after, before, rel_tol=1e-6)
    assert math.isclose(after, expected, rel_tol=1e-4)
