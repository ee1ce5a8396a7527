"""maskedrnn: Keras 3 bidirectional RNNs for padded variable-length sequences."""

__version__ = "0.1.0"

from maskedrnn import bucketing, convert, datasets, export, ops
from maskedrnn.convert_model import bidirectional_to_masked, convert_model
from maskedrnn.layers import MaskedBidirectional
from maskedrnn.losses import MaskedLoss, masked_loss
from maskedrnn.metrics import (
    MaskedAccuracy,
    MaskedMeanAbsoluteError,
    MaskedMeanSquaredError,
)

__all__ = [
    "MaskedAccuracy",
    "MaskedBidirectional",
    "MaskedLoss",
    "MaskedMeanAbsoluteError",
    "MaskedMeanSquaredError",
    "bidirectional_to_masked",
    "bucketing",
    "convert",
    "convert_model",
    "datasets",
    "export",
    "masked_loss",
    "ops",
]
