from maskedrnn.layers.masked_bidirectional import MaskedBidirectional
from maskedrnn.layers.masked_rnn import MaskedRNN

__all__ = ["MaskedBidirectional", "MaskedRNN"]
