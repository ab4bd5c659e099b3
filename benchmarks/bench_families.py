"""The new families' cost over their own forward pass (issue 55): mixtures of experts (Mixtral, Qwen2-MoE with its
shared expert), DeepSeek-V3 (latent attention and a mixture), GPT-OSS (sinks, clamped experts), beside a dense Llama
of the same width, as a user meets them: ``model.attribute(prompt, prompt + answer)`` through Inseq (best of two
calls), against the forward pass the user runs (the model's default attention, SDPA, and transformers' default
experts kernel, ``grouped_mm``; best of three), in the same process. The ratios of each family are over its own
forward pass.

Models: random weights, ``d_model`` 256, 4 layers, 8 query heads (4 key/value heads; DeepSeek: 8, from one latent),
FFN 1,024 (a mixture: 4 experts of width 512, top-2); the word tokenizer (one token a word), a prompt of ``--length``
words and a 16-word answer.

    python benchmarks/bench_families.py [--families llama mixtral qwen2_moe deepseek_v3 gpt_oss] [--length 256]
        [--methods alti_logit decompx attn_lrp alti value_zeroing]
"""

import argparse
import json
import time

import torch

METHODS = ["alti_logit", "decompx", "attn_lrp", "alti", "value_zeroing"]
FAMILIES = ["llama", "mixtral", "qwen2_moe", "deepseek_v3", "gpt_oss"]


def best_of(function, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--length", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    import inseq

    import inseq_mixing  # noqa: F401  (registers the methods)
    from inseq_mixing.testing import WORDS, tiny_model, word_tokenizer

    tokenizer = word_tokenizer(seq2seq=False)
    words = [WORDS[index % 40] for index in range(args.length + 16)]
    prompt, text = " ".join(words[: args.length]), " ".join(words)
    rows = []
    for family in args.families:
        model = tiny_model(family, d_model=256, layers=4, heads=8, ffn=1024, attn_implementation="sdpa",
                           kv_heads=4, vocab=len(tokenizer))  # fmt: skip
        if hasattr(model, "set_experts_implementation") and family != "llama":
            model.set_experts_implementation("grouped_mm")  # transformers' default (the tiny test models loop)
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            forward = best_of(lambda model=model, ids=ids: model(ids))
        row = {"family": family, "tokens": int(ids.shape[1]), "forward_s": round(forward, 4)}
        for method in args.methods:
            loaded = inseq.load_model(model, method, tokenizer=tokenizer)
            elapsed = best_of(lambda loaded=loaded: loaded.attribute(prompt, text, show_progress=False), repeats=2)
            row[method] = round(elapsed / forward, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
