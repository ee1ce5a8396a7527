"""`maskedrnn.convert.gate_layout`: the gate permutations every converter shares.

Checked on arrays whose entries name their gate, so the expected result is
written down from the layouts' documentation (Keras GRU z, r, h; cuDNN and
PyTorch r, z, h/n; Keras LSTM i, f, c, o; TF1 LSTM cells i, c, f, o), and on
torch tensors through `torch.chunk`/`torch.cat`, the path the torch
backend's native GRU kernel takes.
"""

import importlib.util

import numpy as np
import pytest

from maskedrnn.convert import gate_layout
from tests.helpers import run_python

U = 2


def labelled(gates, rows=1):
    """A `(rows, len(gates) * U)` array whose column block `k` holds the
    letter of gate `gates[k]`."""
    return np.array([[g for g in gates for _ in range(U)]] * rows)


def test_swap_gru_zr_maps_keras_to_cudnn_and_back():
    keras_kernel = labelled("zrh", rows=3)
    torch_order = gate_layout.swap_gru_zr(keras_kernel)
    np.testing.assert_array_equal(torch_order, labelled("rzh", rows=3))
    np.testing.assert_array_equal(gate_layout.swap_gru_zr(torch_order), keras_kernel)
    # PyTorch keeps gates on rows: axis=0 on the transposed matrix.
    np.testing.assert_array_equal(
        gate_layout.swap_gru_zr(keras_kernel.T, axis=0), labelled("rzh", rows=3).T
    )
    # A Keras GRU bias (2, 3U): both rows reordered.
    bias = labelled("zrh", rows=2)
    np.testing.assert_array_equal(gate_layout.swap_gru_zr(bias), labelled("rzh", 2))


def test_tf1_lstm_swap_and_reorders():
    tf1 = labelled("icfo")
    keras_order = gate_layout.reorder_gates(tf1, gate_layout.TF1_LSTM_SWAP_CF, 1)
    np.testing.assert_array_equal(keras_order, labelled("ifco"))
    blocks = gate_layout.split_gates(labelled("rzh")[0], 3, 0)
    reordered = gate_layout.reorder_blocks(blocks, gate_layout.GRU_SWAP_ZR)
    np.testing.assert_array_equal(np.concatenate(reordered), labelled("zrh")[0])


def test_map_gate_blocks_and_halve_bias():
    matrix = np.arange(12.0).reshape(1, 12)
    flipped = gate_layout.map_gate_blocks(matrix, 4, lambda b: b[:, ::-1])
    np.testing.assert_array_equal(flipped[0], [2, 1, 0, 5, 4, 3, 8, 7, 6, 11, 10, 9])
    half = gate_layout.halve_bias(np.ones(8, "float32"))
    assert half.dtype == np.float32 and np.all(half == 0.5)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_swap_gru_zr_on_torch_tensors_equals_numpy():
    import torch

    x = np.random.default_rng(0).standard_normal((2, 3, 3 * U))
    got = gate_layout.swap_gru_zr(torch.from_numpy(x), -1, torch.chunk, torch.cat)
    np.testing.assert_array_equal(got.numpy(), gate_layout.swap_gru_zr(x))


@pytest.mark.on_backends("torch")  # its own JAX process, whatever the backend
def test_convert_package_does_not_import_torch():
    """The converters and the permutation work with torch unimportable (on
    the JAX backend, whose Keras does not import torch either)."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np\n"
        "import maskedrnn\n"
        "from maskedrnn.convert import gate_layout, pytorch\n"
        "w = pytorch.torch_gru_to_gru(np.ones((6, 3)), np.ones((6, 2)))\n"
        "assert [a.shape for a in w] == [(3, 6), (2, 6)]\n"
        "print('ok')\n"
    )
    assert run_python(["-c", code], "jax").strip() == "ok"


def test_docstring_examples_run():
    import doctest

    from maskedrnn import _gate_layout  # where the functions are defined

    results = doctest.testmod(_gate_layout, extraglobs={"np": np})
    assert results.failed == 0 and results.attempted > 0
