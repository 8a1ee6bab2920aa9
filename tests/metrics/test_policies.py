"""Each policy's state is exported under its own names, or not at all: real managers, in-process
and through the multiprocess directory as the sidecar reads it."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import pytest
from prometheus_client import CollectorRegistry

from numbakv.manager import CPUOffloadingManager
from numbakv.metrics import MANAGER, MANAGER_LABELS, TRANSFERS, OffloadMetrics
from numbakv.policies import POLICIES
from tests.support.metrics_fakes import churn, run_engine_process

BY_IMPORT_PATH = "numbakv.policies.arc:ARCPolicy"
LISTS = ("t1", "t2", "b1", "b2")


def arc_like(prefix: str) -> dict:
    """An ARC's series (name, labels beyond policy and instance) to its policy_stats() key."""
    lists = {(f"numbakv_{prefix}_list_blocks", (("list", key),)): key for key in LISTS}
    return {(f"numbakv_{prefix}_p_blocks", ()): "p", **lists}


POLICY_SERIES = {
    "lru": {},
    "arc": arc_like("arc"),
    "s3fifo": {
        ("numbakv_s3fifo_queue_blocks", (("queue", key),)): key
        for key in ("small", "main", "ghost")
    },
    "sieve": {},
    "sarc": arc_like("sarc"),
    BY_IMPORT_PATH: {},
}
"""Every series of each policy's state: the policy-state series its export must hold, no more."""

ENGINE = """
import json
from numbakv.manager import CPUOffloadingManager
from numbakv.metrics import OffloadMetrics
from numbakv.service.metrics_dir import MetricsDirectory
from tests.support.metrics_fakes import churn
policy_stats = {}
for policy in json.loads(sys.argv[3]):
    manager = CPUOffloadingManager(block_size=4, num_blocks=16, cache_policy=policy)
    metrics = OffloadMetrics(manager, instance=policy)
    churn(manager)
    metrics.sync()
    policy_stats[policy] = manager.policy_stats()
# Read while this process runs: its gauges leave with it.
metrics = MetricsDirectory(sys.argv[2]).read().metrics
samples = [(m.name, s.name, s.labels, s.value) for m in metrics for s in m.samples]
print(json.dumps([samples, policy_stats]))
"""


def policy_state(samples: Iterable, policy: str) -> dict:
    """The policy's samples outside the families every manager exports (MANAGER, TRANSFERS):
    (sample name, labels beyond policy and instance) to value."""
    common = {definition.name for definition in (*MANAGER, *TRANSFERS)}
    state = {}
    for family, name, labels, value in samples:
        if family not in common and labels["instance"] == policy:
            assert labels["policy"] == policy, (name, labels)
            others = tuple(sorted((k, v) for k, v in labels.items() if k not in MANAGER_LABELS))
            state[(name, others)] = value
    return state


def in_process(policy: str) -> tuple[dict, dict]:
    manager = CPUOffloadingManager(block_size=4, num_blocks=16, cache_policy=policy)
    registry = CollectorRegistry()
    OffloadMetrics(manager, instance=policy, registry=registry, enabled=True)
    churn(manager)
    samples = [(m.name, s.name, s.labels, s.value) for m in registry.collect() for s in m.samples]
    return policy_state(samples, policy), manager.policy_stats()


@pytest.fixture(scope="module")
def multiprocess(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """One engine process exports a manager of every policy, each as its own instance."""
    directory = tmp_path_factory.mktemp("metrics")
    out = run_engine_process(ENGINE, directory, str(directory), json.dumps(list(POLICY_SERIES)))
    samples, policy_stats = json.loads(out)
    return {
        policy: (policy_state(samples, policy), policy_stats[policy]) for policy in policy_stats
    }


@pytest.fixture(params=["in-process", "multiprocess"])
def export(request) -> Callable[[str], tuple[dict, dict]]:
    """A policy's state as exported (see :func:`policy_state`), and its manager's policy_stats()."""
    if request.param == "in-process":
        return in_process
    return request.getfixturevalue("multiprocess").__getitem__


def check(export: Callable[[str], tuple[dict, dict]], policy: str) -> None:
    """Exactly the policy's series, each with the value of its policy_stats() key."""
    got, policy_stats = export(policy)
    assert got == {series: policy_stats[key] for series, key in POLICY_SERIES[policy].items()}
    assert any(got.values()) or not got, "the workload left every gauge at 0: nothing is checked"


def test_lru_exports_no_policy_state(export):
    check(export, "lru")


def test_arc_exports_its_target_and_lists_under_arc_names(export):
    check(export, "arc")


def test_s3fifo_exports_its_queues_under_its_own_names(export):
    check(export, "s3fifo")


def test_sieve_exports_no_policy_state(export):
    check(export, "sieve")


def test_sarc_exports_its_target_and_lists_under_its_own_names(export):
    check(export, "sarc")


def test_a_policy_loaded_by_import_path_exports_no_policy_state(export):
    check(export, BY_IMPORT_PATH)


def test_every_registered_policy_has_its_test():
    assert set(POLICIES) == set(POLICY_SERIES) - {BY_IMPORT_PATH}
