"""The ``context`` protocol: gold passages ranked by a span's scores over passages, the answer's probability without
the top-ranked passage, against a random ranking in closed form; each metric recomputed here from its definition."""

import json
import math
import random

import inseq
import pytest
import torch

import inseq_mixing
from inseq_mixing.demo.retrieval import rows as retrieval_rows
from inseq_mixing.demo.retrieval import vocabulary
from inseq_mixing.evaluation import evaluate
from inseq_mixing.evaluation.context import answer_probabilities, ranking_metrics
from inseq_mixing.testing import tiny_model, word_tokenizer


def tiny_retrieval_model(family: str = "llama", method: str = "alti_logit"):
    """A tiny random model with the retrieval task's words."""
    tokenizer = word_tokenizer(seq2seq=False, words=vocabulary())
    return inseq.load_model(tiny_model(family, vocab=len(tokenizer)), method, tokenizer=tokenizer)


def test_ranking_metrics_by_hand():
    scores = torch.tensor([0.1, 0.5, 0.5, -1.0])
    assert ranking_metrics(scores, [1]) == {"mrr": 1 / 1.5, "recall_at_1": 0.0}  # tied first and second: rank 1.5
    assert ranking_metrics(scores, [0, 3]) == {"mrr": 1 / 3, "recall_at_1": 0.0}
    assert ranking_metrics(torch.tensor([0.0, 2.0, 1.0]), [1, 2]) == {"mrr": 1.0, "recall_at_1": 1.0}


def test_answer_probabilities_are_each_prompt_alone():
    """The batched, right-padded probabilities equal the product of the answer tokens' probabilities computed on each
    prompt alone, token by token."""
    model = tiny_retrieval_model()
    tokenizer, net = model.tokenizer, model.model
    prompts = ["alice lives in paris .\n\nwhere does alice live ?", "where does bob live ?"]
    answer = " paris ."
    batched = answer_probabilities(net, tokenizer, prompts, answer, encoder_decoder=False)
    for index, prompt in enumerate(prompts):
        ids = tokenizer(prompt)["input_ids"]
        product = 1.0
        for token in tokenizer(answer)["input_ids"]:
            with torch.no_grad():
                probabilities = net(input_ids=torch.tensor([ids])).logits[0, -1].double().softmax(-1)
            product *= float(probabilities[token])
            ids = ids + [token]
        assert math.isclose(float(batched[index]), product, rel_tol=1e-5)


@pytest.mark.parametrize("hops", [0, 1])
def test_context_protocol_recomputed_from_its_definition(hops):
    """Every row's metrics recomputed from ``model.attribute(..., spans="answer", units=passages)`` and from the
    model's probabilities with each passage taken out; the baseline in closed form."""
    model = tiny_retrieval_model()
    rows = retrieval_rows(6, seed=3)
    rows[0]["gold"] = [0, 2]  # several gold passages
    evaluation = evaluate(model, ["alti_logit", "attn_lrp"], rows, "context", hops=hops, draws=50, batch_size=4)
    expected_metrics = ("mrr", "recall_at_1", "probability_drop")
    if hops:
        expected_metrics += ("mrr_hop0", "recall_at_1_hop0", "mrr_hop1", "recall_at_1_hop1")
    assert evaluation.metrics == expected_metrics
    for method in ("alti_logit", "attn_lrp"):
        attribution = inseq.load_model(model.model, method, tokenizer=model.tokenizer)
        mrr, recall, drops = [], [], []
        for row in rows:
            gold = row["gold"] if isinstance(row["gold"], list) else [row["gold"]]
            prompt = "\n\n".join([*row["passages"], row["question"]])
            out = attribution.attribute(prompt, prompt + row["answer"], spans="answer", units=row["passages"],
                                        hops=hops, show_progress=False)  # fmt: skip
            scores = out.sequence_attributions[0].source_attributions[: len(row["passages"]), 0]
            order = sorted(range(len(scores)), key=lambda k: -float(scores[k]))
            best = min(1 + sum(float(scores[j]) > float(scores[g]) for j in range(len(scores)))
                       + 0.5 * sum(float(scores[j]) == float(scores[g]) for j in range(len(scores)) if j != g)
                       for g in gold)  # fmt: skip
            mrr.append(1 / best)
            recall.append(float(best == 1))
            without = "\n\n".join([*[p for k, p in enumerate(row["passages"]) if k != order[0]], row["question"]])
            full, cut = answer_probabilities(model.model, model.tokenizer, [prompt, without], row["answer"], False)
            drops.append(float(full - cut))
        result = evaluation.results[method].statistics
        assert math.isclose(float(result["mrr"].value()), sum(mrr) / len(mrr), rel_tol=1e-6)
        assert math.isclose(float(result["recall_at_1"].value()), sum(recall) / len(recall), rel_tol=1e-6)
        assert math.isclose(float(result["probability_drop"].value()), sum(drops) / len(drops), rel_tol=1e-5,
                            abs_tol=1e-9)  # fmt: skip
    passages = [len(row["passages"]) for row in rows]
    golds = [len(row["gold"]) if isinstance(row["gold"], list) else 1 for row in rows]
    random_mrr = [sum(math.comb(n - r, m - 1) / math.comb(n, m) / r for r in range(1, n - m + 2))
                  for n, m in zip(passages, golds, strict=True)]  # fmt: skip
    assert math.isclose(evaluation.baseline["mrr"], sum(random_mrr) / len(rows), rel_tol=1e-9)
    assert math.isclose(
        evaluation.baseline["recall_at_1"], sum(m / n for n, m in zip(passages, golds, strict=True)) / len(rows)
    )


def test_context_protocol_bad_rows_are_skipped_with_their_reason():
    model = tiny_retrieval_model()
    rows = retrieval_rows(3, seed=1)
    rows.append({"passages": ["alice lives in paris ."], "question": "where does alice live ?", "gold": 0})
    rows.append({"passages": ["alice lives in paris .", "bob lives in rome ."], "question": "x", "gold": 5})
    evaluation = evaluate(model, ["alti_logit"], rows, "context", draws=10)
    reasons = [skip.reason for skip in evaluation.skipped]
    assert len(reasons) == 2 and "at least two" in reasons[0] and "gold must be the index" in reasons[1]
    with pytest.raises(ValueError, match="no column 'passages'"):
        evaluate(model, ["alti_logit"], [{"text": "x"}], "context")


def test_cli_context_protocol_writes_a_report_with_the_passages(tmp_path, capfd):
    """``inseq-mixing evaluate --protocol context`` on a saved model and a JSONL of rows (the passages as a list):
    the report draws each example's scores over its passages."""
    from inseq_mixing.cli import main

    model = tiny_retrieval_model()
    folder = tmp_path / "model"
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    data = tmp_path / "rows.jsonl"
    rows = retrieval_rows(4, seed=random.Random(0).randrange(100))
    data.write_text("\n".join(json.dumps(row) for row in rows))
    out = tmp_path / "report.html"
    code = main(["evaluate", str(data), "--model", str(folder), "--protocol", "context", "--methods", "alti_logit",
                 "--hops", "1", "--out", str(out), "--json", str(tmp_path / "m.json"), "--draws", "20"])  # fmt: skip
    assert code == 0
    page = out.read_text()
    assert rows[0]["passages"][0] in page and "mrr_hop1" in page
    assert json.loads((tmp_path / "m.json").read_text())["protocol"] == "context"
    shown = capfd.readouterr().err  # every long step has a named bar from its start
    for step in ("context: the answer without each passage", "context: alti_logit explains each answer over its"):
        assert step in shown, step


def test_a_row_without_an_answer_is_explained_for_the_models_own_greedy_answer():
    """A row without ``answer``: the model's greedy continuation of the prompt as written (blank lines kept) is the
    answer: the protocol's metrics equal those of the same row given that answer (the retrieval demo model, whose
    greedy answers hold no special token)."""
    model = inseq_mixing.load_model("demo-retrieval", "alti_logit")
    rows = retrieval_rows(2, seed=5)
    tokenizer = model.tokenizer
    for row in rows:
        row.pop("answer")
    evaluation = evaluate(model, ["alti_logit"], rows, "context", draws=10)
    given = []
    for row in rows:
        prompt = "\n\n".join([*row["passages"], row["question"]])
        ids = torch.tensor([tokenizer(prompt)["input_ids"]])
        greedy = model.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False)[0, ids.shape[1] :]
        answer = " " + tokenizer.decode(greedy, skip_special_tokens=True)
        assert tokenizer(prompt + answer)["input_ids"][ids.shape[1] :] == greedy.tolist()
        given.append({**row, "answer": answer})
    expected = evaluate(model, ["alti_logit"], given, "context", draws=10)
    for metric in expected.metrics:
        assert float(evaluation.results["alti_logit"].statistics[metric].value()) == pytest.approx(
            float(expected.results["alti_logit"].statistics[metric].value())
        )


def test_the_context_report_explains_its_colours_and_fits_1280_pixels(tmp_path):
    """The report of the context protocol (per-hop columns, each example's units against its answer) explains its
    colours and fits a 1,280 px window, measured in headless Chromium."""
    import re

    from inseq_mixing.views.eval_report import write_evaluation_report

    from .test_report import browser, page_width

    model = inseq_mixing.load_model("demo-retrieval", "alti_logit")
    methods = ["alti_logit", "decompx", "attn_lrp", "value_zeroing", "alti", "globenc"]
    evaluation = evaluate(model, methods, retrieval_rows(6, seed=2), "context", hops=2, draws=10)
    path = write_evaluation_report(evaluation, tmp_path / "context.html")
    page = path.read_text()
    captions = re.findall(r'<table class="heatmap" id="[^"]+"><caption>([^<]*)</caption>', page)
    assert captions and all("full colour at the largest |score| of this table" in text for text in captions)
    assert "mrr_hop2" in page and "lives in" in page
    assert page_width(browser(), path) <= 1280
