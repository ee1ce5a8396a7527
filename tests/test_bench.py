"""`python -m maskedrnn.bench`: runs end to end, and times the right computations.

No timing is asserted (speed lives in docs/benchmarks.md). What is checked:
the JSON holds one row per implementation and mode with its timings, the
ratios are the ratios of those medians, and every implementation the
benchmark times was first checked against an oracle on the benchmark's own
data: Keras' `Bidirectional` fed the mask (and on torch PyTorch's packed
`nn.LSTM`/`nn.GRU`, an independent implementation with converted weights).
The unmasked ceilings must *differ* from it on padded rows, which proves the
check can see a wrong computation.
"""

import importlib.util
import json
import runpy
import sys

import keras
import numpy as np
import pytest

from maskedrnn import bench
from tests.helpers import edge_mask

BACKEND = keras.backend.backend()
TINY = ["--batch", "4", "--time", "6", "--features", "3", "--units", "4"]
# No first calls unless a test is about them: each is a fresh compilation of
# every implementation and mode, several times over.
QUICK = ["--repeats", "2", "--warmup", "1", "--no-progress", "--seed", "0"]
QUICK += ["--first-call-repeats", "0"]
FIRST_CALLS = ["--first-call-repeats", "3"]
ALL_IMPLS = [n for n in bench.IMPLS if BACKEND == "torch" or n not in bench.TORCH_ONLY]
# float32 against Keras' float32 loop; tests/conftest.py turns TF32 off on
# CUDA, where cuDNN's different summation order stays well inside this.
MATCH_ATOL = 1e-4
GPU = bench.gpu_available(BACKEND)
# cuDNN computes the unmasked LSTMs only on a CUDA device (torch, JAX).
GPU_CUDNN = GPU and BACKEND in ("torch", "jax")


# On a JAX CPU ours runs an LSTM, GRU or SimpleRNN in its length tiers
# (`maskedrnn.backends.jax_tiers`): no Keras RNN function at all.
JAX_CPU = BACKEND == "jax" and not GPU


# On a TensorFlow CPU ours runs every LSTM on TensorFlow's fused BlockLSTMV2
# (`maskedrnn.backends.tensorflow_block_lstm`).
TF_CPU = BACKEND == "tensorflow" and not GPU


def assert_rows_match_oracles(rows):
    """Every implementation agrees with Keras masked (outputs, and input and
    weight gradients in train mode) except the ceilings, which must not."""
    for (name, mode), row in rows.items():
        if name in bench.CEILINGS:
            assert row["max_abs_diff"] > 1e-3, row
            continue
        assert row["max_abs_diff"] < MATCH_ATOL, row
        if mode == "train":
            assert row["max_abs_grad_diff"] < MATCH_ATOL, row


def assert_state_layer_mask_use(ours, cell, directions):
    """Ours' kernel line for a 2-layer stack whose last layer returns states
    (`directions` inner RNNs per layer): no RNN gets a mask; on a JAX CPU
    no Keras RNN function runs at all (the length tiers), but a SimpleRNN's
    layers run Keras' masked loop there."""
    if JAX_CPU and cell == "rnn":
        assert f"backend.rnn computed, with a mask x{2 * directions}" in ours
        assert "no mask" not in ours
    elif JAX_CPU:
        assert "no Keras RNN function or native kernel called" in ours
    else:
        assert "with a mask" not in ours


@pytest.fixture(scope="module")
def lstm_run(tmp_path_factory):
    """One end-to-end run (LSTM, both modes, every implementation)."""
    path = tmp_path_factory.mktemp("bench") / "lstm.json"
    returned = bench.main(TINY + QUICK + FIRST_CALLS + ["--json", str(path)])
    with open(path) as f:
        return json.load(f), returned


def by_case(results):
    return {(r["impl"], r["mode"]): r for r in results["rows"]}


def test_json_has_every_row_with_its_timings(lstm_run):
    results, returned = lstm_run
    assert results == json.loads(json.dumps(returned))  # the file is the result
    config = results["config"]
    assert config["backend"] == BACKEND
    assert (config["batch"], config["time"], config["features"]) == (4, 6, 3)
    assert config["units"] == 4 and config["impls"] == ALL_IMPLS
    assert config["padding_fraction"] > 0  # the checks below need padded rows
    rows = by_case(results)
    assert set(rows) == {(n, m) for n in ALL_IMPLS for m in ("train", "infer")}
    for row in results["rows"]:
        times = np.asarray(row["times_ms"])
        assert len(times) == 2 and np.all(times > 0)
        assert row["median_ms"] == pytest.approx(np.median(times))
        assert row["min_ms"] == pytest.approx(times.min())
        assert row["p25_ms"] <= row["median_ms"] <= row["p75_ms"]
        # The host's share: each repeat's call returned before it ended.
        assert 0 < row["host_median_ms"] <= row["median_ms"]


def test_ratios_are_ratios_of_the_medians(lstm_run):
    results, _ = lstm_run
    rows = by_case(results)
    baselines = [n for n in bench.BASELINES if n in ALL_IMPLS]
    for mode in ("train", "infer"):
        ratios = results["ratios"][mode]
        expected_keys = {f"{o}/{b}" for o in bench.OURS for b in baselines}
        assert set(ratios) == expected_keys
        for key, value in ratios.items():
            ours, base = key.split("/")
            expected = rows[ours, mode]["median_ms"] / rows[base, mode]["median_ms"]
            assert value == pytest.approx(expected, rel=1e-12)


def _rows(ours, base, mode="infer"):
    return [
        {"impl": "maskedrnn", "mode": mode, "times_ms": list(ours)},
        {"impl": "keras_masked", "mode": mode, "times_ms": list(base)},
    ]


def test_ratio_interval_is_a_paired_bootstrap_of_the_ratio_of_medians():
    """`report.ratio_interval`: repeats drawn with replacement, the same
    repeats for both implementations. Oracles: a ratio that is the same in
    every repeat has no spread, however much the machine drifts between
    repeats (pairing keeps the drift out); numpy's own bootstrap, written
    here, gives the same bounds; the interval holds the point ratio."""
    from maskedrnn.bench.report import ratio_interval

    drift = np.linspace(1.0, 3.0, 20)  # a machine slowing down threefold
    rows = _rows(1.1 * drift, drift)
    low, high = ratio_interval(rows, "infer", "maskedrnn/keras_masked")
    assert low == pytest.approx(1.1) and high == pytest.approx(1.1)

    rng = np.random.default_rng(5)
    base = rng.uniform(1.0, 2.0, 20)
    ours = base * rng.uniform(0.9, 1.2, 20)
    rows = _rows(ours, base, "train")
    interval = ratio_interval(rows, "train", "maskedrnn/keras_masked")
    draws = np.random.default_rng(0).integers(0, 20, size=(4000, 20))
    ratios = np.median(ours[draws], axis=1) / np.median(base[draws], axis=1)
    assert interval == pytest.approx(tuple(np.percentile(ratios, [2.5, 97.5])))
    point = np.median(ours) / np.median(base)
    assert interval[0] < point < interval[1]
    assert ratio_interval(rows, "train", "maskedrnn/keras_masked") == interval
    assert ratio_interval(rows, "infer", "maskedrnn/keras_masked") is None


def test_text_table_gives_each_ratio_its_interval(lstm_run):
    results, _ = lstm_run
    from maskedrnn.bench.report import ratio_interval

    table = bench.format_table(results)
    low, high = ratio_interval(results["rows"], "train", "maskedrnn/keras_masked")
    value = results["ratios"]["train"]["maskedrnn/keras_masked"]
    assert f"maskedrnn/keras_masked = {value:.2f} [{low:.2f}, {high:.2f}]" in table


def test_timed_implementations_compute_the_masked_result(lstm_run):
    results, _ = lstm_run
    for row in results["rows"]:
        assert row["reference"] == "keras_masked"
        if row["impl"] in bench.CEILINGS:
            continue
        assert row["expected_to_match"]
        assert row["max_abs_diff"] < MATCH_ATOL, row
        if row["mode"] == "train":
            assert row["max_abs_grad_diff"] < MATCH_ATOL, row
            covers = "inputs" if row["impl"] in bench.TORCH_ONLY else "inputs+weights"
            assert row["grad_diff_covers"] == covers
        else:
            assert "max_abs_grad_diff" not in row
        if BACKEND == "torch" and row["impl"] in bench.OURS:
            # Second, independent oracle: PyTorch's packed bidirectional RNN.
            assert row["max_abs_diff_torch_packed"] < MATCH_ATOL
            if row["mode"] == "train":
                assert row["max_abs_grad_diff_torch_packed"] < MATCH_ATOL


def test_unmasked_ceilings_differ_on_padded_rows(lstm_run):
    results, _ = lstm_run
    ceilings = [r for r in results["rows"] if r["impl"] in bench.CEILINGS]
    assert ceilings
    for row in ceilings:
        assert not row["expected_to_match"]
        assert row["max_abs_diff"] > 1e-3, row
        if row["mode"] == "train":
            assert row["max_abs_grad_diff"] > 1e-3, row


def test_records_which_kernels_each_implementation_ran(lstm_run):
    """Ours never hands a mask to an RNN kernel (on a JAX CPU it calls none:
    its length tiers run); Keras' masked layer does
    (and its fused kernel declines it). The oracle for the recorder itself
    is that contrast, plus PyTorch's own modules calling none of them.
    Device-aware: on CUDA/GPU ours and Keras' unmasked layer must reach
    cuDNN, on a CPU nothing does (tests/test_bench_kernels.py drives the
    spies through Keras' cuDNN branches with a faked device)."""
    results, _ = lstm_run
    rows = by_case(results)
    for mode in ("train", "infer"):
        for name in ("maskedrnn", "maskedrnn_lengths"):
            row = rows[name, mode]
            if JAX_CPU:
                # JAX's length tiers: no Keras RNN function, no kernel.
                assert row["kernels"] == "no Keras RNN function or native kernel called"
                assert row["cudnn"] == "not called", row
                continue
            assert "with a mask" not in row["kernels"]
            assert all(c["mask"] in (None, False) for c in row["kernel_calls"])
            if BACKEND == "torch" and not GPU:
                assert row["kernels"] == "torch native kernel computed x2"
            elif BACKEND == "torch":
                # Both directions in one call of the one-call kernel (cuDNN).
                assert row["kernels"] == "torch one-call kernel (torch._VF) computed x1"
            elif TF_CPU:
                assert row["kernels"] == "tf BlockLSTMV2 kernel computed x2"
            else:
                assert "backend.lstm" in row["kernels"] and "no mask" in row["kernels"]
            assert row["cudnn"] == ("computed" if GPU_CUDNN else "not called"), row
        masked = rows["keras_masked", mode]
        assert "backend.lstm declined, with a mask x2" in masked["kernels"]
        assert "backend.rnn computed, with a mask x2" in masked["kernels"]
        assert masked["cudnn"] == "not called"
        unmasked = rows["keras_unmasked", mode]
        assert "with a mask" not in unmasked["kernels"]
        if BACKEND in ("torch", "jax"):
            # Keras 3.15 tries one fused bidirectional cuDNN call first.
            fused = "backend.bidirectional_lstm computed, no mask x1"
            declined = "backend.bidirectional_lstm declined, no mask x1"
            assert (fused if GPU_CUDNN else declined) in unmasked["kernels"]
            assert unmasked["cudnn"] == ("computed" if GPU_CUDNN else "not called")
        if BACKEND == "torch" and not GPU:
            assert "torch Python loop _fallback_lstm computed x2" in unmasked["kernels"]
        if BACKEND == "torch":
            for name in bench.TORCH_ONLY:
                assert rows[name, mode]["kernels"].startswith("no Keras RNN")
                assert rows[name, mode]["cudnn"] == "not called"
    table = bench.format_table(results)
    assert rows["keras_masked", "train"]["kernels"] in table
    assert "[cuDNN: not called]" in table


def test_table_lists_every_row_and_ratio(lstm_run, capsys):
    results, _ = lstm_run
    table = bench.format_table(results)
    lines = table.splitlines()
    for name in ALL_IMPLS:
        for mode in ("train", "infer"):
            assert any(line.split()[:2] == [mode, name] for line in lines)
    ratio = results["ratios"]["train"]["maskedrnn/keras_masked"]
    assert f"maskedrnn/keras_masked = {ratio:.2f}" in table


def test_plot_writes_a_png(lstm_run, tmp_path):
    pytest.importorskip("matplotlib")
    results, _ = lstm_run
    path = tmp_path / "bench.png"
    bench.plot(results, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_from_json_measures_nothing_and_prints_and_plots_the_file(
    lstm_run, tmp_path, capsys, monkeypatch
):
    """`--from-json FILE`: the table (and with `--plot` the chart) of a file
    written by `--json`, without running anything (the docs' plots come
    from the committed JSON this way)."""
    results, _ = lstm_run
    path = tmp_path / "run.json"
    path.write_text(json.dumps(results))
    monkeypatch.setattr(bench.cli, "run", lambda args: pytest.fail("it measured"))
    capsys.readouterr()
    argv = ["--from-json", str(path)]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--plot", str(tmp_path / "run.png")]
    assert bench.main(argv) == results
    assert capsys.readouterr().out.strip() == bench.format_table(results).strip()
    if "--plot" in argv:
        assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_fails_early_and_says_how(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    with pytest.raises(SystemExit, match="pip install matplotlib"):
        bench.main(TINY + QUICK + ["--plot", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_return_state_puts_the_final_states_into_the_checked_output(cell):
    """--return-state: the timed output includes the final states, so ours
    (and PyTorch's packed module, whose h_n/c_n are mapped to Keras' order)
    must match Keras' masked states too, and the ceilings' wrong states show."""
    results = bench.run(
        bench.build_parser().parse_args(
            TINY + QUICK + ["--cell", cell, "--return-state", "--lengths", "fixed:3"]
        )
    )
    assert results["config"]["return_state"] is True
    assert_rows_match_oracles(by_case(results))
    assert "with final states" in bench.format_table(results)


def test_states_enter_the_timed_output_at_every_step():
    """`_states_into_sequence` (numpy oracle): sequence + [fwd_k, bwd_k] for
    each state kind k, broadcast over time."""
    rng = np.random.default_rng(0)
    seq = rng.standard_normal((2, 3, 4)).astype("float32")
    h_f, c_f, h_b, c_b = (rng.standard_normal((2, 2)).astype("float32") for _ in "1234")
    tensors = [keras.ops.convert_to_tensor(a) for a in (seq, h_f, c_f, h_b, c_b)]
    got = bench.states_into_sequence(*tensors)
    states = np.concatenate([h_f, h_b], -1) + np.concatenate([c_f, c_b], -1)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(got), seq + states[:, None, :], rtol=1e-6
    )


def test_gru_subset_is_checked_against_an_untimed_reference(tmp_path):
    """--impl without keras_masked: the reference still runs (untimed), and
    the GRU path (and on torch the GRU weight conversion) is checked."""
    impls = ["maskedrnn", "keras_unmasked"]
    if BACKEND == "torch":
        impls.append("torch_packed")
    argv = TINY + QUICK + ["--cell", "gru", "--mode", "infer", "--impl", *impls]
    results = bench.main(argv + ["--lengths", "fixed:2"])
    rows = by_case(results)
    assert set(rows) == {(n, "infer") for n in impls}
    assert results["config"]["mean_length"] == 2
    for name in impls:
        diff = rows[name, "infer"]["max_abs_diff"]
        if name in bench.CEILINGS:
            assert diff > 1e-3
        else:
            assert diff < MATCH_ATOL
    assert set(results["ratios"]["infer"]) == {
        f"maskedrnn/{n}" for n in impls if n in bench.BASELINES
    }


@pytest.mark.parametrize(
    "spec, expected",
    [("full", [6, 6, 6, 6]), ("fixed:3", [3, 3, 3, 3]), ("fixed:6", [6] * 4)],
)
def test_parse_lengths_fixed(spec, expected):
    lengths = bench.parse_lengths(spec, batch=4, time=6)
    assert lengths.dtype == np.int32
    np.testing.assert_array_equal(lengths, expected)


def test_parse_lengths_uniform_bounds_and_seed():
    time = 100
    lengths = bench.parse_lengths("uniform:0.2", batch=5000, time=time, seed=3)
    # Oracle: integers uniform on [ceil(0.2 * 100), 100] = [20, 100].
    assert lengths.min() == 20 and lengths.max() == time
    assert abs(lengths.mean() - 60) < 1.0
    again = bench.parse_lengths("uniform:0.2", batch=5000, time=time, seed=3)
    np.testing.assert_array_equal(lengths, again)
    tiny = bench.parse_lengths("uniform:0.01", batch=200, time=10, seed=0)
    assert tiny.min() == 1  # never an empty row: PyTorch cannot pack it
    np.testing.assert_array_equal(
        bench.parse_lengths("uniform:1", batch=3, time=7), [7, 7, 7]
    )


@pytest.mark.parametrize(
    "spec", ["fixed:0", "fixed:7", "fixed:2.5", "uniform:0", "uniform:1.5", "zipf"]
)
def test_parse_lengths_rejects_bad_specs(spec):
    with pytest.raises(ValueError, match="--lengths"):
        bench.parse_lengths(spec, batch=4, time=6)


def test_bad_arguments_exit_with_the_argument_named():
    with pytest.raises(SystemExit, match="--lengths"):
        bench.main(TINY + QUICK + ["--lengths", "fixed:9"])
    with pytest.raises(SystemExit, match="--warmup must be >= 1"):
        bench.main(TINY + ["--warmup", "0", "--no-progress"])
    with pytest.raises(SystemExit, match="--batch must be >= 1"):
        bench.main(TINY + QUICK + ["--batch", "0"])
    with pytest.raises(SystemExit, match="--threads must be >= 1"):
        bench.main(TINY + QUICK + ["--threads", "0"])


@pytest.mark.skipif(BACKEND == "torch", reason="torch_* implementations run here")
def test_torch_implementations_need_the_torch_backend():
    with pytest.raises(SystemExit, match="only on the torch backend"):
        bench.main(TINY + QUICK + ["--impl", "maskedrnn", "torch_packed"])


@pytest.mark.skipif(BACKEND != "jax", reason="JAX-specific --threads rule")
def test_jax_threads_must_be_set_before_jax_starts():
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # JAX has started in this process
    with pytest.raises(SystemExit, match="XLA_FLAGS"):
        bench.main(TINY + QUICK + ["--threads", "1"])
    with pytest.raises(SystemExit, match="only --threads 1"):
        bench.main(TINY + QUICK + ["--threads", "2"])


def test_gpu_request_without_gpu_is_refused():
    if bench.gpu_available(BACKEND):
        pytest.skip("a GPU is visible to this backend")
    with pytest.raises(SystemExit, match="no GPU is visible"):
        bench.main(TINY + QUICK + ["--device", "gpu"])


def test_runs_as_a_module(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m maskedrnn.bench", "--help"])
    monkeypatch.delitem(sys.modules, "maskedrnn.bench")  # as a fresh `-m` run
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("maskedrnn.bench", run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--cell", "--lengths", "--impl", "--plot", "--json", "--preset"):
        assert option in out


def test_gpu_preset_is_the_reference_size():
    # B=64 T=100 D=512 U=512: the size of the H100 reference figures of
    # Keras' own layers (docs/benchmarks.md), so that GPU runs compare.
    gpu = bench.PRESETS["gpu"]
    assert [gpu[k] for k in ("batch", "time", "features", "units")] == [
        64,
        100,
        512,
        512,
    ]


# ------------------------------------------------ padding layouts (--padding)


def test_make_mask_puts_the_valid_steps_where_each_padding_says():
    lengths = np.array([3, 1, 5, 2])
    post = bench.make_mask(lengths, 5, "post")
    pre = bench.make_mask(lengths, 5, "pre")
    holes = bench.make_mask(lengths, 5, "holes", seed=1)
    # numpy oracle: post = a prefix, pre = a suffix (the reversed prefix).
    prefix = np.array([[j < n for j in range(5)] for n in lengths])
    np.testing.assert_array_equal(post, prefix)
    np.testing.assert_array_equal(pre, prefix[:, ::-1])
    np.testing.assert_array_equal(holes.sum(1), lengths)
    assert not np.array_equal(holes, post) and not np.array_equal(holes, pre)
    with pytest.raises(ValueError, match="padding must be one of"):
        bench.make_mask(lengths, 5, "middle")


def test_edge_mask_holds_every_padding_pattern_as_documented():
    mask = edge_mask()
    assert mask.shape == (6, 7) and mask.dtype == bool
    rows = ["".join("1" if v else "0" for v in row) for row in mask]
    assert rows == [
        "1111000",  # right-padded
        "0001111",  # left-padded
        "1010011",  # holes
        "0000000",  # all padding
        "1111111",  # full
        "1000000",  # one step
    ]
    assert edge_mask() is not mask  # a fresh array each call


def test_valid_first_permutation_moves_valid_steps_first_and_back():
    mask = bench.make_mask(np.array([2, 4, 1]), 6, "holes", seed=3)
    order, inverse = bench.valid_first_permutation(mask)
    steps = np.tile(np.arange(6), (3, 1))
    moved = np.take_along_axis(steps, order, 1)
    for row, n in enumerate(mask.sum(1)):
        # The valid steps, in their order, then the padded ones.
        np.testing.assert_array_equal(moved[row, :n], np.flatnonzero(mask[row]))
    np.testing.assert_array_equal(np.take_along_axis(moved, inverse, 1), steps)


@pytest.mark.parametrize("padding", ["pre", "holes"])
def test_pre_padding_and_holes_are_checked_like_post(padding):
    """--padding pre|holes: every exact implementation (on torch PyTorch's
    packed module too, which must gather the valid steps first and scatter
    them back) matches Keras' masked layer, the ceilings do not, and
    `lengths=` (right-padded rows only) is left out."""
    argv = TINY + QUICK + ["--padding", padding, "--return-state", "--mode", "train"]
    results = bench.main(argv)
    assert results["config"]["padding"] == padding
    impls = results["config"]["impls"]
    assert "maskedrnn_lengths" not in impls
    assert set(impls) == set(ALL_IMPLS) - {"maskedrnn_lengths"}
    for row in results["rows"]:
        if row["impl"] in bench.CEILINGS:
            assert row["max_abs_diff"] > 1e-3, row
            continue
        assert row["max_abs_diff"] < MATCH_ATOL, row
        if row["mode"] == "train":
            assert row["max_abs_grad_diff"] < MATCH_ATOL, row
    assert f"{padding}-padded" in bench.format_table(results)


def test_lengths_implementation_needs_post_padding():
    with pytest.raises(SystemExit, match="needs --padding post; got --padding pre"):
        bench.main(TINY + QUICK + ["--padding", "pre", "--impl", "maskedrnn_lengths"])


# ------------------------------------------------------- what the JSON records


def test_json_records_device_versions_spread_and_kernels(lstm_run):
    results, _ = lstm_run
    env = results["environment"]
    for key in ("python", "keras", "numpy", "maskedrnn", "device", "cpu_count"):
        assert env[key] not in (None, ""), key
    if BACKEND == "torch":
        import torch

        assert env["torch"] == torch.__version__
        assert "torch_cuda" in env
        if GPU:
            assert env["device"] == f"cuda: {torch.cuda.get_device_name(0)}"
            assert env["cuda_device_name"] == torch.cuda.get_device_name()
    elif BACKEND == "jax":
        import jax

        assert env["jax"] == jax.__version__ and env["jaxlib"]
        assert env["jax_devices"] == [
            f"{d.platform}: {d.device_kind}" for d in jax.devices()
        ]
    else:
        import tensorflow as tf

        assert env["tensorflow"] == tf.__version__
    if not GPU:
        assert env["device"] == "cpu"
    for row in results["rows"]:
        assert row["iqr_ms"] == pytest.approx(row["p75_ms"] - row["p25_ms"])
        assert row["cudnn"] in ("computed", "failed, fell back", "not called")
        assert bench.cudnn_verdict(row["kernel_calls"]) == row["cudnn"]


def test_thread_count_is_chosen_and_said(lstm_run, monkeypatch):
    results, _ = lstm_run
    config = results["config"]
    assert config["threads_note"] in bench.format_table(results)
    if BACKEND == "torch" and not GPU:
        # 1 intra-op thread on a CPU (or OMP_NUM_THREADS) unless --threads
        # says otherwise; the caller's own setting is put back afterwards.
        import torch

        from maskedrnn.backends.torch_threads import resolve_threads

        expected, source = resolve_threads(None)
        if source == "default for small models":
            assert expected == 1
        assert config["threads"] == expected
        assert f"{expected} intra-op thread(s) ({source})" in config["threads_note"]

        before = torch.get_num_threads()
        calls = []
        original = torch.set_num_threads
        monkeypatch.setattr(
            torch, "set_num_threads", lambda n: (calls.append(n), original(n))[1]
        )
        again = bench.run(
            bench.build_parser().parse_args(
                TINY + QUICK + ["--mode", "infer", "--impl", "maskedrnn"]
            )
        )
        assert again["config"]["threads"] == expected
        assert calls == [expected, before]  # set for the run, then put back
        assert torch.get_num_threads() == before
    else:
        assert config["threads"] is None
        assert "--threads" in config["threads_note"]


# The committed results (docs/results) are checked in tests/test_results.py.


def test_markdown_table_is_the_json_rounded(lstm_run):
    results, _ = lstm_run
    lines = bench.report.markdown_table(results).splitlines()
    assert len(lines) == 2 + len(results["rows"])
    rows = by_case(results)
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        mode = "train" if cells[0] == "fwd+bwd" else "infer"
        row = rows[cells[1].split("`")[1], mode]
        assert cells[2] == f"{row['median_ms']:.1f}"
        assert cells[3] == f"{row['p25_ms']:.1f}–{row['p75_ms']:.1f}"
        ours = rows["maskedrnn", mode]["median_ms"]
        assert cells[4] == f"{ours / row['median_ms']:.2f}"
        assert ("(ceiling)" in cells[1]) == (row["impl"] in bench.CEILINGS)


@pytest.mark.slow
def test_stacked_layers_are_checked_against_keras_and_pytorch():
    """--layers 2: two MaskedBidirectional layers against two Keras masked
    Bidirectional layers and, on torch, one nn.LSTM(num_layers=2) (its
    last layer's h_n/c_n against the last layer's states)."""
    argv = TINY + QUICK + ["--layers", "2", "--padding", "pre", "--return-state"]
    results = bench.main(argv + ["--mode", "train"])
    assert results["config"]["layers"] == 2
    rows = by_case(results)
    assert_rows_match_oracles(rows)
    ours = rows["maskedrnn", "train"]["kernels"]
    assert_state_layer_mask_use(ours, "lstm", directions=2)
    if BACKEND == "torch" and not GPU:
        assert ours == "torch native kernel computed x4"  # 2 layers x 2 directions
    if TF_CPU:
        assert ours == "tf BlockLSTMV2 kernel computed x4"
    masked = rows["keras_masked", "train"]["kernels"]
    assert "backend.rnn computed, with a mask x4" in masked
    assert "2 stacked layers" in bench.format_table(results)


def test_stacked_preset_is_the_gpu_size_with_two_layers():
    stacked, gpu = bench.PRESETS["stacked"], bench.PRESETS["gpu"]
    assert stacked["layers"] == 2 and gpu["layers"] == 1
    for key in ("batch", "time", "features", "units"):
        assert stacked[key] == gpu[key]


# `--cell`: the Keras layer and the PyTorch module the bench must compare.
CELL_NAMES = {
    "lstm": ("LSTM", "LSTM"),
    "gru": ("GRU", "GRU"),
    "rnn": ("SimpleRNN", "RNN"),
}


@pytest.mark.slow
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_unidirectional_layer_is_checked_against_keras_and_pytorch(cell):
    """--layer rnn: MaskedRNN against the Keras LSTM/GRU/SimpleRNN fed the
    mask (zero_output_for_mask=True, as PyTorch pads with zeros) and, on
    torch, nn.LSTM/GRU/RNN(bidirectional=False) packed; stacked, with holes
    and states."""
    argv = TINY + QUICK + ["--layer", "rnn", "--cell", cell, "--layers", "2"]
    results = bench.main(
        argv + ["--padding", "holes", "--return-state", "--mode", "train"]
    )
    assert results["config"]["layer"] == "rnn"
    rows = by_case(results)
    assert rows["maskedrnn", "train"]["label"] == "MaskedRNN, mask="
    keras_name, torch_name = CELL_NAMES[cell]
    assert rows["keras_masked", "train"]["label"] == f"keras {keras_name}, mask="
    if BACKEND == "torch":
        label = f"torch nn.{torch_name}, PackedSequence"
        assert rows["torch_packed", "train"]["label"] == label
    assert_rows_match_oracles(rows)
    ours = rows["maskedrnn", "train"]["kernels"]
    assert_state_layer_mask_use(ours, cell, directions=1)
    if BACKEND == "torch" and not GPU:
        assert ours == "torch native kernel computed x2"  # 2 layers, 1 direction
    if TF_CPU and cell == "lstm":
        assert ours == "tf BlockLSTMV2 kernel computed x2"
    masked = rows["keras_masked", "train"]["kernels"]
    assert "backend.rnn computed, with a mask x2" in masked
    assert "MaskedRNN" in bench.format_table(results)


def test_bench_runs_summary_counts_rounds_that_met_the_target():
    """`maskedrnn.bench.runs`' summary of repeated runs: median, lowest
    and highest ratio over the rounds, and in how many rounds the ratio
    rounded to 2 digits (as the docs' verdicts) met the target; numpy is
    the oracle, on made-up rounds. The docs' `bench-runs` tables are this
    summary (`maskedrnn.bench.docs_tables`, test above)."""
    from maskedrnn.bench import runs as module

    series = [0.996, 1.004, 1.006, 1.03, 0.97]  # 1.004 rounds to 1.00: met
    rounds = [
        {"x": {"ratios": {"infer": {"maskedrnn/keras_masked": v, "other": 2.0}}}}
        for v in series
    ]
    summary = module.summarize(rounds, ["x"], {"maskedrnn/keras_masked": 1.0})
    entry = summary["x"]["infer"]["maskedrnn/keras_masked"]
    assert entry["median"] == pytest.approx(np.median(series))
    assert (entry["min"], entry["max"]) == (0.97, 1.03)
    assert entry["rounds_met"] == 3 and entry["target"] == 1.0
    assert "rounds_met" not in summary["x"]["infer"]["other"]


def test_case_orders_time_every_case_once_a_repeat_and_repeat_per_seed():
    """Each repeat times every case once, in a new order; the same
    `--order-seed` gives the same orders (numpy's own permutations of that
    seed: what the runs before the option was added used, with seed 0) and
    another seed other orders."""
    from maskedrnn.bench import timing

    orders = timing.case_orders(6, 20, seed=0)
    assert len(orders) == 20
    for permutation in orders:
        assert sorted(permutation) == list(range(6))
    assert len({tuple(p) for p in orders}) > 1
    rng = np.random.default_rng(0)
    assert [list(p) for p in orders] == [list(rng.permutation(6)) for _ in range(20)]
    assert [list(p) for p in timing.case_orders(6, 20, seed=0)] == [
        list(p) for p in orders
    ]
    assert [list(p) for p in timing.case_orders(6, 20, seed=1)] != [
        list(p) for p in orders
    ]


def test_order_seed_option_orders_the_timing_and_is_recorded(monkeypatch, tmp_path):
    from maskedrnn.bench import timing

    seen = []
    real = timing.case_orders

    def spy(cases, repeats, seed=0):
        seen.append(seed)
        return real(cases, repeats, seed)

    monkeypatch.setattr(timing, "case_orders", spy)
    path = tmp_path / "r.json"
    impl = ["--impl", "keras_masked", "--mode", "infer"]
    order = ["--order-seed", "5", "--json", str(path)]
    bench.main(TINY + QUICK + FIRST_CALLS + impl + order)
    # The timing's orders, then the first calls' (their own seed after it).
    assert seen == [5, 6]
    with open(path) as f:
        assert json.load(f)["config"]["order_seed"] == 5


@pytest.mark.on_backends("torch")  # scripts and a stand-in bench: no backend
def test_bench_runs_gives_each_round_its_own_order_seed(tmp_path):
    """`python -m maskedrnn.bench.runs` end to end in an empty project
    folder, with a stand-in for `python -m maskedrnn.bench` (PYTHON, which
    `maskedrnn.bench.cpu` runs) that records its arguments and writes a
    result: round k runs the run's own options plus `--order-seed k`, the
    JSON records each round's seed and a Python probe per round, and the
    summary is over the rounds' ratios; `--same-order` runs every round
    with seed 0 (the control)."""
    import os
    import pathlib
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    (tmp_path / "docs" / "results").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "fake_python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "argv = sys.argv[1:]\n"
        f"open({str(calls)!r}, 'a').write(' '.join(argv) + '\\n')\n"
        "seed = int(argv[argv.index('--order-seed') + 1])\n"
        "rows = [{'impl': i, 'mode': 'infer', 'times_ms': [1.0 + 0.1 * seed] * 3}\n"
        "        for i in ('maskedrnn', 'keras_masked')]\n"
        "ratio = 1.0 + 0.01 * seed\n"
        "json.dump({'config': {'order_seed': seed},\n"
        "           'environment': {'load_average_1m': 0.5},\n"
        "           'ratios': {'infer': {'maskedrnn/keras_masked': ratio}},\n"
        "           'rows': rows}, open(argv[argv.index('--json') + 1], 'w'))\n"
    )
    fake.chmod(0o755)
    out = tmp_path / "runs.json"
    env = {**os.environ, "PYTHON": str(fake), "PYTHONPATH": str(root)}
    script = ["-m", "maskedrnn.bench.runs"]
    options = ["--rounds", "3", "--target", "maskedrnn/keras_masked=1.0"]
    subprocess.run(
        [sys.executable, *script, *options, "--out", str(out), "jax-rnn-gru"],
        check=True,
        env=env,
        cwd=tmp_path,
        capture_output=True,
    )
    lines = calls.read_text().splitlines()
    assert len(lines) == 3
    for k, line in enumerate(lines):
        assert line.startswith("-m maskedrnn.bench --layer rnn --batch 32 ")
        assert f"--cell gru --first-call-repeats 7 --order-seed {k} --json " in line
    runs = json.loads(out.read_text())
    assert [r["jax-rnn-gru"]["order_seed"] for r in runs["rounds"]] == [0, 1, 2]
    assert len(runs["python_probe_ms"]) == 3
    assert all(ms > 0 for ms in runs["python_probe_ms"])
    entry = runs["summary"]["jax-rnn-gru"]["infer"]["maskedrnn/keras_masked"]
    assert (entry["min"], entry["max"], entry["rounds_met"]) == (1.0, 1.02, 1)
    # The control: every round in the orders of --order-seed 0.
    subprocess.run(
        [sys.executable, *script, *options, "--out", str(out), "--same-order"]
        + ["jax-rnn-gru"],
        check=True,
        env=env,
        cwd=tmp_path,
        capture_output=True,
    )
    runs = json.loads(out.read_text())
    assert [r["jax-rnn-gru"]["order_seed"] for r in runs["rounds"]] == [0, 0, 0]
    assert calls.read_text().splitlines()[3:] == [lines[0]] * 3


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="a torch kernel")
def test_kernel_option_runs_the_one_call_kernel_for_torch_fused():
    """`--kernel torch-fused`: the forced row runs the one-call kernel (the
    kernel spies say so) and still matches Keras' masked layer."""
    impl = ["--impl", "maskedrnn", "keras_masked", "--mode", "train"]
    results = bench.main(TINY + QUICK + impl + ["--kernel", "torch-fused"])
    ours = [r for r in results["rows"] if r["impl"] == "maskedrnn:torch-fused"][0]
    assert ours["kernels"] == "torch one-call kernel (torch._VF) computed x1"
    assert ours["max_abs_diff"] < 1e-5
    assert results["config"]["kernels"] == ["torch-fused"]


def test_forced_kernels_are_timed_and_checked_and_declines_listed():
    """`--kernel`: ours again with each kernel forced (`maskedrnn.backends.force`),
    as rows `maskedrnn:KERNEL`, checked against Keras' masked layer like the
    others and in the ratios; a kernel the backend cannot run in a mode is
    listed under `declined`, not timed. `--slow-repeats` caps the rows in
    Keras' masked loop."""
    from maskedrnn import backends

    kernels = list(backends.current().KERNELS)
    results = bench.main(
        TINY
        + QUICK
        + ["--repeats", "3", "--impl", "maskedrnn", "keras_masked", "keras_unmasked"]
        + ["--kernel", *kernels, "--slow-repeats", "1"]
    )
    assert results["config"]["kernels"] == kernels
    rows = by_case(results)
    declined = {
        (d["impl"], d["mode"]): d["reason"] for d in results.get("declined", [])
    }
    for kernel in kernels:
        for mode in ("train", "infer"):
            name = f"maskedrnn:{kernel}"
            if (name, mode) in declined:
                assert f"{kernel!r} cannot run here" in declined[name, mode]
                assert "Arguments received" not in declined[name, mode]
                assert (name, mode) not in rows
                continue
            row = rows[name, mode]
            assert row["expected_to_match"] and row["max_abs_diff"] < 1e-5, row
            assert row.get("max_abs_grad_diff", 0) < 1e-4, row
            assert row["label"].endswith(f", forced {kernel}")
            slow = kernel == "keras-masked"
            assert len(row["times_ms"]) == (1 if slow else 3)
            assert f"{name}/keras_unmasked" in results["ratios"][mode]
    assert len(rows["keras_masked", "train"]["times_ms"]) == 1
    if BACKEND == "torch":
        # Gradients recorded: PyTorch's packed kernel is declined.
        assert ("maskedrnn:torch-packed", "train") in declined
        assert ("maskedrnn:torch-packed", "infer") in rows
    table = bench.format_table(results)
    assert all(f"declined: {m} {n}: " in table for n, m in declined)


def test_first_calls_are_in_the_json_and_in_their_ratios(lstm_run):
    """Every row has the median of its first calls (fresh steps, timed after
    the steady state), whose results are the warm step's; the first-call
    ratios are the ratios of those medians, for the same pairs as `ratios`."""
    results, _ = lstm_run
    config = results["config"]
    assert config["first_call_repeats"] == 3
    assert "new layers" in config["first_call_fresh"]
    rows = by_case(results)
    for row in results["rows"]:
        times = np.asarray(row["first_call_times_ms"])
        assert len(times) == 3 and np.all(times > 0)
        assert row["first_call_ms"] == pytest.approx(np.median(times))
        # The same computation as the checked warm step, on new layers.
        assert row["first_call_max_abs_diff"] < 1e-6, row
    for mode in ("train", "infer"):
        first = results["first_call_ratios"][mode]
        assert set(first) == set(results["ratios"][mode])
        for key, value in first.items():
            ours, base = key.split("/")
            expected = rows[ours, mode]["first_call_ms"] / rows[base, mode][
                "first_call_ms"
            ]
            assert value == pytest.approx(expected, rel=1e-12)
    table = bench.format_table(results)
    assert "first call ms" in table.splitlines()[3]
    value = results["first_call_ratios"]["train"]["maskedrnn/keras_masked"]
    assert f"first-call ratios (train): maskedrnn/keras_masked = {value:.2f}" in table
    lines = bench.report.markdown_table(results).splitlines()
    assert lines[0].endswith(" first call ms |")
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        mode = "train" if cells[0] == "fwd+bwd" else "infer"
        row = rows[cells[1].split("`")[1], mode]
        assert cells[7] == f"{row['first_call_ms']:.1f}"


def test_no_first_calls_leaves_the_json_as_before(tmp_path):
    """`--first-call-repeats 0` times no first call: no first-call keys, and
    the tables keep their columns (committed JSON without them still print)."""
    results = bench.main(
        TINY + QUICK + ["--impl", "maskedrnn", "--mode", "infer"]
        + ["--first-call-repeats", "0"]
    )
    assert results["config"]["first_call_repeats"] == 0
    assert "first_call_ratios" not in results
    assert all("first_call_ms" not in row for row in results["rows"])
    assert "first call" not in bench.report.markdown_table(results)
    with pytest.raises(SystemExit, match="--first-call-repeats must be >= 0"):
        bench.main(TINY + QUICK + ["--first-call-repeats", "-1"])


def _fresh_and_warm_steps(harness, mode):
    """A warm step of ours (called once: every trace and compilation at
    these shapes done) and a function that builds a fresh one, as
    `first_call.measure` does."""
    from maskedrnn.bench.layers import BenchLayers

    rng = np.random.default_rng(0)
    layers = BenchLayers("lstm", "bidirectional", 4, 3, 1, False, rng=rng)
    x = harness.tensor(rng.standard_normal((4, 6, 3)).astype("float32"))
    w = harness.tensor(rng.standard_normal((4, 6, 8)).astype("float32"))
    mask = harness.tensor(bench.make_mask(np.array([6, 3, 1, 5]), 6))
    warm = harness.keras_step(layers.ours_timed, mode, x, w, {"mask": mask})
    harness.block(warm())

    def fresh():
        again = BenchLayers("lstm", "bidirectional", 4, 3, 1, False, layers.weights)
        return harness.keras_step(again.ours_timed, mode, x, w, {"mask": mask})

    return warm, fresh


@pytest.mark.skipif(BACKEND != "jax", reason="XLA compilations: JAX")
@pytest.mark.parametrize("mode", ["train", "infer"])
def test_first_call_on_jax_compiles_anew_after_the_same_shapes(mode):
    """The first call of a fresh step compiles with XLA although the warm
    step compiled the same shapes before; its second call compiles nothing."""
    from maskedrnn.bench import harness_jax
    from tests.helpers import JaxCompiles

    harness = harness_jax.Harness(gpu=False)
    warm, fresh = _fresh_and_warm_steps(harness, mode)
    with JaxCompiles() as again:
        harness.block(warm())
    assert again.count == 0
    with harness.fresh_compilation():
        step = fresh()
        with JaxCompiles() as first:
            harness.block(step())
        with JaxCompiles() as second:
            harness.block(step())
    assert first.count >= 1 and second.count == 0


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function traces")
def test_first_call_on_tensorflow_retraces_module_level_functions():
    """maskedrnn's module-level tf.functions keep their traces across steps;
    inside `fresh_compilation` a fresh step traces new copies of them (with
    the same options), and the originals come back after."""
    from maskedrnn.bench import harness_tensorflow

    harness = harness_tensorflow.Harness(gpu=False)
    warm, fresh = _fresh_and_warm_steps(harness, "train")
    kept = harness.module_functions()
    before = {(m.__name__, n): f.experimental_get_tracing_count() for m, n, f in kept}
    with harness.fresh_compilation():
        copies = harness.module_functions()
        assert [n for _, n, _ in copies] == [n for _, n, _ in kept]
        for (_, _, copy), (_, _, original) in zip(copies, kept):
            assert copy is not original
            assert copy._reduce_retracing == original._reduce_retracing
        harness.block(fresh()())
    assert [f for _, _, f in harness.module_functions()] == [f for _, _, f in kept]
    # The fresh step reused no trace of the originals.
    after = {(m.__name__, n): f.experimental_get_tracing_count() for m, n, f in kept}
    assert after == before
