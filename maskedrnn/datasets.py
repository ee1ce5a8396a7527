"""Small data sets and padding helpers, NumPy only (they feed any backend).

UCI Japanese Vowels is bundled in `maskedrnn/data/` (licence there; nothing
is downloaded); the other tasks are synthetic.
"""

import importlib.resources
import math
import os

import numpy as np

from maskedrnn._checks import check_int

__all__ = [
    "parse_ts",
    "load_japanese_vowels",
    "pad_batch",
    "make_distance_to_end_task",
    "make_spoken_digits_task",
]

_BOOLEAN_TAGS = {
    "timestamps": "timestamps",
    "missing": "missing",
    "univariate": "univariate",
    "equallength": "equal_length",
}
_INT_TAGS = {"dimensions": "dimensions", "serieslength": "series_length"}


def _parse_bool(word, tag, lineno):
    lowered = word.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError(
        f"Line {lineno}: @{tag} must be followed by 'true' or 'false'; got {word!r}."
    )


def _parse_header(line, lineno, meta):
    """Parses one `@tag value...` line into `meta`."""
    words = line.split()
    tag = words[0][1:].lower()
    args = words[1:]
    if tag == "data":
        if args:
            raise ValueError(
                f"Line {lineno}: @data must stand alone on its line; the cases "
                "start on the next line."
            )
        return
    if tag == "problemname":
        if not args:
            raise ValueError(f"Line {lineno}: @problemName needs a name.")
        meta["problem_name"] = line.split(None, 1)[1].strip()
    elif tag in _BOOLEAN_TAGS:
        if len(args) != 1:
            raise ValueError(
                f"Line {lineno}: @{words[0][1:]} takes exactly one value, "
                f"'true' or 'false'; got {len(args)} values."
            )
        meta[_BOOLEAN_TAGS[tag]] = _parse_bool(args[0], words[0][1:], lineno)
    elif tag in _INT_TAGS:
        if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
            raise ValueError(
                f"Line {lineno}: @{words[0][1:]} takes one positive integer; "
                f"got {' '.join(args)!r}."
            )
        meta[_INT_TAGS[tag]] = int(args[0])
    elif tag == "classlabel":
        if not args:
            raise ValueError(
                f"Line {lineno}: @classLabel needs 'true' followed by the class "
                "labels, or 'false'."
            )
        has_labels = _parse_bool(args[0], "classLabel", lineno)
        if has_labels and len(args) == 1:
            raise ValueError(
                f"Line {lineno}: @classLabel true must list the class labels, "
                "e.g. '@classLabel true 1 2 3'."
            )
        if not has_labels and len(args) > 1:
            raise ValueError(
                f"Line {lineno}: @classLabel false takes no labels; got "
                f"{' '.join(args[1:])!r}."
            )
        if len(set(args[1:])) != len(args[1:]):
            raise ValueError(
                f"Line {lineno}: @classLabel lists a label twice: "
                f"{' '.join(args[1:])!r}."
            )
        meta["class_label"] = has_labels
        meta["class_labels"] = list(args[1:])
    elif tag == "targetlabel":
        if len(args) != 1:
            raise ValueError(
                f"Line {lineno}: @targetLabel takes exactly one value, 'true' or "
                f"'false'; got {len(args)} values."
            )
        meta["target_label"] = _parse_bool(args[0], "targetLabel", lineno)
    else:
        raise ValueError(
            f"Line {lineno}: unknown header tag {words[0]!r}. Known tags: "
            "@problemName, @timeStamps, @missing, @univariate, @dimensions, "
            "@equalLength, @seriesLength, @classLabel, @targetLabel, @data."
        )


def _parse_values(text, lineno, dim):
    """Comma-separated floats of one dimension; '?' is a missing value (NaN)."""
    values = []
    for token in text.split(","):
        token = token.strip()
        if token == "?":
            values.append(math.nan)
            continue
        try:
            values.append(float(token))
        except ValueError:
            raise ValueError(
                f"Line {lineno}, dimension {dim}: {token!r} is not a number "
                "(use '?' for a missing value)."
            ) from None
    return values


def parse_ts(path_or_text):
    """Parses a time-series file in the sktime/aeon `.ts` format.

    Cases may differ in length; `?` reads as NaN; timestamped data is not
    supported.

    Args:
        path_or_text: A path to a `.ts` file, or its text (with a newline).

    Returns:
        A tuple `(series, labels, metadata)`: one float32 array `(time, dims)`
        per case; the class (str) or target (float32) labels `(cases,)`, or
        `None`; and a dict of the header tags present.

    Raises:
        ValueError: On malformed input; the message names the line number.

    Example:

    >>> series, labels, meta = parse_ts(
    ...     "@problemName toy\\n@univariate false\\n@dimensions 2\\n"
    ...     "@classLabel true a b\\n@data\\n1,2,3:4,5,?:a\\n6:7:b\\n")
    >>> [s.shape for s in series], labels
    ([(3, 2), (1, 2)], array(['a', 'b'], dtype='<U1'))
    """
    if isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str) and "\n" not in path_or_text
    ):
        with open(path_or_text, encoding="utf-8") as f:
            text = f.read()
    elif isinstance(path_or_text, str):
        text = path_or_text
    else:
        raise TypeError(
            "parse_ts expects a path (str or os.PathLike) or the file's text "
            f"(str); got {type(path_or_text).__name__}."
        )

    meta = {}
    in_data = False
    series = []
    raw_labels = []
    n_dims_seen = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            if in_data:
                raise ValueError(
                    f"Line {lineno}: header line {line.split()[0]!r} after "
                    "@data; all header lines must come before @data."
                )
            _parse_header(line, lineno, meta)
            if line.split()[0].lower() == "@data":
                in_data = True
                if meta.get("timestamps", False):
                    raise ValueError(
                        "parse_ts does not support timestamped data "
                        "(@timeStamps true); convert the file to plain "
                        "values first."
                    )
                if meta.get("class_label", False) and meta.get("target_label", False):
                    raise ValueError(
                        "The header declares both @classLabel true and "
                        "@targetLabel true; a .ts file has one label field."
                    )
            continue
        if not in_data:
            raise ValueError(
                f"Line {lineno}: data found before the @data line; put the "
                "header first and end it with @data."
            )

        parts = line.split(":")
        has_label = meta.get("class_label", False) or meta.get("target_label", False)
        if has_label:
            if len(parts) < 2:
                raise ValueError(
                    f"Line {lineno}: expected values followed by ':<label>' "
                    "(the header declares labels); found no ':'."
                )
            label = parts[-1].strip()
            parts = parts[:-1]
            if meta.get("class_label", False):
                if label not in meta["class_labels"]:
                    raise ValueError(
                        f"Line {lineno}: class label {label!r} is not one of "
                        f"the labels declared by @classLabel: "
                        f"{meta['class_labels']}."
                    )
                raw_labels.append(label)
            else:
                try:
                    raw_labels.append(float(label))
                except ValueError:
                    raise ValueError(
                        f"Line {lineno}: regression target {label!r} is not a number."
                    ) from None

        n_dims = len(parts)
        expected = meta.get("dimensions")
        if meta.get("univariate", False) and n_dims != 1:
            raise ValueError(
                f"Line {lineno}: found {n_dims} dimensions but the header says "
                "@univariate true (one dimension)."
            )
        if expected is not None and n_dims != expected:
            raise ValueError(
                f"Line {lineno}: found {n_dims} dimensions, but @dimensions is "
                f"{expected}."
            )
        if n_dims_seen is not None and n_dims != n_dims_seen:
            raise ValueError(
                f"Line {lineno}: found {n_dims} dimensions, but earlier cases "
                f"have {n_dims_seen}."
            )
        n_dims_seen = n_dims

        columns = []
        for d, part in enumerate(parts):
            if not part.strip():
                raise ValueError(
                    f"Line {lineno}, dimension {d}: no values (empty field "
                    "between ':' separators)."
                )
            columns.append(_parse_values(part, lineno, d))
        lengths = {len(c) for c in columns}
        if len(lengths) != 1:
            raise ValueError(
                f"Line {lineno}: dimensions have different lengths "
                f"{[len(c) for c in columns]}; every dimension of a case must "
                "have the same number of values."
            )
        length = lengths.pop()
        if meta.get("series_length") is not None and meta.get("equal_length", False):
            if length != meta["series_length"]:
                raise ValueError(
                    f"Line {lineno}: case has {length} time steps but "
                    f"@seriesLength is {meta['series_length']}."
                )
        if meta.get("equal_length", False) and series:
            if length != series[0].shape[0]:
                raise ValueError(
                    f"Line {lineno}: case has {length} time steps but the "
                    f"first case has {series[0].shape[0]}, and the header says "
                    "@equalLength true."
                )
        series.append(np.asarray(columns, dtype=np.float32).T.copy())

    if not in_data:
        raise ValueError("No @data line found; this is not a .ts file.")
    if not series:
        raise ValueError("The file has an @data line but no cases after it.")

    if meta.get("class_label", False):
        labels = np.asarray(raw_labels, dtype=str)
    elif meta.get("target_label", False):
        labels = np.asarray(raw_labels, dtype=np.float32)
    else:
        labels = None
    return series, labels, meta


_JAPANESE_VOWELS_FILES = {
    "train": "JapaneseVowels_TRAIN.ts",
    "test": "JapaneseVowels_TEST.ts",
}


def load_japanese_vowels(split="train"):
    """Loads the UCI Japanese Vowels data set shipped with `maskedrnn`.

    Nine speakers' utterances of /ae/, 7 to 29 frames of 12 LPC cepstrum
    coefficients; the task is to recognise the speaker. Source: Kudo, Toyama
    and Shimbo (1999), UCI ML Repository (CC BY 4.0,
    https://doi.org/10.24432/C5NS47); see `maskedrnn/data/`.

    Args:
        split: `"train"` (270 utterances) or `"test"` (370). Defaults to
            `"train"`.

    Returns:
        A tuple `(sequences, labels)`: float32 arrays `(time, 12)`, and int32
        speaker indices 0..8 `(cases,)`.

    Example:

    >>> x, y = load_japanese_vowels("train")
    >>> len(x), x[0].shape, y[:3]
    (270, (20, 12), array([0, 0, 0], dtype=int32))
    """
    if split not in _JAPANESE_VOWELS_FILES:
        raise ValueError(f"split must be 'train' or 'test'; got {split!r}.")
    resource = importlib.resources.files("maskedrnn").joinpath(
        "data", _JAPANESE_VOWELS_FILES[split]
    )
    text = resource.read_text(encoding="utf-8")
    series, labels, meta = parse_ts(text)
    index = {name: i for i, name in enumerate(meta["class_labels"])}
    ids = np.asarray([index[name] for name in labels], dtype=np.int32)
    return series, ids


def pad_batch(sequences, maxlen=None, padding="post", value=0.0, dtype="float32"):
    """Pads variable-length sequences into one array and returns their lengths.

    Like `keras.utils.pad_sequences`, but with feature axes, the lengths
    returned, and an error, not truncation, past `maxlen`.

    Args:
        sequences: Non-empty sequence of arrays `(time, *features)`.
        maxlen: Int, the padded length. Defaults to `None` (the longest).
        padding: `"post"` or `"pre"`. Defaults to `"post"`.
        value: Scalar written into the padded steps. Defaults to `0.0`.
        dtype: NumPy dtype of the result. Defaults to `"float32"`.

    Returns:
        A tuple `(padded, lengths)`: `(len(sequences), maxlen, *features)` and
        int32 `(len(sequences),)`.

    Example:

    >>> padded, lengths = pad_batch([np.ones((2, 3)), np.ones((4, 3))])
    >>> padded.shape, lengths
    ((2, 4, 3), array([2, 4], dtype=int32))
    """
    if padding not in ("pre", "post"):
        raise ValueError(f"padding must be 'pre' or 'post'; got {padding!r}.")
    if maxlen is not None:
        if isinstance(maxlen, bool) or not isinstance(maxlen, (int, np.integer)):
            raise ValueError(
                f"maxlen must be a non-negative int or None; got {maxlen!r}."
            )
        if maxlen < 0:
            raise ValueError(f"maxlen must be >= 0; got {maxlen}.")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype {dtype!r} is not a NumPy dtype.") from None
    arrays = [np.asarray(s) for s in sequences]
    if not arrays:
        raise ValueError("sequences is empty; pass at least one sequence.")
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise ValueError(
                f"sequences[{i}] is a scalar; every sequence needs a time axis "
                "(shape (time, *features))."
            )
    feature_shape = arrays[0].shape[1:]
    for i, a in enumerate(arrays):
        if a.shape[1:] != feature_shape:
            raise ValueError(
                f"sequences[{i}] has feature shape {a.shape[1:]}, but "
                f"sequences[0] has {feature_shape}; all sequences must share "
                "the axes after time."
            )
    lengths = np.asarray([a.shape[0] for a in arrays], dtype=np.int32)
    longest = int(lengths.max())
    if maxlen is None:
        maxlen = longest
    elif longest > maxlen:
        i = int(np.argmax(lengths))
        raise ValueError(
            f"sequences[{i}] has {longest} steps, more than maxlen={maxlen}; "
            "pass a larger maxlen (or None) or truncate the sequences first."
        )
    maxlen = int(maxlen)
    padded = np.full((len(arrays), maxlen) + feature_shape, value, dtype=dtype)
    for i, a in enumerate(arrays):
        n = a.shape[0]
        if n == 0:
            continue
        if padding == "post":
            padded[i, :n] = a
        else:
            padded[i, maxlen - n :] = a
    return padded, lengths


def make_distance_to_end_task(
    n,
    maxlen,
    vocab_size=16,
    n_classes=8,
    min_length=None,
    padding="post",
    seed=None,
):
    """Synthetic tagging task that needs the backward direction of an RNN.

    Each token's target is its distance to the end of its sequence, clipped to
    `n_classes - 1`; tokens carry no information, so wrong padding handling in
    the backward direction shows up directly as wrong targets.

    Args:
        n: Int >= 1, number of sequences.
        maxlen: Int >= 1, padded length.
        vocab_size: Int >= 2; tokens are `1 .. vocab_size - 1`. Defaults to
            `16`.
        n_classes: Int >= 1. Defaults to `8`.
        min_length: Int in `[1, maxlen]`; lengths are uniform in
            `[min_length, maxlen]`. Defaults to `max(1, maxlen // 5)`.
        padding: `"post"` or `"pre"`. Defaults to `"post"`.
        seed: Int, seed of `numpy.random.default_rng`. Defaults to `None`.

    Returns:
        A tuple `(ids, labels, lengths)`: int32 `(n, maxlen)` ids (0 at
        padding), int32 `(n, maxlen)` targets (-1 at padding), int32 `(n,)`.
    """

    check_int("n", n, 1)
    check_int("maxlen", maxlen, 1)
    check_int("vocab_size", vocab_size, 2)
    check_int("n_classes", n_classes, 1)
    if min_length is None:
        min_length = max(1, maxlen // 5)
    check_int("min_length", min_length, 1)
    if min_length > maxlen:
        raise ValueError(
            f"min_length={min_length} is larger than maxlen={maxlen}; pass "
            "min_length <= maxlen."
        )
    if padding not in ("pre", "post"):
        raise ValueError(f"padding must be 'pre' or 'post'; got {padding!r}.")

    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, maxlen + 1, size=n).astype(np.int32)
    tokens = rng.integers(1, vocab_size, size=(n, maxlen)).astype(np.int32)
    steps = np.arange(maxlen, dtype=np.int32)[None, :]
    if padding == "post":
        valid = steps < lengths[:, None]
        distance = lengths[:, None] - 1 - steps
    else:
        valid = steps >= maxlen - lengths[:, None]
        distance = np.broadcast_to(maxlen - 1 - steps, (n, maxlen))
    ids = np.where(valid, tokens, 0).astype(np.int32)
    labels = np.where(valid, np.minimum(distance, n_classes - 1), -1)
    return ids, labels.astype(np.int32), lengths


def make_spoken_digits_task(
    n,
    max_digits=5,
    features=12,
    noise=0.6,
    maxlen=None,
    padding="post",
    seed=None,
):
    """Synthetic "speech": digit strings rendered as noisy frames, for CTC.

    Each digit becomes 2-4 noisy frames of its prototype, with silence between,
    so alignment is unknown. Padded frames are exactly zero (`Masking()` masks
    them); label ids are `digit + 1` (0 is the blank).

    Args:
        n: Int >= 1, number of sequences.
        max_digits: Int >= 1, most digits per sequence. Defaults to `5`.
        features: Int >= 1, features per frame. Defaults to `12`.
        noise: Float >= 0, noise standard deviation. Defaults to `0.6`.
        maxlen: Int, the padded number of frames. Defaults to the longest.
        padding: `"post"` or `"pre"`. Defaults to `"post"`.
        seed: Int, seed of `numpy.random.default_rng`. Defaults to `None`.

    Returns:
        A tuple `(x, labels, lengths)`: float32 `(n, maxlen, features)`, int32
        `(n, max_digits)` padded with 0, and int32 `(n,)` frame counts.

    Example:

    >>> x, labels, lengths = make_spoken_digits_task(3, seed=0)
    >>> x.shape[0], labels.shape, lengths.shape
    (3, (3, 5), (3,))
    """
    for name, v in (("n", n), ("max_digits", max_digits), ("features", features)):
        check_int(name, v, 1)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or noise < 0:
        raise ValueError(f"noise must be a number >= 0; got {noise!r}.")
    rng = np.random.default_rng(seed)
    prototypes = rng.normal(size=(10, features))
    labels = np.zeros((n, max_digits), np.int32)
    sequences = []
    for i in range(n):
        digits = rng.integers(0, 10, size=rng.integers(1, max_digits + 1))
        labels[i, : len(digits)] = digits + 1
        frames = [np.zeros((rng.integers(0, 3), features))]
        for d in digits:
            steps = rng.integers(2, 5)
            amplitude = rng.uniform(0.7, 1.3, size=(steps, 1))
            frames.append(amplitude * prototypes[d])
            frames.append(np.zeros((rng.integers(1, 3), features)))
        frames = np.concatenate(frames)
        frames = frames + noise * rng.normal(size=frames.shape)
        sequences.append(frames)
    x, lengths = pad_batch(sequences, maxlen=maxlen, padding=padding)
    return x, labels, lengths
