"""What a higher layer lends a lower one, looked up by name: the evaluation's result writes its HTML report with the
views' writer (``Evaluation.report``), which :func:`inseq_mixing.register` installs here; the evaluation never
imports the views above it."""

from collections.abc import Callable

#: Writers of HTML pages by what they write (``"evaluation"``: ``writer(evaluation, path, **kwargs) -> Path``).
WRITERS: dict[str, Callable] = {}
