"""A snapshot of every front end's outputs, to check that a refactoring changes no number.

Every method on GPT-2 and BART (two texts each), a span explanation over sentences, a dataset run with generated
targets, ``compare`` on texts, every method on a BERT masked LM, ``compare`` and ``evaluate`` on it, Whisper and ViT
with a few methods, ``compare`` on images: every tensor, token list and table kept. Run it in the checkout before and
in the one after, then compare::

    PYTHONPATH=old python scripts/snapshot_outputs.py before.pt
    PYTHONPATH=new python scripts/snapshot_outputs.py after.pt
    python scripts/snapshot_outputs.py --compare before.pt after.pt   # exit 1 naming what differs

Issue 53 (kinds as records, the protocol registry, the generation front end for dataset runs): 246 entries, every
one bit-identical (NaN where NaN), on this 2-core CPU.
"""

import sys
import tempfile
import warnings

import torch

import inseq_mixing
from inseq_mixing.testing import (
    encoder_tokenizer,
    is_seq2seq,
    speech_processor,
    synthetic_audio,
    synthetic_image,
    tiny_encoder,
    tiny_model,
    tiny_speech,
    tiny_vision,
    vision_processor,
    word_tokenizer,
)

warnings.filterwarnings("ignore")


def compare(before: str, after: str) -> int:
    old, new = (torch.load(path, weights_only=False) for path in (before, after))
    differing = sorted(set(old) ^ set(new))
    for key in sorted(set(old) & set(new)):
        x, y = old[key], new[key]
        if isinstance(x, torch.Tensor):
            same = (
                x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.nan_to_num(12345.0), y.nan_to_num(12345.0))
            )
        else:
            same = x == y
        if not same:
            differing.append(key)
    print(f"{len(old)} entries compared; differing: {differing}")
    return 1 if differing else 0


if sys.argv[1] == "--compare":
    sys.exit(compare(sys.argv[2], sys.argv[3]))
print(inseq_mixing.__file__, file=sys.stderr)
torch.manual_seed(0)
out = {}


def keep(name, output):
    for i, seq in enumerate(output.sequence_attributions):
        for field in ("source_attributions", "target_attributions"):
            value = getattr(seq, field)
            if value is not None:
                out[f"{name}/{i}/{field}"] = value.clone()
        for key, value in (seq.step_scores or {}).items():
            out[f"{name}/{i}/step/{key}"] = value.clone()
        out[f"{name}/{i}/tokens"] = [t.token for t in seq.target] + ["|"] + [t.token for t in (seq.source or [])]


methods = list(inseq_mixing.METHODS)
for family in ("gpt2", "bart"):
    model = tiny_model(family)
    tok = word_tokenizer(seq2seq=is_seq2seq(family))
    for method in methods:
        m = inseq_mixing.load_model(model, method, tokenizer=tok)
        if is_seq2seq(family):
            o = m.attribute(
                ["the cat sat", "a dog"], ["le chat assis", "un chien"], attribute_target=True, show_progress=False
            )
        else:
            o = m.attribute(["the cat sat", "a dog"], ["the cat sat on the mat", "a dog ran"], show_progress=False)
        keep(f"{family}/{method}", o)
    m = inseq_mixing.load_model(model, "alti_logit", tokenizer=tok)
    if not is_seq2seq(family):
        keep(
            f"{family}/spans",
            m.attribute(
                "the cat sat . the dog ran .",
                "the cat sat . the dog ran . a cat sat",
                spans="answer",
                units="sentences",
                show_progress=False,
            ),
        )
    texts = ("the cat sat . the dog ran .", "the cat sat . the dog ran . a cat sat on")
    if not is_seq2seq(family):
        for method in ("alti_logit", "alti", "attn_lrp"):  # hops, on each kind of method
            spans = inseq_mixing.load_model(model, method, tokenizer=tok)
            keep(f"{family}/hops/{method}", spans.attribute(*texts, spans="sentences", units="sentences", hops=2,
                                                            show_progress=False))  # fmt: skip
        d = tempfile.mkdtemp()
        rows = [{"source": texts[0], "target": texts[1]}]
        inseq_mixing.attribute_dataset(model, "alti_logit", rows, d, tokenizer=tok, show_progress=False,
                                       units="sentences", hops=1)  # fmt: skip
        keep(f"{family}/span-run", type("O", (), {"sequence_attributions": list(inseq_mixing.load_run(d))})())
    d = tempfile.mkdtemp()
    rows = [
        {"id": "a", "source": "the cat sat", "target": ("le chat" if is_seq2seq(family) else "the cat sat on")},
        {"id": "b", "source": "a dog"},
    ]
    inseq_mixing.attribute_dataset(
        model, "decompx", rows, d, tokenizer=tok, batch_size=2, show_progress=False, id_column="id", max_new_tokens=3
    )
    run = inseq_mixing.load_run(d)
    for rid in run.ids():
        keep(f"{family}/run/{rid}", type("O", (), {"sequence_attributions": [run[rid]]})())
    c = inseq_mixing.compare(
        model, ["alti_logit", "attention_rollout"], ["the cat sat"], tokenizer=tok, max_new_tokens=3
    )
    out[f"{family}/compare"] = repr(c.tokens) + repr(c.agreement)
enc = tiny_encoder("bert")
etok = encoder_tokenizer()
for method in methods:
    keep(
        f"bert/{method}",
        inseq_mixing.load_model(enc, method, tokenizer=etok).attribute(
            ["the [MASK] sat", "a dog [MASK]"], show_progress=False
        ),
    )
c = inseq_mixing.compare(enc, ["alti_logit", "alti"], ["the [MASK] sat on the mat"], tokenizer=etok)
out["bert/compare"] = repr(c.tokens)
ev = inseq_mixing.evaluate(
    enc,
    ["alti", "alti_logit"],
    [
        {"source": "the [MASK] sat on the mat", "target": "cat", "evidence": [0], "cues": [0]},
        {"source": "a dog [MASK] on the mat", "target": "sat", "evidence": [1], "cues": [1]},
    ],
    "cue",
    tokenizer=etok,
    draws=20,
)
out["bert/evaluate"] = repr(ev.summary_rows())
sp = tiny_speech("whisper")
proc = speech_processor("whisper")
audio = synthetic_audio(1.0)
for method in ("alti", "alti_logit", "value_zeroing"):
    keep(
        f"whisper/{method}",
        inseq_mixing.load_model(sp, method, processor=proc).attribute(audio, "the cat", show_progress=False),
    )
vi = tiny_vision("vit")
vproc = vision_processor("vit")
img = synthetic_image()
for method in ("alti", "alti_logit", "decompx", "attn_lrp"):
    keep(
        f"vit/{method}",
        inseq_mixing.load_model(vi, method, processor=vproc).attribute([img, img[::-1].copy()], show_progress=False),
    )
c = inseq_mixing.compare(vi, ["alti_logit", "alti"], [img], processor=vproc)
out["vit/compare"] = repr(c.tokens)
torch.save(out, sys.argv[1])
print(len(out), "entries", file=sys.stderr)
