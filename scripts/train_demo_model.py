"""Train the embedded demo model: a small Marian-style encoder–decoder on the synthetic grammar of
``inseq_mixing.demo.grammar``, saved (weights, config, tokenizer) into ``inseq_mixing/demo_model``.

Runs on CPU in a few minutes, offline:

    python scripts/train_demo_model.py [--steps 3000] [--out inseq_mixing/demo_model]
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel

from inseq_mixing.demo.grammar import sample, vocabulary
from inseq_mixing.testing import BOS_ID, EOS_ID, PAD_ID, word_tokenizer


def build_model(vocab_size: int) -> MarianMTModel:
    config = MarianConfig(
        vocab_size=vocab_size, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, max_position_embeddings=64,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID, decoder_start_token_id=PAD_ID,
        forced_eos_token_id=None, dropout=0.1, attention_dropout=0.0, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    return MarianMTModel(config)


def batch_of(tokenizer, examples):
    sources = tokenizer([" ".join(e.source) for e in examples], return_tensors="pt", padding=True)
    labels = tokenizer([" ".join(e.target) for e in examples], return_tensors="pt", padding=True).input_ids
    decoder_inputs = torch.cat([torch.full_like(labels[:, :1], PAD_ID), labels[:, :-1]], dim=1)
    labels = labels.masked_fill(labels == PAD_ID, -100)
    return {**sources, "decoder_input_ids": decoder_inputs, "labels": labels}


@torch.no_grad()
def exact_match(model, tokenizer, examples) -> float:
    model.eval()
    sources = tokenizer([" ".join(e.source) for e in examples], return_tensors="pt", padding=True)
    generated = model.generate(**sources, max_new_tokens=24, num_beams=1, do_sample=False)
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    model.train()
    return sum(text.split() == e.target for text, e in zip(texts, examples, strict=True)) / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "inseq_mixing" / "demo_model"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = word_tokenizer(seq2seq=True, words=vocabulary())
    model = build_model(len(tokenizer))
    held_out = [sample(random.Random(10_000 + i)) for i in range(300)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=args.steps, pct_start=0.1)
    model.train()
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = model(**batch_of(tokenizer, [sample(rng) for _ in range(args.batch_size)])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 500 == 0 or step == args.steps:
            accuracy = exact_match(model, tokenizer, held_out)
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out exact match {accuracy:.3f}  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)  # fmt: skip
    model.eval()
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"steps": args.steps, "batch_size": args.batch_size, "seed": args.seed, "held_out_exact_match": accuracy}
    (out / "training.json").write_text(json.dumps(record, indent=1))
    print(f"saved to {out}")


if __name__ == "__main__":
    main()
