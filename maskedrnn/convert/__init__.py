"""Convert recurrent-layer weights between other layouts and Keras 3.

The converters are pure numpy: they take arrays (anything `np.asarray`
accepts, e.g. `layer.get_weights()`, `h5py` datasets, CPU `torch` tensors from
a `state_dict()`) or lists of them, and return `np.ndarray`s or lists of
them, keeping the input dtype. Function names say the direction:
`<source>_to_<target>`.

Keras 3 layouts (the target/source of every function here), with `D` the
input feature size and `U` the number of units:

- `keras.layers.LSTM`: `[kernel (D, 4U), recurrent_kernel (U, 4U),
  bias (4U,)]`, gate column blocks in order i (input), f (forget),
  c (cell candidate), o (output).
- `keras.layers.GRU(reset_after=True)`: `[kernel (D, 3U),
  recurrent_kernel (U, 3U), bias (2, 3U)]`, gate column blocks in order
  z (update), r (reset), h (candidate); `bias[0]` is the input bias and
  `bias[1]` the recurrent bias (the one multiplied by the reset gate for h).
  `GRU(reset_after=False)` computes a different function and cannot hold
  cuDNN/PyTorch GRU weights.
- `keras.layers.SimpleRNN`: `[kernel (D, U), recurrent_kernel (U, U),
  bias (U,)]`, one block (PyTorch's `nn.RNN` only; cuDNN's RNN_TANH/RELU
  modes have no legacy Keras layer).
- `keras.layers.Bidirectional` (and `maskedrnn.MaskedBidirectional`): the
  forward layer's weights followed by the backward layer's weights.

One module per source format, all re-exported here (`maskedrnn.convert.X`):

- `maskedrnn.convert.legacy_cudnn`: legacy `tf.compat.v1.keras.layers.
  CuDNNLSTM`/`CuDNNGRU` weights and their tf-keras `.h5` files;
- `maskedrnn.convert.cudnn_canonical`: TF1 `CudnnLSTM`/`CudnnGRU` canonical
  parameters;
- `maskedrnn.convert.cudnn_compatible`: TF1 `CudnnCompatibleLSTMCell`/
  `CudnnCompatibleGRUCell` checkpoint variables;
- `maskedrnn.convert.pytorch`: PyTorch `nn.LSTM`/`nn.GRU`/`nn.RNN` weights
  and state dicts;
- `maskedrnn.convert.gate_layout`: the gate orders and block permutations
  they share.

Whole Keras models: `maskedrnn.convert.model` (`convert_model`,
`bidirectional_to_masked`) and `maskedrnn.convert.checkpoint`
(`load_weights`), also available as `maskedrnn.convert_model`,
`maskedrnn.bidirectional_to_masked` and `maskedrnn.load_weights`. See
`docs/convert.md` for the full layout tables.
"""

from maskedrnn.convert.cudnn_canonical import (
    cudnn_canonical_gru_to_gru,
    cudnn_canonical_lstm_to_lstm,
    cudnn_canonical_to_keras,
    gru_to_cudnn_canonical_gru,
    keras_to_cudnn_canonical,
    lstm_to_cudnn_canonical_lstm,
)
from maskedrnn.convert.cudnn_compatible import (
    CUDNN_COMPATIBLE_GRU_CELL_VARIABLES,
    CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES,
    cudnn_compatible_gru_cell_to_gru,
    cudnn_compatible_lstm_cell_to_lstm,
    gru_to_cudnn_compatible_gru_cell,
    lstm_to_cudnn_compatible_lstm_cell,
)
from maskedrnn.convert.legacy_cudnn import (
    bidirectional_to_cudnn_bidirectional,
    cudnn_bidirectional_to_bidirectional,
    cudnn_gru_to_gru,
    cudnn_lstm_to_lstm,
    gru_to_cudnn_gru,
    load_legacy_cudnn_h5,
    lstm_to_cudnn_lstm,
)
from maskedrnn.convert.pytorch import (
    gru_to_torch_gru,
    keras_to_torch_state_dict,
    lstm_to_torch_lstm,
    simple_rnn_to_torch_rnn,
    torch_gru_to_gru,
    torch_lstm_to_lstm,
    torch_rnn_to_simple_rnn,
    torch_state_dict_to_keras,
)

__all__ = [
    "CUDNN_COMPATIBLE_GRU_CELL_VARIABLES",
    "CUDNN_COMPATIBLE_LSTM_CELL_VARIABLES",
    "bidirectional_to_cudnn_bidirectional",
    "cudnn_bidirectional_to_bidirectional",
    "cudnn_canonical_gru_to_gru",
    "cudnn_canonical_lstm_to_lstm",
    "cudnn_canonical_to_keras",
    "cudnn_compatible_gru_cell_to_gru",
    "cudnn_compatible_lstm_cell_to_lstm",
    "cudnn_gru_to_gru",
    "cudnn_lstm_to_lstm",
    "gru_to_cudnn_canonical_gru",
    "gru_to_cudnn_compatible_gru_cell",
    "gru_to_cudnn_gru",
    "gru_to_torch_gru",
    "keras_to_cudnn_canonical",
    "keras_to_torch_state_dict",
    "load_legacy_cudnn_h5",
    "lstm_to_cudnn_canonical_lstm",
    "lstm_to_cudnn_compatible_lstm_cell",
    "lstm_to_cudnn_lstm",
    "lstm_to_torch_lstm",
    "simple_rnn_to_torch_rnn",
    "torch_gru_to_gru",
    "torch_lstm_to_lstm",
    "torch_rnn_to_simple_rnn",
    "torch_state_dict_to_keras",
]
