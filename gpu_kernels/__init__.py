"""Block gather/scatter between an engine's paged KV and the store's contiguous chunks (CUDA or torch)."""

from gpu_kernels.dispatch import active_backend, gather_blocks, scatter_blocks

__all__ = ["active_backend", "gather_blocks", "scatter_blocks"]
