"""The quick subset (``python -m pytest -q -m quick``, the README's test command) touches every family of every kind
and every method: checked on its collected test ids, in a fresh pytest process."""

import subprocess
import sys
from pathlib import Path

import inseq_mixing
from inseq_mixing.testing import ALL_FAMILIES, ENCODER_FAMILIES, SPEECH_FAMILIES, VISION_FAMILIES

ROOT = Path(__file__).resolve().parents[1]


def test_the_quick_subset_touches_every_family_and_method():
    collected = subprocess.run([sys.executable, "-m", "pytest", "-m", "quick", "--collect-only", "-q", "-p",
                                "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert 0 < len(ids) < 2000
    families = [*ALL_FAMILIES, *ENCODER_FAMILIES, *SPEECH_FAMILIES, *VISION_FAMILIES]
    missing = [family for family in families if not any(touches(line, family) for line in ids)]
    assert not missing, f"families the quick subset never touches: {missing}"
    untouched = [method for method in inseq_mixing.METHODS if not any(touches(line, method) for line in ids)]
    assert not untouched, f"methods the quick subset never runs: {untouched}"


def touches(test_id: str, name: str) -> bool:
    """Whether a test id's parameters include ``name`` as a whole parameter (``[gpt2-alti]``, not ``distilbert``
    for ``bert``)."""
    parameters = "-" + test_id.split("[", 1)[-1].rstrip("]") + "-"
    return f"-{name}-" in parameters
