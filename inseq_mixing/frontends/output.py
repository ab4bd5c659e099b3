"""The output of this package's own front ends: Inseq's ``FeatureAttributionOutput``, whose ``show()`` names its
columns.

Inseq captions every heatmap "Generated tokens" and "Attributed tokens". The encoder, speech and vision front ends'
columns are the explained entries instead (a masked word, a label, a transcript token, an image's label or text, a
bare encoder's rows), which the output's ``info["explained"]`` says; :class:`ExplainedOutput` writes that in the
caption. Everything else is Inseq's: ``aggregate()``, ``weight_attributions()``, ``save()`` (which writes a plain
``inseq.FeatureAttributionOutput``, so that ``FeatureAttributionOutput.load()`` reads it; a loaded output shows
Inseq's caption).

:func:`load_output` reads a saved output back through an allow-list of output classes (Inseq's and this package's):
Inseq's own ``FeatureAttributionOutput.load`` imports whatever module a file names and builds any class in it, so a
shared file could run code; a file naming any other class is refused here, naming it.
"""

import html
import json
from pathlib import Path

import inseq
import numpy as np

#: Inseq's caption of a heatmap, which its ``show()`` writes under every title.
INSEQ_CAPTION = "→ : Generated tokens, ↓ : Attributed tokens"


class ExplainedOutput(inseq.FeatureAttributionOutput):
    """``inseq.FeatureAttributionOutput`` of a front end of this package (see the module docstring)."""

    def caption(self) -> str:
        """What the heatmaps' columns and rows are."""
        explained = (self.info or {}).get("explained", "the explained entries")
        return f"→ : explained, {explained}; ↓ : input units"

    #: The images a vision output explains (set by the vision front end; not saved): ``show()`` draws over them.
    images = None

    def show(self, *args, display: bool = True, return_html: bool | None = False, **kwargs):
        """Inseq's ``show()`` with the columns named: in a notebook and in the returned HTML the caption is replaced;
        a terminal's tables keep Inseq's, under a line that names them. An output of images draws each image's scores
        over it instead: the overlays' page in a notebook (and as the returned HTML), PNG files in a terminal (their
        paths printed)."""
        from inseq.utils import isnotebook

        notebook = isnotebook()
        if self.images is not None:
            return self._show_images(display, return_html, notebook)
        if display and not notebook:
            print(f"(The heatmaps below: {self.caption()}; Inseq's own caption says 'Generated tokens'.)")
        page = super().show(*args, display=display and not notebook, return_html=True, **kwargs)
        page = None if page is None else page.replace(INSEQ_CAPTION, html.escape(self.caption()))
        if display and notebook:
            from IPython.display import HTML
            from IPython.display import display as show_html

            show_html(HTML(page))
        return page if return_html else None

    def _show_images(self, display: bool, return_html: bool | None, notebook: bool):
        from ..hooks import WRITERS

        if "image_report" not in WRITERS:
            raise RuntimeError("import inseq_mixing (with Inseq installed) to draw images.")
        page = WRITERS["image_report"](self, self.images, None)
        if display and notebook:
            from IPython.display import HTML
            from IPython.display import display as show_html

            show_html(HTML(page))
        elif display:
            import tempfile

            paths = WRITERS["image_overlays"](self, self.images, tempfile.mkdtemp(prefix="inseq_mixing_"))
            print("The scores over each image (" + self.caption() + "):\n" + "\n".join(str(p) for p in paths))
        return page if return_html else None

    def save(self, *args, **kwargs):
        """Inseq's ``save()``, as a plain ``inseq.FeatureAttributionOutput`` (what ``load()`` reads)."""
        plain = inseq.FeatureAttributionOutput(sequence_attributions=self.sequence_attributions,
                                               step_attributions=self.step_attributions, info=self.info)  # fmt: skip
        return plain.save(*args, **kwargs)


class UnsafeOutputError(ValueError):
    """A saved output that names a class outside the allow-list, or is not a saved attribution output."""


#: The array kinds a saved output may hold (booleans, integers, floats): never objects.
ARRAY_KINDS = "biuf"


def allowed_output_classes() -> dict[tuple[str, str], type]:
    """``(module, class name) → class`` of every class a saved output may name: Inseq's attribution outputs, sequence
    and step outputs and their subclasses (Inseq's and this package's, under their modules and the module that names
    this package's sequence classes for outputs saved by earlier versions), and Inseq's token class."""
    from inseq.data.attribution import (
        FeatureAttributionOutput,
        FeatureAttributionSequenceOutput,
        FeatureAttributionStepOutput,
    )
    from inseq.utils.typing import TokenWithId

    from . import sequences

    found, pending = {TokenWithId}, [FeatureAttributionOutput, FeatureAttributionSequenceOutput,
                                     FeatureAttributionStepOutput]  # fmt: skip
    while pending:
        cls = pending.pop()
        if cls.__module__.split(".")[0] in ("inseq", "inseq_mixing"):
            found.add(cls)
            pending += cls.__subclasses__()
    allowed = {(cls.__module__, cls.__name__): cls for cls in found}
    for name in ("MixingSequenceOutput", "SignedMixingSequenceOutput", "MixingStepOutput"):
        allowed["inseq_mixing.frontends.inseq_adapter.base", name] = getattr(sequences, name)
    return allowed


def load_output(path) -> inseq.FeatureAttributionOutput:
    """A saved output (``out.save(path)``, Inseq's format, gzip-compressed or not) read back without importing or
    building anything but the allowed output classes (:func:`allowed_output_classes`) and numeric arrays.

    Raises:
        UnsafeOutputError: The file names another class (its module and name are said), holds an array of objects,
            or is not a saved attribution output.
        OSError, ValueError: The file cannot be read or is not JSON.
    """
    import gzip

    raw = Path(path).read_bytes()
    text = gzip.decompress(raw).decode("utf-8") if raw[:2] == b"\x1f\x8b" else raw.decode("utf-8")
    allowed = allowed_output_classes()
    out = json.loads(text, object_pairs_hook=lambda pairs: _decoded(dict(pairs), allowed, path))
    if not isinstance(out, inseq.FeatureAttributionOutput):
        raise UnsafeOutputError(f"{path} is not a saved attribution output (out.save(path) writes one).")
    out.sequence_attributions = [sequence._recover_from_safetensors() for sequence in out.sequence_attributions]
    if out.step_attributions is not None:
        out.step_attributions = [step._recover_from_safetensors() for step in out.step_attributions]
    return out


def _decoded(entry: dict, allowed: dict, path):
    """One JSON object of a saved output: an allowed class's instance, a numeric array, or the object itself."""
    from inseq.utils.serialization import ndarray_hook

    if "__instance_type__" in entry:
        named = entry["__instance_type__"]
        key = tuple(named) if isinstance(named, list) and len(named) == 2 else None
        if key not in allowed:
            raise UnsafeOutputError(
                f"{path} names the class {named!r}, which is not an attribution output's: refused (a saved output "
                "holds Inseq's and inseq-mixing's output classes only)."
            )
        cls = allowed[key]
        instance = cls.__new__(cls)
        attributes = entry.get("attributes", {})
        if not isinstance(attributes, dict):
            raise UnsafeOutputError(f"{path}: the attributes of a {key[1]} are not a mapping.")
        if hasattr(instance, "__json_decode__"):
            instance.__json_decode__(**attributes)
        else:
            instance.__dict__ = dict(attributes)
        return instance
    if "__ndarray__" in entry:
        kind = np.dtype(str(entry.get("dtype"))).kind if _known_dtype(entry.get("dtype")) else None
        if kind is None or kind not in ARRAY_KINDS:
            raise UnsafeOutputError(f"{path} holds an array of {entry.get('dtype')!r}: only numbers are read.")
        return ndarray_hook(entry)
    return entry


def _known_dtype(name) -> bool:
    try:
        np.dtype(str(name))
    except TypeError:
        return False
    return True
