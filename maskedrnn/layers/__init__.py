from maskedrnn.layers.masked_bidirectional import MaskedBidirectional

__all__ = ["MaskedBidirectional"]
