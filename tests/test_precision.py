"""MaskedBidirectional under mixed precision (`mixed_float16`, `mixed_bfloat16`).

Oracles: Keras' own masked `keras.layers.Bidirectional(..., use_cudnn=False)`
under the same policy with the same weights, and our layer in float32. Both
are compared within tolerances tied to the compute dtype's resolution at 1.0
(float16: 2**-10 ~ 1e-3, bfloat16: 2**-7 ~ 7.8e-3) for tanh-bounded outputs:

| policy | vs Keras, same policy | vs our float32 | measured (both) |
|---|---|---|---|
| mixed_float16 | atol 2e-3 | atol 2e-3 | <= 3.1e-4 / <= 7.0e-4 |
| mixed_bfloat16 | atol 1.6e-2 | atol 1.6e-2 | <= 3.0e-3 / <= 5.4e-3 |

(B=4, T=6, 8 units, on TF, JAX and PyTorch CPU; LSTM and GRU, the GRU on JAX
CPU through Keras' generic step loop.) Single-step sequences (T=1) are checked
the same way under float32 and both mixed policies. The LSTM cell state is
recomputed in float32, so ours is as close to float32 as Keras is, or closer.
Training: `compile` wraps the optimizer in a `LossScaleOptimizer` under
`mixed_float16`; a few steps give finite losses and change the weights.
"""

import keras
import numpy as np
import pytest

from maskedrnn import MaskedBidirectional, MaskedRNN
from tests.helpers import GPU_FLOAT32_ATOL, flat, to_np

B, T, D, U = 4, 6, 3, 8
TOLERANCE = {"mixed_float16": 2e-3, "mixed_bfloat16": 1.6e-2}
COMPUTE = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
# float32 (the single-step test): ours and Keras differ by float rounding only
# (on a GPU cuDNN's order of additions: `GPU_FLOAT32_ATOL`).
FLOAT32_ATOL = max(1e-6, GPU_FLOAT32_ATOL)


@pytest.fixture(autouse=True)
def reset_policy():
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def mask_patterns():
    m = np.ones((B, T), bool)
    m[0, 4:] = False  # right-padded
    m[1, :2] = False  # left-padded
    m[2] = False  # empty
    m[3, 2] = False  # a hole
    return m


def build(kind, policy):
    """(ours, Keras' masked Bidirectional), both under `policy`."""
    keras.config.set_dtype_policy(policy)
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}[kind]
    kw = dict(return_sequences=True, return_state=True)
    ref = keras.layers.Bidirectional(cls(U, use_cudnn=False, **kw))
    ref.build((None, None, D))
    ours = MaskedBidirectional(cls(U, **kw))
    ours.build((None, None, D))
    keras.config.set_dtype_policy("float32")
    return ours, ref


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_outputs_close_to_keras_and_to_float32(kind, policy):
    _check_against_keras_and_float32(kind, policy, T, mask_patterns())


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_single_step_sequences(kind, policy):
    """T=1: the reversal and the final-state gather degenerate to one step.

    On JAX CPU the GRU runs Keras' generic step loop (`lax.scan`, no fused
    kernel), so this is also that path under mixed precision.
    """
    mask = np.array([[True], [False], [True], [False]])
    _check_against_keras_and_float32(kind, policy, 1, mask)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("wrapper", ["bidirectional", "rnn"])
def test_a_policy_on_the_wrapper_alone(wrapper, policy):
    """The policy given to the wrapper only (`MaskedBidirectional(LSTM(...),
    dtype=policy)`), its inner LSTMs float32: the wrapper's autocast hands
    the inner layers float16/bfloat16 weight values, which must not break
    the torch CPU path's padding flag (its weight would overflow float16).
    Outputs and final states stay finite and equal Keras under the same
    policy (`Bidirectional(LSTM(use_cudnn=False), dtype=policy)`, or the
    LSTM itself for `MaskedRNN`), every mask pattern, an empty row."""
    kw = dict(return_sequences=True, return_state=True)
    if wrapper == "bidirectional":
        ours = MaskedBidirectional(keras.layers.LSTM(U, **kw), dtype=policy)
        ref = keras.layers.Bidirectional(
            keras.layers.LSTM(U, use_cudnn=False, **kw), dtype=policy
        )
    else:
        ours = MaskedRNN(keras.layers.LSTM(U, **kw), dtype=policy)
        ref = keras.layers.LSTM(U, use_cudnn=False, dtype=policy, **kw)
    ours.build((None, None, D))
    ref.build((None, None, D))
    ours.set_weights(ref.get_weights())
    mask = mask_patterns()
    x = np.random.default_rng(3).standard_normal((B, T, D)).astype("float32")
    got = [to_np(t).astype("float32") for t in flat(ours(x, mask=mask))]
    want = [to_np(t).astype("float32") for t in flat(ref(x, mask=mask))]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=TOLERANCE[policy], rtol=0)


def _check_against_keras_and_float32(kind, policy, steps, mask):
    x = np.random.default_rng(0).standard_normal((B, steps, D)).astype("float32")
    ours32, _ = build(kind, "float32")
    ours, ref = build(kind, policy)
    weights = ours32.get_weights()
    ours.set_weights(weights)
    ref.set_weights(weights)
    assert ours.compute_dtype == COMPUTE.get(policy, "float32")
    assert ours.variable_dtype == "float32"

    got = flat(ours(x, mask=mask))
    for t in got:
        assert COMPUTE.get(policy, "float32") in str(t.dtype)
    got = [to_np(t).astype("float32") for t in got]
    want = [to_np(t).astype("float32") for t in flat(ref(x, mask=mask))]
    full = [to_np(t) for t in flat(ours32(x, mask=mask))]
    atol = TOLERANCE.get(policy, FLOAT32_ATOL)
    for g, w, f in zip(got, want, full):
        assert np.all(np.isfinite(g))
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)
        np.testing.assert_allclose(g, f, atol=atol, rtol=0)
    # Padded steps are exactly zero and empty rows keep zero states.
    assert np.all(got[0][~mask] == 0)
    empty = ~mask.any(axis=1)
    assert empty.any()
    assert all(np.all(s[empty] == 0) for s in got[1:])


def _lengths_model():
    x = keras.Input((None, D))
    lengths = keras.Input((), dtype="int32")
    y = MaskedBidirectional(keras.layers.LSTM(U))(x, lengths=lengths)
    # The head outputs float32, as the mixed-precision guide recommends.
    out = keras.layers.Dense(1, dtype="float32")(y)
    return keras.Model([x, lengths], out)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fit_under_mixed_precision(policy):
    """Three steps: the loss is finite and goes down, every weight is still
    float32 and finite and has moved, and under mixed_float16 compile has
    applied loss scaling (LossScaleOptimizer)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, T, D)).astype("float32")
    lengths = rng.integers(0, T + 1, 8).astype("int32")
    y = rng.standard_normal((8, 1)).astype("float32")
    keras.config.set_dtype_policy(policy)
    model = _lengths_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    before = [w.copy() for w in model.get_weights()]
    history = model.fit([x, lengths], y, epochs=3, batch_size=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    for w in model.weights:
        assert w.dtype == "float32"
    for a, b in zip(before, model.get_weights()):
        assert np.all(np.isfinite(b)) and not np.allclose(a, b)
