"""End-to-end demo: `MaskedBidirectional` (or `MaskedRNN`) vs Keras' own layers.

Run it with `python -m maskedrnn` (see `main` for the options). Three models
are built from the same initial weights and trained on the same data in the
same batch order:

* `masked_bidirectional`: `maskedrnn.MaskedBidirectional` fed the mask (its
  inner LSTMs run unmasked, so the fused cuDNN kernel stays usable on GPU);
* `keras_masked`: `keras.layers.Bidirectional(LSTM(use_cudnn="auto"))` fed the
  same mask (on GPU, Keras leaves cuDNN for a general mask);
* `naive`: the same `keras.layers.Bidirectional` with no mask at all: it reads
  the padded steps as if they were data.

With `layer="rnn"` (`--layer rnn`) the three models use one direction
instead: `masked_rnn` (`maskedrnn.MaskedRNN(LSTM)` fed the mask),
`keras_masked` (Keras' `LSTM` fed the same mask) and `naive` (Keras' `LSTM`
with no mask); everything below holds for them too. (On `"distance"` a
forward LSTM cannot know how far the end is, so its accuracy stays low: the
task needs the backward direction. The agreement checks still apply.)

The first two compute the same function, so after training they should give
nearly the same predictions (they differ only by float rounding order); the
naive one computes something else. Trained and tested with the same padding,
the naive model can learn to live with it (on these tasks it reaches about
the same accuracy), but its predictions depend on how much padding there is:
the demo also re-pads the test set with extra padding, which leaves the
masked models' predictions unchanged and changes the naive one's.

Tasks:

* `"vowels"` (default): speaker recognition on UCI Japanese Vowels
  (`maskedrnn.datasets.load_japanese_vowels`: 270 train / 370 test utterances
  of 7 to 29 frames of 12 LPC coefficients, 9 speakers). Features are
  standardised with the mean and standard deviation of the training frames
  (padding excluded), then padded with zeros, which `keras.layers.Masking`
  turns into the mask. Model: `Masking -> BiLSTM(return_sequences=False) ->
  Dense(9)`. Metric: test accuracy.
* `"distance"`: tag every token with its distance to the end of its sequence
  (`maskedrnn.datasets.make_distance_to_end_task`), which only the backward
  direction can know. Model: `Embedding(mask_zero=True) ->
  BiLSTM(return_sequences=True) -> Dense(8)`, trained with
  `maskedrnn.MaskedLoss` and `maskedrnn.MaskedAccuracy` (label `-1` marks
  padding). Metric: test accuracy over the valid tokens.

Finally our model (`masked_bidirectional` or `masked_rnn`) is saved as
`.keras`, reloaded, and its test predictions are checked to equal the
in-memory ones.

`python -m maskedrnn` exits with status 1 (and says why on stderr) when one
of the promises the README makes does not hold (`check_agreement`): ours
and Keras' masked model agree to `AGREEMENT_ATOL`, extra padding leaves both
masked models' predictions unchanged, and the reloaded model predicts what
the saved one did.

On the torch backend the demo runs PyTorch with one CPU thread unless told
otherwise (`threads`, `--threads` or `OMP_NUM_THREADS`): its models are too
small to gain from more, and on a busy machine a full thread pool makes them
many times slower (see `maskedrnn.backends.torch_threads`). It prints the count.
"""

from maskedrnn.demo.bucket import run_bucket_demo
from maskedrnn.demo.checks import check_agreement, format_results, summarize
from maskedrnn.demo.cli import main
from maskedrnn.demo.experiment import run_demo
from maskedrnn.demo.models import MODEL_NAMES, RNN_MODEL_NAMES
from maskedrnn.demo.settings import (
    AGREEMENT_ATOL,
    LAYERS,
    TASKS,
    TRAINING_DRIFT_ATOL,
)

__all__ = [
    "AGREEMENT_ATOL",
    "TRAINING_DRIFT_ATOL",
    "LAYERS",
    "MODEL_NAMES",
    "RNN_MODEL_NAMES",
    "TASKS",
    "check_agreement",
    "format_results",
    "main",
    "run_bucket_demo",
    "summarize",
    "run_demo",
]
