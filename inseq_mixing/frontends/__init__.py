"""Front ends: what turns a user's model and inputs into the declarations' requests, and their results into Inseq's
outputs. No math here.

- :mod:`.router`: the one place that decides what kind a model is (:func:`identify`) and builds its front end
  (:func:`load_model`);
- :mod:`.inseq_adapter`: generation models, through Inseq's own ``AttributionModel`` (one method class per
  declaration);
- :mod:`.encoders`: encoder-only models (masked LMs, classifiers, token classifiers, bare encoders);
- :mod:`.speech` (with :mod:`.audio`): Whisper, wav2vec 2.0 and HuBERT over audio words;
- :mod:`.vision`: ViT and DeiT over image patches;
- :mod:`.vlm`: vision–language decoders over images and prompts;
- :mod:`.common`: what the front ends share;
- :mod:`.patches`: every change this package makes to Inseq's own behaviour.
"""

from .router import (
    ENCODER,
    GENERATION,
    SPEECH,
    VISION,
    VISION_LANGUAGE,
    ModelKind,
    as_front_end,
    identify,
    is_front_end,
    load_model,
    run_front_end,
)


def __getattr__(name: str):
    if name in ("EncoderAttributionModel", "SpeechAttributionModel", "VisionAttributionModel"):  # imported on first
        from .encoders import EncoderAttributionModel  # use (they import torch)
        from .speech import SpeechAttributionModel
        from .vision import VisionAttributionModel

        classes = (EncoderAttributionModel, SpeechAttributionModel, VisionAttributionModel)
        return {cls.__name__: cls for cls in classes}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENCODER",
    "GENERATION",
    "SPEECH",
    "VISION",
    "VISION_LANGUAGE",
    "EncoderAttributionModel",
    "ModelKind",
    "as_front_end",
    "identify",
    "is_front_end",
    "load_model",
    "run_front_end",
    "SpeechAttributionModel",
    "VisionAttributionModel",
]
