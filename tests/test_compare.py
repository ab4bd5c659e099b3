"""compare(): faithfulness metrics on a model whose answer is known, rank agreement, tables, every family."""

import csv
import json
from types import SimpleNamespace

import pytest
import torch

import inseq_mixing
from inseq_mixing.evaluation import compare, faithfulness, rank_correlation
from inseq_mixing.evaluation.faithfulness import TokenExample, perturbed_contexts
from inseq_mixing.testing import ALL_FAMILIES, MOE_FAMILIES, load_tiny

from .test_inseq_glue import CONTINUATION, PROMPT, SOURCE, TARGET

KEY, ANSWER, VOCAB = 7, 9, 20


class CountingLM(torch.nn.Module):
    """A decoder-only 'model' whose logit for ANSWER is 3 × the number of KEY tokens in its input."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, decoder_input_ids=None):
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[:, -1, ANSWER] = 3.0 * (input_ids == KEY).sum(-1)
        return SimpleNamespace(logits=logits)


def counting_example() -> TokenExample:
    ids = torch.tensor([4, 5, KEY, 6, 8, 10, 11, 12, ANSWER])
    return TokenExample(None, ids, position=8, candidates=torch.ones(8, dtype=torch.bool))


def test_perturbed_contexts_remove_or_keep_the_top_tokens():
    example = counting_example()
    ranking = torch.tensor([2, 0, 1, 3, 4, 5, 6, 7])
    removed, kept = perturbed_contexts(example, ranking, (0.1, 0.5), replacement_id=0)
    assert removed[0].tolist() == [4, 5, 0, 6, 8, 10, 11, 12]  # ceil(0.8) = 1 token: KEY
    assert (removed[1] == 0).sum() == 4 and (kept[1] == 0).sum() == 4
    assert kept[0].tolist() == [0, 0, KEY, 0, 0, 0, 0, 0]


def test_faithful_ranking_beats_random_and_unfaithful_one_loses():
    example = counting_example()
    key_first = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    good = faithfulness(CountingLM(), example, key_first, random_draws=5)
    assert good["comprehensiveness_logit"] == pytest.approx(3.0) and good["sufficiency_logit"] == pytest.approx(0.0)
    assert good["random_comprehensiveness_logit"] < 3.0 and good["random_sufficiency_logit"] > 0.0
    bad = faithfulness(CountingLM(), example, -key_first, fractions=(0.1, 0.2), random_draws=0)
    assert bad["comprehensiveness_logit"] == 0.0 and bad["sufficiency_logit"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="candidate"):
        faithfulness(CountingLM(), example, key_first[:3])


def test_aopc_is_the_mean_drop_of_probability_and_logit_over_each_perturbation():
    """One AOPC for every front end: comprehensiveness reads the inputs with the top removed, sufficiency those with
    only the top kept, each the mean drop below the unperturbed reading (encoder-only models: deletion, below)."""
    from inseq_mixing.evaluation.faithfulness import aopc_scores, removal_faithfulness

    readings = {"removed": (torch.tensor([0.4, 0.2]), torch.tensor([4.0, 1.0])),
                "kept": (torch.tensor([0.5, 0.6]), torch.tensor([3.0, 2.0]))}  # fmt: skip
    scores = aopc_scores(lambda name: readings[name], "removed", "kept", (torch.tensor([0.7]), torch.tensor([5.0])))
    assert scores == pytest.approx({"comprehensiveness_prob": 0.4, "comprehensiveness_logit": 2.5,
                                    "sufficiency_prob": 0.15, "sufficiency_logit": 2.5})  # fmt: skip
    seen = []

    def read(masks):  # the number of tokens left, as a logit; a tenth of it as a probability
        seen.append(masks.tolist())
        left = masks.sum(1).float()
        return left / 10, left

    # 5 tokens (or units), 0 and 4 never removed; the scores rank token 3 first, then 1, then 2
    candidates = torch.tensor([False, True, True, True, False])
    scores = removal_faithfulness(read, torch.tensor([9.0, 0.5, 0.1, 0.9, 9.0]), candidates, (1 / 3, 2 / 3), 0,
                                  torch.Generator())  # fmt: skip
    assert seen[0] == [[True] * 5]  # the unperturbed reading: 5 left, (0.5, 5.0)
    assert seen[1] == [[True, True, True, False, True], [True, False, True, False, True]]  # the top deleted
    assert seen[2] == [[True, False, False, True, True], [True, True, False, True, True]]  # only the top kept
    ranked = {name: value for name, value in scores.items() if not name.startswith("random_")}
    assert ranked == pytest.approx({"comprehensiveness_prob": 0.15, "comprehensiveness_logit": 1.5,
                                    "sufficiency_prob": 0.15, "sufficiency_logit": 1.5})  # fmt: skip


def test_rank_correlation():
    values = torch.tensor([0.3, 0.1, 0.9, 0.5])
    assert rank_correlation(values, values * 2 + 1) == pytest.approx(1.0)
    assert rank_correlation(values, -values) == pytest.approx(-1.0)


#: The comparison is family-blind above the methods: one mixture of experts stands for the others (each costs ~25 s of
#: perturbed forward passes through the experts' loop on this CPU; every method runs on each in the other tests).
COMPARED_FAMILIES = [family for family in ALL_FAMILIES if family not in MOE_FAMILIES] + ["qwen2_moe", "deepseek_v3"]


@pytest.mark.parametrize("family", COMPARED_FAMILIES)
def test_compare_every_method_on_every_family(family, tmp_path):
    model = load_tiny(family, "alti")
    text, target = (SOURCE, TARGET) if model.is_encoder_decoder else (PROMPT, CONTINUATION)
    methods = [*inseq_mixing.METHODS, "integrated_gradients", "deeplift"]
    result = compare(
        model, methods, text, target, fractions=(0.5,), random_draws=1,
        method_kwargs={"integrated_gradients": {"n_steps": 4}},
    )  # fmt: skip
    assert list(result.outputs) == methods
    generated = {row["position"] for row in result.tokens}
    assert len(result.tokens) == len(methods) * len(generated) > 0
    assert all(torch.isfinite(torch.tensor(row["comprehensiveness_logit"])) for row in result.tokens)
    assert len(result.agreement) == len(generated) * len(methods) * (len(methods) - 1) // 2
    summary = {row["method"]: row for row in result.summary()}
    assert set(summary) == set(methods) and summary["decompx"]["tokens"] == len(generated)
    with result.to_csv(tmp_path / "tokens.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(result.tokens)
    saved = json.loads(result.to_json(tmp_path / "result.json").read_text())
    assert saved["summary"][0]["method"] == methods[0] and len(saved["agreement"]) == len(result.agreement)


def test_forced_targets_are_the_same_for_every_method():
    model = load_tiny("gpt2", "alti")
    result = compare(model, ["alti_logit", "deeplift"], PROMPT, fractions=(0.5,), random_draws=0)
    first, second = (out.sequence_attributions[0] for out in result.outputs.values())
    assert [t.token for t in first.target] == [t.token for t in second.target]


def test_unknown_method_is_refused():
    with pytest.raises(ValueError, match="Unknown attribution method"):
        compare(load_tiny("gpt2", "alti"), ["alti", "magic"], PROMPT, CONTINUATION)


def test_every_method_of_a_comparison_explains_the_logit_and_says_so(tmp_path):
    """By default a comparison explains one quantity with every method: the gradient baselines explain the logit as
    the logit methods do (their scores are Inseq's with ``attributed_fn="logit"``, not its default probability), and
    the summary, the terminal table and the report name each method's quantity; ``attributed_fn=None`` gives each
    method its own default, and says so."""
    import inseq

    from inseq_mixing.views.report import write_report

    model = load_tiny("marian", "alti")
    methods = ["alti_logit", "saliency", "alti"]
    result = compare(model, methods, SOURCE, TARGET, fractions=(0.5,), random_draws=0)
    assert {row["method"]: row["explains"] for row in result.summary()} == {
        "alti_logit": "logit", "saliency": "logit", "alti": "map"}  # fmt: skip
    saliency = inseq.load_model(model.model, "saliency", tokenizer=model.tokenizer)
    by_logit = saliency.attribute(SOURCE, TARGET, attribute_target=True, attributed_fn="logit", show_progress=False)
    by_default = saliency.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False)
    compared = result.outputs["saliency"].sequence_attributions[0].source_attributions
    assert torch.equal(compared, by_logit.sequence_attributions[0].source_attributions)
    assert not torch.allclose(compared, by_default.sequence_attributions[0].source_attributions)
    page = write_report(result, tmp_path / "r.html").read_text()
    assert page.count("<td>logit</td>") == 2 and page.count("<td>map</td>") == 1 and "<th>explains</th>" in page
    import re

    captions = dict(re.findall(r'<table class="heatmap" id="([^"]+)"><caption>([^<]*)</caption>', page))
    assert set(captions) == {f"{method}-0-{side}" for method in methods for side in ("source", "target")}
    assert all("full colour at the largest |score| of this table" in caption for caption in captions.values())
    assert "blue lowers it" in captions["alti_logit-0-source"] and "no sign" in captions["alti-0-source"]
    assert "blank: a token the position cannot see" in captions["alti-0-target"]  # the causal half
    metrics = re.search(r'<table id="metrics">.*?</table>', page).group(0)
    agreement = re.search(r'<table id="agreement">(.*?)</table>', page).group(1)
    assert "spearman" not in metrics and all(f"<th>{method}</th>" in agreement for method in methods)
    assert page.count('<p class="example">sentence 1: ') == len(methods)  # every example captioned
    shown = write_report(result, tmp_path / "short.html", examples=0).read_text()
    assert '<p class="example">' not in shown and "The first 0 of 1 sentences." in shown

    own = compare(model, ["saliency"], SOURCE, TARGET, fractions=(0.5,), random_draws=0, attributed_fn=None)
    assert own.summary()[0]["explains"] == "probability"
