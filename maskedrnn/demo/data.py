"""The demo's data: Japanese Vowels and the distance task, padded."""

import numpy as np

from maskedrnn.datasets import (
    load_japanese_vowels,
    make_distance_to_end_task,
    pad_batch,
)
from maskedrnn.demo.settings import DISTANCE_CLASSES, DISTANCE_SIZE, DISTANCE_VOCAB


def vowels_data(padding):
    """Standardised, zero-padded Japanese Vowels; train statistics only."""
    x_train, y_train = load_japanese_vowels("train")
    x_test, y_test = load_japanese_vowels("test")
    frames = np.concatenate(x_train, axis=0)
    mean = frames.mean(axis=0)
    std = frames.std(axis=0)
    x_train = [(x - mean) / std for x in x_train]
    x_test = [(x - mean) / std for x in x_test]
    maxlen = max(len(x) for x in x_train + x_test)
    x_train, len_train = pad_batch(x_train, maxlen=maxlen, padding=padding)
    x_test, len_test = pad_batch(x_test, maxlen=maxlen, padding=padding)
    for name, x, lengths in (
        ("train", x_train, len_train),
        ("test", x_test, len_test),
    ):
        valid = valid_steps(lengths, maxlen, padding)
        all_zero = np.all(x == 0.0, axis=-1)
        if np.any(all_zero & valid):
            # keras.layers.Masking would take such a frame for padding.
            raise ValueError(
                f"A real {name} frame is all zeros after standardisation, so "
                "Masking(mask_value=0.0) would drop it; pass an explicit mask."
            )
    return {
        "x_train": x_train,
        "y_train": y_train,
        "x_test": x_test,
        "y_test": y_test,
        "valid_test": valid_steps(len_test, maxlen, padding),
        "maxlen": maxlen,
        "n_features": x_train.shape[-1],
        "n_classes": int(y_train.max()) + 1,
    }


def distance_data(padding, quick, seed):
    n_train, n_test, maxlen = DISTANCE_SIZE[quick]
    common = {
        "maxlen": maxlen,
        "vocab_size": DISTANCE_VOCAB,
        "n_classes": DISTANCE_CLASSES,
        "padding": padding,
    }
    x_train, y_train, _ = make_distance_to_end_task(n_train, seed=seed, **common)
    x_test, y_test, len_test = make_distance_to_end_task(
        n_test, seed=seed + 1, **common
    )
    return {
        "x_train": x_train,
        "y_train": y_train,
        "x_test": x_test,
        "y_test": y_test,
        "valid_test": valid_steps(len_test, maxlen, padding),
        "maxlen": maxlen,
        "n_classes": DISTANCE_CLASSES,
    }


def pad_more(x, extra, padding):
    """`x` with `extra` more zero steps on its padding side (axis 1)."""
    width = [(0, 0)] * x.ndim
    width[1] = (extra, 0) if padding == "pre" else (0, extra)
    return np.pad(x, width)


def valid_steps(lengths, maxlen, padding):
    steps = np.arange(maxlen)[None, :]
    if padding == "post":
        return steps < lengths[:, None]
    return steps >= maxlen - lengths[:, None]
