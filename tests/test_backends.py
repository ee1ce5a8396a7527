"""Which backend RNN function runs inside `MaskedBidirectional`, and with what mask.

The whole point of `MaskedBidirectional` is that its inner `LSTM`/`GRU` never
see a mask, so Keras can hand them to the backend's fused kernel
(`keras.src.backend.lstm` / `gru`: cuDNN on GPU, and on the PyTorch backend
also a CPU loop with pre-computed input projections). A mask reaching them
sends them to the generic step loop (`keras.src.backend.rnn`; only
TensorFlow's cuDNN path takes a mask, a right-padded one).
Outputs cannot show this (both paths give the same numbers), so these tests
put spies on the backend functions the Keras layers look up at call time,
record the `mask` each call receives, and delegate to the real function.

Oracle for the spies themselves: Keras' own `Bidirectional` fed the same
mask, whose inner layers must be seen passing that mask (otherwise a spy
that never sees masks would make every "mask is None" assertion vacuous).

Which function ends up computing on this machine (asserted below):

| backend    | CPU                                     | GPU                       |
|------------|-----------------------------------------|---------------------------|
| tensorflow | `lstm`/`gru` decline -> `rnn` (no mask) | `lstm`/`gru` (cuDNN)      |
| jax        | `lstm` declines -> `rnn` (no mask);     | `lstm` (cuDNN); `gru`     |
|            | `gru` computes (`lax.scan`, no mask)    | (`lax.scan`)              |
| torch      | PyTorch's `torch.lstm`/`gru` via        | `lstm`/`gru` (cuDNN)      |
|            | `maskedrnn.backends.torch` (no Keras    |                           |
|            | call); with it turned off, `lstm`/`gru` |                           |
|            | compute (a Python loop over steps)      |                           |

With a mask, `backend.lstm`/`gru` decline on torch and JAX whatever the
device (TensorFlow's cuDNN path accepts right-padded masks only).

On a TensorFlow CPU an LSTM runs TensorFlow's fused `BlockLSTMV2` by
default (`maskedrnn.backends.tensorflow_block_lstm`), and a GRU Keras'
equations in length tiers (`maskedrnn.backends.tensorflow_cells`): no Keras
RNN function runs at all, and a spy on that runner sees both inner layers.

On a JAX CPU ours runs its length tiers by default
(`maskedrnn.backends.jax_tiers`): no Keras RNN function runs at all, and a
spy on the tiers' runner sees both inner layers.

Every eager test runs twice: with the default plan, and with Keras' inner
layers forced to run unmasked (`maskedrnn.backends.force("keras-unmasked")`,
the path a GPU takes on TensorFlow and JAX, and on torch for layers the
native kernels do not cover), so both paths stay proven.
"""

import inspect

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, backends
from maskedrnn._keras_private import get_keras_mask
from maskedrnn._keras_private import keras_gru_module as gru_module
from maskedrnn._keras_private import keras_lstm_module as lstm_module
from maskedrnn._keras_private import keras_rnn_module as rnn_module
from maskedrnn._keras_private import keras_src_backend as keras_backend
from tests.helpers import GPU, to_np

BACKEND = keras.backend.backend()
B, T, D, U, VOCAB = 3, 5, 2, 3, 7

# Token rows for Embedding(mask_zero=True): right-padded, left-padded, a hole.
TOKENS = np.array(
    [[1, 2, 3, 4, 5], [6, 1, 2, 0, 0], [0, 0, 3, 0, 4]],
    dtype="int32",
)
LENGTHS = np.array([5, 3, 1], dtype="int32")


def fused_without_mask(cell):
    """Whether `backend.<cell>` computes itself when given mask=None here (else
    it raises NotImplementedError and the layer falls back to `backend.rnn`):
    always on torch (cuDNN on CUDA, a pure-torch loop on CPU) and for JAX's GRU
    (a `lax.scan` with pre-computed input projections; JAX has no cuDNN GRU),
    otherwise only on GPU (cuDNN)."""
    if BACKEND == "torch" or (BACKEND == "jax" and cell == "gru"):
        return True
    return GPU


def native_kernels_here():
    """Whether ours runs PyTorch's own kernels here by default (torch, CPU)."""
    return BACKEND == "torch" and not GPU


def default_kernels(cell=None):
    """What ours runs here by default for `cell` ("lstm" or "gru"):
    "native" (PyTorch's kernels, torch on CPU), "one_call" (both directions
    in one cuDNN call: torch on CUDA, a JAX LSTM on a GPU), "jax_tiers"
    (JAX's length tiers, a JAX CPU), "block_lstm" (TensorFlow's
    `BlockLSTMV2`, an LSTM on a TensorFlow CPU), "tiers" (the length tiers
    of `maskedrnn.backends.tensorflow_cells`, a GRU on a TensorFlow CPU) or
    "keras_layers" (Keras' unmasked inner layers)."""
    if native_kernels_here():
        return "native"
    if BACKEND == "torch" or (BACKEND == "jax" and cell == "lstm" and GPU):
        return "one_call"
    if BACKEND == "tensorflow" and cell == "lstm" and not GPU:
        return "block_lstm"
    if BACKEND == "tensorflow" and cell == "gru" and not GPU:
        return "tiers"
    if BACKEND == "jax" and not GPU:
        return "jax_tiers"
    return "keras_layers"


class Spy:
    """Replaces `module.<name>` (`keras.src.backend.lstm` and the like, or
    `maskedrnn.backends.torch.run_native`) by a recorder that delegates.

    Each call appends a dict: `device` (of the input tensor, as a string),
    `mask` (the object passed, None or a tensor;
    `run_native` takes none), `kernel` (the kernel weight of the `inner`
    layer passed, else the `kernel` keyword: it identifies the calling
    layer's cell), and `outcome`: "computed" or "NotImplementedError" (the backend
    declined and the layer falls back).
    """

    def __init__(self, monkeypatch, name, module=keras_backend):
        self.name = name
        self.calls = []
        original = getattr(module, name)
        signature = inspect.signature(original)

        def spy(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            inner = bound.arguments.get("inner")
            # JAX's tiers take the list of directions: the first's kernel.
            inner = inner or (bound.arguments.get("inners") or [None])[0]
            data = bound.arguments.get("inputs", bound.arguments.get("x"))
            call = {
                "device": str(getattr(data, "device", "")),
                "mask": bound.arguments.get("mask"),
                "kernel": (
                    inner.cell.kernel
                    if inner is not None
                    else bound.arguments.get("kernel")
                ),
            }
            self.calls.append(call)
            try:
                out = original(*args, **kwargs)
            except NotImplementedError:
                call["outcome"] = "NotImplementedError"
                raise
            call["outcome"] = "computed"
            return out

        monkeypatch.setattr(module, name, spy)

    def masks(self):
        return [c["mask"] for c in self.calls]

    def outcomes(self):
        return [c["outcome"] for c in self.calls]

    def clear(self):
        self.calls.clear()


@pytest.fixture
def spies(monkeypatch):
    # The layers read these as attributes of the `keras.src.backend` module at
    # call time (`from keras.src import backend` ... `backend.lstm(...)`), so
    # that module attribute is the one to replace.
    for module in (lstm_module, gru_module, rnn_module):
        assert module.backend is keras_backend
    spies = {name: Spy(monkeypatch, name) for name in ("lstm", "gru", "rnn")}
    if BACKEND == "torch":
        # Looked up as `backends.current().run_native` / `.run_direction` at
        # call time; both record into one list.
        from maskedrnn.backends import torch as torch_backend

        spies["native"] = Spy(monkeypatch, "run_native", torch_backend)
        direct = Spy(monkeypatch, "run_direction", torch_backend)
        direct.calls = spies["native"].calls
    if BACKEND == "tensorflow":
        # Looked up as `block_lstm.run` at call time.
        from maskedrnn.backends import tensorflow_block_lstm

        spies["block"] = Spy(monkeypatch, "run", tensorflow_block_lstm)
        from maskedrnn.backends import tensorflow_cells

        spies["tiers"] = Spy(monkeypatch, "run", tensorflow_cells)
    if BACKEND == "jax":
        # Looked up as `run_directions` / `run_in_place` in its module at call
        # time; both record into one list.
        from maskedrnn.backends import jax_tiers

        spies["jax_tiers"] = Spy(monkeypatch, "run_directions", jax_tiers)
        placed = Spy(monkeypatch, "run_in_place", jax_tiers)
        placed.calls = spies["jax_tiers"].calls
    if BACKEND in ("torch", "jax"):
        # Looked up as `backends.current().run_one_call` at call time.
        spies["one_call"] = Spy(monkeypatch, "run_one_call", backends.current())
    return spies


@pytest.fixture(params=["default", "keras_layers"])
def kernels(request):
    """"default": ours as shipped (`default_kernels`). "keras_layers": Keras'
    unmasked inner layers forced (`maskedrnn.backends.force`), so they
    compute without a mask (the path of a GPU, and on torch for layers the
    native kernels do not cover)."""
    cell = request.node.callspec.params.get("cell")
    if request.param == "keras_layers":
        if default_kernels(cell) == "keras_layers":
            pytest.skip("the default plan here: the run above")
        with backends.force("keras-unmasked"):
            yield "keras_layers"
        return
    yield default_kernels(cell)


def make_rnn(cell, **kwargs):
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[cell]
    return cls(U, return_sequences=True, **kwargs)


def ours_and_keras(cell):
    """MaskedBidirectional and keras Bidirectional with the same weights."""
    ours = MaskedBidirectional(make_rnn(cell))
    ref = keras.layers.Bidirectional(make_rnn(cell))
    ours.build((None, None, D))
    ref.build((None, None, D))
    ref.set_weights(ours.get_weights())
    return ours, ref


def float_inputs(seed=0):
    x = np.random.default_rng(seed).standard_normal((B, T, D)).astype("float32")
    mask = np.arange(T)[None, :] < LENGTHS[:, None]
    return x, mask


def assert_fast_path_taken(spies, cell, ours, kernels="keras_layers"):
    """Ours: both inner layers call `backend.<cell>` with mask=None, and the
    generic loop runs exactly when the fused function declined, maskless.
    With `kernels="native"`: PyTorch's kernel computes both directions (one
    `run_native` or `run_direction` per direction and call) and no
    Keras RNN function runs at all; the same with `kernels="block_lstm"`
    (one `BlockLSTMV2` run per direction and call) and `kernels="tiers"`
    (one run of the GRU's length tiers per direction and call). With
    `kernels="jax_tiers"`: JAX's length tiers run both directions at once,
    and no Keras RNN function runs. With `kernels="masked_loop"`: Keras'
    masked loop runs both directions, each handed a mask."""
    inner = (ours.forward_layer, ours.backward_layer)
    if "block" in spies and kernels != "block_lstm":
        assert spies["block"].calls == []
    if "tiers" in spies and kernels != "tiers":
        assert spies["tiers"].calls == []
    if "jax_tiers" in spies and kernels != "jax_tiers":
        assert spies["jax_tiers"].calls == []
    if kernels == "one_call":
        # Both directions in one kernel call (cuDNN on a GPU), handed the
        # valid-first batch and its lengths, no mask; no Keras RNN function.
        calls = spies["one_call"].calls
        assert calls, "no one-call kernel ran"
        assert all(c["kernel"] is inner[0].cell.kernel for c in calls)
        assert spies["one_call"].outcomes() == ["computed"] * len(calls)
        assert spies["one_call"].masks() == [None] * len(calls)
        for name in ("lstm", "gru", "rnn"):
            real = [c for c in spies[name].calls if c["device"] != "meta"]
            assert real == [], f"backend.{name} ran on data"
        return
    if "one_call" in spies and kernels != "jax_tiers":
        assert spies["one_call"].calls == []
    if kernels == "jax_tiers":
        # Both directions in one tiered recurrence per call, no Keras RNN
        # function on data.
        tiers = spies["jax_tiers"].calls
        assert tiers and tiers[0]["kernel"] is inner[0].cell.kernel
        assert spies["jax_tiers"].outcomes() == ["computed"] * len(tiers)
        for name in ("lstm", "gru", "rnn"):
            assert spies[name].calls == [], f"backend.{name} ran"
        return
    if kernels in ("native", "block_lstm", "tiers"):
        native = spies[{"block_lstm": "block"}.get(kernels, kernels)]
        assert native.calls, f"{kernels} kernels were never called"
        assert len(native.calls) % 2 == 0
        kernels_seen = {id(c["kernel"]) for c in native.calls}
        assert kernels_seen == {id(layer.cell.kernel) for layer in inner}
        assert native.outcomes() == ["computed"] * len(native.calls)
        for name in ("lstm", "gru", "rnn"):
            # Keras' torch backend infers output shapes by running layers on
            # "meta" tensors (no values); that pass takes Keras' path.
            real = [c for c in spies[name].calls if c["device"] != "meta"]
            assert real == [], f"backend.{name} ran on data"
        return
    if "native" in spies:
        assert spies["native"].calls == []
    fused = spies[cell]
    assert fused.calls, f"backend.{cell} was never called"
    assert fused.masks() == [None] * len(fused.calls)
    kernels_seen = {id(c["kernel"]) for c in fused.calls}
    assert kernels_seen == {id(layer.cell.kernel) for layer in inner}
    expected = "computed" if fused_without_mask(cell) else "NotImplementedError"
    assert fused.outcomes() == [expected] * len(fused.calls)
    declined = fused.outcomes().count("NotImplementedError")
    assert len(spies["rnn"].calls) == declined
    assert spies["rnn"].masks() == [None] * declined
    other = spies["gru" if cell == "lstm" else "lstm"]
    assert other.calls == []


def assert_keras_passed_mask(spies, cell, expected_mask=None):
    """The contrast: keras Bidirectional's inner layers pass the mask on."""
    fused = spies[cell]
    assert len(fused.calls) >= 2
    assert all(m is not None for m in fused.masks())
    if expected_mask is not None:
        for m in fused.masks():
            np.testing.assert_array_equal(to_np(m), expected_mask)
    # With a mask, torch and JAX always decline (TF declines on CPU); the
    # generic loop then receives the same mask.
    declined = fused.outcomes().count("NotImplementedError")
    assert len(spies["rnn"].calls) == declined
    assert all(m is not None for m in spies["rnn"].masks())
    if expected_mask is not None:
        for m in spies["rnn"].masks():
            np.testing.assert_array_equal(to_np(m), expected_mask)


# ------------------------------------------------------------------- eager


@pytest.mark.parametrize("cell", ["lstm", "gru"])
@pytest.mark.parametrize("how", ["keras_mask", "mask", "lengths"])
def test_eager_inner_rnns_get_no_mask(spies, kernels, cell, how):
    ours, ref = ours_and_keras(cell)
    if how == "keras_mask":
        embedding = keras.layers.Embedding(VOCAB, D, mask_zero=True)
        x = embedding(TOKENS)  # carries a Keras mask, which fills `mask=`
        mask = TOKENS != 0
        assert get_keras_mask(x) is not None
        for spy in spies.values():
            spy.clear()
        y = ours(x)
        kwargs = {}
    else:
        x, mask = float_inputs()
        kwargs = {"mask": mask} if how == "mask" else {"lengths": LENGTHS}
        y = ours(x, **kwargs)
    assert_fast_path_taken(spies, cell, ours, kernels)
    if how != "keras_mask":
        return  # (parity for every input form: tests/test_masked_bidirectional.py)
    # The fast path computed the masked result (oracle: Keras with the mask),
    # and the spies do see masks when a layer passes one (the contrast).
    for spy in spies.values():
        spy.clear()
    expected = ref(to_np(x), mask=mask)
    assert_keras_passed_mask(spies, cell, expected_mask=mask)
    np.testing.assert_allclose(to_np(y), to_np(expected), atol=1e-5)


def test_generic_cell_loops_over_the_callers_mask(spies):
    """`RNN(LSTMCell)` has no fused kernel to keep: ours gives Keras'
    generic loop the caller's mask as it is (the backward direction reads
    it flipped), no reordering."""
    ours = MaskedBidirectional(
        keras.layers.RNN(keras.layers.LSTMCell(U), return_sequences=True)
    )
    assert not ours.uses_fast_path
    x = np.random.default_rng(2).standard_normal((B, T, D)).astype("float32")
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], bool)
    ours(x, mask=mask)
    assert spies["lstm"].calls == []
    if "native" in spies:
        assert spies["native"].calls == []
    assert len(spies["rnn"].calls) == 2
    forward, backward = spies["rnn"].masks()
    np.testing.assert_array_equal(to_np(forward), mask)
    np.testing.assert_array_equal(to_np(backward), mask[:, ::-1])


# -------------------------------------------------------- compiled training


def one_fit_step(model, inputs, target):
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(inputs, target, epochs=1, batch_size=B, verbose=0)


def build_model(wrapper, how):
    """A Functional model around `wrapper`, fed as `how` says."""
    if how == "keras_mask":
        tokens = keras.Input((T,), dtype="int32")
        x = keras.layers.Embedding(VOCAB, D, mask_zero=True)(tokens)
        y = wrapper(x)
        inputs, data = tokens, TOKENS
    elif how == "mask":
        seq = keras.Input((T, D))
        mask = keras.Input((T,), dtype="bool")
        y = wrapper(seq, mask=mask)
        x, m = float_inputs()
        inputs, data = [seq, mask], [x, m]
    else:
        seq = keras.Input((T, D))
        lengths = keras.Input((), dtype="int32")
        y = wrapper(seq, lengths=lengths)
        inputs, data = [seq, lengths], [float_inputs()[0], LENGTHS]
    out = keras.layers.Dense(1)(y)
    return keras.Model(inputs, out), data


@pytest.mark.slow
@pytest.mark.parametrize(
    "cell, how",
    [("lstm", "keras_mask"), ("lstm", "lengths"), ("gru", "mask")],
)
def test_fit_step_inner_rnns_get_no_mask(spies, cell, how):
    ours = MaskedBidirectional(make_rnn(cell))
    model, data = build_model(ours, how)
    for spy in spies.values():
        spy.clear()
    one_fit_step(model, data, np.zeros((B, T, 1), "float32"))
    assert_fast_path_taken(spies, cell, ours, default_kernels(cell))


@pytest.mark.slow
def test_fit_step_keras_bidirectional_passes_the_mask(spies):
    ref = keras.layers.Bidirectional(make_rnn("lstm"))
    model, data = build_model(ref, "keras_mask")
    for spy in spies.values():
        spy.clear()
    one_fit_step(model, data, np.zeros((B, T, 1), "float32"))
    assert_keras_passed_mask(spies, "lstm")
