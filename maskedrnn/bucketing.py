"""Length bucketing: batches of similar length, each padded only to its bucket.

Masking makes padded steps harmless, not free; bucketing skips most of
them with few distinct padded lengths. See `docs/scaling.md`.
"""


import keras
import numpy as np

from maskedrnn._checks import check_int
from maskedrnn.datasets import pad_batch

__all__ = ["BucketBatchSampler", "BucketedDataset", "quantile_boundaries"]


def quantile_boundaries(lengths, num_buckets):
    """Bucket boundaries at the quantiles of a length distribution.

    Boundary `i` is the `(i + 1) / num_buckets` quantile of `lengths`, rounded
    up to a length that occurs; repeated values are merged, so fewer than
    `num_buckets` may come back. The last is `max(lengths)`.

    Args:
        lengths: 1-D array-like of non-negative ints.
        num_buckets: Int >= 1, the largest number of boundaries.

    Returns:
        A sorted list of distinct Python ints.

    Example:

    >>> quantile_boundaries([3, 5, 8, 9, 20, 21, 22, 40], 4)
    [8, 20, 22, 40]
    """
    num_buckets = check_int("num_buckets", num_buckets, 1)
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.size == 0:
        raise ValueError(
            "lengths must be a non-empty 1-D array of sequence lengths; got "
            f"lengths of shape {lengths.shape}."
        )
    q = np.arange(1, num_buckets + 1) / num_buckets
    values = np.quantile(lengths, q, method="higher")
    return sorted({int(v) for v in values})


class BucketBatchSampler:
    """Groups sequence indices into batches of similar length.

    Each sequence goes into the first bucket whose boundary is at least its
    length; buckets are cut into batches of `batch_size`. Shuffling is seeded
    by `(seed, epoch)`, the same on every backend and process. The first two
    batches of an epoch differ in padded length and size where possible, since
    Keras infers a `PyDataset`'s spec from them. Iterating yields one epoch and
    advances it, as a PyTorch `DataLoader(batch_sampler=...)` expects.

    Args:
        lengths: 1-D array-like, the non-negative length of every sequence.
        batch_size: Int >= 1, rows per batch.
        boundaries: Sorted list of padded lengths, the last >= `max(lengths)`.
            Defaults to `None` (`quantile_boundaries(lengths, num_buckets)`).
        num_buckets: Int >= 1, used without `boundaries`. Defaults to `4`.
        shuffle: Bool, shuffle within and across buckets. Defaults to `True`.
        seed: Int, the shuffling seed. Defaults to `None` (drawn once).
        drop_remainder: Bool, drop each bucket's last incomplete batch (the
            last bucket's only, with `carry_remainder`). Defaults to `False`.
        carry_remainder: Bool, move each bucket's last incomplete batch on to
            the next bucket, so all batches but the last are full. Defaults to
            `False`.

    Example:

    >>> sampler = BucketBatchSampler([3, 9, 4, 8, 2], batch_size=2,
    ...                              boundaries=[4, 9], shuffle=False)
    >>> sampler.batches()
    [[4], [1, 3], [0, 2]]
    """

    def __init__(
        self,
        lengths,
        batch_size,
        boundaries=None,
        num_buckets=4,
        shuffle=True,
        seed=None,
        drop_remainder=False,
        carry_remainder=False,
    ):
        lengths = np.asarray(lengths)
        if lengths.ndim != 1 or lengths.size == 0:
            raise ValueError(
                "lengths must be a non-empty 1-D array with one length per "
                f"sequence; got lengths of shape {lengths.shape}."
            )
        if not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0:
            raise ValueError(
                "lengths must hold non-negative ints; got dtype "
                f"{lengths.dtype} and minimum {lengths.min()}."
            )
        self.lengths = lengths.astype(np.int64)
        self.batch_size = check_int("batch_size", batch_size, 1)
        if boundaries is None:
            boundaries = quantile_boundaries(self.lengths, num_buckets)
        else:
            boundaries = [
                check_int(f"boundaries[{i}]", b, 0) for i, b in enumerate(boundaries)
            ]
            if not boundaries or boundaries != sorted(set(boundaries)):
                raise ValueError(
                    "boundaries must be a non-empty, strictly increasing list of "
                    f"padded lengths; got boundaries={boundaries}."
                )
        longest = int(self.lengths.max())
        if boundaries[-1] < longest:
            raise ValueError(
                f"The longest sequence has length {longest}, more than the last "
                f"boundary; add a boundary >= {longest}. Got "
                f"boundaries={boundaries}."
            )
        self.boundaries = boundaries
        self.shuffle = bool(shuffle)
        if seed is None:
            seed = int(np.random.default_rng().integers(2**31))
        self.seed = check_int("seed", seed, 0)
        self.drop_remainder = bool(drop_remainder)
        self.carry_remainder = bool(carry_remainder)
        self.epoch = 0
        bucket = np.searchsorted(np.asarray(boundaries), self.lengths, side="left")
        self.bucket_ids = bucket
        self._members = [np.flatnonzero(bucket == b) for b in range(len(boundaries))]
        if self.carry_remainder:
            self._num_batches = self._bucket_batches(len(self.lengths))
        else:
            self._num_batches = sum(self._bucket_batches(len(m)) for m in self._members)
        if self._num_batches == 0:
            raise ValueError(
                "drop_remainder=True leaves no batch: every bucket has fewer than "
                f"batch_size={self.batch_size} sequences; got bucket sizes "
                f"{[len(m) for m in self._members]}. Use a smaller batch_size or "
                "fewer buckets."
            )

    def _bucket_batches(self, size):
        if self.drop_remainder:
            return size // self.batch_size
        return -(-size // self.batch_size)

    def __len__(self):
        return self._num_batches

    def padded_length(self, length):
        """The smallest boundary >= `length`."""
        if length > self.boundaries[-1]:
            raise ValueError(
                f"length {length} is longer than the last boundary "
                f"{self.boundaries[-1]}; got length={length}."
            )
        return self.boundaries[int(np.searchsorted(self.boundaries, length))]

    def boundary_of(self, batch):
        """The padded length of a batch: the boundary of its longest row."""
        return self.padded_length(
            int(self.lengths[np.asarray(batch, dtype=np.int64)].max())
        )

    def batches(self, epoch=None, shuffle=None, drop_remainder=None):
        """The batches of one epoch, as lists of indices into `lengths`.

        Args:
            epoch: Int, seeds the shuffling. Defaults to the current `epoch`.
            shuffle: Bool. Defaults to the sampler's.
            drop_remainder: Bool. Defaults to the sampler's.
        """
        epoch = self.epoch if epoch is None else epoch
        shuffle = self.shuffle if shuffle is None else shuffle
        drop = self.drop_remainder if drop_remainder is None else drop_remainder
        rng = np.random.default_rng([self.seed, epoch])
        out = []
        carried = np.zeros(0, dtype=np.int64)
        last = len(self._members) - 1
        for k, members in enumerate(self._members):
            if shuffle:
                members = rng.permutation(members)
            if self.carry_remainder:
                members = np.concatenate([carried, members]).astype(np.int64)
                if k < last:
                    cut = len(members) - len(members) % self.batch_size
                    members, carried = members[:cut], members[cut:]
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                if drop and len(chunk) < self.batch_size:
                    continue
                out.append([int(i) for i in chunk])
        if shuffle:
            out = [out[i] for i in rng.permutation(len(out))]
        self._distinct_first_two(out)
        return out

    def _distinct_first_two(self, out):
        """Moves a batch that differs from the first one up to second place."""
        keys = [(self.boundary_of(b), len(b)) for b in out]
        many_t = len({k[0] for k in keys}) > 1
        many_n = len({k[1] for k in keys}) > 1

        def differ(a, b):
            return (a[0] != b[0] or not many_t) and (a[1] != b[1] or not many_n)

        if len(out) < 2 or differ(keys[0], keys[1]):
            return
        for j in range(2, len(out)):
            if differ(keys[0], keys[j]):
                out.insert(1, out.pop(j))
                return
        for i in range(1, len(out)):
            for j in range(i + 1, len(out)):
                if differ(keys[i], keys[j]):
                    second = out.pop(j)
                    first = out.pop(i)
                    out[:0] = [first, second]
                    return

    def __iter__(self):
        batches = self.batches()
        self.epoch += 1
        return iter(batches)


def _as_sequences(name, values):
    if isinstance(values, np.ndarray) and values.dtype != object:
        raise TypeError(
            f"{name} must be a list of arrays of shape (time, *features), one per "
            "sequence, unpadded; got a NumPy array of shape "
            f"{values.shape}. Pass list(array) if its rows are whole sequences."
        )
    if not isinstance(values, (list, tuple, np.ndarray)) or len(values) == 0:
        raise TypeError(
            f"{name} must be a non-empty list of arrays, one per sequence; got "
            f"{type(values).__name__}."
        )
    arrays = [np.asarray(v) for v in values]
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise ValueError(
                f"{name}[{i}] is a scalar; every sequence needs a time axis "
                f"(shape (time, *features)); got {a!r}."
            )
    return arrays


class BucketedDataset(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` of length-bucketed, per-batch padded batches.

    Batches from `BucketBatchSampler`, each padded by `pad_batch` only to its
    bucket's boundary. A masked model's results do not depend on a batch's
    padded length, so bucketing changes the cost of training, not its result.

    Args:
        x: List of unpadded arrays `(time, *features)`, one per sequence.
        y: `None`, an array of per-sequence labels `(len(x), ...)`, or a list
            of per-step label arrays `(len(x[i]), ...)`. Defaults to `None`.
        batch_size: Int >= 1. Defaults to `32`.
        boundaries: Sorted list of padded lengths. Defaults to `None`
            (`num_buckets` quantiles).
        num_buckets: Int >= 1. Defaults to `4`.
        padding: `"post"` or `"pre"`. Defaults to `"post"`.
        value: Scalar written into padded input steps. Defaults to `0`.
        label_pad_value: Scalar written into padded per-step labels (the
            `pad_value` of `MaskedLoss`). Defaults to `-1`.
        return_lengths: Bool; inputs are `(padded, lengths)`. Defaults to
            `False`.
        shuffle: Bool. Defaults to `True`.
        seed: Int, the shuffling seed. Defaults to `None` (random).
        drop_remainder: Bool, as in `BucketBatchSampler`. Defaults to `False`.
        carry_remainder: Bool, as in `BucketBatchSampler`. Defaults to `False`.
        dtype: NumPy dtype of the padded inputs. Defaults to that of `x[0]`.
        **kwargs: `keras.utils.PyDataset` arguments (`workers`, ...).

    Call arguments:
        `ds[i]` is batch `i`, `(inputs, labels)` or `(inputs,)`: inputs
        `(batch, boundary, *features)`, labels `(batch, ...)` or
        `(batch, boundary, ...)`.

    Example:

    >>> x = [np.ones((n, 3), "float32") for n in (4, 9, 5, 8)]
    >>> ds = BucketedDataset(x, np.arange(4), batch_size=2, boundaries=[5, 9],
    ...                      shuffle=False)
    >>> [batch[0].shape for batch in ds]
    [(2, 5, 3), (2, 9, 3)]
    """

    def __init__(
        self,
        x,
        y=None,
        batch_size=32,
        boundaries=None,
        num_buckets=4,
        padding="post",
        value=0,
        label_pad_value=-1,
        return_lengths=False,
        shuffle=True,
        seed=None,
        drop_remainder=False,
        carry_remainder=False,
        dtype=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if padding not in ("pre", "post"):
            raise ValueError(f"padding must be 'pre' or 'post'; got {padding!r}.")
        self.x = _as_sequences("x", x)
        self.lengths = np.asarray([len(a) for a in self.x], dtype=np.int32)
        self.y, self.per_step_labels = self._labels(y)
        self.padding = padding
        self.value = value
        self.label_pad_value = label_pad_value
        self.return_lengths = bool(return_lengths)
        self.dtype = np.dtype(self.x[0].dtype if dtype is None else dtype)
        self.sampler = BucketBatchSampler(
            self.lengths,
            batch_size,
            boundaries=boundaries,
            num_buckets=num_buckets,
            shuffle=shuffle,
            seed=seed,
            drop_remainder=drop_remainder,
            carry_remainder=carry_remainder,
        )
        self._batches = self.sampler.batches()

    def _labels(self, y):
        if y is None:
            return None, False
        if isinstance(y, np.ndarray) and y.dtype != object:
            if len(y) != len(self.x):
                raise ValueError(
                    f"y has {len(y)} rows but x has {len(self.x)} sequences; got "
                    f"y of shape {y.shape}."
                )
            return y, False
        labels = _as_sequences("y", y)
        if len(labels) != len(self.x):
            raise ValueError(
                f"y has {len(labels)} label sequences but x has {len(self.x)} "
                "sequences; pass one per sequence."
            )
        for i, (a, n) in enumerate(zip(labels, self.lengths)):
            if len(a) != n:
                raise ValueError(
                    f"y[{i}] has {len(a)} steps but x[{i}] has {n}: per-step "
                    "labels need one label per step (pass per-sequence labels "
                    f"as a NumPy array); got y[{i}] of shape {a.shape}."
                )
        return labels, True

    @property
    def boundaries(self):
        """The padded lengths, one per bucket."""
        return self.sampler.boundaries

    @property
    def num_batches(self):
        return len(self._batches)

    def __len__(self):
        return len(self._batches)

    @property
    def batch_indices(self):
        """The current epoch's batches as indices into `x`, in `predict`'s row order."""
        return [list(b) for b in self._batches]

    def make_batch(self, indices):
        """Pads the sequences `indices` to their bucket's boundary, as `ds[i]`."""
        boundary = self.sampler.boundary_of(indices)
        padded, lengths = pad_batch(
            [self.x[i] for i in indices],
            maxlen=boundary,
            padding=self.padding,
            value=self.value,
            dtype=self.dtype,
        )
        inputs = (padded, lengths) if self.return_lengths else padded
        if self.y is None:
            return (inputs,)
        if self.per_step_labels:
            labels, _ = pad_batch(
                [self.y[i] for i in indices],
                maxlen=boundary,
                padding=self.padding,
                value=self.label_pad_value,
                dtype=self.y[indices[0]].dtype,
            )
        else:
            labels = self.y[np.asarray(indices)]
        return inputs, labels

    def __getitem__(self, index):
        if not 0 <= index < len(self._batches):
            raise IndexError(
                f"batch index {index} is out of range for {len(self._batches)} "
                f"batches; got index={index}."
            )
        return self.make_batch(self._batches[index])

    def on_epoch_end(self):
        if self.sampler.shuffle:
            self.sampler.epoch += 1
            self._batches = self.sampler.batches()

    def to_tf_dataset(self):
        """This dataset as a `tf.data.Dataset`, for `fit` on every backend.

        Its batch axis is static when every batch is full, which TensorFlow runs
        faster. Needs TensorFlow.
        """
        import tensorflow as tf

        batch_size = self.sampler.batch_size
        full = all(len(b) == batch_size for b in self._batches)
        free_time = len(self.boundaries) > 1
        first = self[0]

        def spec(a, time_axis):
            a = np.asarray(a)
            shape = [batch_size if full else None] + list(a.shape[1:])
            if time_axis and free_time:
                shape[1] = None
            return tf.TensorSpec(shape, tf.as_dtype(a.dtype))

        inputs = first[0]
        if self.return_lengths:
            in_spec = (spec(inputs[0], True), spec(inputs[1], False))
        else:
            in_spec = spec(inputs, True)
        signature = (in_spec,)
        if self.y is not None:
            signature += (spec(first[1], self.per_step_labels),)

        def generate():
            for i in range(len(self._batches)):
                yield self[i]
            self.on_epoch_end()

        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        # So that `fit` knows where an epoch ends.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(self)))
        return dataset.prefetch(tf.data.AUTOTUNE)

    def predict(self, model, per_step=None, pad_to_max=False):
        """Runs `model` on every sequence, bucket by bucket, in the order of `x`.

        Args:
            model: A Keras model taking this dataset's inputs.
            per_step: Bool, whether outputs have a time axis. Defaults to `None`
                (whether axis 1 is every batch's padded length).
            pad_to_max: Bool; per-step outputs as one array padded to the last
                boundary instead of a list of valid steps. Defaults to `False`.

        Returns:
            The model's output structure, rows in the order of `x`.
        """
        batches = self.sampler.batches(shuffle=False, drop_remainder=False)
        results = []
        for indices in batches:
            out = model.predict_on_batch(self.make_batch(indices)[0])
            results.append(
                (indices, self.sampler.boundary_of(indices), keras.tree.flatten(out))
            )
            structure = out
        n_out = len(results[0][2])
        flat = []
        for k in range(n_out):
            steps = per_step
            if steps is None:
                steps = all(
                    np.ndim(outs[k]) >= 2 and np.shape(outs[k])[1] == boundary
                    for _, boundary, outs in results
                )
            flat.append(self._reorder(results, k, steps, pad_to_max))
        return keras.tree.pack_sequence_as(structure, flat)

    def _reorder(self, results, k, steps, pad_to_max):
        rows = [None] * len(self.x)
        for indices, boundary, outs in results:
            values = np.asarray(outs[k])
            for row, i in zip(values, indices):
                if steps:
                    n = int(self.lengths[i])
                    row = row[:n] if self.padding == "post" else row[boundary - n :]
                rows[i] = row
        if not steps:
            return np.stack(rows)
        if not pad_to_max:
            return rows
        padded, _ = pad_batch(
            rows,
            maxlen=self.boundaries[-1],
            padding=self.padding,
            value=0,
            dtype=rows[0].dtype,
        )
        return padded
