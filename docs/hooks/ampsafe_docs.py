"""MkDocs hooks: the pages that are generated from the code, so they cannot go stale.

- ``bench/results/`` (tables, plots, JSON) is served under the same path in the site, read from the repository
  at build time instead of copied into ``docs/``;
- ``<!-- ampsafe:results-machines -->`` becomes a table of every ``bench/results`` JSON file with the machine and
  date it records;
- ``<!-- ampsafe:cli -->`` in a page becomes the command-line reference: ``ampsafe --help`` and each command's
  own ``--help``, read from the parsers of the commands in ``ampsafe.cli.COMMANDS``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[2]
RESULTS = "bench/results"
CLI_MARK = "<!-- ampsafe:cli -->"
MACHINES_MARK = "<!-- ampsafe:results-machines -->"


def on_files(files, config):
    """Serve every file of ``bench/results/`` at ``bench/results/...`` in the site."""
    for path in sorted((REPO / RESULTS).rglob("*")):
        if path.is_file():
            src_uri = path.relative_to(REPO).as_posix()
            files.append(File(src_uri, str(REPO), config["site_dir"], config["use_directory_urls"]))
    return files


def _help(argv: list[str]) -> str:
    """What ``ampsafe ARGV`` prints (stdout and stderr), at a fixed width and without colour, run from the
    repository root (``ampsafe bench`` reads the checkout's ``bench/``)."""
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", *argv], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    return (done.stdout + done.stderr).rstrip()


def cli_reference() -> str:
    """The reference: the top-level usage, then one section per command with its parser's help."""
    from ampsafe.cli import COMMANDS

    parts = ["```text", _help(["--help"]), "```", ""]
    for name, (_, summary) in COMMANDS.items():
        parts += [f"## `ampsafe {name}`", "", summary[:1].upper() + summary[1:] + ".", "", "```text"]
        parts += [_help([name, "--help"]), "```", ""]
    return "\n".join(parts)


def results_machines(page_depth: int) -> str:
    """One row per result file: the machine and date it records (``machine`` in its JSON), linked to its table."""
    up = "../" * page_depth
    rows = ["| result | CPU | cores | ISA | GPU | torch | paddle | date |", "|---|---|---|---|---|---|---|---|"]
    for path in sorted((REPO / RESULTS).rglob("*.json")):
        try:
            machine = json.loads(path.read_text(encoding="utf-8")).get("machine") or {}
        except (ValueError, AttributeError):
            machine = {}
        rel = path.relative_to(REPO).as_posix()
        table = path.with_suffix(".md")
        name = f"[{path.stem}]({up}{table.relative_to(REPO).as_posix()})" if table.is_file() else f"`{rel}`"
        cells = [machine.get(k) for k in ("cpu", "cores", "isa", "gpu", "torch", "paddle", "date")]
        cells[3] = cells[3] or "none"
        rows.append(
            "| " + " | ".join([name] + [str(c) if c not in (None, "") else "not recorded" for c in cells]) + " |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown, page, config, files):
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if MACHINES_MARK in markdown:
        markdown = markdown.replace(MACHINES_MARK, results_machines(page.file.src_uri.count("/")))
    return markdown
