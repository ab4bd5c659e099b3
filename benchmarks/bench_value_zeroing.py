"""Time value_zeroing against Inseq's own methods on the same inputs, in one run, and print ratios.

Models are full-size with random weights (nothing is downloaded): an opus-mt-sized Marian (d_model 512, 6+6 layers,
8 heads, FFN 2048), a T5-small-sized model (d_model 512, 6+6 layers, 8 heads, FFN 2048) and a GPT-2-small-sized model
(d_model 768, 12 layers, 12 heads, FFN 3072). Each input has N source and N target words (seq2seq), or N/2 prompt
words and N/2 generated words (decoder-only).

Usage:
    python benchmarks/bench_value_zeroing.py [--lengths 20 40 80] [--models marian t5 gpt2] [--methods ...]
        [--ig-max-length 40]
"""

import argparse
import logging
import random
import time
import warnings
from importlib.metadata import version

import inseq
import torch

import inseq_mixing  # noqa: F401  (registers value_zeroing, renames the built-in)
from inseq_mixing.testing import WORDS, is_seq2seq, tiny_model, word_tokenizer

FULL_SIZE = {
    "marian": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101},
    "t5": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 32128},
    "gpt2": {"d_model": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 50257},
}
DEFAULT_METHODS = ["value_zeroing", "integrated_gradients", "deeplift", "inseq_value_zeroing"]


def sentence(num_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def inputs_for(family: str, length: int) -> tuple[str, str]:
    if is_seq2seq(family):
        return sentence(length - 1, 1), sentence(length - 1, 2)  # + </s>
    prompt = sentence(length // 2, 3)
    return prompt, prompt + " " + sentence(length - length // 2, 4)


def model_inputs(tokenizer, text: str) -> dict:
    """Ids and mask only (transformers 4.x tokenizers also return token_type_ids, which these models refuse)."""
    encoded = tokenizer(text, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def time_forward(model, tokenizer, family: str, source: str, target: str, repeats: int = 3) -> float:
    if is_seq2seq(family):
        enc = model_inputs(tokenizer, source)
        dec = tokenizer(text_target=target, return_tensors="pt").input_ids
        dec = torch.cat([torch.zeros_like(dec[:, :1]), dec[:, :-1]], dim=1)
        kwargs = {**enc, "decoder_input_ids": dec}
    else:
        kwargs = model_inputs(tokenizer, target)
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            model(**kwargs, use_cache=False)
            best = min(best, time.perf_counter() - start)
    return best


def _defined_in_inseq(hook) -> bool:
    function = getattr(hook, "func", hook)
    return getattr(function, "__module__", "").startswith("inseq.")


def drop_leftover_hooks(model) -> int:
    """Remove the hooks a failed Inseq method left on the model (the built-in value zeroing does), and only those:
    transformers keeps hooks of its own for recording outputs."""
    dropped = 0
    for module in model.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            for key in [key for key, hook in hooks.items() if _defined_in_inseq(hook)]:
                del hooks[key]
                dropped += 1
    return dropped


def time_method(model, tokenizer, family: str, method: str, source: str, target: str) -> float | str:
    try:
        attribution_model = inseq.load_model(model, method, tokenizer=tokenizer)
        start = time.perf_counter()
        attribution_model.attribute(source, target, attribute_target=is_seq2seq(family), show_progress=False)
        return time.perf_counter() - start
    except Exception as error:  # report, don't hide: the built-in crashes on most families with transformers 5
        leftovers = drop_leftover_hooks(model)
        return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:60]} ({leftovers} hooks left on model)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40, 80])
    parser.add_argument("--models", nargs="+", default=list(FULL_SIZE), choices=list(FULL_SIZE))
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument(
        "--ig-max-length", type=int, default=None, help="skip integrated_gradients above this length (it is slow)"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    versions = f"inseq {version('inseq')}, transformers {version('transformers')}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {versions}")
    header = f"{'model':7} {'N':>4} {'forward':>9} " + " ".join(f"{m:>22}" for m in args.methods)
    print(header)
    for family in args.models:
        model = tiny_model(family, **FULL_SIZE[family])
        tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
        for length in args.lengths:
            source, target = inputs_for(family, length)
            forward = time_forward(model, tokenizer, family, source, target)
            results = {
                m: "skipped (--ig-max-length)"
                if m == "integrated_gradients" and args.ig_max_length and length > args.ig_max_length
                else time_method(model, tokenizer, family, m, source, target)
                for m in args.methods
            }
            cells = []
            for method in args.methods:
                value = results[method]
                cells.append(f"{value:>8.2f}s ({value / forward:>6.0f}×fw)" if isinstance(value, float) else "  n/a")
            print(f"{family:7} {length:>4} {forward * 1000:>7.1f}ms " + " ".join(f"{c:>22}" for c in cells))
            ours = results.get("value_zeroing")
            if isinstance(ours, float):
                ratios = [
                    f"{method}/value_zeroing = {value / ours:.1f}×"
                    for method, value in results.items()
                    if method != "value_zeroing" and isinstance(value, float)
                ]
                if ratios:
                    print("          ratios: " + ", ".join(ratios))
            failures = [f"{m}: {v}" for m, v in results.items() if isinstance(v, str)]
            for failure in failures:
                print(f"          {failure}")


if __name__ == "__main__":
    main()
