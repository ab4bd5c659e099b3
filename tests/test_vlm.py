"""Vision–language decoders (issue 56, the decoder's first step): LLaVA's, Qwen2-VL's and Qwen2.5-VL's decoders over
image and text tokens, traced with the images, read by every method as a Llama's (the Qwens with their multimodal
rotary positions). ALTI-logit adds up to the model's own logits at image and text positions (with foils), every method
gives causal rows and a left-padded row equal to that row with its image alone, the image tokens get their share, and
AttnLRP gives the model's own logit."""

import contextlib
import json
import math

import pytest
import torch

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.methods.value_zeroing import value_zeroing
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import (
    VLM_BIDIRECTIONAL,
    VLM_FAMILIES,
    VLM_INJECTED,
    VLM_PROCESSOR_FAMILIES,
    VLM_TOKENS_PER_IMAGE,
    tiny_vlm,
    tiny_vlm_images,
    tiny_vlm_inputs,
)
from inseq_mixing.trace import trace_model

from .conftest import assert_a_killed_run_resumes, next_tokens
from .reference import naive_value_zeroing

_MODELS: dict = {}
#: Text before and after the image, and the left padding of the second row.
BEFORE, AFTER, PADDED = 2, 4, 3


def vlm(family: str):
    if family not in _MODELS:
        _MODELS[family] = tiny_vlm(family)
    return _MODELS[family]


def image_batch(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows of ``BEFORE`` words, the image's tokens and ``AFTER`` words, the second left-padded, and their two
    images (:func:`tiny_vlm_images`)."""
    generator = torch.Generator().manual_seed(seed)
    image = torch.full((VLM_TOKENS_PER_IMAGE[model.config.model_type],), get_spec(model).image_token_id)
    words = torch.randint(5, 60, (2, BEFORE + AFTER), generator=generator)
    pad = torch.full((PADDED,), model.config.text_config.pad_token_id)
    first = torch.cat([words[0, :BEFORE], image, words[0, BEFORE:]])
    second = torch.cat([pad, words[1, :BEFORE], image, words[1, BEFORE : BEFORE + AFTER - PADDED]])
    ids = torch.stack([first, second])
    mask = torch.ones_like(ids)
    mask[1, :PADDED] = 0
    return ids, mask, tiny_vlm_images(model, 2, generator)


def both_ways(model, ids, images) -> torch.Tensor:
    """``(B, T, T)``: the pairs a bidirectional family's tokens read both ways (Gemma 3: an image's tokens; PaliGemma:
    its prefix, ``token_type_ids`` 0)."""
    types = tiny_vlm_inputs(model, ids, images)["token_type_ids"]
    block = types == (1 if model.config.model_type == "gemma3" else 0)
    return block[:, :, None] & block[:, None, :]


def traced(model, ids, mask, images):
    return trace_model(model, ids, mask, extra=tiny_vlm_inputs(model, ids, images))


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_alti_logit_adds_up_to_the_vlms_own_logits_at_image_and_text_positions(family):
    model = vlm(family)
    ids, mask, images = image_batch(model)
    trace = traced(model, ids, mask, images)
    predicted = next_tokens({"input_ids": ids})
    foils = (predicted + 7) % 50 + 5
    with torch.no_grad():
        inputs = tiny_vlm_inputs(model, ids, images)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **inputs).logits
    own = logits.gather(-1, predicted[..., None])[..., 0]
    contrast = own - logits.gather(-1, foils[..., None])[..., 0]
    real = mask.bool()
    for explained, expected in ((None, own), (foils, contrast)):
        scores = alti_logit(trace, predicted, explained)
        total = scores.target.sum(-1) + sum(scores.unattributed.values())
        torch.testing.assert_close(total[real], expected[real], rtol=1e-4, atol=1e-4)
    image = ids == get_spec(model).image_token_id
    assert scores.target[0, -1, image[0]].abs().sum() > 0  # the image's tokens take part


@pytest.mark.parametrize("method", list(DECLARATIONS))
@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_every_method_reads_a_vlm_causally_and_a_padded_row_alone(family, method):
    """Each method on a left-padded batch of two images with text: no weight on later tokens, and the padded row's
    real positions are that row with its image explained alone."""
    model = vlm(family)
    ids, mask, images = image_batch(model)
    spec, declaration = get_spec(model), DECLARATIONS[method]

    def run(ids, mask, images):
        trace = traced(model, ids, mask, images)
        request = Request(
            spec, model, mask, None, None, next_tokens({"input_ids": ids}), None, mask.bool(), lambda: trace
        )
        return declaration.run(request, declaration.options())

    batch, alone = run(ids, mask, images), run(ids[1:, PADDED:], mask[1:, PADDED:], images[1:])
    length = ids.shape[1]
    later = torch.ones(length, length, dtype=torch.bool).triu(1).expand(2, -1, -1)
    if family in VLM_BIDIRECTIONAL:  # Gemma 3's image, PaliGemma's prefix: read both ways; nothing else reads later
        later = later & ~both_ways(model, ids, images)
    assert (batch.target[later] == 0).all()
    torch.testing.assert_close(batch.target[1, PADDED:, PADDED:], alone.target[0], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_value_zeroing_matches_zeroing_image_and_text_values_through_a_hook(family):
    """Zero token j's value vectors through a hook on the real value projection, re-run the block on its recorded
    input (Qwen3-VL's: with the features added before it), measure the cosine distance: every image and text token,
    for every position."""
    model = vlm(family)
    ids, mask, images = image_batch(model)
    kwargs = {"input_ids": ids[:1], "attention_mask": mask[:1], **tiny_vlm_inputs(model, ids[:1], images[:1])}
    spec = get_spec(model)
    naive = naive_value_zeroing(model, spec, {**kwargs, "use_cache": False}, "decoder", "self")  # no cache to grow
    fast = value_zeroing(trace_model(model, ids[:1], mask[:1], extra=kwargs)).decoder[0]
    torch.testing.assert_close(fast, naive, atol=1e-5, rtol=1e-4)
    image = ids[0] == spec.image_token_id
    assert naive[..., image].sum() > 0 and naive[..., ~image].sum() > 0


@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_image_tokens_without_the_images_are_refused_not_explained(family):
    """Ids holding image tokens without ``pixel_values`` would be explained as the placeholder token's own
    embedding, a prediction the model never makes with the image: refused, naming the count and what to pass; text
    alone is explained."""
    model = vlm(family)
    ids, mask, _ = image_batch(model)
    count = 2 * VLM_TOKENS_PER_IMAGE[model.config.model_type]
    with pytest.raises(ValueError, match=rf"holds {count} image token\(s\) .* but no images: pass them"):
        trace_model(model, ids, mask)
    text = ids[:, :BEFORE]
    assert trace_model(model, text).logits.shape[:2] == text.shape


@pytest.mark.parametrize("family", VLM_BIDIRECTIONAL)
@pytest.mark.parametrize("method", ["alti", "value_zeroing", "attention_rollout"])
def test_gemma_image_models_read_images_both_ways(family, method):
    """Gemma 3's image tokens attend to later image tokens of their image, PaliGemma's prefix (the image and the
    first words) to its later tokens: a map method gives an image row weight on a later image token (the trace is
    not causal there); the other rows stay causal (the test above)."""
    model = vlm(family)
    ids, mask, images = image_batch(model)
    spec, declaration = get_spec(model), DECLARATIONS[method]
    trace = traced(model, ids, mask, images)
    assert not trace.decoder.causal
    request = Request(spec, model, mask, None, None, next_tokens({"input_ids": ids}), None, mask.bool(), lambda: trace)
    maps = declaration.run(request, declaration.options()).target
    first = BEFORE  # the first image token of row 0
    assert maps[0, first, first + 1 : first + VLM_TOKENS_PER_IMAGE[family]].sum() > 1e-3


@pytest.mark.parametrize("family", VLM_BIDIRECTIONAL + VLM_INJECTED)
@pytest.mark.parametrize("method", ["decompx", "attn_lrp", "alti_logit"])
def test_logit_methods_add_up_through_tokens_read_both_ways_and_features_added_between_blocks(family, method):
    """DecompX, AttnLRP and ALTI-logit through Gemma 3's image blocks and PaliGemma's prefix (tokens reading later
    ones), and through Qwen3-VL's DeepStack features (added to the image tokens' states after each block): the parts
    and terms add up to the model's own logit at image and text positions (no tiny model has a soft-cap)."""
    model = vlm(family)
    ids, mask, images = image_batch(model)
    trace = traced(model, ids, mask, images)
    predicted = next_tokens({"input_ids": ids})
    request = Request(get_spec(model), model, mask, None, None, predicted, None, mask.bool(), lambda: trace)
    declaration = DECLARATIONS[method]
    scores = declaration.run(request, declaration.options())
    total = scores.target.sum(-1) + sum(scores.terms.values())
    torch.testing.assert_close(total[mask.bool()], scores.logit[mask.bool()], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        own = model(input_ids=ids, attention_mask=mask, use_cache=False, **tiny_vlm_inputs(model, ids, images))
    expected = own.logits.gather(-1, predicted[..., None])[..., 0]
    torch.testing.assert_close(scores.logit[mask.bool()], expected[mask.bool()], rtol=1e-4, atol=1e-4)


#: The methods that read what a block adds (the rollouts read its attention weights, which its input changes even
#: where its output is zero).
READ_WHAT_BLOCKS_ADD = [method for method in DECLARATIONS if method not in ("attention_rollout", "attention_flow")]


@pytest.mark.parametrize("method", READ_WHAT_BLOCKS_ADD)
def test_a_feature_added_after_a_block_counts_as_its_image_tokens_own_as_the_embedding_does(method):
    """Qwen3-VL's DeepStack adds a vector ``d`` to each image token's state after its first block. Where that block
    adds nothing (its output projections zeroed), the model is the same function as one whose image tokens start
    from their embedding plus ``d`` (moved there by a hook on the real first block, the feature itself zeroed): each
    method that reads what blocks add gives both the same scores at every position, so an added vector is credited
    to its token whole, as the embedding is (the second block's feature stays added in both)."""
    model = tiny_vlm("qwen3_vl_moe", seed=3)
    first = model.model.language_model.layers[0]
    with torch.no_grad():
        first.self_attn.o_proj.weight.zero_()
        first.mlp.experts.down_proj.zero_()
    ids, mask, images = image_batch(model)
    extra = tiny_vlm_inputs(model, ids, images)
    spec, declaration = get_spec(model), DECLARATIONS[method]
    explained = next_tokens({"input_ids": ids})

    def scores():
        trace = trace_model(model, ids, mask, extra=extra)
        request = Request(spec, model, mask, None, None, explained, None, mask.bool(), lambda: trace)
        return declaration.run(request, declaration.options()).target

    added = scores()
    moved = {}

    def zero_the_first(_module, args, kwargs):
        vectors, where = kwargs["deepstack_visual_embeds"], kwargs["visual_pos_masks"]
        moved["first"] = spec.decoder.injected.scattered(vectors[0], where)
        return args, {**kwargs, "deepstack_visual_embeds": [torch.zeros_like(vectors[0]), *vectors[1:]]}

    def into_the_embedding(_module, args, kwargs):
        return (args[0] + moved["first"], *args[1:]), kwargs

    handles = [model.model.language_model.register_forward_pre_hook(zero_the_first, with_kwargs=True),
               first.register_forward_pre_hook(into_the_embedding, with_kwargs=True)]  # fmt: skip
    try:
        embedded = scores()
    finally:
        for handle in handles:
            handle.remove()
    assert moved["first"].abs().sum() > 1  # the moved feature is not nothing
    image = ids == spec.image_token_id
    assert added[image[:, None, :].expand_as(added) & mask.bool()[:, :, None]].abs().sum() > 0
    torch.testing.assert_close(added, embedded, rtol=1e-4, atol=1e-5)


def test_a_vlm_whose_language_model_is_not_laid_out_as_llamas_is_refused_with_the_reason():
    """A LLaVA over a Gemma language model (its norms scale by ``1 + weight``): not read as a Llama's, refused naming
    what is read."""
    import transformers

    from inseq_mixing.specs import UnsupportedModelError

    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=24, patch_size=8)  # fmt: skip
    text = transformers.GemmaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=1, head_dim=8)  # fmt: skip
    model = transformers.LlavaForConditionalGeneration(
        transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=63)
    )
    with pytest.raises(UnsupportedModelError, match=r"language model is a 'gemma'.*laid out as Llama's"):
        get_spec(model)


def test_tiles_that_do_not_match_the_image_tokens_are_refused_when_rows_are_cut():
    """InternVL's tiles are one run over the batch; a row's tiles are its image tokens over one tile's. Tokens that
    are not a whole number of equal tiles (three tiles for two images of two tiles' tokens) are refused, naming the
    counts, rather than given to the wrong row."""
    from inseq_mixing.trace import ModelCall

    model = vlm("internvl")
    ids, mask, images = image_batch(model)
    inputs = tiny_vlm_inputs(model, ids, images)
    call = ModelCall(model, {"input_ids": ids, "attention_mask": mask, **inputs})
    assert call.rows(torch.tensor([1]))["pixel_values"].shape[0] == 2  # the second row's two tiles
    torch.testing.assert_close(call.rows(torch.tensor([1, 1]))["pixel_values"], inputs["pixel_values"][[2, 3, 2, 3]])
    short = ModelCall(model, {"input_ids": ids, "attention_mask": mask, "pixel_values": inputs["pixel_values"][:3]})
    with pytest.raises(ValueError, match="36 image tokens cannot be cut into 3 equal tiles"):
        short.rows(torch.tensor([0]))


# ----- the front end over images and prompts (inseq_mixing.load_model(vlm, method, processor=...)) -----

_FRONTS: dict = {}


def front(family: str, method: str = "alti_logit"):
    """The family's tiny VLM and processor, loaded through the router with ``method`` (one model per family)."""
    import inseq_mixing
    from inseq_mixing.testing import tiny_vlm_processor

    if family not in _FRONTS:
        _FRONTS[family] = (vlm(family), tiny_vlm_processor(family))
    model, processor = _FRONTS[family]
    return inseq_mixing.load_model(model, method, processor=processor)


def placeholder(family: str) -> str:
    if family == "gemma3":
        return "<start_of_image>"
    if family == "internvl":
        return "<IMG_CONTEXT>"
    return "<|vision_start|><|image_pad|><|vision_end|>" if family.startswith("qwen") else "<image>"


def own_logits(front_end, images: list, prompt: str, answer: list[int]) -> torch.Tensor:
    """The model's own logits of ``answer`` after the prompt, from the processor's inputs and a plain forward pass
    (no trace): ``(len(answer), vocabulary)``."""
    encoded = front_end.processor(images=[images], text=[prompt], return_tensors="pt")
    ids = torch.cat([encoded["input_ids"], torch.tensor([answer])], 1)
    extra = {name: value for name, value in encoded.items() if name not in ("input_ids", "attention_mask")}
    for name in ("mm_token_type_ids", "token_type_ids"):  # which tokens are the image's: none of the answer's
        if name in extra:
            extra[name] = torch.nn.functional.pad(extra[name], (0, len(answer)))
    with torch.no_grad():
        logits = front_end.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra).logits
    return logits[0, encoded["input_ids"].shape[1] - 1 : -1]


def two_images():
    from inseq_mixing.testing import synthetic_image

    return synthetic_image(40, seed=1), synthetic_image(48, seed=2)[:, :24]  # a square and a tall image


@pytest.mark.parametrize("family", VLM_PROCESSOR_FAMILIES)
def test_the_front_end_explains_the_greedy_answer_and_adds_up_to_the_models_own_logits(family):
    """Images and a prompt in, Inseq's output out: the answer is the model's own greedy one (generate, run apart),
    each answer token's scores over the image and text tokens plus the terms equal the model's own logit (a plain
    forward pass on the processor's inputs), and the image tokens, labelled on their grid, take part."""
    square, _ = two_images()
    model = front(family)
    prompt = f"the {placeholder(family)} cat sat on"
    out = model.attribute(square, prompt, max_new_tokens=4, show_progress=False)
    sequence = out.sequence_attributions[0]
    encoded = model.processor(images=[[square]], text=[prompt], return_tensors="pt")
    encoded.pop("labels", None)  # PaliGemma's processor gives training labels too
    with torch.no_grad():
        generated = model.model.generate(**encoded, max_new_tokens=4, do_sample=False, output_logits=True,
                                         return_dict_in_generate=True)  # fmt: skip
    answer = generated.sequences[0, encoded["input_ids"].shape[1] :].tolist()
    answer = answer[: answer.index(1)] if 1 in answer else answer  # the tiny models' end of sequence, id 1
    assert [token.token for token in sequence.target] == model.tokenizer.convert_ids_to_tokens(answer)
    own = torch.stack([step[0, token] for step, token in zip(generated.logits, answer, strict=False)])
    torch.testing.assert_close(sequence.step_scores["logit"], own, rtol=1e-4, atol=1e-5)  # generation's own logits
    terms = sum(value for name, value in sequence.step_scores.items() if name != "logit")
    torch.testing.assert_close(sequence.source_attributions.sum(0) + terms, own, rtol=1e-4, atol=1e-4)
    labels = [token.token for token in sequence.source]
    images = [index for index, label in enumerate(labels) if label.startswith("img1")]
    assert len(images) == sum(out.info["image_counts"][0]) and len(images) == len(out.info["image_tokens"][0][0])
    assert sequence.source_attributions[images].abs().sum() > 0
    if family == "internvl":  # tiles of one run cut by the processor's tokens per tile, each a grid
        assert "img1 t1 r0c0" in labels and "img1 t2 r2c2" in labels
    elif family not in ("llava_next", "llava_onevision"):  # a grid (LLaVA's, Qwen2-VL's); packed tiles: numbered
        assert "img1 r0c0" in labels and "img1 r1c1" in labels


@pytest.mark.parametrize("method", ["alti_logit", "attn_lrp", "alti", "value_zeroing"])
@pytest.mark.parametrize("family", ["llava_next", "qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_a_batch_of_prompts_with_different_images_equals_each_prompt_alone(family, method):
    """Two prompts whose images make different numbers of tokens (a square and a tall image; one image and two),
    explained in one batch (left-padded, the images cut by row for AttnLRP's copies): each prompt's scores equal
    the prompt explained alone."""
    square, tall = two_images()
    model = front(family, method)
    mark = placeholder(family)
    images, prompts = [[square], [tall, square]], [f"the {mark} cat", f"a {mark} dog and {mark} the"]
    answers = ["sat on the", "cat"]
    batch = model.attribute(images, prompts, answers, batch_size=2, show_progress=False).sequence_attributions
    for row in range(2):
        alone = model.attribute(images[row], prompts[row], answers[row], show_progress=False).sequence_attributions
        assert [token.token for token in batch[row].source] == [token.token for token in alone[0].source]
        torch.testing.assert_close(batch[row].source_attributions, alone[0].source_attributions, rtol=1e-4,
                                   atol=2e-5)  # fmt: skip


def test_images_as_units_and_the_answer_as_one_span_are_sums_of_the_token_scores():
    """``units="images"``: an image's score is its tokens' summed (every other token kept); ``spans="answer"``: a logit
    method's answer score is its tokens' summed, with the summed logit; contrast answers explain the logit
    difference (the model's own, from a plain forward pass)."""
    square, tall = two_images()
    model = front("qwen2_vl")
    prompt = f"the {placeholder('qwen2_vl')} cat and {placeholder('qwen2_vl')}"
    tokens = model.attribute([square, tall], prompt, "sat on the", show_progress=False)
    keys = tokens.info["image_tokens"][0]
    scores = tokens.sequence_attributions[0].source_attributions
    units = model.attribute([square, tall], prompt, "sat on the", units="images", show_progress=False)
    pooled = units.sequence_attributions[0]
    labels = [token.token for token in pooled.source]
    for number, positions in enumerate(keys):
        torch.testing.assert_close(pooled.source_attributions[labels.index(f"image {number + 1}")],
                                   scores[positions].sum(0))  # fmt: skip
    assert len(labels) == scores.shape[0] - sum(len(positions) for positions in keys) + len(keys)
    answer = model.attribute([square, tall], prompt, "sat on the", spans="answer", show_progress=False)
    whole = answer.sequence_attributions[0]
    assert whole.source_attributions.shape[1] == 1
    torch.testing.assert_close(whole.source_attributions[:, 0], scores.sum(1), rtol=1e-5, atol=1e-5)
    summed = tokens.sequence_attributions[0].step_scores["logit"].sum()
    torch.testing.assert_close(whole.step_scores["logit"][0], summed)
    contrast = model.attribute([square, tall], prompt, "sat on the", contrast_targets="the cat on",
                               show_progress=False).sequence_attributions[0]  # fmt: skip
    answer_ids = model.tokenizer("sat on the", add_special_tokens=False)["input_ids"]
    foil_ids = model.tokenizer("the cat on", add_special_tokens=False)["input_ids"]
    logits = own_logits(model, [square, tall], prompt, answer_ids)
    expected = logits.gather(-1, torch.tensor([answer_ids, foil_ids]).T)
    expected = expected[:, 0] - expected[:, 1]
    torch.testing.assert_close(contrast.step_scores["contrast_logits_diff"], expected, rtol=1e-4, atol=1e-5)
    terms = sum(value for name, value in contrast.step_scores.items() if name != "contrast_logits_diff")
    torch.testing.assert_close(contrast.source_attributions.sum(0) + terms, expected, rtol=1e-4, atol=1e-4)


def test_a_onevision_prompt_of_two_images_counts_the_tokens_each_makes_beside_the_other():
    """OneVision encodes an image alone in tiles, and two images of one prompt untiled: the front end counts each
    image's tokens as the processor laid them out in that prompt (a run of image tokens each), the scores plus the
    terms equal the model's own logits, and the tower reads each image as one tile (its newline keeping its score)."""
    square, tall = two_images()
    model = front("llava_onevision")
    prompt = "a <image> dog <image>"
    out = model.attribute([tall, square], prompt, "sat on", tower=True, show_progress=False)
    encoded = model.processor(images=[[tall, square]], text=[prompt], return_tensors="pt")["input_ids"][0].tolist()
    image_id = model.tokenizer.convert_tokens_to_ids("<image>")
    found = [index for index, token in enumerate(encoded) if token == image_id]
    alone = model.processor(images=[[tall]], text=["<image>"], return_tensors="pt")["input_ids"]
    assert int((alone == image_id).sum()) > 10  # alone, the tall image is tiled
    assert out.info["image_tokens"][0] == [found[:10], found[10:]]  # beside another: 9 tokens and a newline each
    sequence = out.sequence_attributions[0]
    answer_ids = model.tokenizer("sat on", add_special_tokens=False)["input_ids"]
    expected = own_logits(model, [tall, square], prompt, answer_ids).gather(-1, torch.tensor(answer_ids)[:, None])[
        :, 0
    ]
    terms = sum(value for name, value in sequence.step_scores.items() if name != "logit")
    torch.testing.assert_close(sequence.source_attributions.sum(0) + terms, expected, rtol=1e-4, atol=1e-4)
    for number, positions in enumerate(out.info["image_tokens"][0], start=1):
        spread = sequence.sequence_scores[f"tower_image{number}"]
        assert spread.shape[0] == 10  # one tile's tower tokens ([CLS] and 9 patches)
        decoder = sequence.source_attributions[positions[:-1]]  # the last is the newline
        torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)


def test_bad_prompts_are_named_before_the_model_runs():
    """A prompt whose placeholders do not match its images, an unreadable image, a contrast answer of another length,
    unknown spans or units: refused naming the prompt and what to do, before any forward pass."""
    import numpy

    square, _ = two_images()
    model = front("llava")
    calls = []
    handle = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"Prompt 1 has 2 image\(s\) and its text 1 image placeholder"):
            model.attribute([[square], [square, square]], ["a <image> cat", "the <image> dog"], show_progress=False)
        with pytest.raises(ValueError, match=r"Prompt 0, image 0 has shape \(3,\)"):
            model.attribute(numpy.zeros(3), "<image> cat", show_progress=False)
        with pytest.raises(ValueError, match="Prompt 0: the contrast answer has 1 tokens and the answer 2"):
            model.attribute(square, "<image> cat", "sat on", contrast_targets="dog", show_progress=False)
        with pytest.raises(ValueError, match="units='boxes'"):
            model.attribute(square, "<image> cat", units="boxes", show_progress=False)
        with pytest.raises(ValueError, match=r"Give one entry of images per prompt \(2\)"):
            model.attribute([square], ["<image> a", "<image> b"], show_progress=False)
    finally:
        handle.remove()
    assert not calls


def test_a_vlm_is_its_own_kind_and_inseq_points_to_the_front_end(tmp_path):
    """The router gives a VLM the vision-language front end (``inseq.load_model`` says to call this package's
    ``load_model`` with the processor); its output is Inseq's: shown as HTML, saved and loaded back equal."""
    import inseq

    import inseq_mixing  # noqa: F401  (registers the methods and the guide to other kinds)
    from inseq_mixing.frontends import identify

    square, _ = two_images()
    assert identify(vlm("llava")).kind == "vision-language"
    with pytest.raises(Exception, match=r"inseq_mixing.load_model\(model, 'alti_logit', processor=\.\.\.\)"):
        inseq.load_model(vlm("llava"), "alti_logit")
    out = front("llava", "alti").attribute(square, "the <image> cat", "sat on", show_progress=False)
    html = out.show(display=False, return_html=True)
    assert "img1 r2c2" in html
    path = tmp_path / "out.json"
    out.save(path)
    loaded = inseq.FeatureAttributionOutput.load(path)
    torch.testing.assert_close(loaded.sequence_attributions[0].source_attributions,
                               out.sequence_attributions[0].source_attributions)  # fmt: skip


def test_the_answer_is_drawn_over_the_part_of_the_image_its_grid_covers():
    """LLaVA's processor resizes the shorter side and keeps the centred square: a 40 × 30 image's grid covers
    ``(5, 0, 35, 30)``; Qwen2-VL's resizes the whole image. ``answer_heatmap`` lays the first image's token scores of
    the explained word on that box, cell by cell."""
    from inseq_mixing.testing import synthetic_image
    from inseq_mixing.views.images import answer_heatmap

    wide = synthetic_image(40, seed=3)[:30]  # 30 rows, 40 columns
    llava = front("llava").attribute(wide, "the <image> cat", "sat on", show_progress=False)
    assert llava.info["image_boxes"] == [[[5.0, 0.0, 35.0, 30.0]]]
    qwen = front("qwen2_vl").attribute(wide, f"the {placeholder('qwen2_vl')} cat", "sat on", show_progress=False)
    assert qwen.info["image_boxes"] == [[[0.0, 0.0, 40.0, 30.0]]]
    figure = answer_heatmap(llava, wide, entry=1)
    overlay = figure.axes[0].images[1]
    assert tuple(overlay.get_extent()) == (5.0, 35.0, 30.0, 0.0)
    sequence = llava.sequence_attributions[0]
    labels = [token.token for token in sequence.source]
    drawn = overlay.get_array()
    for row in range(3):
        for column in range(3):
            expected = sequence.source_attributions[labels.index(f"img1 r{row}c{column}"), 1].item()
            assert drawn[row, column] == pytest.approx(expected)
    with pytest.raises(ValueError, match="explains 1 image"):
        answer_heatmap(llava, wide, image_number=2)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_the_tower_scores_are_drawn_on_the_towers_patches(family):
    """``answer_heatmap(..., tower=True)`` draws the scores continued through the tower on its patch grid (LLaVA's
    3 × 3 patches, ``[CLS]`` in the caption; Qwen2-VL's patches of the resized image, in the processor's order
    laid out by their labels), over the same box as the tokens; an output without tower scores, or a tiled image's, is
    refused with the reason."""
    from inseq_mixing.testing import synthetic_image
    from inseq_mixing.views.images import answer_heatmap

    wide = synthetic_image(40, seed=3)[:30]
    prompt = "the <image> cat" if family == "llava" else f"the {placeholder(family)} cat"
    model = front(family)
    out = model.attribute(wide, prompt, "sat on", tower=True, show_progress=False)
    spread = out.sequence_attributions[0].sequence_scores["tower_image1"]
    labels = out.info["tower_tokens"] if family == "llava" else out.info["tower_tokens"][0][0]
    figure = answer_heatmap(out, wide, entry=1, tower=True)
    overlay = figure.axes[0].images[1]
    assert tuple(overlay.get_extent()) == tuple(out.info["image_boxes"][0][0][i] for i in (0, 2, 3, 1))
    drawn = overlay.get_array()
    cells = [label for label in labels if label.startswith("r")]
    assert drawn.size == len(cells) > 9 * (family != "llava")
    for number, label in enumerate(labels):
        if label.startswith("r"):
            row, column = (int(part) for part in label[1:].split("c"))
            assert drawn[row, column] == pytest.approx(spread[number, 1].item())
    if family == "llava":
        assert f"[CLS]: {spread[0, 1].item():.3g}" in figure.axes[0].get_xlabel()
    plain = model.attribute(wide, prompt, "sat on", show_progress=False)
    with pytest.raises(ValueError, match="no tower scores for image 1"):
        answer_heatmap(plain, wide, tower=True)
    tiled = front("internvl").attribute(wide, f"the {placeholder('internvl')} cat", "sat", tower=True,
                                        show_progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="tiles, whose patches are not one grid"):
        answer_heatmap(tiled, wide, tower=True)


def test_the_explorer_shows_the_image_beside_the_caption_word_by_word(page, tmp_path):
    """The explorer of a LLaVA's answer: the image cut to what its grid covers, each of its tokens a patch of the
    overlay, the overlay of the clicked word being that word's scores over the image tokens (drawn in Chromium)."""
    import re

    from inseq_mixing.testing import synthetic_image
    from inseq_mixing.views.explorer import explore

    wide = synthetic_image(40, seed=3)[:30]
    out = front("llava").attribute(wide, "the <image> cat", "sat on the", show_progress=False)
    path = tmp_path / "vlm.html"
    explore(out, path, images=[[wide]])
    page.goto(path.as_uri())
    page.click("#panels .panel >> nth=0 >> th.col[data-col='2']")  # the third word
    size = page.eval_on_selector("#overlays .overlay img", "i => [i.width, i.height]")
    assert size[0] == size[1]  # the centred square, not the 40 × 30 image
    drawn = page.eval_on_selector_all("#overlays .overlay rect.patch", "rs => rs.map(r => r.textContent)")
    sequence = out.sequence_attributions[0]
    labels = [token.token for token in sequence.source]
    assert len(drawn) == 9
    for text in drawn:
        name, value = text.split(": ")
        assert re.match(r"img1 r\d+c\d+$", name)
        assert float(value) == pytest.approx(sequence.source_attributions[labels.index(name), 2].item(), rel=1e-3,
                                             abs=1e-6)  # fmt: skip


def test_the_explorer_draws_every_image_of_a_prompt_on_one_scale(page, tmp_path):
    """A prompt with two images (a square and a tall one): the explorer draws both, each image's tokens as the
    patches of its own grid with the clicked word's scores, and one colour scale over both images' patches: each
    patch's opacity is its score's magnitude over the largest of both images' (drawn in Chromium)."""
    import re

    from inseq_mixing.views.explorer import explore

    square, tall = two_images()
    mark = placeholder("qwen2_vl")
    out = front("qwen2_vl").attribute([square, tall], f"the {mark} cat and {mark}", "sat on", show_progress=False)
    path = tmp_path / "two.html"
    explore(out, path, images=[[square, tall]])
    page.goto(path.as_uri())
    page.click("#panels .panel >> nth=0 >> th.col[data-col='1']")  # the second word
    overlay = "#overlays .overlay[data-method='0']"
    assert page.locator(f"{overlay} figure.picture").count() == 2
    assert "one scale over the 2 images' patches" in page.text_content(f"{overlay} .what")
    sequence = out.sequence_attributions[0]
    labels = [token.token for token in sequence.source]
    values = {}
    for number, positions in enumerate(out.info["image_tokens"][0], start=1):
        drawn = page.eval_on_selector_all(f"{overlay} figure[data-image='{number}'] rect.patch",
                                          "rs => rs.map(r => [r.textContent, r.getAttribute('fill')])")  # fmt: skip
        assert len(drawn) == len(positions)
        for text, fill in drawn:
            name, value = text.split(": ")
            assert re.match(rf"img{number} r\d+c\d+$", name)
            expected = sequence.source_attributions[labels.index(name), 1].item()
            assert float(value) == pytest.approx(expected, rel=1e-3, abs=1e-6)
            values[name] = (abs(expected), float(fill.rsplit(",", 1)[1].rstrip(")")))  # the fill's opacity
    top = max(magnitude for magnitude, _ in values.values())
    for magnitude, opacity in values.values():  # |v| / the largest |v| of both images, not of its own image
        assert opacity == pytest.approx(magnitude / top, abs=2e-3)
    tops = [max(v for name, (v, _) in values.items() if name.startswith(f"img{n} ")) for n in (1, 2)]
    assert min(tops) < 0.95 * max(tops)  # so that a scale per image would have drawn another opacity


def test_a_dataset_run_of_images_and_prompts_killed_mid_run_resumes_to_the_uninterrupted_one(tmp_path, monkeypatch):
    """Rows of (image files, prompt, answer or none) run in batches, each row stored as the prompt explained alone
    (its greedy answer where none was given); a run killed after its first shard resumes to the rows of an
    uninterrupted run, bit for bit; a row whose image file is missing is refused naming it, before any work."""
    from PIL import Image

    from inseq_mixing.runs import attribute_dataset, load_run
    from inseq_mixing.runs.data import DatasetInputError

    square, tall = two_images()
    paths = []
    for number, image in enumerate((square, tall)):
        paths.append(str(tmp_path / f"image{number}.png"))
        Image.fromarray(image).save(paths[-1])
    model = front("qwen2_vl", "alti_logit")
    mark = placeholder("qwen2_vl")
    rows = [
        {"id": "a", "images": paths[0], "prompt": f"the {mark} cat", "answer": "sat on"},
        {"id": "b", "images": json.dumps(paths), "prompt": f"a {mark} dog {mark}", "answer": None},
        {"id": "c", "images": [paths[1]], "prompt": f"{mark} she read", "answer": "the book"},
    ]

    def run(out, data=rows):
        return attribute_dataset(model, "alti_logit", data, out, batch_size=2, show_progress=False, id_column="id",
                                 max_new_tokens=3)  # fmt: skip

    run(tmp_path / "whole")
    stored = load_run(tmp_path / "whole")
    frame = stored.to_pandas()
    alone = model.attribute([square, tall], f"a {mark} dog {mark}", max_new_tokens=3, show_progress=False)
    sequence = alone.sequence_attributions[0]
    row_b = frame[(frame["id"] == "b") & (frame["side"] == "source")]
    answer = alone.info["generated_texts"][0]
    assert stored.inputs("b") == {"source_text": f"a {mark} dog {mark}", "target_text": answer, "words": paths}
    assert len(row_b) == sequence.source_attributions.numel()
    assert sorted(row_b["score"].tolist()) == pytest.approx(sorted(sequence.source_attributions.flatten().tolist()),
                                                            rel=1e-4, abs=1e-6)  # fmt: skip
    assert_a_killed_run_resumes(run, tmp_path, len(rows), monkeypatch)
    missing = [*rows, {"id": "d", "images": str(tmp_path / "none.png"), "prompt": f"{mark} cat", "answer": "on"}]
    with pytest.raises(DatasetInputError, match=r"Row 3 \(id 'd'\), image 0: no image file at"):
        run(tmp_path / "refused", missing)
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("method", ["alti_logit", "alti"])
def test_scores_continued_through_the_tower_keep_the_images_total_and_follow_its_rollout(method):
    """``tower=True`` (LLaVA): each image's scores over the tower's input tokens add up to the decoder's scores of
    that image's tokens (completeness across the junction), span by span. A tower read at its input
    (``vision_feature_layer=-2`` of one block) leaves each image token's score on its own patch, nothing on [CLS];
    two blocks read at the last follow the tower's ALTI rollout as the ALTI declaration gives it on the tower alone."""
    import inseq_mixing
    from inseq_mixing.testing import tiny_vlm_processor

    square, tall = two_images()
    prompts, answers = ["the <image> cat", "a <image> dog <image>"], ["sat on", "the"]
    for layers, feature, check in ((2, -1, "rollout"), (1, -2, "identity")):
        model = tiny_vlm("llava", tower_layers=layers, feature_layer=feature)
        front_end = inseq_mixing.load_model(model, method, processor=tiny_vlm_processor("llava"))
        out = front_end.attribute([[square], [tall, square]], prompts, answers, tower=True, batch_size=2,
                                  show_progress=False)  # fmt: skip
        assert out.info["tower_tokens"][:2] == ["[CLS]", "r0c0"] and len(out.info["tower_tokens"]) == 10
        tower = get_spec(model).tower
        pixels = front_end.processor(images=[[square], [tall, square]], text=prompts, padding=True,
                                     return_tensors="pt")["pixel_values"]  # fmt: skip
        image = 0
        for row, sequence in enumerate(out.sequence_attributions):
            for number, positions in enumerate(out.info["image_tokens"][row]):
                spread = sequence.sequence_scores[f"tower_image{number + 1}"]  # (tower tokens, spans)
                decoder = sequence.source_attributions[positions]  # (image tokens, spans)
                torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)
                if check == "identity":
                    torch.testing.assert_close(spread[1:], decoder)
                    assert (spread[0] == 0).all()
                else:
                    expected = decoder.T @ tower_alti(tower, pixels[image : image + 1])[0, 1:]
                    torch.testing.assert_close(spread, expected.T, rtol=1e-4, atol=1e-6)
                image += 1


def test_scores_continued_through_a_pixel_shuffle_split_each_token_over_its_patches_exactly():
    """``tower=True`` on Idefics3 (its connector folds 2 × 2 patches into a token by one bias-free linear map): the
    real connector run on the tower's states with one patch kept gives that patch's part of every token; the parts add
    up to the embeddings the decoder read; each token's score goes to its patches by the parts' ALTI proximity shares,
    then through the tower's ALTI rollout; each image's total is the decoder's, span by span."""
    import inseq_mixing
    from inseq_mixing.methods.alti import proximity
    from inseq_mixing.testing import tiny_vlm_processor

    square, tall = two_images()
    model = tiny_vlm("idefics3", tower_layers=2)
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=tiny_vlm_processor("idefics3"))
    images, prompts = [[square], [tall, square]], ["the <image> cat", "a <image> dog <image>"]
    out = front_end.attribute(images, prompts, ["sat on", "the"], tower=True, batch_size=2, show_progress=False)
    assert out.info["tower_tokens"][:2] == ["r0c0", "r0c1"] and len(out.info["tower_tokens"]) == 36
    tower, connector = model.model.vision_model, model.model.connector
    image = 0
    for row, sequence in enumerate(out.sequence_attributions):
        for number, positions in enumerate(out.info["image_tokens"][row]):
            pixels = front_end.processor(images=[[images[row][number]]], text=["<image>"], return_tensors="pt")
            read = {}
            handle = connector.register_forward_hook(lambda _m, _a, out, read=read: read.update(embeddings=out[0]))
            with torch.no_grad():
                model(**pixels)
                handle.remove()
                states = tower(pixel_values=pixels["pixel_values"][0]).last_hidden_state  # (1, 36, D)
                parts = torch.stack([connector(states * (torch.arange(36) == patch)[None, :, None])[0]
                                     for patch in range(36)], 1)  # (tokens, patches, E)  # fmt: skip
            torch.testing.assert_close(parts.sum(1), read["embeddings"], rtol=1e-5, atol=1e-6)
            used = parts.abs().sum(-1) > 0  # the patches each token folds: four each
            assert (used.sum(1) == 4).all()
            shares = proximity(parts.sum(1)[None], parts.clone()[None])[0] * used
            shares = shares / shares.sum(1, keepdim=True)
            decoder = sequence.source_attributions[positions]  # (tokens, spans)
            expected = (decoder.T @ shares) @ tower_alti(get_spec(model).tower, pixels["pixel_values"][0])[0]
            spread = sequence.sequence_scores[f"tower_image{number + 1}"]  # (tower tokens, spans)
            torch.testing.assert_close(spread, expected.T, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)
            image += 1
    assert image == 3


def test_scores_continued_through_internvls_mlp_projector_and_tiles_keep_each_images_total():
    """``tower=True`` on InternVL (pixel shuffle, then an MLP: LayerNorm, linear, GELU, linear; an image in tiles):
    each token's parts over its four patches, plus the projector's bias path at the pass (its LayerNorm's shift and
    biases through the activation's slope there, run through the real linear modules), add up to the embedding the
    real projector gave; each tile's scores go to its patches by the parts' proximity shares, then through the tower's
    ALTI rollout ([CLS] first); the image's rows are its tiles' in turn, and its total is the decoder's."""
    import inseq_mixing
    from inseq_mixing.methods.alti import proximity
    from inseq_mixing.methods.tower import merge_parts
    from inseq_mixing.testing import tiny_vlm_processor

    square, _ = two_images()
    model = tiny_vlm("internvl", seed=1)
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=tiny_vlm_processor("internvl"))
    prompt = f"the {placeholder('internvl')} cat"
    out = front_end.attribute(square, prompt, "sat on", tower=True, show_progress=False)
    tower = get_spec(model).tower
    projector = model.model.multi_modal_projector
    pixels = front_end.processor(images=[[square]], text=[prompt], return_tensors="pt")["pixel_values"]
    read = {}
    handle = projector.register_forward_hook(lambda _m, args, output: read.update(input=args[0], output=output))
    with torch.no_grad():
        model.model.get_image_features(pixel_values=pixels)
        handle.remove()
        states = tower.module(pixel_values=pixels).last_hidden_state[:, 1:]  # (tiles, 36, D) without [CLS]
        parts = merge_parts(states, tower.merge)  # (tiles, 9, 4, E)
        pre = projector.linear_1(projector.layer_norm(read["input"]))
        slope = projector.act(pre) / pre
        bias_path = projector.linear_2(slope * projector.linear_1(projector.layer_norm.bias.expand_as(read["input"])))
    torch.testing.assert_close(parts.sum(2) + bias_path, read["output"], rtol=1e-4, atol=1e-5)
    sequence = out.sequence_attributions[0]
    positions = out.info["image_tokens"][0][0]
    decoder = sequence.source_attributions[positions]  # (tiles · 9, spans)
    tiles = len(pixels)
    assert tiles > 1 and len(positions) == 9 * tiles
    spread = sequence.sequence_scores["tower_image1"]  # (tiles · 37, spans)
    expected = []
    for tile in range(tiles):
        shares = proximity(parts[tile].sum(1)[None], parts[tile].clone()[None])[0]
        total = shares.sum(-1, keepdim=True)
        shares = torch.where(total > 0, shares / total, 1 / 4)  # (9, 4); no part closer than 0: even (as defined)
        on_patches = torch.zeros(decoder.shape[1], 37)
        on_patches[:, 1 + tower.merge.groups.flatten()] += (decoder[9 * tile : 9 * tile + 9].T[:, :, None]
                                                            * shares).flatten(1)  # fmt: skip
        expected.append(on_patches @ tower_alti(tower, pixels[tile : tile + 1])[0])
    torch.testing.assert_close(spread, torch.cat(expected, -1).T, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["gemma3", "paligemma"])
def test_scores_continued_through_gemma_towers_pooled_or_one_patch_a_token(family):
    """``tower=True`` on Gemma 3 (each token the RMSNorm and projection of the mean of a 2 × 2 block of SigLIP patches
    in the tiny model) and PaliGemma (each token one patch, projected): Gemma 3's parts over its patches add up
    exactly to the embedding the real projector gave, its shares their proximities; PaliGemma's tokens go to their
    own patches whole; then the tower's ALTI rollout; each image's total is the decoder's."""
    from inseq_mixing.methods.alti import proximity
    from inseq_mixing.methods.tower import merge_parts

    square, _ = two_images()
    model = front(family)
    prompt = f"the {placeholder(family)} cat"
    out = model.attribute(square, prompt, "sat on", tower=True, show_progress=False)
    tower = get_spec(model.model).tower
    pixels = model.processor(images=[[square]], text=[prompt], return_tensors="pt")["pixel_values"]
    sequence = out.sequence_attributions[0]
    decoder = sequence.source_attributions[out.info["image_tokens"][0][0]]  # (tokens, spans)
    with torch.no_grad():
        states = tower.module(pixel_values=pixels).last_hidden_state
    if family == "gemma3":
        projector = model.model.model.multi_modal_projector
        with torch.no_grad():
            parts = merge_parts(states, tower.merge)[0]  # (9, 4, E)
            torch.testing.assert_close(parts.sum(1), projector(states)[0], rtol=1e-4, atol=1e-5)
        shares = proximity(parts.sum(1)[None], parts.clone()[None])[0]
        total = shares.sum(-1, keepdim=True)
        shares = torch.where(total > 0, shares / total, 1 / 4)
        on_patches = torch.zeros(decoder.shape[1], tower.tokens)
        on_patches[:, tower.merge.groups.flatten()] += (decoder.T[:, :, None] * shares).flatten(1)
    else:
        assert tower.merge is None and decoder.shape[0] == tower.tokens
        on_patches = decoder.T
    expected = on_patches @ tower_alti(tower, pixels)[0]
    spread = sequence.sequence_scores["tower_image1"]
    torch.testing.assert_close(spread, expected.T, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)


def tower_alti(tower, pixels: torch.Tensor) -> torch.Tensor:
    """The ALTI declaration's rolled-out map ``(1, tokens, tokens)`` on the tower alone (every row explained)."""
    from inseq_mixing.trace import ModelCall, trace_call

    mask = torch.ones(1, tower.tokens, dtype=torch.long)
    trace = trace_call(tower.spec, ModelCall(tower.module, {"pixel_values": pixels}, frame_masks={"decoder": mask}))
    request = Request(tower.spec, tower.module, mask, None, None, torch.zeros_like(mask), None, mask.bool(),
                      lambda: trace)  # fmt: skip
    return DECLARATIONS["alti"].run(request, DECLARATIONS["alti"].options()).target


@pytest.mark.parametrize("family", ["llava_next", "llava_onevision"])
def test_scores_continued_through_tiles_follow_the_models_own_packing(family):
    """``tower=True`` on LLaVA-NeXT and OneVision (each image in tiles: the base tile's tokens, then the other tiles'
    put together on the image's grid, cut to its aspect ratio, a learned newline after each row), a square and a tall
    image: every image token's embedding the model packed is the projector on the tower token the layout names (the
    newline's where it names none); each tile's scores are the decoder's scores of its tokens through the tile's ALTI
    rollout; each image's total is the decoder's over its tokens but the newlines."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    import inseq_mixing
    from inseq_mixing.testing import tiny_vlm_processor

    square, tall = two_images()
    model = tiny_vlm(family, tower_layers=2)
    processor = tiny_vlm_processor(family)
    images, prompts = [[square], [tall]], ["the <image> cat", "a <image> dog"]
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=processor)
    out = front_end.attribute(images, prompts, ["sat on", "the"], tower=True, batch_size=2, show_progress=False)
    assert out.info["tower_tokens"][:2] == ["[CLS]", "r0c0"] and len(out.info["tower_tokens"]) == 10
    tower, inner = get_spec(model).tower, model.model
    kwargs = processor(images=images, text=prompts, padding=True, return_tensors="pt")
    counts = [image_size_to_num_patches(size, model.config.image_grid_pinpoints, model.config.vision_config.image_size)
              for size in kwargs["image_sizes"]]  # fmt: skip
    tiles = torch.cat([pixels[:count] for pixels, count in zip(kwargs["pixel_values"], counts, strict=True)])
    (run,) = tower.tower_runs(dict(kwargs))
    with torch.no_grad():
        packed = inner.get_image_features(pixel_values=kwargs["pixel_values"], image_sizes=kwargs["image_sizes"],
                                          **({"batch_num_images": kwargs["batch_num_images"]}
                                             if "batch_num_images" in kwargs else {})).pooler_output  # fmt: skip
        states = tower.module(pixel_values=tiles, output_hidden_states=True).hidden_states[-1][:, 1:]
        projected = inner.multi_modal_projector(states)  # (tiles, 9, E)
    tile = 0
    for row, sequence in enumerate(out.sequence_attributions):
        (positions,) = out.info["image_tokens"][row]
        placed = run.layout[row]
        newline = placed[:, 0] < 0
        assert newline.any() and (placed[~newline, 0] >= tile).all() and len(placed) == len(positions)
        expected = torch.where(newline[:, None], inner.image_newline.detach(), projected[placed[:, 0], placed[:, 1]])
        torch.testing.assert_close(packed[row], expected)
        decoder = sequence.source_attributions[positions]  # (tokens, spans)
        spread = sequence.sequence_scores["tower_image1"]  # (tiles · 10, spans)
        assert spread.shape[0] == 10 * counts[row]
        for own in range(counts[row]):
            on_tokens = torch.zeros(decoder.shape[1], 10)
            chosen = placed[:, 0] == tile
            on_tokens[:, 1 + placed[chosen, 1]] = decoder[chosen].T
            rollout = tower_alti(tower, tiles[tile : tile + 1])[0]
            torch.testing.assert_close(spread[10 * own : 10 * own + 10], (on_tokens @ rollout).T, rtol=1e-4, atol=1e-6)
            tile += 1
        torch.testing.assert_close(spread.sum(0), decoder[~newline].sum(0), rtol=1e-5, atol=1e-6)
    assert tile == len(tiles)


def test_tiles_the_model_resamples_are_refused_with_the_tower():
    """OneVision resamples an image's grid of tiles when it holds more patches than ``anyres_max_N`` keeps (here N = 1:
    9 patches): its tokens then blend patches, so ``tower=True`` is refused with the reason; without the tower the
    same call is answered."""
    import inseq_mixing
    from inseq_mixing.testing import tiny_vlm_processor

    _, tall = two_images()
    model = tiny_vlm("llava_onevision")
    processor = tiny_vlm_processor("llava_onevision")
    model.config.vision_aspect_ratio = processor.vision_aspect_ratio = "anyres_max_1"  # the processor counts tokens
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=processor)
    with pytest.raises(ValueError, match="resamples image 1's grid of tiles"):
        front_end.attribute(tall, "a <image> dog", "the", tower=True, show_progress=False)
    assert front_end.attribute(tall, "a <image> dog", "the", show_progress=False).sequence_attributions


def window_order(height: int, width: int, window: int) -> list[int]:
    """Qwen2.5-VL's order of one image's patches (processor indices) by its definition: windows of ``window`` ×
    ``window`` 2 × 2-patch units row by row, each window's units row by row, each unit's four patches in turn."""
    units_high, units_wide = height // 2, width // 2
    order = []
    for top in range(0, units_high, window):
        for left in range(0, units_wide, window):
            for row in range(top, min(top + window, units_high)):
                for column in range(left, min(left + window, units_wide)):
                    unit = row * units_wide + column
                    order += [4 * unit + patch for patch in range(4)]
    return order


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_5"])
def test_scores_continued_through_packed_towers_read_each_image_as_the_model_attends_it(family, monkeypatch):
    """``tower=True`` on the packed towers (every image one sequence, two blocks; Qwen2.5-VL's first in windows), two
    prompts, images of two sizes: the traced tower's probabilities, image by image in the processor's patch order, are
    the model's own eager attention weights (each image's, each window's, captured from its run and placed by the
    windows' definition); the real merger on the traced final states gives the embeddings the decoder read, and the
    merge parts (each patch normalised alone) plus the bias path add up to them; each image's scores are the decoder's
    spread by the parts' shares then the ALTI rollout, their total the decoder's; each image's labels its grid's."""
    import sys

    import inseq_mixing
    from inseq_mixing.methods.alti import proximity
    from inseq_mixing.methods.tower import merge_parts
    from inseq_mixing.testing import tiny_vlm_processor
    from inseq_mixing.trace import ModelCall, trace_call

    square, tall = two_images()
    model = tiny_vlm(family, tower_layers=2)
    processor = tiny_vlm_processor(family)
    mark = placeholder(family)
    images, prompts = [[square], [tall, square]], [f"the {mark} cat", f"a {mark} dog {mark}"]
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=processor)
    out = front_end.attribute(images, prompts, ["sat on", "the"], tower=True, batch_size=2, show_progress=False)
    tower, visual = get_spec(model).tower, model.model.visual
    family_module = sys.modules[type(visual.blocks[0].attn).__module__]
    own_eager, seen = family_module.eager_attention_forward, []

    def eager(module, query, *args, **kwargs):
        output, weights = own_eager(module, query, *args, **kwargs)
        seen[-1].append(weights[0])
        return output, weights

    monkeypatch.setattr(family_module, "eager_attention_forward", eager)
    marks = [block.register_forward_pre_hook(lambda *_: seen.append([])) for block in visual.blocks]
    kwargs = processor(images=images, text=prompts, padding=True, return_tensors="pt")
    try:
        runs = tower.tower_runs(dict(kwargs))
    finally:
        for mark in marks:
            mark.remove()
    grids = kwargs["image_grid_thw"].tolist()
    assert [len(run.labels) for run in runs] == [h * w for _, h, w in grids] and len(runs) == 3
    assert out.info["tower_tokens"] == [[runs[0].labels], [runs[1].labels, runs[2].labels]]
    decoder_images = model.model.get_image_features(kwargs["pixel_values"], kwargs["image_grid_thw"])
    decoder_images = getattr(decoder_images, "pooler_output", decoder_images)
    embeddings = torch.cat(list(decoder_images)) if isinstance(decoder_images, tuple | list) else decoder_images
    start, token = 0, 0
    expected_spreads = []
    for image, run in enumerate(runs):
        _, height, width = grids[image]
        assert sorted(run.labels) == sorted(f"r{r}c{c}" for r in range(height) for c in range(width))
        trace = trace_call(tower.spec, ModelCall(tower.module, run.inputs, frame_masks={"decoder": run.mask}))
        size = height * width
        order = window_order(height, width, 2) if family == "qwen2_5_vl" else list(range(size))
        at = torch.empty(size, dtype=torch.long)
        at[torch.tensor(order)] = torch.arange(size)  # each processor patch's position in the model's run
        for block, chunks in enumerate(seen):
            heads = torch.stack([torch.block_diag(*[chunk[h] for chunk in chunks]) for h in range(chunks[0].shape[0])])
            own = heads[:, start : start + size, start : start + size][:, at][:, :, at]
            windowed = family == "qwen2_5_vl" and block == 0
            assert windowed == bool((own == 0).any())
            torch.testing.assert_close(trace.decoder.layers[block].self_attn.probs[0], own, rtol=1e-4, atol=1e-6)
        states = trace.final_hidden  # (1, patches, D), the processor's order
        tokens = size // 4
        merged = visual.merger(states[0])
        torch.testing.assert_close(merged, embeddings[token : token + tokens], rtol=1e-4, atol=1e-5)
        parts = merge_parts(states, tower.merge)[0]  # (tokens, 4, E)
        merger = visual.merger
        if family == "qwen3_5":
            norm, (linear_1, act, linear_2) = merger.norm, (merger.linear_fc1, merger.act_fn, merger.linear_fc2)
        else:
            norm, (linear_1, act, linear_2) = merger.ln_q, merger.mlp
        with torch.no_grad():  # the biases through the activation's slope at the pass, run through the real modules
            concat = norm(states[0]).reshape(tokens, -1)
            pre = linear_1(concat)
            bias_path = linear_2(act(pre) / pre * linear_1(torch.zeros_like(concat)))
        torch.testing.assert_close(parts.sum(1) + bias_path, merged, rtol=1e-4, atol=1e-5)
        shares = proximity(parts.sum(1)[None], parts.clone()[None])[0]
        total = shares.sum(-1, keepdim=True)
        shares = torch.where(total > 0, shares / total, 1 / 4)
        request = Request(tower.spec, tower.module, run.mask, None, None, torch.zeros_like(run.mask), None,
                          run.mask.bool(), lambda trace=trace: trace)  # fmt: skip
        rollout = DECLARATIONS["alti"].run(request, DECLARATIONS["alti"].options()).target[0]
        expected_spreads.append((shares, rollout))
        start, token = start + size, token + tokens
    image = 0
    for row, sequence in enumerate(out.sequence_attributions):
        for number, positions in enumerate(out.info["image_tokens"][row]):
            shares, rollout = expected_spreads[image]
            decoder = sequence.source_attributions[positions]  # (tokens, spans)
            on_patches = (decoder.T[:, :, None] * shares).flatten(1)  # token k's four patches are 4k .. 4k + 3
            spread = sequence.sequence_scores[f"tower_image{number + 1}"]
            torch.testing.assert_close(spread, (on_patches @ rollout).T, rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(spread.sum(0), decoder.sum(0), rtol=1e-5, atol=1e-6)
            image += 1
    assert image == 3


@pytest.mark.parametrize("method", ["alti_logit", "attn_lrp"])
def test_a_packed_tower_is_read_from_the_models_own_pass_and_run_once(method):
    """``tower=True`` on Qwen2-VL reads the tower's first-block input and its merged embeddings from the forward pass
    the method runs anyway: the real tower runs once in the call (as without the tower), and the scores are those of
    a call that runs it a second time of its own (the recorder disabled)."""
    from inseq_mixing.specs import packed_tower

    square, tall = two_images()
    model = front("qwen2_vl", method)
    prompt = f"a {placeholder('qwen2_vl')} dog {placeholder('qwen2_vl')}"
    calls = []
    hook = model.model.model.visual.register_forward_hook(lambda *_: calls.append(1))
    try:
        out = model.attribute([square, tall], prompt, "the", tower=True, show_progress=False)
        assert len(calls) == 1
        original = packed_tower.tower_recorder
        packed_tower.tower_recorder = lambda tower: contextlib.nullcontext({})  # nothing read: a run of its own
        try:
            calls.clear()
            again = model.attribute([square, tall], prompt, "the", tower=True, show_progress=False)
        finally:
            packed_tower.tower_recorder = original
        assert len(calls) == 2
    finally:
        hook.remove()
    for number in (1, 2):
        torch.testing.assert_close(out.sequence_attributions[0].sequence_scores[f"tower_image{number}"],
                                   again.sequence_attributions[0].sequence_scores[f"tower_image{number}"])  # fmt: skip


def test_a_packed_tower_run_that_is_not_the_models_own_is_refused(monkeypatch):
    """The traced tower is checked against the model's own run of it: Qwen2.5-VL's windows put in the wrong order
    (the unit order left as the model's) give other final states, and ``tower=True`` is refused, not answered."""
    import inseq_mixing
    from inseq_mixing.specs import qwen2_vl
    from inseq_mixing.testing import tiny_vlm_processor
    from inseq_mixing.trace import TraceError

    square, _ = two_images()
    model = inseq_mixing.load_model(tiny_vlm("qwen2_5_vl", tower_layers=2), "alti_logit",
                                    processor=tiny_vlm_processor("qwen2_5_vl"))  # fmt: skip
    prompt = f"the {placeholder('qwen2_5_vl')} cat"
    model.attribute(square, prompt, "sat", tower=True, show_progress=False)  # the model's own order: answered
    monkeypatch.setattr(qwen2_vl, "get_vision_window_index",
                        lambda grid, *_: (torch.arange(int(grid[:, 1:].prod()) // 4), None))  # fmt: skip
    with pytest.raises(TraceError, match="computes them otherwise"):
        model.attribute(square, prompt, "sat", tower=True, show_progress=False)


def test_the_tower_is_refused_where_the_projector_merges_or_units_pool():
    """``tower=True`` on Qwen3-VL (DeepStack: earlier tower blocks' merged states are added to the decoder's) or with
    image units: refused with the reason before the model runs."""
    square, _ = two_images()
    qwen = front("qwen3_vl")
    with pytest.raises(ValueError, match="qwen3_vl's image tokens read the tower otherwise"):
        qwen.attribute(square, f"the {placeholder('qwen3_vl')} cat", "sat", tower=True, show_progress=False)
    with pytest.raises(ValueError, match="use units='tokens'"):
        front("llava").attribute(square, "the <image> cat", "sat", tower=True, units="images", show_progress=False)


def test_attn_lrp_builds_no_graph_through_the_vision_tower():
    """AttnLRP's relevance stops at the first decoder block's input, so its pass runs the tower and the projector
    without gradients (no activations kept for them): the tower's output needs no gradient during the pass, the first
    block's output does, the model's own logit is still explained whole, and gradients are on again after the call."""
    model = vlm("llava")
    ids, mask, images = image_batch(model)
    seen = {}

    def on_tower(_module, _args, out) -> None:  # a hook that returns something would replace the output
        seen.setdefault("tower", out.last_hidden_state.requires_grad)

    def on_block(_module, _args, out) -> None:
        seen.setdefault("block", (out[0] if isinstance(out, tuple) else out).requires_grad)

    tower = model.model.vision_tower.register_forward_hook(on_tower)
    block = get_spec(model).decoder.layers[0].module.register_forward_hook(on_block)
    try:
        trace = traced(model, ids, mask, images)
        predicted = next_tokens({"input_ids": ids})
        request = Request(get_spec(model), model, mask, None, None, predicted, None, mask.bool(), lambda: trace)
        seen.clear()
        scores = DECLARATIONS["attn_lrp"].run(request, DECLARATIONS["attn_lrp"].options())
    finally:
        tower.remove()
        block.remove()
    assert seen == {"tower": False, "block": True}
    total = scores.target.sum(-1) + sum(scores.terms.values())
    torch.testing.assert_close(total[mask.bool()], scores.logit[mask.bool()], rtol=1e-4, atol=1e-4)
    assert torch.is_grad_enabled()


def test_the_pointing_game_scores_the_answer_against_its_box(tmp_path):
    """``evaluate(vlm, methods, rows, "pointing")``: an image token is in the box when half its cell is (on the part
    of the image its grid covers: LLaVA's centred square), the game is 1 when the answer's highest-scored image token
    is in it, the gold share is the positive scores' share in it; both read from the front end's own output here;
    the random baseline is the box's share of the tokens; a row whose box leaves the image is skipped, named."""
    from PIL import Image

    import inseq_mixing
    from inseq_mixing.evaluation.vlm import box_tokens
    from inseq_mixing.testing import synthetic_image

    wide = synthetic_image(40, seed=3)[:30]  # its grid covers (5, 0, 35, 30): cells of 10 × 10 pixels
    path = tmp_path / "wide.png"
    Image.fromarray(wide).save(path)
    rows = [
        {"images": str(path), "prompt": "the <image> cat", "answer": "sat on", "box": [5, 0, 25, 10]},  # r0c0, r0c1
        {"images": str(path), "prompt": "a <image> dog", "answer": "the mat", "box": [14, 14, 35, 30]},  # r1c1 on
        {"images": str(path), "prompt": "a <image> dog", "answer": "the mat", "box": [0, 0, 50, 10]},  # outside
    ]
    model = front("llava")
    evaluation = inseq_mixing.evaluate(model, ["alti_logit", "alti"], rows, "pointing")
    assert [skip.row for skip in evaluation.skipped] == [2] and "not inside the first image, 40 × 30 pixels" in \
        evaluation.skipped[0].reason  # fmt: skip
    expected = {name: [] for name in ("pointing_game", "gold_share")}
    for row in rows[:2]:
        out = model.for_method("alti_logit").attribute(wide, row["prompt"], row["answer"], spans="answer",
                                                       show_progress=False)  # fmt: skip
        region, positions = box_tokens(out, row["box"])
        labels = [out.sequence_attributions[0].source[position].token for position in positions]
        inside = sorted(label for label, flag in zip(labels, region.tolist(), strict=True) if flag)
        assert inside == (["img1 r0c0", "img1 r0c1"] if row is rows[0] else ["img1 r1c1", "img1 r1c2", "img1 r2c1",
                                                                             "img1 r2c2"])  # fmt: skip
        scores = out.sequence_attributions[0].source_attributions[positions, 0]
        expected["pointing_game"].append(float(region[int(scores.argmax())]))
        positive = scores.clamp(min=0)
        expected["gold_share"].append(float(positive[region].sum() / positive.sum()))
    summary = evaluation.results["alti_logit"].statistics
    for metric, values in expected.items():
        assert float(summary[metric].value()) == pytest.approx(sum(values) / len(values))
    assert evaluation.baseline["pointing_game"] == pytest.approx((2 / 9 + 4 / 9) / 2)


def projector_outputs(model) -> list:
    """The modules whose outputs are what the decoder reads of each image token: LLaVA's projector; Qwen3-VL's merger
    and its DeepStack mergers."""
    if model.config.model_type == "llava":
        return [model.model.multi_modal_projector]
    visual = model.model.visual
    return [visual.merger, *visual.deepstack_merger_list]


def answer_inputs(front_end, image, prompt: str, answer: str) -> tuple[torch.Tensor, dict, int, list[int]]:
    """A plain forward pass's inputs for one image, a prompt and its answer teacher-forced (the processor's, the
    answer's ids appended): the ids, the other inputs, the position predicting the answer's first token, its ids."""
    answer_ids = front_end.tokenizer(answer, add_special_tokens=False)["input_ids"]
    encoded = front_end.processor(images=[[image]], text=[prompt], return_tensors="pt")
    ids = torch.cat([encoded["input_ids"], torch.tensor([answer_ids])], 1)
    extra = {name: value for name, value in encoded.items() if name not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in extra:
        extra["mm_token_type_ids"] = torch.cat([extra["mm_token_type_ids"], torch.zeros(1, len(answer_ids))], 1).int()
    return ids, extra, encoded["input_ids"].shape[1] - 1, answer_ids


def answer_probability_with_tokens_averaged(front_end, image, prompt: str, answer: str, removed: list[int]) -> float:
    """The naive reading of a removal: the answer's mean token probability (a plain forward pass of the processor's
    inputs) with the image tokens ``removed`` (indices in the image's order) replaced, at the projectors' outputs
    (hooks on the real modules), by the mean of the image's tokens."""
    ids, extra, first, answer_ids = answer_inputs(front_end, image, prompt, answer)

    def averaged(_module, _args, output):
        flat = output.reshape(-1, output.shape[-1])
        flat = flat.clone()
        flat[removed] = flat.mean(0)
        return flat.reshape(output.shape)

    handles = [module.register_forward_hook(averaged) for module in projector_outputs(front_end.model)]
    try:
        with torch.no_grad():
            logits = front_end.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                     **extra).logits[0]  # fmt: skip
    finally:
        for handle in handles:
            handle.remove()
    probabilities = logits[first : first + len(answer_ids)].softmax(-1)
    return float(probabilities[torch.arange(len(answer_ids)), answer_ids].mean())


@pytest.mark.parametrize("family", ["llava", "qwen3_vl"])
def test_removing_image_tokens_reads_the_answer_as_the_model_does_with_those_tokens_averaged(family):
    """Faithfulness's reader: with some of the first image's tokens removed, the answer's probability equals a plain
    forward pass whose projector outputs (Qwen3-VL: its DeepStack mergers' too) put the image tokens' mean at those
    tokens; nothing removed is the model's own probability."""
    from inseq_mixing.evaluation.vlm import answer_reader

    square, _ = two_images()
    model = front(family)
    prompt, answer = f"the {placeholder(family)} cat", "sat on the"
    item = model.prompt_item("Prompt 0", [square], prompt, answer, None)
    read = answer_reader(model, item)
    count = len(model.image_positions(item)[0][0])
    removals = [[], [0, 4, 8], [1], list(range(count))]
    kept = torch.ones(len(removals), count, dtype=torch.bool)
    for row, removed in enumerate(removals):
        kept[row, removed] = False
    probabilities, _ = read(kept)
    for row, removed in enumerate(removals):
        naive = answer_probability_with_tokens_averaged(model, square, prompt, answer, removed)
        assert float(probabilities[row]) == pytest.approx(naive, rel=1e-4, abs=1e-6)
    assert len(set(probabilities.tolist())) == len(removals)  # each removal changes the answer's probability


def test_faithfulness_of_a_vlm_reads_curves_over_the_image_tokens_in_the_answers_order(tmp_path):
    """``evaluate(vlm, methods, rows, "faithfulness")``: each method's deletion area is the trapezoid of the answer's
    probability (the naive reading above) as its top-scored image tokens are removed, fraction by fraction; random
    rankings give the baseline; a row without an answer is skipped, named."""
    from PIL import Image

    import inseq_mixing

    square, _ = two_images()
    path = tmp_path / "square.png"
    Image.fromarray(square).save(path)
    rows = [{"images": str(path), "prompt": "the <image> cat", "answer": "sat on the"},
            {"images": str(path), "prompt": "a <image> dog", "answer": ""}]  # fmt: skip
    model = front("llava")
    evaluation = inseq_mixing.evaluate(model, ["alti_logit"], rows, "faithfulness", steps=3)
    assert [skip.row for skip in evaluation.skipped] == [1] and "has no answer" in evaluation.skipped[0].reason
    out = model.attribute(square, rows[0]["prompt"], rows[0]["answer"], spans="answer", show_progress=False)
    positions = out.info["image_tokens"][0][0]
    ranking = torch.argsort(out.sequence_attributions[0].source_attributions[positions, 0], descending=True,
                            stable=True).tolist()  # fmt: skip
    counts = [round(9 * step / 3) for step in range(4)]
    deletion = [answer_probability_with_tokens_averaged(model, square, rows[0]["prompt"], rows[0]["answer"],
                                                        ranking[:count]) for count in counts]  # fmt: skip
    expected = float(torch.trapezoid(torch.tensor(deletion, dtype=torch.float64),
                                     torch.tensor(counts, dtype=torch.float64) / 9))  # fmt: skip
    summary = evaluation.results["alti_logit"].statistics
    assert float(summary["deletion_auc"].value()) == pytest.approx(expected, rel=1e-4)
    assert set(evaluation.baseline) == {"deletion_auc", "insertion_auc", "comprehensiveness_prob",
                                        "sufficiency_prob"}  # fmt: skip


def first_block_gradient(front_end, image, prompt: str, answer: str, read: str | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor, float]:  # fmt: skip
    """Naively, on the real model: the first decoder block's input made a leaf by a hook, the answer's summed logit
    (teacher-forced, a plain forward pass of the processor's inputs; ``read``: the logits of these tokens instead, at
    the answer's positions) and its gradient there: ``(input, gradient)`` ``(T, D)`` and the logit."""
    ids, extra, start, answer_ids = answer_inputs(front_end, image, prompt, answer)
    if read is not None:
        answer_ids = front_end.tokenizer(read, add_special_tokens=False)["input_ids"]
    leaf = {}

    def made_leaf(_module, args, kwargs):
        leaf["input"] = args[0].detach().requires_grad_(True)
        return (leaf["input"], *args[1:]), kwargs

    first = get_spec(front_end.model).decoder.layers[0].module
    handle = first.register_forward_pre_hook(made_leaf, with_kwargs=True)
    try:
        logits = front_end.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, **extra).logits
    finally:
        handle.remove()
    logit = logits[0, start : start + len(answer_ids)].gather(-1, torch.tensor(answer_ids)[:, None]).sum()
    (gradient,) = torch.autograd.grad(logit, leaf["input"])
    return leaf["input"][0].detach(), gradient[0], float(logit)


@pytest.mark.parametrize("family", ["llava", "qwen3_vl"])
def test_gradient_baselines_on_a_vlm_are_the_gradient_at_the_first_block_input(family):
    """``input_x_gradient`` and ``saliency`` over image and text tokens for the answer as one span: the gradient of its
    summed logit at the first block's input (a hook on the real block, a plain backward pass) times that input (or in
    absolute value), summed over the embedding; ``integrated_gradients`` (a right Riemann sum of 4 steps from the zero
    input) is the input times the mean of those gradients at a quarter, half, ... of it."""
    square, _ = two_images()
    prompt, answer = f"the {placeholder(family)} cat", "sat on the"
    embeds, gradient, logit = first_block_gradient(front(family), square, prompt, answer)
    for method, expected in (("input_x_gradient", (embeds * gradient).sum(-1)), ("saliency", gradient.abs().sum(-1))):
        out = front(family, method).attribute(square, prompt, answer, spans="answer", show_progress=False)
        sequence = out.sequence_attributions[0]
        torch.testing.assert_close(sequence.source_attributions[: len(embeds), 0], expected, rtol=1e-4, atol=1e-6)
        assert sequence.step_scores["logit"][0] == pytest.approx(logit, rel=1e-5)
        assert out.info["attributed_fn"] == "logit"
    assert any(token.token.startswith("img1 ") for token in sequence.source[: len(embeds)])
    steps = 4  # integrated gradients' right Riemann sum: the input times the mean gradient at 1/4, ..., 4/4 of it
    out = front(family, "integrated_gradients").attribute(square, prompt, answer, spans="answer", n_steps=steps,
                                                          method="riemann_right", show_progress=False)  # fmt: skip
    mean = sum(gradient_at_scaled_input(front(family), square, prompt, answer, (k + 1) / steps) for k in range(steps))
    torch.testing.assert_close(out.sequence_attributions[0].source_attributions[: len(embeds), 0],
                               (embeds * mean / steps).sum(-1), rtol=1e-4, atol=1e-6)  # fmt: skip


def test_a_gradient_baseline_on_a_vlm_explains_the_contrast_with_another_answer():
    """``contrast_targets=``: ``input_x_gradient`` of the answer's summed logit minus the contrast's, read at the
    answer's positions, is the input times the difference of the two gradients (each a plain backward pass through a
    hook on the real block), and its step score is the logits' difference."""
    square, _ = two_images()
    prompt, answer, contrast = "the <image> cat", "sat on the", "ran to a"
    embeds, gradient, logit = first_block_gradient(front("llava"), square, prompt, answer)
    _, foil_gradient, foil_logit = first_block_gradient(front("llava"), square, prompt, answer, read=contrast)
    out = front("llava", "input_x_gradient").attribute(square, prompt, answer, spans="answer",
                                                       contrast_targets=contrast, show_progress=False)  # fmt: skip
    sequence = out.sequence_attributions[0]
    torch.testing.assert_close(sequence.source_attributions[: len(embeds), 0],
                               (embeds * (gradient - foil_gradient)).sum(-1), rtol=1e-4, atol=1e-6)  # fmt: skip
    assert sequence.step_scores["contrast_logits_diff"][0] == pytest.approx(logit - foil_logit, rel=1e-5)
    assert out.info["attributed_fn"] == "contrast_logits_diff"


def gradient_at_scaled_input(front_end, image, prompt: str, answer: str, scale: float) -> torch.Tensor:
    """The answer's summed-logit gradient at the first block's input scaled by ``scale`` (a hook on the real block
    scales it, :func:`first_block_gradient` takes the gradient there)."""
    first = get_spec(front_end.model).decoder.layers[0].module
    handle = first.register_forward_pre_hook(lambda _m, args, kwargs: ((args[0] * scale, *args[1:]), kwargs),
                                             with_kwargs=True)  # fmt: skip
    try:
        return first_block_gradient(front_end, image, prompt, answer)[1]
    finally:
        handle.remove()


def test_compare_on_a_vlm_scores_each_method_by_removing_its_top_image_tokens():
    """``compare(vlm, methods, [(image, prompt)], [answer], processor=...)``: every method (a gradient baseline among
    them) explains the answer as one span; each row's comprehensiveness is the mean drop of the answer's probability
    (the naive reading: projector outputs averaged by hooks) with the method's top image tokens removed, fraction by
    fraction; a method that fails is named, the others kept."""
    import inseq_mixing

    square, _ = two_images()
    model = front("llava")
    prompt, answer = "the <image> cat", "sat on the"
    with pytest.warns(UserWarning, match="saliency failed"):
        comparison = inseq_mixing.compare(model.model, ["alti_logit", "input_x_gradient", "saliency"],
                                          [(square, prompt)], [answer], processor=model.processor,
                                          fractions=(0.2, 0.5),
                                          method_kwargs={"saliency": {"n_steps": 3}})  # fmt: skip
    assert "saliency" in comparison.failed and set(comparison.outputs) == {"alti_logit", "input_x_gradient"}
    for method in comparison.outputs:
        out = comparison.outputs[method]
        scores = out.sequence_attributions[0].source_attributions[out.info["image_tokens"][0][0], 0]
        ranking = torch.argsort(scores, descending=True, stable=True).tolist()
        original = answer_probability_with_tokens_averaged(model, square, prompt, answer, [])
        drops = [original - answer_probability_with_tokens_averaged(model, square, prompt, answer,
                                                                    ranking[: math.ceil(fraction * 9)])
                 for fraction in (0.2, 0.5)]  # fmt: skip
        row = next(row for row in comparison.tokens if row["method"] == method)
        assert row["comprehensiveness_prob"] == pytest.approx(sum(drops) / 2, rel=1e-4, abs=1e-7)
    assert comparison.agreement and comparison.summary()[1]["explains"] == "logit"


def test_boxes_as_units_sum_the_tokens_whose_cells_they_hold():
    """``units=[box, ...]``: a box's unit is the image tokens with at least half their cell in it (LLaVA's 40 × 30
    image: its grid covers the centred 30 × 30 square, cells of 10 pixels), its score their scores' sum; the rest of
    the image is one unit, the text's tokens their own; a box outside the image, or covering no token's half cell,
    is refused naming the prompt before the model runs."""
    from inseq_mixing.testing import synthetic_image

    wide = synthetic_image(40, seed=3)[:30]
    model = front("llava")
    tokens = model.attribute(wide, "the <image> cat", "sat on", show_progress=False).sequence_attributions[0]
    labels = [token.token for token in tokens.source]
    boxed = model.attribute(wide, "the <image> cat", "sat on", units=[[5, 0, 25, 10], (1, [14, 14, 35, 30])],
                            show_progress=False).sequence_attributions[0]  # fmt: skip
    units = [token.token for token in boxed.source]
    assert units[:4] == ["the", "box 1", "image 1 (rest)", "box 2"] and units[4:] == labels[10:]  # at first tokens
    members = {"box 1": ["r0c0", "r0c1"], "box 2": ["r1c1", "r1c2", "r2c1", "r2c2"],
               "image 1 (rest)": ["r0c2", "r1c0", "r2c0"]}  # fmt: skip
    for unit, cells in members.items():
        rows = [labels.index(f"img1 {cell}") for cell in cells]
        torch.testing.assert_close(
            boxed.source_attributions[units.index(unit)], tokens.source_attributions[rows].sum(0)
        )
    calls = []
    handle = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"Prompt 0: box 1 \[0.0, 0.0, 50.0, 10.0\] is not inside image 1"):
            model.attribute(wide, "the <image> cat", "sat", units=[[0, 0, 50, 10]], show_progress=False)
        with pytest.raises(ValueError, match="Prompt 0: box 1 .* covers no image token"):
            model.attribute(wide, "the <image> cat", "sat", units=[[5, 0, 9, 4]], show_progress=False)
        with pytest.raises(ValueError, match="units: box 1 is 'x'"):
            model.attribute(wide, "the <image> cat", "sat", units=["x"], show_progress=False)
    finally:
        handle.remove()
    assert not calls


def image_embeddings(front_end, pixels_changed: dict) -> torch.Tensor:
    """The decoder's input embeddings ``(tokens, width)`` of a prompt (the processor's inputs, ``pixels_changed``
    replacing some), read at the language model's input."""
    seen = {}
    language = front_end.model.model.language_model

    def read(_module, _args, kwargs) -> None:
        seen.setdefault("embeds", kwargs["inputs_embeds"][0].clone())

    handle = language.register_forward_pre_hook(read, with_kwargs=True)
    try:
        with torch.no_grad():
            front_end.model(**pixels_changed, use_cache=False)
    finally:
        handle.remove()
    return seen["embeds"]


def by_tokens_and_units(model, image, prompt: str, answer: str, units: str):
    """One prompt explained over tokens and over ``units``; each unit's score checked to be its tokens' summed."""
    tokens = model.attribute(image, prompt, answer, show_progress=False)
    out = model.attribute(image, prompt, answer, units=units, show_progress=False)
    scores = tokens.sequence_attributions[0].source_attributions
    for row, members in enumerate(out.info["unit_keys"][0]):
        torch.testing.assert_close(out.sequence_attributions[0].source_attributions[row], scores[members].sum(0))
    return tokens, out


@pytest.mark.parametrize("family", ["internvl", "llava_next", "llava_onevision", "llava"])
def test_tiles_as_units_are_the_tokens_each_tile_gives(family):
    """``units="tiles"``: unit ``img1 t{k}`` holds the image tokens whose embeddings change when the model's k-th
    tile's pixels change and no other (a black-box check on the model: InternVL's one run of tiles cut by the
    processor's tokens per tile, LLaVA-NeXT's and OneVision's tiles packed on the image's grid), the tokens no tile
    changes are the image's newlines; an untiled image is one unit; each unit's score is its tokens' summed."""
    _, tall = two_images()
    model = front(family)
    prompt = f"the {placeholder(family)} cat"
    tokens, tiles = by_tokens_and_units(model, tall, prompt, "sat on", "tiles")
    labels = [token.token for token in tiles.sequence_attributions[0].source]
    keys = dict(zip(labels, tiles.info["unit_keys"][0], strict=True))
    encoded = dict(model.processor(images=[[tall]], text=[prompt], return_tensors="pt"))
    pixels = encoded["pixel_values"]
    flat = pixels.reshape(-1, *pixels.shape[-3:])
    image = tokens.info["image_tokens"][0][0]
    plain = image_embeddings(model, encoded)
    changed_by = []
    for tile in range(flat.shape[0]):
        moved = flat.clone()
        moved[tile] += 1.0
        embeds = image_embeddings(model, encoded | {"pixel_values": moved.reshape(pixels.shape)})
        changed_by.append(sorted((embeds - plain).abs().amax(-1).nonzero()[:, 0].tolist()))
    if family == "llava":
        assert len(changed_by) == 1 and "image 1" in keys and keys["image 1"] == image
    else:
        assert len(changed_by) >= 3  # the whole image and two tiles at least
        assert [label for label in labels if label.startswith("img1 t")] == [f"img1 t{k + 1}" for k in
                                                                             range(len(changed_by))]  # fmt: skip
        for tile, positions in enumerate(changed_by):
            assert keys[f"img1 t{tile + 1}"] == positions
        rest = sorted(set(image) - {position for positions in changed_by for position in positions})
        assert keys.get("img1 newlines", []) == rest and (bool(rest) == family.startswith("llava"))


def test_tiles_the_model_resamples_are_refused_as_units():
    """OneVision's resampled grid (``anyres_max_1``: its tokens blend tiles) cannot be cut into tiles:
    ``units="tiles"`` is refused with the reason, naming the image."""
    import inseq_mixing
    from inseq_mixing.testing import tiny_vlm_processor

    _, tall = two_images()
    model = tiny_vlm("llava_onevision")
    processor = tiny_vlm_processor("llava_onevision")
    model.config.vision_aspect_ratio = processor.vision_aspect_ratio = "anyres_max_1"
    front_end = inseq_mixing.load_model(model, "alti_logit", processor=processor)
    with pytest.raises(ValueError, match="units='tiles': the model resamples image 1's grid of tiles"):
        front_end.attribute(tall, "a <image> dog", "the", units="tiles", show_progress=False)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_sentences_as_units_are_the_prompts_and_the_answers_sentences(family):
    """``units="sentences"``: the text between images and markup tokens cut into its sentences (a sentence an image
    interrupts is two units), each image one unit, markup tokens their own, the answer's sentences ``(generated)``;
    the units partition the tokens and each unit's score is its tokens' summed."""
    square, _ = two_images()
    model = front(family)
    prompt = f"the cat sat . the dog {placeholder(family)} sat on the mat . a dog"
    tokens, out = by_tokens_and_units(model, square, prompt, "sat on the . the cat", "sentences")
    labels = [token.token for token in out.sequence_attributions[0].source]
    marks = ["<|vision_start|>", "image 1", "<|vision_end|>"] if family == "qwen2_vl" else ["image 1"]
    assert labels == ["the cat sat .", "the dog", *marks, "sat on the mat .", "a dog", "(generated) sat on the .",
                      "(generated) the cat"]  # fmt: skip
    keys = out.info["unit_keys"][0]
    text = tokens.sequence_attributions[0].source
    assert sorted(key for members in keys for key in members) == list(range(len(text)))
    for label, members in zip(labels, keys, strict=True):
        words = " ".join(text[key].token for key in members)
        assert label == "image 1" or words == label.removeprefix("(generated) ")


def test_sentences_are_cut_by_the_language_asked_and_a_bad_code_is_refused_first(monkeypatch, tmp_path):
    """``language=`` reaches ``sentencex`` (every stretch cut by its rules), in a call and in a dataset run; a value
    that is not a language code is refused before the model runs, by ``attribute`` and by a dataset run."""
    from PIL import Image

    import inseq_mixing.frontends.vlm as vlm_front_end
    from inseq_mixing.runs import attribute_dataset
    from inseq_mixing.runs.data import DatasetInputError

    asked = []
    cut = vlm_front_end.sentence_ranges
    monkeypatch.setattr(
        vlm_front_end, "sentence_ranges", lambda text, language: asked.append(language) or cut(text, language)
    )
    square, _ = two_images()
    model = front("llava")
    out = model.attribute(square, "the cat sat . <image> a dog", "sat on", units="sentences", language="fr",
                          show_progress=False)  # fmt: skip
    assert asked and set(asked) == {"fr"} and "the cat sat ." in [token.token for token in
                                                                   out.sequence_attributions[0].source]  # fmt: skip
    calls = []
    handle = model.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(ValueError, match="language='english': give a language code"):
            model.attribute(square, "the <image> cat", "sat", units="sentences", language="english",
                            show_progress=False)  # fmt: skip
    finally:
        handle.remove()
    assert not calls
    path = tmp_path / "square.png"
    Image.fromarray(square).save(path)
    rows = [{"images": str(path), "prompt": "the cat sat . <image> a dog", "answer": "sat on"}]
    with pytest.raises(DatasetInputError, match="language='english'"):
        attribute_dataset(model, "alti_logit", rows, tmp_path / "bad", units="sentences", language="english",
                          show_progress=False)  # fmt: skip
    asked.clear()
    attribute_dataset(model, "alti_logit", rows, tmp_path / "fr", units="sentences", language="fr",
                      show_progress=False)  # fmt: skip
    assert set(asked) == {"fr"}


def sentence_tokenizer(kind: str):
    """A tokenizer trained here on a few sentences: byte-level BPE (GPT-2's kind) or SentencePiece-like BPE
    (Llama's: a metaspace, spaces folded into the next token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    if kind == "bytes":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet = []
    corpus = ["The cat sat on the mat. A dog ran! Is it late? Dr. Smith met Mrs. Jones at 5 p.m. today."] * 20
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"],
                                                              initial_alphabet=alphabet))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>")


WORDS_OF_SENTENCES = ["The", "cat", "sat", "on", "the", "mat", "A", "dog", "ran", "Is", "it", "late", "Dr.", "Smith"]


@pytest.mark.parametrize("kind", ["bytes", "metaspace"])
def test_a_stretch_of_text_is_cut_into_its_sentences_token_for_token(kind):
    """For any text of sentences, :func:`_sentence_groups` partitions its tokens in order, and each group's tokens
    decode to its sentence (``sentencex``'s cut of the whole text), spaces aside: found by bisection over prefixes,
    with tokens that fold the space before a word into it (a metaspace) and tokens of bytes."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from inseq_mixing.frontends.spans import sentence_ranges
    from inseq_mixing.frontends.vlm import _sentence_groups

    tokenizer = sentence_tokenizer(kind)
    sentence = st.lists(st.sampled_from(WORDS_OF_SENTENCES), min_size=1, max_size=6).map(" ".join)
    ends = st.sampled_from([".", "!", "?"])

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(sentence, ends), min_size=1, max_size=5))
    def check(parts):
        text = " ".join(words + end for words, end in parts)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        groups = _sentence_groups(tokenizer, ids)
        assert [index for _, members in groups for index in members] == list(range(len(ids)))
        decoded = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        expected = [decoded[begin:end].strip() for begin, end in sentence_ranges(decoded, "en")]
        found = [tokenizer.decode([ids[i] for i in members], clean_up_tokenization_spaces=False).strip()
                 for _, members in groups]  # fmt: skip
        assert found == expected

    check()


def test_a_dataset_runs_spans_units_and_boxes_are_checked_before_any_work(tmp_path):
    """A dataset run's own arguments are checked as ``attribute`` checks them, before any row is attributed: an
    unknown span kind, and a box outside a row's image (named by its row), are refused and no store is written."""
    from PIL import Image

    from inseq_mixing.runs import attribute_dataset
    from inseq_mixing.runs.data import DatasetInputError

    square, _ = two_images()
    path = tmp_path / "square.png"
    Image.fromarray(square).save(path)
    rows = [{"images": str(path), "prompt": "the <image> cat", "answer": "sat on"}]
    model = front("llava")
    with pytest.raises(DatasetInputError, match=r"spans='words': give one of \('tokens', 'answer'\)"):
        attribute_dataset(model, "alti_logit", rows, tmp_path / "spans", spans="words", show_progress=False)
    with pytest.raises(DatasetInputError, match=r"Row 0 \(id '0'\): box 1 \[0.0, 0.0, 90.0, 10.0\] is not inside"):
        attribute_dataset(model, "alti_logit", rows, tmp_path / "boxes", units=[[0, 0, 90, 10]], show_progress=False)
    assert not (tmp_path / "spans").exists() and not (tmp_path / "boxes").exists()
    attribute_dataset(model, "alti_logit", rows, tmp_path / "ok", units=[[0, 0, 20, 20]], show_progress=False)
