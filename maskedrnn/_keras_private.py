"""Every private `keras.src` import of maskedrnn's layer code, with its reason.

Keras 3 has no public API for these. Importing them here, one per line,
means a Keras upgrade that moves one breaks in this one place.
"""

# The Keras mask attached to a tensor (public Keras only reads it inside call).
from keras.src.backend import get_keras_mask  # noqa: F401

# The ConvLSTM1D/2D/3D base class, refused by the wrappers (no public base).
from keras.src.layers.rnn.conv_lstm import ConvLSTM  # noqa: F401

# The reduction keras.losses.Loss.__call__ applies (sample weights, every
# `reduction`, tf.distribute scaling), reused so losses match Keras exactly.
from keras.src.losses.loss import reduce_weighted_values  # noqa: F401

# The class of models made with `keras.Model(inputs, outputs)` (Keras has no
# public name for it): convert_model and load_weights rebuild those.
from keras.src.models.functional import Functional  # noqa: F401
