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
  pass over the new tokens whose attention reads the prefix in the paged cache;
- layerwise: the same, a job per group of layers (`LAYER_GROUPS`, numbakv's `layers=`), the groups
  crossing the link one after the other; each layer's attention waits on the GPU for its own
  group only, so the forward pass runs while the later groups still load;
- disk: the same, the blocks first read from numbakv's disk tier into host memory;
- torch: the same, loaded torch's way: one pinned copy to the GPU, then an index_copy per layer.
Only the last token's logits are computed. A load is queued on the GPU as an engine queues it: the
forward pass's kernels wait for it on the GPU, not on the CPU. On a GPU each row's forward pass is
one CUDA graph, captured once per prompt length and replayed, as vLLM runs a batch of a few hundred
tokens; transformers' eager forward spends about 40 ms of Python launching its kernels, more than
the GPU takes to run them (`--forward eager` measures that instead). Attention over a prefix is
paged flash attention, split across the prefix's keys (`PrefixAttention`): transformers' own
cache would copy the whole prefix twice a pass.
Per row: TTFT, its speed-up over recompute, and the load's time (on the GPU's timeline, from the
request to the loaded prefix) against its bytes over the DMA ceiling measured in the same run.
Every loaded prefix must equal the recompute's KV byte for byte, and its first token's logits
must equal, bit for bit, those of the same forward pass over the recompute's own KV, or the
command exits 1; the pass must be seen to read the paged cache, or it stops. Without a GPU it
runs on the CPU and numbakv's data path on Numba's CUDA simulator (times meaningless, the checks
real).
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
PATHS = ("recompute", "numbakv", "layerwise", "disk", "torch")
BLOCK_TOKENS = 16  # vLLM's default block size
ATTENTION = "paged_prefix"
LAYER_GROUPS = 8
"""Groups of layers the layerwise row loads one after the other: a group of Llama-3.1-8B's 32 is
4 layers, 5 ms of a 16k prompt's load at the link, about what its 4 layers' forward pass takes."""
SPLIT_TOKENS = 2048
"""Prefix keys per split of a new-token pass's attention, so a long prefix gives every SM work:
on an H200 at 16k tokens the pass took 15.8 ms at 2,048, 17.6 at 1,024, 22.1 at 512 and 19.5
unsplit (CUDA graphs, 2026-11-28)."""


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
    parser.add_argument(
        "--forward",
        choices=("graph", "eager"),
        help="each forward pass one replayed CUDA graph, or transformers' eager launches "
        "(default: graph on a GPU; the CPU has only eager)",
    )
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
        from numbakv.tiers import Namespace, open_tier

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
        # a layerwise load is a job per group, all in flight at once
        options["max_jobs_in_flight"] = LAYER_GROUPS
        self.engine = TransferEngine(self.layout, self.pool, **options)
        size = -(-len(self.layers) // LAYER_GROUPS)
        self.layer_groups = [
            range(at, min(at + size, len(self.layers))) for at in range(0, len(self.layers), size)
        ]
        # On a GPU: an event per group, recorded once its load ends, that its layers' attention
        # waits for; external, so a CUDA graph's replay waits for its latest record.
        self.group_ready = self._side = self.layer_ready = None
        if device == "cuda":
            self._side = torch.cuda.Stream()
            self.group_ready = [torch.cuda.Event(external=True) for _ in self.layer_groups]
            for event in self.group_ready:
                event.record()  # created now: a graph captures a wait only on a created event
            self.layer_ready = [self.group_ready[layer // size] for layer in range(len(words))]
        self.host_ids = np.random.default_rng(0).permutation(max_blocks)  # scattered, as in use
        namespace = Namespace(
            "ttft-benchmark", "", str(self.dtype), BLOCK_TOKENS, 1, len(self.layers),
            self.heads, self.head, self.layout.chunk_bytes, "numbakv-host-block",
        )  # fmt: skip
        self.tier = open_tier(
            f"dir:{disk_dir}", self.pool, namespace, bytes_to_use=2 * self.pool.nbytes + 2**30,
            io_threads=8,
        )  # fmt: skip
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
        self._submit("store", blocks, self._stream())
        self.settle()
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

    def load(self, path: str, blocks: int):
        """Queue the prefix's blocks into the paged cache the way row `path` does: work queued
        on the current stream after this waits for them (`settle` ends numbakv's jobs), except
        the layerwise row's, which its attention waits for layer by layer. Returns a mark once
        the whole prefix is in place where that is not the current stream's next one (or None)."""
        if path == "numbakv":
            self._load_after_compute(blocks)
        elif path == "layerwise":
            return self._load_by_layers(blocks)
        elif path == "disk":
            self.tier.submit_load(next(self._jobs), self.keys[:blocks], self.host_ids[:blocks])
            self.tier.drain()
            if not all(done.success for done in self.tier.take_finished()):
                raise RuntimeError("the disk tier failed to load the prefix")
            self._load_after_compute(blocks)
        else:  # torch's way: one pinned copy, an index_copy per layer
            staging = self._torch_blocks(self._staging, blocks)
            staging.copy_(self._torch_blocks(self._pinned, blocks), non_blocking=True)
            index = self.gpu_index[:blocks]
            for layer, loaded in zip(self.layers, staging):
                layer.index_copy_(1, index, loaded)

    def prefix(self, blocks: int) -> list:
        """Each layer's first `blocks` blocks as (K, V), [1, KV heads, tokens, head]: views of
        the paged cache, no copies, as paged attention reads them."""
        tokens = blocks * BLOCK_TOKENS
        return [
            tuple(
                layer[i, :blocks].view(1, tokens, self.heads, self.head).transpose(1, 2)
                for i in (0, 1)
            )
            for layer in self.layers
        ]

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
        """End numbakv's jobs (a load's jobs end on the CPU once the forward pass is queued)."""
        for job in self._in_flight:
            self.engine.wait(job)
        self._in_flight.clear()
        self.engine.get_finished()

    def _stream(self):
        return self.torch.cuda.current_stream() if self.device == "cuda" else None

    def _submit(self, direction: str, blocks: int, after, layers: range | None = None):
        """One job over the prefix's blocks (`layers` of them, or all), once `after` (a stream's
        queued work, or None) is reached; its completion event (None once it has finished)."""
        job = next(self._jobs)
        self.engine.submit(
            job, direction, np.arange(blocks), self.host_ids[:blocks], after, layers=layers
        )
        self._in_flight.append(job)
        return self.engine.completion_event(job)

    def _load_after_compute(self, blocks: int) -> None:
        """One load of every layer: the current stream waits for it on the GPU."""
        stream = self._stream()
        done = self._submit("load", blocks, stream)
        if stream is None or done is None:
            self.settle()
        else:
            from numba import cuda

            done.wait(cuda.external_stream(stream.cuda_stream))

    def _load_by_layers(self, blocks: int):
        """A load job per group of layers, in order on the engine's load stream, the first after
        the current stream's queued work; on a GPU, each group's event recorded (on a side
        stream) once its job ends, and a mark once the last has."""
        if self.group_ready is None:  # the simulator: each job has ended when it returns
            for layers in self.layer_groups:
                self._submit("load", blocks, None, layers)
            self.settle()
            return None
        from numba import cuda

        side = cuda.external_stream(self._side.cuda_stream)
        after = self._stream()
        for layers, ready in zip(self.layer_groups, self.group_ready):
            done = self._submit("load", blocks, after, layers)
            after = None  # the lane's stream keeps the rest in order behind the first
            if done is not None:
                done.wait(side)
                ready.record(self._side)
        loaded = self.torch.cuda.Event(enable_timing=True)
        loaded.record(self._side)
        return loaded

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


def replayable(torch, forward, graph: bool):
    """`forward` (a callable returning a tensor) as a callable to run it again: on a GPU with
    `graph`, one CUDA graph of its kernels replayed on the current stream, so what it waits for
    on that stream it still waits for; its output is the graph's own tensor, overwritten by the
    next replay. Without `graph`, `forward` itself."""
    if not graph:
        return forward
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()  # lazy initialisation (cuBLAS handles, workspaces) stays out of the graph
    torch.cuda.current_stream().wait_stream(side)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured, capture_error_mode="thread_local"):
        output = forward()

    def replay():
        captured.replay()
        return output

    return replay


class PrefixAttention:
    """transformers' attention interface for a pass over new tokens whose prefix sits in the
    paged cache, as a serving engine's paged flash attention runs it: queries attend to the
    prefix's keys where they lie (no copies into a contiguous cache), split across the keys so
    every SM has work, then causally to the new tokens' own keys; the splits are merged by their
    log-sum-exp. KV heads are shared by their query heads without copies. Without a prefix (the
    whole prompt) it is plain causal attention. On the CPU the same splits run in fp32."""

    def __init__(self) -> None:
        self.prefix: list | None = None  # per layer (K, V), set around a new-token pass
        self.ready: list | None = None  # per layer, an event to wait for before reading it

    def __call__(
        self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
    ):
        import torch

        if self.prefix is None:
            output = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=True
            )
        else:
            if self.ready is not None:
                self.ready[module.layer_idx].wait()
            output = self._over_prefix(query, key, value, *self.prefix[module.layer_idx], scaling)
        return output.transpose(1, 2).contiguous(), None

    @staticmethod
    def _over_prefix(query, key, value, prefix_k, prefix_v, scale):
        """Attention of `query` over the prefix's keys and then its own ([1, heads, tokens,
        head]): whole splits of the prefix as a batch, the rest with the new keys."""
        import torch

        splits = prefix_k.shape[2] // SPLIT_TOKENS
        whole = splits * SPLIT_TOKENS
        tail_k = torch.cat([prefix_k[:, :, whole:], key], dim=2)
        tail_v = torch.cat([prefix_v[:, :, whole:], value], dim=2)
        out, lse = _attend(query, tail_k, tail_v, scale, causal=True)
        outputs, lses = [out], [lse]
        if splits:

            def batched(x):  # [1, heads, whole, head] -> [splits, heads, SPLIT_TOKENS, head]
                return x[0, :, :whole].unflatten(1, (splits, SPLIT_TOKENS)).transpose(0, 1)

            queries = query.expand(splits, -1, -1, -1).contiguous()
            out, lse = _attend(queries, batched(prefix_k), batched(prefix_v), scale, causal=False)
            outputs.append(out)
            lses.append(lse)
        weights = torch.softmax(torch.cat(lses).float(), dim=0).unsqueeze(-1)
        merged = (weights * torch.cat(outputs).float()).sum(0, keepdim=True)
        return merged.to(query.dtype)


def _attend(query, key, value, scale, causal: bool):
    """(output, log-sum-exp per query) of attention over `key`/`value` ([batch, heads, tokens,
    head], fewer KV heads than query heads), causal aligned to the last key: flash attention on
    a GPU, the same sums in fp32 on the CPU."""
    import torch

    if query.is_cuda:  # flash attention shares KV heads natively; causal is aligned lower right
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, 0.0, is_causal=causal, scale=scale
        )[:2]
        return output, lse
    group = query.shape[1] // key.shape[1]
    key, value = (x.repeat_interleave(group, dim=1).float() for x in (key, value))
    scores = query.float() @ key.transpose(-1, -2) * (scale or query.shape[-1] ** -0.5)
    if causal:
        queries, keys = scores.shape[-2:]
        visible = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = scores.logsumexp(-1)
    return (torch.softmax(scores, -1) @ value).to(query.dtype), lse


ATTEND = PrefixAttention()


def build_model(torch, name: str, device: str):
    """LlamaForCausalLM from `name`'s shapes, random weights, bf16 on a GPU (fp32 on the CPU)."""
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    AttentionInterface.register(ATTENTION, ATTEND)
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


def measure(
    torch, model, paged: PagedPrefix, clock: Clock, prompt: int, new: int, repeats: int, graph: bool
):
    """The rows of one prompt length."""
    blocks = (prompt - new) // BLOCK_TOKENS
    generator = torch.Generator(device="cpu").manual_seed(prompt)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=generator)
    ids = ids.to(paged.device)
    new_ids = ids[:, prompt - new :]

    def whole_prompt():
        return model(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1]

    positions = torch.arange(prompt - new, prompt, device=paged.device)[None]
    prefix = paged.prefix(blocks)

    def new_tokens(ready=None):  # attention reads the prefix in the paged cache, graphed or not
        ATTEND.prefix, ATTEND.ready = prefix, ready
        try:
            output = model(input_ids=new_ids, position_ids=positions, use_cache=False,
                           logits_to_keep=1)  # fmt: skip
        finally:
            ATTEND.prefix = ATTEND.ready = None
        return output.logits[0, -1]

    def recompute():
        started = clock.start()
        logits = recompute_pass().float()
        return clock.ms(started, clock.mark()), None, logits

    def from_prefix(path: str):
        paged.forget(blocks, host_too=path == "disk")
        started = clock.start()
        loaded = paged.load(path, blocks)
        if loaded is None:
            loaded = clock.mark()
        logits = (layerwise_pass if path == "layerwise" else cached_pass)().float()
        ended = clock.mark()
        times = clock.ms(started, ended), clock.ms(started, loaded)
        paged.settle()
        return *times, logits

    with torch.inference_mode():
        first = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        reference = first.logits[0, -1].float()
        paged.save(first.past_key_values, blocks)
        recompute_pass = replayable(torch, whole_prompt, graph)
        cached_pass = replayable(torch, new_tokens, graph)
        layerwise_pass = replayable(torch, lambda: new_tokens(paged.layer_ready), graph)
        # what every load must give: the same pass over the recompute's own KV, in place
        cached_reference = cached_pass().float()
        paged.forget(blocks, host_too=False)
        if torch.equal(cached_pass().float(), cached_reference):
            raise RuntimeError("the forward pass does not read the paged cache: checks would lie")
        times: dict[str, list[tuple[float, float | None]]] = {path: [] for path in PATHS}
        checks = {}
        for repeat in range(repeats + 1):
            for path in PATHS:
                total, load, logits = recompute() if path == "recompute" else from_prefix(path)
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
    graph = device == "cuda" and args.forward != "eager"
    clock = Clock(torch, device)
    model = build_model(torch, args.model, device)
    max_blocks = (max(args.prompt_tokens) - args.new_tokens) // BLOCK_TOKENS
    with tempfile.TemporaryDirectory(prefix="numbakv-ttft-", dir=args.disk_dir) as disk_dir:
        paged = PagedPrefix(torch, model, device, max_blocks, Path(disk_dir))
        ceiling = dma_ceiling_gbps(torch, device, min(2**30, paged.pool.nbytes))
        rows = []
        try:
            for prompt in args.prompt_tokens:
                rows += measure(torch, model, paged, clock, prompt, args.new_tokens, repeats, graph)
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
        "forward": "cuda graph" if graph else "eager",
        "torch": torch.__version__,
        "dma_ceiling_gbps": {"h2d": ceiling},
        "rows": rows,
    }


def print_table(report: dict) -> None:
    ceiling = report["dma_ceiling_gbps"]["h2d"]
    print(
        f"{report['model']} ({report['layers']} layers, {report['dtype']}, "
        f"{report['kv_bytes_per_token']:,} bytes of KV a token) on {report['device']}, "
        f"{report['forward']} forward passes; "
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
        import torch
        import transformers  # noqa: F401
    except ImportError as error:
        sys.stderr.write(f"ttft.py: error: needs torch and transformers ({error})\n")
        return 2
    if args.forward == "graph" and not torch.cuda.is_available():
        sys.stderr.write("ttft.py: error: argument --forward: graph needs a GPU; this has none\n")
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
