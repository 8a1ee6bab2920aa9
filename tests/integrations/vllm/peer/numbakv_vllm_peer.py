"""A pytest plugin that runs vLLM's own offloading tests against numbakv's manager.

    cd DIR && PYTHONPATH=.../tests/integrations/vllm/peer \
        python -m pytest -p numbakv_vllm_peer FILES

DIR holds the `tests/` folder of the installed vLLM release's source distribution, and FILES are
`TEST_FILES` of that release (`.ci/vllm_peer_tests` fetches, unpacks and runs them). Wherever those
tests build vLLM's `CPUOffloadingManager(num_chunks, cache_policy=..., ...)`, they get numbakv's,
built from the same settings as `NumbaKVOffloadingSpec` builds it; wherever they name vLLM's
`CPUOffloadingSpec` (by class, or as `spec_name` through vLLM's spec factory), they get
`NumbaKVOffloadingSpec`. Tests that read or replace vLLM's private attributes or internals are
deselected, each with its reason (`DESELECTED`); behaviour tests where numbakv differs on purpose
run as strict expected failures, each with its reason and the exception it fails with
(`DIFFERS`). docs/VLLM.md lists both.
Loaded as a top-level module, not from numbakv's `tests` package: vLLM's tests import their own
package `tests`.
"""

from __future__ import annotations

import pytest
import vllm
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

from numbakv.integrations.vllm.config import ConfigError, Settings
from numbakv.integrations.vllm.spec import NumbaKVOffloadingSpec, build_scheduler_manager

_SCHEDULER = "tests/v1/kv_connector/unit/offloading_connector/test_scheduler.py"
TEST_FILES = {
    "0.32.0": (
        "tests/v1/kv_offload/cpu/test_manager.py",
        "tests/v1/kv_offload/cpu/policies/test_factory.py",
        "tests/v1/kv_offload/test_factory.py",
        # The connector scheduler's test that builds a real manager and runs without a GPU. Its
        # other one, test_swa_load_does_not_wait_for_unusable_pending_suffix, builds an engine
        # config from facebook/opt-125m on the Hugging Face hub with vLLM's hybrid KV cache
        # manager, which vLLM refuses on a CPU platform (against its own manager too).
        f"{_SCHEDULER}::test_swa_offload_window_covers_unaligned_hit",
    ),
    "0.33.0": (
        "tests/v1/kv_offload/cpu/test_manager.py",
        "tests/v1/kv_offload/cpu/policies/test_factory.py",
        "tests/v1/kv_offload/test_factory.py",
        f"{_SCHEDULER}::test_swa_offload_window_covers_unaligned_hit",
    ),
}
"""vLLM's test files (or single tests, `path::name`) run against numbakv, per vLLM release."""

_MANAGER = "tests/v1/kv_offload/cpu/test_manager.py"
_POLICIES = "tests/v1/kv_offload/cpu/policies/test_factory.py"
_SPECS = "tests/v1/kv_offload/test_factory.py"
_POLICY = "reads or replaces vLLM's policy object (`manager._policy`) and its lists"
_CPU_SPEC_INTERNALS = (
    "replaces the internals of vLLM's CPU spec module (`SharedOffloadRegion`, "
    "`CPUOffloadingWorker`) to see what its `create_worker` builds"
)
_TIERING_INTERNALS = (
    "replaces the internals of vLLM's tiering spec module (`SharedOffloadRegion`, "
    "`CPUOffloadingWorker`); no numbakv code runs there"
)
DESELECTED = {
    "0.32.0": {
        f"{_MANAGER}::test_cpu_manager_reports_allocation_size_on_allocation_failure": (
            "replaces vLLM's private `_allocate_chunks`"
        ),
        f"{_MANAGER}::test_lru_batch_eviction_failure_is_atomic": _POLICY,
        f"{_MANAGER}::test_lru_repeated_pin_cycles_compact_lazy_heap_entries": (
            "reads vLLM's LRU heap (`manager._policy._heap`)"
        ),
        f"{_MANAGER}::test_reset_discards_stale_request_access_classification": _POLICY,
        **{
            f"{_MANAGER}::TestARCPolicy::{name}": _POLICY
            for name in (
                "test_basic",
                "test_t1_to_t2_promotion",
                "test_eviction_with_load",
                "test_adaptive_target",
                "test_t1_t2_eviction_policy",
                "test_batch_eviction_scans_t1_and_t2_once",
                "test_batch_eviction_falls_back_after_t1_iterator_exhausted",
                "test_store_falls_back_to_t1_when_t2_cannot_satisfy_eviction",
                "test_batch_eviction_failure_is_atomic",
                "test_ghost_list_bounds",
                "test_touch_ordering",
                "test_failed_store",
                "test_full_scenario",
            )
        },
        f"{_MANAGER}::test_filter_reused_manager": (
            "reads vLLM's admission tracker (`manager.counts`)"
        ),
        f"{_MANAGER}::test_store_threshold_does_not_hide_ready_reuse": (
            "reads vLLM's counter `manager.stores_skipped_in_current_batch` (numbakv reports "
            "skipped stores through get_stats)"
        ),
        f"{_MANAGER}::test_evictable_cache_chunk_count": (
            "reads vLLM's private `_num_evictable_cache_chunks` and replaces `_policy.evict`"
        ),
        f"{_MANAGER}::test_touch_forwards_req_context_to_policy": _POLICY,
        f"{_MANAGER}::test_arc_counts_reuse_once_and_keeps_insertions_in_t1": _POLICY,
        f"{_MANAGER}::test_arc_reuse_wins_if_same_request_later_reinserts_key": _POLICY,
        f"{_MANAGER}::test_request_finish_forwards_grouped_deduplicated_accesses": _POLICY,
        f"{_MANAGER}::test_failed_store_records_access_once_and_uses_store_miss_hook": (
            "replaces vLLM's private `_record_request_cache_access` and its policy's hooks"
        ),
        f"{_MANAGER}::test_arc_ghost_hit_adapts_once_per_request_before_insertion": _POLICY,
        f"{_MANAGER}::test_arc_pending_chunk_is_not_a_frequency_hit": _POLICY,
        f"{_POLICIES}::TestCachePolicyFactory::test_register_and_resolve_custom_policy": (
            "reads vLLM's policy object (`manager._policy`) of a vLLM CachePolicy"
        ),
        f"{_POLICIES}::TestCachePolicyFactory::test_manager_resolves_policy_via_module_path": (
            "reads vLLM's policy object (`manager._policy`) of a vLLM CachePolicy"
        ),
        f"{_SPECS}::test_cpu_spec_create_worker_uses_mmap_on_cuda": _CPU_SPEC_INTERNALS,
        f"{_SPECS}::test_cpu_spec_create_worker_uses_tensor_path_without_shared_region": (
            _CPU_SPEC_INTERNALS
        ),
        f"{_SPECS}::test_cpu_spec_create_worker_skips_mmap_for_empty_cache": _CPU_SPEC_INTERNALS,
        f"{_SPECS}::test_cpu_spec_create_worker_rank_assignment": _CPU_SPEC_INTERNALS,
        f"{_SPECS}::test_dynamic_load_via_spec_module_path": (
            "deletes the CPU spec from vLLM's private `OffloadingSpecFactory._registry` to load "
            "vLLM's own spec by module path"
        ),
        f"{_SPECS}::test_tiering_spec_create_worker_uses_single_slot_for_replicated_layout": (
            _TIERING_INTERNALS
        ),
        f"{_SPECS}::test_tiering_spec_create_worker_uses_worker_rank_for_sharded_layout": (
            _TIERING_INTERNALS
        ),
    },
}
"""Per vLLM release: test id (path::name, parameters dropped) -> the private state of vLLM's it
reads or replaces, which numbakv's objects do not have. Only such tests are deselected."""
DESELECTED["0.33.0"] = DESELECTED["0.32.0"]  # 0.33's copies of them read the same internals

_NO_EMPTY_TIER = (
    "a tier of 0 chunks, which numbakv's spec refuses at start, naming `cpu_bytes_to_use`, "
    "rather than run a tier that holds nothing"
)
_UNPADDED = (
    "vLLM pads each chunk to a 4 KiB page of its shared region; numbakv's chunks are unpadded, "
    "so the same bytes hold as many chunks or more"
)
DIFFERS = {
    "0.32.0": {
        f"{_MANAGER}::test_cpu_manager_reports_cache_usage_gauge": (_NO_EMPTY_TIER, ConfigError),
        f"{_SPECS}::test_cpu_spec_zero_worker_bytes_produces_empty_cache": (
            _NO_EMPTY_TIER,
            ConfigError,
        ),
        f"{_SPECS}::test_cpu_spec_sizes_normalized_worker_layout": (_UNPADDED, AssertionError),
    },
}
"""Per vLLM release: behaviour tests where numbakv differs on purpose -> (why, the exception the
test then fails with). They run, as strict expected failures: one that passes, or fails otherwise,
fails the suite."""
DIFFERS["0.33.0"] = {
    **DIFFERS["0.32.0"],
    f"{_SPECS}::test_cpu_config_info_zero_capacity_is_exact_not_unknown": (
        _NO_EMPTY_TIER,
        ConfigError,
    ),
}


def numbakv_cpu_manager(
    num_chunks: int,
    cache_policy: str = "lru",
    cache_policy_module_path: str | None = None,
    enable_events: bool = False,
    store_threshold: int = 1,
    max_tracker_size: int = 64_000,
):
    """numbakv's manager where vLLM's tests build `CPUOffloadingManager`, from the settings they
    give it, checked as the spec checks them."""
    extra = {
        "cpu_bytes_to_use": num_chunks,
        "eviction_policy": cache_policy,
        "store_threshold": store_threshold,
        "max_tracker_size": max_tracker_size,
    }
    if cache_policy_module_path is not None:
        extra["cache_policy_module_path"] = cache_policy_module_path
    return build_scheduler_manager(
        Settings.from_extra_config(extra), num_chunks, block_size=16, enable_events=enable_events
    )


def pytest_configure(config: pytest.Config) -> None:
    if vllm.__version__ not in TEST_FILES:
        raise pytest.UsageError(
            f"numbakv_vllm_peer: no peer suite for vLLM {vllm.__version__}; "
            f"known: {sorted(TEST_FILES)}"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselected_ids, differs = DESELECTED[vllm.__version__], DIFFERS[vllm.__version__]
    kept, dropped = [], []
    for item in items:
        test_id = item.nodeid.split("[")[0]
        if test_id in differs:
            reason, raises = differs[test_id]
            item.add_marker(pytest.mark.xfail(reason=reason, raises=raises, strict=True))
        (dropped if test_id in deselected_ids else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


NUMBAKV_FOR = {CPUOffloadingManager: numbakv_cpu_manager, CPUOffloadingSpec: NumbaKVOffloadingSpec}
"""vLLM's class -> what its tests get in its place."""


@pytest.fixture(autouse=True)
def _numbakv_in_vllms_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's test modules import its manager and spec by name, and its spec factory resolves
    "CPUOffloadingSpec": all of them now give numbakv's."""
    module = request.module
    for name, value in list(vars(module).items()):
        if isinstance(value, type) and value in NUMBAKV_FOR:
            monkeypatch.setattr(module, name, NUMBAKV_FOR[value])
    registry = {
        **OffloadingSpecFactory._registry,
        "CPUOffloadingSpec": lambda: NumbaKVOffloadingSpec,
    }
    monkeypatch.setattr(OffloadingSpecFactory, "_registry", registry)
