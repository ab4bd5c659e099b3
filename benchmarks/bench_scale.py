"""Research scale, as a user meets it (issue 52): ``model.attribute(prompt, prompt + answer, spans="answer",
units="passages")`` on long prompts, against the forward pass that user runs (the model's default attention, SDPA),
in the same process, with the peak resident memory above the loaded model.

Each (model, length, method) runs in a fresh process (its memory high-water mark is its own): a full-size model with
random weights (nothing is downloaded) whose positions reach the length, a prompt of ``length - 100`` words in 10
passages separated by blank lines, and an answer of 100 words, the word tokenizer (one token a word). In that process:
the SDPA forward pass of the whole text (best of ``--repeats``), then the call, timed once, its peak resident memory
(``VmHWM`` after the call, the mark reset just before it, after ``malloc_trim``) minus the resident memory just
before it. Methods: ``METHOD`` (the answer as one span over the passages), ``decompx:units`` (DecompX decomposed over
the passages from the first block, ``unit_components=True``).

Models: ``gpt2`` (GPT-2-small-sized: d_model 768, 12 layers, 12 heads, FFN 3,072, learned positions) and ``llama``
(the same width, 12 layers, 12 query heads sharing 4 key/value heads, RoPE, SwiGLU FFN 2,048, RMSNorm), or
``llama8b`` (Llama-3-8B-shaped: 32 layers, d_model 4,096, 32 / 8 heads, FFN 14,336; for a GPU). The new families of
issue 55 at ``llama``'s width and depth, transformers' default kernels (SDPA, ``grouped_mm`` experts): ``mixtral`` (8
experts of width 1,024, top-2), ``deepseek_v3`` (multi-head latent attention: KV latent 256, query latent 384, 32
rotary + 32 plain query/key dimensions per head, values of 64; 8 routed experts of width 512, top-2, one shared;
the first layer dense, FFN 2,048), ``gpt_oss`` (learned sinks, sliding windows of 128 tokens on every other
layer, 8 clamped experts of width 1,024, top-2) and ``granitemoe`` (8 experts of width 1,024, top-2, Granite-3.0's
multipliers); a mixture's floor counts the experts a token is routed to.
``bamba``: a hybrid at ``llama``'s width and depth whose layers 2, 5, 8 and 11 are attention and the others Mamba-2
(12 heads of 128 channels, 128 states, 4 taps; transformers' PyTorch path here, no CUDA kernels); its floor counts
the mixer layers as attention layers. ``qwen3_5``: a Qwen3.5 text decoder at ``llama``'s width and depth whose layers
3, 7 and 11 are gated attention (12 / 4 heads of 64) and the others Gated DeltaNet (6 key and 12 value heads of 64,
4 taps; transformers' PyTorch path, no flash-linear-attention kernels); its floor counts them as attention layers.
``falcon_h1``: a Falcon-H1 at ``llama``'s width and depth, every block a Mamba-2 mixer (12 heads of 128 channels, 128
states, 4 taps) beside attention (12 / 4 heads of 64); its floor counts each block as one attention layer.
``zamba2``: a Zamba 2 at ``llama``'s width and depth, Mamba-2 blocks (12 heads of 128 channels, 128 states, 4 taps)
whose layers 5 and 11 also run the shared attention block (12 heads of 128 over the input and the embeddings,
adapters of rank 128, a gated FFN of 2,048) into the mixer's input; its floor counts each block as one attention
layer (a hybrid block's parts cost ``T³`` more: not in the floor).

The FLOP floor of each method is what its definition must compute for a span of ``k`` explained rows over ``T``
tokens (``L`` layers, width ``D``, ``H`` heads, ``P`` parameters, ``U`` units); the forward pass is about
``2·P·T + 2·L·T²·D`` (causal attention: half the score and value products). ALTI and ALTI-logit form every causal
pair's part over the heads and take its L1 distance (``L·T²/2·(2H + 3)·D``: no shortcut for an L1 norm); GlobEnc and
the attention norms need each pair's L2 norm only, a quadratic form in the heads' probabilities over its token's
``H × H`` Gram matrix (``L·(T²/2·2H² + 2·T·H²·D)``). Printed beside each ratio as a multiple of the forward pass.

    python benchmarks/bench_scale.py [--models gpt2] [--lengths 1024 2048 4096 8192]
        [--methods alti_logit attn_lrp decompx:units alti attention_rollout globenc attention_norm value_zeroing]
        [--repeats 2] [--device cpu] [--dtype float32]
"""

import argparse
import json
import math
import subprocess
import sys

METHODS = ["alti_logit", "attn_lrp", "decompx:units", "alti", "attention_rollout", "globenc", "attention_norm",
           "value_zeroing"]  # fmt: skip
ANSWER = 100
PASSAGES = 10
SHAPES = {
    "gpt2": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 12, "ffn": 3072},
    "llama": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2048},
    "llama8b": {"layers": 32, "width": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336},
    # mixtures: ``ffn`` is what a token goes through (its top-k experts and the shared one)
    "mixtral": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2 * 1024},
    "deepseek_v3": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 12, "ffn": 3 * 512},
    "gpt_oss": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2 * 1024},
    "granitemoe": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2 * 1024},
    # a hybrid: Mamba-2 layers (12 heads of 128 channels, 128 states, 4 taps), attention at every third layer
    "bamba": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2048},
    # a hybrid: Gated DeltaNet layers (6 key heads, 12 value heads of 64), gated attention at every fourth layer
    "qwen3_5": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2048},
    # a hybrid: a Mamba-2 mixer (12 heads of 128 channels, 128 states) beside attention in every block
    "falcon_h1": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 4, "ffn": 2048},
    # a hybrid: Mamba-2 blocks; at layers 5 and 11 a shared attention block over [input; embeddings] (12 heads of 128)
    "zamba2": {"layers": 12, "width": 768, "heads": 12, "kv_heads": 12, "ffn": 2048},
}
#: The mixtures' own config fields (transformers 5.24's names).
MIXTURES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"intermediate_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2}),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    {"intermediate_size": 2048, "moe_intermediate_size": 512, "n_routed_experts": 8,
                     "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1,
                     "topk_group": 1, "kv_lora_rank": 256, "q_lora_rank": 384, "qk_rope_head_dim": 32,
                     "qk_nope_head_dim": 32, "v_head_dim": 64,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"intermediate_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2, "head_dim": 64,
                 "sliding_window": 128, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   {"intermediate_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2,
                    "embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 1 / 128,
                    "logits_scaling": 6.0}),
}  # fmt: skip


def build(family: str, length: int, dtype, device: str):
    """The model (the model's default attention), its word tokenizer."""
    import transformers

    from inseq_mixing.testing import randomize_weights, word_tokenizer

    shape, tokenizer = SHAPES[family], word_tokenizer(seq2seq=False)
    common = {"vocab_size": 50257, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=shape["width"], n_layer=shape["layers"], n_head=shape["heads"],
                                         n_inner=shape["ffn"], n_positions=length + 8, **common)  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    elif family in MIXTURES:
        config_class, model_class, own = MIXTURES[family]
        config = getattr(transformers, config_class)(
            hidden_size=shape["width"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"], max_position_embeddings=length + 8, **own, **common,
        )  # fmt: skip
        model = getattr(transformers, model_class)(config)
        model.set_experts_implementation("grouped_mm")  # transformers' default kernel
    elif family == "bamba":
        config = transformers.BambaConfig(
            hidden_size=shape["width"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"], intermediate_size=shape["ffn"], max_position_embeddings=length + 8,
            attn_layer_indices=list(range(2, shape["layers"], 3)), mamba_n_heads=12, mamba_d_head=128,
            mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, **common,
        )  # fmt: skip
        model = transformers.BambaForCausalLM(config)
    elif family == "qwen3_5":
        layer_types = [("linear_attention", "linear_attention", "linear_attention", "full_attention")[i % 4]
                       for i in range(shape["layers"])]  # fmt: skip
        config = transformers.Qwen3_5TextConfig(
            hidden_size=shape["width"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"], intermediate_size=shape["ffn"], max_position_embeddings=length + 8,
            head_dim=64, layer_types=layer_types, linear_num_key_heads=6, linear_num_value_heads=12,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4, **common,
        )  # fmt: skip
        model = transformers.Qwen3_5ForCausalLM(config)
    elif family == "falcon_h1":
        config = transformers.FalconH1Config(
            hidden_size=shape["width"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"], intermediate_size=shape["ffn"], max_position_embeddings=length + 8,
            head_dim=64, mamba_d_ssm=1536, mamba_n_heads=12, mamba_d_head=128, mamba_n_groups=1, mamba_d_state=128,
            mamba_d_conv=4, mamba_chunk_size=256, **common,
        )  # fmt: skip
        model = transformers.FalconH1ForCausalLM(config)
    elif family == "zamba2":
        layer_types = [("mamba", "hybrid")[i % 6 == 5] for i in range(shape["layers"])]
        config = transformers.Zamba2Config(
            hidden_size=shape["width"], num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"], intermediate_size=shape["ffn"], max_position_embeddings=length + 8,
            layers_block_type=layer_types, n_mamba_heads=12, mamba_ngroups=1, mamba_d_state=128, mamba_d_conv=4,
            mamba_expand=2, chunk_size=256, num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=128,
            use_mem_rope=True, **common,
        )  # fmt: skip
        model = transformers.Zamba2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(hidden_size=shape["width"], num_hidden_layers=shape["layers"],
                                          num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                                          intermediate_size=shape["ffn"], max_position_embeddings=length + 8,
                                          **common)  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    randomize_weights(model, 0, scale=0.1)
    return model.to(device=device, dtype=dtype).eval(), tokenizer


def texts(length: int) -> tuple[str, str]:
    """A prompt of ``length - ANSWER`` words in :data:`PASSAGES` passages, and the prompt with its answer."""
    import torch

    from inseq_mixing.testing import WORDS

    generator = torch.Generator().manual_seed(length)
    words = [WORDS[int(index)] for index in torch.randint(len(WORDS), (length - 1,), generator=generator)]
    prompt_words = length - ANSWER - 1
    cut = [prompt_words * part // PASSAGES for part in range(PASSAGES + 1)]
    prompt = "\n\n".join(" ".join(words[cut[part] : cut[part + 1]]) for part in range(PASSAGES))
    return prompt, prompt + " " + " ".join(words[prompt_words:])


def child(family: str, length: int, name: str, repeats: int, device: str, dtype: str) -> dict:
    """One measurement in this process (see the module docstring)."""
    import ctypes
    import logging
    import time
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import inseq
    import torch

    import inseq_mixing  # noqa: F401  (registers the methods)

    model, tokenizer = build(family, length, getattr(torch, dtype), device)
    prompt, generated = texts(length)
    ids = torch.tensor([tokenizer(generated)["input_ids"]], device=device)
    method, _, mode = name.partition(":")
    options = {"unit_components": True} if mode == "units" else {}
    attribution = inseq.load_model(model, method, tokenizer=tokenizer, device=device)

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    forward = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids)  # the model's default attention: what a user runs
        sync()
        forward.append(time.perf_counter() - start)
    if device.startswith("cuda"):
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        before = _status("VmRSS:")
    sync()
    start = time.perf_counter()
    out = attribution.attribute(prompt, generated, spans="answer", units="passages", show_progress=False, **options)
    sync()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else _status("VmHWM:")
    assert len(out.info["units"][0]) >= PASSAGES
    return {"family": family, "length": int(ids.shape[1]), "method": name, "forward_s": min(forward),
            "method_s": seconds, "peak_gb": (peak - before) / 2**30, "model_gb": before / 2**30}  # fmt: skip


def _status(key: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(key)) * 2**10


def floor_over_forward(family: str, name: str, length: int) -> float:
    """The method's FLOP floor (see the module docstring) over the forward pass's FLOPs, for a span of ANSWER rows."""
    shape = SHAPES[family]
    layers, width, tokens, rows = shape["layers"], shape["width"], length, ANSWER
    per_layer = width * width * (2 + 2 * shape["kv_heads"] / shape["heads"]) + width * shape["ffn"] * (
        3 if family != "gpt2" else 2
    )  # the blocks' weights a token goes through (a mixture: its experts'; latent attention counted as plain)
    blocks = layers * per_layer
    forward = 2 * (blocks + 50257 * width) * tokens + 2 * layers * tokens * tokens * width
    method = name.partition(":")[0]
    if method == "attn_lrp":  # a forward and a backward pass
        floor = 3 * forward
    elif method == "decompx":  # every unit's component through every block's weights
        floor = (PASSAGES + 1) * 2 * blocks * tokens
    elif method in ("alti_logit", "alti"):  # every (i, j) part formed over the heads, and its L1 distance
        floor = layers * tokens * tokens / 2 * (2 * shape["heads"] + 3) * width
    elif method in ("globenc", "attention_norm"):  # every (i, j) part's norm from its token's heads' Gram matrix
        heads = shape["heads"]
        floor = layers * (tokens * tokens / 2 * 2 * heads * heads + 2 * tokens * heads * heads * width)
    elif method == "value_zeroing":  # an FFN row per (explained row, zeroed token), every layer
        floor = layers * rows * tokens * 2 * width * shape["ffn"] * 2
    else:  # attention_rollout: the span's rows through every layer's head-averaged map
        floor = layers * rows * tokens * tokens * 2
    return floor / forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2"], choices=list(SHAPES))
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096, 8192])
    parser.add_argument("--methods", nargs="+", default=METHODS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--child", nargs=3, metavar=("FAMILY", "LENGTH", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        family, length, name = args.child
        print(json.dumps(child(family, int(length), name, args.repeats, args.device, args.dtype)))
        return
    import torch

    print(f"torch {torch.__version__}, {args.device}, {args.dtype}, {torch.get_num_threads()} threads")
    for family in args.models:
        print(f"\n{family}: model.attribute(spans='answer', units='passages') on the last {ANSWER} tokens (time, "
              "time / SDPA forward of the same input, FLOP floor / forward, peak GB above the model)")  # fmt: skip
        print(f"{'method':>16} " + " ".join(f"{length:>34}" for length in args.lengths) + "   exponent (forward)")
        for name in args.methods:
            cells, times, forwards = [], [], []
            for length in args.lengths:
                command = [sys.executable, __file__, "--child", family, str(length), name, "--repeats",
                           str(args.repeats), "--device", args.device, "--dtype", args.dtype]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True)
                if done.returncode != 0:
                    cells.append(f"{'failed: ' + done.stderr.strip().splitlines()[-1][:24]:>34}")
                    continue
                found = json.loads(done.stdout.strip().splitlines()[-1])
                times.append((length, found["method_s"]))
                forwards.append((length, found["forward_s"]))
                ratio = found["method_s"] / found["forward_s"]
                floor = floor_over_forward(family, name, length)
                cells.append(f"{found['method_s']:8.1f} s {ratio:6.1f}x (>{floor:5.2f}x) {found['peak_gb']:5.2f} GB")
            slope = f"{exponent(times):.2f} ({exponent(forwards):.2f})" if len(times) > 1 else ""
            print(f"{name:>16} " + " ".join(cells) + f"   {slope}", flush=True)


def exponent(points: list[tuple[int, float]]) -> float:
    """The slope of log(time) over log(length)."""
    xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum((x - mean_x) ** 2 for x in xs)


if __name__ == "__main__":
    main()
