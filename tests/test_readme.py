"""The Python snippets of the README and of the guide's pages (``docs/``, the design notes aside): none uses a name it
does not define (each is self-contained), and the offline ones (those that load nothing from a model hub) run as
written. A snippet found on several pages runs once."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "DESIGN.md")]
SNIPPETS = {}  # block → the first page it is on
for page in PAGES:
    for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        SNIPPETS.setdefault(block, page.relative_to(ROOT).as_posix())
#: A snippet that names a hub model or a folder of the user's (``"org/name"``, ``from_pretrained``): not run here.
HUB = re.compile(r'from_pretrained\(|"[A-Za-z][\w.-]*/[\w.-]+"')


def test_no_snippet_uses_a_name_it_does_not_define(tmp_path):
    assert len(SNIPPETS) >= 10 and {"README.md", "docs/index.md"} <= set(SNIPPETS.values())
    for number, block in enumerate(SNIPPETS):
        (tmp_path / f"snippet_{number:02d}.py").write_text(block, encoding="utf-8")
    found = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--select", "F821",
                            "--output-format", "concise", str(tmp_path)], capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 0, found.stdout


OFFLINE = [(block, page) for block, page in SNIPPETS.items() if not HUB.search(block)]


@pytest.mark.parametrize(("block", "page"), OFFLINE, ids=[f"{page}-{n}" for n, (_, page) in enumerate(OFFLINE)])
def test_an_offline_snippet_runs_as_written(block, page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a snippet writes lands here
    exec(compile(block, f"snippet of {page}", "exec"), {"__name__": "guide_snippet"})  # noqa: S102
