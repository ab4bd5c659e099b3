"""Cost of the run manifest's weight fingerprint (a SHA-256 of every byte of the weights), against a plain copy of
the same bytes to the host, in one run; with the figure it gives for a 7B model.

The fingerprint is computed once per dataset run (per process). Models are random (nothing is downloaded): a
Llama-style model of about ``--params`` parameters.

Usage:
    python benchmarks/bench_fingerprint.py [--params 3e8] [--dtype float32|bfloat16] [--device cpu|cuda]
"""

import argparse
import time

import torch
import transformers

from inseq_mixing.runs.runner import weights_fingerprint


def model_of(params: float, dtype: torch.dtype, device: str) -> torch.nn.Module:
    hidden = 1024
    layers = max(1, round(params / (12 * hidden * hidden)))
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=16, num_key_value_heads=16,
    )  # fmt: skip
    with torch.device(device):
        return transformers.LlamaForCausalLM(config).to(dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=3e8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    model = model_of(args.params, getattr(torch, args.dtype), args.device)
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    start = time.perf_counter()
    for tensor in model.state_dict().values():
        tensor.detach().cpu().reshape(-1).clone()
    copy = time.perf_counter() - start
    start = time.perf_counter()
    weights_fingerprint(model)
    seconds = time.perf_counter() - start
    rate = size / seconds / 1e9
    print(f"device {args.device}, {args.dtype}: {size / 1e9:.2f} GB of weights")
    print(f"fingerprint {seconds:.2f} s ({rate:.2f} GB/s); copying the same bytes to the host: {copy:.2f} s "
          f"(fingerprint / copy = {seconds / copy:.1f}x)")  # fmt: skip
    print(f"a 7B model in bfloat16 (14.0 GB) at this rate: {14.0 / rate:.0f} s")


if __name__ == "__main__":
    main()
