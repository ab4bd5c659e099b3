"""Idefics3 and SmolVLM (Hugging Face, 2024–2025): a SigLIP-style vision tower whose patch states are pixel-shuffled
(each 2 × 2 block of patches folded into one state of four times the width) and projected into the embeddings of the
image's tokens in a Llama language model's input. The decoder is explained as LLaVA's is (the image tokens'
embeddings are the first block's input); traced with ``pixel_values`` ``(batch, images, 3, H, W)``.

The tower (our extension, :mod:`inseq_mixing.methods.tower`): the projection is one bias-free linear map of the
shuffled concatenation, so an image token's embedding is exactly a sum of one part per patch it folds
(:class:`~.base.PatchMerge`; which patches, in which order, is read from the connector's own shuffle run on patch
indices); the tower is a SigLIP encoder (CLIP's blocks, the final ``post_layernorm``), traced on the model's images
without the padding images its processor adds to rows with fewer images.
"""

import torch
from torch import nn

from . import clip
from .base import ModelSpec, PatchMerge, StackSpec, TowerSpec
from .llava import decoder_spec

FAMILY = "Idefics3, SmolVLM (a Llama decoder over pixel-shuffled image tokens and text)"
KIND = "vision-language"
MODEL_TYPES = {"idefics3", "smolvlm"}


def tower_spec(model: nn.Module) -> TowerSpec | None:
    """The vision tower and the pixel shuffle as the image tokens read them, or None where the projection has a bias
    (its parts would not add up to the embedding)."""
    tower, connector = model.model.vision_model, model.model.connector
    projection = connector.modality_projection.proj
    if projection.bias is not None:
        return None
    patches = (tower.config.image_size // tower.config.patch_size) ** 2
    order = torch.arange(patches, dtype=torch.float64)[None, :, None]
    groups = connector.pixel_shuffle(order, connector.scale_factor)[0].round().long()  # (tokens, n): patch indices
    spec = ModelSpec(family=tower.config.model_type, causal=False,
                     decoder=StackSpec(layers=[clip.layer_spec(layer, tower.config) for layer in tower.encoder.layers],
                                       final_norm=tower.post_layernorm))  # fmt: skip
    return TowerSpec(module=tower, spec=spec, layers=len(tower.encoder.layers), first_feature=0, tokens=patches,
                     merge=PatchMerge(groups, projection), inputs=real_images)  # fmt: skip


def real_images(kwargs: dict) -> dict:
    """The tower's input from the model's: every row's images in one run, without the all-zero padding images the
    processor adds to rows with fewer images (the model drops them too).

    Raises:
        ValueError: An image is padded inside (a pixel mask with zeros): the tower would mask those patches.
    """
    pixels = kwargs["pixel_values"].flatten(0, 1)
    real = pixels.flatten(1).ne(0).any(1)
    mask = kwargs.get("pixel_attention_mask")
    if mask is not None and not mask.flatten(0, 1)[real].all():
        raise ValueError("tower=True reads whole images, and an image here is padded inside its square: give images "
                         "the processor resizes to its square (do_image_splitting=False).")  # fmt: skip
    return {"pixel_values": pixels[real]}


def build(model: nn.Module) -> ModelSpec:
    return decoder_spec(model, model.model.text_model, model.config.image_token_id, tower=tower_spec(model))
