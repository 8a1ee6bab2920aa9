"""vLLM 0.32's real Scheduler and a worker-role OffloadingConnector on CPU, with numbakv's spec.

The model is a local `config.json` (no hub, no tokenizer); its "forward pass" writes, for every
token a step computes, K and V of every layer as random words seeded by the token's whole prefix.
So the KV of a prefix is the same whichever request computed it, and every block a request
relies on (GPU prefix cache or loaded from numbakv) can be checked against what its first writer
wrote. The worker's kernels run on the CUDA simulator over the CPU KV tensors.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json: never ask a hub

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)
from vllm.forward_context import ForwardContext
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16  # tokens per GPU block
NUM_LAYERS = 2
NUM_KV_HEADS = 2
HEAD_SIZE = 16
SPEC = "numbakv.integrations.vllm"

_TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": NUM_KV_HEADS * 2 * HEAD_SIZE,
    "num_attention_heads": NUM_KV_HEADS * 2,
    "num_key_value_heads": NUM_KV_HEADS,
    "num_hidden_layers": NUM_LAYERS,
    "intermediate_size": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
}


def extra_config(**overrides: Any) -> dict[str, Any]:
    """The OffloadingConnector's extra config loading numbakv's spec."""
    return {"spec_name": "NumbaKVOffloadingSpec", "spec_module_path": SPEC, **overrides}


def vllm_config(model_dir: Path, extra: dict[str, Any], num_gpu_blocks: int) -> VllmConfig:
    (model_dir / "config.json").write_text(json.dumps(_TINY_LLAMA))
    config = VllmConfig(
        model_config=ModelConfig(
            model=str(model_dir), skip_tokenizer_init=True, dtype="float16", max_model_len=2048
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=4,
            max_num_batched_tokens=256,
            max_model_len=2048,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            async_scheduling=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", kv_connector_extra_config=extra
        ),
        device_config=DeviceConfig("cpu"),
    )
    config.cache_config.num_gpu_blocks = num_gpu_blocks
    return config


def kv_cache_config(num_gpu_blocks: int) -> KVCacheConfig:
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]
    spec = FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE, dtype=torch.float16
    )
    return KVCacheConfig(
        num_blocks=num_gpu_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
    )


class TokenKV:
    """The K and V words every layer holds for a token, a function of the token's whole prefix."""

    def __init__(self) -> None:
        self._cache: dict[int, np.ndarray] = {}

    def __call__(self, token_ids: Sequence[int], positions: range) -> np.ndarray:
        """[len(positions), layers, 2, heads * head_size] uint16 words, never all zero."""
        prefix_hashes, running = [], 0
        for token in token_ids[: positions.stop]:
            running = hash((running, token))
            prefix_hashes.append(running)
        return np.stack([self._words(prefix_hashes[p]) for p in positions])

    def _words(self, prefix_hash: int) -> np.ndarray:
        words = self._cache.get(prefix_hash)
        if words is None:
            rng = np.random.default_rng(prefix_hash & (2**63 - 1))
            shape = (NUM_LAYERS, 2, NUM_KV_HEADS * HEAD_SIZE)
            words = self._cache[prefix_hash] = rng.integers(1, 2**16, shape, dtype=np.uint16)
        return words


class Engine:
    """One scheduler and one worker, stepped the way vLLM's engine core and model runner do."""

    def __init__(self, tmp_path: Path, extra: dict[str, Any], num_gpu_blocks: int = 24) -> None:
        self.config = vllm_config(tmp_path, extra, num_gpu_blocks)
        kv_config = kv_cache_config(num_gpu_blocks)
        self.scheduler = Scheduler(
            vllm_config=self.config,
            kv_cache_config=kv_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK_SIZE,
        )
        self.worker_connector = OffloadingConnector(self.config, KVConnectorRole.WORKER, kv_config)
        # The "GPU" KV cache: per layer [num_blocks, K/V, block_size, heads, head_size], random
        # from the start so an unwritten block never passes for a written one.
        shape = (NUM_LAYERS, num_gpu_blocks, 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_SIZE)
        self.kv = torch.empty(shape, dtype=torch.float16)
        self.words = self.kv.numpy().view(np.uint16).reshape(*shape[:4], -1)
        self.words[:] = np.random.default_rng(0).integers(1, 2**16, self.words.shape)
        layer_names = kv_config.kv_cache_groups[0].layer_names
        with set_current_vllm_config(self.config):
            self.worker_connector.register_kv_caches(
                {name: self.kv[i] for i, name in enumerate(layer_names)}
            )
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
        self._forward_context = ForwardContext(
            no_compile_layers={}, attn_metadata={}, slot_mapping={}
        )
        self.token_kv = TokenKV()
        self.next_request = 0
        self.checked_tokens = 0  # tokens whose KV was checked before a step used them
        self.loaded_requests: set[str] = set()  # requests a load from numbakv finished for
        self.checked_after_load = 0  # tokens checked in requests that had a load

    @property
    def manager(self):
        """numbakv's scheduler-side adapter inside vLLM's connector."""
        return self.scheduler.connector.connector_scheduler.manager

    @property
    def worker(self):
        """numbakv's worker inside the worker-role connector."""
        return self.worker_connector.connector_worker.worker

    def add(self, prompt: Sequence[int], max_tokens: int = 2) -> str:
        request_id = f"r{self.next_request}"
        self.next_request += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.scheduler.add_request(
            Request(request_id, list(prompt), params, None, block_hasher=self._hasher)
        )
        return request_id

    def step(self) -> None:
        output = self.scheduler.schedule()
        metadata = output.kv_connector_metadata
        connector = self.worker_connector
        connector.handle_preemptions(metadata)
        connector.bind_connector_metadata(metadata)
        connector.start_load_kv(self._forward_context)
        sampled = self._forward(output.num_scheduled_tokens)
        if output.total_num_scheduled_tokens > 0:
            connector.wait_for_save()
        finished_sending, finished_recving = connector.get_finished(output.finished_req_ids)
        self.loaded_requests |= finished_recving
        worker_meta = connector.build_connector_worker_meta()
        connector.clear_connector_metadata()
        request_ids = list(output.num_scheduled_tokens)
        self.scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=request_ids,
                req_id_to_index={request_id: i for i, request_id in enumerate(request_ids)},
                sampled_token_ids=[sampled[request_id] for request_id in request_ids],
                kv_connector_output=KVConnectorOutput(
                    finished_sending=finished_sending,
                    finished_recving=finished_recving,
                    kv_connector_worker_meta=worker_meta,
                ),
            ),
        )

    def _forward(self, num_scheduled_tokens: dict[str, int]) -> dict[str, list[int]]:
        """Check the KV each request attends to, write the KV of its new tokens, sample."""
        sampled = {}
        manager = self.scheduler.kv_cache_manager
        for request_id, count in num_scheduled_tokens.items():
            request = self.scheduler.requests[request_id]
            end = request.num_computed_tokens  # the scheduler has already advanced it
            start = end - count
            tokens = request.all_token_ids
            blocks = np.asarray(manager.get_block_ids(request_id)[0])
            if start:
                self._check(blocks, tokens, start)
                if request_id in self.loaded_requests:
                    self.checked_after_load += start
            positions = np.arange(start, end)
            # Two index arrays apart: the token axis comes first, [tokens, layers, 2, words].
            self.words[:, blocks[positions // BLOCK_SIZE], :, positions % BLOCK_SIZE] = (
                self.token_kv(tokens, range(start, end))
            )
            done_prefill = end >= request.num_prompt_tokens
            sampled[request_id] = [1 + int(request_id[1:]) % 997] if done_prefill else []
        return sampled

    def _check(self, blocks: np.ndarray, tokens: Sequence[int], count: int) -> None:
        positions = np.arange(count)
        held = self.words[:, blocks[positions // BLOCK_SIZE], :, positions % BLOCK_SIZE]
        wrong = np.flatnonzero((held != self.token_kv(tokens, range(count))).any(axis=(1, 2, 3)))
        assert wrong.size == 0, (
            f"KV of positions {wrong[:8].tolist()} differs from its first writer"
        )
        self.checked_tokens += count

    def run(self, max_steps: int = 200) -> int:
        """Step until every request has finished and every transfer completed; returns steps."""
        for steps in range(1, max_steps + 1):
            self.step()
            if not self.scheduler.has_requests():
                return steps
        raise AssertionError(f"requests still pending after {max_steps} steps")

    def serve(self, prompt: Sequence[int], max_tokens: int = 2) -> str:
        """Run one request to completion (and its stores with it)."""
        request_id = self.add(prompt, max_tokens)
        self.run()
        return request_id
