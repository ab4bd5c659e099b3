"""How close each method is to its arithmetic: time of a batch over the time of the same batch's plain forward pass
(LM head included), and FLOPs over the floor (the matrix arithmetic the method's definition needs), in one run.

Models are full-size with random weights (nothing is downloaded): a GPT-2-small-sized model (d_model 768, 12 layers,
vocabulary 50,257) and an opus-mt-sized Marian (d_model 512, 6+6 layers, vocabulary 58,101). Examples have 20 words
(GPT-2: a 10-word prompt and its 10-word continuation; Marian: 20-word source and target), as a dataset run reads
them. For each batch size the batch goes once through ``inseq_mixing.attribute_dataset`` (the ``run`` column: Inseq,
tokenization and the Parquet store included, the run's manifest left out: it is made once per run and fingerprints the
model's weights, 0.2–0.5 s here); the method's own request is kept from that run and timed alone
(``method``: the traced forward pass and the method's math, what the method costs whatever the front end). FLOPs are
torch's ``FlopCounterMode`` counts (matrix products only; elementwise work is not counted).

The floor (see :func:`floor_flops`) is the forward pass without the LM head, the explained tokens' logits, and the
products each definition needs on the real tokens: only the explained rows where nothing else reads the others, the
causal half of every causal map. Usage:

    python benchmarks/bench_floor.py [--models gpt2 marian] [--batch-sizes 1 16] [--methods alti_logit ...]
        [--repeats 3] [--compile] [--device cuda] [--dtype bfloat16]
"""

import argparse
import dataclasses
import shutil
import tempfile
import time

import inseq
import torch
from bench_datasets import examples  # the benchmarks folder is on sys.path when run as a script
from bench_methods import FULL_SIZE, device_arguments, synchronize
from torch.utils.flop_counter import FlopCounterMode

import inseq_mixing
from inseq_mixing.declarations import Declaration
from inseq_mixing.runs import runner
from inseq_mixing.testing import is_seq2seq, tiny_model, word_tokenizer


def capture_requests(model, method: str, rows: list[dict], **options) -> list:
    """The requests a dataset run of ``rows`` (one batch) hands the method, and the run's time without its manifest
    (made once per run, whatever its number of batches: mostly the fingerprint of the model's weights)."""
    captured, run, manifest = [], Declaration.run, runner.build_manifest
    manifest_time = []

    def keep(self, request, options):
        captured.append((request, options))
        return run(self, request, options)

    def timed_manifest(*args, **kwargs):
        start = time.perf_counter()
        try:
            return manifest(*args, **kwargs)
        finally:
            manifest_time.append(time.perf_counter() - start)

    out = tempfile.mkdtemp(prefix="bench-floor-")
    Declaration.run, runner.build_manifest = keep, timed_manifest
    try:
        start = time.perf_counter()
        inseq_mixing.attribute_dataset(model, method, rows, out, batch_size=len(rows), show_progress=False, **options)
        return captured, time.perf_counter() - start - sum(manifest_time)
    finally:
        Declaration.run, runner.build_manifest = run, manifest
        shutil.rmtree(out, ignore_errors=True)


def fresh(request):
    """The same request with its trace not yet computed (the trace is part of what is timed)."""
    return dataclasses.replace(request)


def best_times(functions: list, repeats: int, device: str) -> list[float]:
    """The best of ``repeats`` timings of each function, the functions taking turns (so that a slow spell of the
    machine falls on all of them)."""
    times = [[] for _ in functions]
    for _ in range(repeats):
        for function, timings in zip(functions, times, strict=True):
            synchronize(device)
            start = time.perf_counter()
            function()
            synchronize(device)
            timings.append(time.perf_counter() - start)
    return [min(timings) for timings in times]


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


def causal_triples(n: int) -> int:
    """Triples ``k <= j <= i < n``: a causal map applied to a causal map."""
    return n * (n + 1) * (n + 2) // 6


@dataclasses.dataclass
class Shape:
    """Per sentence of a batch: real decoder length, the explained positions, real source length (seq2seq)."""

    n: int
    explained: list[int]
    s: int = 0


def kept_positions(request, model, rows: list[dict]) -> torch.Tensor:
    """``(B, T)``: the positions whose rows a dataset run keeps (decoder-only: those predicting a generated token;
    the examples' prompts all have the same number of tokens), whatever the method was asked to compute."""
    mask = request.decoder_mask.bool()
    if request.target_ids is not None:
        return request.positions.bool()
    (prompt,) = {model.encode(row["source"]).input_ids.shape[1] for row in rows}
    return mask & (torch.arange(mask.shape[1], device=mask.device) >= prompt - 1)


def shapes(request, positions: torch.Tensor) -> list[Shape]:
    mask = request.decoder_mask.bool().cpu()
    positions = positions.bool().cpu()
    source = request.attention_mask.bool().cpu() if request.target_ids is not None else None
    rows = []
    for idx in range(mask.shape[0]):
        real = mask[idx].nonzero().flatten()
        first = int(real[0])  # left padding: positions count from the first real token
        explained = [int(p) - first for p in positions[idx].nonzero().flatten()]
        rows.append(Shape(len(real), explained, 0 if source is None else int(source[idx].sum())))
    return rows


def floor_flops(method: str, request, body_flops: int, kept: torch.Tensor) -> int:
    """The matrix arithmetic ``method``'s definition needs on the request's real tokens, explaining the ``kept``
    positions (2 FLOPs a multiply-add).

    Terms, per sentence and layer (``n`` real decoder tokens, ``k`` explained, ``P`` the pairs ``(i, j <= i)`` of
    explained rows ``i``, ``s`` source tokens):

    * every method: the forward pass without the LM head (``body_flops``, counted) and the explained logits (``k D``);
    * ``alti_logit``: value vectors through ``W_O`` per head (``n D²``); ALTI's transformed vectors of every causal
      pair for the layers below the last (``H D`` each); the logit direction through ``W_O`` (``k D²``) and its parts
      on the pairs of explained rows (``P D``); the rollout of the layers below the last (``n³/6`` each); the explained
      rows' parts times the rollout below (``Σ_t (t+1)(t+2)/2``). Marian adds the encoder's maps and rollout, the
      cross-attention's maps and parts over ``n s`` pairs, and the source columns of the decoder rollout.
    * ``value_zeroing`` (maps of the explained rows; the paper's default, no rollout): per pair of an explained row,
      the value part ``H D`` and the rest of the block on the corrupted row (GPT-2: the FFN, ``2 D F``; Marian: the
      cross-attention re-run ``2 D² + 2 s D`` and the FFN); Marian's cross zeroings (``k s`` rows: part and FFN) and
      encoder zeroings (``s²`` rows).
    * ``decompx`` (causal components): per causal pair the component through the value and output projections
      (``2 D²``) and the FFN (``2 D F``), per causal triple the attention mix (``D``); the explained rows' components
      on the logit direction (``P D``). Marian adds the encoder's ``s²`` components per layer (and ``s³/2`` mixes) and
      the decoder's source components (``n s`` per layer through value/output projections and FFN).
    """
    spec = request.spec
    config = request.model.config
    d = config.hidden_size if hasattr(config, "hidden_size") else config.d_model
    heads = spec.decoder.layers[0].self_attn.num_heads
    ffn = getattr(config, "n_inner", None) or getattr(config, "decoder_ffn_dim", None) or 4 * d
    layers = len(spec.decoder.layers)
    enc_layers = 0 if spec.encoder is None else len(spec.encoder.layers)
    total = body_flops
    for row in shapes(request, kept):
        n, k, s = row.n, len(row.explained), row.s
        pairs = sum(t + 1 for t in row.explained)
        rolled = sum((t + 1) * (t + 2) // 2 for t in row.explained)
        macs = k * d
        if method == "alti_logit":
            macs += layers * (n * d * d + k * d * d + pairs * d)
            macs += (layers - 1) * (causal_pairs(n) * heads * d + causal_triples(n)) + layers * rolled
            if s:
                macs += enc_layers * (s * d * d + s * s * heads * d) + (enc_layers - 1) * s**3
                macs += layers * (s * d * d + k * d * d + k * s * d)  # cross-attention values and parts
                macs += (layers - 1) * (n * s * heads * d + n * n * s) + layers * k * n * s  # source columns
        elif method == "value_zeroing":
            rest = 2 * d * ffn + (2 * d * d + 2 * s * d if s else 0)
            macs += layers * (n * d * d + pairs * (heads * d + rest))
            if s:
                macs += layers * (s * d * d + k * s * (heads * d + 2 * d * ffn))
                macs += enc_layers * (s * d * d + s * s * (heads * d + 2 * d * ffn))
        elif method == "decompx":
            macs += layers * (causal_pairs(n) * (2 * d * d + 2 * d * ffn) + causal_triples(n) * d) + pairs * d
            if s:
                macs += enc_layers * (s * s * (2 * d * d + 2 * d * ffn) + s**3 * d)
                macs += layers * (n * s * (2 * d * d + 2 * d * ffn) + n * s * s * d + n * n * s * d // 2)
        else:
            raise ValueError(f"No floor written for {method!r}.")
        total += 2 * macs
    return total


def head_flops(request) -> int:
    """The LM head over every position of the padded batch (what a plain forward pass computes)."""
    batch, length = request.decoder_mask.shape
    weight = request.spec.lm_head.weight
    return 2 * batch * length * weight.shape[0] * weight.shape[1]


def measure(
    hf_model, tokenizer, family: str, method: str, batch_size: int, repeats: int, device: str, compile_: bool
) -> str:
    """One table line: the batch's forward pass, the method's request alone and the dataset run; FLOPs and floor;
    with ``compile_``, the request with ``compile=True`` too (timed in turn with the others) and the time its first
    call spent compiling (once per process and kernel: later lines reuse the kernels)."""
    model = inseq.load_model(hf_model, method, tokenizer=tokenizer, device=device)
    rows = examples(family, batch_size)
    capture_requests(model, method, rows)  # warm-up
    captured, run_time = capture_requests(model, method, rows)
    ((request, options),) = captured
    declaration = model.attribution_method.declaration
    call = fresh(request).trace.call
    offered = compile_ and "compile" in declaration.option_names()
    compiled = dataclasses.replace(options, compile=True) if offered else None

    def forward():
        with torch.no_grad():
            hf_model(**call.kwargs)

    def attribute(chosen=options):
        declaration.run(fresh(request), chosen)

    functions = [forward, attribute]
    if compiled is not None:
        start = time.perf_counter()
        attribute(compiled)
        first_compiled = time.perf_counter() - start
        functions.append(lambda: attribute(compiled))
    forward_time, method_time, *compiled_time = best_times(functions, repeats, device)
    flops = counted_flops(attribute)
    floor = floor_flops(
        method, request, counted_flops(forward) - head_flops(request), kept_positions(request, model, rows)
    )
    line = (
        f"{family:7} {batch_size:5d} {method:14} {forward_time * 1e3:7.0f}ms {method_time:8.2f}s "
        f"{method_time / forward_time:5.1f}× {run_time:7.2f}s {run_time / forward_time:5.1f}× "
        f"{flops / 1e9:8.1f} {floor / 1e9:8.1f} {flops / floor:6.2f}× {method_time / batch_size * 1e3:7.0f}"
    )
    if compiled_time:
        (best,) = compiled_time
        line += f" {best:8.2f}s {best / forward_time:5.1f}× {first_compiled - best:6.1f}s"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2", "marian"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--methods", nargs="+", default=["alti_logit", "value_zeroing", "decompx"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time the methods with compile=True")
    args = device_arguments(parser)
    header = f"{'model':7} {'batch':>5} {'method':14} {'forward':>9} {'method':>9} {'×fwd':>6} {'run':>8} {'×fwd':>6}"
    header += f" {'GFLOP':>8} {'floor':>8} {'×floor':>7} {'ms/ex':>7}"
    print(header + (f" {'compiled':>9} {'×fwd':>6} {'compiling':>9}" if args.compile else ""))
    for family in args.models:
        tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
        hf_model = tiny_model(family, **FULL_SIZE[family]).to(device=args.device, dtype=args.torch_dtype)
        for batch_size in args.batch_sizes:
            for method in args.methods:
                line = measure(
                    hf_model, tokenizer, family, method, batch_size, args.repeats, args.device, args.compile
                )
                print(line, flush=True)


if __name__ == "__main__":
    main()
