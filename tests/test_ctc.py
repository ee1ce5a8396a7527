"""`maskedrnn.MaskedCTC`, `masked_ctc`, `ctc_decode` and the text helpers.

Oracles:
- `torch.nn.functional.ctc_loss(log_softmax(logits), targets, input_lengths,
  target_lengths, blank=0, reduction="none")` run by PyTorch itself (on every
  Keras backend) on each row's valid frames only: loss values, their mean,
  gradients, an SGD update, `zero_infinity`;
- `keras.losses.CTC()` (no mask), `keras.ops.ctc_decode` on logits compacted
  with numpy, `tf.nn.ctc_greedy_decoder` on TensorFlow;
- Keras' own `keras.losses.CTC` on a masked output, which fails in `fit`
  (the claim the docs make);

Padded frames hold garbage (large values, or NaN) so that a loss that reads
them cannot pass.
"""

import keras
import numpy as np
import pytest
import torch
from keras import ops

import maskedrnn
from maskedrnn import MaskedCTC, ctc_decode, ctc_ids_to_text, masked_ctc
from maskedrnn._keras_private import set_keras_mask
from maskedrnn.ctc import character_error_rate
from tests.helpers import BACKEND, save_and_load, to_np

B, T, C = 4, 9, 5
# Row 1 repeats a label (needs 3 frames); zeros pad the labels.
LABELS = np.array([[1, 2, 0], [3, 3, 0], [1, 0, 0], [4, 2, 1]], "int32")


def _masks(pattern):
    mask = np.zeros((B, T), bool)
    counts = [9, 7, 5, 6]
    for b, n in enumerate(counts):
        if pattern == "right":
            mask[b, :n] = True
        elif pattern == "left":  # as keras.utils.pad_sequences pads
            mask[b, T - n :] = True
        elif pattern == "holes":
            keep = np.random.default_rng(b).permutation(T)[:n]
            mask[b, keep] = True
        else:
            raise ValueError(pattern)
    return mask


def _logits(mask, garbage=1e3, seed=0):
    x = np.random.default_rng(seed).normal(size=mask.shape + (C,)).astype("float32")
    x[~mask] = garbage
    return x


def _with_mask(x, mask):
    y = ops.convert_to_tensor(x)
    set_keras_mask(y, ops.convert_to_tensor(mask))
    return y


def _torch_ctc(x, mask, labels, zero_infinity=False, grad=False):
    """PyTorch's per-row CTC on the valid frames, and optionally the gradient
    of the mean w.r.t. the full (batch, time, classes) logits.

    One batched `ctc_loss` call: each row's valid frames (in order) first,
    `input_lengths` = their count, `targets` = the non-zero labels."""
    xt = torch.tensor(np.where(mask[..., None], x, 0.0), requires_grad=grad)
    batch, time = mask.shape
    order = np.stack(
        [np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)]) for m in mask]
    )
    index = torch.tensor(order)[..., None].expand(-1, -1, x.shape[-1])
    compact = torch.gather(xt, 1, index)  # (batch, time, classes)
    targets = [row[row > 0] for row in labels]
    padded = np.zeros((batch, max(1, max(len(t) for t in targets))), "int64")
    for b, t in enumerate(targets):
        padded[b, : len(t)] = t
    losses = torch.nn.functional.ctc_loss(
        compact.log_softmax(-1).transpose(0, 1),
        torch.tensor(padded),
        torch.tensor(mask.sum(1)),
        torch.tensor([len(t) for t in targets]),
        blank=0,
        reduction="none",
        zero_infinity=zero_infinity,
    )
    if not grad:
        return losses.detach().numpy()
    (g,) = torch.autograd.grad(losses.mean(), xt)
    return losses.detach().numpy(), g.numpy()


def _grad(fn, x):
    """Gradient of the scalar `fn(x)` w.r.t. the numpy array `x`."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        xt = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            value = fn(xt)
        return tape.gradient(value, xt).numpy()
    if BACKEND == "torch":
        xt = torch.tensor(x, requires_grad=True)
        (g,) = torch.autograd.grad(fn(xt), xt)
        return g.numpy()
    import jax

    return np.asarray(jax.grad(fn)(x))


# ------------------------------------------------------------------ values


@pytest.mark.parametrize("pattern", ["right", "left", "holes"])
def test_values_and_mean_equal_torch_on_the_valid_frames(pattern):
    mask = _masks(pattern)
    x = _logits(mask)
    expected = _torch_ctc(x, mask, LABELS)
    per_row = MaskedCTC(reduction="none")(LABELS, _with_mask(x, mask))
    np.testing.assert_allclose(to_np(per_row), expected, rtol=1e-5)
    mean = MaskedCTC()(LABELS, _with_mask(x, mask))
    np.testing.assert_allclose(to_np(mean), expected.mean(), rtol=1e-5)
    total = MaskedCTC(reduction="sum")(LABELS, _with_mask(x, mask))
    np.testing.assert_allclose(to_np(total), expected.sum(), rtol=1e-5)
    # The function form with the mask given explicitly.
    np.testing.assert_allclose(
        to_np(masked_ctc(LABELS, x, mask=mask)), expected, rtol=1e-5
    )


def test_nan_in_padded_frames_reaches_neither_loss_nor_gradient():
    mask = _masks("holes")
    x = _logits(mask, garbage=np.nan)
    expected, expected_grad = _torch_ctc(x, mask, LABELS, grad=True)
    np.testing.assert_allclose(
        to_np(masked_ctc(LABELS, x, mask=mask)), expected, rtol=1e-5
    )
    grad = _grad(lambda t: ops.mean(masked_ctc(LABELS, t, mask=mask)), x)
    np.testing.assert_allclose(grad, expected_grad, atol=1e-6)
    assert np.all(grad[~mask] == 0)


@pytest.mark.parametrize("pattern", ["right", "left", "holes"])
def test_gradient_equals_torch_and_is_zero_at_padded_frames(pattern):
    mask = _masks(pattern)
    x = _logits(mask, garbage=50.0)
    _, expected_grad = _torch_ctc(x, mask, LABELS, grad=True)
    grad = _grad(lambda t: MaskedCTC()(LABELS, _with_mask(t, mask)), x)
    np.testing.assert_allclose(grad, expected_grad, atol=1e-6)
    assert np.all(grad[~mask] == 0)
    assert np.any(grad[mask] != 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_masks_and_labels_equal_torch(seed):
    """Random masks (empty rows included) and labels (repeats, infeasible
    rows, zeros between labels), with torch's zero_infinity=True."""
    rng = np.random.default_rng(seed)
    mask = rng.random((6, 10)) < rng.uniform(0.2, 1.0, size=(6, 1))
    mask[0] = False
    labels = rng.integers(0, 6, size=(6, 4)).astype("int32")
    labels[1] = [2, 2, 2, 0]
    x = rng.normal(size=(6, 10, 6)).astype("float32")
    x[~mask] = np.nan
    expected = _torch_ctc(x, mask, labels, zero_infinity=True)
    values = masked_ctc(labels, x, mask=mask, zero_infinity=True)
    np.testing.assert_allclose(to_np(values), expected, rtol=1e-5, atol=1e-6)


def test_lengths_give_the_right_padded_mask():
    mask = _masks("right")
    x = _logits(mask)
    np.testing.assert_allclose(
        to_np(masked_ctc(LABELS, x, lengths=mask.sum(1))),
        _torch_ctc(x, mask, LABELS),
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="lengths has a value 10 longer"):
        masked_ctc(LABELS, x, lengths=[10, 1, 1, 1])
    with pytest.raises(ValueError, match="not both"):
        masked_ctc(LABELS, x, mask=mask, lengths=mask.sum(1))


def test_without_a_mask_equals_keras_ctc():
    x = _logits(np.ones((B, T), bool))
    keras_rows = keras.losses.CTC(reduction=None)(LABELS, x)
    np.testing.assert_allclose(
        to_np(MaskedCTC(reduction="none")(LABELS, x)), to_np(keras_rows), rtol=1e-6
    )
    np.testing.assert_allclose(
        to_np(MaskedCTC()(LABELS, x)), to_np(keras.losses.CTC()(LABELS, x)), rtol=1e-6
    )
    np.testing.assert_allclose(
        to_np(keras_rows), _torch_ctc(x, np.ones((B, T), bool), LABELS), rtol=1e-5
    )


def test_sample_weight_weights_rows():
    mask = _masks("left")
    x = _logits(mask)
    expected = _torch_ctc(x, mask, LABELS)
    w = np.array([1.0, 0.0, 2.0, 0.5], "float32")
    value = MaskedCTC()(LABELS, _with_mask(x, mask), sample_weight=w)
    np.testing.assert_allclose(to_np(value), (w * expected).sum() / B, rtol=1e-5)
    value = MaskedCTC(reduction="mean_with_sample_weight")(
        LABELS, _with_mask(x, mask), sample_weight=w
    )
    np.testing.assert_allclose(to_np(value), (w * expected).sum() / w.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="one sample weight per row"):
        MaskedCTC()(LABELS, _with_mask(x, mask), sample_weight=np.ones((B, T)))


def test_labels_padded_anywhere_with_zeros_are_read_in_order():
    mask = _masks("right")
    x = _logits(mask)
    scattered = np.array([[0, 1, 2], [3, 0, 3], [0, 0, 1], [4, 2, 1]], "int32")
    np.testing.assert_allclose(
        to_np(masked_ctc(scattered, x, mask=mask)),
        _torch_ctc(x, mask, LABELS),
        rtol=1e-5,
    )


# ------------------------------------------------- infeasible rows, bad ids


def _infeasible_case():
    mask = np.zeros((B, T), bool)
    mask[0, 2:5] = True  # 3 frames for 1, 1, 1 (needs 5): infeasible
    mask[1, :2] = True  # 2 frames for 3, 3 (needs 3): infeasible
    mask[2, 4:] = True  # 5 frames for 1: fine
    mask[3, [0, 3, 8]] = True  # 3 frames for 4, 2, 1: exactly enough
    labels = np.array([[1, 1, 1], [3, 3, 0], [1, 0, 0], [4, 2, 1]], "int32")
    return _logits(mask, garbage=7.0), mask, labels


def test_infeasible_rows_give_inf_like_torch():
    x, mask, labels = _infeasible_case()
    expected = _torch_ctc(x, mask, labels)
    assert np.isinf(expected[:2]).all() and np.isfinite(expected[2:]).all()
    values = to_np(masked_ctc(labels, x, mask=mask))
    np.testing.assert_allclose(values, expected, rtol=1e-5)
    assert np.isinf(to_np(MaskedCTC()(labels, _with_mask(x, mask))))
    # Keras' CTC (no mask) on the valid frames alone of row 0: inf on torch,
    # a large finite number on TensorFlow and JAX; MaskedCTC gives inf.
    alone = x[:1][:, mask[0]]
    keras_value = to_np(keras.losses.CTC(reduction=None)(labels[:1], alone))[0]
    assert np.isinf(keras_value) if BACKEND == "torch" else keras_value > 100
    assert np.isinf(to_np(MaskedCTC(reduction="none")(labels[:1], alone))[0])


def test_zero_infinity_equals_torch_values_and_gradient():
    x, mask, labels = _infeasible_case()
    expected, expected_grad = _torch_ctc(x, mask, labels, zero_infinity=True, grad=True)
    loss = MaskedCTC(zero_infinity=True, reduction="none")
    np.testing.assert_allclose(
        to_np(loss(labels, _with_mask(x, mask))), expected, rtol=1e-5
    )
    grad = _grad(
        lambda t: ops.mean(masked_ctc(labels, t, mask=mask, zero_infinity=True)), x
    )
    np.testing.assert_allclose(grad, expected_grad, atol=1e-6)
    assert np.all(grad[:2] == 0)


def test_empty_row_with_empty_label_has_zero_loss():
    mask = _masks("right")
    mask[2] = False
    labels = LABELS.copy()
    labels[2] = 0
    values = to_np(masked_ctc(labels, _logits(mask), mask=mask))
    assert values[2] == 0 and np.isfinite(values).all()


def test_out_of_range_label_ids_raise_in_eager_code():
    x = _logits(np.ones((B, T), bool))
    too_big = LABELS.copy()
    too_big[3, 0] = C
    with pytest.raises(ValueError, match="y_true has label id 5 but y_pred has 5"):
        MaskedCTC()(too_big, x)
    negative = LABELS.copy()
    negative[0, 2] = -1
    with pytest.raises(ValueError, match=r"got min\(y_true\)=-1. Pad labels with 0"):
        masked_ctc(negative, x)


def test_out_of_range_label_ids_in_compiled_code_give_nan_rows():
    mask = _masks("holes")
    x = _logits(mask)
    bad = LABELS.copy()
    bad[1, 0] = C + 3
    bad[2, 1] = -1
    if BACKEND == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda y, t: masked_ctc(y, t, mask=mask))
    elif BACKEND == "jax":
        import jax

        fn = jax.jit(lambda y, t: masked_ctc(y, t, mask=mask))
    else:
        pytest.skip("PyTorch runs eagerly here (torch.compile: see docs/ctc.md)")
    values = to_np(fn(bad, x))
    expected = _torch_ctc(x, mask, LABELS)
    assert np.isnan(values[1:3]).all()
    np.testing.assert_allclose(values[[0, 3]], expected[[0, 3]], rtol=1e-5)


def test_argument_errors_name_the_argument():
    x = _logits(np.ones((B, T), bool))
    with pytest.raises(ValueError, match=r"y_true must be integer labels .* \(4,\)"):
        masked_ctc(LABELS[:, 0], x)
    with pytest.raises(ValueError, match="y_true has 3 rows but y_pred has 4"):
        masked_ctc(LABELS[:3], x)
    with pytest.raises(ValueError, match=r"y_pred must be logits .* \(4, 9\)"):
        masked_ctc(LABELS, x[..., 0])
    with pytest.raises(ValueError, match="mask has 8 along axis 1"):
        masked_ctc(LABELS, x, mask=np.ones((B, T - 1), bool))
    with pytest.raises(TypeError, match="zero_infinity must be True or False"):
        MaskedCTC(zero_infinity="yes")


# ------------------------------------------------------------- in training


def _masking_dense(features=3, seed=1):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, features))
    masked = keras.layers.Masking()(inputs)
    logits = keras.layers.Dense(C)(masked)
    return keras.Model(inputs, logits)


def _frames(mask, features=3, seed=2):
    x = np.random.default_rng(seed).normal(size=mask.shape + (features,))
    x = x.astype("float32")
    x[~mask] = 0.0  # what Masking reads as padding
    return x


@pytest.mark.parametrize(
    "pattern, jit_compile",
    [("right", False), ("left", False), ("holes", False), ("holes", True)],
)
def test_sgd_step_equals_torch_gradient_times_learning_rate(pattern, jit_compile):
    if jit_compile and BACKEND == "torch":
        pytest.skip("jit_compile (XLA) is tested on TensorFlow and JAX")
    mask = _masks(pattern)
    x = _frames(mask)
    model = _masking_dense()
    kernel, bias = [w.copy() for w in model.get_weights()]
    lr = 0.1
    model.compile(
        optimizer=keras.optimizers.SGD(lr), loss=MaskedCTC(), jit_compile=jit_compile
    )
    history = model.fit(x, LABELS, batch_size=B, epochs=1, shuffle=False, verbose=0)

    w = torch.tensor(kernel, requires_grad=True)
    b = torch.tensor(bias, requires_grad=True)
    losses = []
    for row in range(B):
        frames = torch.tensor(x[row][mask[row]]) @ w + b
        target = torch.tensor(LABELS[row][LABELS[row] > 0], dtype=torch.long)
        losses.append(
            torch.nn.functional.ctc_loss(
                frames.log_softmax(-1)[:, None],
                target[None],
                [len(frames)],
                [len(target)],
                blank=0,
                reduction="none",
            )[0]
        )
    loss = torch.stack(losses).mean()
    gw, gb = torch.autograd.grad(loss, [w, b])
    np.testing.assert_allclose(history.history["loss"][0], loss.item(), rtol=1e-5)
    new_kernel, new_bias = model.get_weights()
    np.testing.assert_allclose(new_kernel, kernel - lr * gw.numpy(), atol=1e-6)
    np.testing.assert_allclose(new_bias, bias - lr * gb.numpy(), atol=1e-6)


def test_keras_ctc_fails_on_a_masked_output_and_scores_padding_without_mask():
    """What Keras 3.15.1 does instead (the claim README and docs make)."""
    mask = _masks("right")
    x = _frames(mask)
    model = _masking_dense()
    logits = to_np(model(x))
    masked_logits = model(ops.convert_to_tensor(x))
    model.compile(optimizer="sgd", loss=keras.losses.CTC())
    # TF: "Dimensions must be equal"; torch: a shape RuntimeError; JAX:
    # "Incompatible shapes for broadcasting". keras-team/keras#23228.
    with pytest.raises((ValueError, RuntimeError, TypeError)):
        model.fit(x, LABELS, batch_size=B, epochs=1, verbose=0)
    # Called on the logits without their mask, every row's logit length is T:
    # the padded frames are scored as if they were speech.
    keras_rows = to_np(keras.losses.CTC(reduction=None)(LABELS, logits))
    expected = _torch_ctc(logits, mask, LABELS)
    padded = mask.sum(1) < T
    assert np.all(np.abs(keras_rows[padded] - expected[padded]) > 1e-2)
    # MaskedCTC on the model's masked output gets it right.
    ours = MaskedCTC(reduction="none")(LABELS, masked_logits)
    np.testing.assert_allclose(to_np(ours), expected, rtol=1e-5)


def test_out_of_range_label_in_fit_raises_or_gives_a_nan_loss():
    mask = _masks("right")
    x = _frames(mask)
    bad = LABELS.copy()
    bad[0, 0] = C
    model = _masking_dense()
    model.compile(optimizer="sgd", loss=MaskedCTC())
    if BACKEND == "torch":  # fit runs eagerly: the values can be checked
        with pytest.raises(ValueError, match="label id 5"):
            model.fit(x, bad, batch_size=B, epochs=1, verbose=0)
        return
    before = model.get_weights()
    history = model.fit(x, bad, batch_size=B, epochs=1, verbose=0)
    assert np.isnan(history.history["loss"][0])
    # The bad row passes no gradient: the weights stay finite.
    for a, b in zip(before, model.get_weights()):
        assert np.isfinite(b).all() and not np.array_equal(a, b)


def _gru_model(seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((None, 3))
    x = keras.layers.Masking()(inputs)
    x = maskedrnn.MaskedBidirectional(keras.layers.GRU(8, return_sequences=True))(x)
    return keras.Model(inputs, keras.layers.Dense(C)(x))


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", [False, True])
def test_masked_bidirectional_gru_model_fits(jit_compile):
    if jit_compile and BACKEND == "torch":
        pytest.skip("jit_compile (XLA) is tested on TensorFlow and JAX")
    if not jit_compile and BACKEND == "jax":
        pytest.skip("JAX's fit is jitted either way; one run is enough")
    mask = _masks("holes")
    x = _frames(mask)
    model = _gru_model()
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=MaskedCTC(),
        jit_compile=jit_compile,
    )
    history = model.fit(x, LABELS, batch_size=B, epochs=15, verbose=0)
    losses = history.history["loss"]
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0]
    # The reported loss is the torch oracle's on the model's own logits.
    logits = to_np(model(x))
    np.testing.assert_allclose(
        to_np(model.compute_loss(x, LABELS, model(x))),
        _torch_ctc(logits, mask, LABELS).mean(),
        rtol=1e-4,
    )


def test_serialization_round_trip():
    loss = MaskedCTC(zero_infinity=True, reduction="sum", name="ctc_x")
    config = loss.get_config()
    clone = MaskedCTC.from_config(config)
    assert clone.get_config() == config
    revived = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(revived, MaskedCTC) and revived.get_config() == config
    # A saved model keeps its compiled loss.
    model = _masking_dense()
    model.compile(optimizer="sgd", loss=MaskedCTC(zero_infinity=True))
    mask = _masks("right")
    x = _frames(mask)
    model.fit(x, LABELS, batch_size=B, epochs=1, verbose=0)
    loaded = save_and_load(model)
    assert isinstance(loaded.loss, MaskedCTC) and loaded.loss.zero_infinity
    np.testing.assert_allclose(
        loaded.evaluate(x, LABELS, verbose=0),
        model.evaluate(x, LABELS, verbose=0),
        rtol=1e-6,
    )


# ------------------------------------------------------------------ decode


def _compacted(x, mask):
    """Valid frames first (numpy), the rest filled with other garbage."""
    out = np.full_like(x, -3.0)
    for b in range(len(x)):
        out[b, : mask[b].sum()] = x[b][mask[b]]
    return out


@pytest.mark.parametrize(
    "pattern, strategy",
    [
        ("right", "greedy"),
        ("left", "greedy"),
        ("holes", "greedy"),
        ("holes", "beam_search"),  # slow to compile on JAX: one mask pattern
    ],
)
def test_decode_equals_keras_on_compacted_logits(pattern, strategy):
    mask = _masks(pattern)
    x = _logits(mask, garbage=30.0)
    kw = dict(strategy=strategy, beam_width=3, top_paths=2)
    if strategy == "greedy":
        kw = dict(strategy="greedy")
    decoded, scores = ctc_decode(x, mask=mask, **kw)
    ref_decoded, ref_scores = ops.ctc_decode(_compacted(x, mask), mask.sum(1), **kw)
    np.testing.assert_array_equal(to_np(decoded), to_np(ref_decoded))
    np.testing.assert_allclose(to_np(scores), to_np(ref_scores), rtol=1e-5)
    # The Keras mask of y_pred is used when no mask is given.
    again, _ = ctc_decode(_with_mask(x, mask), **kw)
    np.testing.assert_array_equal(to_np(again), to_np(decoded))


def test_decode_with_lengths_and_argument_errors():
    mask = _masks("right")
    x = _logits(mask, garbage=30.0)
    decoded, _ = ctc_decode(x, lengths=mask.sum(1))
    expected, _ = ops.ctc_decode(_compacted(x, mask), mask.sum(1))
    np.testing.assert_array_equal(to_np(decoded), to_np(expected))
    with pytest.raises(ValueError, match="not both"):
        ctc_decode(x, mask=mask, lengths=mask.sum(1))
    with pytest.raises(ValueError, match=r"lengths must be >= 0; got min\(lengths\)"):
        ctc_decode(x, lengths=[-1, 2, 3, 4])
    with pytest.raises(ValueError, match="lengths has 3 along axis 0 but inputs"):
        ctc_decode(x, lengths=[1, 2, 3])


def test_greedy_decode_equals_tf_ctc_greedy_decoder():
    if BACKEND != "tensorflow":
        pytest.skip("tf.nn.ctc_greedy_decoder is TensorFlow's")
    import tensorflow as tf

    mask = _masks("holes")
    x = _logits(mask, garbage=30.0)
    sparse, _ = tf.nn.ctc_greedy_decoder(
        tf.transpose(_compacted(x, mask), (1, 0, 2)),
        mask.sum(1).astype("int32"),
        blank_index=0,
    )
    expected = tf.sparse.to_dense(sparse[0], default_value=-1).numpy()
    decoded, _ = ctc_decode(x, mask=mask)
    decoded = to_np(decoded)[0]
    np.testing.assert_array_equal(decoded[:, : expected.shape[1]], expected)
    assert np.all(decoded[:, expected.shape[1] :] == -1)


def test_ids_to_text_with_a_string_lookup():
    chars = list("abcd")
    char_to_num = keras.layers.StringLookup(vocabulary=chars, oov_token="")
    ids = to_np(char_to_num(["c", "a", "b", "d"]))
    assert ids.tolist() == [3, 1, 2, 4]  # 0 is the OOV token: the blank
    decoded = np.array([[3, 1, 2, -1], [4, 4, -1, -1], [-1, -1, -1, -1]])
    assert ctc_ids_to_text(decoded, vocabulary=char_to_num) == ["cab", "dd", ""]
    assert ctc_ids_to_text(decoded) == [[3, 1, 2], [4, 4], []]
    assert (
        ctc_ids_to_text(decoded, vocabulary=["", "x", "y", "z", "w"], separator=" ")[0]
        == "z x y"
    )
    # y_true (0-padded) turns into the same strings as the decoded ids.
    assert ctc_ids_to_text(np.array([[3, 1, 2, 0]]), vocabulary="-abcd") == ["cab"]
    # Rank 3: one list per path.
    assert ctc_ids_to_text(decoded[None], vocabulary="-abcd")[0][1] == "dd"
    with pytest.raises(ValueError, match="id 3, which the vocabulary of 3"):
        ctc_ids_to_text(decoded, vocabulary="-ab")


def test_decode_to_text_end_to_end_recovers_the_labels():
    """Logits that spell the labels with blanks and repeats in the valid frames,
    garbage elsewhere, decode back to the labels' text."""
    mask = np.zeros((2, 8), bool)
    mask[0, [0, 2, 3, 5, 7]] = True
    mask[1, 3:] = True
    paths = [[1, 1, 0, 2, 2], [3, 0, 3, 3, 4]]  # spell "ab" and "ccd"
    x = np.full((2, 8, C), 0.0, "float32")
    x[..., 1] = 9.0  # padded frames all say "a"
    for b in range(2):
        for t, c in zip(np.flatnonzero(mask[b]), paths[b]):
            x[b, t] = 0.0
            x[b, t, c] = 9.0
    decoded, _ = ctc_decode(x, mask=mask)
    assert ctc_ids_to_text(decoded[0], vocabulary="-abcd") == ["ab", "ccd"]


def test_character_error_rate():
    assert character_error_rate(["abc", "de"], ["abd", "de"]) == pytest.approx(0.2)
    assert character_error_rate(["kitten"], ["sitting"]) == pytest.approx(3 / 6)
    assert character_error_rate([[1, 2, 3]], [[]]) == 1.0
    with pytest.raises(ValueError, match="got 2 references and 1 hypotheses"):
        character_error_rate(["a", "b"], ["a"])


# ------------------------------------------- keras-io's CTC ASR, converted


def _keras_io_asr_model(input_dim, output_dim, rnn_layers, rnn_units, every=False):
    """keras-io's "CTC ASR" model (DeepSpeech2-like), as docs/ctc.md shows it:
    a frame mask (every second frame: the first convolution halves time) is
    given to the first Bidirectional, and the output is logits. With
    `every=True` the mask is handed to every Bidirectional (the model's
    masked semantics on any Keras version: up to 3.15 Keras passed it on
    from the first, 3.16 does not)."""
    layers = keras.layers
    spectrogram = layers.Input((None, input_dim), name="input")
    frame_mask = ops.any(ops.not_equal(spectrogram, 0.0), axis=-1)[:, ::2]
    x = layers.Reshape((-1, input_dim, 1))(spectrogram)
    x = layers.Conv2D(4, [11, 41], strides=[2, 2], padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.Conv2D(4, [11, 21], strides=[1, 2], padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    x = layers.Reshape((-1, x.shape[-2] * x.shape[-1]))(x)
    for i in range(1, rnn_layers + 1):
        gru = layers.GRU(rnn_units, return_sequences=True, reset_after=True)
        x = layers.Bidirectional(gru, merge_mode="concat")(
            x, mask=frame_mask if i == 1 or every else None
        )
        if i < rnn_layers:
            x = layers.Dropout(rate=0.5)(x)
    x = layers.Dense(rnn_units * 2)(x)
    x = layers.ReLU()(x)
    x = layers.Dropout(rate=0.5)(x)
    logits = layers.Dense(output_dim + 1)(x)
    return keras.Model(spectrogram, logits)


@pytest.mark.slow
def test_keras_io_asr_model_converts_and_trains_with_masked_ctc():
    if BACKEND == "jax":
        pytest.skip(
            "eager JAX compiles every op of the convolutions (~40 s); the "
            "conversion does not depend on the backend and MaskedCTC is "
            "covered on JAX by the tests above"
        )
    keras.utils.set_random_seed(4)
    model = _keras_io_asr_model(
        input_dim=16, output_dim=C - 1, rnn_layers=2, rnn_units=4
    )
    fast = maskedrnn.convert_model(model)  # uncompiled, then compiled below
    assert sum(isinstance(a, maskedrnn.MaskedBidirectional) for a in fast.layers) == 2
    x = np.random.default_rng(5).normal(size=(B, 18, 16)).astype("float32")
    frames = np.array([18, 13, 9, 16])
    for b, n in enumerate(frames):
        x[b, n:] = 0.0
    reference = _keras_io_asr_model(16, C - 1, rnn_layers=2, rnn_units=4, every=True)
    reference.set_weights(model.get_weights())
    np.testing.assert_allclose(to_np(fast(x)), to_np(reference(x)), atol=1e-5)
    # The mask reaches the logits: MaskedCTC scores ceil(frames / 2) frames.
    logits = fast(ops.convert_to_tensor(x))
    mask = np.arange(9)[None] < (frames[:, None] + 1) // 2
    np.testing.assert_allclose(
        to_np(MaskedCTC(reduction="none")(LABELS, logits)),
        _torch_ctc(to_np(logits), mask, LABELS),
        rtol=1e-5,
    )
    fast.compile(optimizer=keras.optimizers.Adam(1e-3), loss=MaskedCTC())
    history = fast.fit(x, LABELS, batch_size=B, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
