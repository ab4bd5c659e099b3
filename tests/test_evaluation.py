"""Evaluation protocols: each metric against hand-computed values, column mapping, word-level aggregation over
subwords (a locally trained BPE tokenizer), clear errors naming the row, and the command on the demo data."""

import itertools
import json
import math
import re
import subprocess

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.demo.evaluation_data import evaluation_rows, export_evaluation_data
from inseq_mixing.evaluation import EvaluationInputError, read_items
from inseq_mixing.evaluation.metrics import (
    Statistic,
    alignment_counts,
    bootstrap_interval,
    cue_share,
    mean_statistic,
    paired_permutation_test,
    parse_pharaoh,
    random_reciprocal_rank,
    reciprocal_rank,
    tied_ranks,
)
from inseq_mixing.evaluation.words import token_words, word_scores
from inseq_mixing.testing import tiny_model

from .test_encoders import MLM_ROWS, encoder_dirs  # noqa: F401  (saved tiny encoders)
from .test_report import browser, page_width

# metrics


def test_tied_ranks_share_their_mean_rank():
    assert tied_ranks(torch.tensor([3.0, 1.0, 2.0])).tolist() == [1, 3, 2]
    assert tied_ranks(torch.tensor([1.0, 1.0, 0.0])).tolist() == [1.5, 1.5, 3]


def test_reciprocal_rank_perfect_reversed_and_ties():
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0])
    assert reciprocal_rank(scores, [0]) == 1.0  # perfect
    assert reciprocal_rank(scores, [3]) == 0.25  # reversed: the evidence is last of four
    assert reciprocal_rank(scores, [2, 3]) == pytest.approx(1 / 3)  # the best of the evidence words counts
    assert reciprocal_rank(torch.ones(4), [1]) == pytest.approx(1 / 2.5)  # all tied: the mean rank
    with pytest.raises(ValueError):
        reciprocal_rank(scores, [])


@pytest.mark.parametrize(("words", "evidence"), [(4, 1), (5, 2), (6, 3), (3, 3)])
def test_random_reciprocal_rank_is_the_mean_over_all_rankings(words, evidence):
    marked = set(range(evidence))
    values = [
        1 / min(rank + 1 for rank, word in enumerate(order) if word in marked)
        for order in itertools.permutations(range(words))
    ]
    assert random_reciprocal_rank(words, evidence) == pytest.approx(sum(values) / len(values))


def test_cue_share_uses_absolute_values_per_layer():
    assert float(cue_share(torch.tensor([1.0, -3.0, 0.0, 4.0]), [1, 3])) == pytest.approx(7 / 8)
    layers = torch.tensor([[1.0, 0.0], [1.0, 2.0], [2.0, 2.0]])
    torch.testing.assert_close(cue_share(layers, [2]), torch.tensor([0.5, 0.5], dtype=torch.float64))
    assert math.isnan(float(cue_share(torch.zeros(3), [0])))


def test_alignment_counts_perfect_reversed_and_partial():
    diagonal = torch.eye(3)
    perfect = alignment_counts(diagonal, {(0, 0), (1, 1), (2, 2)})
    assert (perfect.overlap2, perfect.size, perfect.hits, perfect.aligned_words) == (6, 6, 3, 3)
    reversed_ = alignment_counts(diagonal, {(2, 0), (1, 1), (0, 2)})
    assert 1 - reversed_.overlap2 / reversed_.size == pytest.approx(1 - 2 / 6)  # only the middle word is right
    assert reversed_.hits == 1
    anti = alignment_counts(diagonal, {(2, 0), (0, 2)})  # target word 1 has no gold link
    assert (anti.overlap2, anti.size, anti.hits, anti.aligned_words) == (0, 5, 0, 2)
    partial = alignment_counts(diagonal, {(0, 0), (1, 1), (2, 2), (1, 2)})  # a word with two gold sources
    assert 1 - partial.overlap2 / partial.size == pytest.approx(1 - 6 / 7)
    assert partial.hits == 3


def test_parse_pharaoh():
    assert parse_pharaoh("0-0 2-1 1p2") == {(0, 0), (2, 1), (1, 2)}
    with pytest.raises(ValueError, match="Pharaoh"):
        parse_pharaoh("0-x")


def test_bootstrap_and_paired_test():
    constant = mean_statistic([0.5] * 10)
    assert bootstrap_interval(constant, draws=50) == pytest.approx((0.5, 0.5))
    spread = mean_statistic([float(i) for i in range(20)])
    low, high = bootstrap_interval(spread, draws=500)
    assert low < float(spread.value()) < high
    same = mean_statistic([0.1 * i for i in range(30)])
    assert paired_permutation_test(same, same, draws=200) == 1.0
    ones, zeros = mean_statistic([1.0] * 30), mean_statistic([0.0] * 30)
    assert paired_permutation_test(ones, zeros, draws=200) == pytest.approx(1 / 201)
    ratio = Statistic(torch.tensor([2.0, 0.0]), torch.tensor([4.0, 4.0]), "one_minus")
    assert float(ratio.value()) == pytest.approx(0.75)


# reading rows


def test_columns_are_mapped_by_role():
    rows = [{"ctx": "the cat", "good": "sleeps", "bad": "sleep", "ev": "cat", "src": "le chat"}]
    items = read_items(rows, "evidence", False, {"prefix": "ctx", "target": "good", "foil": "bad", "evidence": "ev"})
    assert (items[0].prefix, items[0].target, items[0].foil, items[0].marks) == ("the cat", "sleeps", "sleep", [1])
    items = read_items(rows, "evidence", True, {"source": "src", "prefix": "ctx", "target": "good", "evidence": "ev"})
    assert items[0].context_words == ["le", "chat", "the", "cat"] and items[0].marks == [3]
    with_indices = [
        {"prefix": "a b a", "target": "c", "cues": "[0, 1]"},
        {"prefix": "a b a", "target": "c", "cues": "a"},
    ]
    assert [item.marks for item in read_items(with_indices, "cue", False)] == [[0, 1], [0, 2]]


@pytest.mark.parametrize(
    ("rows", "protocol", "message"),
    [
        ([{"prefix": "the cat", "target": "sleeps"}], "evidence", "no column 'evidence'.*--evidence-column"),
        ([{"prefix": "the cat", "target": "sleeps", "evidence": "dog"}], "evidence", "Row 0.*'dog' is not in"),
        ([{"prefix": "the cat", "target": "sleeps", "evidence": "[5]"}], "evidence", "Row 0.*index 5"),
        ([{"prefix": "the cat", "target": "sleeps", "evidence": "[1.5]"}], "evidence", "Row 0.*1.5 is not an integer"),
        ([{"prefix": "the cat", "target": "sleeps", "evidence": 0.5}], "evidence", "Row 0.*0.5 is not an integer"),
        ([{"prefix": "", "target": "x", "cues": "cat"}], "cue", "Row 0 has no prefix"),
    ],
)
def test_bad_rows_name_the_row(rows, protocol, message):
    with pytest.raises(EvaluationInputError, match=message):
        read_items(rows, protocol, False)


def test_bad_alignments_name_the_row():
    good = {"source": "a b", "target": "x y", "alignment": "0-0 1-1"}
    with pytest.raises(EvaluationInputError, match=r"Row 1.*2-1.*2 source and 2 target"):
        read_items([good, {**good, "alignment": "0-0 2-1"}], "alignment", True)
    with pytest.raises(EvaluationInputError, match="Row 0.*Pharaoh"):
        read_items([{**good, "alignment": "0:0"}], "alignment", True)
    with pytest.raises(EvaluationInputError, match="encoder–decoder"):
        read_items([good], "alignment", False)


# words over subwords


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A small BPE tokenizer trained here: long and rare words split into several subwords."""
    corpus = ["the cat sat on the mat", "a dog sat", "the cats sat", "a blue vine", "be able to"] * 5
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=45, special_tokens=["<pad>", "</s>", "<unk>", "<s>"])
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>"
    )


def test_word_scores_sum_subwords():
    tokenizer = bpe_tokenizer()
    text = "the unbelievable cats sat"
    ids = tokenizer(text).input_ids
    assert len(ids) > len(text.split())  # some words are split
    words = token_words(tokenizer, text, [0, *ids])  # a leading extra token (e.g. a decoder start) maps to -1
    assert words[0] == -1 and sorted(set(words[1:])) == [0, 1, 2, 3]
    for word in range(4):
        pieces = [ids[i] for i, owner in enumerate(words[1:]) if owner == word]
        assert tokenizer.decode(pieces).strip() == text.split()[word]
    scores = torch.arange(len(ids) + 1, dtype=torch.float32)
    expected = [sum(float(scores[i]) for i, owner in enumerate(words) if owner == word) for word in range(4)]
    assert word_scores(scores, words, 4).tolist() == expected


def test_evidence_on_a_decoder_only_model_with_subwords(tmp_path):
    """Word scores read off a real run sum the subword scores of Inseq's output for the explained token."""
    tokenizer = bpe_tokenizer()
    model = tiny_model("gpt2", vocab=len(tokenizer))
    rows = [{"prefix": "the unbelievable cats", "target": "sat", "evidence": "cats"}]
    from inseq import load_model

    from inseq_mixing.evaluation.explain import explain_items

    inseq_model = load_model(model, "alti_logit", tokenizer=tokenizer)
    (explanation,) = explain_items(inseq_model, read_items(rows, "evidence", False), 4, {})
    (column,) = explanation.explained_columns()
    seq = explanation.seq
    scores = explanation.context_scores(column)
    tokens = [token.token for token in seq.target]
    words = explanation.target_words
    for word, text in enumerate(["the", "unbelievable", "cats"]):
        positions = [p for p, owner in enumerate(words) if owner == word]
        assert "".join(tokens[p] for p in positions).replace("▁", "") == text
        assert float(scores[word]) == pytest.approx(float(seq.target_attributions[positions, column].sum()), abs=1e-6)
    evaluation = inseq_mixing.evaluate(inseq_model, ["alti_logit", "value_zeroing"], rows, "evidence", draws=20)
    assert evaluation.to_dict()["methods"]["alti_logit"]["n"] == 1
    # one item: its interval cannot vary, and the terminal says so (not only the report)
    row = evaluation.summary_rows()[0]
    assert row["mrr 95% CI"].endswith(" degenerate") and "model" not in row
    assert any(note.startswith("alti_logit: the 95% interval of mrr is degenerate") for note in evaluation.notes())
    path = evaluation.report(tmp_path / "evidence.html", title="one <item>")  # the report, from Python
    page = path.read_text()
    assert "one &lt;item&gt;" in page and "alti_logit" in page and "value_zeroing" in page


# the demo data and the command


def test_demo_data_annotations_hold_by_construction():
    rows = evaluation_rows(count=10)
    for row in rows["evidence"]:
        context = row["source"].split() + row["prefix"].split()
        assert row["target"] != row["foil"] and all(0 <= index < len(context) for index in row["evidence"])
    for row in rows["alignment"]:
        items = read_items([row], "alignment", True)
        assert {t for _, t in items[0].gold} == set(range(len(row["target"].split())))
    assert rows["alti_logit_layout"] and rows["cue"]


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    return export_evaluation_data(tmp_path_factory.mktemp("demo-data"), count=4)


@pytest.mark.parametrize("protocol", ["evidence", "cue", "alignment", "faithfulness"])
def test_cli_evaluates_every_protocol_on_the_demo(protocol, demo_data, tmp_path, capsys):
    out, metrics = tmp_path / "report.html", tmp_path / "metrics.json"
    methods = ["alti_logit", "value_zeroing", "saliency"]
    code = main(
        ["evaluate", str(demo_data[protocol]), "--model", "demo", "--protocol", protocol, "--methods", *methods,
         "--out", str(out), "--json", str(metrics), "--draws", "50"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    content = json.loads(metrics.read_text())
    assert content["protocol"] == protocol and set(content["methods"]) == set(methods)
    metric = {
        "evidence": "mrr",
        "cue": "cue_contribution",
        "alignment": "aer",
        "faithfulness": "comprehensiveness_prob",
    }
    for summary in content["methods"].values():
        low, high = summary["ci"]
        assert low <= summary[metric[protocol]] <= high and summary["n"] > 0
    assert len(content["pairs"]) == 3 and all(0 < pair["p_value"] <= 1 for pair in content["pairs"])
    if protocol == "cue":
        assert len(content["methods"]["value_zeroing"]["per_layer"]) == 2  # the demo model's decoder layers
    page = out.read_text()
    assert 'id="metrics"' in page and 'id="pairs"' in page
    assert ('id="cue-figure"' in page) == (protocol == "cue")
    heads = re.findall(r'<table class="heatmap" id="alti_logit-0-source"><caption>[^<]*</caption><tr>(.*?)</tr>', page)
    if protocol in ("evidence", "cue"):  # only the explained token's column, headed by the target word (vs foil)
        assert heads and heads[0].count("<th>") == 2
    if protocol == "alignment":  # every column, the gold links outlined
        assert heads and heads[0].count("<th>") > 2
        assert 'class="gold"' in page and "outlined: gold links" in page


def test_cli_evaluates_the_alti_logit_csv_layout(demo_data, tmp_path, capsys):
    metrics = tmp_path / "metrics.json"
    code = main(
        ["evaluate", str(demo_data["alti_logit_layout"]), "--model", "demo", "--protocol", "evidence",
         "--prefix-column", "one_prefix_prefix", "--target-column", "one_prefix_word_good",
         "--foil-column", "one_prefix_word_bad", "--evidence-column", "target", "--methods", "alti_logit",
         "decompx", "--out", str(tmp_path / "r.html"), "--json", str(metrics), "--draws", "20"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert set(json.loads(metrics.read_text())["methods"]) == {"alti_logit", "decompx"}


def test_cli_evaluate_bad_input_is_one_line_exit_2(demo_data, tmp_path, capsys):
    code = main(["evaluate", str(demo_data["evidence"]), "--model", "demo", "--protocol", "evidence",
                 "--evidence-column", "nope", "--out", str(tmp_path / "r.html")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "no column 'nope'" in err and len(err.strip().splitlines()) == 1


def test_evaluation_report_in_headless_browser(demo_data, tmp_path):
    executable = browser()
    evaluation = inseq_mixing.evaluate(_demo_model(), ["alti", "value_zeroing"], demo_data["cue"], "cue", draws=20)
    from inseq_mixing.views.eval_report import write_evaluation_report

    path = write_evaluation_report(evaluation, tmp_path / "eval.html")
    common = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,1600"]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'id="metrics"' in dom and 'id="cue-figure"' in dom and 'id="value_zeroing-0-source"' in dom


def _demo_model():
    from inseq import load_model

    from inseq_mixing.demo import load_demo_model

    model, tokenizer = load_demo_model()
    return load_model(model, "alti", tokenizer=tokenizer)


# rows that cannot be evaluated, multi-token targets and foils, unknown words, degenerate statistics


def byte_bpe_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE tokenizer trained here on ``texts``: their words become whole tokens, words
    outside them split into several."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet)
    tokenizer.train_from_iterator(texts * 3, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


# ruff: noqa: E501 (the rows below are copied in the released files' layout, one row per line)
RELEASED_BLIMP = """,sentence_good,sentence_bad,one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,field,UID,pairID,target
0,Raymond is selling this sketch.,Raymond is selling this sketches.,Raymond is selling this,sketch,sketches,morphology,dna_1,0,this
1,Craig explored that grocery store.,Craig explored that grocery stores.,Craig explored that,grocery store,grocery stores,morphology,dna_1,1,that
2,Eva has scared these children.,Eva has scared these child.,Eva has scared these,children,child,morphology,dna_1,2,these
3,Those ladies walk through those oases.,Those ladies walk through those oasis.,Those ladies walk through those,oases,oasis,morphology,dna_1,3,
4,Tara wasn't fixing those rugs.,Tara wasn't fixing those rug.,Tara wasn't fixing those,sketchy rugs,rug,morphology,dna_1,4,those
"""
RELEASED_IOI = """,Sentence_good,one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,target
0,Friends Juana and Kristi found a mango at the bar. Kristi gave it to Juana,Friends Juana and Kristi found a mango at the bar. Kristi gave it to,Juana,Kristi,Juana
1,"Then, Yvette and Angie were working at the mountain. Yvette decided to give a banana to Angie","Then, Yvette and Angie were working at the mountain. Yvette decided to give a banana to",Angie,Yvette,Angie
2,"After Doris and Marsha went to the mountain, Marsha gave a strawberry to Doris","After Doris and Marsha went to the mountain, Marsha gave a strawberry to",Doris,Marsha,"Doris,"
"""  # the released files' layout: an unnamed index column, the evidence in `target`


@pytest.fixture(scope="module")
def released_layout(tmp_path_factory):
    """CSV files laid out as the ALTI-logit paper released them (BLiMP: two-word targets, an empty evidence cell; IOI:
    commas in the prefix), and a local decoder-only model whose tokenizer was trained on their text."""
    import csv
    import io

    folder = tmp_path_factory.mktemp("released")
    texts = []
    for name, content in (("blimp.csv", RELEASED_BLIMP), ("ioi.csv", RELEASED_IOI)):
        (folder / name).write_text(content)
        for row in csv.DictReader(io.StringIO(content)):
            texts += [value for key, value in row.items() if key.lower().startswith("sentence")]
    tokenizer = byte_bpe_tokenizer(texts)
    model = tiny_model("gpt2", vocab=len(tokenizer))
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return folder


ALTI_LOGIT_COLUMNS = ["--prefix-column", "one_prefix_prefix", "--target-column", "one_prefix_word_good",
                      "--foil-column", "one_prefix_word_bad", "--evidence-column", "target"]  # fmt: skip


@pytest.mark.parametrize("name", ["blimp.csv", "ioi.csv"])
def test_the_released_alti_logit_csvs_run_unedited(released_layout, name, tmp_path, capsys):
    metrics = tmp_path / "metrics.json"
    code = main(
        ["evaluate", str(released_layout / name), "--model", str(released_layout / "model"), "--protocol", "evidence",
         *ALTI_LOGIT_COLUMNS, "--methods", "alti_logit", "decompx", "--out", str(tmp_path / "r.html"),
         "--json", str(metrics), "--draws", "20"]
    )  # fmt: skip
    output = capsys.readouterr()
    assert code == 0, output.err
    content = json.loads(metrics.read_text())
    skipped = {skip["row"]: skip for skip in content["skipped"]}
    if name == "blimp.csv":
        # grocery store / grocery stores share their first token: skipped and counted, as in the paper's code
        assert skipped[1]["kind"] == "target equals foil" and "grocery" in skipped[1]["reason"]
        assert skipped[3]["kind"] == "bad row" and "no evidence" in skipped[3]["reason"]  # empty evidence cell
        assert content["skipped_counts"] == {"target equals foil": 1, "bad row": 1}
        assert content["methods"]["alti_logit"]["n"] == 3  # rows 0, 2 and 4 (a two-word target: its first token)
        assert "skipped 2 row(s)" in output.out
    else:
        assert not skipped and content["methods"]["alti_logit"]["n"] == 3  # "Doris," marks the word Doris
    assert content["target_tokens"] == "first"
    page = (tmp_path / "r.html").read_text()
    assert ('id="skipped"' in page) == bool(skipped)


def _gpt2_with(tokenizer):
    from inseq import load_model

    return load_model(tiny_model("gpt2", vocab=len(tokenizer)), "alti_logit", tokenizer=tokenizer)


def test_a_multi_token_target_explains_the_first_token_of_space_plus_word(released_layout):
    """The explained logit is the model's own logit of the first token of " " + word, right after the prefix; with a
    foil, the difference with the foil's first token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inseq_mixing.evaluation.explain import explain_items
    from inseq_mixing.evaluation.targets import prepare_targets

    tokenizer = AutoTokenizer.from_pretrained(released_layout / "model")
    model = AutoModelForCausalLM.from_pretrained(released_layout / "model").eval()
    word, foil, prefix = "sketchy rugs", "rug", "Tara wasn't fixing those"
    target_ids = tokenizer(" " + word, add_special_tokens=False).input_ids
    assert len(target_ids) > 1  # several tokens
    rows = [{"prefix": prefix, "target": word, "evidence": "those"}, {**{"prefix": prefix, "target": word},
            "foil": foil, "evidence": "those"}]  # fmt: skip
    from inseq import load_model

    inseq_model = load_model(model, "alti_logit", tokenizer=tokenizer)
    items, skipped = prepare_targets(tokenizer, read_items(rows, "evidence", False), False, "first")
    assert not skipped and items[0].word == word and items[0].target != word
    plain, contrast = explain_items(inseq_model, items, 4, {})
    prompt = tokenizer(prefix, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(prompt).logits[0, -1]
    foil_id = tokenizer(" " + foil, add_special_tokens=False).input_ids[0]
    for explanation, expected in ((plain, logits[target_ids[0]]), (contrast, logits[target_ids[0]] - logits[foil_id])):
        (column,) = explanation.explained_columns()
        token = explanation.seq.target[explanation.seq.attr_pos_start + column]  # Inseq shows a contrast "foil → it"
        assert token.token.split(" → ")[-1] == tokenizer.convert_ids_to_tokens(target_ids[0])
        logit = explanation.seq.step_scores["contrast_logits_diff" if explanation is contrast else "logit"][column]
        assert float(logit) == pytest.approx(float(expected), abs=1e-4)


def test_whole_word_sums_the_scores_of_every_token(released_layout):
    from transformers import AutoTokenizer

    from inseq_mixing.evaluation.explain import explain_items
    from inseq_mixing.evaluation.targets import prepare_targets

    tokenizer = AutoTokenizer.from_pretrained(released_layout / "model")
    rows = [{"prefix": "Tara wasn't fixing those", "target": "sketchy rugs", "evidence": "those"}]
    items, _ = prepare_targets(tokenizer, read_items(rows, "evidence", False), False, "whole")
    (explanation,) = explain_items(_gpt2_with(tokenizer), items, 4, {})
    columns = explanation.explained_columns()
    assert len(columns) == len(tokenizer(" sketchy rugs", add_special_tokens=False).input_ids)
    summed = sum(explanation.context_scores(column) for column in columns)
    torch.testing.assert_close(explanation.context_scores(columns), summed)
    evaluation = inseq_mixing.evaluate(_gpt2_with(tokenizer), ["alti_logit"], rows, "evidence", target_tokens="whole",
                                       draws=10)  # fmt: skip
    assert evaluation.to_dict()["target_tokens"] == "whole" and evaluation.results["alti_logit"].statistics


def test_unknown_words_keep_their_scores_and_an_unknown_target_skips_only_its_row():
    from inseq import load_model

    from inseq_mixing.testing import word_tokenizer

    tokenizer = word_tokenizer(seq2seq=False)
    model = load_model(tiny_model("gpt2"), "alti_logit", tokenizer=tokenizer)
    rows = [
        {"prefix": "the cat zebra sat on", "target": "the", "evidence": "cat"},  # "zebra" is not in the vocabulary
        {"prefix": "the dog sat on", "target": "xylophone", "evidence": "dog"},  # an unknown target
        {"prefix": "the dog sat on", "target": "the", "foil": "the", "evidence": "dog"},  # target equals foil
    ]
    evaluation = inseq_mixing.evaluate(model, ["alti_logit"], rows, "evidence", draws=10)
    assert evaluation.results["alti_logit"].statistics["mrr"].num.numel() == 1
    assert {skip.row: skip.kind for skip in evaluation.skipped} == {1: "unknown", 2: "target equals foil"}
    assert evaluation.unknown_words == {0: ["zebra"]}
    from inseq_mixing.evaluation.explain import explain_items
    from inseq_mixing.evaluation.targets import prepare_targets

    items, _ = prepare_targets(tokenizer, read_items(rows[:1], "evidence", False), False)
    (explanation,) = explain_items(model, items, 4, {})
    scores = explanation.context_scores(explanation.explained_columns())
    unk = [p for p, token in enumerate(explanation.seq.target) if token.id == tokenizer.unk_token_id]
    assert float(scores[2]) == pytest.approx(float(explanation.seq.target_attributions[unk, 0].sum()))
    assert float(scores[2]) != 0  # the unknown word keeps its token's score


def test_an_all_bad_file_exits_2_and_bad_calls_are_refused_before_any_work(demo_data, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"source": "a b", "prefix": "", "target": "x", "evidence": "[0.5]"}\n')
    code = main(["evaluate", str(bad), "--model", "demo", "--protocol", "evidence", "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert code == 2 and "No row of the data can be evaluated" in err and "0.5 is not an integer" in err
    for flag, value in (("--batch-size", "0"), ("--draws", "0")):
        code = main(["evaluate", str(demo_data["evidence"]), "--model", "demo", "--protocol", "evidence",
                     flag, value, "--out", str(tmp_path / "r.html")])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 2 and "must be a positive integer" in err and "failed" not in err


def test_a_degenerate_interval_is_reported_as_such(demo_data):
    from inseq_mixing.views.eval_report import render_evaluation_report

    with open(demo_data["evidence"]) as handle:
        first = json.loads(handle.readline())
    evaluation = inseq_mixing.evaluate(_demo_model(), ["alti_logit", "alti"], [first], "evidence", draws=10)
    summary = evaluation.to_dict()["methods"]["alti_logit"]
    assert summary["n"] == 1 and summary["degenerate"] == ["mrr"]
    assert "degenerate" in render_evaluation_report(evaluation)
    assert all(math.isnan(bound) for bound in bootstrap_interval(mean_statistic([1.0, 2.0]), draws=0))  # no crash


def test_reports_mark_gold_words_fill_every_baseline_and_fit_1280_pixels(demo_data, tmp_path):
    """The evidence and cue examples mark their gold words, the alignment baseline has its AER, and every report fits
    a 1,280 px window (wide tables scroll inside themselves), measured in headless Chromium."""
    from inseq_mixing.views.eval_report import write_evaluation_report

    model = _demo_model()
    pages = {}
    for protocol, methods in (("evidence", ["alti_logit"]), ("cue", ["value_zeroing"]), ("alignment", ["alti"]),
                              ("faithfulness", ["alti", "value_zeroing", "alti_logit", "decompx", "attention_norm",
                                                "globenc", "attention_rollout", "saliency"])):  # fmt: skip
        evaluation = inseq_mixing.evaluate(model, methods, demo_data[protocol], protocol, draws=10)
        pages[protocol] = write_evaluation_report(evaluation, tmp_path / f"{protocol}.html")
        assert set(evaluation.baseline) == set(evaluation.metrics), f"{protocol}: every baseline cell is filled"
        page = pages[protocol].read_text()
        assert ('<mark class="gold">' in page) == (protocol in ("evidence", "cue"))
        captions = re.findall(r'<table class="heatmap" id="[^"]+"><caption>([^<]*)</caption>', page)
        assert captions and all("full colour at the largest |score| of this table" in text for text in captions)
        assert not re.search(r"<h2>[^<]*</h2>\s*(<h2>|</body>)", page), f"{protocol}: an empty section"
    executable = browser()
    for protocol, path in pages.items():
        width = page_width(executable, path)
        assert width <= 1280, f"the {protocol} report is {width} px wide"


def test_encoder_and_demo_reports_explain_their_colours_and_fit_1280_pixels(encoder_dirs, tmp_path, capsys):  # noqa: F811
    """An encoder model's evidence report and the demo's page, in headless Chromium: each fits a 1,280 px window,
    every coloured table says what its colours mean, and no section is empty."""
    from inseq_mixing.views.demo import run_demo
    from inseq_mixing.views.eval_report import write_evaluation_report

    evaluation = inseq_mixing.evaluate(str(encoder_dirs["mlm"]), ["alti_logit", "alti"], MLM_ROWS[:2], "evidence",
                                       draws=10)  # fmt: skip
    pages = [write_evaluation_report(evaluation, tmp_path / "encoder.html")]
    assert run_demo(tmp_path / "demo.html", methods=["alti_logit", "value_zeroing"], random_draws=1) == 0
    pages.append(tmp_path / "demo.html")
    executable = browser()
    for path in pages:
        page = path.read_text()
        captions = re.findall(r'<table class="heatmap" id="[^"]+"><caption>([^<]*)</caption>', page)
        assert captions and all("full colour at the largest |score| of this table" in text for text in captions)
        assert not re.search(r"<h2>[^<]*</h2>\s*(<h2>|</body>)", page), f"{path.name}: an empty section"
        assert page_width(executable, path) <= 1280, path.name
