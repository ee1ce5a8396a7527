"""maskedrnn: Keras 3 bidirectional RNNs for padded variable-length sequences."""

__version__ = "0.1.0"

from maskedrnn import backends, bucketing, convert, datasets, export, ops
from maskedrnn.convert.checkpoint import load_weights
from maskedrnn.convert_model import bidirectional_to_masked, convert_model
from maskedrnn.ctc import MaskedCTC, ctc_decode, ctc_ids_to_text, masked_ctc
from maskedrnn.layers import MaskedBidirectional, MaskedRNN
from maskedrnn.losses import MaskedLoss, masked_loss
from maskedrnn.metrics import (
    MaskedAccuracy,
    MaskedMeanAbsoluteError,
    MaskedMeanSquaredError,
)

__all__ = [
    "MaskedAccuracy",
    "MaskedBidirectional",
    "MaskedCTC",
    "MaskedLoss",
    "MaskedMeanAbsoluteError",
    "MaskedMeanSquaredError",
    "MaskedRNN",
    "backends",
    "bidirectional_to_masked",
    "bucketing",
    "convert",
    "convert_model",
    "ctc_decode",
    "ctc_ids_to_text",
    "datasets",
    "export",
    "load_weights",
    "masked_ctc",
    "masked_loss",
    "ops",
]
