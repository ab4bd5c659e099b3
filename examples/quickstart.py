"""Quickstart: Value Zeroing, then ALTI-logit and DecompX, on a Marian translation model, with source and target
heatmaps.

Runs offline: the model is a small Marian built from a config with random weights and a local word-level tokenizer
(swap in ``inseq.load_model("Helsinki-NLP/opus-mt-en-fr", "value_zeroing")`` when you have the hub).

    python examples/quickstart.py [--out out/quickstart.html]
"""

import argparse
from pathlib import Path

import inseq

import inseq_mixing  # noqa: F401  (registers the plugin's methods inside Inseq)
from inseq_mixing.testing import tiny_model, word_tokenizer

SOURCE = "the books in the library were read by many people"
TARGET = "les livres dans la bibliothèque ont été lus par beaucoup de gens"


def logit_explanations(model) -> str:
    """ALTI-logit and DecompX: signed contributions that, with the returned extra terms, add up to the logit."""
    html = ""
    for method in ("alti_logit", "decompx"):
        attribution_model = inseq.load_model(model, method, tokenizer=word_tokenizer())
        out = attribution_model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False)
        seq = out.sequence_attributions[0]
        tokens = seq.source_attributions.sum(0) + seq.target_attributions.nansum(0)
        other = sum(score for name, score in seq.step_scores.items() if name != "logit")
        gap = (tokens + other - seq.step_scores["logit"]).abs().max()
        print(f"{method}: token scores + {sorted(set(seq.step_scores) - {'logit'})} = logit (max gap {gap:.1e})")
        html += f"<h2>{method}</h2>" + out.show(display=False, return_html=True)
    return html


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="out/quickstart.html")
    args = parser.parse_args()

    model = tiny_model("marian", d_model=64, layers=3, heads=4, ffn=128)
    attribution_model = inseq.load_model(model, "value_zeroing", tokenizer=word_tokenizer())
    # one map per layer (the default is one map: their mean)
    out = attribution_model.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False, per_layer=True)
    seq = out.sequence_attributions[0]
    print(f"source scores {tuple(seq.source_attributions.shape)} = (source tokens, generated tokens, layers)")
    print(f"target scores {tuple(seq.target_attributions.shape)} = (target tokens, generated tokens, layers)")
    print(f"encoder self scores {tuple(seq.sequence_scores['encoder_self_scores'].shape)}")

    last_layer = out.aggregate("mean", select_idx=-1).sequence_attributions[0]
    generated = [token.token for token in seq.target[seq.attr_pos_start :]]
    print("\nLast layer, source → each generated token (columns):")
    print(" " * 12 + " ".join(f"{token[:9]:>9}" for token in generated))
    for row, token in enumerate(seq.source):
        cells = " ".join(f"{value:9.3f}" for value in last_layer.source_attributions[row].tolist())
        print(f"{token.token[:11]:>11} {cells}")

    html = "<h2>value_zeroing (mean over layers)</h2>" + out.show(display=False, return_html=True)
    print()
    html += logit_explanations(model)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html, encoding="utf-8")
    print(f"\nHeatmaps written to {path}")


if __name__ == "__main__":
    main()
