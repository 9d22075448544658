"""The README stays a newcomer's page, and every link of it and of docs/ leads somewhere.

The README says what the product is, how to try it (the two commands in its first screen), how to deploy
it and where to read more; the reference lives in docs/*.md, which it links. Links are checked as GitHub
renders them: a relative path must exist, and an anchor must name a heading of the page it points at.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.paths import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MAX_README_LINES = 300
FIRST_SCREEN = 40  # lines

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def links(page: Path) -> list[str]:
    """The targets of the Markdown links on ``page``, in order."""
    return _LINK.findall(_prose(page.read_text()))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors of ``page``'s headings (a repeated heading gets -1, -2, ... as on GitHub)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    names = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        names.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return frozenset(names)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def broken(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file or heading does not exist, with why."""
    problems = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{target}: {_shown(resolved)} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading of {_shown(resolved)} has the anchor #{anchor}")
    return problems


def test_the_readme_stays_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < MAX_README_LINES, (
        f"README.md has {len(lines)} lines; move reference text to a page under docs/ and link it"
    )


def test_the_first_screen_shows_how_to_try_it() -> None:
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN])
    # make test is also CI's command (.ci/run, cloudbuild.yaml's test step).
    for command in ("make demo", "make test"):
        assert re.search(rf"^{command}\b", first, re.M), f"{command!r} is not in the README's first screen"


def test_the_readme_shows_the_deploy_command() -> None:
    text = README.read_text()
    assert "gcloud builds submit --config cloudbuild.yaml" in text
    assert (REPO / "cloudbuild.yaml").is_file()


def test_every_docs_page_the_readme_links_exists() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in links(README)
        if target.startswith("docs/")
    }
    assert linked, "the README links no page under docs/"
    missing = sorted(str(p.relative_to(REPO)) for p in linked if not p.is_file())
    assert not missing, f"the README links docs pages that do not exist: {missing}"
    unlinked = sorted(str(p.relative_to(REPO)) for p in PAGES if p.resolve() not in linked)
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken(page), broken(page)


def test_code_that_points_at_docs_names_existing_pages_and_sections() -> None:
    # e.g. tpuprov doctor's 'docs/functions.md "Upgrades and running slices"', a comment's 'docs/settings.md'.
    reference = re.compile(r'docs/([\w-]+\.md)(?: \\?"([^"\\]+)\\?")?')
    found = 0
    for top in ("tpuprov", "shared", "sandbox", "functions", "infra"):
        for path in sorted((REPO / top).rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".tf", ".example", ".tftpl", ".txt"}:
                continue
            for page, section in reference.findall(path.read_text(errors="replace")):
                found += 1
                where = f"{path.relative_to(REPO)} names docs/{page}"
                assert (DOCS / page).is_file(), f"{where}, which does not exist"
                if section:
                    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", (DOCS / page).read_text(), re.M)
                    assert any(h.startswith(section) for h in headings), (
                        f'{where} "{section}": no such section'
                    )
    assert found, "no code points at docs/ (the doctor's release-channel check does)"


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: with (punctuation)\n")
    page.write_text(
        "# Page\n\n[ok](other.md#a-code-heading-with-punctuation) [here](#page) [web](https://example.com)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) `[not a link](missing.md)`\n"
        "```\n[in code](missing.md)\n```\n"
    )
    assert [p.split(":")[0] for p in broken(page)] == ["missing.md", "other.md#nowhere"]
