"""The documentation: the MkDocs site builds strictly (no broken link or anchor, every page
in the navigation), the README stays a short entry point, and the architecture page names
modules that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PACKAGE = ROOT / "dropbox_eval"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    built = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("index.html", "client/file-protocol/index.html", "reference/cli/index.html"):
        assert page in built, page
    # the schemas page includes the shipped files themselves
    schemas = (site / "reference" / "schemas" / "index.html").read_text(encoding="utf-8")
    for name in ("batch", "receipt", "error", "report"):
        assert f"urn:dropbox-eval:schema:{name}" in schemas, name
    # nothing is fetched from another host when a page is read (fonts, scripts, styles)
    home = (site / "index.html").read_text(encoding="utf-8")
    assert not re.findall(r'<(?:link|script)[^>]+(?:href|src)="https?://', home)


def test_the_readme_quick_start_comes_first_with_exactly_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections[0] == "Quick start"
    quick = text[text.index("## Quick start") :]
    block = re.search(r"```sh\n(.*?)```", quick, re.DOTALL)
    assert block is not None
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert commands == [
        "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/dropbox-eval demo",
        "python3 -m venv .venv && .venv/bin/pip install '.[test]' && .venv/bin/python -m pytest",
    ]


def test_the_readme_is_short_and_maps_every_guide() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    for page in sorted((ROOT / "docs").rglob("*.md")):
        name = page.relative_to(ROOT).as_posix()
        if page.name != "index.md":
            assert f"]({name})" in text, f"the README's map misses {name}"


def _source(name: str) -> Path:
    """Where a file the docs name lives: the repository's own folders, else the package."""
    top = name.split("/")[0]
    return ROOT / name if top in ("tests", "bench", "examples", "deploy") else PACKAGE / name


def test_the_pages_name_source_files_that_exist() -> None:
    named: set[str] = set()
    for page in (ROOT / "docs").rglob("*.md"):
        named |= set(re.findall(r"`([a-z_]+(?:/[a-z_]+)+\.py)`", page.read_text(encoding="utf-8")))
    assert len(named) > 40
    assert not sorted(n for n in named if not _source(n).is_file())


def test_the_architecture_page_names_modules_that_exist() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`", text))
    assert len(named) > 40
    assert not sorted(n for n in named if not _source(n).is_file())
    # and every package the import picture draws
    picture = text[text.index("## The import picture") : text.index("## The data path")]
    drawn = set(re.findall(r"(?<![\w/])([a-z]+)/(?=\s)", picture))
    assert {"forge", "intake", "results", "store"} <= drawn
    assert not sorted(n for n in drawn if not (ROOT / "dropbox_eval" / n).is_dir())
