"""Hits in seconds: the profile's reading, its interpolation, the per-request arithmetic against a
plain reference, the replay's and the fleet's per-request hits against their totals, and the
commands' reports and one-line errors."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from numbakv.tools.fleet.core import FleetConfig, fleet_grid
from numbakv.tools.replay.command import main
from numbakv.tools.replay.core import replay_grid
from numbakv.tools.ttft_profile import (
    DISK,
    HOST,
    SHARED,
    ProfileError,
    TTFTProfile,
    format_worth_table,
    worth,
)
from numbakv.tools.workloads.core import multi_turn_chat

ROWS = [
    {"path": "recompute", "prompt_tokens": 1024, "ttft_ms": 40.0},
    {"path": "recompute", "prompt_tokens": 16384, "ttft_ms": 700.0},
    {"path": "numbakv", "prefix_tokens": 896, "load_ms": 2.0, "forward_ms": 10.0, "ok": True},
    {"path": "numbakv", "prefix_tokens": 16256, "load_ms": 40.0, "forward_ms": 20.0, "ok": True},
    {"path": "disk", "prefix_tokens": 896, "load_ms": 20.0, "forward_ms": 10.0, "ok": True},
    {"path": "disk", "prefix_tokens": 16256, "load_ms": 400.0, "forward_ms": 20.0, "ok": True},
    {"path": "torch", "prefix_tokens": 16256, "load_ms": 50.0, "forward_ms": 20.0, "ok": True},
]


def _profile_file(tmp_path, rows=ROWS, **document):
    path = tmp_path / "ttft.json"
    path.write_text(
        json.dumps({"device": "H100", "model": "llama-3.1-8b", "rows": rows, **document})
    )
    return path


@pytest.fixture
def profile(tmp_path):
    return TTFTProfile.read(_profile_file(tmp_path))


def test_interpolation_passes_through_zero_and_every_point_and_extends_the_last_slope(profile):
    assert profile.prefill_ms(np.array([0, 512, 1024, 16384])).tolist() == [0, 20, 40, 700]
    slope = (700 - 40) / (16384 - 1024)
    assert profile.prefill_ms(np.array([32768]))[0] == pytest.approx(700 + 16384 * slope)
    assert profile.load_ms(HOST, np.array([16256]))[0] == 40.0
    assert profile.load_ms(SHARED, np.array([896]))[0] == profile.load_ms(DISK, np.array([896]))[0]
    assert profile.forward_floor_ms == 10.0


def _reference(profile, prompt, hits, block_tokens):
    """One request, plainly: (TTFT ms, GPU ms saved)."""
    p = prompt * block_tokens
    h = sum(hits.values()) * block_tokens
    prefill = lambda n: float(profile.prefill_ms(np.array([n]))[0])
    without = prefill(p)
    compute = without if h == 0 else min(without, max(without - prefill(h), 10.0))
    loads = sum(float(profile.load_ms(t, np.array([n * block_tokens]))[0]) for t, n in hits.items())
    return compute + loads, without - compute


@settings(max_examples=40, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(1, 80), st.integers(0, 80), st.integers(0, 80), st.integers(0, 80)),
        min_size=1,
        max_size=30,
    ),
    block_tokens=st.sampled_from([16, 512]),
)
def test_worth_matches_a_plain_reference_request_by_request(
    tmp_path_factory, requests, block_tokens
):
    profile = TTFTProfile.read(_profile_file(tmp_path_factory.mktemp("p")))
    prompts, hits = [], {HOST: [], DISK: [], SHARED: []}
    for prompt, host, disk, shared in requests:
        host = min(host, prompt)  # a leading run: never more hits than blocks
        disk = min(disk, prompt - host)
        shared = min(shared, prompt - host - disk)
        prompts.append(prompt)
        for tier, count in ((HOST, host), (DISK, disk), (SHARED, shared)):
            hits[tier].append(count)
    report = worth(
        profile, np.array(prompts), {t: np.array(v) for t, v in hits.items()}, block_tokens
    )
    expected = [
        _reference(profile, prompt, {t: hits[t][i] for t in hits}, block_tokens)
        for i, prompt in enumerate(prompts)
    ]
    ttft = np.array([e[0] for e in expected])
    assert report.requests == len(prompts)
    assert report.prefill_s_saved == pytest.approx(sum(e[1] for e in expected) / 1e3)
    assert report.ttft_ms["p50"] == pytest.approx(float(np.percentile(ttft, 50)))
    assert report.ttft_ms["p99"] == pytest.approx(float(np.percentile(ttft, 99)))
    assert sum(report.prefill_s_saved_by_tier.values()) == pytest.approx(report.prefill_s_saved)
    counted = sum(figures["requests"] for figures in report.ttft_ms_by_tier.values())
    assert counted == len(prompts)


def test_a_request_counts_under_the_lowest_tier_that_served_it(profile):
    report = worth(
        profile,
        np.array([10, 10, 10, 10]),
        {
            HOST: np.array([4, 4, 0, 0]),
            DISK: np.array([0, 3, 0, 0]),
            SHARED: np.array([0, 0, 0, 2]),
        },
    )
    assert {name: f["requests"] for name, f in report.ttft_ms_by_tier.items()} == {
        HOST: 1,
        DISK: 1,
        SHARED: 1,
        "miss": 1,
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected benchmarks/ttft.py's JSON"),
        (json.dumps({"rows": ROWS[:4]}), "no disk row"),
        (json.dumps({"rows": [*ROWS, ROWS[0]]}), "a second recompute row of 1024 tokens"),
        (json.dumps({"rows": [{**ROWS[0], "ttft_ms": -1}, *ROWS[1:]]}), "time must be > 0 ms"),
        (json.dumps({"rows": [{**ROWS[0], "ttft_ms": math.inf}, *ROWS[1:]]}), "must be finite"),
        (json.dumps({"rows": [{**ROWS[2], "ok": False}, *ROWS]}), "failed its check"),
        (json.dumps({"rows": [{**ROWS[2], "prefix_tokens": "9"}, *ROWS]}), "prefix_tokens must be"),
        (json.dumps({"rows": [{**ROWS[2], "forward_ms": None}, *ROWS]}), "forward_ms must be > 0"),
        (json.dumps({"rows": ROWS, "simulator": True}), "measured without a GPU"),
        (json.dumps({"rows": ROWS, "kv_bytes_per_token": 0}), "kv_bytes_per_token must be"),
    ],
)
def test_a_bad_profile_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ProfileError, match=message):
        TTFTProfile.read(path)
    with pytest.raises(SystemExit) as exit_:
        main(["--ttft-profile", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "numbakv-replay: error: argument --ttft-profile: got"
    )


def test_a_missing_profile_and_a_bad_block_size_are_one_line(tmp_path, capsys):
    for argv, message in (
        (["--ttft-profile", str(tmp_path / "none.json")], "cannot read it"),
        (["--block-tokens", "0"], "argument --block-tokens: got 0"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_profile_of_another_model_than_the_block_size_says_is_one_line(tmp_path, capsys):
    profile = str(_profile_file(tmp_path, kv_bytes_per_token=131072))
    argv = ["--ttft-profile", profile, "--block-tokens", "16", "--block-bytes", "1MiB"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert "131,072 bytes of KV a token, 2,097,152 a block of 16 tokens" in err[0]
    assert main([*argv[:4], "--block-bytes", "2MiB", "--capacity", "200"]) == 0


def test_a_profile_measured_faster_at_more_tokens_never_gives_a_negative_time(tmp_path):
    """Noise: the longer prompt measured faster. Its curve stays flat there, and every figure of
    a request stays >= 0 (before: TTFT p50 -49.5 ms, prefill saved of -0.2 s)."""
    rows = [
        {"path": "recompute", "prompt_tokens": 1024, "ttft_ms": 100.0},
        {"path": "recompute", "prompt_tokens": 2048, "ttft_ms": 90.0},
        {"path": "numbakv", "prefix_tokens": 512, "load_ms": 5.0, "forward_ms": 10.0},
        {"path": "numbakv", "prefix_tokens": 1536, "load_ms": 4.0, "forward_ms": 10.0},
        {"path": "disk", "prefix_tokens": 512, "load_ms": 9.0, "forward_ms": 10.0},
        {"path": "disk", "prefix_tokens": 1536, "load_ms": 8.0, "forward_ms": 10.0},
    ]
    profile = TTFTProfile.read(_profile_file(tmp_path, rows=rows))
    tokens = np.arange(0, 40_000, 16)
    for curve in (profile.prefill_ms(tokens), profile.load_ms(HOST, tokens)):
        assert (np.diff(curve) >= 0).all() and (curve >= 0).all()
    report = worth(profile, np.array([40, 2000, 2500]), {HOST: np.array([39, 1900, 0])}, 16)
    assert report.ttft_ms["p50"] > 0 and report.prefill_s_without_cache > 0
    assert 0 <= report.prefill_s_saved <= report.prefill_s_without_cache


def test_a_run_cut_short_is_marked_in_the_table(profile):
    whole = worth(profile, np.array([40, 80, 120]), {HOST: np.array([0, 40, 80])}, 16)
    cut = worth(profile, np.array([40]), {HOST: np.array([0])}, 16)
    table = format_worth_table(["lru at 100", "lru at 200"], [cut, whole], requests=3)
    lines = table.splitlines()
    assert lines[2].startswith("lru at 100* ") and lines[3].startswith("lru at 200 ")
    assert lines[-1] == "* partial: its first 1 of 3 requests"
    without = whole.prefill_s_without_cache
    assert f"without the cache: {without:,.1f} GPU s" in lines[0]  # the whole run's


CHAINS = [request.hash_ids for request in multi_turn_chat(sessions=60)]


def test_the_replays_hits_per_request_add_up_to_its_hits():
    request_hits = []
    results = replay_grid(CHAINS, ["lru", "belady"], [50, 400], request_hits=request_hits)
    assert [hits is None for hits in request_hits] == [False, False, True, True]
    for result, hits in zip(results[:2], request_hits):
        assert len(hits) == len(CHAINS) and sum(hits) == result.hits


def test_the_fleets_hits_per_request_add_up_to_its_tiers():
    config = FleetConfig(engines=2, host_capacity=40, disk_capacity=100, shared_capacity=200)
    request_hits = []
    (result,) = fleet_grid(CHAINS, [config], request_hits=request_hits)
    (hits,) = request_hits
    for tier, total in (
        ("host", result.host_hits),
        ("disk", result.disk_hits),
        ("shared_own", result.shared_own_hits),
        ("shared_other", result.shared_other_hits),
    ):
        assert sum(request.get(tier, 0) for request in hits) == total


def test_the_replay_reports_its_hits_in_seconds(tmp_path, capsys):
    profile = str(_profile_file(tmp_path))
    assert main(["--capacity", "200", "--ttft-profile", profile, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)["ttft"]
    assert report["requests"] == len(multi_turn_chat())
    assert 0 < report["prefill_s_saved"] < report["prefill_s_without_cache"]
    assert report["ttft_ms"]["p50"] <= report["ttft_ms_without_cache"]["p50"]
    assert "prefill saved" in captured.err and "TTFT            p50" in captured.err


def test_the_capacity_plan_and_the_fleet_speak_in_seconds(tmp_path, capsys):
    profile = str(_profile_file(tmp_path))
    trace = ["mooncake_conversation", "--requests", "400", "--ttft-profile", profile]
    assert main([*trace, "--capacity", "100,400", "--policy", "lru,belady"]) == 0
    out = capsys.readouterr().out
    assert "lru at 100" in out and "belady at 400" in out and "GPU s saved" in out
    assert main([*trace, "--engines", "2", "--capacity", "100", "--disk-capacity", "0,400"]) == 0
    out = capsys.readouterr().out
    assert "lru, demote, host 100, disk 400, shared none" in out
