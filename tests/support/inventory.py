"""Accelerators as a node's discovery reports them, for tests of what a worker gets."""

from __future__ import annotations

from shared.messages import Accelerator


def nvidia_gpus(count: int, model: str = "A100") -> tuple[Accelerator, ...]:
    """`count` whole GPUs, gpu0.., index i, UUID GPU-i (what CUDA_VISIBLE_DEVICES names)."""
    return tuple(
        Accelerator(
            id=f"gpu{i}",
            kind="gpu",
            vendor="nvidia",
            model=model,
            memory_bytes=1,
            compute_units=108,
            index=i,
            uuid=f"GPU-{i}",
        )
        for i in range(count)
    )
