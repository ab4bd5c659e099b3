"""What the token mixers' exact mixings cost (:mod:`inseq_mixing.methods.mixers`), against the mixer's own forward.

One layer of each mixer at a released model's width, random weights (nothing is downloaded): Mamba-2 as in
Mamba2-780m (d 1,536, 48 heads of 64, 128 states, one group) and Gated DeltaNet as in Qwen3-Next's linear-attention
layers (d 2,048, 16 key heads and 32 value heads of 128). For each length: the module's own forward (its PyTorch path:
what the model runs here without the CUDA kernels), freezing its mixing (the ``T × T`` matrix per head; Gated
DeltaNet's triangular solve is ``T³`` per head), and every token's part of 64 positions' outputs (a chunk of rows:
``64 × T × channels`` elements, the memory that a method reading the parts holds per chunk). Times are the best of
``--repeats``; memory is the elements of the mixing and of one chunk, in float32. Gated DeltaNet's mixing is computed
chunk by chunk (:func:`~inseq_mixing.methods.mixers.delta_rule_mixing`); ``--whole-solve`` also times it as one
``T × T`` triangular solve per head (one chunk for all: the earlier way), in the same run.

    python benchmarks/bench_mixers.py [--lengths 512 1024 2048] [--repeats 2] [--threads 2] [--mixers NAME ...]
                                      [--whole-solve] [--no-parts]
"""

import argparse
import time
from functools import partial

import torch
from transformers import Mamba2Config, Qwen3NextConfig
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

import inseq_mixing.methods.mixers as mixer_math
from inseq_mixing.methods.mixers import FrozenMixer

ROWS = 64


def mixers():
    """(name, module, freeze) of each mixer at its released width."""
    mamba2 = Mamba2Config(hidden_size=1536, num_heads=48, head_dim=64, expand=2, n_groups=1, state_size=128,
                          conv_kernel=4, chunk_size=256, num_hidden_layers=1)  # fmt: skip
    deltanet = Qwen3NextConfig(hidden_size=2048, linear_num_value_heads=32, linear_num_key_heads=16,
                               linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                               num_hidden_layers=1, layer_types=["linear_attention"])  # fmt: skip
    return [
        ("Mamba-2", Mamba2Mixer(mamba2, 0).eval(), FrozenMixer.mamba2),
        ("Gated DeltaNet", Qwen3NextGatedDeltaNet(deltanet, 0).eval(), FrozenMixer.gated_deltanet),
    ]


def best(repeats: int, work) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mixers", nargs="+", default=None, help="names to run (default: all)")
    parser.add_argument("--whole-solve", action="store_true", help="also freeze with one chunk for all positions")
    parser.add_argument("--no-parts", action="store_true", help="skip the 64 rows of parts")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads; times in s (best of {args.repeats})")
    print(f"{'mixer':>15} {'T':>6} {'forward':>8} {'freeze':>8} {'ratio':>6} {'64 rows':>8} {'mixing GB':>10} "
          f"{'chunk GB':>9}" + (f" {'one solve':>9} {'max diff':>9}" if args.whole_solve else ""))  # fmt: skip
    for name, module, freeze in mixers():
        if args.mixers is not None and name not in args.mixers:
            continue
        width = module.out_proj.out_features
        for length in args.lengths:
            hidden = torch.randn(1, length, width)
            rows = slice(length - ROWS, length)  # the last rows: the longest
            with torch.no_grad():
                forward, _ = best(args.repeats, partial(module, hidden))
                frozen_time, frozen = best(args.repeats, partial(freeze, module, hidden))
                parts_time = float("nan")
                if not args.no_parts:
                    parts_time, _ = best(args.repeats, partial(frozen.token_parts, rows))
                whole = ""
                if args.whole_solve:
                    chunk, mixer_math.DELTA_RULE_CHUNK = mixer_math.DELTA_RULE_CHUNK, length
                    try:
                        whole_time, one = best(args.repeats, partial(freeze, module, hidden))
                    finally:
                        mixer_math.DELTA_RULE_CHUNK = chunk
                    whole = f" {whole_time:9.3f} {float((one.mixing - frozen.mixing).abs().max()):9.1e}"
                    del one
            mixing_gb = frozen.mixing.numel() * 4 / 2**30
            chunk_gb = ROWS * length * frozen.conv_input.shape[-1] * 4 / 2**30
            print(f"{name:>15} {length:>6} {forward:8.3f} {frozen_time:8.3f} {frozen_time / forward:6.1f} "
                  f"{parts_time:8.3f} {mixing_gb:10.3f} {chunk_gb:9.3f}{whole}", flush=True)  # fmt: skip
            del frozen


if __name__ == "__main__":
    main()
