"""NPU prefill (emulated NPU) handing the KV cache to a Vulkan decoder (lavapipe here): the plan
the product runs on a Phoenix laptop, NPU for the prompt and iGPU for the tokens."""

from __future__ import annotations

from phoenix_chat.engine.generate import generate_step
from phoenix_chat.engine.sampling import SamplingParams
from tests.npu.emulator import EmulatedXrt


class _Model:
    def __init__(self, backend):
        self.backend = backend


def test_npu_prefill_then_vulkan_decode_equals_npu_prefill_then_cpu_decode(gguf, npu_test_kernels, vk_device):
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    weights, kernels = gguf, npu_test_kernels
    prompt = weights.tokenizer().encode("The harbour town woke up long before the sun did. Fishing boats left")
    vk = VulkanBackend(weights, 128, device=vk_device)
    try:
        on_gpu = NpuHybridBackend(weights, 128, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=vk)
        on_cpu = NpuHybridBackend(
            weights, 128, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=CpuBackend(weights, 128)
        )
        greedy = SamplingParams(temperature=0)
        a = list(generate_step(_Model(on_gpu), prompt, greedy, 8))
        b = list(generate_step(_Model(on_cpu), prompt, greedy, 8))
        assert a == b
        st = on_gpu.stats()["handoff"]
        assert st["to_decoder_rows"] == len(prompt) * weights.config.num_layers and st["bytes"] > 0
        assert vk_device.name in on_gpu.device_name and "emulated NPU" in on_gpu.device_name
    finally:
        vk.close()
