"""maskedrnn: Keras 3 bidirectional RNNs for padded variable-length sequences.

The public surface is `__all__` below (docs/api.md documents each name;
tests/test_api.py checks both agree). The version is `__version__`, read
by setup.cfg; CHANGELOG.md says what changed.
"""

__version__ = "0.2.0"

import sys as _sys

# `python -m maskedrnn` (the demo) runs this file before its `__main__`, with
# `sys.argv[0] == "-m"` meanwhile: only then is `_quiet_demo` loaded, as it
# must quiet TensorFlow before Keras loads it; `import maskedrnn` skips it.
if _sys.argv[:1] == ["-m"]:
    from maskedrnn import _quiet_demo  # noqa: F401

from maskedrnn import (
    backends,
    bucketing,
    convert,
    datasets,
    export,
    ops,
)
from maskedrnn.convert.checkpoint import load_weights
from maskedrnn.convert.model import bidirectional_to_masked, convert_model
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
