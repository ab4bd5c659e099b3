"""SigLIP's and SigLIP 2's image towers (``siglip_vision_model``, ``siglip2_vision_model``, and the ones inside their
``...ForImageClassification``).

No [CLS]: the tokens are the patches alone, after the patch embedding and the position embeddings. The blocks are
CLIP's (:func:`.clip.layer_spec`); the final ``post_layernorm`` normalises every token. SigLIP 2 (NaFlex) reads each
image at its own aspect ratio: its processor gives the patches flattened, padded to ``max_num_patches``, with each
image's grid (``spatial_shapes``) and the real patches (``pixel_attention_mask``); padding is masked in attention as
a padded text batch is, and its position embeddings are resized to each grid inside the embedding module.

Read-outs: ``...ForImageClassification``: the mean of the real tokens' final states through one linear
``classifier`` (a pooled read-out, :class:`~.base.HeadSpec`); ``...VisionModel``: the bare encoder (map methods).
Refused: ``SiglipModel``'s and ``Siglip2Model``'s image–text similarity. Their image embedding comes from the
attention-pooling head, a further multi-head attention whose query is a learned probe (not a token), followed by an
MLP with its own residual: a block outside the token sequence, which none of the methods' definitions covers (there
is no probe token for maps to have a row for). Load the ``...VisionModel`` for the maps.
"""

from torch import nn

from .base import ModelSpec, StackSpec, UnsupportedModelError
from .clip import layer_spec, tower
from .encoder_heads import pooled_head_spec

FAMILY = "SigLIP, SigLIP 2 image towers (vision)"
KIND = "vision"
MODEL_TYPES = {"siglip", "siglip_vision_model", "siglip2", "siglip2_vision_model"}


def build(model: nn.Module) -> ModelSpec:
    name, vision = type(model).__name__, tower(model)
    if name in ("SiglipForImageClassification", "Siglip2ForImageClassification"):
        head = pooled_head_spec(("mean",), 0, (model.classifier,))
    elif name in ("SiglipVisionModel", "Siglip2VisionModel"):
        head = None
    else:
        raise UnsupportedModelError(
            f"{name}: SigLIP's image–text similarity is read through an attention-pooling head (a learned probe "
            "attending over the patches, then an MLP), a block outside the token sequence that the methods do not "
            "define; load the ...VisionModel (map methods) or ...ForImageClassification instead."
        )
    return ModelSpec(
        family=model.config.model_type,
        decoder=StackSpec(
            layers=[layer_spec(layer, vision.config) for layer in vision.encoder.layers],
            final_norm=vision.post_layernorm,
        ),  # fmt: skip
        causal=False,
        head=head,
    )
