"""What a launched plan tells torchtitan's fault-tolerant trainer, and what it cannot.

Pure functions over the TrainingPlan spec and the chosen plan (its status). The island Jobs
run ``torchrun … -m torchtitan.train --module M --config C`` from the user's template; the
operator appends the flags below to that command line (exec form) or hands them over in
``SHARDMETER_TORCHTITAN_ARGS`` (a ``sh -c`` script that ends with that variable).

Facts of torchtitan 0.3.0 this module relies on (paths inside the wheel):

* ``experiments/torchft/manager.py``: ``--fault_tolerance.replica_id`` is this island's index
  and ``--fault_tolerance.group_size`` the number of replica groups (islands);
  ``get_dp_info`` makes the data-parallel degree ``dp × group_size`` and the rank
  ``dp × replica_id + dp_rank``.
* ``experiments/torchft/trainer.py``: gradient accumulation =
  ``global_batch_size // (local_batch_size × dp × group_size)``, asserted to divide. Each
  island parses its own flags, so ``--training.global_batch_size`` is per island:
  ``micro × N·G × accumulation × islands`` gives every island its planned accumulation.
* ``torchft/local_sgd.py`` (torchft 0.2.0): DiLoCo averages the islands' pseudo-gradients
  unweighted (``Manager.allreduce`` divides by the participants); fragment ``j`` is synced
  at inner step ``(j+1)·H/F`` of every ``H`` and prepared ``fragment_sync_delay`` steps
  earlier; pseudo-gradients travel in the parameters' dtype (FP32) unless quantised.
* ``experiments/torchft/diloco/utils.py``: ``fragment_llm`` splits the model contiguously
  (embeddings with the first blocks, norm and head with the last).
* ``config/manager.py`` + tyro: the activation-checkpointing choice is a subcommand
  (``activation-checkpoint:full``) and must be the last argument.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from shardmeter.plan.schema import Runtime
from shardmeter.spec.training import (
    ActivationCheckpointing,
    AttentionKernel,
    GradientSync,
    ParamAllGather,
    Precision,
    Sharding,
    StrategyKind,
)
from shardmeter_operator.api import (
    DiLoCoSettings,
    FaultToleranceSpec,
    IslandStatus,
    Predictions,
    TrainingPlanSpec,
)
from shardmeter_operator.api.errors import RuntimeCannotExpressError, TemplateError

ARGS_ENV = "SHARDMETER_TORCHTITAN_ARGS"
"""The rendered flags, space-separated, for templates that run a shell script."""
MANAGER_PORT = 29512
"""``TORCHFT_MANAGER_PORT``: where each island's torchft manager listens (rank 0)."""
MIN_COLLECTIVE_TIMEOUT_S = 60
"""torchft's own default for its collectives and RPCs (``Manager(timeout=60 s)``)."""
COLLECTIVE_TIMEOUT_MARGIN = 4.0
"""Timeout / the outer all_reduce's predicted window."""
SHELLS = {"sh", "bash", "dash", "ash", "zsh"}

# Flags the operator sets from the plan; a template that sets one is refused.
OWNED_FLAGS = frozenset(
    {
        *(
            f"--fault_tolerance.{k}"
            for k in (
                "enable",
                "replica_id",
                "group_size",
                "min_replica_size",
                "process_group",
                "semi_sync_method",
                "sync_steps",
                "num_fragments",
                "fragment_sync_delay",
                "module_fqns_per_model_fragment",
                "process_group_timeout_ms",
                "should_quantize",
            )
        ),
        *(
            f"--training.{k}"
            for k in (
                "local_batch_size",
                "global_batch_size",
                "seq_len",
                "steps",
                "dtype",
                "mixed_precision_param",
            )
        ),
        "--compile.enable",
        "--compile.no_enable",
        *(
            f"--parallelism.{k}"
            for k in (
                "data_parallel_shard_degree",
                "data_parallel_replicate_degree",
                "tensor_parallel_degree",
                "pipeline_parallel_degree",
                "context_parallel_degree",
                "expert_parallel_degree",
            )
        ),
    }
)
ATTENTION_BACKEND = {AttentionKernel.FLEX: "flex"}
"""The planned kernel → the ``attn_backend`` torchtitan 0.3.0's Llama 3 model registry builds
(``shardmeter_torchtitan.config_registry.ATTENTION_BACKEND`` passes it; a test reads
torchtitan's registry and the built model to prove the two agree)."""
_ACTIVATION_CHECKPOINT = "activation-checkpoint:"
_MASTER_DTYPE = {4: "float32", 2: "bfloat16"}
_PARAM_DTYPE = {Precision.BF16: "bfloat16", Precision.FP32: "float32"}
_AC_MODE = {
    ActivationCheckpointing.NONE: "none",
    ActivationCheckpointing.FULL: "full",
    ActivationCheckpointing.SELECTIVE_OP: "selective",
}
"""torchtitan 0.3.0's activation-checkpointing subcommands (distributed/activation_checkpoint.py:
FullAC, op-level SelectiveAC; it has no every-k-th-block mode)."""


@dataclass(frozen=True)
class TorchtitanRun:
    """Everything the islands' command lines are rendered from."""

    islands: tuple[IslandStatus, ...]
    seq_len_tokens: int
    training_steps: int
    """Inner steps: the token budget over the islands' batch, rounded up to whole outer steps."""
    activation_checkpointing: str
    """torchtitan's subcommand: none, full or selective."""
    torch_compile: bool
    shard_group_nodes: int
    """hsdp: nodes per FSDP shard group (it divides every island's nodes, `torchtitan_run`
    checks); 0 for fsdp (one group, the island)."""
    master_dtype: str
    param_dtype: str
    diloco: DiLoCoSettings | None
    """None for FSDP (one island, no torchft)."""
    fault_tolerance: FaultToleranceSpec
    collective_timeout_s: int
    """For torchft's cross-island process group and manager: a margin over the window the
    plan gives a fragment's all_reduce (τ inner steps plus any predicted blocking)."""
    quantize_outer: bool = False
    """Pseudo-gradients all-reduced in FP8 (``outerPrecision: fp8``; torchft's
    ``should_quantize``)."""
    restart_alone: bool = False
    """A failed island is recreated alone (JobSet ``RestartJob``): the quorum needs one
    island fewer by default, so the others keep training while it recovers."""

    @property
    def min_replicas(self) -> int:
        if self.fault_tolerance.min_replicas:
            return self.fault_tolerance.min_replicas
        n = len(self.islands)
        return n - 1 if self.restart_alone and n > 1 else n


def torchtitan_run(
    spec: TrainingPlanSpec,
    islands: Sequence[IslandStatus],
    settings: DiLoCoSettings | None,
    predictions: Predictions | None,
    *,
    restart_alone: bool = False,
) -> TorchtitanRun:
    """The run the chosen plan describes (``restart_alone``: a failed island is recreated
    alone). Raises RuntimeCannotExpressError (naming the field) for training settings
    torchtitan 0.3.0 has no flag for."""
    if not islands:
        raise RuntimeCannotExpressError("status.islands", "the plan has no islands to launch")
    diloco = settings if spec.strategy.kind is not StrategyKind.FSDP else None
    if spec.strategy.kind is not StrategyKind.FSDP and diloco is None:
        raise RuntimeCannotExpressError("status.streamingDiLoCo", "a DiLoCo plan needs settings")
    t = spec.training
    refusals = [
        (
            t.grad_reduce_bytes != 4,
            "spec.training.gradReduceBytes",
            f"is {t.grad_reduce_bytes}, but torchtitan reduces gradients in FP32 only "
            "(--training.mixed_precision_reduce accepts float32); set it to 4",
        ),
        (
            t.master_param_bytes not in _MASTER_DTYPE,
            "spec.training.masterParamBytes",
            f"is {t.master_param_bytes}; torchtitan keeps parameters in float32 (4) or "
            "bfloat16 (2) (--training.dtype)",
        ),
        (
            t.precision not in _PARAM_DTYPE,
            "spec.training.precision",
            f"is {t.precision}: torchtitan 0.3.0 selects float8 in the config function "
            "(model converters), not by a flag; plan with bf16, or launch such a config yourself",
        ),
        (
            t.param_all_gather is ParamAllGather.FP32 and t.precision is not Precision.FP32,
            "spec.training.paramAllGather",
            f"is fp32 with precision {t.precision}: torchtitan's FSDP2 computes in the gathered "
            "dtype (--training.mixed_precision_param float32 is FP32 training; it has no "
            "autocast over FSDP), so FP32 gathers for bf16 compute cannot be launched; "
            "unset paramAllGather, or plan with precision: fp32",
        ),
        (
            t.attention_kernel not in ATTENTION_BACKEND,
            "spec.training.attentionKernel",
            f"is {t.attention_kernel}: torchtitan 0.3.0's Llama 3 runs FlexAttention "
            "(attn_backend 'flex', which the shardmeter_torchtitan configs pass; it refuses "
            "'sdpa', so cuDNN and FlashAttention-2 cannot be launched); plan with flex "
            "(the default)",
        ),
        (
            t.activation_checkpointing not in _AC_MODE,
            "spec.training.activationCheckpointing",
            f"is {t.activation_checkpointing}: torchtitan 0.3.0 checkpoints every block (full), "
            "by op (selective) or not at all (none); plan with one of full, selective-op, none",
        ),
        (
            t.gradient_sync is not GradientSync.EVERY_MICRO_BATCH,
            "spec.training.gradientSync",
            f"is {t.gradient_sync}: torchtitan's FSDP2 reduce-scatters after every micro-batch "
            "(it has no flag to skip it during accumulation); plan with every-micro-batch",
        ),
    ]
    for refused, field, message in refusals:
        if refused:
            raise RuntimeCannotExpressError(field, message)
    for k, isl in enumerate(islands):  # hsdp: the planner proposes only whole shard groups
        problem = t.shard_group_problem(isl.nodes)
        if problem is not None:
            raise RuntimeCannotExpressError(
                "spec.training.shardGroupNodes",
                f"{problem} (island {k}, {isl.name}): torchtitan's data_parallel_shard_degree × "
                f"data_parallel_replicate_degree would not cover its {isl.nodes * isl.gpus_per_node}"
                " GPUs; plan again with this shardGroupNodes",
            )
    window_s = predictions.outer_step_blocking_seconds if predictions else 0.0
    if diloco is not None and predictions is not None:
        window_s += diloco.fragment_sync_delay * predictions.step_seconds
    floor = spec.fault_tolerance.collective_timeout_s or MIN_COLLECTIVE_TIMEOUT_S
    timeout_s = max(floor, math.ceil(COLLECTIVE_TIMEOUT_MARGIN * window_s))
    batch_tokens = sum(i.local_batch_tokens for i in islands)
    steps = math.ceil(t.total_tokens / batch_tokens)
    if diloco is not None:
        steps = math.ceil(steps / diloco.sync_every) * diloco.sync_every
    return TorchtitanRun(
        islands=tuple(islands),
        seq_len_tokens=t.seq_len_tokens,
        training_steps=steps,
        activation_checkpointing=_AC_MODE[t.activation_checkpointing],
        torch_compile=t.torch_compile,
        shard_group_nodes=t.shard_group_nodes if t.sharding is Sharding.HSDP else 0,
        master_dtype=_MASTER_DTYPE[t.master_param_bytes],
        param_dtype=_PARAM_DTYPE[t.precision],
        diloco=diloco,
        fault_tolerance=spec.fault_tolerance,
        collective_timeout_s=timeout_s,
        quantize_outer=spec.strategy.outer_precision is Precision.FP8 and diloco is not None,
        restart_alone=restart_alone,
    )


def check_expressible(run: TorchtitanRun, spec: TrainingPlanSpec) -> None:
    """Refuse (RuntimeCannotExpressError naming the field) a plan torchtitan-FT would run differently from
    the plan: unequal local batches (torchft averages pseudo-gradients unweighted, so an island
    with a bigger batch would count as much as a smaller one), a quorum larger than the plan,
    a fragment layout or outer precision torchft does not have."""
    if spec.runtime is not Runtime.TORCHTITAN_FT:
        raise RuntimeCannotExpressError(
            "spec.runtime",
            f"is {spec.runtime.value}: the plan may give islands unequal local batches weighted by "
            "tokens, but the launched runtime (torchtitan with torchft) averages pseudo-gradients "
            "unweighted; set runtime: torchtitan-ft (the default) to plan a run it can launch",
        )
    first = run.islands[0]
    for k, isl in enumerate(run.islands[1:], start=1):
        if isl.local_batch_tokens != first.local_batch_tokens:
            raise RuntimeCannotExpressError(
                f"status.islands[{k}].localBatchTokens",
                f"is {isl.local_batch_tokens:,} tokens but island 0 ({first.name}) trains on "
                f"{first.local_batch_tokens:,}: torchtitan's fault-tolerant trainer averages the "
                "islands' pseudo-gradients unweighted (torchft DiLoCo), so every island needs the "
                "same local batch. Plan for that runtime (equal local batches), or restrict "
                "spec.pools / spec.constraints to one island shape",
            )
    if run.diloco is None:
        if len(run.islands) != 1:
            raise RuntimeCannotExpressError(
                "spec.strategy.kind", "fsdp launches exactly one island"
            )
        return
    if run.min_replicas > len(run.islands):
        raise RuntimeCannotExpressError(
            "spec.faultTolerance.minReplicas",
            f"is {run.min_replicas} but the plan has {len(run.islands)} island(s): no quorum "
            "could ever form; lower it or leave it unset (every island)",
        )
    if run.diloco.fragments > 1 and spec.strategy.fragment_layout != "contiguous":
        raise RuntimeCannotExpressError(
            "spec.strategy.fragmentLayout",
            f"is {spec.strategy.fragment_layout}, but torchtitan's fragment_llm splits the model "
            "into contiguous fragments; plan with fragmentLayout: contiguous",
        )
    if spec.strategy.outer_precision not in (Precision.FP32, Precision.FP8):
        raise RuntimeCannotExpressError(
            "spec.strategy.outerPrecision",
            f"is {spec.strategy.outer_precision}, but torchft 0.2.0's DiLoCo all-reduces "
            "pseudo-gradients in the parameters' dtype (FP32 master weights), or quantised to "
            "FP8 with a scale per row (torchtitan --fault_tolerance.should_quantize; "
            "torchft/quantization.py): plan with outerPrecision fp32 or fp8",
        )


def island_flags(run: TorchtitanRun, index: int, replica_id: str | None = None) -> list[str]:
    """The torchtitan flags of island ``index``, in the order they are appended (the
    activation-checkpointing subcommand last, as tyro requires). ``replica_id`` replaces the
    island's index in ``--fault_tolerance.replica_id`` (a JobSet's replicated Job passes
    ``$(SHARDMETER_ISLAND_ID)``, which the kubelet expands per pod)."""
    isl = run.islands[index]
    replicas = len(run.islands) if run.diloco is not None else 1
    dp = isl.nodes * isl.gpus_per_node
    group = run.shard_group_nodes or isl.nodes  # hsdp: shard inside node groups
    flags: list[str] = []
    if run.diloco is not None:
        d = run.diloco
        flags += [
            "--fault_tolerance.enable",
            f"--fault_tolerance.replica_id={index if replica_id is None else replica_id}",
            f"--fault_tolerance.group_size={replicas}",
            f"--fault_tolerance.min_replica_size={run.min_replicas}",
            f"--fault_tolerance.process_group={run.fault_tolerance.process_group}",
            f"--fault_tolerance.process_group_timeout_ms={run.collective_timeout_s * 1000}",
            "--fault_tolerance.semi_sync_method=diloco",
            f"--fault_tolerance.sync_steps={d.sync_every}",
            f"--fault_tolerance.num_fragments={d.fragments}",
            f"--fault_tolerance.fragment_sync_delay={d.fragment_sync_delay}",
        ]
        if run.quantize_outer:  # torchft's row-wise FP8 all_reduce of the pseudo-gradients
            flags.append("--fault_tolerance.should_quantize")
    flags += [
        f"--parallelism.data_parallel_shard_degree={group * isl.gpus_per_node}",
        f"--parallelism.data_parallel_replicate_degree={isl.nodes // group}",
        f"--training.local_batch_size={isl.micro_batch}",
        f"--training.global_batch_size={isl.micro_batch * dp * isl.accumulation * replicas}",
        f"--training.seq_len={run.seq_len_tokens}",
        f"--training.steps={run.training_steps}",
        f"--training.dtype={run.master_dtype}",
        f"--training.mixed_precision_param={run.param_dtype}",
        "--compile.enable" if run.torch_compile else "--compile.no-enable",
        _ACTIVATION_CHECKPOINT + run.activation_checkpointing,
    ]
    return flags


def island_env(
    run: TorchtitanRun,
    index: int,
    *,
    lighthouse: str,
    job_id: str,
    replica_id: str | None = None,
) -> list[dict[str, Any]]:
    """Environment for every container of island ``index``: the flags for shell templates
    and, for DiLoCo, torchft's lighthouse address, manager port and timeouts."""
    flags = island_flags(run, index, replica_id)
    # The script expands $SHARDMETER_TORCHTITAN_ARGS unquoted: the shell splits it on spaces
    # and removes no quotes, so every flag must be one plain word (a `$(VAR)` in it is
    # expanded by the kubelet before the shell runs).
    unsafe = [f for f in flags if any(c in f for c in " \t\n'\"\\*?[")]
    if unsafe:
        raise ValueError(f"flags a shell cannot take word by word: {unsafe}")
    env = [{"name": ARGS_ENV, "value": " ".join(flags)}]
    if run.diloco is not None:
        env += [
            {"name": "TORCHFT_LIGHTHOUSE", "value": lighthouse},
            {"name": "TORCHFT_MANAGER_PORT", "value": str(MANAGER_PORT)},
            {
                "name": "TORCHFT_QUORUM_TIMEOUT_SEC",
                "value": str(run.fault_tolerance.quorum_timeout_s),
            },
            {"name": "TORCHFT_TIMEOUT_SEC", "value": str(run.collective_timeout_s)},
            {"name": "JOB_ID", "value": job_id},
        ]
    return env


def dns_searches(run: TorchtitanRun, namespace: str) -> list[str]:
    """Search domains that make every island pod's bare hostname resolvable from the others.

    torchft advertises ``socket.gethostname()`` (manager.py ``hostname=``,
    checkpointing/http_transport.py) and islands heal from each other at step 0 through that
    address; an Indexed Job pod's hostname is ``<job>-<index>``, an A record only under its
    own island's headless Service (``subdomain``)."""
    if run.diloco is None:
        return []
    domain = run.fault_tolerance.cluster_domain
    return [f"{isl.name}.{namespace}.svc.{domain}" for isl in run.islands]


# ---- the template's trainer container ---------------------------------------------------------
@dataclass(frozen=True)
class TrainerCommand:
    """How the trainer container's command line can take the flags."""

    tokens: list[str]
    """Its words (a shell script split with shlex)."""
    shell: bool
    """``sh -c SCRIPT``: flags reach it through ``$SHARDMETER_TORCHTITAN_ARGS``."""
    field: str
    """Where it is, as the user wrote it."""


def _script(container: Mapping[str, Any], where: str) -> tuple[str, str] | None:
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command or PurePosixPath(command[0]).name not in SHELLS or "-c" not in command:
        return None
    at = command.index("-c")
    if at + 1 < len(command):
        return command[at + 1], f"{where}.command[{at + 1}]"
    if args:
        return args[0], f"{where}.args[0]"
    raise TemplateError(f"{where}.command", "runs a shell with -c but no script")


def trainer_command(template: Mapping[str, Any], where: str = "spec.template") -> TrainerCommand:
    """The first container's command line (the trainer; GPUs go to it). Raises SpecError
    naming the field when it cannot carry torchtitan's flags."""
    containers = template.get("spec", {}).get("template", {}).get("spec", {}).get("containers")
    path = f"{where}.spec.template.spec.containers[0]"
    first = containers[0] if isinstance(containers, list) and containers else {}
    command, args = first.get("command") or [], first.get("args") or []
    if not command and not args:
        raise TemplateError(
            f"{path}.command",
            "is empty: the operator appends torchtitan's flags to the trainer's command line; "
            "set command to torchrun … -m torchtitan.train --module M --config C",
        )
    script = _script(first, path)
    if script is not None:
        text, field = script
        try:
            tokens = shlex.split(text, comments=True)
        except ValueError as exc:
            raise TemplateError(field, f"is not a valid shell command line ({exc})") from exc
        if not tokens or tokens[-1] not in {f"${ARGS_ENV}", f"${{{ARGS_ENV}}}"}:
            raise TemplateError(
                field,
                f"a shell script must end with ${ARGS_ENV} (unquoted) so the operator's "
                "torchtitan flags come last, e.g. `… -m torchtitan.train --module M "
                f"--config C ${ARGS_ENV}`",
            )
        return TrainerCommand(tokens, True, field)
    return TrainerCommand([str(t) for t in [*command, *args]], False, f"{path}.args")


def _flag_name(token: str) -> str:
    """``--training.local-batch-size=8`` → ``--training.local_batch_size`` (tyro takes both)."""
    if not token.startswith("--"):
        return token
    return "--" + token[2:].split("=", 1)[0].replace("-", "_")


def check_trainer_template(template: Mapping[str, Any], where: str = "spec.template") -> None:
    """The trainer runs torchtitan 0.3.0 (``--module``/``--config``, no ``--job.config_file``)
    and leaves every flag the plan decides to the operator."""
    cmd = trainer_command(template, where)
    names = {_flag_name(t) for t in cmd.tokens}
    if "--job.config_file" in names:
        raise TemplateError(
            cmd.field,
            "uses --job.config_file, which torchtitan 0.3.0 removed; select the config with "
            "--module M --config C (e.g. --module shardmeter_torchtitan --config llama3_8b_torchft)",
        )
    for required in ("--module", "--config"):
        if required not in names:
            raise TemplateError(
                cmd.field,
                f"has no {required}: torchtitan 0.3.0 requires --module and --config "
                "(e.g. --module shardmeter_torchtitan --config llama3_8b_torchft)",
            )
    owned = sorted(n for n in names if n in OWNED_FLAGS)
    owned += sorted(t for t in cmd.tokens if t.startswith(_ACTIVATION_CHECKPOINT))
    if owned:
        raise TemplateError(
            cmd.field,
            f"sets {', '.join(owned)}, which the operator sets from the plan; remove "
            + ("it" if len(owned) == 1 else "them"),
        )


def append_flags(container: dict[str, Any], flags: Sequence[str]) -> None:
    """Put the flags on an exec-form trainer command line (after everything else: tyro reads
    the activation-checkpointing subcommand last). A shell script reads them from the env."""
    if _script(container, "") is None:
        container["args"] = [*(container.get("args") or []), *flags]


def apply_to_island_job(
    job: dict[str, Any],
    run: TorchtitanRun,
    index: int,
    *,
    namespace: str,
    lighthouse: str,
    job_id: str,
    replica_id: str | None = None,
    searches: Sequence[str] | None = None,
) -> None:
    """Give a rendered island Job its runtime: torchft's environment on every container, the
    flags on the trainer's command line, DNS searches for the peers' hostnames (default:
    every island's Service, :func:`dns_searches`)."""
    pod = job["spec"]["template"]["spec"]
    env = island_env(run, index, lighthouse=lighthouse, job_id=job_id, replica_id=replica_id)
    names = {e["name"] for e in env}
    for container in pod["containers"]:
        kept = [e for e in container.get("env") or [] if e.get("name") not in names]
        container["env"] = [*kept, *env]
    append_flags(pod["containers"][0], island_flags(run, index, replica_id))
    searches = list(dns_searches(run, namespace) if searches is None else searches)
    if searches:
        dns = dict(pod.get("dnsConfig") or {})
        dns["searches"] = [*(dns.get("searches") or []), *searches]
        pod["dnsConfig"] = dns
