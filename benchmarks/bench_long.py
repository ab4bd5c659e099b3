"""Long contexts: each method explaining the last 100 tokens of a long decoder-only input token by token and as one
span, and every token of a 1,000-token generation, against the plain forward pass of the same input, with a growth
exponent fitted over the lengths.

Models are full-size with random weights (nothing is downloaded): a GPT-2-small-sized model (d_model 768, 12 layers,
12 heads, FFN 3072, learned positions for 4,096 tokens) and a Llama-style one of the same width (12 layers, 12 query
heads sharing 4 key/value heads (GQA), RoPE, SwiGLU FFN 2048, RMSNorm). An input of ``L`` tokens is a prompt of
``L - 100`` words and an answer of 100 words (the word tokenizer: one token a word). A method is named with how it
explains the answer: ``METHOD`` (its 100 tokens, each on its own, as ``model.attribute`` does without spans),
``METHOD:span`` (the 100 tokens as one quantity, :meth:`Declaration.run_spans`: AttnLRP's one backward pass, the
others' rows summed or averaged) or ``decompx:units`` (the span over 10 passages of the prompt plus the answer,
decomposed over those units from the first block: ``unit_components=True``). The request is captured from a dataset
run of that one row and the method's ``run`` is timed alone (the traced forward pass and the method's math), the best
of ``--repeats``, each method taking turns with the forward pass. The peak memory above what was held before the call
is reported: PyTorch's allocations on CUDA; on the CPU the process's resident high-water mark, reset before each call
(``/proc/self/clear_refs``, after ``malloc_trim`` gave freed memory back), so it counts what the call held at once,
the traced pass included.

    python benchmarks/bench_long.py [--models gpt2 llama] [--lengths 512 1024 2048 4096]
        [--methods alti_logit:span ...] [--generation 1000] [--repeats 2] [--device cuda]
"""

import argparse
import ctypes
import dataclasses
import math
import shutil
import tempfile
import time

import torch
import transformers
from bench_methods import device_arguments, process_status_gb, synchronize

import inseq_mixing
from inseq_mixing.declarations import DECLARATIONS, Declaration
from inseq_mixing.methods.spans import SpanRows
from inseq_mixing.methods.units import FrameUnits
from inseq_mixing.testing import WORDS, randomize_weights, word_tokenizer

METHODS = ["alti_logit", "alti_logit:span", "attn_lrp", "attn_lrp:span", "decompx", "decompx:span",
           "decompx:units", "value_zeroing", "value_zeroing:span", "alti", "alti:span", "globenc:span",
           "attention_rollout:span"]  # fmt: skip
ANSWER = 100
#: Passages of the prompt in ``decompx:units`` (equal runs of words; the answer is one more unit).
PASSAGES = 10


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


def timed(function, device: str) -> tuple[float, float]:
    """Seconds and the peak GB held above what was held before the call (CUDA: PyTorch's allocations; CPU: the
    resident high-water mark, reset before the call)."""
    synchronize(device)
    if device.startswith("cuda"):
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system: resident = what is alive
        with open("/proc/self/clear_refs", "w") as refs:  # the high-water mark starts again from the resident size
            refs.write("5")
        before = process_status_gb("VmRSS:") * 2**30
    start = time.perf_counter()
    function()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else process_status_gb("VmHWM:") * 2**30
    return seconds, (peak - before) / 2**30


def measure(model, request, options, name: str, repeats: int, device: str) -> dict:
    """The best time of the method's run and of the plain forward pass of the same input, in turns (see the module
    docstring for ``METHOD:span`` and ``decompx:units``)."""
    ids = request.input_ids if request.target_ids is None else request.target_ids
    method, _, mode = name.partition(":")
    declaration = DECLARATIONS[method]
    spans = SpanRows(request.positions.float()[:, None, :])
    if mode == "units":
        options = dataclasses.replace(options, unit_components=True)
        request = dataclasses.replace(request, units=passage_units(request))

    def run():
        fresh = dataclasses.replace(request)  # a request traces once: every repeat traces again
        if mode:
            declaration.run_spans(fresh, options, spans)
        else:
            declaration.run(fresh, options)

    forward, runs, peaks = [], [], []
    for _ in range(repeats):
        with torch.no_grad():
            forward.append(timed(lambda: model(input_ids=ids), device)[0])
        seconds, peak = timed(run, device)
        runs.append(seconds)
        peaks.append(peak)
    return {"forward_s": min(forward), "method_s": min(runs), "peak_gb": max(peaks)}


def profiled(model, request, options, name: str) -> str:
    """torch.profiler's table of the operators that took the most self CPU time in one more call of the method."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        measure(model, request, options, name, 1, "cpu")
    return profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)


def passage_units(request) -> FrameUnits:
    """The prompt cut into :data:`PASSAGES` equal runs of tokens, the answer one more unit."""
    length = request.input_ids.shape[1]
    prompt = length - ANSWER
    owner = torch.cat([torch.arange(prompt) * PASSAGES // prompt, torch.full((ANSWER,), PASSAGES)])
    members = torch.nn.functional.one_hot(owner, PASSAGES + 1).T[None].float()
    return FrameUnits(members.to(request.input_ids.device), "decoder")


def exponent(lengths: list[int], seconds: list[float]) -> float:
    """The slope of log(time) over log(length): the fitted growth exponent."""
    xs, ys = [math.log(x) for x in lengths], [math.log(y) for y in seconds]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


def trace_bytes(model, tokenizer, length: int) -> dict[str, float]:
    """GB of the tensors one trace of ``length`` tokens records, by kind (a memory profile of the maps' and
    ALTI-logit's input: what every method that reads a trace holds at once)."""
    from inseq_mixing.trace import trace_model

    ids = torch.tensor([tokenizer(words(length - 1, 1))["input_ids"]], device=next(model.parameters()).device)
    with torch.no_grad():
        trace = trace_model(model, ids, torch.ones_like(ids))
    sizes: dict[str, float] = {}

    def visit(value, name: str) -> None:
        if torch.is_tensor(value):
            sizes[name] = sizes.get(name, 0.0) + value.numel() * value.element_size() / 2**30
        elif dataclasses.is_dataclass(value):
            for item in dataclasses.fields(value):
                visit(getattr(value, item.name), item.name)
        elif isinstance(value, list | tuple):
            for entry in value:
                visit(entry, name)

    visit(trace.decoder, "decoder")
    return dict(sorted(sizes.items(), key=lambda entry: -entry[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=["gpt2", "llama"])
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--generation", type=int, default=1000, help="tokens of the every-token case (0: skip)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print torch.profiler's top operators (self CPU time) of each method's last call",
    )
    parser.add_argument("--trace-bytes", type=int, default=None, metavar="L",
                        help="print what one trace of L tokens records, by kind, and stop")  # fmt: skip
    args = device_arguments(parser)
    torch.manual_seed(0)
    if args.trace_bytes:
        for family in args.models:
            model, tokenizer = model_of(family, args.trace_bytes, args.torch_dtype, args.device)
            found = trace_bytes(model, tokenizer, args.trace_bytes)
            print(f"{family}, one trace of {args.trace_bytes} tokens: {sum(found.values()):.2f} GB: "
                  + ", ".join(f"{name} {size:.2f} GB" for name, size in found.items()))  # fmt: skip
        return
    for family in args.models:
        model, tokenizer = model_of(family, max(args.lengths + [args.generation + 24]), args.torch_dtype, args.device)
        print(f"\n{family}: explaining the last {ANSWER} tokens of L (time, time / forward pass of the same input, "
              "peak GB above what was held before)")  # fmt: skip
        print(f"{'method':>22} " + " ".join(f"{length:>24}" for length in args.lengths) + "   exponent")
        for method in args.methods:
            cells, times = [], []
            for length in args.lengths:
                try:
                    declared = method.partition(":")[0]
                    request, options = captured_request(model, tokenizer, declared, length - ANSWER - 1, ANSWER)
                    found = measure(model, request, options, method, args.repeats, args.device)
                    if args.profile:
                        print(f"{method} at {length} tokens:\n" + profiled(model, request, options, method))
                except torch.OutOfMemoryError:
                    cells.append(f"{'out of memory':>24}")
                    continue
                times.append((length, found["method_s"]))
                ratio = found["method_s"] / found["forward_s"]
                cells.append(f"{found['method_s']:7.2f}s {ratio:6.1f}x {found['peak_gb']:5.2f}GB".rjust(24))
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
            slope = exponent(*zip(*times, strict=True)) if len(times) > 1 else float("nan")
            print(f"{method:>22} " + " ".join(cells) + f"   {slope:8.2f}", flush=True)
        if args.generation and "alti_logit" in args.methods:
            request, options = captured_request(model, tokenizer, "alti_logit", 24, args.generation)
            found = measure(model, request, options, "alti_logit", args.repeats, args.device)
            print(f"every token of a {args.generation}-token generation after a 24-token prompt, alti_logit: "
                  f"{found['method_s']:.2f}s, {found['method_s'] / found['forward_s']:.1f}x the forward pass "
                  f"({found['forward_s']:.3f}s), {found['peak_gb']:.2f} GB", flush=True)  # fmt: skip
        del model


if __name__ == "__main__":
    main()
