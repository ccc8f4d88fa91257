"""Scheduling policy as plain frozen data (parsed from gpud.toml by gpud.config)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SchedConfig:
    default_partition: str = "gpu"
    default_account: str = "default"
    default_qos: str = "normal"
    default_mem_mb: int = 1024
