"""Gate layouts shared by every converter: gate counts, block splits, reorders.

Defined in `maskedrnn._gate_layout` (below both the converters and the
torch backend, which feeds Keras GRU weights to PyTorch's kernel) and
importable from here as before; see that module for the gate orders.
"""

from maskedrnn._gate_layout import (
    GRU_GATES,
    GRU_SWAP_ZR,
    LSTM_GATES,
    SIMPLE_RNN_GATES,
    TF1_LSTM_SWAP_CF,
    halve_bias,
    map_gate_blocks,
    reorder_blocks,
    reorder_gates,
    split_gates,
    swap_gru_zr,
)

__all__ = [
    "GRU_GATES",
    "GRU_SWAP_ZR",
    "LSTM_GATES",
    "SIMPLE_RNN_GATES",
    "TF1_LSTM_SWAP_CF",
    "halve_bias",
    "map_gate_blocks",
    "reorder_blocks",
    "reorder_gates",
    "split_gates",
    "swap_gru_zr",
]
