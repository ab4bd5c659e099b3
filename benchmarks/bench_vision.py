"""Time every method on a ViT-B/16-sized image classifier at 224 px (197 tokens: [CLS] and 14 × 14 patches), each as a
multiple of one plain forward pass of the same batch, measured in the same run.

The model has ViT-B/16's shape with random weights (d_model 768, 12 layers, 12 heads, FFN 3072, 1,000 labels;
nothing is downloaded); the images are synthetic (224 × 224, so the processor only normalises them). Every method
goes through ``inseq_mixing.load_model(...).attribute`` on the whole batch, one untimed call first; the forward pass
is the model's own on the processed pixels (best of 5).

Usage:
    python benchmarks/bench_vision.py [--batch-sizes 1 8] [--methods alti alti_logit ...] [--device cuda]
"""

import argparse
import sys
import time
import warnings

import torch
import transformers

import inseq_mixing
from inseq_mixing.testing import image_processor, randomize_weights, synthetic_image

DEFAULT_METHODS = ["alti", "alti_logit", "decompx", "attn_lrp", "value_zeroing", "attention_rollout",
                   "attention_norm", "globenc"]  # fmt: skip


def vit_base(device: str) -> torch.nn.Module:
    config = transformers.ViTConfig(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, image_size=224,
        patch_size=16, num_labels=1000, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(config)
    randomize_weights(model, 0)
    return model.eval().to(device)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def best_of(call, device: str, repeats: int) -> float:
    call()  # untimed: first-call costs
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--repeats", type=int, default=1, help="timed calls per method (the best is kept)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    model, processor = vit_base(args.device), image_processor(224)
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"# ViT-B/16-sized, 224 px (197 tokens), {args.device} ({name}), torch {torch.__version__}, transformers "
          f"{transformers.__version__}")  # fmt: skip
    print("| batch | forward | " + " | ".join(f"`{method}`" for method in args.methods) + " |")
    print("|---:|---:|" + "---:|" * len(args.methods))
    for batch in args.batch_sizes:
        images = [synthetic_image(224, seed=seed) for seed in range(batch)]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(args.device)
        with torch.no_grad():
            forward = best_of(lambda: model(pixel_values=pixels), args.device, 5)  # noqa: B023
        cells = []
        for method in args.methods:
            attribution = inseq_mixing.load_model(model, method, processor=processor)
            seconds = best_of(lambda: attribution.attribute(images, batch_size=batch, show_progress=False),  # noqa: B023
                              args.device, args.repeats)  # fmt: skip
            cells.append(f"{seconds:.2f} s ({seconds / forward:.0f}×)")
        print(f"| {batch} | {forward * 1000:.0f} ms | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
