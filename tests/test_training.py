"""Training with explicit lengths (no Keras masks) equals Keras' masked training.

The oracle is the Keras-native masked model, trained the same way from the
same initial weights, the mask `ids != 0` handed to its RNN and attached to
its output explicitly:

    ids -> Embedding
        -> keras.layers.Bidirectional(LSTM/GRU(use_cudnn=False), return_sequences)
           (mask=ids != 0)
        -> Dense(softmax) -> the same mask attached (for the loss)

with `"sparse_categorical_crossentropy"` and labels 0 at padded steps (Keras
drops them through the mask: the loss is the mean over valid steps). The
models under test are

- the explicit-lengths model `ids, lengths -> Embedding (no mask) ->
  MaskedBidirectional(...)(x, lengths=lengths) -> Dense`, trained with
  `MaskedLoss("sparse_categorical_crossentropy", pad_value=-1)` on labels that
  are -1 at padding (right-padded data);
- `Embedding(mask_zero=True) -> MaskedBidirectional -> Dense` with the same
  `MaskedLoss` on left-padded data (the mask path);
- the explicit-lengths model in a custom training loop with
  `maskedrnn.masked_loss(..., lengths=lengths)`, against the native model in
  the same loop with the masked mean written out.

Each step must give the same loss and the run the same final weights.
Data: `maskedrnn.datasets.make_distance_to_end_task` (labels -1 at padding).
"""

import keras
import numpy as np
import pytest
from keras import layers, ops

from maskedrnn import MaskedBidirectional, MaskedLoss, masked_loss
from maskedrnn.datasets import make_distance_to_end_task
from tests.helpers import BACKEND, AttachMask

V, T, E, U, C = 12, 8, 3, 4, 5  # vocab, time, embedding, units, classes
BATCH, STEPS = 4, 4
# Float32 round-off (the two models sum in different orders) leaves ~1e-8
# absolute differences on weights of ~1e-3, so rtol alone is too strict there.
RTOL, ATOL = 1e-5, 1e-6


def task(padding):
    ids, labels, lengths = make_distance_to_end_task(
        BATCH * STEPS, T, vocab_size=V, n_classes=C, min_length=1,
        padding=padding, seed=7,
    )  # fmt: skip
    assert (labels[ids == 0] == -1).all() and (labels[ids != 0] >= 0).all()
    # The native model reads labels 0 at padded steps (masked out by Keras).
    return ids, labels, lengths, np.where(labels < 0, 0, labels)


def rnn(kind):
    # use_cudnn=False keeps Keras' generic masked loop for the oracle; the
    # inner layers of MaskedBidirectional run unmasked either way.
    cls = {"lstm": layers.LSTM, "gru": layers.GRU}[kind]
    return cls(U, return_sequences=True, use_cudnn=False)


def native_model(kind, seed=0):
    """The oracle. The mask is handed to the RNN and attached to the output
    (for the loss) explicitly: Keras 3.16 no longer passes it on past an RNN."""
    keras.utils.set_random_seed(seed)
    ids = keras.Input((T,), dtype="int32")
    mask = ops.not_equal(ids, 0)
    x = layers.Embedding(V, E, name="embed")(ids)
    x = layers.Bidirectional(rnn(kind), name="bidi")(x, mask=mask)
    out = layers.Dense(C, activation="softmax", name="head")(x)
    return keras.Model(ids, AttachMask()(out, mask=mask))


def lengths_model(kind):
    ids = keras.Input((T,), dtype="int32", name="ids")
    lengths = keras.Input((), dtype="int32", name="lengths")
    x = layers.Embedding(V, E, name="embed")(ids)
    x = MaskedBidirectional(rnn(kind), name="bidi")(x, lengths=lengths)
    out = layers.Dense(C, activation="softmax", name="head")(x)
    return keras.Model({"ids": ids, "lengths": lengths}, out)


def mask_model(kind):
    ids = keras.Input((T,), dtype="int32")
    x = layers.Embedding(V, E, mask_zero=True, name="embed")(ids)
    x = MaskedBidirectional(rnn(kind), name="bidi")(x)
    return keras.Model(ids, layers.Dense(C, activation="softmax", name="head")(x))


def copy_weights(source, target):
    """Same initial weights, layer by layer (the models differ in inputs)."""
    for name in ("embed", "bidi", "head"):
        target.get_layer(name).set_weights(source.get_layer(name).get_weights())


def layer_weights(model):
    names = ("embed", "bidi", "head")
    return [w for name in names for w in model.get_layer(name).get_weights()]


def make_optimizer(name):
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.5)
    return keras.optimizers.Adam(learning_rate=0.05)


class BatchLosses(keras.callbacks.Callback):
    """Records `logs["loss"]` after every training batch."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def fit(model, x, y, optimizer, loss):
    # TensorFlow runs eagerly: 2-3x faster here than tracing the train step.
    # (Graph-mode fits of MaskedBidirectional and MaskedLoss are tested in
    # test_masked_bidirectional.py and test_losses.py.)
    run_eagerly = BACKEND == "tensorflow"
    model.compile(
        optimizer=make_optimizer(optimizer), loss=loss, run_eagerly=run_eagerly
    )
    record = BatchLosses()
    model.fit(
        x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[record]
    )
    # Keras reports the running mean over the epoch; undo it to get each
    # batch's own loss (equal running means <=> equal batch losses).
    means = np.array(record.losses)
    steps = np.arange(1, len(means) + 1)
    return means * steps - np.concatenate([[0.0], means[:-1] * steps[:-1]])


def assert_same_training(losses, expected_losses, model, oracle, initial):
    assert len(losses) == len(expected_losses) == STEPS
    assert np.all(np.isfinite(expected_losses))
    np.testing.assert_allclose(losses, expected_losses, rtol=RTOL, atol=ATOL)
    final, expected = layer_weights(model), layer_weights(oracle)
    assert len(final) == len(expected) == len(initial)
    for w, e in zip(final, expected):
        np.testing.assert_allclose(w, e, rtol=RTOL, atol=ATOL)
    # Training did move the weights (the comparison is not between no-ops).
    assert any(not np.allclose(e, w0, atol=1e-3) for e, w0 in zip(expected, initial))


# ------------------------------------------------------------------ model.fit


@pytest.mark.parametrize(
    "kind, optimizer",
    [("lstm", "sgd"), pytest.param("gru", "adam", marks=pytest.mark.slow)],
)
def test_fit_with_lengths_matches_native_masked_fit(kind, optimizer):
    ids, labels, lengths, labels0 = task("post")
    oracle = native_model(kind)
    initial = layer_weights(oracle)
    model = lengths_model(kind)
    copy_weights(oracle, model)

    expected = fit(oracle, ids, labels0, optimizer, "sparse_categorical_crossentropy")
    losses = fit(
        model,
        {"ids": ids, "lengths": lengths},
        labels,
        optimizer,
        MaskedLoss("sparse_categorical_crossentropy", pad_value=-1),
    )
    assert_same_training(losses, expected, model, oracle, initial)


def test_fit_left_padded_with_mask_matches_native_masked_fit():
    kind, optimizer = "lstm", "adam"
    ids, labels, _, labels0 = task("pre")
    assert (ids[:, -1] != 0).all()  # left-padded: every row ends with a token
    oracle = native_model(kind)
    initial = layer_weights(oracle)
    model = mask_model(kind)
    copy_weights(oracle, model)

    expected = fit(oracle, ids, labels0, optimizer, "sparse_categorical_crossentropy")
    losses = fit(
        model,
        ids,
        labels,
        optimizer,
        MaskedLoss("sparse_categorical_crossentropy", pad_value=-1),
    )
    assert_same_training(losses, expected, model, oracle, initial)


# --------------------------------------------------------- custom training loop


def masked_mean_crossentropy(y_true, y_pred, mask):
    """Keras' masked reduction written out: sum over valid steps / their count."""
    values = keras.losses.sparse_categorical_crossentropy(y_true, y_pred)
    mask = ops.cast(mask, values.dtype)
    return ops.sum(values * mask) / ops.sum(mask)


def lengths_loss(y_true, y_pred, lengths):
    return masked_loss(
        "sparse_categorical_crossentropy", y_true, y_pred, lengths=lengths
    )


def train_loop(model, optimizer, batches, loss_fn):
    """Runs `optimizer` on `loss_fn(y, model(x), aux)` for each `(x, y, aux)`
    of `batches`, the backend's own kernel; returns the loss of every step."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        losses = []
        for x, y, aux in batches:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True), aux)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            losses.append(float(loss))
        return losses
    if BACKEND == "torch":
        import torch

        losses = []
        for x, y, aux in batches:
            loss = loss_fn(y, model(x, training=True), aux)
            params = [v.value for v in model.trainable_variables]
            grads = torch.autograd.grad(loss, params)
            optimizer.apply(list(grads), model.trainable_variables)
            losses.append(float(loss.detach()))
        return losses
    if BACKEND == "jax":
        import jax

        optimizer.build(model.trainable_variables)

        def loss_of(trainable, non_trainable, x, y, aux):
            y_pred, non_trainable = model.stateless_call(
                trainable, non_trainable, x, training=True
            )
            return loss_fn(y, y_pred, aux), non_trainable

        @jax.jit
        def step(trainable, non_trainable, opt_vars, x, y, aux):
            (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(
                trainable, non_trainable, x, y, aux
            )
            trainable, opt_vars = optimizer.stateless_apply(opt_vars, grads, trainable)
            return loss, trainable, non_trainable, opt_vars

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        opt_vars = [v.value for v in optimizer.variables]
        losses = []
        for x, y, aux in batches:
            loss, trainable, non_trainable, opt_vars = step(
                trainable, non_trainable, opt_vars, x, y, aux
            )
            losses.append(float(loss))
        for v, value in zip(model.trainable_variables, trainable):
            v.assign(value)
        for v, value in zip(model.non_trainable_variables, non_trainable):
            v.assign(value)
        return losses
    pytest.skip(f"no custom training loop written for the {BACKEND} backend")


def test_custom_loop_with_masked_loss_matches_native_masked_model():
    kind = "lstm"
    ids, labels, lengths, labels0 = task("post")
    oracle = native_model(kind)
    initial = layer_weights(oracle)
    model = lengths_model(kind)
    copy_weights(oracle, model)
    parts = [slice(i * BATCH, (i + 1) * BATCH) for i in range(STEPS)]

    expected = train_loop(
        oracle,
        keras.optimizers.Adam(learning_rate=0.05),
        [(ids[s], labels0[s], ids[s] != 0) for s in parts],
        masked_mean_crossentropy,
    )
    losses = train_loop(
        model,
        keras.optimizers.Adam(learning_rate=0.05),
        [
            ({"ids": ids[s], "lengths": lengths[s]}, labels[s], lengths[s])
            for s in parts
        ],
        lengths_loss,
    )
    assert_same_training(losses, expected, model, oracle, initial)
