"""A clone is self-contained: no text points outside the repository, and the README's commands
run as written on a copy of the repository with nothing beside it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "build", "dist"}
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".txt", ".sh", ".cfg", ".json"}
# The team's material beside a developer's checkout, which a user's clone does not have.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w-])shared/(?:traces|spec|gpu|ARCHITECTURE)|/work/")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:docs|numbakv|tests|benchmarks|dashboards|deploy|service)/[\w./*-]*[\w*])"
)
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def repository_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files, as a clone of this work would have them."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return sorted(
            ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()
        )
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: walk it
        return sorted(
            path
            for path in ROOT.rglob("*")
            if path.is_file()
            and not SKIP_DIRS & set(path.relative_to(ROOT).parts)
            and not any(part.endswith(".egg-info") for part in path.parts)
        )


def text_files() -> list[Path]:
    return [
        path
        for path in repository_files()
        if (path.suffix in TEXT_SUFFIXES or path.name == "Dockerfile")
        and path.name != Path(__file__).name
        and path.stat().st_size < 1_000_000
    ]


def test_no_text_points_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_paths_and_links_in_the_docs_exist():
    """Markdown links and paths such as `docs/X.md` or `tests/test_*.py` in README and docs name
    files of the clone."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for target in MARKDOWN_LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # a URL
                continue
            resolved = (doc.parent / target).resolve()
            if ROOT not in resolved.parents or not resolved.exists():
                missing.append(f"{doc.name}: link {target}")
        for path in REPO_PATH.findall(text):
            if not any(ROOT.glob(path)):
                missing.append(f"{doc.name}: {path}")
    assert not missing, "\n".join(missing)


def readme_commands() -> list[str]:
    """The README's code-block commands, continuation lines joined, install and tests left out."""
    commands, current = [], ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if not line.startswith("    "):
            current = ""
            continue
        current += line.strip()
        if current.endswith("\\"):
            current = current[:-1]
            continue
        if (
            current.startswith("python3 ")
            and "pip install" not in current
            and "pytest" not in current
        ):
            commands.append(current)
        current = ""
    return commands


# Flags that keep a documented command short here: the same code path on less work.
QUICKER = {
    "numbakv.demo": "--sessions 12",
    "numbakv.replay": "--requests 1500",
}


def quicker(command: str) -> str:
    head, pipe, tail = command.partition(" | ")
    module = shlex.split(head)[2]
    extra = QUICKER.get(module, "")
    if module == "numbakv.replay" and "--list-policies" in head:
        extra = ""
    return f"{head} {extra}".rstrip() + (f" {pipe.strip()} {tail}" if pipe else "")


def test_the_readme_documents_the_three_commands():
    text = (ROOT / "README.md").read_text()
    for command in (
        'python3 -m pip install -e ".[test]"',
        "python3 -m numbakv.demo",
        "python3 -m pytest -q",
    ):
        assert f"\n    {command}\n" in text, command
    assert any("mooncake_conversation" in command for command in readme_commands())


@pytest.mark.slow
def test_readme_commands_run_on_a_copy_with_nothing_beside_it(tmp_path):
    clone = tmp_path / "numbakv"
    for path in repository_files():
        target = clone / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    assert [entry.name for entry in tmp_path.iterdir()] == ["numbakv"]
    # Nothing of this checkout on the path; folders outside it stay (a GPU machine's carried wheels).
    outside = [
        entry
        for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not Path(entry).resolve().is_relative_to(ROOT)
    ]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(outside),
    }
    where = subprocess.run(
        [
            "python3",
            "-c",
            "import numbakv.tools.traces as t; print(t.SAMPLE_TRACES['mooncake_conversation'])",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(where.stdout.strip()).is_relative_to(clone)  # the copy's own package and sample
    commands = readme_commands()
    assert len(commands) >= 5
    for command in commands:
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", quicker(command)],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
    assert (clone / "hit_ratio.png").read_bytes()[:4] == b"\x89PNG"
    assert (clone / "mixed.jsonl").stat().st_size > 0


def run_example(doc: str, directory: Path) -> str:
    """What the one ```python block of docs/`doc` prints, run on a copy of nothing but itself in
    `directory`: what a newcomer pastes."""
    text = (ROOT / "docs" / doc).read_text()
    (example,) = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    script = directory / "example.py"
    script.write_text(example)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=directory, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_offloader_example_runs_as_written(tmp_path):
    assert run_example("OFFLOADER.md", tmp_path).strip() == "[('store', 3072), ('load', 2048)]"


def test_the_tiers_example_runs_as_written(tmp_path):
    """docs/TIERS.md's example: a tier from a URL, a namespace, a store and a load."""
    assert run_example("TIERS.md", tmp_path).splitlines() == [
        "[True, True, False]",
        "[('store', True), ('load', True)]",
        "True",
    ]
