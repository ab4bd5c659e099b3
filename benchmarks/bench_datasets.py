"""Examples per second of ``inseq_mixing.attribute_dataset`` against a loop of ``model.attribute`` through Inseq, on
the same examples, in one run, with the ratio.

Models are full-size with random weights (nothing is downloaded): an opus-mt-sized Marian (d_model 512, 6+6 layers)
and a GPT-2-small-sized model (d_model 768, 12 layers). Examples have 20 words: source and target for Marian; a
10-word prompt and its 10-word continuation for GPT-2.

Usage:
    python benchmarks/bench_datasets.py [--examples 64] [--batch-size 16] [--models marian gpt2]
        [--methods alti_logit value_zeroing decompx] [--device cuda] [--dtype bfloat16]
"""

import argparse
import shutil
import tempfile
import time

import inseq

# the benchmarks folder is on sys.path when run as a script
from bench_methods import FULL_SIZE, device_arguments, sentence

import inseq_mixing
from inseq_mixing.testing import is_seq2seq, tiny_model, word_tokenizer


def examples(family: str, count: int, words: int = 20) -> list[dict]:
    rows = []
    for idx in range(count):
        if is_seq2seq(family):
            rows.append({"source": sentence(words, 2 * idx), "target": sentence(words, 2 * idx + 1)})
        else:
            prompt = sentence(words // 2, 2 * idx)
            rows.append({"source": prompt, "target": f"{prompt} {sentence(words - words // 2, 2 * idx + 1)}"})
    return rows


def loop_of_attribute(model, rows: list[dict], seq2seq: bool) -> float:
    start = time.perf_counter()
    for row in rows:
        model.attribute(row["source"], row["target"], attribute_target=seq2seq, show_progress=False)
    return time.perf_counter() - start


def dataset_run(model, method: str, rows: list[dict], batch_size: int) -> float:
    out = tempfile.mkdtemp(prefix="bench-run-")
    try:
        start = time.perf_counter()
        inseq_mixing.attribute_dataset(model, method, rows, out, batch_size=batch_size, show_progress=False)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--models", nargs="+", default=["marian", "gpt2"])
    parser.add_argument("--methods", nargs="+", default=["alti_logit", "value_zeroing", "decompx"])
    args = device_arguments(parser)
    dtype = args.torch_dtype
    print(f"{'model':8} {'method':14} {'loop ex/s':>10} {'dataset ex/s':>13} {'ratio':>7}")
    for family in args.models:
        tokenizer = word_tokenizer(seq2seq=is_seq2seq(family))
        hf_model = tiny_model(family, **FULL_SIZE[family]).to(device=args.device, dtype=dtype)
        rows = examples(family, args.examples)
        for method in args.methods:
            model = inseq.load_model(hf_model, method, tokenizer=tokenizer, device=args.device)
            dataset_run(model, method, rows[: args.batch_size], args.batch_size)  # warm-up
            batched = dataset_run(model, method, rows, args.batch_size)
            looped = loop_of_attribute(model, rows, is_seq2seq(family))
            n = len(rows)
            print(
                f"{family:8} {method:14} {n / looped:10.2f} {n / batched:13.2f} {looped / batched:6.1f}x", flush=True
            )


if __name__ == "__main__":
    main()
