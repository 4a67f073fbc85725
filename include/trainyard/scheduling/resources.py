"""resources.yaml -> GPU types, Airflow pools, and the checks a JobSpec must pass against them."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard.errors import spec_error_message
from trainyard.spec import JobSpec, SpecError

POOL_PREFIX = "gpu-"


class GpuType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    count: int = Field(ge=1)
    price_per_hour: float = Field(ge=0.0)
    description: str = ""
    node_selector: dict[str, str] = {}


class Team(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    description: str = ""


class ResourcesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu_types: dict[str, GpuType]
    teams: dict[str, Team] = {"default": Team()}


def default_config_dir() -> Path:
    return Path(os.environ.get("TRAINYARD_CONFIG_DIR", Path(__file__).resolve().parents[2] / "config"))


def load_resources(path: str | os.PathLike | None = None) -> ResourcesConfig:
    import yaml

    path = Path(path) if path else default_config_dir() / "resources.yaml"
    try:
        return ResourcesConfig.model_validate(yaml.safe_load(path.read_text()))
    except ValidationError as err:
        raise ValueError(f"{path}: {err}") from None


def pool_name(gpu_type: str) -> str:
    return f"{POOL_PREFIX}{gpu_type}"


def pools(config: ResourcesConfig) -> dict[str, dict]:
    """Airflow pools, in the shape `airflow pools import` reads."""
    return {
        pool_name(name): {
            "slots": gpu.count,
            "description": f"{gpu.description or name}: {gpu.count} GPU(s) at {gpu.price_per_hour}/GPU-hour",
            "include_deferred": True,
        }
        for name, gpu in sorted(config.gpu_types.items())
    }


def check_spec(spec: JobSpec, config: ResourcesConfig) -> None:
    """Refuse a job that could never be scheduled: Airflow never runs a task whose pool_slots exceed
    the pool's size, it would wait forever instead."""
    res = spec.resources
    if res.gpu_type not in config.gpu_types:
        raise SpecError(
            spec_error_message(
                [f"resources.gpu_type: unknown GPU type {res.gpu_type!r}; allowed: {sorted(config.gpu_types)}"]
            )
        )
    if res.team not in config.teams:
        raise SpecError(
            spec_error_message([f"resources.team: unknown team {res.team!r}; allowed: {sorted(config.teams)}"])
        )
    size = config.gpu_types[res.gpu_type].count
    if res.total_gpus > size:
        raise SpecError(
            spec_error_message(
                [
                    f"resources.gpus_per_node: the job needs {res.total_gpus} {res.gpu_type} GPU(s) "
                    f"(nodes x gpus_per_node) but pool {pool_name(res.gpu_type)!r} has only {size}"
                ]
            )
        )


def run_cost(config: ResourcesConfig, gpu_type: str, gpu_seconds: float) -> float:
    """Cost of a run = price per GPU-hour x GPU-hours, where ``gpu_seconds`` sums hours x GPUs over every
    try (``trainyard.training.usage.gpu_seconds``)."""
    return config.gpu_types[gpu_type].price_per_hour * gpu_seconds / 3600.0
