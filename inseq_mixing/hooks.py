"""What a higher layer lends a lower one, looked up by name: the evaluation's result writes its HTML report with the
views' writer (``Evaluation.report``), a vision output draws its overlays with the views' (``out.show()``); the
writers are installed here by :func:`inseq_mixing.register`, and neither layer imports the views above it."""

from collections.abc import Callable

#: Writers of pages and figures by what they write: ``"evaluation"`` (``writer(evaluation, path, **kwargs) -> Path``),
#: ``"image_report"`` (``writer(output, images, path) -> HTML``), ``"image_overlays"`` (``writer(output, images,
#: folder) -> PNG paths``).
WRITERS: dict[str, Callable] = {}
