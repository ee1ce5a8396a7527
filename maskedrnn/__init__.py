"""maskedrnn: Keras 3 bidirectional RNNs for padded variable-length sequences."""

__version__ = "0.1.0"

from maskedrnn import ops
from maskedrnn.layers import MaskedBidirectional

__all__ = ["MaskedBidirectional", "ops"]
