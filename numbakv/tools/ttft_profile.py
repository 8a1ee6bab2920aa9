"""What cache hits are worth in seconds: a measured TTFT profile, and the arithmetic that turns a
replay's hits into prefill GPU time saved and time to first token per request.

The profile is benchmarks/ttft.py's JSON: for some prompt lengths, the time of a forward pass over
the whole prompt (recompute), and of loading a prefix from host memory (numbakv) or the disk tier
(disk) before a forward pass over the rest. From it, by piecewise-linear interpolation in tokens
(through zero, and past the longest prompt along the last segment's slope):
- prefill(n): the GPU time of a forward pass over n tokens;
- load_tier(n): the time to bring n tokens of KV from a tier onto the GPU.
A request of P tokens whose leading h tokens hit (h_t of them from tier t) then takes
    TTFT = sum over tiers of load_t(h_t) + compute(P, h),
    compute(P, h) = prefill(P) - prefill(h), and no less than the profile's shortest forward pass
    over its new tokens (a forward pass costs at least the weights' read), or prefill(P) if h = 0,
and saves prefill(P) - compute(P, h) of GPU time, credited to its tiers in proportion to their
hit tokens. The tier shared by a fleet's engines is timed as the disk tier (the profile does not
measure it). Per request, a request counts under the lowest tier that served any of its hits.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from numbakv.tools.workloads.core import BLOCK_TOKENS

HOST, DISK, SHARED = "host", "disk", "shared"
TIERS = (HOST, DISK, SHARED)  # fastest first
MISS = "miss"
_PROFILE_PATHS = {"recompute": None, "numbakv": HOST, "disk": DISK}  # row path -> tier it times


class ProfileError(ValueError):
    """A profile that cannot be used; the message says why in one line."""


@dataclass(frozen=True)
class TTFTProfile:
    """Measured points (tokens, milliseconds): prefill, and each tier's load."""

    source: str
    device: str
    model: str
    prefill: tuple[tuple[int, float], ...]
    loads: Mapping[str, tuple[tuple[int, float], ...]]
    forward_floor_ms: float
    kv_bytes_per_token: int | None = None  # the model's, where the profile says

    @classmethod
    def read(cls, path: str | Path) -> TTFTProfile:
        """The profile in `path`; ProfileError saying what is wrong with it."""
        try:
            document = json.loads(Path(path).read_text())
        except OSError as error:
            raise ProfileError(f"cannot read it ({error.strerror or error})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ProfileError(f"not JSON ({error})") from None
        rows = document.get("rows") if isinstance(document, dict) else None
        if not isinstance(rows, list):
            raise ProfileError("expected benchmarks/ttft.py's JSON, an object with a 'rows' list")
        if document.get("simulator") is True:
            raise ProfileError(
                "measured without a GPU (the CPU and Numba's CUDA simulator), whose times are no "
                "GPU's: measure it on the GPU at hand"
            )
        kv_bytes_per_token = document.get("kv_bytes_per_token")
        if kv_bytes_per_token is not None and (
            isinstance(kv_bytes_per_token, bool)
            or not isinstance(kv_bytes_per_token, int)
            or kv_bytes_per_token < 1
        ):
            raise ProfileError(
                f"kv_bytes_per_token must be a whole number >= 1, got {kv_bytes_per_token!r}"
            )
        points: dict[str, dict[int, float]] = {name: {} for name in _PROFILE_PATHS}
        floors = []
        for number, row in enumerate(rows, start=1):
            name, tokens, ms, forward = _checked_row(number, row)
            if name is None:
                continue
            if tokens in points[name]:
                raise ProfileError(f"row {number}: a second {name} row of {tokens} tokens")
            points[name][tokens] = ms
            if forward is not None:
                floors.append(forward)
        for name, found in points.items():
            if not found:
                raise ProfileError(f"no {name} row: the profile needs recompute, numbakv and disk")
        return cls(
            source=str(path),
            device=str(document.get("device", "")),
            model=str(document.get("model", "")),
            prefill=tuple(sorted(points["recompute"].items())),
            loads={
                tier: tuple(sorted(points[name].items()))
                for name, tier in _PROFILE_PATHS.items()
                if tier
            },
            forward_floor_ms=min(floors),
            kv_bytes_per_token=kv_bytes_per_token,
        )

    def prefill_ms(self, tokens: np.ndarray) -> np.ndarray:
        return _piecewise(tokens, self.prefill)

    def load_ms(self, tier: str, tokens: np.ndarray) -> np.ndarray:
        """Milliseconds to load `tokens` from `tier` (the shared tier timed as the disk)."""
        return _piecewise(tokens, self.loads[DISK if tier == SHARED else tier])


def _checked_row(number: int, row: object) -> tuple[str | None, int, float, float | None]:
    """(path, tokens, milliseconds, forward ms) of a row the profile uses; (None, ...) for a row
    it does not (torch's way). Tokens are the prompt's for recompute, the prefix's for a load."""
    if not isinstance(row, dict) or not isinstance(row.get("path"), str):
        raise ProfileError(f"row {number}: expected an object with a 'path'")
    name = row["path"]
    if name not in _PROFILE_PATHS:
        return None, 0, 0.0, None
    if row.get("ok") is False:
        raise ProfileError(f"row {number}: its {name} load failed its check (wrong KV)")
    key = "prompt_tokens" if name == "recompute" else "prefix_tokens"
    tokens = row.get(key)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ProfileError(f"row {number}: {key} must be a whole number >= 1, got {tokens!r}")
    ms = row.get("ttft_ms" if name == "recompute" else "load_ms")
    forward = None if name == "recompute" else row.get("forward_ms")
    for field, value in (("time", ms), ("forward_ms", forward)):
        if field == "forward_ms" and name == "recompute":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ProfileError(f"row {number}: {name}'s {field} must be > 0 ms, got {value!r}")
        if not math.isfinite(value):
            raise ProfileError(f"row {number}: {name}'s {field} must be finite, got {value!r}")
    return name, tokens, float(ms), None if forward is None else float(forward)


def _piecewise(x: np.ndarray, points: Sequence[tuple[int, float]]) -> np.ndarray:
    """Linear through (0, 0) and `points`, past the last point along the last segment; never
    decreasing: a point measured faster than a shorter one (noise) counts as the shorter's time,
    so no longer prompt is faster and no time negative."""
    xs = np.array([0.0] + [p[0] for p in points])
    ys = np.maximum.accumulate(np.array([0.0] + [p[1] for p in points]))
    x = np.asarray(x, dtype=np.float64)
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + (x - xs[-1]) * slope)


@dataclass(frozen=True)
class TTFTReport:
    """What one run's hits are worth."""

    requests: int
    prefill_s_without_cache: float
    prefill_s_saved: float
    prefill_s_saved_by_tier: dict[str, float]
    load_s_by_tier: dict[str, float]
    ttft_ms: dict[str, float]  # p50, p99 over every request, with the run's hits
    ttft_ms_without_cache: dict[str, float]
    ttft_ms_by_tier: dict[
        str, dict[str, float]
    ]  # lowest serving tier (or miss) -> requests, p50, p99


def worth(
    profile: TTFTProfile,
    prompt_blocks: np.ndarray,
    hits: Mapping[str, np.ndarray],
    block_tokens: int = BLOCK_TOKENS,
) -> TTFTReport:
    """The report for requests of `prompt_blocks` blocks each, the leading `hits[tier]` of them
    found in each tier (arrays, one entry a request)."""
    prompt = np.asarray(prompt_blocks, dtype=np.float64) * block_tokens
    tiers = [tier for tier in TIERS if tier in hits]
    hit = {tier: np.asarray(hits[tier], dtype=np.float64) * block_tokens for tier in tiers}
    total_hit = sum(hit.values(), np.zeros_like(prompt))
    without = profile.prefill_ms(prompt)
    extension = np.maximum(without - profile.prefill_ms(total_hit), profile.forward_floor_ms)
    compute = np.where(total_hit > 0, np.minimum(extension, without), without)
    loads = {tier: profile.load_ms(tier, hit[tier]) for tier in tiers}
    ttft = compute + sum(loads.values(), np.zeros_like(prompt))
    saved = without - compute
    share = np.divide(1.0, total_hit, out=np.zeros_like(prompt), where=total_hit > 0)
    lowest = np.full(len(prompt), MISS, dtype=object)
    for tier in tiers:  # fastest first: a lower tier overrides
        lowest[hit[tier] > 0] = tier
    by_tier = {}
    for name in (*tiers, MISS):
        chosen = ttft[lowest == name]
        if len(chosen):
            by_tier[name] = {"requests": len(chosen), **_percentiles(chosen)}
    return TTFTReport(
        requests=len(prompt),
        prefill_s_without_cache=float(without.sum()) / 1e3,
        prefill_s_saved=float(saved.sum()) / 1e3,
        prefill_s_saved_by_tier={
            tier: float((saved * hit[tier] * share).sum()) / 1e3 for tier in tiers
        },
        load_s_by_tier={tier: float(loads[tier].sum()) / 1e3 for tier in tiers},
        ttft_ms=_percentiles(ttft),
        ttft_ms_without_cache=_percentiles(without),
        ttft_ms_by_tier=by_tier,
    )


def _percentiles(values: np.ndarray) -> dict[str, float]:
    p50, p99 = np.percentile(values, [50, 99]) if len(values) else (math.nan, math.nan)
    return {"p50": float(p50), "p99": float(p99)}


# --- the commands' side: options, reading, the report -----------------------------------------


def add_ttft_arguments(parser: argparse.ArgumentParser) -> None:
    """--ttft-profile and --block-tokens, for the replay and the fleet replay."""
    parser.add_argument(
        "--ttft-profile",
        metavar="FILE",
        help="benchmarks/ttft.py's JSON: report the hits as prefill GPU time saved and time to "
        "first token per request, p50 and p99, per tier (default: hit ratios only)",
    )
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=BLOCK_TOKENS,
        metavar="N",
        help="tokens of one of the trace's blocks, with --ttft-profile (default: %(default)s, "
        "the Mooncake traces')",
    )


def read_profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TTFTProfile | None:
    """The profile --ttft-profile names, or None; a bad one or a bad --block-tokens exits with
    one line (the parser's `error`, status 2)."""
    if args.block_tokens < 1:
        parser.error(
            f"argument --block-tokens: got {args.block_tokens}, expected a whole number >= 1"
        )
    if args.ttft_profile is None:
        return None
    try:
        profile = TTFTProfile.read(args.ttft_profile)
    except ProfileError as error:
        parser.error(f"argument --ttft-profile: got {args.ttft_profile!r}: {error}")
    per_token, block_bytes = profile.kv_bytes_per_token, args.block_bytes
    if per_token and block_bytes and per_token * args.block_tokens != block_bytes:
        parser.error(
            f"argument --ttft-profile: got {args.ttft_profile!r}: its model holds {per_token:,} "
            f"bytes of KV a token, {per_token * args.block_tokens:,} a block of "
            f"{args.block_tokens} tokens, but --block-bytes is {block_bytes:,}: a profile of "
            "another model (or give --block-tokens)"
        )
    return profile


def describe_profile(profile: TTFTProfile, block_tokens: int) -> str:
    """One line: where the times come from."""
    longest = profile.prefill[-1][0]
    return (
        f"{profile.source} ({profile.model} on {profile.device}, prompts up to {longest:,} "
        f"tokens; {block_tokens} tokens a block)"
    )


_FLEET_TIERS = {"host": HOST, "disk": DISK, "shared_own": SHARED, "shared_other": SHARED}


def runs_worth(
    profile: TTFTProfile,
    chains: Sequence[Sequence[int]],
    request_hits: Sequence[Sequence[int] | Sequence[Mapping[str, int]] | None],
    block_tokens: int,
) -> list[TTFTReport | None]:
    """Each run's report from its hits per request: a count (the one-engine replay, all from host
    memory) or a mapping of the fleet's tiers to counts; None stays None (no per-request hits)."""
    prompt_blocks = np.fromiter(map(len, chains), dtype=np.int64, count=len(chains))
    reports: list[TTFTReport | None] = []
    for hits in request_hits:
        if hits is None:
            reports.append(None)
            continue
        served = len(hits)  # an interrupted run replayed the first `served` requests
        by_tier: dict[str, np.ndarray] = {}
        if served and isinstance(hits[0], Mapping):
            for name, tier in _FLEET_TIERS.items():
                counts = np.array([request.get(name, 0) for request in hits], dtype=np.int64)
                by_tier[tier] = by_tier.get(tier, 0) + counts
        else:
            by_tier[HOST] = np.asarray(hits, dtype=np.int64)
        reports.append(worth(profile, prompt_blocks[:served], by_tier, block_tokens))
    return reports


def print_worth(
    profile: TTFTProfile,
    block_tokens: int,
    labels: Sequence[str],
    reports: Sequence[TTFTReport | None],
    requests: int,
    out: TextIO,
) -> None:
    """The report of one run (its lines) or several (a table), after the profile's line."""
    print(f"TTFT profile    {describe_profile(profile, block_tokens)}", file=out)
    if len(reports) == 1 and reports[0] is not None:
        for line in format_worth(reports[0]):
            print(line, file=out)
    else:
        print(format_worth_table(labels, reports, requests), file=out)


def format_worth(report: TTFTReport) -> list[str]:
    """The lines a single run's report adds."""
    saved = report.prefill_s_saved
    of = report.prefill_s_without_cache
    by_tier = ", ".join(
        f"{tier} {seconds:,.1f} s" for tier, seconds in report.prefill_s_saved_by_tier.items()
    )
    loads = ", ".join(f"{tier} {seconds:,.1f} s" for tier, seconds in report.load_s_by_tier.items())
    ttft, without_cache = report.ttft_ms, report.ttft_ms_without_cache
    lines = [
        f"prefill saved   {saved:,.1f} GPU s of {of:,.1f} ({_share(saved, of)}; {by_tier})",
        f"loads took      {loads}",
        (
            f"TTFT            p50 {ttft['p50']:,.1f} ms, p99 {ttft['p99']:,.1f} ms (without the "
            f"cache: p50 {without_cache['p50']:,.1f}, p99 {without_cache['p99']:,.1f})"
        ),
    ]
    for name, figures in report.ttft_ms_by_tier.items():
        lines.append(
            f"  {'served by ' + name if name != MISS else 'missed':<32}{figures['requests']:>12,}"
            f"  p50 {figures['p50']:,.1f} ms, p99 {figures['p99']:,.1f} ms"
        )
    return lines


def format_worth_table(
    labels: Sequence[str], reports: Sequence[TTFTReport | None], requests: int
) -> str:
    """One row per run: the prefill GPU time saved and TTFT at p50 and p99; a dash for a run with
    no report (Belady's MIN keeps no per-request hits); `*` and a note for a run cut short before
    the trace's `requests`, whose figures are its first requests'."""
    header = ["run", "GPU s saved", "saved", "TTFT p50 ms", "TTFT p99 ms"]
    rows = []
    for label, report in zip(labels, reports):
        if report is None:
            rows.append([label, "-", "-", "-", "-"])
            continue
        rows.append(
            [
                label + ("*" if report.requests < requests else ""),
                f"{report.prefill_s_saved:,.1f}",
                _share(report.prefill_s_saved, report.prefill_s_without_cache),
                f"{report.ttft_ms['p50']:,.1f}",
                f"{report.ttft_ms['p99']:,.1f}",
            ]
        )
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    reported = [report for report in reports if report is not None]
    partial = [report for report in reported if report.requests < requests]
    whole = [report for report in reported if report.requests == requests]
    first = next(iter(whole or partial), None)  # the header's figures: a whole run's
    lines = ["prefill GPU time saved and time to first token by run"]
    if first is not None:
        lines[0] += (
            f" (without the cache: {first.prefill_s_without_cache:,.1f} GPU s, TTFT p50 "
            f"{first.ttft_ms_without_cache['p50']:,.1f} ms, p99 "
            f"{first.ttft_ms_without_cache['p99']:,.1f} ms)"
        )
    for cells in (header, *rows):
        lines.append(
            cells[0].ljust(widths[0] + 2)
            + "".join(cell.rjust(width + 2) for cell, width in zip(cells[1:], widths[1:]))
        )
    for report in partial:
        lines.append(f"* partial: its first {report.requests:,} of {requests:,} requests")
    return "\n".join(lines)


def report_worth(
    profile: TTFTProfile | None,
    chains: Sequence[Sequence[int]],
    request_hits: Sequence,
    block_tokens: int,
    labels: Sequence[str],
    out: TextIO,
) -> list[TTFTReport | None] | None:
    """What the runs' hits are worth under `profile`, printed after their report and returned
    for the JSON (None without a profile): what the replay's and the fleet's commands add."""
    if profile is None:
        return None
    worth = runs_worth(profile, chains, request_hits[: len(labels)], block_tokens)
    print_worth(profile, block_tokens, labels, worth, len(chains), out)
    return worth


def with_worth(runs: list[dict], worth: list[TTFTReport | None] | None) -> list[dict]:
    """The runs' JSON documents, each with what its hits are worth (`ttft`) when a profile was
    given (`worth` is not None)."""
    if worth is None:
        return runs
    return [
        {**run, "ttft": None if report is None else asdict(report)}
        for run, report in zip(runs, worth)
    ]


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"
