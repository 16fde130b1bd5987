"""The README is a manual that cannot drift: its environment table is _env's, its links resolve inside the
repository, it stays short. CPU only."""
from __future__ import annotations

import re
from pathlib import Path

from blackwell_sparsek import _env

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "bench" / "results" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_readme_environment_table_is_the_one_env_reads():
    assert _env.markdown_table() in (REPO / "README.md").read_text()


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_every_link_resolves_inside_the_repository():
    bad = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path = (doc.parent / target).resolve()
            if not path.exists() or REPO not in path.parents and path != REPO:
                bad.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not bad, bad
