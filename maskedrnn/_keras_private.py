"""Every private Keras API (`keras.src.*`) maskedrnn uses, in one place.

Keras 3 has no public accessor for these; when a Keras upgrade moves one of
them, the import error points here and nowhere else. One import per line,
alphabetical by module, each with the reason maskedrnn needs it. No other
module of maskedrnn imports `keras.src` (`tests/test_keras_private.py` checks
this).
"""

# The backend namespace Keras' RNN layers call (`lstm`, `gru`, `rnn`,
# `bidirectional_lstm/gru`): the bench's kernel spies patch its functions.
from keras.src import backend as keras_src_backend  # noqa: F401

# Read and attach the mask a layer carries on a tensor (Keras 3 has no public
# accessor). Their home in every supported Keras, 3.10 through 3.16; up to
# 3.15 `keras.src.backend` re-exported them too, 3.16 does not.
# isort: off
from keras.src.backend.common.masking import get_keras_mask  # noqa: F401
from keras.src.backend.common.masking import set_keras_mask  # noqa: F401
# isort: on

# The modules of Keras' GRU, LSTM and RNN layers: the tests replace the backend
# functions those layers call (`backend.gru`, ...) where these modules see them.
from keras.src.layers.rnn import gru as keras_gru_module  # noqa: F401
from keras.src.layers.rnn import lstm as keras_lstm_module  # noqa: F401
from keras.src.layers.rnn import rnn as keras_rnn_module  # noqa: F401

# The ConvLSTM1D/2D/3D base class, refused by the wrappers (no public base).
from keras.src.layers.rnn.conv_lstm import ConvLSTM  # noqa: F401

# The reduction `keras.losses.Loss.__call__` applies (sample weights, mask
# weights, every `reduction`, `tf.distribute` scaling), reused so that
# `MaskedLoss` values match Keras exactly.
from keras.src.losses.loss import reduce_weighted_values  # noqa: F401

# How Keras turns a loss function into a `Loss` (as `model.compile` does).
from keras.src.losses.losses import LossFunctionWrapper  # noqa: F401

# The class of models made with `keras.Model(inputs, outputs)` (Keras has no
# public name for it): convert_model and load_weights rebuild those.
from keras.src.models.functional import Functional  # noqa: F401


def keras_backend_rnn(backend):
    """`keras.src.backend.<backend>.rnn` for "tensorflow", "jax" or "torch".

    Its `_is_gpu_available()` is the test Keras' own `lstm`/`gru` make before
    trying cuDNN; `maskedrnn.backends.<backend>.has_fused_rnn_kernel` asks
    the same one, so that both agree (and a test that fakes a GPU fakes it for
    both). The
    bench spies on the torch module's `_cudnn_lstm/gru` (Keras' cuDNN call)
    and `_fallback_lstm/gru` (its Python loop), which Keras' torch backend
    chooses between without saying which ran. Imported by name: the package
    `keras.src.backend.torch` re-exports a function called `rnn`.
    """
    import importlib

    return importlib.import_module(f"keras.src.backend.{backend}.rnn")



def keras_torch_device():
    """The device Keras' torch backend puts new tensors on
    (`keras.src.backend.torch.core.get_device()`, no public accessor):
    `maskedrnn.backends.torch.scalar` fills its scalars there. Imported when
    called: that module imports torch."""
    try:
        # Keras 3.16 moved the torch backend's core into `ops`.
        from keras.src.backend.torch.ops.core import get_device
    except ImportError:
        # Its home up to Keras 3.15.
        from keras.src.backend.torch.core import get_device

    return get_device()
