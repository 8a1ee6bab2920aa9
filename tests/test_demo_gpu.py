"""The demo at real size on a GPU, with torch tensors as the engine's KV cache."""

import pytest

from numbakv.demo import DemoConfig, run


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_demo_at_real_size_with_torch_tensors(mode):
    torch = pytest.importorskip("torch")
    config = DemoConfig(
        num_layers=32,
        block_size=16,
        num_kv_heads=8,
        head_size=128,  # 2 MiB blocks, Llama-8B-like
        gpu_blocks=256,
        host_blocks=1024,
        sessions=200,
        mode=mode,
        threads_per_block=1024,
        max_thread_blocks=None,
    )
    shape = (2, config.gpu_blocks, config.block_size, config.num_kv_heads, config.head_size)
    arrays = [
        torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(config.num_layers)
    ]
    report = run(config, arrays)
    assert report.host_hits > 0 and report.verified == report.host_hits
    assert report.mismatched == 0
