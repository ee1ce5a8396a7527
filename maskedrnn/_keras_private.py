"""Every private Keras API (`keras.src.*`) maskedrnn uses, in one place.

Keras 3 has no public name for these, so a Keras upgrade that moves one
breaks here only; no other module imports `keras.src` (tested).
"""

# What Keras' RNN layers call (`lstm`, `gru`, ...): the bench's spies patch it.
from keras.src import backend as keras_src_backend  # noqa: F401

# The mask a tensor carries; this module is their home in Keras 3.10-3.16.
# isort: off
from keras.src.backend.common.masking import get_keras_mask  # noqa: F401
from keras.src.backend.common.masking import set_keras_mask  # noqa: F401
# isort: on

# Where Keras' GRU, LSTM and RNN layers see `backend.gru`, ...: tests patch it.
from keras.src.layers.rnn import gru as keras_gru_module  # noqa: F401
from keras.src.layers.rnn import lstm as keras_lstm_module  # noqa: F401
from keras.src.layers.rnn import rnn as keras_rnn_module  # noqa: F401

# The ConvLSTM1D/2D/3D base class, refused by the wrappers (no public base).
from keras.src.layers.rnn.conv_lstm import ConvLSTM  # noqa: F401

# `Loss.__call__`'s reduction, so that `MaskedLoss` values match Keras'.
from keras.src.losses.loss import reduce_weighted_values  # noqa: F401

# How Keras turns a loss function into a `Loss` (as `model.compile` does).
from keras.src.losses.losses import LossFunctionWrapper  # noqa: F401

# Models made with `keras.Model(inputs, outputs)`, which convert_model rebuilds.
from keras.src.models.functional import Functional  # noqa: F401


def keras_backend_rnn(backend):
    """`keras.src.backend.<backend>.rnn`, whose GPU test Keras' cuDNN uses.

    `has_fused_rnn_kernel` asks the same `_is_gpu_available()`, so both agree;
    the bench spies on its `_cudnn_*` and `_fallback_*` functions. Imported by
    name: `keras.src.backend.torch` re-exports a function called `rnn`.
    """
    import importlib

    return importlib.import_module(f"keras.src.backend.{backend}.rnn")



def keras_torch_device():
    """The device Keras' torch backend puts new tensors on (imports torch)."""
    if not _GET_DEVICE:
        # Looked up once: a failed import searches the path again each time.
        try:  # Keras 3.16 moved it from `core` to `ops.core`.
            from keras.src.backend.torch.ops.core import get_device
        except ImportError:
            from keras.src.backend.torch.core import get_device
        _GET_DEVICE.append(get_device)
    return _GET_DEVICE[0]()


_GET_DEVICE = []
