"""Typed input specifications: models, hardware, training and strategy (pydantic v2)."""

from shardmeter.spec.base import SpecModel
from shardmeter.spec.hardware import GPUSpec, LinkKind, LinkSpec
from shardmeter.spec.model import MLPKind, TransformerSpec
from shardmeter.spec.pool import PoolSpec
from shardmeter.spec.precision import Precision
from shardmeter.spec.training import StrategyKind, StrategySpec, TrainingSpec

__all__ = [
    "GPUSpec",
    "LinkKind",
    "LinkSpec",
    "MLPKind",
    "PoolSpec",
    "Precision",
    "SpecModel",
    "StrategyKind",
    "StrategySpec",
    "TrainingSpec",
    "TransformerSpec",
]
