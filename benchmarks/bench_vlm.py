"""Vision–language decoders as a user meets them (issue 56): ``model.attribute(images, prompt, answer, spans="answer",
units="images")`` through the vision-language front end, against the forward pass that user runs (the model's
default attention, SDPA: the vision tower and the decoder on the processor's inputs and the answer), in the same
process, with the peak resident memory above the loaded model.

Each (images, method) runs in a fresh process (its memory high-water mark is its own): a Qwen2-VL-2B-shaped model with
random weights (nothing is downloaded): the decoder 28 layers of width 1,536, 12 query heads sharing 2 key/value
heads, FFN 8,960, a vocabulary of 151,936 tied to the embeddings; the tower 32 blocks of width 1,280, 16 heads, patches
of 14 pixels merged 2 × 2) and a local processor (the word tokenizer with Qwen2-VL's image tokens; Qwen2-VL's image
processor at ``--side`` pixels a side: 224 gives 64 tokens an image). The prompt is ``--images`` image placeholders
and 20 words, the answer ``--answer`` words. In that process: the SDPA forward pass of the prompt and answer (best of
``--repeats``), then the call, timed once, its peak resident memory (``VmHWM`` after the call, the mark reset just
before it, after ``malloc_trim``) minus the resident memory just before it. ``--units tokens --tower`` times the
continuation through the merger and the tower (``tower=True``, which needs one score per image token); compare it
with ``--units tokens`` alone.

    python benchmarks/bench_vlm.py [--images 1 4] [--methods alti_logit attn_lrp attention_rollout] [--side 224]
        [--answer 10] [--repeats 2] [--layers 28] [--units images|tokens] [--tower]
"""

import argparse
import json
import subprocess
import sys

METHODS = ["alti_logit", "attn_lrp", "attention_rollout"]
PROMPT_WORDS = 20


def build(layers: int, tower_layers: int, side: int):
    """The Qwen2-VL-2B-shaped model (SDPA) and its processor."""
    import torch
    import transformers

    from inseq_mixing.testing import (
        BOS_ID,
        EOS_ID,
        PAD_ID,
        QWEN_VL_MARKS,
        images_only,
        qwen_vl_tokenizer,
        randomize_weights,
    )

    tokenizer = qwen_vl_tokenizer()
    end, start, pad = tokenizer.convert_tokens_to_ids(list(QWEN_VL_MARKS))
    text = dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=layers,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
    )
    vision = dict(depth=tower_layers, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)  # fmt: skip
    config = transformers.Qwen2VLConfig(vision_config=vision, text_config=text, image_token_id=pad,
                                        vision_start_token_id=start, vision_end_token_id=end)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    images = transformers.Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                                                   min_pixels=side * side, max_pixels=side * side)  # fmt: skip
    processor = images_only(transformers.Qwen2VLProcessor)(images, tokenizer, video_processor=None)
    return model, processor


def child(count: int, method: str, args) -> dict:
    """One measurement in this process (see the module docstring)."""
    import ctypes
    import logging
    import time
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch

    import inseq_mixing
    from inseq_mixing.testing import WORDS, synthetic_image

    model, processor = build(args.layers, args.tower_layers, args.side)
    images = [synthetic_image(args.side, seed=index) for index in range(count)]
    mark = "<|vision_start|><|image_pad|><|vision_end|>"
    prompt = " ".join([mark] * count + [WORDS[index % len(WORDS)] for index in range(PROMPT_WORDS)])
    answer = " ".join(WORDS[(3 * index) % len(WORDS)] for index in range(args.answer))
    front = inseq_mixing.load_model(model, method, processor=processor)
    encoded = processor(images=[images], text=[prompt + " " + answer], return_tensors="pt")
    forward = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        with torch.no_grad():
            model(**encoded, use_cache=False)  # the model's default attention: what a user runs
        forward.append(time.perf_counter() - start)
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    before = _status("VmRSS:")
    start = time.perf_counter()
    out = front.attribute(images, prompt, answer, spans="answer", units=args.units, tower=args.tower,
                          show_progress=False)  # fmt: skip
    seconds = time.perf_counter() - start
    peak = _status("VmHWM:")
    assert out.sequence_attributions[0].source_attributions.shape[1] == 1
    return {"images": count, "tokens": int(encoded["input_ids"].shape[1]), "method": method,
            "forward_s": min(forward), "method_s": seconds, "peak_gb": (peak - before) / 2**30,
            "model_gb": before / 2**30}  # fmt: skip


def _status(key: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key)) * 2**10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--answer", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tower-layers", type=int, default=32)
    parser.add_argument("--units", choices=["images", "tokens"], default="images")
    parser.add_argument("--tower", action="store_true", help="continue the scores through the tower (units tokens)")
    parser.add_argument("--child", nargs=2, metavar=("IMAGES", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args)))
        return
    import torch

    print(f"torch {torch.__version__}, cpu, float32, {torch.get_num_threads()} threads; Qwen2-VL-2B-shaped "
          f"({args.layers} decoder layers, {args.tower_layers} tower blocks), {args.side} px images, "
          f"{PROMPT_WORDS} prompt words, {args.answer} answer words")  # fmt: skip
    print(f"model.attribute(spans='answer', units={args.units!r}, tower={args.tower}): time, time / SDPA forward of "
          "the same input, peak GB above the model")  # fmt: skip
    for count in args.images:
        for method in args.methods:
            command = [sys.executable, __file__, "--child", str(count), method, "--repeats", str(args.repeats),
                       "--side", str(args.side), "--answer", str(args.answer), "--layers", str(args.layers),
                       "--tower-layers", str(args.tower_layers), "--units", args.units,
                       *(["--tower"] if args.tower else [])]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{count} image(s) {method:>18}: failed: {done.stderr.strip().splitlines()[-1][:200]}")
                continue
            found = json.loads(done.stdout.strip().splitlines()[-1])
            ratio = found["method_s"] / found["forward_s"]
            print(f"{count} image(s), {found['tokens']:5d} tokens {method:>18}: forward {found['forward_s']:6.2f} s, "
                  f"method {found['method_s']:7.1f} s = {ratio:5.1f}x, {found['peak_gb']:5.2f} GB above the model "
                  f"({found['model_gb']:.1f} GB)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
