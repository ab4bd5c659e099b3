"""The output of this package's own front ends: Inseq's ``FeatureAttributionOutput``, whose ``show()`` names its
columns.

Inseq captions every heatmap "Generated tokens" and "Attributed tokens". The encoder, speech and vision front ends'
columns are the explained entries instead (a masked word, a label, a transcript token, an image's label or text, a
bare encoder's rows), which the output's ``info["explained"]`` says; :class:`ExplainedOutput` writes that in the
caption. Everything else is Inseq's: ``aggregate()``, ``weight_attributions()``, ``save()`` (which writes a plain
``inseq.FeatureAttributionOutput``, so that ``FeatureAttributionOutput.load()`` reads it; a loaded output shows
Inseq's caption).
"""

import html

import inseq

#: Inseq's caption of a heatmap, which its ``show()`` writes under every title.
INSEQ_CAPTION = "→ : Generated tokens, ↓ : Attributed tokens"


class ExplainedOutput(inseq.FeatureAttributionOutput):
    """``inseq.FeatureAttributionOutput`` of a front end of this package (see the module docstring)."""

    def caption(self) -> str:
        """What the heatmaps' columns and rows are."""
        explained = (self.info or {}).get("explained", "the explained entries")
        return f"→ : explained, {explained}; ↓ : input units"

    def show(self, *args, display: bool = True, return_html: bool | None = False, **kwargs):
        """Inseq's ``show()`` with the columns named: in a notebook and in the returned HTML the caption is replaced;
        a terminal's tables keep Inseq's, under a line that names them."""
        from inseq.utils import isnotebook

        notebook = isnotebook()
        if display and not notebook:
            print(f"(The heatmaps below: {self.caption()}; Inseq's own caption says 'Generated tokens'.)")
        page = super().show(*args, display=display and not notebook, return_html=True, **kwargs)
        page = None if page is None else page.replace(INSEQ_CAPTION, html.escape(self.caption()))
        if display and notebook:
            from IPython.display import HTML
            from IPython.display import display as show_html

            show_html(HTML(page))
        return page if return_html else None

    def save(self, *args, **kwargs):
        """Inseq's ``save()``, as a plain ``inseq.FeatureAttributionOutput`` (what ``load()`` reads)."""
        plain = inseq.FeatureAttributionOutput(sequence_attributions=self.sequence_attributions,
                                               step_attributions=self.step_attributions, info=self.info)  # fmt: skip
        return plain.save(*args, **kwargs)
