"""Inputs as users give them, on the encoder, generation and dataset paths: no silent wrong answer, every bad input
named (its row and id, or its position in the call) before the expensive work, the caller's objects left as they
were, and the values people have at hand (NumPy and torch labels, float64 models, Inseq's keyword names) taken as
they mean.

Each test here failed on the code before the fix it checks (watched once)."""

import functools
import json
import os

import inseq
import numpy as np
import pytest
import torch

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.runs import DatasetInputError, load_run
from inseq_mixing.testing import encoder_tokenizer, tiny_encoder, tiny_model, word_tokenizer

from .test_encoders import encoder_dirs  # noqa: F401  (saved tiny encoders: a masked LM and a classifier)


@functools.cache
def tokenizer():
    return encoder_tokenizer()


@functools.cache
def encoder(family: str = "bert", task: str = "masked_lm", dtype: torch.dtype = torch.float32):
    return tiny_encoder(family, task).to(dtype)


def front(method: str, task: str = "masked_lm", family: str = "bert", dtype: torch.dtype = torch.float32):
    return inseq_mixing.load_model(encoder(family, task, dtype), method, tokenizer=tokenizer())


def weights(model) -> dict:
    return {name: value.clone() for name, value in model.state_dict().items()}


# ----- silent wrong answers -----


def test_a_classifier_row_whose_foil_is_its_target_is_skipped_with_the_reason():
    """logit(target) − logit(foil) is 0 for every token when both name one label (by name, or by name and index):
    such rows are left out of the metric, each with its reason, instead of entering it as an all-tied ranking."""
    rows = [
        {"source": "the cat sat on the mat", "target": "positive", "foil": "positive", "evidence": "cat"},
        {"source": "the dog sat on the mat", "target": "positive", "foil": "2", "evidence": "dog"},
        {"source": "the dog sat on a mat", "target": "negative", "foil": "positive", "evidence": "dog"},
    ]
    model = encoder("bert", "sequence_classification")
    result = inseq_mixing.evaluate(model, ["alti_logit"], rows, "evidence", tokenizer=tokenizer(), draws=10)
    assert [(skip.row, skip.kind) for skip in result.skipped] == [(0, "target equals foil"), (1, "target equals foil")]
    assert "share their label" in result.skipped[1].reason
    assert result.method_summary("alti_logit")["n"] == 1


def test_a_dataset_run_never_converts_the_callers_model_object(tmp_path):
    """``dtype=`` that differs from a model object's is refused (as for generation models), and the object, bare or
    inside a front end, keeps its dtype and every weight."""
    model = tiny_encoder("bert", "masked_lm")
    before = weights(model)
    rows = [{"source": "the [MASK] sat"}]
    for given in (model, inseq_mixing.load_model(model, "alti", tokenizer=tokenizer())):
        with pytest.raises(ValueError, match="runs in torch.float32; convert it to torch.bfloat16"):
            inseq_mixing.attribute_dataset(given, "alti", rows, tmp_path / "run", tokenizer=tokenizer(),
                                           dtype="bfloat16", show_progress=False)  # fmt: skip
        assert model.dtype == torch.float32
        assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
    assert not (tmp_path / "run").exists()


def test_a_float64_model_gives_float64_scores_in_memory_and_in_a_stored_run(tmp_path):
    """Precision is kept: encoder outputs and their step scores, Inseq's generation outputs, and a stored run read
    back bit-identical to ``.attribute`` alone."""
    out = front("alti_logit", dtype=torch.float64).attribute(["the [MASK] sat"], show_progress=False)
    seq = out.sequence_attributions[0]
    assert seq.source_attributions.dtype == torch.float64
    assert {score.dtype for score in seq.step_scores.values()} == {torch.float64}
    maps = front("value_zeroing", dtype=torch.float64).attribute("the [MASK] sat", show_progress=False)
    assert maps.sequence_attributions[0].sequence_scores["encoder_self_scores"].dtype == torch.float64
    gpt2 = inseq.load_model(tiny_model("gpt2").double(), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    generated = gpt2.attribute("the cat", "the cat sat", show_progress=False).sequence_attributions[0]
    assert generated.target_attributions.dtype == torch.float64
    assert generated.step_scores["logit"].dtype == torch.float64
    rows = [{"id": "a", "source": "the [MASK] sat on the mat"}, {"id": "b", "source": "a [MASK] sat"}]
    model = encoder("bert", "masked_lm", torch.float64)
    inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "run", tokenizer=tokenizer(),
                                   id_column="id", show_progress=False)  # fmt: skip
    run = load_run(tmp_path / "run")
    for row in rows:
        own = front("alti_logit", dtype=torch.float64).attribute(row["source"], show_progress=False)
        own = own.sequence_attributions[0]
        stored = run[row["id"]]
        assert stored.source_attributions.dtype == torch.float64
        # float64 rounding between a padded batch and the text alone; a float32 store would be ~1e-9 off
        torch.testing.assert_close(stored.source_attributions, own.source_attributions, atol=1e-13, rtol=1e-12)
        torch.testing.assert_close(stored.step_scores["logit"], own.step_scores["logit"], atol=1e-13, rtol=1e-12)


@pytest.mark.parametrize("method", ["alti_logit", "decompx", "attn_lrp"])
def test_inseqs_contrast_targets_are_the_encoders_foils(method):
    """An option the method lists is never ignored: ``contrast_targets=`` explains logit(target) − logit(foil)
    exactly as ``foils=`` does, named so in the step scores."""
    model = front(method)
    plain = model.attribute("the [MASK] sat", "cat", show_progress=False).sequence_attributions[0]
    foils = model.attribute("the [MASK] sat", "cat", "dog", show_progress=False).sequence_attributions[0]
    inseq_named = model.attribute("the [MASK] sat", "cat", contrast_targets="dog", show_progress=False)
    named = inseq_named.sequence_attributions[0]
    assert torch.equal(named.source_attributions, foils.source_attributions)
    assert not torch.equal(named.source_attributions, plain.source_attributions)
    assert "contrast_logits_diff" in named.step_scores and "logit" not in named.step_scores
    assert inseq_named.info["attributed_fn"] == "contrast_logits_diff"
    with pytest.raises(ValueError, match="Give the foils once"):
        model.attribute("the [MASK] sat", "cat", "dog", contrast_targets="dog", show_progress=False)
    with pytest.raises(ValueError, match="no contrastive form"):
        front("value_zeroing").attribute("the [MASK] sat", "cat", "dog", show_progress=False)


def test_generated_targets_say_their_length_and_take_max_new_tokens(tmp_path, capsys):
    """A model whose generation config sets no length generates transformers' default of 20 new tokens: a run says
    so once; ``max_new_tokens`` sets it, in dataset runs (and their identity), in ``compare`` and on the command
    line."""
    from inseq_mixing.frontends.generation import GenerationLengthWarning

    model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    assert model.model.generation_config.max_length is None and model.model.generation_config.max_new_tokens is None
    rows = [{"id": "a", "source": "the cat"}, {"id": "b", "source": "a dog sat"}]
    with pytest.warns(GenerationLengthWarning, match="at most 20 new tokens") as caught:
        inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "default", id_column="id",
                                       show_progress=False)  # fmt: skip
    assert len([w for w in caught if issubclass(w.category, GenerationLengthWarning)]) == 1
    inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "short", id_column="id", max_new_tokens=2,
                                   show_progress=False)  # fmt: skip
    run = load_run(tmp_path / "short")
    assert run.manifest["options"]["max_new_tokens"] == 2
    for row in rows:
        prompt = len(row["source"].split())
        assert len(run[row["id"]].target) == prompt + 2  # 2 new tokens (the tiny model never ends early here)
    assert len(load_run(tmp_path / "default")["a"].target) == 2 + 20
    compared = inseq_mixing.compare(model, ["alti_logit"], "the cat", max_new_tokens=3, random_draws=1)
    assert len(compared.outputs["alti_logit"].sequence_attributions[0].target) == 2 + 3
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"source": "the cat"}))
    code = main(["attribute-dataset", str(data), "--model", "demo", "--method", "alti", "--out", str(tmp_path / "c")])
    assert code == 0 and "note: The model's generation config sets no length" in capsys.readouterr().err
    code = main(["attribute-dataset", str(data), "--model", "demo", "--method", "alti", "--max-new-tokens", "2",
                 "--out", str(tmp_path / "d")])  # fmt: skip
    assert code == 0 and "note:" not in capsys.readouterr().err


# ----- crashes -----


def test_an_encoder_row_without_a_target_alone_in_its_batch_stores_the_prediction(tmp_path):
    rows = [{"id": "a", "source": "the [MASK] sat"}, {"id": "b", "source": "a [MASK] sat on the mat", "target": "dog"}]
    model = encoder()
    inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "run", tokenizer=tokenizer(), batch_size=1,
                                   id_column="id", show_progress=False)  # fmt: skip
    run = load_run(tmp_path / "run")
    for row in rows:
        own = front("alti_logit").attribute(row["source"], row.get("target"), show_progress=False)
        assert torch.equal(run[row["id"]].source_attributions, own.sequence_attributions[0].source_attributions)


def test_labels_and_positions_as_numpy_or_torch_values():
    model = front("alti_logit", "sequence_classification")
    texts = ["the cat sat", "a dog sat"]
    expected = model.attribute(texts, [0, 2], show_progress=False)
    for labels in (np.array([0, 2]), torch.tensor([0, 2]), [np.int64(0), np.int64(2)], (torch.tensor(0), 2)):
        got = model.attribute(texts, labels, show_progress=False)
        for mine, theirs in zip(got.sequence_attributions, expected.sequence_attributions, strict=True):
            assert torch.equal(mine.source_attributions, theirs.source_attributions)
    alone = model.attribute("the cat sat", np.int64(2), show_progress=False).sequence_attributions[0]
    assert alone.target[0].token == "positive"
    tokens = front("alti", "token_classification")
    listed = tokens.attribute(texts, positions=[1, 2], show_progress=False)
    for positions in (np.array([1, 2]), torch.tensor([1, 2]), [np.int64(1), np.int64(2)]):
        got = tokens.attribute(texts, positions=positions, show_progress=False)
        assert [len(seq.target) for seq in got.sequence_attributions] == [2, 2]
        assert torch.equal(got.sequence_attributions[1].source_attributions,
                           listed.sequence_attributions[1].source_attributions)  # fmt: skip


def test_a_whitespace_prompt_is_the_empty_prompt_and_a_whitespace_target_is_generated(tmp_path):
    """Text of whitespace only is no text: a decoder-only prompt of spaces starts from BOS like an empty one (it
    stopped the run with ZeroDivisionError), a target of spaces is generated like an empty one (it was forced)."""
    gpt2 = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    rows = [{"id": "spaces", "source": "   "}, {"id": "empty", "source": ""}]
    inseq_mixing.attribute_dataset(gpt2, "alti_logit", rows, tmp_path / "prompts", id_column="id", max_new_tokens=3,
                                   show_progress=False)  # fmt: skip
    run = load_run(tmp_path / "prompts")
    assert [t.token for t in run["spaces"].target] == [t.token for t in run["empty"].target]
    assert run["spaces"].target[0].token == "<s>"
    torch.testing.assert_close(run["spaces"].target_attributions, run["empty"].target_attributions, equal_nan=True)
    marian = inseq.load_model(tiny_model("marian"), "alti", tokenizer=word_tokenizer(seq2seq=True))
    rows = [{"id": "spaces", "source": "the cat", "target": "   "}, {"id": "empty", "source": "the cat", "target": ""}]
    inseq_mixing.attribute_dataset(marian, "alti", rows, tmp_path / "targets", id_column="id", max_new_tokens=3,
                                   show_progress=False)  # fmt: skip
    run = load_run(tmp_path / "targets")
    assert [t.token for t in run["spaces"].target] == [t.token for t in run["empty"].target]
    assert len(run["spaces"].target) > 2  # generated, not forced to an empty translation


# ----- unclear or late errors -----


def test_bad_encoder_rows_are_named_by_row_and_id_before_any_work(tmp_path):
    model = encoder()
    rows = [{"id": "a", "source": "the [MASK] sat"}, {"id": "b", "source": "the cat sat"}]
    with pytest.raises(DatasetInputError, match=r"Row 1 \(id 'b'\) has no mask token"):
        inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "run", tokenizer=tokenizer(),
                                       id_column="id", show_progress=False)  # fmt: skip
    rows = [{"id": "a", "source": "the cat", "target": "neutral"}, {"id": "b", "source": "a dog", "target": "good"}]
    with pytest.raises(DatasetInputError, match=r"Row 1 \(id 'b'\): Unknown label 'good'"):
        inseq_mixing.attribute_dataset(encoder("bert", "sequence_classification"), "alti", rows, tmp_path / "run",
                                       tokenizer=tokenizer(), id_column="id", show_progress=False)  # fmt: skip
    assert not (tmp_path / "run").exists()  # refused before the store was made
    with pytest.raises(ValueError, match="Text 3 has no mask token"):  # the text's place in the call, not its batch
        front("alti_logit").attribute(["a [MASK]", "the [MASK]", "a [MASK] sat", "no mask"], batch_size=2,
                                      show_progress=False)  # fmt: skip


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "bert"])
def test_an_input_past_the_position_table_is_refused_with_the_reason(family):
    """RoBERTa's family counts positions from ``padding_idx + 1``: its longest input is the table's size minus that
    offset (roberta-base: 512 of 514), not the table's size, at which the model itself fails."""
    model = encoder(family)
    offset = model.config.pad_token_id + 1 if family != "bert" else 0
    longest = model.config.max_position_embeddings - offset
    fits = " ".join(["the"] * (longest - 3)) + " [MASK]"  # + [CLS] and [SEP]: the longest input
    front("alti", family=family).attribute(fits, show_progress=False)
    too_long = "the " + fits
    ids = torch.tensor([tokenizer()(too_long).input_ids])
    assert ids.shape[1] == longest + 1
    if offset:
        with pytest.raises((IndexError, RuntimeError), match="out of"):  # the model itself cannot take it
            model(input_ids=ids)
    with pytest.raises(ValueError, match=rf"Text 0 has {longest + 1} tokens.*reads {longest} at most"):
        front("alti", family=family).attribute(too_long, show_progress=False)


def test_the_attribute_command_sends_encoder_models_to_the_commands_that_take_them(encoder_dirs, capsys):  # noqa: F811
    code = main(["attribute", "-m", str(encoder_dirs["mlm"]), "-a", "alti", "-i", "the [MASK] sat"])
    err = capsys.readouterr().err
    assert code == 2 and "is an encoder-only model" in err and "inseq_mixing.load_model" in err
    assert "Traceback" not in err


def test_a_float64_modernbert_batch_with_padding_equals_each_text_alone():
    """transformers' float64 masking of a padded ModernBERT batch puts NaN into the real tokens: the front end runs
    such texts one at a time, so a batch gives each text what it gets alone, with every method."""
    model = tiny_encoder("modernbert", "masked_lm", layers=4).double()  # deep enough for the NaN to reach them
    texts = ["the [MASK] sat on the mat and it was read by many people", "a [MASK] sat"]
    encoded = tokenizer()(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask).logits
    assert not torch.isfinite(logits[encoded.attention_mask.bool()]).all()  # the model's own padded batch
    for method in ("alti_logit", "value_zeroing", "decompx", "attention_norm"):
        attribution = inseq_mixing.load_model(model, method, tokenizer=tokenizer())
        batch = attribution.attribute(texts, show_progress=False)
        for text, seq in zip(texts, batch.sequence_attributions, strict=True):
            own = attribution.attribute(text, show_progress=False).sequence_attributions[0]
            assert torch.isfinite(seq.source_attributions).all()
            assert torch.equal(seq.source_attributions, own.source_attributions)


def test_a_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="batch_size must be a positive integer, not 0"):
        front("alti").attribute("the [MASK] sat", batch_size=0, show_progress=False)


# ----- usability -----


def test_map_methods_give_a_masked_lms_maps_for_a_text_without_a_mask():
    """The maps are there without a mask (the authors' code gives them on any sentence): the rows of ``positions=``
    (default: the first token) with the full token-to-token map, and the output says nothing is explained; the logit
    methods, which explain a mask's logit, refuse the text."""
    out = front("value_zeroing").attribute(["the cat sat", "the [MASK] sat"], show_progress=False, per_layer=True)
    plain, masked = out.sequence_attributions
    assert [token.token for token in plain.target] == ["[CLS]"]
    maps = plain.sequence_scores["encoder_self_scores"]  # (tokens, tokens, layers)
    assert maps.shape[:2] == (5, 5)
    torch.testing.assert_close(maps.sum(0), torch.ones(5, maps.shape[-1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(plain.source_attributions[:, 0], maps[:, 0])
    assert "a text without a mask" in out.info["explained"] and "no logit" in out.info["explained"]
    rows = front("alti").attribute("the cat sat", positions=[1, 3], show_progress=False).sequence_attributions[0]
    assert [token.token for token in rows.target] == ["the", "sat"]
    with pytest.raises(ValueError, match="Text 0 has no mask token"):
        front("alti_logit").attribute("the cat sat", show_progress=False)
    with pytest.raises(ValueError, match="no mask token, so there is no word to give a target"):
        front("alti").attribute("the cat sat", "dog", show_progress=False)


def test_the_readmes_test_command_draws_the_same_examples_every_run():
    """Without ``HYPOTHESIS_PROFILE`` (a user's plain ``python -m pytest``), property tests are derandomized."""
    from hypothesis import settings

    if os.environ.get("HYPOTHESIS_PROFILE") in (None, "", "default", "ci"):
        assert settings.default.derandomize
