"""The synthetic grammar, the shipped demo model, and the demo report."""

import random

import torch

from inseq_mixing.demo import demo_examples, load_demo_model
from inseq_mixing.demo.grammar import NOUNS, sample, vocabulary
from inseq_mixing.views.demo import alignment_accuracy, run_demo


def test_grammar_alignments_and_agreement_are_consistent():
    words = set(vocabulary())
    english_nouns = set(NOUNS) | {noun + "s" for noun in NOUNS}
    for seed in range(200):
        example = sample(random.Random(seed))
        assert set(example.source) | set(example.target) <= words
        assert len(example.alignment) == len(example.target) == len(example.agreement)
        assert sorted(example.alignment) == list(range(len(example.source)))  # one target word per source word
        for head in example.agreement:
            assert head is None or example.source[head] in english_nouns


def test_shipped_model_translates_the_grammar():
    model, tokenizer = load_demo_model()
    examples = [sample(random.Random(50_000 + i)) for i in range(100)]
    inputs = tokenizer([" ".join(e.source) for e in examples], return_tensors="pt", padding=True)
    assert not (inputs.input_ids == tokenizer.unk_token_id).any()
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=24, num_beams=1, do_sample=False)
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    correct = sum(text.split() == e.target for text, e in zip(texts, examples, strict=True))
    assert correct >= 90


def test_demo_report_has_alignment_accuracy(tmp_path, capsys):
    out = tmp_path / "demo.html"
    assert run_demo(out, methods=["alti_logit", "decompx"], random_draws=1) == 0
    page = out.read_text()
    assert 'id="alignment"' in page and 'id="method-decompx"' in page
    printed = capsys.readouterr()
    assert "alignment_accuracy" in printed.out
    # the table's columns explained under it, and the faithfulness step named
    assert "comprehensiveness_prob: AOPC" in printed.out and "random_sufficiency_prob: the same" in printed.out
    assert "faithfulness: each generated token's top-ranked context removed, 2 method(s)" in printed.err


def test_alignment_accuracy_of_a_perfect_and_a_wrong_attribution():
    examples = demo_examples(count=2)

    class Seq:
        def __init__(self, example, shift):
            scores = torch.zeros(len(example.source) + 1, len(example.target) + 1)
            for column, aligned in enumerate(example.alignment):
                scores[(aligned + shift) % len(example.source), column] = 1.0
            self.source_attributions, self.target_attributions = scores, None

    class Out:
        def __init__(self, shift):
            self.sequence_attributions = [Seq(example, shift) for example in examples]

    assert alignment_accuracy(Out(0), examples) == 1.0
    assert alignment_accuracy(Out(1), examples) == 0.0


def test_examples_run(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"

    for script, extra in (
        ("quickstart.py", ["--out", str(tmp_path / "q.html")]),
        ("compare_methods.py", ["--out", str(tmp_path / "c"), "--methods", "alti_logit", "decompx"]),
        ("decoder_only.py", []),
        ("per_layer_analysis.py", ["--out", str(tmp_path / "l")]),
    ):
        result = subprocess.run(
            [sys.executable, str(examples / script), *extra], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, (script, result.stderr[-2000:])
    assert (tmp_path / "c" / "report.html").exists() and (tmp_path / "l" / "alti_target.png").exists()
