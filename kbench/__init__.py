"""kbench: correctness and speed of GPU compute kernels on every Vulkan device."""

__version__ = "0.1.0"
