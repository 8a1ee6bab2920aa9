"""Time to first token of a returning prompt, on a real model's forward pass: recompute it, or load
its prefix's KV (from host memory or the disk tier through numbakv, or torch's own way) and compute
only its new tokens.

    python3 benchmarks/ttft.py --out results/ttft.json            # on a GPU: Llama-3.1-8B's shapes
    python3 benchmarks/ttft.py --model tiny --prompt-tokens 256 --out results/ttft.json  # anywhere

The model is transformers' LlamaForCausalLM built from a config, random weights: with
`llama-3.1-8b`, 32 layers, 32 heads, 8 KV heads of 128, bf16 (128 KiB of KV a token). For each
prompt length, the last `--new-tokens` tokens are new and the prefix before them was seen before.
Rows, each a median of `--repeats` runs after a warm-up, interleaved:
- recompute: one forward pass over the whole prompt;
- numbakv: load the prefix's blocks from host memory through numbakv's data path into a paged KV
  cache in vLLM's layout (flash-attention, blocks of 16 tokens, every layer), then one forward
  pass over the new tokens with a KV cache of the prefix's length;
- disk: the same, the blocks first read from numbakv's disk tier into host memory;
- torch: the same, loaded torch's way: one pinned copy to the GPU, then an index_copy per layer.
Only the last token's logits are computed. A load is queued on the GPU as an engine queues it: the
forward pass's kernels wait for it on the GPU, not on the CPU. Attention is torch's scaled dot
product attention with the causal mask aligned to the last key and the KV heads shared, as a
serving engine's flash attention runs it; transformers' own `sdpa` passes an explicit mask when a
cache is longer than the query, which repeats K and V per head and leaves flash attention out.
Per row: TTFT, its speed-up over recompute, and the load's time (on the GPU's timeline, from the
request to the loaded prefix) against its bytes over the DMA ceiling measured in the same run.
Every loaded prefix must equal the recompute's KV byte for byte, and its first token's logits
must equal, bit for bit, those of the same forward pass over the recompute's own KV, or the
command exits 1. Without a GPU it runs on the CPU and numbakv's data path on Numba's CUDA
simulator (times meaningless, the checks real).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODELS = {
    "llama-3.1-8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
        "max_position_embeddings": 4096,
    },
}
PATHS = ("recompute", "numbakv", "disk", "torch")
BLOCK_TOKENS = 16  # vLLM's default block size
ATTENTION = "lower_right_causal"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ttft.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=MODELS, default="llama-3.1-8b")
    parser.add_argument(
        "--prompt-tokens",
        default="1024,4096,16384,32768",
        help="prompt lengths, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--new-tokens", type=int, default=128, help="new tokens at each prompt's end (%(default)s)"
    )
    parser.add_argument("--repeats", type=int, help="runs per row (default: 3 on a GPU, 1 else)")
    parser.add_argument("--disk-dir", type=Path, help="the disk tier's directory (default: a temp)")
    parser.add_argument("--out", type=Path, default=Path("results/ttft.json"))
    args = parser.parse_args(argv)
    try:
        args.prompt_tokens = [int(text) for text in args.prompt_tokens.split(",") if text.strip()]
    except ValueError:
        parser.error(
            f"argument --prompt-tokens: got {args.prompt_tokens!r}, expected whole numbers"
        )
    if args.new_tokens < 1 or args.new_tokens % BLOCK_TOKENS:
        parser.error(
            f"argument --new-tokens: got {args.new_tokens}, expected a positive multiple of "
            f"{BLOCK_TOKENS}"
        )
    for tokens in args.prompt_tokens:
        if tokens % BLOCK_TOKENS or tokens <= args.new_tokens:
            parser.error(
                f"argument --prompt-tokens: got {tokens}, expected multiples of {BLOCK_TOKENS} "
                f"longer than --new-tokens ({args.new_tokens})"
            )
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"argument --repeats: got {args.repeats}, expected a whole number >= 1")
    return args


class Clock:
    """Marks on the GPU's timeline (CUDA events on the current stream), so a mark after queued
    work is taken when that work ends; on the CPU, wall time."""

    def __init__(self, torch, device: str) -> None:
        self._torch, self._cuda = torch, device == "cuda"

    def start(self):
        """A mark once the GPU is idle: what a row measures starts with nothing queued."""
        if self._cuda:
            self._torch.cuda.synchronize()
        return self.mark()

    def mark(self):
        if not self._cuda:
            return time.perf_counter() * 1e3
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ms(self, start, end) -> float:
        """Milliseconds from mark `start` to mark `end`, once `end` is reached."""
        if not self._cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end)


class PagedPrefix:
    """A paged KV cache in vLLM's flash-attention layout (per layer [2, blocks, 16, KV heads,
    head size]) with numbakv's engine, host pool and disk tier over it, and torch's pinned copy
    of the same blocks: everything a row loads its prefix with."""

    def __init__(self, torch, model, device: str, max_blocks: int, disk_dir: Path) -> None:
        from numbakv.datapath import SIMULATOR_LAUNCH, HostPool, KVLayout, TransferEngine
        from numbakv.datapath._device import ON_SIMULATOR
        from numbakv.tiers import ChunkTier, Namespace
        from numbakv.tiers.disk import DiskBackend

        config = model.config
        self.torch, self.device, self.max_blocks = torch, device, max_blocks
        self.heads, self.head = config.num_key_value_heads, config.head_dim
        self.dtype = model.dtype
        shape = (2, max_blocks, BLOCK_TOKENS, self.heads, self.head)
        self.layers = [
            torch.zeros(shape, dtype=self.dtype, device=device)
            for _ in range(config.num_hidden_layers)
        ]
        # The data path sees the same memory as 16-bit words (no bf16 in the array interfaces).
        words = [layer.view(torch.int16) for layer in self.layers]
        self.layout = KVLayout.from_arrays(
            "flash_attn", words if device == "cuda" else [w.numpy() for w in words]
        )
        self.pool = HostPool.for_layout(self.layout, max_blocks)
        options = dict(SIMULATOR_LAUNCH) if ON_SIMULATOR else {}
        self.engine = TransferEngine(self.layout, self.pool, **options)
        self.host_ids = np.random.default_rng(0).permutation(max_blocks)  # scattered, as in use
        namespace = Namespace(
            "ttft-benchmark", "", str(self.dtype), BLOCK_TOKENS, 1, len(self.layers),
            self.heads, self.head, self.layout.chunk_bytes, "numbakv-host-block",
        )  # fmt: skip
        backend = DiskBackend(
            disk_dir, namespace, self.layout.block_bytes, 2 * self.pool.nbytes + 2**30
        )
        self.tier = ChunkTier(backend, self.pool.blocks, namespace, io_threads=8)
        self.keys: list[bytes] = []
        # torch's way keeps a prefix contiguous: the first blocks' worth of one flat buffer each
        elements = len(self.layers) * 2 * max_blocks * BLOCK_TOKENS * self.heads * self.head
        self._pinned = torch.empty(elements, dtype=self.dtype, pin_memory=device == "cuda")
        self._staging = torch.empty(elements, dtype=self.dtype, device=device)
        self.gpu_index = torch.arange(max_blocks, device=device)
        self._jobs = iter(range(10**9))
        self._in_flight: list[int] = []

    def save(self, cache, blocks: int) -> None:
        """Put the first `blocks` blocks of the recompute's KV cache where each row loads them
        from: host memory (stored through numbakv), the disk tier, torch's pinned copy."""
        for layer, kv in zip(self.layers, self._prefix_kv(cache, blocks)):
            layer[:, :blocks] = kv
        self._move("store", blocks)
        self.keys = [uuid.uuid4().bytes for _ in range(blocks)]  # a tier keeps what it holds
        job = next(self._jobs)
        self.tier.submit_store(job, self.keys[:blocks], self.host_ids[:blocks])
        self.tier.drain()
        if not all(done.success for done in self.tier.take_finished()):
            raise RuntimeError("the disk tier failed to store the prefix")
        for pinned, layer in zip(self._torch_blocks(self._pinned, blocks), self.layers):
            pinned.copy_(layer[:, :blocks])

    def forget(self, blocks: int, host_too: bool) -> None:
        """Wipe the GPU's copy of the prefix (and host memory's), so a load must bring it back."""
        for layer in self.layers:
            layer[:, :blocks] = 0
        if host_too:
            self.pool.blocks[self.host_ids[:blocks]] = 0

    def load(self, path: str, blocks: int) -> None:
        """Queue the prefix's blocks into the paged cache the way row `path` does: work queued
        on the current stream after this waits for them (`settle` ends numbakv's job)."""
        if path == "numbakv":
            self._move("load", blocks, block=False)
        elif path == "disk":
            self.tier.submit_load(next(self._jobs), self.keys[:blocks], self.host_ids[:blocks])
            self.tier.drain()
            if not all(done.success for done in self.tier.take_finished()):
                raise RuntimeError("the disk tier failed to load the prefix")
            self._move("load", blocks, block=False)
        else:  # torch's way: one pinned copy, an index_copy per layer
            staging = self._torch_blocks(self._staging, blocks)
            staging.copy_(self._torch_blocks(self._pinned, blocks), non_blocking=True)
            index = self.gpu_index[:blocks]
            for layer, loaded in zip(self.layers, staging):
                layer.index_copy_(1, index, loaded)

    def cache(self, blocks: int):
        """A transformers DynamicCache of the prefix, read from the paged cache."""
        from transformers import DynamicCache

        cache = DynamicCache()
        tokens = blocks * BLOCK_TOKENS
        for number, layer in enumerate(self.layers):
            k, v = (
                layer[i, :blocks].reshape(tokens, self.heads, self.head).transpose(0, 1)[None]
                for i in (0, 1)
            )
            cache.update(k, v, number)
        return cache

    def matches(self, cache, blocks: int) -> bool:
        """Whether the paged cache holds the recompute's prefix KV, byte for byte."""
        return all(
            self.torch.equal(layer[:, :blocks], kv)
            for layer, kv in zip(self.layers, self._prefix_kv(cache, blocks))
        )

    def _torch_blocks(self, flat, blocks: int):
        """`blocks` blocks of every layer, [layers, 2, blocks, 16, heads, head], from the start
        of a flat buffer: contiguous, so one copy moves them."""
        shape = (len(self.layers), 2, blocks, BLOCK_TOKENS, self.heads, self.head)
        return flat[: math.prod(shape)].view(shape)

    def _prefix_kv(self, cache, blocks: int):
        """Each layer's first `blocks` blocks of a DynamicCache as [2, blocks, 16, heads, head]."""
        tokens = blocks * BLOCK_TOKENS
        for layer in cache.layers:
            pair = self.torch.stack([layer.keys[0, :, :tokens], layer.values[0, :, :tokens]])
            yield pair.transpose(1, 2).reshape(2, blocks, BLOCK_TOKENS, self.heads, self.head)

    def settle(self) -> None:
        """End numbakv's jobs (a load's job ends on the CPU once the forward pass is queued)."""
        for job in self._in_flight:
            self.engine.wait(job)
        self._in_flight.clear()
        self.engine.get_finished()

    def _move(self, direction: str, blocks: int, block: bool = True) -> None:
        """One job over the prefix's blocks, after the current stream's queued work; with
        `block`, finished on return, else the current stream waits for it on the GPU."""
        job = next(self._jobs)
        stream = self.torch.cuda.current_stream() if self.device == "cuda" else None
        self.engine.submit(
            job, direction, np.arange(blocks), self.host_ids[:blocks], wait_event=stream
        )
        self._in_flight.append(job)
        done = self.engine.completion_event(job)
        if block or stream is None or done is None:
            self.settle()
        else:
            from numba import cuda

            done.wait(cuda.external_stream(stream.cuda_stream))

    def close(self) -> None:
        self.tier.close()


def dma_ceiling_gbps(torch, device: str, nbytes: int, repeats: int = 5) -> float | None:
    """One contiguous pinned copy host -> GPU: the link's rate in this run (None on the CPU)."""
    if device != "cuda":
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(repeats + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(host, non_blocking=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return nbytes / (statistics.median(times[1:]) / 1e3) / 1e9


def lower_right_causal_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    """transformers' attention interface: each query attends to every key up to its own
    position, counted from the last key (so new tokens see the whole cached prefix), the KV heads
    shared across their query heads without copies. On a GPU this is flash attention."""
    import torch
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention

    queries, keys = query.shape[2], key.shape[2]
    if query.is_cuda:
        mask = causal_lower_right(queries, keys)
    else:  # the CPU has no kernel for the bias: the same mask, spelled out
        mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
    output = scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
    )
    return output.transpose(1, 2).contiguous(), None


def build_model(torch, name: str, device: str):
    """LlamaForCausalLM from `name`'s shapes, random weights, bf16 on a GPU (fp32 on the CPU)."""
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    AttentionInterface.register(ATTENTION, lower_right_causal_attention)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = LlamaConfig(**MODELS[name], attn_implementation=ATTENTION)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def measure(torch, model, paged: PagedPrefix, clock: Clock, prompt: int, new: int, repeats: int):
    """The rows of one prompt length."""
    blocks = (prompt - new) // BLOCK_TOKENS
    generator = torch.Generator(device="cpu").manual_seed(prompt)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=generator)
    ids = ids.to(paged.device)
    new_ids = ids[:, prompt - new :]

    def recompute():
        started = clock.start()
        output = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        logits = output.logits[0, -1].float()
        return clock.ms(started, clock.mark()), None, logits, output

    def first_token(cache):
        return model(input_ids=new_ids, past_key_values=cache, logits_to_keep=1).logits[0, -1]

    def from_prefix(path: str):
        paged.forget(blocks, host_too=path == "disk")
        started = clock.start()
        paged.load(path, blocks)
        loaded = clock.mark()
        logits = first_token(paged.cache(blocks)).float()
        ended = clock.mark()
        times = clock.ms(started, ended), clock.ms(started, loaded)
        paged.settle()
        return *times, logits, None

    with torch.inference_mode():
        _, _, reference, first = recompute()
        paged.save(first.past_key_values, blocks)
        # what every load must give: the same pass over the recompute's own KV, in place
        cached_reference = first_token(paged.cache(blocks)).float()
        times: dict[str, list[tuple[float, float | None]]] = {path: [] for path in PATHS}
        checks = {}
        for repeat in range(repeats + 1):
            for path in PATHS:
                total, load, logits, _ = recompute() if path == "recompute" else from_prefix(path)
                if repeat:
                    times[path].append((total, load))
                if repeat == 0 and path != "recompute":
                    checks[path] = (paged.matches(first.past_key_values, blocks), logits)
    recompute_ms = statistics.median(total for total, _ in times["recompute"])
    load_bytes = blocks * paged.layout.block_bytes
    rows = []
    for path in PATHS:
        ttft_ms = statistics.median(total for total, _ in times[path])
        row = {
            "prompt_tokens": prompt,
            "prefix_tokens": blocks * BLOCK_TOKENS,
            "new_tokens": new,
            "path": path,
            "ttft_ms": ttft_ms,
            "speedup": recompute_ms / ttft_ms,
            "load_ms": None,
            "forward_ms": ttft_ms,
            "load_bytes": 0,
        }
        if path != "recompute":
            load_ms = statistics.median(load for _, load in times[path])
            kv_exact, logits = checks[path]
            logits_exact = bool(torch.equal(logits, cached_reference))
            row.update(
                load_ms=load_ms,
                forward_ms=ttft_ms - load_ms,
                load_bytes=load_bytes,
                kv_exact=kv_exact,
                logits_exact=logits_exact,
                # against the pass over the whole prompt, which rounds differently: for scale
                logits_max_abs_diff_from_recompute=float((logits - reference).abs().max()),
                first_token_matches=int(logits.argmax()) == int(reference.argmax()),
                ok=kv_exact and logits_exact,
            )
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    repeats = args.repeats or (3 if device == "cuda" else 1)
    clock = Clock(torch, device)
    model = build_model(torch, args.model, device)
    max_blocks = (max(args.prompt_tokens) - args.new_tokens) // BLOCK_TOKENS
    with tempfile.TemporaryDirectory(prefix="numbakv-ttft-", dir=args.disk_dir) as disk_dir:
        paged = PagedPrefix(torch, model, device, max_blocks, Path(disk_dir))
        ceiling = dma_ceiling_gbps(torch, device, min(2**30, paged.pool.nbytes))
        rows = []
        try:
            for prompt in args.prompt_tokens:
                rows += measure(torch, model, paged, clock, prompt, args.new_tokens, repeats)
        finally:
            paged.close()
    for row in rows:
        ideal = (
            None if ceiling is None or not row["load_bytes"] else row["load_bytes"] / ceiling / 1e6
        )
        row["ideal_load_ms"] = ideal
        row["load_vs_ideal"] = None if ideal is None else row["load_ms"] / ideal
    config = model.config
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "simulator": device != "cuda",
        "model": args.model,
        "shapes": MODELS[args.model],
        "dtype": str(model.dtype).removeprefix("torch."),
        "block_tokens": BLOCK_TOKENS,
        "kv_bytes_per_token": paged.layout.block_bytes // BLOCK_TOKENS,
        "layers": config.num_hidden_layers,
        "repeats": repeats,
        "torch": torch.__version__,
        "dma_ceiling_gbps": {"h2d": ceiling},
        "rows": rows,
    }


def print_table(report: dict) -> None:
    ceiling = report["dma_ceiling_gbps"]["h2d"]
    print(
        f"{report['model']} ({report['layers']} layers, {report['dtype']}, "
        f"{report['kv_bytes_per_token']:,} bytes of KV a token) on {report['device']}; "
        f"DMA ceiling host -> GPU: {'-' if ceiling is None else f'{ceiling:.1f} GB/s'}; "
        f"median of {report['repeats']}"
    )
    header = ("prompt", "path", "TTFT ms", "speed-up", "load ms", "forward ms", "load/ideal", "KV")
    print(" | ".join(f"{h:>10}" for h in header))
    for row in report["rows"]:
        ratio = row.get("load_vs_ideal")
        cells = [
            row["prompt_tokens"],
            row["path"],
            f"{row['ttft_ms']:.1f}",
            f"{row['speedup']:.1f}x",
            "-" if row["load_ms"] is None else f"{row['load_ms']:.1f}",
            f"{row['forward_ms']:.1f}",
            "-" if ratio is None else f"{ratio:.2f}",
            "-" if "ok" not in row else ("exact" if row["ok"] else "WRONG"),
        ]
        print(" | ".join(f"{c:>10}" for c in cells))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        sys.stderr.write(f"ttft.py: error: needs torch and transformers ({error})\n")
        return 2
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"wrote {args.out}")
    wrong = [row for row in report["rows"] if row.get("ok") is False]
    for row in wrong:
        print(
            f"WRONG: {row['path']} at {row['prompt_tokens']} tokens: KV exact {row['kv_exact']}, "
            f"first token's logits exact {row['logits_exact']}",
            file=sys.stderr,
        )
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
