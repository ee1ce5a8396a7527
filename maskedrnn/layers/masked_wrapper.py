"""`MaskedWrapper`: the Keras layer logic `MaskedRNN` and `MaskedBidirectional`
share (the plan of a call, `kernel_info()`, shape-time checks, empty
batches, what `call` returns)."""

import keras
from keras import ops

from maskedrnn import _checks, backends


def _weights_device(inner):
    """A weight of `inner` (its device decides on torch), or None before it
    is built (the default device)."""
    weights = inner.weights if inner.built else []
    return weights[0] if weights else None


class MaskedWrapper(keras.layers.Layer):
    """Base class of the masked RNN wrappers; subclasses supply
    `compute_output_shape`, `_inners()` (`{key: inner RNN}` in direction
    order) and `call`."""

    def _load_backend(self):
        """Imports this package's code for the Keras backend in use (once
        per process), when the layer is built rather than in its first
        call, so that the first call's trace holds only the layer's own
        work, as Keras' layers' does (Keras imports its backend's RNN code
        with Keras)."""
        backends.current()

    def _plan(self, where, masked=True, training=None):
        """The `maskedrnn.backends.Plan` of a call with inputs on the device
        of `where` (None: the default device)."""
        return backends.plan(
            self._inners(), where, self.return_state, masked=masked, training=training
        )

    def _kernel_info(self, inputs):
        if not self.built:
            raise ValueError(
                "kernel_info() needs a built layer: call it on data first or "
                "call layer.build(input_shape)."
            )
        where = inputs
        if where is None:
            where = _weights_device(next(iter(self._inners().values())))
        return self._plan(where).info()

    @property
    def uses_fast_path(self):
        """Whether no inner RNN is handed a mask here (read from the plan for
        the layer's weights, as `kernel_info()`)."""
        where = _weights_device(next(iter(self._inners().values())))
        return self._plan(where).unmasked

    def compute_output_spec(
        self, inputs, initial_state=None, mask=None, training=None, lengths=None
    ):
        # Functional models are built from shapes alone: run the checks that
        # need no values now, so a bad `lengths`/`mask` fails at model build.
        if lengths is not None:
            _checks.check_lengths_static(lengths, inputs)
        elif mask is not None:
            _checks.check_mask(mask, inputs)
        return super().compute_output_spec(
            inputs,
            initial_state=initial_state,
            mask=mask,
            training=training,
            lengths=lengths,
        )

    def _empty_batch_outputs(self, x):
        """Outputs of the right shapes for a batch of 0 rows (no RNN call)."""
        shapes = self.compute_output_shape(tuple(x.shape))
        if isinstance(shapes[0], int) or shapes[0] is None:
            shapes = [shapes]
        outputs = [
            ops.zeros(tuple(0 if d is None else d for d in shape), self.compute_dtype)
            for shape in shapes
        ]
        return self._returned(outputs)

    def _returned(self, outputs, bad_rows=None):
        """What `call` returns from its list of outputs: rows flagged by
        `_checks.check_lengths` poisoned (`_checks.poison_rows`), then the one
        tensor alone or the tuple."""
        if bad_rows is not None:
            outputs = _checks.poison_rows(outputs, bad_rows)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
