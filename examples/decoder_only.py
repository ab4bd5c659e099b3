"""Decoder-only models: ALTI-logit and DecompX on a Llama-style model (random weights, local tokenizer).

With the hub, use e.g. ``inseq.load_model("gpt2", "decompx")`` instead.

    python examples/decoder_only.py
"""

import inseq

import inseq_mixing  # noqa: F401  (registers the plugin's methods inside Inseq)
from inseq_mixing.testing import tiny_model, word_tokenizer


def main() -> None:
    model = tiny_model("llama", d_model=64, layers=2, heads=4, ffn=128)
    tokenizer = word_tokenizer(seq2seq=False)
    prompt, continuation = "the cat sat", "the cat sat on the mat"
    for method in ("alti_logit", "decompx"):
        attribution_model = inseq.load_model(model, method, tokenizer=tokenizer)
        seq = attribution_model.attribute(prompt, continuation, show_progress=False).sequence_attributions[0]
        tokens = [token.token for token in seq.target]
        for column, position in enumerate(range(seq.attr_pos_start, len(tokens))):
            scores = seq.target_attributions[:position, column]
            top = int(scores.argmax())
            print(
                f"{method:>10}: {tokens[position]!r:8} logit {float(seq.step_scores['logit'][column]):6.2f}, "
                f"most positive context token {tokens[top]!r} ({float(scores[top]):.2f})"
            )


if __name__ == "__main__":
    main()
