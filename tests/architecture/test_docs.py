"""A clone is self-contained: no text points outside the repository, the files and modules its
docs name exist, and the README's commands run as written on a copy of it with nothing beside it."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "__pycache__", ".hypothesis", ".pytest_cache", "build", "dist"}
TEXT_SUFFIXES = {".md", ".py", ".toml", ".yml", ".yaml", ".txt", ".sh", ".cfg", ".json"}
# The team's material beside a developer's checkout, which a user's clone does not have.
OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w-])shared/(?:traces|spec|gpu|ARCHITECTURE)|/work/")
REPO_PATH = re.compile(
    r"(?<![\w./-])((?:docs|numbakv|tests|benchmarks|dashboards|deploy|service)/[\w./*-]*[\w*])"
)
MARKDOWN_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
DOTTED_NAME = re.compile(r"(?<![\w./-])numbakv(?:\.[A-Za-z_]\w*)+")
# In a docstring of numbakv/, `.name` is a module of the docstring's own package.
RELATIVE_NAME = re.compile(r"`(\.[A-Za-z_]\w*)`")
# The packages that install under numbakv from a folder of their own (service/, dashboards/).
PACKAGE_DIRS = {
    package: ROOT / folder
    for package, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"].items()
}


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


def written_files(suffix: str) -> list[Path]:
    return [path for path in repository_files() if path.suffix == suffix]


def written_texts() -> list[tuple[str, str, str]]:
    """(where, text, package) for every Markdown file and every docstring in numbakv/; package is
    the one a docstring's `.module` names resolve in ("" for Markdown)."""
    texts = [(str(doc.relative_to(ROOT)), doc.read_text(), "") for doc in written_files(".md")]
    for source in sorted((ROOT / "numbakv").rglob("*.py")):
        module = ".".join(source.relative_to(ROOT).with_suffix("").parts)
        package = (
            module.removesuffix(".__init__")
            if source.stem == "__init__"
            else module.rpartition(".")[0]
        )
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node, clean=False)
                if docstring:
                    line = getattr(node, "lineno", 1)
                    texts.append((f"{source.relative_to(ROOT)}:{line}", docstring, package))
    return texts


def module_source(name: str) -> Path | None:
    """The file of module `name` in this checkout, where it is one of numbakv's."""
    folder, rest = ROOT, name
    for package, package_folder in PACKAGE_DIRS.items():
        if name == package or name.startswith(f"{package}."):
            folder, rest = package_folder, name[len(package) + 1 :]
    path = folder.joinpath(*rest.split(".")) if rest else folder
    for candidate in (path.parent / f"{path.name}.py", path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined_names(source: Path) -> set[str]:
    """The names a module defines or imports at its top level, and those its `__all__` offers."""
    names = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
                names.update(ast.literal_eval(node.value))
    return names


def resolves(name: str) -> bool:
    """`name` is a module of this checkout, or a name its longest module prefix defines (or a file's
    name, not a module's)."""
    parts = name.split(".")
    if f".{parts[-1]}" in TEXT_SUFFIXES:  # a file's name: the dashboards' numbakv.json
        return True
    for end in range(len(parts), 0, -1):
        source = module_source(".".join(parts[:end]))
        if source is not None:
            return end == len(parts) or parts[end] in defined_names(source)
    return False


def test_no_text_points_outside_the_repository():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in text_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found, "\n".join(found)


def test_links_in_the_docs_exist():
    """Markdown links in every Markdown file name files of the clone."""
    missing = []
    for doc in written_files(".md"):
        for target in MARKDOWN_LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # a URL
                continue
            resolved = (doc.parent / target).resolve()
            if ROOT not in resolved.parents or not resolved.exists():
                missing.append(f"{doc.relative_to(ROOT)}: link {target}")
    assert not missing, "\n".join(missing)


def test_paths_and_module_names_written_in_docs_and_docstrings_exist():
    """Paths such as `docs/X.md` or `tests/*/test_*.py` and module names such as
    `numbakv.tiers.disk` (or a name it defines), in every Markdown file and every docstring of
    numbakv/, name files and modules of the clone; so does a docstring's `.module` beside it."""
    missing = []
    for where, text, package in written_texts():
        # A link's target is relative to its file (test_links_in_the_docs_exist checks it).
        text = MARKDOWN_LINK.sub("]()", text)
        missing += [
            f"{where}: {path}" for path in REPO_PATH.findall(text) if not any(ROOT.glob(path))
        ]
        missing += [f"{where}: {name}" for name in DOTTED_NAME.findall(text) if not resolves(name)]
        if package:
            missing += [
                f"{where}: {name}"
                for name in RELATIVE_NAME.findall(text)
                if not resolves(package + name)
            ]
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


def test_the_datapath_example_runs_as_written(tmp_path):
    assert run_example("DATAPATH.md", tmp_path).strip() == (
        "[('load', 512), ('load', 1536), ('load', 2048), ('store', 2048)]"
    )


def test_the_offloader_example_runs_as_written(tmp_path):
    assert run_example("OFFLOADER.md", tmp_path).strip() == (
        "[('store', 3072), ('load', 2048), ('load', 3072)]"
    )


def test_the_tiers_example_runs_as_written(tmp_path):
    """docs/TIERS.md's example: a tier from a URL, a namespace, a store and a load."""
    assert run_example("TIERS.md", tmp_path).splitlines() == [
        "[True, True, False]",
        "[('store', True), ('load', True)]",
        "True",
    ]
