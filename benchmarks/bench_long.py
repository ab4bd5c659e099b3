"""Long contexts, measured before spans (issue 38): each method explaining the last 100 tokens of a long decoder-only
input, and every token of a 1,000-token generation, against the plain forward pass of the same input, with a growth
exponent fitted over the lengths.

Models are full-size with random weights (nothing is downloaded): a GPT-2-small-sized model (d_model 768, 12 layers,
12 heads, FFN 3072, learned positions for 4,096 tokens) and a Llama-style one of the same width (12 layers, 12 query
heads sharing 4 key/value heads (GQA), RoPE, SwiGLU FFN 2048, RMSNorm). An input of ``L`` tokens is a prompt of
``L - 100`` words and an answer of 100 words (the word tokenizer: one token a word); the method explains the answer's
100 tokens, each on its own, as it does today, and ``attn_lrp_span`` explains them as one quantity (their summed
logit) in one backward pass (:func:`~inseq_mixing.methods.attn_lrp.span_lrp_of_call`, equal to the sum of the
per-token relevances). The request is captured from a dataset run of that one
row and the method's ``run`` is timed alone (the traced forward pass and the method's math), the best of
``--repeats``, each method taking turns with the forward pass. On a CUDA device the peak of PyTorch's allocations
above what the model and the input hold is reported too.

    python benchmarks/bench_long.py [--models gpt2 llama] [--lengths 512 1024 2048 4096] [--methods alti_logit ...]
        [--generation 1000] [--repeats 2] [--device cuda]
"""

import argparse
import dataclasses
import math
import shutil
import tempfile
import time

import torch
import transformers
from bench_methods import device_arguments, synchronize

import inseq_mixing
from inseq_mixing.declarations import DECLARATIONS, Declaration
from inseq_mixing.methods.attn_lrp import span_lrp_of_call
from inseq_mixing.testing import WORDS, randomize_weights, word_tokenizer

METHODS = ["alti_logit", "attn_lrp_span", "decompx", "attn_lrp", "value_zeroing", "alti", "globenc",
           "attention_rollout"]  # fmt: skip
ANSWER = 100


def model_of(family: str, length: int, dtype: torch.dtype, device: str):
    """A full-size random model whose positions reach ``length`` tokens."""
    tokenizer = word_tokenizer(seq2seq=False)
    common = {"vocab_size": 50257, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=768, n_layer=12, n_head=12, n_inner=3072, n_positions=length, **common)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                          num_key_value_heads=4, intermediate_size=2048,
                                          max_position_embeddings=length, **common)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    config._attn_implementation = "eager"
    randomize_weights(model, 0, scale=0.1)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def words(count: int, seed: int) -> str:
    generator = torch.Generator().manual_seed(seed)
    return " ".join(WORDS[int(index)] for index in torch.randint(len(WORDS), (count,), generator=generator))


def captured_request(model, tokenizer, method: str, prompt_words: int, answer_words: int):
    """The request a dataset run of one row (a prompt and its forced answer) hands ``method``."""
    prompt = words(prompt_words, 1)
    row = {"source": prompt, "target": prompt + " " + words(answer_words, 2)}
    captured, run = [], Declaration.run

    def keep(self, request, options):
        captured.append((request, options))
        raise _Captured

    out = tempfile.mkdtemp(prefix="bench-long-")
    Declaration.run = keep
    try:
        inseq_mixing.attribute_dataset(model, method, [row], out, tokenizer=tokenizer, show_progress=False)
    except _Captured:
        pass
    finally:
        Declaration.run = run
        shutil.rmtree(out, ignore_errors=True)
    return captured[0]


class _Captured(Exception):
    """Stops the dataset run once its request is captured."""


def timed(function, device: str) -> tuple[float, int]:
    """Seconds and, on CUDA, the peak bytes allocated above what was allocated before the call."""
    synchronize(device)
    before = torch.cuda.memory_allocated() if device.startswith("cuda") else 0
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    function()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - before if device.startswith("cuda") else 0
    return seconds, peak


def measure(model, request, options, method: str, repeats: int, device: str) -> dict:
    """The best time of the method's run and of the plain forward pass of the same input, in turns
    (``attn_lrp_span``: the answer's 100 tokens as one quantity, one backward pass: :func:`span_lrp_of_call`)."""
    ids = request.input_ids if request.target_ids is None else request.target_ids
    if method == "attn_lrp_span":

        def run():
            span_lrp_of_call(request.spec, request.model_call(), request.predicted_ids, request.foil_ids,
                             request.positions, options.max_chunk_elements)  # fmt: skip
    else:

        def run():
            DECLARATIONS[method].run(dataclasses.replace(request), options)

    forward, runs, peaks = [], [], []
    for _ in range(repeats):
        with torch.no_grad():
            forward.append(timed(lambda: model(input_ids=ids), device)[0])
        seconds, peak = timed(run, device)
        runs.append(seconds)
        peaks.append(peak)
    return {"forward_s": min(forward), "method_s": min(runs), "peak_gb": max(peaks) / 2**30}


def exponent(lengths: list[int], seconds: list[float]) -> float:
    """The slope of log(time) over log(length): the fitted growth exponent."""
    xs, ys = [math.log(x) for x in lengths], [math.log(y) for y in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--generation", type=int, default=1000, help="tokens of the every-token case (0: skip)")
    parser.add_argument("--repeats", type=int, default=2)
    args = device_arguments(parser)
    torch.manual_seed(0)
    for family in args.models:
        model, tokenizer = model_of(family, max(args.lengths + [args.generation + 24]), args.torch_dtype, args.device)
        print(f"\n{family}: explaining the last {ANSWER} tokens of L (time / forward pass of the same input; peak GB "
              "above the model on CUDA)")  # fmt: skip
        print(f"{'method':>18} " + " ".join(f"{length:>22}" for length in args.lengths) + "   exponent")
        for method in args.methods:
            cells, times = [], []
            for length in args.lengths:
                try:
                    declared = "attn_lrp" if method == "attn_lrp_span" else method
                    request, options = captured_request(model, tokenizer, declared, length - ANSWER - 1, ANSWER)
                    found = measure(model, request, options, method, args.repeats, args.device)
                except torch.OutOfMemoryError:
                    cells.append(f"{'out of memory':>22}")
                    continue
                times.append((length, found["method_s"]))
                memory = f" {found['peak_gb']:.2f}GB" if args.device.startswith("cuda") else ""
                ratio = found["method_s"] / found["forward_s"]
                cells.append(f"{found['method_s']:8.2f}s {ratio:6.1f}x{memory}".rjust(22))
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            slope = exponent(*zip(*times, strict=True)) if len(times) > 1 else float("nan")
            print(f"{method:>18} " + " ".join(cells) + f"   {slope:8.2f}", flush=True)
        if args.generation and "alti_logit" in args.methods:
            request, options = captured_request(model, tokenizer, "alti_logit", 24, args.generation)
            found = measure(model, request, options, "alti_logit", args.repeats, args.device)
            print(f"every token of a {args.generation}-token generation after a 24-token prompt, alti_logit: "
                  f"{found['method_s']:.2f}s, {found['method_s'] / found['forward_s']:.1f}x the forward pass "
                  f"({found['forward_s']:.3f}s)", flush=True)  # fmt: skip
        del model


if __name__ == "__main__":
    main()
