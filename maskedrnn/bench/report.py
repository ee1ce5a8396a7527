"""The benchmark's results as a text table, ratios, environment and a plot."""

import os
import platform
import sys

import keras
import numpy as np

from maskedrnn.bench.config import (
    BASELINES,
    CEILINGS,
    CELLS,
    OURS,
    REFERENCE,
    is_ours,
)


def ratios(rows, modes, key="median_ms"):
    """`{mode: {"ours/baseline": median ratio}}` for every pair timed (ours'
    forced kernels, `--kernel`, included: `"maskedrnn:KERNEL/baseline"`); `key`
    `"first_call_ms"`: the ratios of the first calls' medians."""
    median = {(r["impl"], r["mode"]): r[key] for r in rows if key in r}
    forced = [r["impl"] for r in rows if is_ours(r["impl"]) and r["impl"] not in OURS]
    result = {}
    for mode in modes:
        result[mode] = {}
        for ours in (*OURS, *dict.fromkeys(forced)):
            for base in BASELINES:
                if (ours, mode) in median and (base, mode) in median:
                    value = median[ours, mode] / median[base, mode]
                    result[mode][f"{ours}/{base}"] = value
    return result


def ratio_interval(rows, mode, pair, level=0.95, resamples=4000, seed=0):
    """A `level` confidence interval `(low, high)` of the ratio of medians
    `pair` (`"ours/baseline"`, as in `ratios`) in `mode`, from the run's own
    repeats: a paired bootstrap (`resamples` draws of the repeats, with
    replacement, the same repeats for both implementations, each draw's
    ratio of medians; the interval is their central `level` share).

    Each repeat timed every case once, in a new random order
    (`timing._time_all`), so the i-th times of two implementations were
    taken in the same round: drawing repeats, not single times, keeps what
    a round shares (a slow spell of the machine). Seeded: the same JSON
    gives the same interval. It says how far the ratio moves with this
    run's own noise, not with the drift between separate runs (other load,
    another process), which can be larger.

    Returns None when either implementation was not timed in `mode`.
    """
    ours_name, base_name = pair.split("/")
    times = {(r["impl"], r["mode"]): r.get("times_ms") for r in rows}
    ours, base = times.get((ours_name, mode)), times.get((base_name, mode))
    if not ours or not base or len(ours) != len(base):
        return None
    ours, base = np.asarray(ours), np.asarray(base)
    draws = np.random.default_rng(seed).integers(
        0, len(ours), size=(resamples, len(ours))
    )
    ratio = np.median(ours[draws], axis=1) / np.median(base[draws], axis=1)
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(ratio, [tail, 100 - tail])
    return float(low), float(high)


def environment(backend, harness):
    """Machine, device name and library versions (and the load average)."""
    import maskedrnn

    env = {
        "python": platform.python_version(),
        "maskedrnn": maskedrnn.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "device": harness.describe_device(),
        # Other work on the machine skews timings; worth knowing afterwards.
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    env.update(harness.versions())
    for other in ("tensorflow", "jax", "torch"):
        if other not in env and other in sys.modules:
            env[other] = sys.modules[other].__version__
    return env


def import_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(
            "--plot needs matplotlib, which is not installed: "
            "pip install matplotlib (or drop --plot)."
        ) from e
    return plt


def format_table(results):
    """The results as a text table (one line per implementation and mode)."""
    c = results["config"]
    padding = c.get("padding", "post")
    n = c.get("layers", 1)
    layers = f", {n} stacked layers" if n > 1 else ""
    lines = [
        f"backend {c['backend']} on {results['environment']['device']}, "
        f"{'' if c.get('layer', 'bidirectional') == 'bidirectional' else 'MaskedRNN, '}"
        f"{CELLS[c['cell']]['keras']}, B={c['batch']} T={c['time']} D={c['features']} "
        f"U={c['units']}{layers}, lengths {c['lengths']} "
        f"(mean {c['mean_length']:.1f}, "
        f"{100 * c['padding_fraction']:.0f}% padding, {padding}-padded)"
        f"{', with final states' if c.get('return_state') else ''}, median of "
        f"{c['repeats']} after {c['warmup']} warm-up",
    ]
    if c.get("threads_note"):
        lines.append(f"threads: {c['threads_note']}")
    lines.append("")
    width = max([19] + [len(r["impl"]) for r in results["rows"]])
    first = any("first_call_ms" in r for r in results["rows"])
    header = (
        f"{'mode':<6} {'implementation':<{width}} {'median ms':>10} {'IQR ms':>15} "
        f"{'ours/this':>9} {'max|d out|':>10} {'max|d grad|':>11}"
        + (f" {'first call ms':>13}" if first else "")
    )
    lines += [header, "-" * len(header)]
    median = {(r["impl"], r["mode"]): r["median_ms"] for r in results["rows"]}
    for r in results["rows"]:
        ours = median.get(("maskedrnn", r["mode"]))
        ratio = f"{ours / r['median_ms']:.2f}" if ours is not None else "-"
        grad = r.get("max_abs_grad_diff")
        flag = "" if r["expected_to_match"] else " *"
        lines.append(
            f"{r['mode']:<6} {r['impl']:<{width}} {r['median_ms']:>10.2f} "
            f"{r['p25_ms']:>7.2f}-{r['p75_ms']:<7.2f} {ratio:>9} "
            f"{r['max_abs_diff']:>10.1e} "
            f"{'-' if grad is None else f'{grad:.1e}':>11}"
            + (f" {r['first_call_ms']:>13.1f}" if "first_call_ms" in r else "")
            + flag
        )
    lines.append("")
    lines.append(
        f"max|d|: largest difference from {REFERENCE} on this data (outputs; "
        "input and, for Keras layouts, weight gradients)."
    )
    lines.append("* ceiling: runs over the padding, so its results are wrong.")
    for d in results.get("declined", []):
        lines.append(f"declined: {d['mode']} {d['impl']}: {d['reason']}")
    lines.append(
        "kernels (first call of each; Keras' backend RNN functions, cuDNN "
        "and fallback functions, torch's native kernels); did cuDNN compute:"
    )
    for r in results["rows"]:
        if "kernels" in r:
            cudnn = f" [cuDNN: {r['cudnn']}]" if "cudnn" in r else ""
            lines.append(f"  {r['mode']:<6} {r['impl']:<19} {r['kernels']}{cudnn}")
    profiled = [r for r in results["rows"] if "profile" in r]
    if profiled:
        lines.append(f"profile ({profiled[0]['profile']['tool']}):")
        lines.append(f"  {profiled[0]['profile']['note']}")
        for r in profiled if profiled[0]["profile"]["tool"] else []:
            p = r["profile"]
            if p["tool"] == "failed":
                lines.append(f"  {r['mode']:<6} {r['impl']:<19} {p['note']}")
                continue
            found = p["cuda_kernels"] or p["rnn_ops"]
            kind = "CUDA kernels" if p["cuda_kernels"] else "host RNN ops"
            names = ", ".join(f"{k['name']} x{k['count']}" for k in found)
            lines.append(
                f"  {r['mode']:<6} {r['impl']:<19} {kind}: {names or 'none'}"
            )
    for mode, values in results["ratios"].items():
        if values:
            parts = []
            for pair, value in values.items():
                interval = ratio_interval(results["rows"], mode, pair)
                spread = "" if interval is None else " [%.2f, %.2f]" % interval
                parts.append(f"{pair} = {value:.2f}{spread}")
            lines.append(f"ratios ({mode}): {', '.join(parts)}")
    lines.append(
        "[low, high]: 95% interval of the ratio from this run's repeats "
        "(paired bootstrap, maskedrnn.bench.report.ratio_interval)."
    )
    for mode, values in results.get("first_call_ratios", {}).items():
        if values:
            parts = [f"{pair} = {value:.2f}" for pair, value in values.items()]
            lines.append(f"first-call ratios ({mode}): {', '.join(parts)}")
    if first:
        lines.append(
            "first call: median of "
            f"{results['config'].get('first_call_repeats')} first calls, trace "
            f"and compilation included ({results['config'].get('first_call_fresh')})."
        )
    return "\n".join(lines)


def plot(results, path):
    """Writes a bar chart of the medians (one panel per mode) to `path`."""
    plt = import_pyplot()
    c = results["config"]
    modes = c["modes"]
    fig, axes = plt.subplots(
        1,
        len(modes),
        figsize=(5.5 * len(modes), 0.5 * len(c["impls"]) + 1.6),
        squeeze=False,
    )
    for ax, mode in zip(axes[0], modes):
        rows = [r for r in results["rows"] if r["mode"] == mode][::-1]
        values = [r["median_ms"] for r in rows]
        colors = [
            "tab:green"
            if r["impl"] in OURS
            else "tab:gray"
            if r["impl"] in CEILINGS
            else "tab:blue"
            for r in rows
        ]
        bars = ax.barh([r["impl"] for r in rows], values, color=colors)
        errors = [
            [r["median_ms"] - r["p25_ms"] for r in rows],
            [r["p75_ms"] - r["median_ms"] for r in rows],
        ]
        ax.errorbar(values, range(len(rows)), xerr=errors, fmt="none", color="k")
        for bar, row in zip(bars, rows):
            y = bar.get_y() + bar.get_height() / 2
            ax.text(row["p75_ms"], y, f"  {row['median_ms']:.1f}", va="center")
        title = "forward + backward" if mode == "train" else "forward"
        ax.set_title(f"{title} (median ms, IQR)", fontsize=10)
        ax.set_xlim(0, max(r["p75_ms"] for r in rows) * 1.3)
    fig.suptitle(
        f"{c['backend']} ({results['environment']['device']}), "
        f"{CELLS[c['cell']]['keras']} B={c['batch']} T={c['time']} D={c['features']} "
        f"U={c['units']}, lengths {c['lengths']}, {c.get('padding', 'post')}"
        "-padded  (gray: ceiling, wrong results)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(results):
    """The results as the Markdown table docs/benchmarks.md shows.

    One line per implementation and mode: median and IQR in ms, the median
    of `maskedrnn` divided by that row's (below 1: ours is faster), and the
    largest differences from `keras_masked`, and where the JSON has them
    the first calls' median (`first_call_ms`, trace and compilation
    included). Run
    `python -m maskedrnn.bench.report FILE.json` to print it for a JSON file
    written by `--json`.
    """
    median = {(r["impl"], r["mode"]): r["median_ms"] for r in results["rows"]}
    first = any("first_call_ms" in r for r in results["rows"])
    lines = [
        "| mode | implementation | median ms | IQR ms | maskedrnn ÷ this "
        "| max abs diff, outputs | max abs diff, gradients |"
        + (" first call ms |" if first else ""),
        "|---|---|---:|---:|---:|---:|---:|" + ("---:|" if first else ""),
    ]
    for r in results["rows"]:
        mode = "fwd+bwd" if r["mode"] == "train" else "fwd"
        name = f"`{r['impl']}`" + ("" if r["expected_to_match"] else " (ceiling)")
        ours = median.get(("maskedrnn", r["mode"]))
        ratio = f"{ours / r['median_ms']:.2f}" if ours is not None else "–"
        grad = r.get("max_abs_grad_diff")
        lines.append(
            f"| {mode} | {name} | {r['median_ms']:.1f} | "
            f"{r['p25_ms']:.1f}–{r['p75_ms']:.1f} | {ratio} | "
            f"{r['max_abs_diff']:.1e} | {'–' if grad is None else f'{grad:.1e}'} |"
            + (f" {r['first_call_ms']:.1f} |" if "first_call_ms" in r else "")
        )
    return "\n".join(lines)


if __name__ == "__main__":
    import json

    for path in sys.argv[1:]:
        with open(path) as f:
            print(markdown_table(json.load(f)))
