"""Convert recurrent-layer weights between other layouts and Keras 3.

The converters are pure numpy: they take arrays (or lists of them) and
return `np.ndarray`s keeping the input dtype; names say the direction,
`<source>_to_<target>`. One module per source: `legacy_cudnn` (tf-keras
`CuDNNLSTM`/`CuDNNGRU` and `.h5` files), `cudnn_canonical` (TF1
`CudnnLSTM`/`CudnnGRU`), `cudnn_compatible` (TF1 cell checkpoints) and
`pytorch` (`nn.LSTM`/`nn.GRU`/`nn.RNN`); `model` and `checkpoint` convert
whole Keras models. See `docs/convert.md` for the layout tables.
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
