"""Every ``python`` and ``bash`` block of README.md and docs/ is a test (the root ``conftest.py`` collects them with
sybil); these check that each block says how it runs, and that a broken block fails."""

from __future__ import annotations

import re

import pytest
from docs_helpers import REPO, examples_module

EXAMPLES = examples_module()
FENCE = re.compile(r"^```(\w*)", re.M)


def _fences():
    for path in EXAMPLES.documentation_files():
        text = path.read_text(encoding="utf-8")
        opening = True
        for match in FENCE.finditer(text):
            if opening:
                yield (
                    path,
                    match.group(1),
                    EXAMPLES.example_mark(text, match.start()),
                    text[: match.start()].count("\n") + 1,
                )
            opening = not opening


def test_every_python_and_bash_block_says_how_it_runs():
    unmarked = [
        f"{path.relative_to(REPO)}:{line}"
        for path, language, mark, line in _fences()
        if language in EXAMPLES.EXAMPLE_LANGUAGES and mark is None
    ]
    assert not unmarked, f"add <!-- example: run|slow|gpu|covered|skip --> before: {unmarked}"


def test_shell_blocks_are_bash_so_that_they_run():
    other = [f"{p.relative_to(REPO)}:{n}" for p, lang, _, n in _fences() if lang in {"sh", "shell", "console", "zsh"}]
    assert not other, other


def test_a_covered_block_names_a_test_file_that_exists():
    for path, _, mark, line in _fences():
        if mark is not None and mark["kind"] == "covered":
            assert (REPO / mark["arg"]).is_file(), f"{path.relative_to(REPO)}:{line} names {mark['arg']}"


@pytest.mark.parametrize(
    "block",
    ["```python\nassert 1 + 1 == 3\n```\n", "```bash\nampsafe no-such-command\n```\n"],
    ids=["python", "bash"],
)
def test_a_broken_example_fails(tmp_path, block):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\n<!-- example: run -->\n{block}", encoding="utf-8")
    document = EXAMPLES.SYBIL.parse(page)
    namespace = document.namespace
    EXAMPLES._setup(namespace)
    try:
        (example,) = list(document)
        with pytest.raises(Exception):  # noqa: B017 (sybil's failure, or the block's own AssertionError)
            example.evaluate()
    finally:
        EXAMPLES._teardown(namespace)


def test_every_relative_link_of_the_readme_resolves():
    """README.md is read on the repository's host and on the package index, outside the site: its links to docs/
    and bench/results/ must name files that exist (the site's own links are checked by ``mkdocs build --strict``)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets
    assert [t for t in targets if t and not (REPO / t).exists()] == []
