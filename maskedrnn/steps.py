"""The steps of one masked batch: its lengths or mask, checked once per call.

Every kernel of running a direction reads the same `Steps`; each of its
tensors is derived on first use, so a plan that needs only the mask never
computes an order.
"""

import functools

from keras import ops

from maskedrnn import _checks
from maskedrnn import ops as mops


class Steps:
    """Everything a call derives from its lengths or mask.

    Make one with `from_call` (checked arguments) or the constructors
    `from_lengths`, `from_mask`, `full`.

    Attributes:
        time: The size of the time axis (int, or a scalar tensor).
        masked: Bool: the call has a mask or lengths.
        right_padded: Bool: made from lengths (valid-first data).
        bad_rows: None, or bool `(batch,)` flagging unchecked bad lengths.
        mask: Bool `(batch, time)` in the caller's order, or None.
        lengths: Int32 `(batch,)`, valid steps per row, in `[0, time]`.
        order: Int32 `(batch, time)` gather to valid-first, or None when the
            data is valid-first already.
        inverse: The inverse permutation of `order` (None with it).
        rank: Int32 `(batch, time)` or None, as `ops.valid_ranks`.
        valid: Bool `(batch, time)`: the valid steps of valid-first data.
        known_lengths: `lengths`, or None where only ranking the mask
            would give them.
        has_steps: Bool `(batch, 1)`: `lengths > 0`.
        last: Int32 `(batch,)`: each row's last valid step, valid-first.
        reverse: Int32 `(batch, time)`: `ops.reverse_index(lengths, time)`.
    """

    def __init__(self, time, lengths=None, mask=None, batch=None, bad_rows=None):
        self.time = time
        self.bad_rows = bad_rows
        self._lengths = lengths
        self._mask = mask
        self._batch = batch
        self._ranked = mask is not None and lengths is None
        # Lengths known without ranking the mask (`flipped`).
        self._mask_lengths = None

    @classmethod
    def from_call(cls, x, mask=None, lengths=None):
        """The checked `Steps` of a call: `lengths` wins over `mask`.

        Args:
            x: The call's inputs, already checked.
            mask: Optional `(batch, time)` mask, any pattern.
            lengths: Optional integer `(batch,)`: right-padded data.
        """
        time = ops.shape(x)[1]
        if lengths is not None:
            lengths, bad_rows = _checks.check_lengths(lengths, x)
            return cls(time, lengths=lengths, bad_rows=bad_rows)
        if mask is not None:
            return cls.from_mask(_checks.check_mask(mask, x))
        return cls.full(ops.shape(x)[0], time)

    @classmethod
    def from_lengths(cls, lengths, time):
        """Right-padded data, `lengths` checked and clipped to `[0, time]`."""
        return cls(time, lengths=lengths)

    @classmethod
    def from_mask(cls, mask):
        """Any boolean `(batch, time)` mask (left padding, holes, ...)."""
        return cls(ops.shape(mask)[1], mask=mask)

    @classmethod
    def full(cls, batch, time):
        """No mask and no lengths: every step of every row is valid."""
        return cls(time, batch=batch)

    @property
    def masked(self):
        return self._mask is not None or self._lengths is not None

    @property
    def right_padded(self):
        return self._lengths is not None

    @functools.cached_property
    def mask(self):
        if self._mask is not None:
            return self._mask
        if self._lengths is None:
            return None
        return mops.sequence_mask(self._lengths, self.time)

    @functools.cached_property
    def _valid_ranks(self):
        rank, inverse, lengths = mops.valid_ranks(self._mask)
        order = _backend_invert(inverse)
        return rank, inverse, lengths, order

    @functools.cached_property
    def lengths(self):
        if self._lengths is not None:
            return self._lengths
        if self._mask_lengths is not None:
            return self._mask_lengths
        if self._ranked:
            return self._valid_ranks[2]
        time = _backend().scalar(self.time, "int32")
        return ops.zeros((self._batch,), dtype="int32") + time

    @property
    def known_lengths(self):
        """`lengths` when known without ranking the mask, else None."""
        if self._lengths is not None:
            return self._lengths
        if self._mask_lengths is not None:
            return self._mask_lengths
        return self.__dict__.get("lengths")  # the cached property, if run

    @property
    def order(self):
        return self._valid_ranks[3] if self._ranked else None

    @property
    def inverse(self):
        return self._valid_ranks[1] if self._ranked else None

    @property
    def rank(self):
        return self._valid_ranks[0] if self._ranked else None

    @functools.cached_property
    def valid(self):
        return mops.sequence_mask(self.lengths, self.time)

    @functools.cached_property
    def has_steps(self):
        return ops.expand_dims(self.lengths > 0, -1)

    @functools.cached_property
    def last(self):
        return ops.maximum(self.lengths - 1, _backend().scalar(0, "int32"))

    @functools.cached_property
    def reverse(self):
        return mops.reverse_index(self.lengths, self.time)

    def shared(self, key, make):
        """`make()`, made once per `Steps` under `key`: a value a kernel
        derives from the batch's steps (a row order, say), shared by every
        direction of the call, which all read the same rows."""
        made = self.__dict__.setdefault("_shared", {})
        if key not in made:
            made[key] = make()
        return made[key]

    def valid_first(self, x):
        """`x` in valid-first order (no copy when it already is)."""
        return x if self.order is None else mops.gather_time(x, self.order)

    def flipped(self):
        """The `Steps` of the time-reversed batch (Keras' `go_backwards`)."""
        if not self.masked:
            return self
        flipped = Steps.from_mask(ops.flip(self.mask, 1))
        flipped._mask_lengths = self.known_lengths  # flipping keeps them
        if self.right_padded:
            # Flipped right-padded rows are left-padded: their valid-first
            # order is a rotation, known without ranking the mask.
            flipped.__dict__["_valid_ranks"] = _left_padded_ranks(
                self._lengths, self.time
            )
        return flipped


def _left_padded_ranks(lengths, time):
    """`(rank, inverse, lengths, order)` of left-padded rows with `lengths`
    valid steps, as `ops.valid_ranks` and `invert_permutation` give them."""
    backend = _backend()
    t = ops.expand_dims(ops.arange(time, dtype="int32"), 0)
    n = ops.expand_dims(lengths, 1)
    start = backend.scalar(time, "int32") - n
    valid = t >= start
    order = ops.where(t < n, t + start, t - n)
    inverse = ops.where(valid, t - start, t + n)
    rank = ops.where(valid, t - start, backend.scalar(-1, "int32"))
    return rank, inverse, lengths, order


def _backend():
    from maskedrnn import backends

    return backends.current()


def _backend_invert(inverse):
    return _backend().invert_permutation(inverse)
