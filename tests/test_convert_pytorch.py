"""Specification of `maskedrnn.convert.pytorch`: `torch.nn.LSTM`/`GRU`/`RNN`
weights and state dicts, checked by running PyTorch itself on the same inputs
(stacked, bidirectional, without bias, and padded batches as a
`PackedSequence` against Keras' masked `Bidirectional` and
`maskedrnn.MaskedBidirectional`). `nn.RNN` runs with both nonlinearities,
against `keras.layers.SimpleRNN` with the same activation.
"""

import keras
import numpy as np
import pytest

from maskedrnn import convert
from tests.convert_helpers import (
    ATOL,
    bidirectional_classes,
    keras_rnn,
    normal,
    random_keras,
    requires_torch,
    rng_for,
    run_keras,
    to_np,
)

# "rnn_tanh" / "rnn_relu": nn.RNN(nonlinearity=...) and SimpleRNN(activation=...).
KINDS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]


def torch_module(kind, input_dim, units, **kwargs):
    import torch

    if kind.startswith("rnn_"):
        kwargs["nonlinearity"] = kind[4:]
        return torch.nn.RNN(input_dim, units, batch_first=True, **kwargs)
    cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
    return cls(input_dim, units, batch_first=True, **kwargs)


def run_torch(module, x, lengths=None):
    """Returns (padded outputs, [h_n, (c_n)]) as numpy; packed if lengths."""
    import torch

    xt = torch.from_numpy(x)
    with torch.no_grad():
        if lengths is None:
            y, state = module(xt)
        else:
            packed = torch.nn.utils.rnn.pack_padded_sequence(
                xt, torch.as_tensor(lengths), batch_first=True, enforce_sorted=False
            )
            y, state = module(packed)
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(
                y, batch_first=True, total_length=x.shape[1]
            )
    states = list(state) if isinstance(state, tuple) else [state]
    return y.numpy(), [s.numpy() for s in states]


def run_keras_stack(kind, layers_weights, x, mask=None, bidirectional_cls=None, **kw):
    """Stacked Keras layers; returns (last outputs, [per-layer state lists])."""
    y, states = x, []
    for weights in layers_weights:
        units = np.asarray(weights[1]).shape[0]
        layer = keras_rnn(kind, units, mask, use_bias=len(weights) % 3 == 0, **kw)
        if bidirectional_cls is not None:
            layer = bidirectional_cls(layer)
        layer.build(y.shape)
        layer.set_weights(weights)
        out = layer(y, mask=mask)
        y = to_np(out[0])
        states.append([to_np(s) for s in out[1:]])
    return y, states


def assert_states_match_torch(kind, keras_states, torch_states, bidirectional):
    """Keras per-layer [h_fw, (c_fw), h_bw, (c_bw)] vs torch h_n (and c_n) of
    shape (num_layers * directions, batch, H)."""
    per_direction = 2 if kind == "lstm" else 1
    directions = 2 if bidirectional else 1
    for k, layer_states in enumerate(keras_states):
        for d in range(directions):
            for s in range(per_direction):
                np.testing.assert_allclose(
                    layer_states[d * per_direction + s],
                    torch_states[s][k * directions + d],
                    atol=ATOL,
                )


@requires_torch
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "num_layers,bidirectional", [(1, False), (2, False), (2, True)]
)
def test_torch_state_dict_to_keras_unmasked(kind, num_layers, bidirectional):
    import torch

    torch.manual_seed(0)
    input_dim, units = 3, 4
    module = torch_module(
        kind, input_dim, units, num_layers=num_layers, bidirectional=bidirectional
    )
    x = normal(
        rng_for("torch", kind, num_layers, bidirectional), 3, 5, input_dim, scale=1
    )
    expected, torch_states = run_torch(module, x)

    layers = convert.torch_state_dict_to_keras(module.state_dict())
    assert len(layers) == num_layers
    assert all(len(w) == (6 if bidirectional else 3) for w in layers)
    bi_cls = keras.layers.Bidirectional if bidirectional else None
    y, keras_states = run_keras_stack(kind, layers, x, bidirectional_cls=bi_cls)
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, bidirectional)


@requires_torch
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_keras_to_torch_state_dict_loads_into_torch(kind, bidirectional):
    import torch

    rng = rng_for("k2t", kind, bidirectional)
    input_dim, units, num_layers = 3, 4, 2
    directions = 2 if bidirectional else 1
    layers = []
    layer_input = input_dim
    for _ in range(num_layers):
        layer = []
        for _ in range(directions):
            layer += random_keras(rng, kind, layer_input, units)
        layers.append(layer)
        layer_input = units * directions
    x = normal(rng, 3, 5, input_dim, scale=1.0)
    bi_cls = keras.layers.Bidirectional if bidirectional else None
    expected, keras_states = run_keras_stack(kind, layers, x, bidirectional_cls=bi_cls)

    state = convert.keras_to_torch_state_dict(layers)
    if kind != "gru":
        # Documented split of an LSTM's and a SimpleRNN's one bias: all of it
        # in bias_ih, zeros in bias_hh.
        np.testing.assert_array_equal(state["bias_ih_l0"], layers[0][2])
        np.testing.assert_array_equal(state["bias_hh_l0"], np.zeros_like(layers[0][2]))
    module = torch_module(
        kind, input_dim, units, num_layers=num_layers, bidirectional=bidirectional
    )
    module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    y, torch_states = run_torch(module, x)
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, bidirectional)


@requires_torch
@pytest.mark.parametrize("kind", KINDS)
def test_torch_without_bias_round_trips_through_keras_use_bias_false(kind):
    import torch

    torch.manual_seed(1)
    module = torch_module(kind, 3, 2, bias=False, bidirectional=True)
    x = normal(rng_for("nobias", kind), 2, 4, 3, scale=1.0)
    expected, torch_states = run_torch(module, x)
    layers = convert.torch_state_dict_to_keras(module.state_dict())
    assert [len(w) for w in layers] == [4]
    y, keras_states = run_keras_stack(
        kind, layers, x, bidirectional_cls=keras.layers.Bidirectional
    )
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, True)
    state = convert.keras_to_torch_state_dict(layers)
    assert sorted(state) == sorted(module.state_dict())
    for key, value in module.state_dict().items():
        np.testing.assert_array_equal(state[key], value.numpy())


LENGTHS = [6, 2, 4, 1]


@requires_torch
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional_cls", list(bidirectional_classes()))
def test_torch_packed_sequence_equals_masked_keras_bidirectional(
    kind, bidirectional_cls
):
    """Padded batch: PyTorch on a PackedSequence vs the converted weights in
    Keras given the mask (2 stacked bidirectional layers). Outputs (zeros at
    padded steps) and final states of every layer and direction match."""
    import torch

    torch.manual_seed(2)
    input_dim, units, steps = 3, 4, max(LENGTHS)
    module = torch_module(kind, input_dim, units, num_layers=2, bidirectional=True)
    # Padded steps hold garbage: they must be ignored.
    x = normal(rng_for("packed", kind), len(LENGTHS), steps, input_dim, scale=1.0)
    mask = np.arange(steps)[None, :] < np.asarray(LENGTHS)[:, None]
    expected, torch_states = run_torch(module, x, LENGTHS)
    assert np.all(expected[~mask] == 0)

    layers = convert.torch_state_dict_to_keras(module.state_dict())
    y, keras_states = run_keras_stack(
        kind, layers, x, mask=mask, bidirectional_cls=bidirectional_cls
    )
    np.testing.assert_allclose(y, expected, atol=ATOL)
    assert_states_match_torch(kind, keras_states, torch_states, True)


@requires_torch
def test_torch_state_dict_prefix_selects_a_submodule():
    import torch

    torch.manual_seed(3)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = torch.nn.GRU(3, 2, batch_first=True)
            self.head = torch.nn.Linear(2, 1)

    model = Model()
    layers = convert.torch_state_dict_to_keras(model.state_dict(), prefix="rnn.")
    x = normal(rng_for("prefix"), 2, 4, 3, scale=1.0)
    expected, _ = run_torch(model.rnn, x)
    np.testing.assert_allclose(run_keras("gru", layers[0], x)[0], expected, atol=ATOL)
    state = convert.keras_to_torch_state_dict(layers, prefix="rnn.")
    assert sorted(state) == sorted(
        k for k in model.state_dict() if k.startswith("rnn.")
    )
    with pytest.raises(ValueError, match="prefix"):
        convert.torch_state_dict_to_keras(model.state_dict())


@requires_torch
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_torch_rnn_direction_equals_its_equations_and_round_trips(nonlinearity):
    """One `nn.RNN` direction: PyTorch's documented equation
    `h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)` in numpy, PyTorch itself and
    `keras.layers.SimpleRNN` with the converted weights agree; converting
    back gives PyTorch's weights and, as documented, the bias sum in
    `bias_ih`."""
    import torch

    torch.manual_seed(4)
    module = torch_module(f"rnn_{nonlinearity}", 3, 5)
    x = normal(rng_for("rnn", nonlinearity), 2, 6, 3, scale=1.0)
    w_ih, w_hh, b_ih, b_hh = (p.detach().numpy() for p in module.parameters())
    act = np.tanh if nonlinearity == "tanh" else lambda v: np.maximum(v, 0.0)
    h, steps = np.zeros((2, 5)), []
    for t in range(x.shape[1]):
        h = act(x[:, t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh)
        steps.append(h)
    numpy_y = np.stack(steps, 1)
    torch_y, _ = run_torch(module, x)
    np.testing.assert_allclose(torch_y, numpy_y, atol=ATOL)

    weights = convert.torch_rnn_to_simple_rnn(w_ih, w_hh, b_ih, b_hh)
    assert [w.shape for w in weights] == [(3, 5), (5, 5), (5,)]
    y, h_n = run_keras(f"rnn_{nonlinearity}", weights, x)
    np.testing.assert_allclose(y, numpy_y, atol=ATOL)
    np.testing.assert_allclose(h_n, numpy_y[:, -1], atol=ATOL)

    back = convert.simple_rnn_to_torch_rnn(weights)
    np.testing.assert_array_equal(back[0], w_ih)
    np.testing.assert_array_equal(back[1], w_hh)
    np.testing.assert_allclose(back[2], b_ih + b_hh)
    np.testing.assert_array_equal(back[3], np.zeros(5, "float32"))
    no_bias = convert.simple_rnn_to_torch_rnn(weights[:2])
    assert len(no_bias) == 2
    assert len(convert.torch_rnn_to_simple_rnn(*no_bias)) == 2


@requires_torch
def test_torch_errors_name_the_problem():
    import torch

    projected = torch.nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="proj_size"):
        convert.torch_state_dict_to_keras(projected.state_dict())
    with pytest.raises(TypeError, match="mapping"):
        convert.torch_state_dict_to_keras([np.zeros(3)])
    weight = torch.zeros(8, 3, requires_grad=True)
    with pytest.raises(TypeError, match="detach"):
        convert.torch_lstm_to_lstm(weight, np.zeros((8, 2)))
    with pytest.raises(ValueError, match="both `bias_ih` and `bias_hh`"):
        convert.torch_gru_to_gru(np.zeros((6, 3)), np.zeros((6, 2)), np.zeros(6))
    with pytest.raises(ValueError, match=r"bias of a keras SimpleRNN"):
        convert.simple_rnn_to_torch_rnn([np.zeros((3, 2)), np.eye(2), np.zeros(4)])
    with pytest.raises(ValueError, match=r"\(units, units\) for a SimpleRNN"):
        convert.keras_to_torch_state_dict([[np.zeros((3, 4)), np.zeros((2, 4))]])
    with pytest.raises(ValueError, match="same RNN type"):
        convert.keras_to_torch_state_dict(
            [
                [np.zeros((3, 2)), np.eye(2), np.zeros(2)],
                [np.zeros((2, 6)), np.zeros((2, 6)), np.zeros((2, 6))],
            ]
        )
    with pytest.raises(TypeError, match=r"\[layer.get_weights\(\)\]"):
        convert.keras_to_torch_state_dict([np.zeros((3, 8)), np.zeros((2, 8))])


def test_docstring_examples_run():
    import doctest

    from maskedrnn.convert import pytorch

    results = doctest.testmod(pytorch, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 0
