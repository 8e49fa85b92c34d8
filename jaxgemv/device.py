"""Device facts the planner needs, read per device at lowering time.

Facts are never cached process-wide: a process may hold GPUs of different kinds, and a lowering
reads the devices it is compiled for.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the planner may know about the device a product runs on."""

    platform: str  # "cpu" or "cuda"
    compute_capability: tuple[int, int] = (0, 0)
    sm_count: int = 1


CPU_FACTS = DeviceFacts("cpu")


def facts_of(device: jax.Device) -> DeviceFacts:
    """Reads one device's facts."""
    if device.platform == "cpu":
        return CPU_FACTS
    cc = getattr(device, "compute_capability", "0.0")
    major, _, minor = str(cc).partition(".")
    sm_count = int(getattr(device, "core_count", 0) or 0)
    if sm_count <= 0:
        raise RuntimeError(f"jaxgemv: device {device} does not report its multiprocessor count")
    return DeviceFacts("cuda", (int(major), int(minor or 0)), sm_count)


def combine(facts: Sequence[DeviceFacts]) -> DeviceFacts:
    """One plan serves every device of a computation: take what all of them can do.

    The kernels are compiled for every architecture we ship, so the lowest compute capability
    decides the eligible variants and the smallest SM count decides the wave arithmetic.
    """
    first = facts[0]
    return DeviceFacts(
        first.platform,
        min(f.compute_capability for f in facts),
        min(f.sm_count for f in facts),
    )


def facts_for_lowering(ctx, platform: str) -> DeviceFacts:
    """The facts of the devices a lowering targets (its device assignment when known)."""
    if platform == "cpu":
        return CPU_FACTS
    devices = getattr(ctx.module_context.axis_context, "device_assignment", None)
    if not devices:
        backend = ctx.module_context.get_backend(optional=True)
        devices = backend.local_devices() if backend is not None else jax.local_devices(backend="gpu")
    devices = [d for d in devices if d.platform != "cpu"]
    if not devices:
        raise RuntimeError("jaxgemv: lowering for CUDA but no GPU device is visible")
    return combine([facts_of(d) for d in devices])
