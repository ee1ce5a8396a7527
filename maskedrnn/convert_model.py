"""Former home of `convert_model` and `bidirectional_to_masked`.

The code lives in `maskedrnn.convert.model`; this module keeps
`from maskedrnn.convert_model import convert_model` working. Prefer
`maskedrnn.convert_model(model)` and `maskedrnn.bidirectional_to_masked(layer)`.
"""

from maskedrnn.convert.model import bidirectional_to_masked, convert_model

__all__ = ["bidirectional_to_masked", "convert_model"]
