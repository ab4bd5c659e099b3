"""Vision–language decoders (issue 56, the decoder's first step): LLaVA's, Qwen2-VL's and Qwen2.5-VL's decoders over
image and text tokens, traced with the images, read by every method as a Llama's (the Qwens with their multimodal
rotary positions). ALTI-logit adds up to the model's own logits at image and text positions (with foils), every method
gives causal rows and a left-padded row equal to that row with its image alone, the image tokens get their share, and
AttnLRP gives the model's own logit."""

import pytest
import torch

from inseq_mixing.declarations import DECLARATIONS, Request
from inseq_mixing.methods.alti_logit import alti_logit
from inseq_mixing.specs import get_spec
from inseq_mixing.testing import VLM_FAMILIES, VLM_TOKENS_PER_IMAGE, tiny_vlm, tiny_vlm_images, tiny_vlm_inputs
from inseq_mixing.trace import trace_model

from .conftest import next_tokens

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
    later = torch.ones(length, length, dtype=torch.bool).triu(1)
    assert (batch.target[:, later] == 0).all()
    torch.testing.assert_close(batch.target[1, PADDED:, PADDED:], alone.target[0], rtol=1e-4, atol=2e-5)


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
