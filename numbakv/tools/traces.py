"""Mooncake-format request traces: one JSON object per line with the prompt's chain of block ids.

numbakv ships one real trace as sample data (numbakv/data/, see the README there); commands that
take a trace accept its name, `mooncake_conversation`, wherever they accept a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from numbakv.tools.progress import Progress

SAMPLE_TRACES: dict[str, Path] = {
    path.stem: path for path in sorted((Path(__file__).parents[1] / "data").glob("*.jsonl"))
}


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and, for a bad line, its number."""


@dataclass(frozen=True)
class TraceRequest:
    """One request: arrival (ms), token counts, and its prompt as a chain of block ids."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


def trace_path(name: str | Path) -> Path:
    """The file `name` names: a path, or failing that the name of a shipped sample trace."""
    path = Path(name)
    if not path.exists() and str(name) in SAMPLE_TRACES:
        return SAMPLE_TRACES[str(name)]
    return path


def check_trace(name: str | Path) -> Path:
    """`trace_path(name)`, or a TraceError saying why it cannot be read, without reading it."""
    path = trace_path(name)
    samples = ", ".join(SAMPLE_TRACES)
    if not path.exists():
        raise TraceError(f"got {str(name)!r}: no such file (nor a shipped sample: {samples})")
    if not path.is_file():
        raise TraceError(f"got {str(name)!r}: not a file")
    if not os.access(path, os.R_OK):
        raise TraceError(f"got {str(name)!r}: not readable")
    return path


def read_hash_chains(path: str | Path, progress: bool = False) -> list[list[int]]:
    """Each request's `hash_ids`, in file order; everything else in a line is left unchecked.

    `path` may name a shipped sample. With `progress`, reports the bytes read on stderr.
    """
    path = trace_path(path)
    chains = []
    try:
        size = path.stat().st_size
        with (
            open(path, "rb") as lines,
            Progress(f"reading {path.name}", size, "B", unit_scale=True, enabled=progress) as meter,
        ):
            for number, line in enumerate(lines, start=1):
                meter.update(len(line))
                if line.strip():
                    chains.append(_parse_chain(line, f"{path}:{number}"))
    except OSError as error:
        raise TraceError(f"{path}: cannot read trace: {error.strerror or error}") from None
    if not chains:
        raise TraceError(f"{path}: trace has no requests")
    return chains


def _parse_chain(line: bytes, where: str) -> list[int]:
    try:
        request = json.loads(line)
    except UnicodeDecodeError:
        raise TraceError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(request, dict) or "hash_ids" not in request:
        raise TraceError(f"{where}: expected a JSON object with a 'hash_ids' list")
    chain = request["hash_ids"]
    if not isinstance(chain, list) or not all(
        isinstance(block, int) and not isinstance(block, bool) for block in chain
    ):
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    return chain


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> None:
    """Write requests as a Mooncake-format jsonl file: all of it or, if interrupted, nothing (it
    is written under a temporary name, then renamed). A symbolic link is written through: the
    file it names is replaced, not the link."""
    path = Path(path).resolve()
    temporary = path.with_name(f".{path.name}.partial")
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(asdict(request)) + "\n" for request in requests)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
