"""Time the plugin's methods against Inseq's own on the same inputs, in one run, and print ratios; measure the peak
memory of a long input.

Models are full-size with random weights (nothing is downloaded): an opus-mt-sized Marian (d_model 512, 6+6 layers,
8 heads, FFN 2048), a T5-small-sized model (d_model 512, 6+6 layers, 8 heads, FFN 2048) and a GPT-2-small-sized model
(d_model 768, 12 layers, 12 heads, FFN 3072). Each input has N source and N target words (seq2seq), or N/2 prompt
words and N/2 generated words (decoder-only).

Usage:
    python benchmarks/bench_methods.py [--lengths 20 40 80] [--models marian t5 gpt2] [--methods ...]
        [--ig-max-length 40] [--device cuda] [--dtype bfloat16]
    python benchmarks/bench_methods.py --memory-tokens 1000 [--methods alti alti_logit value_zeroing] [--device cuda]

The second form runs each method through Inseq on a GPT-2-small-sized model with a prompt of that many tokens, each
in a fresh process, and prints its time and peak memory above the loaded model: resident memory on the CPU, memory
allocated by PyTorch on a CUDA device.
"""

import argparse
import logging
import random
import resource
import subprocess
import sys
import time
import warnings
from importlib.metadata import version

import inseq
import torch

import inseq_mixing  # registers the plugin's methods, renames the built-in value_zeroing
from inseq_mixing.testing import WORDS, is_seq2seq, tiny_model, word_tokenizer

FULL_SIZE = {
    "marian": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 58101},
    "t5": {"d_model": 512, "layers": 6, "heads": 8, "ffn": 2048, "vocab": 32128},
    "gpt2": {"d_model": 768, "layers": 12, "heads": 12, "ffn": 3072, "vocab": 50257},
}
DEFAULT_METHODS = ["value_zeroing", "alti", "alti_logit", "integrated_gradients", "deeplift", "inseq_value_zeroing"]


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


def device_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Add ``--device`` and ``--dtype``, parse, silence warnings and print what the run is on; ``args.torch_dtype``."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    args.torch_dtype = getattr(torch, args.dtype)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    versions = f"inseq {version('inseq')}, transformers {version('transformers')}"
    print(f"torch {torch.__version__}, {where}, {args.dtype}, {versions}")
    return args


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_forward(model, tokenizer, family: str, source: str, target: str, repeats: int = 3) -> float:
    if is_seq2seq(family):
        enc = model_inputs(tokenizer, source)
        dec = tokenizer(text_target=target, return_tensors="pt").input_ids
        dec = torch.cat([torch.zeros_like(dec[:, :1]), dec[:, :-1]], dim=1)
        kwargs = {**enc, "decoder_input_ids": dec}
    else:
        kwargs = model_inputs(tokenizer, target)
    kwargs = {name: value.to(model.device) for name, value in kwargs.items()}
    best = float("inf")
    with torch.no_grad():
        model(**kwargs, use_cache=False)  # warm-up (CUDA kernels, allocator)
        for _ in range(repeats):
            synchronize(str(model.device))
            start = time.perf_counter()
            model(**kwargs, use_cache=False)
            synchronize(str(model.device))
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
        device = model.device.type  # "cuda", as Inseq names it (it refuses "cuda:0")
        attribution_model = inseq.load_model(model, method, tokenizer=tokenizer, device=device)
        if device != "cpu":  # one untimed call: CUDA kernels load and the allocator warms up on the first
            attribution_model.attribute(source, target, attribute_target=is_seq2seq(family), show_progress=False)
        synchronize(device)
        start = time.perf_counter()
        attribution_model.attribute(source, target, attribute_target=is_seq2seq(family), show_progress=False)
        synchronize(device)
        return time.perf_counter() - start
    except Exception as error:  # report, don't hide: the built-in crashes on most families with transformers 5
        leftovers = drop_leftover_hooks(model)
        return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:60]} ({leftovers} hooks left on model)"


def print_ratios(results: dict) -> None:
    """Each baseline's time over each plugin method's time (how many times faster ours is)."""
    for ours in inseq_mixing.METHODS:
        if not isinstance(results.get(ours), float):
            continue
        ratios = [
            f"{method}/{ours} = {value / results[ours]:.1f}×"
            for method, value in results.items()
            if method not in inseq_mixing.METHODS and isinstance(value, float)
        ]
        if ratios:
            print(f"          {ours}: " + ", ".join(ratios))


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def peak_gb(device: str) -> float:
    """Peak resident memory of this process (CPU), or peak memory PyTorch allocated on the CUDA device."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return peak_rss_gb()


def memory_child(method: str, num_tokens: int, device: str, dtype: torch.dtype) -> None:
    """Run one method on a long prompt in this (fresh) process and print time and peak memory."""
    model = tiny_model("gpt2", **FULL_SIZE["gpt2"]).to(device=device, dtype=dtype)
    attribution_model = inseq.load_model(model, method, tokenizer=word_tokenizer(seq2seq=False), device=device)
    prompt = sentence(num_tokens - 2, 5)
    loaded = peak_gb(device)
    synchronize(device)
    start = time.perf_counter()
    attribution_model.attribute(prompt, prompt + " the end", show_progress=False)
    synchronize(device)
    elapsed = time.perf_counter() - start
    peak = peak_gb(device)
    print(f"{method:14} {num_tokens:>6} {elapsed:>8.1f}s {peak:>8.2f} GB {peak - loaded:>8.2f} GB")


def memory_report(methods: list[str], num_tokens: int, device: str, dtype: str) -> None:
    where = "peak RSS" if device == "cpu" else "peak alloc"
    print(f"GPT-2-small-sized model, {num_tokens}-token prompt, {device}, {dtype}, one fresh process per method")
    print(f"{'method':14} {'tokens':>6} {'time':>9} {where:>11} {'above model':>11}")
    for method in methods:
        command = [sys.executable, __file__, "--memory-child", method, str(num_tokens), "--device", device]
        command += ["--dtype", dtype]
        result = subprocess.run(command, capture_output=True, text=True)
        print(result.stdout.strip() or f"{method:14} fails: {result.stderr.strip().splitlines()[-1][:100]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40, 80])
    parser.add_argument("--models", nargs="+", default=list(FULL_SIZE), choices=list(FULL_SIZE))
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument(
        "--ig-max-length", type=int, default=None, help="skip integrated_gradients above this length (it is slow)"
    )
    parser.add_argument("--memory-tokens", type=int, default=None, help="measure peak memory at this prompt length")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    dtype = getattr(torch, args.dtype)
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]), args.device, dtype)
        return
    if args.memory_tokens:
        methods = [m for m in args.methods if m in inseq_mixing.METHODS] if args.methods != DEFAULT_METHODS else None
        memory_report(methods or list(inseq_mixing.METHODS), args.memory_tokens, args.device, args.dtype)
        return
    versions = f"inseq {version('inseq')}, transformers {version('transformers')}"
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}, {args.dtype}, {versions}")
    header = f"{'model':7} {'N':>4} {'forward':>9} " + " ".join(f"{m:>22}" for m in args.methods)
    print(header)
    for family in args.models:
        model = tiny_model(family, **FULL_SIZE[family]).to(device=args.device, dtype=dtype)
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
            print_ratios(results)
            failures = [f"{m}: {v}" for m, v in results.items() if isinstance(v, str)]
            for failure in failures:
                print(f"          {failure}")


if __name__ == "__main__":
    main()
