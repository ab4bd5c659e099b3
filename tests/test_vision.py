"""Vision Transformers (ViT, DeiT, DINOv2, BEiT, Data2Vec-vision, CLIP's and SigLIP's image towers) through
``inseq_mixing.load_model``: every method on tiny random models, the logit methods against the model's own logit
(classifiers reading [CLS], pooled read-outs, CLIP's image–text similarity), value zeroing against a hook on the HF
value projection, the spec (layer scales included) against the HF blocks, rows that sum to 1, a batch against each
image alone, patch labels, and the errors a user meets."""

import functools
import subprocess

import numpy as np
import pytest
import torch

import inseq_mixing
from inseq_mixing.frontends import identify
from inseq_mixing.frontends.router import inseq_refusal
from inseq_mixing.frontends.vision import ImageError
from inseq_mixing.methods.blocks import finish_layer
from inseq_mixing.methods.norms import freeze_norm
from inseq_mixing.methods.value_zeroing import value_zeroing
from inseq_mixing.specs import UnsupportedModelError, get_spec
from inseq_mixing.testing import (
    LOGIT_METHODS,
    MAP_METHODS,
    ROW_METHODS,
    VISION_FAMILIES,
    image_processor,
    synthetic_image,
    tiny_clip,
    tiny_vision,
    vision_processor,
)
from inseq_mixing.trace import ModelCall, trace_call

from .reference import naive_alti_layer, naive_value_zeroing


@functools.cache
def classifier(family: str):
    return tiny_vision(family)


@functools.cache
def processor():
    return image_processor()


def images() -> list[np.ndarray]:
    return [synthetic_image(seed=0), synthetic_image(size=40, seed=1)]


def pixels(batch: list) -> torch.Tensor:
    return processor()(images=batch, return_tensors="pt")["pixel_values"]


def inputs_of(family: str, batch: list) -> dict:
    """What a model of ``family`` reads of ``batch`` (SigLIP 2: flattened patches, their mask and grids)."""
    return dict(vision_processor(family)(images=batch, return_tensors="pt"))


def token_mask(family: str, batch: list) -> torch.Tensor:
    """Which of the ``(B, T)`` tokens are real: [CLS] and the like, then a 3 × 3 grid; SigLIP 2: its patches."""
    inputs = inputs_of(family, batch)
    if "pixel_attention_mask" in inputs:
        return inputs["pixel_attention_mask"].long()
    return torch.ones(len(batch), LEADING.get(family, 1) + 9, dtype=torch.long)


#: Families whose blocks scale each branch by a learned vector (a layer scale).
LAYER_SCALED = ("dinov2", "dinov2_with_registers", "beit", "data2vec-vision")
#: The tokens before the patches, by family.
LEADING = {"deit": 2, "dinov2_with_registers": 3, "siglip": 0, "siglip2": 0}


@pytest.fixture(params=VISION_FAMILIES)
def family(request):
    return request.param


any_family = family


def trace_of(model, batch: list):
    spec, family = get_spec(model), model.config.model_type
    mask = token_mask(family, batch)
    return spec, trace_call(spec, ModelCall(model, inputs_of(family, batch), frame_masks={"decoder": mask}))


def test_the_spec_recomposes_every_block_and_norm_layer_scales_included(any_family):
    """Each block's position-wise rest, applied with the spec to the recorded attention output, gives the HF block's
    output; every norm (DINOv2's layer scales as norms without statistics) frozen at its recorded input gives the
    module's output."""
    spec, trace = trace_of(classifier(any_family), images())
    for layer, record in zip(spec.decoder.layers, trace.decoder.layers, strict=True):
        index = torch.arange(record.input.shape[0])
        out = finish_layer(layer, record, "self", record.input, record.self_attn.output, index, slice(None))
        torch.testing.assert_close(out, record.output, rtol=0, atol=1e-6)
        pairs = [
            (layer.self_attn.norm, record.self_attn.norm_input),
            (layer.ffn.norm, record.ffn_norm_input),
            (layer.self_attn.out_norm, record.self_attn.output),
            (layer.ffn.out_norm, record.ffn_out_norm_input),
        ]
        for norm, norm_input in pairs:
            if norm is None:
                continue
            frozen = freeze_norm(norm, norm_input)
            shift = 0 if frozen.shift is None else frozen.shift
            torch.testing.assert_close(frozen.linear(norm_input) + shift, norm(norm_input), rtol=0, atol=2e-6)
    assert (spec.decoder.layers[0].self_attn.out_norm is not None) == (any_family in LAYER_SCALED)


def test_logit_methods_add_up_to_the_models_own_logit(family):
    """Patch scores plus the unattributed step scores equal the classifier's own logit (an independent forward pass),
    for the predicted label and for a target against a foil: classifiers reading [CLS] (ViT, DeiT, Data2Vec-vision),
    [CLS] beside the mean of the patches (DINOv2, registers left out), the mean of the patches (BEiT through its
    pooler's norm, CLIP) or of every token (SigLIP)."""
    model = classifier(family)
    with torch.no_grad():
        logits = model(**inputs_of(family, images())).logits
    for method in LOGIT_METHODS:
        attribution = inseq_mixing.load_model(model, method, processor=vision_processor(family))
        for targets, foils in ((None, None), (["positive", 0], ["negative", "neutral"])):
            out = attribution.attribute(images(), targets, foils, show_progress=False)
            for row, sequence in enumerate(out.sequence_attributions):
                label = logits[row].argmax() if targets is None else model.config.label2id.get(targets[row], 0)
                expected = logits[row, label]
                if foils is not None:
                    expected = expected - logits[row, model.config.label2id[foils[row]]]
                steps = sequence.step_scores
                terms = sum(value for key, value in steps.items() if key.startswith("unattributed_"))
                total = sequence.source_attributions.sum(0) + terms
                torch.testing.assert_close(total, expected.reshape(1), atol=1e-4, rtol=1e-4, msg=method)
                assert [token.id for token in sequence.target] == [int(label)]


def test_map_rows_sum_to_one_and_cover_every_token(any_family):
    model = classifier(any_family)
    counts = token_mask(any_family, images()).sum(1).tolist()  # [CLS] and the like, then the patches
    for method in MAP_METHODS:
        out = inseq_mixing.load_model(model, method, processor=vision_processor(any_family)).attribute(
            images(), show_progress=False
        )
        for sequence, tokens in zip(out.sequence_attributions, counts, strict=True):
            maps = sequence.sequence_scores["encoder_self_scores"]
            assert len(sequence.source) == tokens and maps.shape[:2] == (tokens, tokens)
            assert torch.isfinite(sequence.source_attributions).all()
            if method in ROW_METHODS:
                torch.testing.assert_close(maps.sum(0), torch.ones(tokens), atol=1e-5, rtol=0)


def test_value_zeroing_matches_zeroing_values_through_a_hook(any_family):
    """Zero token j's value vectors through a hook on the real value projection, re-run the block on its clean
    input, measure the cosine distance: every patch for every position."""
    model = classifier(any_family)
    kwargs = inputs_of(any_family, images()[:1])
    spec = get_spec(model)
    naive = naive_value_zeroing(model, spec, kwargs, "decoder", "self")
    mask = torch.ones(1, naive.shape[-1], dtype=torch.long)
    trace = trace_call(spec, ModelCall(model, kwargs, frame_masks={"decoder": mask}))
    torch.testing.assert_close(value_zeroing(trace).decoder[0], naive, atol=1e-5, rtol=1e-4)
    assert naive[0, 0, -1] > 0  # [CLS] mixes with the last patch


@pytest.mark.parametrize("batch_family", ["deit", "siglip2"])
@pytest.mark.parametrize("method", [*LOGIT_METHODS, *MAP_METHODS])
def test_a_batch_equals_each_image_alone(method, batch_family):
    """SigLIP 2: a 4 × 4 image beside a 5 × 3 one, padded to 16 patches in the batch (and alone: its processor pads
    every image); the patch labels follow each image's own grid."""
    model = classifier(batch_family)
    attribution = inseq_mixing.load_model(model, method, processor=vision_processor(batch_family))
    pictures = [synthetic_image(32, seed=0), synthetic_image(40, seed=1)[:, :24]]
    together = attribution.attribute(pictures, show_progress=False).sequence_attributions
    for image, batched in zip(pictures, together, strict=True):
        alone = attribution.attribute(image, show_progress=False).sequence_attributions[0]
        torch.testing.assert_close(batched.source_attributions, alone.source_attributions, atol=1e-5, rtol=1e-4)
        assert [token.token for token in batched.source] == [token.token for token in alone.source]
    if batch_family == "siglip2":
        assert [token.token for token in together[1].source][-2:] == ["r4c1", "r4c2"] and len(together[1].source) == 15


def test_patches_are_labelled_by_row_and_column_and_bare_encoders_explain_positions():
    bare = tiny_vision("vit", head=False)
    out = inseq_mixing.load_model(bare, "alti", processor=processor()).attribute(
        images()[0], positions=[0, 5], show_progress=False
    )
    sequence = out.sequence_attributions[0]
    assert [token.token for token in sequence.source] == ["[CLS]"] + [f"r{r}c{c}" for r in range(3) for c in range(3)]
    assert [token.token for token in sequence.target] == ["[CLS]", "r1c1"]
    assert sequence.source_attributions.shape == (10, 2)
    with pytest.raises(ValueError, match="bare encoder"):
        inseq_mixing.load_model(bare, "alti_logit", processor=processor())


def test_greyscale_rgba_paths_and_tensors_give_the_rgb_images_scores(tmp_path):
    from PIL import Image

    model = classifier("vit")
    attribution = inseq_mixing.load_model(model, "alti", processor=processor())
    rgb = images()[0]
    rgba = np.concatenate([rgb, np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=-1)
    path = tmp_path / "image.png"
    Image.fromarray(rgb).save(path)
    tensor = torch.from_numpy(rgb).permute(2, 0, 1).float() / 255
    out = attribution.attribute([rgb, rgba, str(path), tensor], show_progress=False).sequence_attributions
    for other in out[1:]:
        torch.testing.assert_close(other.source_attributions, out[0].source_attributions, atol=1e-5, rtol=1e-4)
    grey = attribution.attribute(rgb.mean(-1).astype(np.uint8), show_progress=False).sequence_attributions[0]
    assert grey.source_attributions.shape == out[0].source_attributions.shape


def test_bad_inputs_get_errors_that_say_what_to_do(tmp_path):
    model = classifier("vit")
    attribution = inseq_mixing.load_model(model, "alti_logit", processor=processor())
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("hello")
    nan = images()[0].astype(np.float32)
    nan[0, 0, 0] = np.nan
    cases = [
        (str(not_an_image), "not an image Pillow can read"),
        (str(tmp_path / "missing.png"), "no image file"),
        (nan, "NaN"),
        (np.zeros((4, 4, 5)), r"\(H, W\), \(H, W, 3\) or \(H, W, 4\)"),
        (b"not a path", "give a path, a PIL image"),
    ]
    for image, message in cases:
        with pytest.raises(ImageError, match=message):
            attribution.attribute([images()[0], image], show_progress=False)
    with pytest.raises(ValueError, match="Unknown label 'cat'"):
        attribution.attribute(images()[0], "cat", show_progress=False)
    with pytest.raises(ValueError, match="reads 24×24"):
        inseq_mixing.load_model(model, "alti", processor=image_processor(32)).attribute(images()[0])
    with pytest.raises(ValueError, match="a token baseline is for text"):
        inseq_mixing.load_model(model, "integrated_gradients", processor=processor()).attribute(
            images()[0], baselines="[MASK]", show_progress=False
        )
    with pytest.raises(ValueError, match="processor"):
        inseq_mixing.load_model(model, "alti")


def test_deits_classifier_with_its_teacher_reads_cls_and_dist_and_adds_up():
    """The average of the [CLS] head and the distillation head at [DIST]: a pooled read-out of two positions."""
    import transformers

    from inseq_mixing.testing import randomize_weights

    model = transformers.DeiTForImageClassificationWithTeacher(classifier("deit").config)
    randomize_weights(model, 1)
    model.eval()
    with torch.no_grad():
        logits = model(pixel_values=pixels(images())).logits
    for method in LOGIT_METHODS:
        out = inseq_mixing.load_model(model, method, processor=processor()).attribute(images(), show_progress=False)
        for row, sequence in enumerate(out.sequence_attributions):
            terms = sum(value for key, value in sequence.step_scores.items() if key.startswith("unattributed_"))
            total = sequence.source_attributions.sum(0) + terms
            torch.testing.assert_close(total, logits[row].max().reshape(1), atol=1e-5, rtol=1e-5, msg=method)
            assert sequence.source_attributions[1].abs().sum() > 0  # [DIST] is read


def test_a_pooled_read_out_sends_its_direction_back_to_the_positions_it_reads():
    """``spread`` is the transpose of ``pooled``: ⟨spread(u), H⟩ = ⟨u, pooled(H)⟩ for every pooling, and nothing
    reaches a position the pooling skips (DINOv2's registers)."""
    from inseq_mixing.methods.head import spread
    from inseq_mixing.specs.encoder_heads import pooled_head_spec

    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 7, 5, generator=generator, dtype=torch.float64)
    for pooling, start in (((0, "mean"), 3), (("mean",), 0), (("mean",), 1), ((0, 1), 2), ((1, "mean", 0), 2)):
        head = pooled_head_spec(pooling, start, (torch.nn.Identity(),))
        pooled = head.pooled(hidden)
        direction = torch.randn(pooled.shape, generator=generator, dtype=torch.float64)
        back = spread(head, direction, 7, 5)
        torch.testing.assert_close((back * hidden).sum((1, 2)), (direction * pooled).sum((1, 2)))
        read = {part for part in pooling if part != "mean"} | (set(range(start, 7)) if "mean" in pooling else set())
        assert all(bool(back[:, position].abs().sum() == 0) == (position not in read) for position in range(7))


def test_clip_explains_the_image_text_similarity_of_each_text():
    """Patch scores plus the unattributed terms equal CLIPModel's own ``logits_per_image`` (its forward pass on the
    image and the texts), for a text and for a text against a foil; the gradient baselines explain the same value;
    map methods take no text; a missing text or a label index is refused before any work."""
    model, both = tiny_clip()
    texts = ["the cat sat", "a dog ran"]
    with torch.no_grad():
        own = model(**both(images=images(), text=texts, return_tensors="pt")).logits_per_image
    for method in [*LOGIT_METHODS, "input_x_gradient"]:
        attribution = inseq_mixing.load_model(model, method, processor=both)
        for foils in (None, texts[::-1]):
            out = attribution.attribute(images(), texts, foils, show_progress=False)
            assert out.info["task"] == "image_text_similarity"
            for row, sequence in enumerate(out.sequence_attributions):
                expected = own[row, row] - (0 if foils is None else own[row, 1 - row])
                assert [token.token for token in sequence.target] == [texts[row]]
                steps = sequence.step_scores
                own_name = "logit" if foils is None else "contrast_logits_diff"
                torch.testing.assert_close(steps[own_name], expected.reshape(1), atol=1e-5, rtol=1e-5, msg=method)
                if method != "input_x_gradient":
                    terms = sum(value for key, value in steps.items() if key.startswith("unattributed_"))
                    total = sequence.source_attributions.sum(0) + terms
                    torch.testing.assert_close(total, expected.reshape(1), atol=1e-5, rtol=1e-5, msg=method)
    maps = inseq_mixing.load_model(model, "alti", processor=both).attribute(images(), show_progress=False)
    assert [token.token for token in maps.sequence_attributions[0].target] == ["[CLS]"]
    logit = inseq_mixing.load_model(model, "alti_logit", processor=both)
    for bad in (None, [1, 2]):
        with pytest.raises(ValueError, match="give targets= a text per image"):
            logit.attribute(images(), bad)
    with pytest.raises(ValueError, match="with a tokenizer"):
        inseq_mixing.load_model(model, "alti_logit", processor=processor())


def test_what_cannot_be_explained_is_refused_with_the_reason():
    import transformers

    siglip = transformers.SiglipModel(classifier("siglip").config)
    with pytest.raises(UnsupportedModelError, match="attention-pooling head"):
        get_spec(siglip)
    swin = transformers.SwinForImageClassification(transformers.SwinConfig(embed_dim=8, depths=[1], num_heads=[2]))
    with pytest.raises(UnsupportedModelError, match="shifted windows and patch merging"):
        inseq_mixing.load_model(swin, "alti")  # before asking for a processor


def test_the_router_says_vision_and_keeps_the_processor_across_methods():
    model = classifier("vit")
    assert identify(model).kind == "vision"
    assert "inseq_mixing.load_model" in inseq_refusal(model, "alti")
    attribution = inseq_mixing.load_model(model, "alti", processor=processor())
    assert identify(attribution).kind == "vision"
    other = inseq_mixing.load_model(attribution, "globenc")
    assert other.method == "globenc" and other.processor is attribution.processor


def test_the_heatmap_puts_each_patch_score_on_its_cell_and_draws_over_the_image(tmp_path):
    from inseq_mixing.views.images import image_heatmap, layer_image_grid, patch_grid

    model = tiny_vision("deit")
    per_layer = inseq_mixing.load_model(model, "alti", processor=processor()).attribute(
        images()[0], per_layer=True, show_progress=False
    )
    sequence = per_layer.sequence_attributions[0]
    scores = sequence.source_attributions  # (tokens, 1, layers)
    grid, others = patch_grid(sequence, layer=0)
    labels = [token.token for token in sequence.source]
    for row in range(3):
        for column in range(3):
            assert grid[row, column] == pytest.approx(float(scores[labels.index(f"r{row}c{column}"), 0, 0]))
    assert set(others) == {"[CLS]", "[DIST]"}
    image_heatmap(sequence, images()[0], path=tmp_path / "map.png")
    layer_image_grid(sequence, images()[0], path=tmp_path / "layers.png")
    from PIL import Image

    for name in ("map.png", "layers.png"):
        with Image.open(tmp_path / name) as drawn:
            assert drawn.size[0] > 300 and drawn.size[1] > 200
    rolled = inseq_mixing.load_model(model, "alti", processor=processor()).attribute(images()[0], show_progress=False)
    with pytest.raises(ValueError, match="no layer axis"):
        layer_image_grid(rolled.sequence_attributions[0], images()[0])


@pytest.mark.parametrize("method", ["integrated_gradients", "input_x_gradient", "saliency", "deeplift"])
def test_gradient_baselines_explain_the_same_logit_over_the_same_units(method):
    """Captum's methods on the token embeddings the first block reads: the same contrast as the logit methods (the
    model's own logits), the same units; input × gradient equals autograd through a hook of our own; Integrated
    Gradients' convergence delta is its scores' sum minus the logit gap to the zero embedding computed here (that
    gap is large on a pre-LN model: the first norm maps every α·x alike but 0, so the path integral misses the jump
    at the baseline; the delta says so)."""
    model = classifier("vit")
    attribution = inseq_mixing.load_model(model, method, processor=processor())
    options = {"n_steps": 200, "return_convergence_delta": True} if method == "integrated_gradients" else {}
    targets, foils = ["positive", "negative"], ["neutral", "neutral"]
    out = attribution.attribute(images(), targets, foils, show_progress=False, **options)
    ids = [model.config.label2id[name] for name in targets]
    neutral = model.config.label2id["neutral"]
    with torch.no_grad():
        logits = model(pixel_values=pixels(images())).logits
        handle = model.vit.embeddings.register_forward_hook(lambda _m, _a, output: torch.zeros_like(output))
        try:
            at_zero = model(pixel_values=pixels(images())).logits
        finally:
            handle.remove()
    units = ["[CLS]"] + [f"r{r}c{c}" for r in range(3) for c in range(3)]
    for row, sequence in enumerate(out.sequence_attributions):
        expected = logits[row, ids[row]] - logits[row, neutral]
        own = sequence.step_scores["contrast_logits_diff"]
        torch.testing.assert_close(own, expected.reshape(1), atol=1e-5, rtol=0)
        assert [token.token for token in sequence.source] == units
        if method == "integrated_gradients":  # Captum's delta is the scores' sum minus the gap we compute here
            gap = expected - (at_zero[row, ids[row]] - at_zero[row, neutral])
            delta = float(sequence.step_scores["convergence_delta"][0])
            assert abs(float(sequence.source_attributions.sum()) - float(gap) - delta) < 1e-4
        if method == "input_x_gradient":  # against autograd through our own hook on the embedding module
            image = pixels(images())[row : row + 1]
            embeds = model.vit.embeddings(image).detach().requires_grad_(True)
            handle = model.vit.embeddings.register_forward_hook(lambda _m, _a, _output: embeds)  # noqa: B023
            try:
                own_logits = model(pixel_values=image).logits
            finally:
                handle.remove()
            (own_logits[0, ids[row]] - own_logits[0, neutral]).backward()
            manual = (embeds.grad * embeds).sum(-1)[0].detach()
            torch.testing.assert_close(sequence.source_attributions[:, 0], manual, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("vision_family", ["vit", "dinov2_with_registers", "beit", "data2vec-vision", "siglip2"])
def test_alti_matches_the_definition_pair_by_pair(vision_family):
    """ALTI of every layer against token pairs built from the HF value and output projections (DINOv2's and BEiT's
    layer scales applied to every part where the spec places them; that placement is checked against the HF blocks
    by the recomposition test; BEiT's relative position bias is in the probabilities the HF module returns)."""
    from inseq_mixing.methods.alti import alti

    model = classifier(vision_family)
    spec, trace = trace_of(model, images()[:1])
    scores = alti(trace)
    for idx in range(len(spec.decoder.layers)):
        naive = naive_alti_layer(model, spec, trace, inputs_of(vision_family, images()[:1]), "decoder", idx, "self")
        torch.testing.assert_close(scores.decoder[0, idx], naive, atol=1e-5, rtol=1e-4)


def test_the_image_report_renders_in_chromium_fits_1280_pixels_and_says_its_scale(tmp_path):
    from PIL import Image

    from inseq_mixing.views.images import image_report

    from .test_report import browser, page_width

    executable = browser()
    model = classifier("deit")
    logit = inseq_mixing.load_model(model, "alti_logit", processor=processor()).attribute(
        images(), show_progress=False
    )
    path = tmp_path / "vision.html"
    page = image_report(logit, images(), path)
    assert page.count("data:image/png;base64,") == 2 and "red raises the explained output, blue lowers it" in page
    per_layer = inseq_mixing.load_model(model, "value_zeroing", processor=processor()).attribute(
        images()[0], per_layer=True
    )
    layers = image_report(per_layer, images()[0], tmp_path / "layers.html")
    assert layers.count("data:image/png;base64,") == 2 and "layer by layer" in layers
    with pytest.raises(ValueError, match="2 image"):
        image_report(logit, images()[:1], tmp_path / "bad.html")
    common = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1400"]
    dom = subprocess.run([*common, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert dom.count("<img") == 2 and "Colour: contribution to the explained logit" in dom
    assert page_width(executable, path) <= 1280
    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120)
    low, high = Image.open(shot).convert("L").getextrema()
    assert high - low > 100  # drawn: the heatmaps and the text on white


def test_a_caption_says_the_scale_its_figure_was_drawn_on(tmp_path):
    """Patches all non-negative but [CLS] negative: the heatmap draws a diverging scale (the caption's scores count),
    and the page's caption says so."""
    from inseq_mixing.views.images import image_report

    out = inseq_mixing.load_model(classifier("vit"), "alti", processor=processor()).attribute(images()[0])
    sequence = out.sequence_attributions[0]
    assert (sequence.source_attributions >= 0).all()
    sequence.source_attributions[0] = -0.1  # [CLS]
    page = image_report(out, images()[0], tmp_path / "page.html")
    assert (
        "red raises the explained output, blue lowers it" in page
        and "white at 0, red at the largest score" not in page
    )


def test_show_save_and_aggregate_work_on_an_image_text_output(tmp_path):
    import inseq

    model, both = tiny_clip()
    texts = ["the cat sat", "a dog ran"]
    out = inseq_mixing.load_model(model, "alti_logit", processor=both).attribute(images(), texts, show_progress=False)
    page = out.show(display=False, return_html=True)  # the overlays, each titled with its text
    assert "the cat sat" in page and "a dog ran" in page and page.count("data:image/png;base64,") == 2
    table = inseq.FeatureAttributionOutput.show(out, display=False, return_html=True)  # Inseq's table, still there
    assert "r2c2" in table and "the cat sat" in table
    out.save(tmp_path / "out.json")
    loaded = inseq.FeatureAttributionOutput.load(tmp_path / "out.json")
    for before, after in zip(out.sequence_attributions, loaded.sequence_attributions, strict=True):
        torch.testing.assert_close(after.source_attributions, before.source_attributions)
        assert [token.token for token in after.target] == [token.token for token in before.target]
    assert out.aggregate().sequence_attributions[0].source_attributions.ndim == 2


def test_show_on_an_image_output_draws_the_overlays(tmp_path, capsys):
    """``out.show()`` of images draws each image's scores over it (not a 100-row terminal table): PNG files in a
    terminal, their paths printed; the overlays' page as HTML; a saved and loaded output (no images) shows Inseq's
    tables as before."""
    from PIL import Image

    attribution = inseq_mixing.load_model(classifier("vit"), "alti_logit", processor=processor())
    out = attribution.attribute(images()[:2], show_progress=False)
    assert out.show() is None
    printed = capsys.readouterr().out
    paths = [line for line in printed.splitlines() if line.endswith(".png")]
    assert len(paths) == 2 and all(Image.open(path).size[0] > 100 for path in paths)
    assert "r0c0" not in printed  # no table of patches
    page = out.show(display=False, return_html=True)
    assert page.count("data:image/png;base64,") == 2 and "Method: alti_logit" in page
    out.save(tmp_path / "out.json")
    loaded = inseq_mixing.load_output(tmp_path / "out.json")
    assert "r0c0" in loaded.show(display=False, return_html=True)  # Inseq's heatmap of the tokens
