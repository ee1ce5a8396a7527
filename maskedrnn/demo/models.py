"""The demo's three models, their training progress bar and predictions."""

import sys
import time

import keras
import numpy as np

from maskedrnn.demo.settings import DISTANCE_EMBED, DISTANCE_VOCAB
from maskedrnn.layers import MaskedBidirectional, MaskedRNN
from maskedrnn.losses import MaskedLoss
from maskedrnn.metrics import MaskedAccuracy

MODEL_NAMES = ("masked_bidirectional", "keras_masked", "naive")


MODEL_LABELS = {
    "masked_bidirectional": "MaskedBidirectional",
    "keras_masked": "keras Bidirectional + mask",
    "naive": "keras Bidirectional, no mask",
}


RNN_MODEL_NAMES = ("masked_rnn", "keras_masked", "naive")


RNN_MODEL_LABELS = {
    "masked_rnn": "MaskedRNN",
    "keras_masked": "keras LSTM + mask",
    "naive": "keras LSTM, no mask",
}


def model_names(layer):
    """The three model names of a run with `layer` (`MODEL_NAMES` or
    `RNN_MODEL_NAMES`); the first is ours."""
    return RNN_MODEL_NAMES if layer == "rnn" else MODEL_NAMES


def model_labels(layer):
    return RNN_MODEL_LABELS if layer == "rnn" else MODEL_LABELS


def _inputs(task, data, masked):
    """A model's inputs and what reads them before the RNN: the frames
    (vowels) or the tokens' embedding (distance), with a mask of the padded
    steps where `masked`."""
    if task == "vowels":
        inputs = keras.Input((None, data["n_features"]), name="frames")
        x = keras.layers.Masking(mask_value=0.0)(inputs) if masked else inputs
    else:
        inputs = keras.Input((None,), dtype="int32", name="tokens")
        x = keras.layers.Embedding(DISTANCE_VOCAB, DISTANCE_EMBED, mask_zero=masked)(
            inputs
        )
    return inputs, x


def build_model(task, kind, data, units, layer="bidirectional"):
    """One of the three models; `kind` is one of `model_names(layer)`."""
    inputs, x = _inputs(task, data, masked=kind != "naive")
    # Vowels: one label per sequence; distance: one per token.
    return_sequences = task != "vowels"
    lstm = keras.layers.LSTM(units, return_sequences=return_sequences, use_cudnn="auto")
    if layer == "rnn":
        # MaskedRNN has the LSTM's weights in the same order, so `set_weights`
        # copies them across the three models.
        if kind == "masked_rnn":
            x = MaskedRNN(lstm, name="rnn")(x)
        else:
            x = keras.layers.LSTM.from_config({**lstm.get_config(), "name": "rnn"})(x)
    elif kind == "masked_bidirectional":
        x = MaskedBidirectional(lstm, name="bidirectional")(x)
    else:
        x = keras.layers.Bidirectional(lstm, name="bidirectional")(x)
    outputs = keras.layers.Dense(data["n_classes"], name="logits")(x)
    return keras.Model(inputs, outputs, name=kind)


def compile_model(model, task, learning_rate):
    optimizer = keras.optimizers.Adam(learning_rate)
    if task == "vowels":
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    else:
        model.compile(
            optimizer=optimizer,
            loss=MaskedLoss(
                keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                pad_value=-1,
            ),
            metrics=[MaskedAccuracy(pad_value=-1, name="accuracy")],
        )


def warm_up(task, data, units, layer, learning_rate, batch_size):
    """Fits, for one epoch on the task's training data, a model made of
    what the three compared models share (their inputs, masking, `Dense`
    head, loss, metrics and optimizer) with a `Dense` layer of the RNN's
    output width in the RNN's place.

    What a process pays once, on its first fit (Keras' training loop and
    the backend starting up), and what the compared models share at the
    same shapes (tracing their head, loss, metrics and optimizer steps for
    each batch shape; JAX caches these traces by shape across models) then
    falls on none of them: each first epoch holds its own model's tracing
    and compiling, whichever model is fitted first. Uses its own weights;
    the demo sets the seed again before each compared fit.
    """
    width = units if layer == "rnn" else 2 * units
    inputs, x = _inputs(task, data, masked=True)
    if task == "vowels":
        x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dense(width, activation="tanh")(x)
    outputs = keras.layers.Dense(data["n_classes"], name="logits")(x)
    model = keras.Model(inputs, outputs, name="warm_up")
    compile_model(model, task, learning_rate)
    model.fit(
        data["x_train"], data["y_train"], epochs=1, batch_size=batch_size, verbose=0
    )


class Progress(keras.callbacks.Callback):
    """Compact per-model progress bar; also records each epoch's duration.

    On a terminal the bar is redrawn in place; otherwise (logs, CI) about five
    lines are printed per model. `verbose=0` prints nothing.
    """

    def __init__(self, label, epochs, verbose, stream=None):
        super().__init__()
        self.label = label
        self.epochs = epochs
        self.verbose = verbose
        self.stream = sys.stdout if stream is None else stream
        self.epoch_seconds = []
        self.last_logs = {}
        self._start = None
        self._width = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self._start)
        self.last_logs = dict(logs or {})
        if not self.verbose:
            return
        done = epoch + 1
        width = 20
        filled = round(width * done / self.epochs)
        bar = "#" * filled + "." * (width - filled)
        line = (
            f"  {self.label:<30} [{bar}] {done:>3}/{self.epochs}"
            f"  loss {self.last_logs.get('loss', float('nan')):.4f}"
            f"  acc {self.last_logs.get('accuracy', float('nan')):.4f}"
            f"  {self.epoch_seconds[-1]:.2f} s/epoch"
        )
        is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        if is_tty:
            end = "\n" if done == self.epochs else ""
            self.stream.write("\r" + line.ljust(self._width) + end)
            self._width = len(line)
        elif done == self.epochs or done % max(1, self.epochs // 5) == 0:
            self.stream.write(line + "\n")
        self.stream.flush()


def predict_logits(model, x, batch_size):
    return np.asarray(model.predict(x, batch_size=batch_size, verbose=0), "float32")


def softmax(logits):
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def accuracy(logits, labels, valid):
    correct = np.argmax(logits, axis=-1) == labels
    if correct.ndim == 1:
        return float(correct.mean())
    return float(correct[valid].mean())
