"""Time the methods on a BERT-base-sized encoder against Captum's Integrated Gradients and DeepLift on the same input,
in one run, and print each as a multiple of one plain forward pass.

The model is BERT-base-sized with random weights (d_model 768, 12 layers, 12 heads, FFN 3072, vocabulary 30522;
nothing is downloaded), as a masked LM (one mask, in the middle) and as a 3-label classifier; each input has N tokens,
[CLS] and [SEP] included. Every method goes through ``inseq_mixing.load_model(...).attribute``, one untimed call
first.

Usage:
    python benchmarks/bench_encoders.py [--lengths 20 40] [--tasks masked_lm sequence_classification]
        [--methods alti alti_logit decompx value_zeroing integrated_gradients deeplift] [--device cuda]
"""

import argparse
import random
import sys
import time
import warnings

import torch
import transformers

import inseq_mixing
from inseq_mixing.testing import WORDS, encoder_tokenizer, randomize_weights

DEFAULT_METHODS = ["alti", "alti_logit", "decompx", "attn_lrp", "value_zeroing", "globenc", "integrated_gradients",
                   "deeplift"]  # fmt: skip


def bert_base(task: str, vocab: int) -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
        num_labels=3, attn_implementation="eager",
    )  # fmt: skip
    cls = transformers.BertForMaskedLM if task == "masked_lm" else transformers.BertForSequenceClassification
    torch.manual_seed(0)
    model = cls(config)
    randomize_weights(model, 0)
    return model.eval()


def text_of(length: int, task: str, seed: int = 1) -> str:
    rng = random.Random(seed)
    words = [rng.choice(WORDS) for _ in range(length - 2)]  # [CLS] and [SEP] complete N
    if task == "masked_lm":
        words[len(words) // 2] = "[MASK]"
    return " ".join(words)


def timed(call, repeats: int = 1) -> float:
    call()  # untimed: first-call costs
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[20, 40])
    parser.add_argument("--tasks", nargs="+", default=["masked_lm", "sequence_classification"])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    tokenizer = encoder_tokenizer()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()}")  # fmt: skip
    print("| task | N | forward | " + " | ".join(f"`{m}`" for m in args.methods) + " |")
    print("|---|---:|---:|" + "---:|" * len(args.methods))
    for task in args.tasks:
        model = bert_base(task, 30522).to(args.device)
        for length in args.lengths:
            text = text_of(length, task)
            inputs = {k: v.to(args.device) for k, v in tokenizer(text, return_tensors="pt").items()}
            assert inputs["input_ids"].shape[1] == length
            with torch.no_grad():
                forward = timed(lambda: model(**inputs), repeats=5)  # noqa: B023
            cells = []
            for method in args.methods:
                attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer)
                seconds = timed(lambda: attribution.attribute(text, show_progress=False))  # noqa: B023
                cells.append(f"{seconds:.2f} s ({seconds / forward:.0f}×)")
            print(f"| {task} | {length} | {forward * 1000:.0f} ms | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
