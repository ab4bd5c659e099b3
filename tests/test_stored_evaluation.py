"""Evaluating a stored run: the faithfulness of a dataset run's method read from its store (nothing attributed again)
equals evaluating the method from the model on the same rows."""

import json

import pytest
import torch

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.demo import MODEL_DIR
from inseq_mixing.evaluation import EvaluationInputError, read_items
from inseq_mixing.evaluation import stored as stored_module
from inseq_mixing.testing import tiny_model, word_tokenizer

from .test_encoders import CLF_ROWS, encoder_dirs  # noqa: F401  (saved tiny encoders: a masked LM and a classifier)
from .test_evaluation import demo_data  # noqa: F401  (the demo grammar's annotated data)

METRICS = ("comprehensiveness_prob", "sufficiency_prob", "comprehensiveness_logit", "sufficiency_logit")


def same_scores(stored, direct, method: str) -> None:
    """The same items and the same mean metrics and random baselines (attributions batched differently agree to
    float32 rounding, so the rankings and the model's readings on the perturbed texts are the same)."""
    for metric in METRICS:
        mine, theirs = stored.results[method].statistics[metric], direct.results[method].statistics[metric]
        torch.testing.assert_close(mine.num, theirs.num, atol=1e-4, rtol=1e-4)  # per explained token, in order
        assert stored.baseline[metric] == pytest.approx(direct.baseline[metric], abs=1e-4)


@pytest.fixture(scope="module")
def demo_run(demo_data, tmp_path_factory):  # noqa: F811
    """A dataset run of the demo model (saved folder: its manifest names it) on the faithfulness rows."""
    items = read_items(demo_data["faithfulness"], "faithfulness", True)
    rows = [{"id": f"r{item.row}", "source": item.source, "target": item.generated_text} for item in items]
    out = tmp_path_factory.mktemp("runs") / "demo"
    inseq_mixing.attribute_dataset(str(MODEL_DIR), "alti_logit", rows, out, id_column="id", show_progress=False)
    return out


def test_a_generation_run_is_evaluated_from_its_store_as_from_the_model(demo_run, demo_data, monkeypatch):  # noqa: F811
    direct = inseq_mixing.evaluate(str(MODEL_DIR), ["alti_logit"], demo_data["faithfulness"], "faithfulness", draws=50)
    attributed = []
    original = inseq_mixing.frontends.inseq_adapter.base.ContextMixingAttribution.attribute
    monkeypatch.setattr(
        inseq_mixing.frontends.inseq_adapter.base.ContextMixingAttribution,
        "attribute",
        lambda *args, **kwargs: attributed.append(1) or original(*args, **kwargs),
    )
    stored = inseq_mixing.evaluate(demo_run, draws=50)  # a run folder: its method, its model, its rows
    assert not attributed  # read from the store: no attribution ran
    assert list(stored.results) == ["alti_logit"] and stored.protocol == "faithfulness"
    same_scores(stored, direct, "alti_logit")


def test_an_encoder_run_is_evaluated_from_its_store_as_from_the_model(encoder_dirs, tmp_path):  # noqa: F811
    folder = str(encoder_dirs["clf"])
    rows = [{"id": f"r{n}", **row} for n, row in enumerate(CLF_ROWS[:2])]
    direct = inseq_mixing.evaluate(folder, ["alti"], rows, "faithfulness", draws=50)
    inseq_mixing.attribute_dataset(folder, "alti", rows, tmp_path / "run", id_column="id", show_progress=False)
    stored = inseq_mixing.evaluate(inseq_mixing.load_run(tmp_path / "run"), draws=50)
    same_scores(stored, direct, "alti")


def test_a_run_is_refused_what_its_store_cannot_answer(demo_run, tmp_path):
    with pytest.raises(EvaluationInputError, match="annotation columns"):
        inseq_mixing.evaluate(demo_run, protocol="evidence")
    other = tiny_model("marian")  # not the run's weights
    with pytest.raises(EvaluationInputError, match="weights are not the ones"):
        stored_module.evaluate_run(demo_run, model=other, tokenizer=word_tokenizer())
    with pytest.raises(ValueError, match="stored run"):
        inseq_mixing.evaluate(str(MODEL_DIR))  # a model without methods, data or protocol


def test_the_cli_evaluates_a_stored_run(demo_run, tmp_path, capsys):
    out, metrics = tmp_path / "report.html", tmp_path / "metrics.json"
    code = main(["evaluate", "--run", str(demo_run), "--out", str(out), "--json", str(metrics), "--draws", "20"])
    assert code == 0, capsys.readouterr().err
    content = json.loads(metrics.read_text())
    assert content["protocol"] == "faithfulness" and list(content["methods"]) == ["alti_logit"]
    assert 'id="metrics"' in out.read_text()
    assert main(["evaluate", "data.jsonl", "--run", str(demo_run)]) == 2
    assert "no data file" in capsys.readouterr().err
