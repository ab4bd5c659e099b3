"""The protocols on images: the deletion / insertion curves against a read-out whose answer is known, the patches a
removal changes (and only those), a gold box mapped through the processor's geometry, the pointing game and the gold
share by hand, and ``evaluate`` end to end with its controls and skipped rows."""

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import inseq_mixing
from inseq_mixing.evaluation.vision import gold_region, patch_reader, pointing, ranking_metrics
from inseq_mixing.testing import image_processor, synthetic_image, tiny_clip, tiny_vision


@functools.cache
def front():
    return inseq_mixing.load_model(tiny_vision("vit"), "alti", processor=image_processor())


def test_the_curves_of_a_known_read_out_put_the_best_ranking_first():
    """A read-out that is the weighted share of the patches kept: deleting the heaviest first gives the lowest
    deletion area, inserting them first the highest insertion area, deleting the lightest first the highest
    deletion area; each area equals the trapezoid computed here from the definition."""
    weights = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 0.0, 4.0, 1.5], dtype=torch.float64)
    patches, steps = len(weights), 4

    def read(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        share = (kept.double() @ weights) / weights.sum()
        return share, share

    best = torch.argsort(weights, descending=True)
    worst = best.flip(0)
    good, bad = ranking_metrics(read, best, patches, steps), ranking_metrics(read, worst, patches, steps)
    assert good["deletion_auc"] < bad["deletion_auc"]
    assert good["insertion_auc"] > bad["insertion_auc"]
    assert "deletion_lerf_auc" not in good  # the insertion curve read backwards: the same area, not repeated
    counts = [round(patches * step / steps) for step in range(steps + 1)]
    share = [float(weights[best[:count]].sum() / weights.sum()) for count in counts]  # the top `count`'s share
    deleted = [1 - value for value in share]
    width = 1 / steps
    trapezoid = [
        sum((a + b) / 2 * width for a, b in zip(curve, curve[1:], strict=False)) for curve in (deleted, share)
    ]
    assert good["deletion_auc"] == pytest.approx(trapezoid[0])
    assert good["insertion_auc"] == pytest.approx(trapezoid[1])
    assert good["comprehensiveness_prob"] == pytest.approx(sum(1 - value for value in deleted[1:steps]) / (steps - 1))
    assert good["sufficiency_prob"] == pytest.approx(sum(1 - value for value in share[1:steps]) / (steps - 1))


def test_removing_a_patch_changes_its_pixels_only_and_reads_the_models_probability():
    model = front()
    image = Image.fromarray(synthetic_image(48, seed=3))
    inputs = model.encode([image])[0]
    pixels = inputs["pixel_values"]
    replaced = {"pixel_values": torch.full_like(pixels, 7.0)}
    seen = []
    handle = model.model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.append(kwargs["pixel_values"]),
                                                   with_kwargs=True)  # fmt: skip
    try:
        kept = torch.ones(2, 9, dtype=torch.bool)
        kept[1, 5] = False  # r1c2
        probability, logit = patch_reader(model, inputs, replaced, (3, 3), 1, foil=2)(kept)
    finally:
        handle.remove()
    with torch.no_grad():
        own = model.model(pixel_values=pixels).logits[0]
    torch.testing.assert_close(probability[0], own.softmax(-1)[1])
    torch.testing.assert_close(logit[0], own[1] - own[2])
    changed = (seen[0][1] != pixels[0]).any(0)
    expected = torch.zeros(24, 24, dtype=torch.bool)
    expected[8:16, 16:24] = True
    assert torch.equal(changed, expected) and bool((seen[0][1][:, expected] == 7.0).all())


def test_a_box_becomes_the_patches_it_covers_at_least_half_of_once_processed():
    """A 48-pixel image resized to 24 (patches of 8): the box [0, 0, 24, 24] is the 12 × 12 top-left corner once
    processed: all of r0c0, half of r0c1 and of r1c0, a quarter of r1c1."""
    model = front()
    image = Image.fromarray(synthetic_image(48))
    region = gold_region(model, image, [0, 0, 24, 24], None, "Row 0")
    assert [index for index, inside in enumerate(region.tolist()) if inside] == [0, 1, 3]
    by_label = gold_region(model, image, None, '["r2c2", 4]', "Row 0")
    assert [index for index, inside in enumerate(by_label.tolist()) if inside] == [4, 8]
    for box, message in (([0, 0, 99, 5], "not inside"), ([1, 2, 3], r"\[x0, y0, x1, y1\]"), ([0, 0, 3, 3], "half")):
        with pytest.raises(ValueError, match=message):
            gold_region(model, image, box, None, "Row 0")
    with pytest.raises(ValueError, match="not a patch of the 3 × 3 grid"):
        gold_region(model, image, None, ["r5c0"], "Row 0")


def test_the_pointing_game_and_the_gold_share_by_hand():
    model = front()
    sequence = model.attribute(synthetic_image(48), show_progress=False).sequence_attributions[0]
    scores = torch.tensor([9.0, 0.1, 0.2, 0.3, -1.0, 0.5, 0.0, 0.4, 0.6, 0.1])  # [CLS] first: never a patch
    sequence.source_attributions = scores[:, None]
    region = torch.zeros(9, dtype=torch.bool)
    region[[7, 3]] = True  # r2c1 (0.6, the best patch) and r1c0 (-1: no positive share)
    found = pointing(model, {"region": region}, sequence)
    positive = scores[1:].clamp(min=0)
    assert found["pointing_game"] == 1.0
    assert found["gold_share"] == pytest.approx(float(0.6 / positive.sum()))
    assert found["random_pointing_game"] == found["random_gold_share"] == pytest.approx(2 / 9)
    region[:] = False
    region[0] = True
    assert pointing(model, {"region": region}, sequence)["pointing_game"] == 0.0


def test_evaluate_runs_both_protocols_on_images_with_their_controls(tmp_path):
    paths = []
    for seed in range(3):
        path = tmp_path / f"image{seed}.png"
        Image.fromarray(synthetic_image(48, seed=seed)).save(path)
        paths.append(str(path))
    rows = [
        {"image": paths[0], "box": [0, 0, 24, 24], "label": "positive"},
        {"image": paths[1], "patches": ["r1c1"]},
        {"image": paths[2]},  # no region: pointing skips it
        {"image": str(tmp_path / "missing.png")},
        {"image": paths[0], "label": "cat"},
    ]
    model = tiny_vision("deit")
    settings = {"processor": image_processor(), "draws": 50, "random_draws": 1, "steps": 2}
    faithful = inseq_mixing.evaluate(model, ["alti_logit", "input_x_gradient"], rows, "faithfulness",
                                     random_baseline=True, **settings)  # fmt: skip
    assert list(faithful.results) == ["alti_logit", "input_x_gradient", "alti_logit (random init)",
                                      "input_x_gradient (random init)"]  # fmt: skip
    assert faithful.method_summary("alti_logit")["n"] == 3 and set(faithful.baseline) == set(faithful.metrics)
    assert [skip.row for skip in faithful.skipped] == [3, 4]
    assert "no image file" in faithful.skipped[0].reason and "Unknown label 'cat'" in faithful.skipped[1].reason
    assert all(0 <= faithful.method_summary(name)["insertion_auc"] <= 1 for name in faithful.results)
    from inseq_mixing.views.eval_report import write_evaluation_report

    from .test_report import browser, page_width

    report = write_evaluation_report(faithful, tmp_path / "evaluation.html")
    page = report.read_text()
    assert page.count("data:image/png;base64,") == 2 * 4  # two examples per method, drawn over their images
    assert "deleting the least relevant first gives the same curve read backwards" in page and "mean colour" in page
    assert "red raises the explained output, blue lowers it" in page and page_width(browser(), report) <= 1280
    pointed = inseq_mixing.evaluate(model, ["alti"], rows, "pointing", **settings)
    assert pointed.method_summary("alti")["n"] == 2 and [skip.row for skip in pointed.skipped] == [2, 3, 4]
    assert math.isfinite(pointed.baseline["gold_share"])
    with pytest.raises(inseq_mixing.evaluation.EvaluationInputError, match="protocols"):
        inseq_mixing.evaluate(model, ["alti"], rows, "cue", **settings)
    clip, both = tiny_clip()
    with pytest.raises(inseq_mixing.evaluation.EvaluationInputError, match="image–text model"):
        inseq_mixing.evaluate(clip, ["alti"], rows, "faithfulness", processor=both)
    assert np.isfinite(faithful.to_dict()["methods"]["alti_logit"]["deletion_auc"])


def test_compare_puts_the_methods_and_gradient_baselines_side_by_side_on_images(tmp_path):
    images = [synthetic_image(48, seed=0), synthetic_image(40, seed=1)]
    methods = ["alti_logit", "integrated_gradients", "alti"]
    options = {"integrated_gradients": {"n_steps": 8}}
    comparison = inseq_mixing.compare(tiny_vision("vit"), methods, images, processor=image_processor(),
                                      random_draws=1, method_kwargs=options)  # fmt: skip
    summary = {row["method"]: row for row in comparison.summary()}
    assert list(summary) == methods and all(row["tokens"] == 2 for row in summary.values())
    assert all(math.isfinite(row["comprehensiveness_prob"]) for row in summary.values())
    assert len(comparison.agreement) == 3 * 2  # every pair of methods, on each image, over its 9 patches
    assert all(-1 <= row["spearman"] <= 1 for row in comparison.agreement)
    assert summary["alti"]["explains"] == "map" and summary["integrated_gradients"]["explains"] == "logit"
    from inseq_mixing.views.report import write_report

    from .test_report import browser, page_width

    path = write_report(comparison, tmp_path / "compare.html")
    page = path.read_text()
    assert page.count("data:image/png;base64,") == 3 * 2  # every method's scores drawn over each image
    assert "red raises the explained output, blue lowers it" in page and "white at 0, red at the largest score" in page
    assert page_width(browser(), path) <= 1280


def test_a_dataset_run_of_images_stores_what_attribute_gives_and_is_evaluated_from_its_store(tmp_path):
    from inseq_mixing.evaluation.stored import evaluate_run

    paths = []
    for seed in range(3):
        path = tmp_path / f"image{seed}.png"
        Image.fromarray(synthetic_image(40 + 8 * seed, seed=seed)).save(path)
        paths.append(str(path))
    rows = [{"id": f"x{index}", "image": path, "label": "positive" if index == 1 else None}
            for index, path in enumerate(paths)]  # fmt: skip
    model = tiny_vision("deit")
    summary = inseq_mixing.attribute_dataset(model, "alti_logit", rows, tmp_path / "run", processor=image_processor(),
                                             batch_size=2, id_column="id", show_progress=False)  # fmt: skip
    assert summary.attributed == 3
    run = inseq_mixing.load_run(tmp_path / "run")
    front = inseq_mixing.load_model(model, "alti_logit", processor=image_processor())
    for row in rows:
        alone = front.attribute(row["image"], row["label"], show_progress=False).sequence_attributions[0]
        stored = run[row["id"]]
        torch.testing.assert_close(stored.source_attributions, alone.source_attributions, atol=1e-5, rtol=1e-4)
        assert [token.token for token in stored.source] == [token.token for token in alone.source]
    assert run["x1"].target[0].token == "positive"
    evaluation = evaluate_run(run, "faithfulness", model=model, processor=image_processor(), draws=50)
    assert evaluation.method_summary("alti_logit")["n"] == 3
    Path(paths[0]).unlink()
    with pytest.raises(inseq_mixing.evaluation.EvaluationInputError, match="reads its image files again"):
        evaluate_run(run, "faithfulness", model=model, processor=image_processor(), draws=50)


def test_the_command_line_evaluates_and_runs_a_folder_of_an_image_classifier(tmp_path, capsys):
    """``inseq-mixing evaluate`` (pointing, with the image columns), ``compare`` (an image path) and
    ``attribute-dataset`` on a saved classifier with its image processor; the reports draw the scores over the
    images."""
    import json

    from inseq_mixing.cli import main

    folder = tmp_path / "model"
    tiny_vision("vit").save_pretrained(folder)
    image_processor().save_pretrained(folder)
    rows = tmp_path / "rows.jsonl"
    lines = []
    for seed in range(2):
        path = tmp_path / f"image{seed}.png"
        Image.fromarray(synthetic_image(48, seed=seed)).save(path)
        lines.append(json.dumps({"id": f"i{seed}", "picture": str(path), "region": [0, 0, 24, 24]}))
    rows.write_text("\n".join(lines) + "\n")
    out = tmp_path / "pointing.html"
    columns = ["--image-column", "picture", "--box-column", "region"]
    code = main(["evaluate", str(rows), "--model", str(folder), "--protocol", "pointing", "--methods", "alti",
                 *columns, "--draws", "20", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    page = out.read_text()
    assert "pointing_game" in page and page.count("data:image/png;base64,") == 2
    code = main(["compare", str(tmp_path / "image0.png"), "--model", str(folder), "--methods", "alti_logit", "alti",
                 "--out", str(tmp_path / "compare.html")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "compare.html").read_text().count("data:image/png;base64,") == 2
    code = main(["attribute-dataset", str(rows), "--model", str(folder), "--method", "alti_logit", "--id-column", "id",
                 "--source-column", "picture", "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert len(inseq_mixing.load_run(tmp_path / "run")) == 2


def test_siglip2s_flattened_patches_are_replaced_row_by_row_and_boxes_follow_each_images_grid():
    """SigLIP 2 reads each image at its aspect ratio, its patches flattened and padded: a 24 × 40 image is a 5 × 3
    grid, 15 real rows of 16; removing a patch changes its row only, the mean colour is over the real patches, and a
    box maps onto that image's grid."""
    from inseq_mixing.testing import vision_processor

    model = inseq_mixing.load_model(tiny_vision("siglip2"), "alti", processor=vision_processor("siglip2"))
    image = Image.fromarray(synthetic_image(40, seed=1)[:, :24])
    inputs, mask, (grid,) = model.encode([image])
    assert grid == (5, 3) and mask.tolist() == [[1] * 15 + [0]]
    mean = model.mean_colour(inputs)
    real = inputs["pixel_values"][0, :15].reshape(15, -1, 3)  # the processor's (p, p, C) order
    torch.testing.assert_close(mean["pixel_values"][0, 4].reshape(-1, 3)[0], real.mean((0, 1)))
    kept = torch.ones(2, 15, dtype=torch.bool)
    kept[1, 7] = False
    out = model.replaced(inputs, mean, kept, grid)
    changed = (out["pixel_values"] != inputs["pixel_values"]).any(-1)
    assert changed[0].sum() == 0 and changed[1].nonzero().flatten().tolist() == [7]
    region = gold_region(model, image, [0, 0, 8, 16], None, "Row 0")
    assert region.nonzero().flatten().tolist() == [0, 3]  # r0c0 and r1c0
    rows = [{"image": synthetic_image(40, seed=1)[:, :24], "box": [0, 0, 8, 16]}, {"image": synthetic_image(32)}]
    faithful = inseq_mixing.evaluate(tiny_vision("siglip2"), ["alti_logit"], rows, "faithfulness", steps=2,
                                     random_draws=1, draws=20, processor=vision_processor("siglip2"))  # fmt: skip
    assert faithful.method_summary("alti_logit")["n"] == 2
