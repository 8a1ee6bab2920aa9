"""numbakv's manager types as vLLM's: the one place the scheduler side maps one to the other.

numbakv's own types (numbakv.specs) carry their own names and fields; vLLM 0.32's counterparts:

- `HostBlocks(block_ids)` becomes a `HostChunksSpec(chunk_ids)`, numbakv's vLLM `LoadStoreSpec`;
- `StorePlan(block_hashes_to_store, store_spec, block_hashes_evicted)` a
  `PrepareStoreOutput(keys_to_store, store_spec, evicted_keys)`;
- `BlockEvent(block_hashes, block_size, medium, removed)` an `OffloadingEvent(keys, medium,
  removed)` (vLLM's event has no block size; its medium is an enum); under vLLM 0.33 a failed
  store, of which numbakv's manager says nothing, becomes a `metadata_only` removal.

vLLM's keys are numbakv's block hashes as they are, and host block ids its chunk ids, so the lists
and arrays pass through uncopied.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import Medium, OffloadingEvent, OffloadKey, PrepareStoreOutput

from numbakv.integrations.vllm.host_spec import HostChunksSpec
from numbakv.specs import MEDIUM_CPU, BlockEvent, HostBlocks, StorePlan

_MEDIA = {MEDIUM_CPU: Medium.CPU}
"""vLLM's medium for each of numbakv's (events name it as a string)."""


def host_chunks_spec(blocks: HostBlocks) -> HostChunksSpec:
    return HostChunksSpec(blocks.block_ids)


def prepare_store_output(plan: StorePlan) -> PrepareStoreOutput:
    return PrepareStoreOutput(
        keys_to_store=plan.block_hashes_to_store,
        store_spec=host_chunks_spec(plan.store_spec),
        evicted_keys=plan.block_hashes_evicted,
    )


def offloading_event(event: BlockEvent) -> OffloadingEvent:
    return OffloadingEvent(
        keys=event.block_hashes, medium=_MEDIA[event.medium], removed=event.removed
    )


def failed_store_event(keys: list[OffloadKey]) -> OffloadingEvent:
    """vLLM 0.33's notice that failed stores released these keys, never announced as stored."""
    return OffloadingEvent(keys=keys, medium=Medium.CPU, removed=True, metadata_only=True)
