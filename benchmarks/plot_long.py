"""Draw the growth curves of ``bench_long.py``'s output files: time against length, log-log, one line per method and
one panel per model, with the plain forward pass of the same input (time / ratio), so a slope is a growth exponent.

    python benchmarks/plot_long.py results/cpu/bench_long_spans_gpt2.txt results/cpu/bench_long_spans_llama.txt
        [results/cpu/bench_long_spans_value_zeroing.txt] --out results/cpu/bench_long_growth.png
"""

import argparse
import re
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CELL = re.compile(r"([\d.]+)s\s+([\d.]+)x\s+(-?[\d.]+)GB")


def read(path: Path) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """Model → method → [(length, seconds, forward seconds)] from one output file."""
    found, model, lengths = {}, None, []
    for line in path.read_text().splitlines():
        if line.startswith(("gpt2:", "llama:")):
            model = line.split(":")[0]
            found.setdefault(model, {})
        elif line.strip().startswith("method"):
            lengths = [int(word) for word in line.split()[1:-1]]
        elif model and CELL.search(line):
            cells = CELL.findall(line)
            method = line.split()[0]
            found[model][method] = [(length, float(seconds), float(seconds) / float(ratio))
                                    for length, (seconds, ratio, _) in zip(lengths, cells, strict=False)]  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    merged: dict[str, dict] = {}
    for path in args.files:
        for model, methods in read(path).items():
            merged.setdefault(model, {}).update(methods)
    names = {"gpt2": "GPT-2-small-sized", "llama": "Llama-style (GQA)"}
    figure, axes = plt.subplots(1, len(merged), figsize=(6 * len(merged), 4.5), squeeze=False)
    for axis, (model, methods) in zip(axes[0], merged.items(), strict=True):
        forward = {}
        for method, points in methods.items():
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
            forward.update({length: seconds for length, _, seconds in points})
        lengths = sorted(forward)
        axis.plot(lengths, [forward[length] for length in lengths], "k--", label="forward pass")
        axis.set(xscale="log", yscale="log", xlabel="tokens", ylabel="seconds", title=names.get(model, model))
        axis.set_xticks(lengths, [f"{length:,}" for length in lengths])
        axis.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
