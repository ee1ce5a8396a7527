"""maskedrnn: Keras 3 bidirectional RNNs for padded variable-length sequences."""

__version__ = "0.1.0"

from maskedrnn import ops  # noqa: E402,F401
