"""Train the embedded retrieval demo model: a small Llama-style model on the synthetic passages of
``inseq_mixing.demo.retrieval`` (the loss on the answer only), saved (weights, config, tokenizer) into
``inseq_mixing/demo_retrieval_model``, for the ``context`` protocol's offline demo.

Runs on CPU in a few minutes, offline:

    python scripts/train_retrieval_model.py [--steps 2000] [--out inseq_mixing/demo_retrieval_model]
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from inseq_mixing.demo.retrieval import sample, vocabulary
from inseq_mixing.testing import BOS_ID, EOS_ID, PAD_ID, word_tokenizer


def build_model(vocab_size: int) -> LlamaForCausalLM:
    """A small Llama-style model (RoPE, grouped-query attention, SwiGLU)."""
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
                         tie_word_embeddings=True)  # fmt: skip
    return LlamaForCausalLM(config)


def batch_of(tokenizer, examples):
    """Right-padded prompt + answer ids, labels on the answer's tokens only."""
    prompts = [tokenizer(example.prompt)["input_ids"] for example in examples]
    answers = [tokenizer(example.answer)["input_ids"] for example in examples]
    length = max(len(p) + len(a) for p, a in zip(prompts, answers, strict=True))
    ids = torch.full((len(examples), length), PAD_ID)
    labels = torch.full((len(examples), length), -100)
    mask = torch.zeros_like(ids)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        labels[row, len(prompt) : len(prompt) + len(answer)] = torch.tensor(answer)
        mask[row, : len(prompt) + len(answer)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@torch.no_grad()
def accuracy(model, tokenizer, examples) -> float:
    """Share of examples whose first answer token (the city) is the model's top prediction after the prompt."""
    model.eval()
    right = 0
    for example in examples:
        ids = torch.tensor([tokenizer(example.prompt)["input_ids"]])
        right += int(model(input_ids=ids).logits[0, -1].argmax()) == tokenizer(example.answer)["input_ids"][0]
    model.train()
    return right / len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "inseq_mixing" /
                                             "demo_retrieval_model"))  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = word_tokenizer(seq2seq=False, words=vocabulary())
    model = build_model(len(tokenizer))
    held_out = [sample(random.Random(10_000 + i)) for i in range(300)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=args.steps, pct_start=0.1)
    model.train()
    start, found = time.perf_counter(), 0.0
    for step in range(1, args.steps + 1):
        loss = model(**batch_of(tokenizer, [sample(rng) for _ in range(args.batch_size)])).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 500 == 0 or step == args.steps:
            found = accuracy(model, tokenizer, held_out)
            print(f"step {step:5d}  loss {loss.item():.4f}  held-out accuracy {found:.3f}  "
                  f"{time.perf_counter() - start:.0f}s", flush=True)  # fmt: skip
    model.eval()
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"steps": args.steps, "batch_size": args.batch_size, "seed": args.seed, "held_out_accuracy": found}
    (out / "training.json").write_text(json.dumps(record, indent=1))
    print(f"saved to {out}")


if __name__ == "__main__":
    main()
