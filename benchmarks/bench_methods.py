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
        [--memory-path attribute dataset] [--live]

The second form measures what a user meets, each method in a fresh process on a GPT-2-small-sized model: a prompt of
that many tokens (the words "the cat sat on the mat" repeated) explained at one token after it, through
``model.attribute`` (Inseq's path) or through ``attribute_dataset`` (two such rows, one per batch, into a store). On
the CPU it reports the process's resident memory just before the call (``VmRSS``, the loaded model) and its high-water
mark after it (``VmHWM``): the peak above the loaded model is what can get the process killed. With ``--live`` it
also reports the peak of the memory PyTorch's allocations keep alive (torch.profiler's CPU memory events, on the
same, first call: its time is then the profiled one), so that what the allocator holds on top of it shows. On a
CUDA device it reports PyTorch's peak allocation. The high-water mark is reset just before the call (Linux), so the
model loading's own transient is not counted.
"""

import argparse
import logging
import random
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


def process_status_gb(key: str) -> float:
    """A ``/proc/self/status`` entry (``VmRSS:``, ``VmHWM:``) in GB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key):
                return int(line.split()[1]) / 2**20
    raise KeyError(key)


def reset_high_water_mark() -> None:
    """Set ``VmHWM`` to the current ``VmRSS`` (Linux 4.0+: ``5`` written to ``/proc/self/clear_refs``), so that the
    high-water mark after a call is the call's own peak, not the model loading's transient; without it, ``VmHWM``
    keeps that transient (the measurement is then an upper bound)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def long_prompt(num_tokens: int) -> str:
    """About ``num_tokens`` tokens of the word tokenizer: the issue's prompt ("the cat sat on the mat", repeated)."""
    return " ".join(["the", "cat", "sat", "on", "the", "mat"] * (num_tokens // 6))


def live_peak_gb(run) -> tuple[float, float]:
    """``run()`` under torch.profiler's CPU memory events: the peak of the bytes its allocations keep alive, and the
    time (profiled)."""
    activity = torch.profiler.ProfilerActivity.CPU
    start = time.perf_counter()
    with torch.profiler.profile(activities=[activity], profile_memory=True) as profile:
        run()
    elapsed = time.perf_counter() - start
    running = peak = 0
    events = sorted((event.start_ns(), event.nbytes()) for event in profile.profiler.kineto_results.events()
                    if event.name() == "[memory]")  # fmt: skip
    for _, nbytes in events:
        running += nbytes
        peak = max(peak, running)
    return peak / 2**30, elapsed


def memory_child(method: str, num_tokens: int, device: str, dtype: torch.dtype, path: str, live: bool) -> None:
    """Run one method on a long prompt in this (fresh) process and print time and peak memory."""
    import tempfile

    from transformers import GPT2Config, GPT2LMHeadModel

    size = FULL_SIZE["gpt2"]  # the issue's model: GPT-2 small's shapes, transformers' own initialisation
    config = GPT2Config(n_embd=size["d_model"], n_layer=size["layers"], n_head=size["heads"], n_inner=size["ffn"],
                        vocab_size=size["vocab"], n_positions=max(1024, num_tokens + 8))  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval().to(device=device, dtype=dtype)
    attribution_model = inseq.load_model(model, method, tokenizer=word_tokenizer(seq2seq=False), device=device)
    prompt = long_prompt(num_tokens)
    target = prompt + " mat"
    folder = tempfile.mkdtemp()

    def run():
        if path == "attribute":
            attribution_model.attribute(prompt, target, show_progress=False)
        else:
            rows = [{"id": str(row), "source": prompt, "target": target} for row in range(2)]
            inseq_mixing.attribute_dataset(attribution_model, method, rows, f"{folder}/run{time.time_ns()}",
                                           batch_size=1, show_progress=False)  # fmt: skip

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        loaded = torch.cuda.memory_allocated() / 2**30
    else:
        reset_high_water_mark()
        loaded = process_status_gb("VmRSS:")
    synchronize(device)
    start = time.perf_counter()
    profiled = live and not device.startswith("cuda")
    alive = live_peak_gb(run)[0] if profiled else None  # the first call, as a user's is: nothing warmed up
    synchronize(device)
    elapsed = time.perf_counter() - start
    if not profiled:
        run()
        synchronize(device)
        elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else process_status_gb("VmHWM:")
    line = f"{method:14} {path:9} {num_tokens:>6} {elapsed:>8.1f}s {loaded:>8.2f} GB {peak:>8.2f} GB"
    line += f" {peak - loaded:>8.2f} GB" + (f" {alive:>8.2f} GB (time profiled)" if profiled else "")
    print(line)


def memory_report(methods: list[str], num_tokens: int, device: str, dtype: str, paths: list[str], live: bool) -> None:
    before, after = ("VmRSS", "VmHWM") if device == "cpu" else ("alloc", "peak alloc")
    print(f"GPT-2-small-sized model, {num_tokens}-token prompt, one token explained, {device}, {dtype}, "
          f"{torch.get_num_threads()} threads, one fresh process per method and path")  # fmt: skip
    header = f"{'method':14} {'path':9} {'tokens':>6} {'time':>9} {before:>11} {after:>11} {'above model':>11}"
    print(header + (f" {'live peak':>11}" if live else ""))
    for path in paths:
        for method in methods:
            command = [sys.executable, __file__, "--memory-child", method, str(num_tokens), "--device", device,
                       "--dtype", dtype, "--memory-path", path] + (["--live"] if live else [])  # fmt: skip
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
    parser.add_argument("--memory-tokens", type=int, nargs="+", default=None,
                        help="measure peak memory at these prompt lengths")  # fmt: skip
    parser.add_argument("--memory-path", nargs="+", default=["attribute"], choices=["attribute", "dataset"],
                        help="model.attribute on one long input, or a dataset run of two")  # fmt: skip
    parser.add_argument("--live", action="store_true", help="also profile the peak of live allocations (CPU)")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    dtype = getattr(torch, args.dtype)
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]), args.device, dtype, args.memory_path[0],
                     args.live)  # fmt: skip
        return
    if args.memory_tokens:
        methods = [m for m in args.methods if m in inseq_mixing.METHODS] if args.methods != DEFAULT_METHODS else None
        for tokens in args.memory_tokens:
            memory_report(methods or list(inseq_mixing.METHODS), tokens, args.device, args.dtype, args.memory_path,
                          args.live)  # fmt: skip
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
