"""Traces and compilations of a `fit` over batches of varying shape:
ours no more than Keras' own masked layer on the same data.

The oracle is Keras' own layer fed the same mask (`Embedding(mask_zero=
True)`), in the same model, compiled and fed alike: `Bidirectional(LSTM(
use_cudnn=False))` against `MaskedBidirectional`, and `GRU(use_cudnn=False)`
against `MaskedRNN` (a GRU runs other kernels than an LSTM: on TensorFlow,
the tiers' shared step loops). Counted: the Python traces of the train
step (`train_step` runs in Python only while `tf.function` or `jax.jit`
traces it) and, on JAX, every XLA compilation during the fit (also those
outside the train step). Data: `BucketedDataset` with 4 bucket boundaries
and no `drop_remainder` (each bucket ends in a smaller batch, and the last
batch of the data set is ragged), over two epochs; and `fit` called again
on arrays padded to other lengths, as when a notebook cell is re-run on
new data. Torch runs Keras' step eagerly: nothing to count.
"""

import keras
import numpy as np
import pytest

import maskedrnn
from maskedrnn.bucketing import BucketedDataset
from tests.helpers import BACKEND, JaxCompiles
from tests.test_bucketing import CLASSES, UNITS, VOCAB, token_data

pytestmark = pytest.mark.skipif(
    BACKEND == "torch", reason="Keras runs the torch step eagerly: nothing traced"
)
BOUNDARIES = [4, 8, 12, 15]


class Counting(keras.Model):
    """A functional model that records the shape of the inputs of each trace
    of its train step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.traces = []

    def train_step(self, *args):
        # Python runs here only while jax.jit / tf.function traces.
        self.traces.append(tuple(keras.tree.flatten(args[-1])[0].shape))
        return super().train_step(*args)


def build(kind, layer):
    """Embedding(mask_zero) -> ours or Keras' layer -> Dense, with the same
    initial weights for both kinds. `layer`: `"bidirectional"` (an LSTM in
    both directions) or `"rnn"` (a GRU in one)."""
    ids = keras.Input((None,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 5, mask_zero=True)(ids)
    if layer == "rnn":
        gru = keras.layers.GRU(UNITS, return_sequences=True, use_cudnn=False)
        h = maskedrnn.MaskedRNN(gru)(h) if kind == "ours" else gru(h)
    else:
        lstm = keras.layers.LSTM(UNITS, return_sequences=True, use_cudnn=False)
        if kind == "ours":
            h = maskedrnn.MaskedBidirectional(lstm)(h)
        else:
            h = keras.layers.Bidirectional(lstm)(h)
    out = keras.layers.Dense(CLASSES, activation="softmax")(h)
    model = Counting(ids, out)
    # The same weights whatever order the layers drew their initial ones in
    # (the weights come in the same order and shapes for both kinds).
    rng = np.random.default_rng(0)
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape) for w in model.get_weights()])
    # The fits' shuffles, seeded after the layers drew their weights.
    keras.utils.set_random_seed(0)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=maskedrnn.MaskedLoss("sparse_categorical_crossentropy", pad_value=-1),
    )
    return model


def counted_fit(kind, layer, fits):
    """Runs `fits(model)` on a new model of `kind` and `layer`; returns
    `(train-step traces, XLA compilations or None off JAX, final loss)`."""
    if BACKEND == "jax":
        import jax

        # Eager ops the first fit of a process compiles (the optimizer's
        # and metrics' updates) would be reused by the second model.
        jax.clear_caches()
    model = build(kind, layer)
    if BACKEND == "jax":
        with JaxCompiles() as compiles:
            history = fits(model)
        count = compiles.count
    else:
        history = fits(model)
        count = None
    return model.traces, count, history.history["loss"][-1]


def bucketed_fits(model):
    x, y_steps, _, _ = token_data(75, seed=3)
    ds = BucketedDataset(x, y_steps, batch_size=8, boundaries=BOUNDARIES, seed=0)
    sizes = {len(b) for b in ds.batch_indices}
    # Ragged: a smaller last batch in every bucket, and more batches than
    # (size, boundary) shapes, so that a per-batch retrace would show.
    assert ds.boundaries == BOUNDARIES and len(sizes) > 1 and 75 % 8 != 0
    return model.fit(ds, epochs=2, verbose=0)


def repadded_fits(model):
    x, y_steps, _, _ = token_data(40, seed=4)
    for maxlen in (15, 18, 21, 24):
        ids = keras.utils.pad_sequences(x, maxlen=maxlen, padding="post")
        labels = keras.utils.pad_sequences(
            y_steps, maxlen=maxlen, padding="post", value=-1
        )
        history = model.fit(ids, labels, batch_size=16, epochs=1, verbose=0)
    return history


@pytest.mark.slow  # two models, several shapes
@pytest.mark.parametrize(
    "layer, fits",
    [
        ("bidirectional", bucketed_fits),
        ("bidirectional", repadded_fits),
        ("rnn", bucketed_fits),
    ],
)
def test_fit_traces_and_compiles_no_more_than_keras_masked(layer, fits):
    ours_traces, ours_compiles, ours_loss = counted_fit("ours", layer, fits)
    keras_traces, keras_compiles, keras_loss = counted_fit("keras", layer, fits)
    # The same training (the same batches reached the same step).
    np.testing.assert_allclose(ours_loss, keras_loss, rtol=1e-4)
    assert len(ours_traces) <= len(keras_traces), (ours_traces, keras_traces)
    assert sorted(ours_traces, key=str) == sorted(keras_traces, key=str)
    if BACKEND == "jax":
        assert ours_compiles <= keras_compiles, (ours_compiles, keras_compiles)
