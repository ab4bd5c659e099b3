"""Per-layer context mixing on the embedded demo model: Value Zeroing and ALTI maps per layer, as figures.

python examples/per_layer_analysis.py [--out out/layers]
"""

import argparse
from pathlib import Path

import inseq

import inseq_mixing  # noqa: F401  (registers the plugin's methods inside Inseq)
from inseq_mixing.demo import demo_examples, load_demo_model
from inseq_mixing.views.figures import layer_figure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/layers")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model, tokenizer = load_demo_model()
    example = demo_examples(count=2)[1]  # a sentence with an attractor before the verb
    source, target = " ".join(example.source), " ".join(example.target)
    for method, options in (("value_zeroing", {"per_layer": True}), ("alti", {"per_layer": True})):
        attribution_model = inseq.load_model(model, method, tokenizer=tokenizer)
        seq = attribution_model.attribute(
            source, target, attribute_target=True, show_progress=False, **options
        ).sequence_attributions[0]
        generated = [token.token for token in seq.target[seq.attr_pos_start :]]
        for side, scores, rows in (
            ("source", seq.source_attributions, [token.token for token in seq.source]),
            ("target", seq.target_attributions, [token.token for token in seq.target]),
        ):
            figure = layer_figure(scores, rows, generated, title=f"{method}, {side}: one panel per layer")
            path = out / f"{method}_{side}.png"
            figure.savefig(path, dpi=100, bbox_inches="tight")
            print("written:", path)


if __name__ == "__main__":
    main()
