"""The demo on a GPU, with torch tensors as the engine's KV cache and the engine's own defaults."""

import pytest

from numbakv.tools.demo.core import DemoConfig, run


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_demo_at_real_size_with_torch_tensors(mode):
    torch = pytest.importorskip("torch")
    config = DemoConfig(
        num_layers=32,
        block_size=16,
        num_kv_heads=2,
        head_size=128,  # 512 KiB blocks: 32 layers as a real model has, fewer heads to hash
        gpu_blocks=256,
        host_blocks=1024,
        sessions=120,
        mode=mode,
    )
    shape = (2, config.gpu_blocks, config.block_size, config.num_kv_heads, config.head_size)
    arrays = [
        torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(config.num_layers)
    ]
    report = run(config, arrays)
    assert report.host_hits > 0 and report.verified == report.host_hits
    assert report.mismatched == 0
