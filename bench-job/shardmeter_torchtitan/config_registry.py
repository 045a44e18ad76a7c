"""Fault-tolerant torchtitan 0.3.0 configs for the Llama 3 models a TrainingPlan launches.

torchtitan 0.3.0 ships one fault-tolerant config, ``torchft.llama3``'s
``llama3_torchft_debugmodel``; its real recipes (``torchtitan.models.llama3``:
``llama3_8b``, ``llama3_70b``, ``llama3_405b``) build a plain ``Trainer.Config`` whose model
spec has no ``fragment_fn``, so ``--fault_tolerance.*`` flags are rejected and Streaming
DiLoCo could not split the model. These functions take those recipes unchanged (optimizer,
schedule, data, checkpoint interval, activation checkpointing) and make them fault-tolerant
the way ``llama3_torchft_debugmodel`` is:

* ``FaultTolerantTrainer.Config`` (it has the ``fault_tolerance`` section),
* the torchft experiment's ``FaultTolerantModelSpec`` (``fragment_fn=fragment_llm``),
* ``TorchFTOptimizersContainer`` and ``TorchFTCheckpointManager`` (replica-aware state),
* ``fault_tolerance`` enabled with DiLoCo over NCCL.

The attention backend is passed explicitly (``ATTENTION_BACKEND``, torchtitan's own default for
Llama 3): the planner prices ``attentionKernel: flex`` for it, and the operator refuses to
launch a plan priced with any other kernel.

The operator appends the planned batch, sequence, steps and DiLoCo flags to the command line
(torchtitan's ``ConfigManager``: CLI flags override these defaults).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from torchtitan.experiments.torchft.checkpoint import TorchFTCheckpointManager
from torchtitan.experiments.torchft.config.job_config import FaultTolerance
from torchtitan.experiments.torchft.llama3 import model_registry
from torchtitan.experiments.torchft.optimizer import TorchFTOptimizersContainer
from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer
from torchtitan.models.llama3 import config_registry as llama3
from torchtitan.trainer import Trainer

__all__ = [
    "ATTENTION_BACKEND",
    "fault_tolerant",
    "llama3_8b_torchft",
    "llama3_70b_torchft",
    "llama3_405b_torchft",
]


ATTENTION_BACKEND = "flex"
"""``attn_backend`` of every config here: FlexAttention, what ``model_registry`` defaults to."""


def _fields(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config) if f.init}


def fault_tolerant(base: Trainer.Config, flavor: str) -> FaultTolerantTrainer.Config:
    """``base`` (a torchtitan Llama 3 recipe) as a fault-tolerant config for ``flavor``."""
    checkpoint = _fields(base.checkpoint)
    return FaultTolerantTrainer.Config(
        **{
            **_fields(base),
            "model_spec": model_registry(flavor, attn_backend=ATTENTION_BACKEND),
            "optimizer": TorchFTOptimizersContainer.Config(**_fields(base.optimizer)),
            "checkpoint": TorchFTCheckpointManager.Config(**checkpoint),
            "fault_tolerance": FaultTolerance(
                enable=True, semi_sync_method="diloco", process_group="nccl"
            ),
        }
    )


def llama3_8b_torchft() -> FaultTolerantTrainer.Config:
    """torchtitan's ``llama3_8b`` recipe (Llama-3.1-8B), fault-tolerant."""
    return fault_tolerant(llama3.llama3_8b(), "8B")


def llama3_70b_torchft() -> FaultTolerantTrainer.Config:
    """torchtitan's ``llama3_70b`` recipe (Llama-3.1-70B), fault-tolerant."""
    return fault_tolerant(llama3.llama3_70b(), "70B")


def llama3_405b_torchft() -> FaultTolerantTrainer.Config:
    """torchtitan's ``llama3_405b`` recipe (Llama-3.1-405B), fault-tolerant."""
    return fault_tolerant(llama3.llama3_405b(), "405B")
