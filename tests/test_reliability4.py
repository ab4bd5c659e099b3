"""Reliability round 4: images, spans, flows and runs with any input. Each test here failed before its fix (the
pages and saved files: :mod:`tests.test_hostile_pages`)."""

import json

import inseq
import numpy as np
import pandas as pd
import pytest
import torch
import transformers
from PIL import Image

import inseq_mixing
from inseq_mixing.cli import main
from inseq_mixing.evaluation.vision import patch_reader, ranking_metrics
from inseq_mixing.frontends.vision import ImageError, read_image
from inseq_mixing.testing import (
    encoder_tokenizer,
    image_processor,
    randomize_weights,
    synthetic_image,
    tiny_encoder,
    tiny_model,
    tiny_vision,
    word_tokenizer,
)

# ----- silent wrong answers -----


def vit():
    return inseq_mixing.load_model(tiny_vision("vit"), "value_zeroing", processor=image_processor())


def test_image_faithfulness_of_a_map_method_reads_the_rows_label_not_class_0(tmp_path):
    """A map method's explained entry is [CLS], whose id is its position (0): the curves must read the row's label
    (here 2), or the prediction without one, as for a logit method."""
    front = vit()
    path = tmp_path / "image.png"
    Image.fromarray(synthetic_image(32, seed=1)).save(path)
    image = read_image(path, "image")
    inputs, _, (grid,) = front.encode([image])
    steps = 4
    for label in ("positive", None):
        rows = [{"image": str(path), **({"label": label} if label else {})}]
        evaluation = inseq_mixing.evaluate(front, ["value_zeroing"], rows, "faithfulness", steps=steps,
                                           random_draws=1, draws=10)  # fmt: skip
        scores = front.attribute(image, show_progress=False).sequence_attributions[0].source_attributions
        ranking = torch.argsort(scores[1:, 0].float(), descending=True, stable=True)  # the layers' mean: one map
        with torch.no_grad():
            predicted = int(front.model(**inputs).logits[0].argmax())
        explained = 2 if label else predicted
        assert explained != 0
        read = patch_reader(front, inputs, front.mean_colour(inputs), grid, explained)
        expected = ranking_metrics(read, ranking, grid[0] * grid[1], steps)
        got = evaluation.results["value_zeroing"].statistics
        for metric in ("deletion_auc", "comprehensiveness_prob"):
            assert float(got[metric].value()) == pytest.approx(expected[metric], abs=1e-6), (label, metric)


def test_image_comparisons_read_the_label_for_map_methods():
    front = vit()
    image = synthetic_image(32, seed=1)
    comparison = inseq_mixing.compare(front, ["value_zeroing", "alti_logit"], [image], [2], fractions=(0.5,),
                                      random_draws=1)  # fmt: skip
    rows = {row["method"]: row for row in comparison.tokens}
    for metric in ("random_comprehensiveness_prob", "random_sufficiency_prob"):  # the same rankings, the same label
        assert rows["value_zeroing"][metric] == pytest.approx(rows["alti_logit"][metric], abs=1e-7), metric


def test_unknown_words_stay_in_their_passage_and_their_span():
    model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    prompt = "the cat sat zebra .\n\nthe dog okapi sat ."
    generated = prompt + " she read quokka ."
    out = model.attribute(prompt, generated, spans="answer", units="passages", show_progress=False)
    unk = model.tokenizer.unk_token_id
    ids = model.tokenizer(generated)["input_ids"]
    unknown = [index for index, token in enumerate(ids) if token == unk]
    assert len(unknown) == 3
    keys = out.info["unit_keys"][0]
    assert out.info["units"][0][:2] == ["the cat sat zebra .", "the dog okapi sat ."]
    assert unknown[0] in keys[0] and unknown[1] in keys[1]
    assert "(rest of the text)" not in out.info["units"][0]  # nothing but markup is left out (GPT-2 has none here)
    assert unknown[2] in out.info["span_tokens"][0][0] if isinstance(out.info["span_tokens"][0][0], list) else \
        unknown[2] in out.info["span_tokens"][0]  # fmt: skip


def test_16_bit_images_are_scaled_and_out_of_range_values_refused(tmp_path):
    eight = synthetic_image(16, seed=2)  # (16, 16, 3) uint8
    grey = eight[..., 0]
    wide = grey.astype(np.uint16) * 257  # the same grey image in 16 bits
    assert np.array_equal(np.asarray(read_image(wide, "x")), np.asarray(read_image(grey, "x")))
    Image.fromarray(wide).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    assert np.array_equal(np.asarray(read_image(tmp_path / "grey16.png", "x")), np.asarray(read_image(grey, "x")))
    normalised = torch.from_numpy(eight).permute(2, 0, 1).float() / 127.5 - 1  # in [-1, 1]
    with pytest.raises(ImageError, match=r"Image 4 has values from -1 to 1: .*refused, not clipped"):
        read_image(normalised, "Image 4")
    with pytest.raises(ImageError, match="Image 5 is an array of int32 with values from 0 to 300"):
        read_image(np.linspace(0, 300, 64).reshape(8, 8).astype(np.int32), "Image 5")
    front = vit()
    with pytest.raises(ImageError, match="Image 1 has values from -1"):
        front.attribute([eight, normalised], show_progress=False)


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 12, 3), (12, 0)])
def test_an_image_without_pixels_is_refused_naming_it(shape):
    with pytest.raises(ImageError, match=r"Image 0 is \d+ × \d+ pixels: give an image with pixels"):
        vit().attribute(np.zeros(shape, dtype=np.uint8), show_progress=False)
    with pytest.raises(ImageError, match="give an image with pixels"):
        read_image(Image.new("RGB", (shape[1], shape[0])), "Image 0")


# ----- crashes, lost work, caller objects -----


def deit_with_teacher():
    model = transformers.DeiTForImageClassificationWithTeacher(tiny_vision("deit").config)
    randomize_weights(model, 1)
    return model.eval()


def test_deit_with_its_teacher_takes_label_indices_in_attribute_and_evaluate():
    model = deit_with_teacher()
    front = inseq_mixing.load_model(model, "alti_logit", processor=image_processor())
    image = synthetic_image(32, seed=3)
    out = front.attribute(image, 2, show_progress=False)
    assert out.sequence_attributions[0].target[0].id == 2
    with torch.no_grad():
        logits = model(**front.encode([read_image(image, "x")])[0]).logits[0]
    sequence = out.sequence_attributions[0]
    terms = sum(value for key, value in sequence.step_scores.items() if key.startswith("unattributed_"))
    torch.testing.assert_close(sequence.source_attributions.sum(0) + terms, logits[2:3], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="Label index 7 is outside the model's 3 labels"):
        front.attribute(image, 7, show_progress=False)


def test_integral_float_labels_are_labels_and_a_missing_one_is_a_skipped_row(tmp_path):
    front = inseq_mixing.load_model(tiny_vision("vit"), "alti_logit", processor=image_processor())
    paths = []
    for index in range(3):
        paths.append(str(tmp_path / f"{index}.png"))
        Image.fromarray(synthetic_image(32, seed=index)).save(paths[-1])
    assert front.attribute(paths[0], 2.0, show_progress=False).sequence_attributions[0].target[0].id == 2
    assert front.attribute(paths[0], "1.0", show_progress=False).sequence_attributions[0].target[0].id == 1
    with pytest.raises(ValueError, match="A label is a name or a whole index, not 1.5"):
        front.attribute(paths[0], 1.5, show_progress=False)
    frame = pd.DataFrame({"image": paths, "label": [2.0, np.nan, 1.0]})  # pandas reads the column as floats
    evaluation = inseq_mixing.evaluate(front, ["alti_logit"], frame, "faithfulness", steps=2, random_draws=1,
                                       draws=10)  # fmt: skip
    assert [skip.row for skip in evaluation.skipped] == [1]
    assert "Row 1 has no label" in evaluation.skipped[0].reason
    assert float(evaluation.results["alti_logit"].statistics["deletion_auc"].den.sum()) == 2
    encoder = inseq_mixing.load_model(tiny_encoder("bert", "sequence_classification"), "alti_logit",
                                      tokenizer=encoder_tokenizer())  # fmt: skip
    frame = pd.DataFrame({"source": ["the cat sat", "the dog sat", "a cat"], "target": [2.0, np.nan, 1.0]})
    evaluation = inseq_mixing.evaluate(encoder, ["alti_logit"], frame, "faithfulness", random_draws=1, draws=10)
    assert [skip.row for skip in evaluation.skipped] == [1]


def test_load_model_refuses_before_converting_the_callers_model():
    model = tiny_encoder("bert")
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises(ValueError, match="Unknown method 'nonexistent'"):
        inseq_mixing.load_model(model, "nonexistent", tokenizer=encoder_tokenizer(), dtype=torch.bfloat16)
    after = model.state_dict()
    assert all(after[name].dtype == value.dtype and torch.equal(after[name], value) for name, value in before.items())
    generation = tiny_model("gpt2")
    with pytest.raises(Exception, match="nonexistent"):
        inseq_mixing.load_model(generation, "nonexistent", tokenizer=word_tokenizer(seq2seq=False),
                                dtype=torch.bfloat16)  # fmt: skip
    assert next(generation.parameters()).dtype == torch.float32
    front = inseq_mixing.load_model(model, "alti", tokenizer=encoder_tokenizer(), dtype=torch.bfloat16)
    assert front.model is model and next(model.parameters()).dtype == torch.bfloat16  # a load that works converts


# ----- late or unclear errors -----


def test_empty_spans_are_refused_and_graphs_with_spans_say_why():
    model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    prompt, generated = "the cat sat", "the cat sat on the mat"
    with pytest.raises(ValueError, match=r"spans=\[\] gives nothing to explain"):
        model.attribute(prompt, generated, spans=[], show_progress=False)
    with pytest.raises(ValueError, match=r"units=\[\] gives nothing"):
        model.attribute(prompt, generated, spans="answer", units=[], show_progress=False)
    with pytest.raises(ValueError, match="a contribution graph is the route of one prediction"):
        model.attribute(prompt, generated, spans="answer", contribution_graphs=True, show_progress=False)
    out = model.attribute(prompt, generated, spans="answer", contribution_graphs=False, show_progress=False)
    assert len(out.sequence_attributions) == 1


def test_a_context_row_whose_passage_has_no_token_of_its_own_is_skipped_before_any_work(monkeypatch):
    from inseq_mixing.evaluation import context

    base = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    rows = [  # passages joined by ";": a word tokenizer's token "cat;sat" straddles two passages
        {"passages": ["the cat sat .", "the dog sat ."], "question": "who sat ?", "answer": " the cat", "gold": 0},
        {"passages": ["the cat ", " sat ."], "question": "", "answer": " the cat", "gold": 1},
        {"passages": ["the cat", "sat"], "question": " who ?", "answer": " the", "gold": 0},  # "sat": no token
    ]
    calls = []
    real = context.passage_drops
    monkeypatch.setattr(context, "passage_drops", lambda *args: calls.append(args[2]["row"]) or real(*args))
    evaluation = inseq_mixing.evaluate(base, ["alti_logit"], rows, "context", draws=10, separator=";")
    assert [skip.row for skip in evaluation.skipped] == [2]
    assert "have no token of their own" in evaluation.skipped[0].reason
    assert calls == [0, 1]  # the bad row was found before its probabilities were read


def test_the_context_protocol_explains_an_encoder_decoders_answer_as_its_span(tmp_path, capsys):
    """The retrieval rows' answers are words the translation demo does not know: its span is their unknown tokens."""
    rows = [
        {
            "passages": ["ivan plays tennis .", "heidi lives in dublin ."],
            "question": "where does heidi live ?",
            "answer": " dublin .",
            "gold": 1,
        },
        {"passages": ["the old cat .", "the red dogs sleep ."], "question": "who sleeps ?", "gold": 1},
    ]
    path = tmp_path / "context.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code = main(["evaluate", str(path), "--model", "demo", "--protocol", "context", "--methods", "alti_logit",
                 "--out", str(tmp_path / "context.html")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert "mrr" in capsys.readouterr().out


@pytest.mark.parametrize("front", ["generation", "encoder"])
def test_a_later_input_over_max_flows_is_refused_before_any_flow_is_solved(front, monkeypatch):
    """max_flows bounds each input: every input of the call is checked before the first batch, so a long last text
    does not throw away the flows already solved for the others (and the batch size changes nothing)."""
    import inseq_mixing.methods.flow as flow

    solved = []
    real = flow.attention_flow
    monkeypatch.setattr(flow, "attention_flow", lambda *args, **kwargs: solved.append(1) or real(*args, **kwargs))
    if front == "generation":
        model = inseq.load_model(tiny_model("gpt2"), "attention_flow", tokenizer=word_tokenizer(seq2seq=False))
        prompts = ["the cat", "the dog"]
        texts = ["the cat sat on", "the dog sat on the mat and it sat on the mat ."]  # 3 and 12 traced positions

        def attribute(**kwargs):
            return model.attribute(prompts, texts, batch_size=1, show_progress=False, **kwargs)
    else:
        model = inseq_mixing.load_model(tiny_encoder("bert"), "attention_flow", tokenizer=encoder_tokenizer())
        texts = ["the cat sat", "the dog sat on the mat and the cat sat on it"]  # 5 and 14 tokens with [CLS], [SEP]

        def attribute(**kwargs):
            return model.attribute(texts, batch_size=1, show_progress=False, **kwargs)

    long = 12 if front == "generation" else 14
    with pytest.raises(ValueError, match=rf"Input 1: attention_flow needs {long * long} maximum flows" if
                       front == "generation" else rf"Text 1: attention_flow needs {long * long} maximum"):  # fmt: skip
        attribute(max_flows=long * long - 1)
    assert solved == []  # not even the first text's flows
    out = attribute(max_flows=long * long)  # each text within the limit, their sum above it: taken
    assert len(out.sequence_attributions) == 2 and len(solved) == 2


def test_bad_span_rows_of_a_dataset_run_are_named_before_any_work(tmp_path):
    model = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    rows = [{"id": f"r{index}", "source": "the cat", "target": "the cat sat on the mat"} for index in range(5)]
    rows[3]["target"] = "the cat read a book"  # no "sat" in its generation
    out = tmp_path / "run"
    with pytest.raises(inseq_mixing.runs.data.DatasetInputError, match=r"Row 3 \(id 'r3'\): the span 'sat'"):
        inseq_mixing.attribute_dataset(model, "alti_logit", rows, out, batch_size=2, id_column="id", spans=["sat"],
                                       show_progress=False)  # fmt: skip
    assert not list(out.glob("**/*.parquet"))  # refused before the first batch was written


def test_compare_with_a_missing_image_exits_2_naming_it(tmp_path, capsys):
    folder = tmp_path / "vit"
    tiny_vision("vit").save_pretrained(folder)
    image_processor().save_pretrained(folder)
    missing = tmp_path / "nope.png"
    code = main(["compare", str(missing), "--model", str(folder), "--methods", "alti_logit", "--out",
                 str(tmp_path / "c.html")])  # fmt: skip
    assert code == 2
    assert f"error: Image 0: no image file at '{missing}'" in capsys.readouterr().err
    assert not (tmp_path / "c.html").exists()


def test_number_cells_of_a_csv_are_read_as_the_jsonl_gives_them(tmp_path):
    front = inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())
    path = tmp_path / "image.png"
    Image.fromarray(synthetic_image(32, seed=1)).save(path)
    frame = pd.DataFrame({"image": [str(path)] * 3, "patches": [4, "[0, 1]", "r2c2"]})
    frame.to_csv(tmp_path / "rows.csv", index=False)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in [{"image": str(path), "patches": 4},
                                                                {"image": str(path), "patches": [0, 1]},
                                                                {"image": str(path), "patches": "r2c2"}]))  # fmt: skip
    from_csv = inseq_mixing.evaluate(front, ["alti"], str(tmp_path / "rows.csv"), "pointing", draws=10)
    from_jsonl = inseq_mixing.evaluate(front, ["alti"], str(jsonl), "pointing", draws=10)
    assert from_csv.skipped == [] and from_jsonl.skipped == []
    for metric in ("pointing_game", "gold_share"):
        assert float(from_csv.results["alti"].statistics[metric].value()) == pytest.approx(
            float(from_jsonl.results["alti"].statistics[metric].value())
        )
    base = inseq.load_model(tiny_model("gpt2"), "alti_logit", tokenizer=word_tokenizer(seq2seq=False))
    rows = pd.DataFrame({"passages": ['["the cat sat .", "the dog sat ."]'] * 2, "answer": [" the cat"] * 2,
                         "gold": ["1", "[0]"]})  # fmt: skip
    rows.to_csv(tmp_path / "context.csv", index=False)
    evaluation = inseq_mixing.evaluate(base, ["alti_logit"], str(tmp_path / "context.csv"), "context", draws=10)
    assert evaluation.skipped == []


def test_a_processor_that_cannot_read_images_and_a_text_too_long_for_clip_are_named():
    from inseq_mixing.testing import speech_processor, tiny_clip

    for wrong in (encoder_tokenizer(), speech_processor("wav2vec2").feature_extractor):
        with pytest.raises(ValueError, match=rf"processor= is a {type(wrong).__name__}, which does not read images"):
            inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=wrong)
    model, processor = tiny_clip()
    front = inseq_mixing.load_model(model, "alti_logit", processor=processor)
    image = synthetic_image(32)
    long = " ".join(["the cat sat"] * 30)  # 90 words, the text tower reads 64 positions
    with pytest.raises(ValueError, match=r"Image 1: the text 'the cat sat.*' has \d+ tokens, but CLIPModel's text "
                       r"tower reads at most 64"):  # fmt: skip
        front.attribute([image, image], ["the cat", long], show_progress=False)


def test_a_stored_image_run_of_a_map_method_reads_the_rows_label(tmp_path):
    """A stored run's faithfulness reads each image's label (the row's, or the prediction) whatever the method: the
    random rankings, the same for every method, then give a map method's run the baseline a logit method's gets."""
    from inseq_mixing.evaluation.stored import evaluate_run

    paths = []
    for seed in range(2):
        paths.append(str(tmp_path / f"image{seed}.png"))
        Image.fromarray(synthetic_image(32, seed=seed + 1)).save(paths[-1])
    rows = [{"id": "a", "image": paths[0], "label": "positive"}, {"id": "b", "image": paths[1], "label": None}]
    model = tiny_vision("vit")
    baselines = {}
    for method in ("value_zeroing", "alti_logit"):
        out = tmp_path / method
        inseq_mixing.attribute_dataset(model, method, rows, out, processor=image_processor(), id_column="id",
                                       show_progress=False)  # fmt: skip
        evaluation = evaluate_run(out, "faithfulness", model=model, processor=image_processor(), draws=10)
        baselines[method] = evaluation.baseline
    for metric, value in baselines["alti_logit"].items():
        assert baselines["value_zeroing"][metric] == pytest.approx(value, abs=1e-7), metric
