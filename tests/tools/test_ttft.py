"""benchmarks/ttft.py on the tiny model, on the CPU and the CUDA simulator: every row is there,
every loaded prefix is the recompute's KV byte for byte, and a wrong load is caught (skipped where
torch or transformers is absent; the vLLM environments have both)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ttft.py"
TINY = ["--model", "tiny", "--prompt-tokens", "256", "--repeats", "1"]


@pytest.fixture(scope="module")
def ttft():
    spec = importlib.util.spec_from_file_location("ttft", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report(ttft, tmp_path_factory):
    out = tmp_path_factory.mktemp("ttft") / "ttft.json"
    assert ttft.main([*TINY, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_row_is_there_with_its_time(report):
    paths = ["recompute", "numbakv", "layerwise", "disk", "torch"]
    assert [row["path"] for row in report["rows"]] == paths
    for row in report["rows"]:
        assert row["ttft_ms"] > 0 and row["prompt_tokens"] == 256
        assert row["prefix_tokens"] + row["new_tokens"] == 256
    word = {"float32": 4, "bfloat16": 2}[report["dtype"]]  # fp32 on the CPU, bf16 on a GPU
    assert report["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * word  # layers x K, V x heads x head


def test_each_load_brings_back_the_recomputes_kv_and_first_token(report):
    for row in report["rows"][1:]:
        assert row["kv_exact"] and row["logits_exact"] and row["first_token_matches"], row
        assert row["load_bytes"] == 128 * report["kv_bytes_per_token"]
        assert row["load_ms"] + row["forward_ms"] == pytest.approx(row["ttft_ms"])


def test_a_load_that_brings_nothing_back_fails_the_run(ttft, tmp_path, monkeypatch, capsys):
    """numbakv's load skipped: the paged cache stays wiped, and the checks must say so."""
    load = ttft.PagedPrefix.load
    monkeypatch.setattr(
        ttft.PagedPrefix,
        "load",
        lambda self, path, blocks: None if path == "numbakv" else load(self, path, blocks),
    )
    out = tmp_path / "ttft.json"
    assert ttft.main([*TINY, "--out", str(out)]) == 1
    rows = {row["path"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["numbakv"]["ok"] is False and not rows["numbakv"]["kv_exact"]
    assert rows["layerwise"]["ok"] and rows["disk"]["ok"] and rows["torch"]["ok"]
    assert "WRONG: numbakv at 256 tokens" in capsys.readouterr().err


def test_a_layerwise_load_that_skips_its_last_group_fails_the_run(ttft, tmp_path, monkeypatch):
    """The tiny model's two layers are two groups: the second left unloaded must be caught."""
    by_layers = ttft.PagedPrefix._load_by_layers

    def all_but_the_last_group(self, blocks):
        groups, self.layer_groups = self.layer_groups, self.layer_groups[:-1]
        try:
            return by_layers(self, blocks)
        finally:
            self.layer_groups = groups

    monkeypatch.setattr(ttft.PagedPrefix, "_load_by_layers", all_but_the_last_group)
    out = tmp_path / "ttft.json"
    assert ttft.main([*TINY, "--out", str(out)]) == 1
    rows = {row["path"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["layerwise"]["ok"] is False and rows["numbakv"]["ok"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--new-tokens", "100"], "argument --new-tokens: got 100, expected a positive multiple"),
        (["--prompt-tokens", "128"], "argument --prompt-tokens: got 128, expected multiples of 16"),
        (["--prompt-tokens", "1k"], "argument --prompt-tokens: got '1k', expected whole numbers"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(ttft, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        ttft.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_report_is_a_profile_the_replay_reads(report, tmp_path):
    """Measured on a GPU; one measured without (here, on the CPU) is refused, saying so."""
    from numbakv.tools.ttft_profile import ProfileError, TTFTProfile

    path = tmp_path / "ttft.json"
    path.write_text(json.dumps({**report, "simulator": False}))
    profile = TTFTProfile.read(path)
    assert profile.prefill[0][0] == 256 and set(profile.loads) == {"host", "disk"}
    assert profile.kv_bytes_per_token == report["kv_bytes_per_token"]
    if report["simulator"]:
        path.write_text(json.dumps(report))
        with pytest.raises(ProfileError, match="measured without a GPU"):
            TTFTProfile.read(path)


def test_graph_forward_passes_without_a_gpu_are_one_line_and_exit_2(ttft, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ttft.main([*TINY, "--forward", "graph", "--out", "unused.json"]) == 2
    assert capsys.readouterr().err == (
        "ttft.py: error: argument --forward: graph needs a GPU; this has none\n"
    )


def test_the_report_says_how_its_forward_passes_ran(report):
    assert report["forward"] == ("cuda graph" if report["device"] != "cpu" else "eager")


@pytest.mark.parametrize("prefix_tokens", [40, 64 * 3 + 17])
def test_attention_over_a_split_prefix_equals_one_causal_pass_over_all_keys(
    ttft, monkeypatch, prefix_tokens
):
    """The prefix read in splits (none, or three and a rest) and merged by log-sum-exp: the same
    as attention over the prefix and the new keys at once, the mask aligned to the last key."""
    import torch

    monkeypatch.setattr(ttft, "SPLIT_TOKENS", 64)
    generator = torch.Generator().manual_seed(prefix_tokens)
    new, keys = 32, prefix_tokens + 32
    query = torch.randn(1, 8, new, 16, generator=generator)
    key, value = (torch.randn(1, 2, keys, 16, generator=generator) for _ in range(2))
    merged = ttft.PrefixAttention._over_prefix(
        query, key[:, :, prefix_tokens:], value[:, :, prefix_tokens:],
        key[:, :, :prefix_tokens], value[:, :, :prefix_tokens], None,
    )  # fmt: skip
    visible = torch.ones(new, keys, dtype=torch.bool).tril(prefix_tokens)
    whole = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=visible, enable_gqa=True
    )
    torch.testing.assert_close(merged, whole, rtol=1e-5, atol=1e-5)
