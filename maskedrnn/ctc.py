"""CTC on masked outputs: a loss and a decoder that read each row's valid frames.

Each row's valid frames (any mask pattern) are gathered to the front, in
order, and their count is the row's logit length, as `input_lengths` in
`torch.nn.functional.ctc_loss`. See `docs/ctc.md`.
"""

import keras
import numpy as np
from keras import ops

from maskedrnn import _checks, backends
from maskedrnn import ops as mops
from maskedrnn._checks import static_dim
from maskedrnn._keras_private import get_keras_mask, reduce_weighted_values

__all__ = [
    "MaskedCTC",
    "masked_ctc",
    "ctc_decode",
    "ctc_ids_to_text",
    "character_error_rate",
]

def _check_logits(y_pred, what="y_pred"):
    if len(y_pred.shape) != 3:
        raise ValueError(
            f"{what} must be logits of shape (batch, time, classes); got shape "
            f"{tuple(y_pred.shape)}."
        )


def _check_mask(mask, y_pred):
    """Validates a `(batch, time)` mask against `y_pred`; returns it as bool."""
    mask = ops.convert_to_tensor(mask)
    if len(mask.shape) != 2:
        raise ValueError(
            "The mask of y_pred must have shape (batch, time); got shape "
            f"{tuple(mask.shape)}."
        )
    mask = _checks.match_leading_dims(mask, y_pred, 2, "mask")
    if keras.backend.standardize_dtype(mask.dtype) != "bool":
        mask = ops.not_equal(mask, 0)
    return mask


def _compact(y_pred, mask):
    """Valid frames first, in order, zeros after them; and their counts.

    Padded frames are zeroed, not only moved, so NaN or Inf there reach
    neither the loss nor its gradient.
    """
    order, _, counts = mops.valid_first_order(mask)
    compact = mops.gather_time(y_pred, order)
    valid = mops.sequence_mask(counts, ops.shape(y_pred)[1])
    compact = ops.where(ops.expand_dims(valid, -1), compact, ops.zeros_like(compact))
    return compact, counts


def _labels(y_true, y_pred):
    """Returns `(labels, label_lengths, bad_rows)`, non-zero ids first in each row.

    Ids outside `[0, classes)` raise when the values are concrete; in compiled
    code their rows are flagged in `bad_rows` and the ids set to 0.
    """
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) != 2:
        raise ValueError(
            "y_true must be integer labels of shape (batch, max_label_length), "
            f"padded with 0; got shape {tuple(y_true.shape)}."
        )
    b_true, b_pred = static_dim(y_true.shape[0]), static_dim(y_pred.shape[0])
    if b_true is not None and b_pred is not None and b_true != b_pred:
        raise ValueError(
            f"y_true has {b_true} rows but y_pred has {b_pred} (batch dimension); "
            f"got y_true of shape {tuple(y_true.shape)} and y_pred of shape "
            f"{tuple(y_pred.shape)}."
        )
    y_true = ops.cast(y_true, "int32")
    classes = ops.shape(y_pred)[2]
    if backends.current().is_concrete(y_true) and static_dim(classes) is not None:
        values = ops.convert_to_numpy(y_true)
        if values.size and values.min() < 0:
            raise ValueError(
                "y_true must hold label ids >= 0 padded with 0 (0 is the blank); "
                f"got min(y_true)={values.min()}. Pad labels with 0, not -1."
            )
        if values.size and values.max() >= classes:
            raise ValueError(
                f"y_true has label id {values.max()} but y_pred has {classes} "
                f"classes (ids 0 to {classes - 1}, 0 the blank); got "
                f"max(y_true)={values.max()}. Give the last Dense layer one "
                "unit per label id plus one for the blank."
            )
    in_range = ops.logical_and(y_true >= 0, y_true < ops.cast(classes, "int32"))
    bad_rows = ops.logical_not(ops.all(in_range, axis=1))
    y_true = ops.where(in_range, y_true, ops.zeros_like(y_true))
    order, _, label_lengths = mops.valid_first_order(ops.not_equal(y_true, 0))
    labels = mops.gather_time(y_true, order)
    keep = mops.sequence_mask(label_lengths, ops.shape(y_true)[1])
    labels = ops.where(keep, labels, ops.zeros_like(labels))
    return labels, label_lengths, bad_rows


def _min_frames(labels, label_lengths):
    """Fewest frames that can emit each row: a blank between equal neighbours."""
    if static_dim(labels.shape[1]) == 0:
        return label_lengths
    same = ops.logical_and(
        ops.equal(labels[:, 1:], labels[:, :-1]), ops.not_equal(labels[:, 1:], 0)
    )
    return label_lengths + ops.sum(ops.cast(same, "int32"), axis=1)


def masked_ctc(
    y_true, y_pred, mask=None, lengths=None, zero_infinity=False, dtype=None
):
    """Per-row CTC loss over each row's valid frames, for custom loops.

    `MaskedCTC(reduction="none")`'s values, with the valid frames from `mask`,
    else `lengths`, else the Keras mask of `y_pred`, else all frames.

    Args:
        y_true: Integer labels `(batch, max_label_length)`, padded with 0.
        y_pred: Logits `(batch, time, classes)`; class 0 is the blank.
        mask: Optional bool or 0/1 tensor `(batch, time)`, True at valid frames.
        lengths: Optional int tensor `(batch,)` for right-padded rows.
        zero_infinity: Bool; infeasible rows give 0 instead of `inf`. Defaults
            to `False`.
        dtype: Dtype of the computation. Defaults to `keras.backend.floatx()`.

    Returns:
        A `(batch,)` tensor of negative log-likelihoods; padded frames
        contribute nothing (see `MaskedCTC` for `inf` and NaN rows).

    Example:

    Uniform logits over (blank, 1, 2) and the labels `1 2` in 3 valid frames:
    5 of the 27 paths spell `1 2`, so the loss is `-log(5 / 27)`.

    >>> logits = np.zeros((1, 4, 3), "float32")  # (batch, time, classes)
    >>> y_true = np.array([[1, 2]])
    >>> round(float(masked_ctc(y_true, logits, lengths=[3])[0]), 4)
    1.6864
    """
    if mask is not None and lengths is not None:
        raise ValueError(
            "Pass either mask or lengths to masked_ctc, not both (lengths=L is "
            "the same as mask=sequence_mask(L, time))."
        )
    if mask is None and lengths is None:
        mask = get_keras_mask(y_pred)
    dtype = dtype or keras.backend.floatx()
    y_pred = ops.convert_to_tensor(y_pred, dtype=dtype)
    _check_logits(y_pred)
    labels, label_lengths, bad_rows = _labels(y_true, y_pred)
    if mask is not None:
        y_pred, counts = _compact(y_pred, _check_mask(mask, y_pred))
    elif lengths is not None:
        counts = _check_lengths(lengths, y_pred)
        valid = mops.sequence_mask(counts, ops.shape(y_pred)[1])
        y_pred = ops.where(ops.expand_dims(valid, -1), y_pred, ops.zeros_like(y_pred))
    else:
        counts = ops.full((ops.shape(y_pred)[0],), ops.shape(y_pred)[1], "int32")
    infeasible = counts < _min_frames(labels, label_lengths)
    # Infeasible rows get an empty label, so that no backend's inf or NaN
    # stand-in reaches the result or the gradient.
    skip = ops.logical_or(infeasible, bad_rows)
    safe_labels = ops.where(ops.expand_dims(skip, 1), ops.zeros_like(labels), labels)
    safe_lengths = ops.where(skip, ops.zeros_like(label_lengths), label_lengths)
    values = ops.ctc_loss(safe_labels, y_pred, safe_lengths, counts, mask_index=0)
    values = ops.cast(values, dtype)
    fill = 0.0 if zero_infinity else float("inf")
    values = ops.where(infeasible, ops.full_like(values, fill), values)
    return ops.where(bad_rows, ops.full_like(values, float("nan")), values)


@keras.saving.register_keras_serializable(package="maskedrnn")
class MaskedCTC(keras.losses.Loss):
    """CTC loss over each row's valid frames, with the mask of `y_pred`.

    `keras.losses.CTC`'s conventions (labels padded with 0, logits, blank 0),
    but with a Keras mask on `y_pred` each row reads only its valid frames, in
    order, whatever the pattern; without one it equals `keras.losses.CTC()`.
    Rows whose labels need more frames than they have give `inf` (or 0) and no
    gradient; a label id outside `[0, classes)` raises in eager code and gives
    NaN in compiled code (see `docs/ctc.md`).

    Args:
        zero_infinity: Bool; infeasible rows give 0 instead of `inf`. Defaults
            to `False`.
        reduction: Type of reduction, as in `keras.losses.Loss`. Defaults to
            `"sum_over_batch_size"`.
        name: Name of the loss instance. Defaults to `"masked_ctc"`.
        dtype: Dtype of the loss computation. Defaults to `None`.

    Call arguments:
        y_true: Integer labels `(batch, max_label_length)`, padded with 0.
        y_pred: Logits `(batch, time, classes)`, possibly with a Keras mask.
        sample_weight: Optional per-row weights `(batch,)`.

    Returns:
        A scalar, or `(batch,)` values for `reduction="none"`.

    Example:

    ```python
    inputs = keras.Input((None, 20))
    x = maskedrnn.MaskedBidirectional(
        keras.layers.GRU(64, return_sequences=True))(keras.layers.Masking()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(num_labels + 1)(x))
    model.compile(optimizer="adam", loss=maskedrnn.MaskedCTC())
    ```
    """

    def __init__(
        self,
        zero_infinity=False,
        reduction="sum_over_batch_size",
        name="masked_ctc",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        if not isinstance(zero_infinity, bool):
            raise TypeError(
                f"zero_infinity must be True or False; got {zero_infinity!r}."
            )
        self.zero_infinity = zero_infinity

    def __call__(self, y_true, y_pred, sample_weight=None):
        mask = get_keras_mask(y_pred)
        with keras.name_scope(self.name):
            values = masked_ctc(
                y_true,
                y_pred,
                mask=mask,
                zero_infinity=self.zero_infinity,
                dtype=self.dtype,
            )
            if sample_weight is not None:
                sample_weight = _checks.one_per_row(
                    ops.convert_to_tensor(sample_weight, self.dtype),
                    "MaskedCTC takes one sample weight per row: sample_weight "
                    "must have shape (batch,)",
                )
            return reduce_weighted_values(
                values,
                sample_weight=sample_weight,
                reduction=self.reduction,
                dtype=self.dtype,
            )

    def call(self, y_true, y_pred):
        """Per-row values, `(batch,)`, with the Keras mask of `y_pred`."""
        return masked_ctc(
            y_true,
            y_pred,
            mask=get_keras_mask(y_pred),
            zero_infinity=self.zero_infinity,
            dtype=self.dtype,
        )

    def get_config(self):
        return {
            "zero_infinity": self.zero_infinity,
            "reduction": self.reduction,
            "name": self.name,
            "dtype": self._dtype_policy.name,
        }


def _check_lengths(lengths, y_pred):
    lengths = ops.cast(ops.convert_to_tensor(lengths), "int32")
    lengths = _checks.match_leading_dims(lengths, y_pred, 1, "lengths")
    time = ops.shape(y_pred)[1]
    if backends.current().is_concrete(lengths):
        values = ops.convert_to_numpy(lengths)
        if values.size and values.min() < 0:
            raise ValueError(f"lengths must be >= 0; got min(lengths)={values.min()}.")
        if static_dim(time) is not None and values.size and values.max() > time:
            raise ValueError(
                f"lengths has a value {values.max()} longer than the time axis of "
                f"y_pred ({time}); clip lengths or pad y_pred."
            )
    # Compiled code cannot raise: lengths are clipped to [0, time].
    return _checks.clamp_lengths(lengths, time)


def ctc_decode(
    y_pred,
    mask=None,
    lengths=None,
    strategy="greedy",
    beam_width=100,
    top_paths=1,
    merge_repeated=True,
):
    """Decodes CTC logits over each row's valid frames.

    `keras.ops.ctc_decode` on the valid-first logits, blank 0, with valid
    frames from `mask`, else `lengths`, else the Keras mask of `y_pred`.

    Args:
        y_pred: Logits (or log-probabilities) `(batch, time, classes)`.
        mask: Optional bool or 0/1 tensor `(batch, time)`, True at valid frames.
        lengths: Optional int tensor `(batch,)` for right-padded rows.
        strategy: `"greedy"` or `"beam_search"`. Defaults to `"greedy"`.
        beam_width: Int, for `"beam_search"`. Defaults to `100`.
        top_paths: Int, for `"beam_search"`. Defaults to `1`.
        merge_repeated: Bool. Defaults to `True`.

    Returns:
        A tuple `(decoded, scores)`: label ids `(top_paths, batch, time)`
        padded with `-1`, and scores `(batch, top_paths)`.

    Example:

    Frames that read `a a <blank> b`, then a padded frame that reads `a`:

    >>> probs = [[[.1, .8, .1], [.1, .8, .1], [.8, .1, .1], [.1, .1, .8],
    ...           [.1, .8, .1]]]
    >>> logits = np.log(np.array(probs, "float32"))  # (batch, time, classes)
    >>> decoded, _ = ctc_decode(logits, mask=[[1, 1, 1, 1, 0]])
    >>> ctc_ids_to_text(decoded[0], vocabulary="-ab")  # index 0: the blank
    ['ab']
    >>> ctc_ids_to_text(ctc_decode(logits)[0][0], vocabulary="-ab")  # no mask
    ['aba']
    """
    if mask is not None and lengths is not None:
        raise ValueError(
            "Pass either mask or lengths to ctc_decode, not both (lengths=L is "
            "the same as mask=sequence_mask(L, time))."
        )
    if mask is None and lengths is None:
        mask = get_keras_mask(y_pred)
    y_pred = ops.convert_to_tensor(y_pred)
    _check_logits(y_pred)
    if mask is not None:
        y_pred, counts = _compact(y_pred, _check_mask(mask, y_pred))
    elif lengths is not None:
        counts = _check_lengths(lengths, y_pred)
    else:
        counts = ops.full((ops.shape(y_pred)[0],), ops.shape(y_pred)[1], "int32")
    return ops.ctc_decode(
        y_pred,
        counts,
        strategy=strategy,
        beam_width=beam_width,
        top_paths=top_paths,
        merge_repeated=merge_repeated,
        mask_index=0,
    )


def _vocabulary_list(vocabulary):
    if hasattr(vocabulary, "get_vocabulary"):  # StringLookup, IntegerLookup
        return [str(token) for token in vocabulary.get_vocabulary()]
    if isinstance(vocabulary, str):
        return list(vocabulary)
    if isinstance(vocabulary, dict):
        return vocabulary
    if isinstance(vocabulary, (list, tuple)):
        return [str(token) for token in vocabulary]
    raise TypeError(
        "vocabulary must be None, a list of tokens indexed by id, a string of "
        "characters, a dict {id: token} or a keras.layers.StringLookup; got "
        f"{type(vocabulary).__name__}."
    )


def ctc_ids_to_text(ids, vocabulary=None, separator=""):
    """Turns padded label ids into lists of ids or strings, dropping -1 and 0.

    Args:
        ids: Integer array `(batch, length)` or `(top_paths, batch, length)`.
        vocabulary: `None` (ids), a list or string of tokens indexed by id, a
            dict `{id: token}`, or a `keras.layers.StringLookup`. Defaults to
            `None`.
        separator: String between tokens. Defaults to `""`.

    Returns:
        One entry per row (a list of ints, or a string), nested for rank 3.

    Example:

    >>> ctc_ids_to_text([[3, 1, -1], [2, -1, -1]], vocabulary="-abc")
    ['ca', 'b']
    """
    if isinstance(ids, (list, tuple)):
        array = np.asarray(ids)
    else:
        array = np.asarray(ops.convert_to_numpy(ids))
    if array.ndim == 3:
        return [ctc_ids_to_text(path, vocabulary, separator) for path in array]
    if array.ndim != 2:
        raise ValueError(
            "ids must have shape (batch, length) or (top_paths, batch, length); "
            f"got shape {array.shape}."
        )
    rows = [[int(i) for i in row if i > 0] for row in array]
    if vocabulary is None:
        return rows
    tokens = _vocabulary_list(vocabulary)
    texts = []
    for row in rows:
        for i in row:
            if (isinstance(tokens, dict) and i not in tokens) or (
                not isinstance(tokens, dict) and i >= len(tokens)
            ):
                raise ValueError(
                    f"ids holds id {i}, which the vocabulary of {len(tokens)} "
                    "tokens does not have; pass the vocabulary the labels were "
                    f"made with. Got ids of shape {array.shape}."
                )
        texts.append(separator.join(str(tokens[i]) for i in row))
    return texts


def _edit_distance(a, b):
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y))
            )
        previous = current
    return previous[-1]


def character_error_rate(references, hypotheses):
    """Total edit distance over total reference length (the corpus CER).

    Args:
        references: List of the true sequences (strings or lists of ids).
        hypotheses: List of the decoded sequences, one per reference.

    Returns:
        A float: summed Levenshtein distances over summed reference lengths.

    Example:

    >>> character_error_rate(["abc", "de"], ["abd", "de"])
    0.2
    """
    if len(references) != len(hypotheses):
        raise ValueError(
            "references and hypotheses must have one entry each per row; got "
            f"{len(references)} references and {len(hypotheses)} hypotheses."
        )
    total = sum(len(r) for r in references)
    if total == 0:
        raise ValueError(
            "character_error_rate needs at least one reference token; got "
            "only empty references."
        )
    errors = sum(_edit_distance(r, h) for r, h in zip(references, hypotheses))
    return errors / total
