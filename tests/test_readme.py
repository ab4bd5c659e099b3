"""The README's Python snippets: none uses a name it does not define (each is self-contained), and the offline ones
(those that load nothing from a model hub) run as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
#: A snippet that names a hub model or a folder of the user's (``"org/name"``, ``from_pretrained``): not run here.
HUB = re.compile(r'from_pretrained\(|"[A-Za-z][\w.-]*/[\w.-]+"')


def test_no_readme_snippet_uses_a_name_it_does_not_define(tmp_path):
    assert len(BLOCKS) >= 5
    for number, block in enumerate(BLOCKS):
        (tmp_path / f"snippet_{number:02d}.py").write_text(block, encoding="utf-8")
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821",
                            "--output-format", "concise", str(tmp_path)], capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 0, found.stdout


OFFLINE = [block for block in BLOCKS if not HUB.search(block)]


@pytest.mark.parametrize("block", OFFLINE, ids=[f"snippet-{n}" for n in range(len(OFFLINE))])
def test_an_offline_readme_snippet_runs_as_written(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a snippet writes lands here
    exec(compile(block, "README snippet", "exec"), {"__name__": "readme_snippet"})  # noqa: S102
