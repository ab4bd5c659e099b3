"""Gemma 3 (Gemma Team, 2025) and PaliGemma / PaliGemma 2 (Beyer et al., 2024; Steiner et al., 2024), their image
models: a SigLIP tower whose patch states are projected (Gemma 3: average-pooled first, to ``mm_tokens_per_image``
per image) into the embeddings of the image's tokens in a Gemma decoder (Gemma 3's, Gemma's, Gemma 2's). The decoder is
explained as the text decoder is (unit-offset RMSNorms; Gemma 2's and Gemma 3's around each sub-block), its positions
the image's tokens and the text's. The tower (our extension, :mod:`inseq_mixing.methods.tower`): PaliGemma's projector
reads one patch per token (LLaVA's case); Gemma 3's averages each block of patches, then its RMSNorm and projection,
decomposed exactly into one part per patch (:func:`tower_spec`).

Some tokens attend both ways. Gemma 3: an image's tokens read each other (a bidirectional block per image, from
``token_type_ids``). PaliGemma: its prefix, the image and the prompt, reads itself both ways where ``token_type_ids``
mark it (0: prefix, 1: suffix; without them the model is causal). The trace records the stack as not causal
(``bidirectional_images``), so every method reads each row over every key its attention saw, as on an encoder's stack,
and explains the logits as a decoder's; a row still reads no later token where the model's own mask says so (tested).

A PaliGemma answer is its suffix (``token_type_ids`` 1 at the answer's tokens, read causally, as generation reads it).
The final logit soft-cap is the model's: PaliGemma 2 applies its text config's; transformers 5.24's
``Gemma3ForConditionalGeneration`` applies none, whatever its text config says, so its logits are the head's.
"""

import torch
from torch import nn

from . import gemma2, llama
from .base import ModelSpec, PatchMerge, StackSpec, TowerSpec, UnsupportedModelError

FAMILY = "Gemma 3 and PaliGemma with images (a Gemma decoder over image and text tokens, some read both ways)"
KIND = "vision-language"
MODEL_TYPES = {"gemma3", "paligemma"}

#: The layer layout of each Gemma decoder an image model may hold, by ``text_config.model_type``.
LAYERS = {"gemma": llama.layer_spec, "gemma2": gemma2.layer_spec, "gemma3_text": gemma2.layer_spec}


def tower_spec(model: nn.Module) -> TowerSpec:
    """The SigLIP tower as the image tokens read it (its last states, ``post_layernorm`` included): PaliGemma projects
    each patch's state into one token (no merge); Gemma 3 averages each ``k × k`` block of patches, then its RMSNorm
    and projection (:class:`~.base.PatchMerge`, ``pool="mean"``)."""
    from . import get_spec

    tower = model.model.vision_tower
    vision = model.config.vision_config
    side = vision.image_size // vision.patch_size
    encoder = getattr(tower, "vision_model", tower).encoder
    merge = None
    if model.config.model_type == "gemma3":
        projector = model.model.multi_modal_projector
        kernel, tokens = projector.kernel_size, projector.tokens_per_side
        groups = torch.arange(side * side).reshape(tokens, kernel, tokens, kernel).permute(0, 2, 1, 3)
        merge = PatchMerge(groups.reshape(tokens * tokens, kernel * kernel), projector.mm_input_projection_weight,
                           norm=projector.mm_soft_emb_norm, pool="mean")  # fmt: skip
    return TowerSpec(module=tower, spec=get_spec(tower), layers=len(encoder.layers), first_feature=0,
                     tokens=side * side, merge=merge)  # fmt: skip


def build(model: nn.Module) -> ModelSpec:
    language, text = model.model.language_model, model.config.text_config
    if text.model_type not in LAYERS:
        raise UnsupportedModelError(f"This {model.config.model_type}'s language model is a {text.model_type!r}; its "
                                    f"decoder is explained when it is one of {sorted(LAYERS)}.")  # fmt: skip
    layers = [LAYERS[text.model_type](layer, text) for layer in language.layers]
    softcap = None if model.config.model_type == "gemma3" else getattr(text, "final_logit_softcapping", None)
    suffix = (("token_type_ids", 1),) if model.config.model_type == "paligemma" else ()  # the answer, read causally
    return ModelSpec(family=model.config.model_type, decoder=StackSpec(layers=layers, final_norm=language.norm),
                     lm_head=model.get_output_embeddings(), image_token_id=model.config.image_token_id,
                     logit_softcap=softcap, bidirectional_images=True, tower=tower_spec(model),
                     answer_inputs=suffix)  # fmt: skip
