"""The CPU stand-in for ``python -m torchtitan.train`` inside a rendered island pod.

torchtitan 0.3.0's trainer cannot train on a CPU-only torch (see docs/launch-local.md, "A launch that
trains"): ``torchtitan/tools/utils.py`` falls back to device type ``cuda`` when no accelerator
is present and ``FaultTolerantTrainer.__init__`` then calls ``torch.cuda.set_device``; and its
Llama 3 attention is FlexAttention (``sdpa`` is refused by
``models/common/config_utils.py``), which has no backward pass on CPU.

So this module keeps everything of torchtitan's fault-tolerant path that runs on a CPU and
replaces only the device-bound parts:

* the arguments (the pod's command line, as the operator rendered it) are parsed by
  torchtitan's own ``ConfigManager`` — ``--module``/``--config`` and every flag the operator
  appended;
* the torchft ``Manager`` is built by torchtitan's ``TorchFTManager`` from
  ``--fault_tolerance.*`` and the pod's environment (``TORCHFT_LIGHTHOUSE``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE`` from torchrun, ``TORCHFT_MANAGER_PORT``);
* the optimizer and learning-rate schedule are the config's (``TorchFTOptimizersContainer``);
* the data-parallel rank and degree come from ``TorchFTManager.get_dp_info`` and the gradient
  accumulation from torchtitan's formula ``global_batch_size // (local_batch_size × dp)``;
* Streaming DiLoCo is ``maybe_semi_sync_training`` — torchft's ``local_sgd.DiLoCo`` over the
  fragments of the config's ``fragment_fn`` (torchtitan's ``fragment_llm``);
* the metric lines (``step: … loss: … tps: … mfu: …`` every ``--metrics.log_freq`` steps) are
  printed by torchtitan's own ``MetricsProcessor.log`` from the config's ``metrics`` section,
  with its token count kept as torchtitan's ``batch_generator`` keeps it (``labels.numel()``
  per micro-batch) and its FLOPs per token from torchtitan's
  ``get_dense_model_nparams_and_flops``; only the device-memory monitor (CUDA-only) reads
  the process's peak RSS instead. The operator's log parser (``shardmeter_operator.observe.logparse``)
  is tested on these lines.

What is not torchtitan: the model (a Llama-shaped decoder, width 64, with the config's
vocabulary and layer count and the module names ``fragment_llm`` splits on, using
``scaled_dot_product_attention``) and the data (seeded arithmetic token sequences, one stream
per data-parallel rank, so the loss can fall). Nothing here reads a planned value from
anywhere but the command line and the environment of the pod.

Every line it prints for the test starts with ``[island]`` and holds ``key=value`` pairs
(``step_end`` carries ``step_s``, the step's own wall time, and ``optimizer_s``, the part of
it inside ``optimizers.step()`` — AdamW plus DiLoCo's hooks that prepare and sync fragments —
which the observation tests hold the parsed step times against).
"""

from __future__ import annotations

import logging
import math
import os
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

WIDTH = 64
HEADS = 4
CYCLE = 16


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim)
        self.w13 = nn.Linear(dim, 2 * 3 * dim, bias=False)
        self.w2 = nn.Linear(3 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(b, s, 3, self.heads, -1).unbind(2)
        att = functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.wo(att.transpose(1, 2).reshape(b, s, d))
        gate, up = self.w13(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w2(functional.silu(gate) * up)


class TinyDecoder(nn.Module):
    """Llama-shaped: ``tok_embeddings``, ``layers.N``, ``norm``, ``lm_head`` (the names
    torchtitan's ``fragment_llm`` splits a model on)."""

    def __init__(self, vocab_size: int, n_layers: int, seq_len: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, WIDTH)
        self.pos_embeddings = nn.Parameter(torch.randn(seq_len, WIDTH) * 0.02)
        self.layers = nn.ModuleList(_Block(WIDTH, HEADS) for _ in range(n_layers))
        self.norm = nn.RMSNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens) + self.pos_embeddings[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def token_batches(
    vocab_size: int, seq_len: int, batch: int, dp_rank: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Arithmetic sequences ``a, a+d, a+2d, … (mod CYCLE)`` over the first ``CYCLE`` token
    ids: learnable in a few steps (the loss falls well below ``ln(vocab)``), one seeded stream
    per data-parallel rank (so islands never see the same samples)."""
    cycle = min(CYCLE, vocab_size)
    gen = torch.Generator().manual_seed(1000 + dp_rank)
    positions = torch.arange(seq_len + 1)
    while True:
        start = torch.randint(0, cycle, (batch, 1), generator=gen)
        stride = torch.randint(1, 4, (batch, 1), generator=gen)
        seq = (start + stride * positions) % cycle
        yield seq[:, :-1], seq[:, 1:]


class CPUMemoryMonitor:
    """torchtitan's ``DeviceMemoryMonitor`` interface over this process's peak RSS (its own
    reads ``torch.cuda``): what ``MetricsProcessor.log`` prints as ``memory:``."""

    def __init__(self) -> None:
        from torchtitan.components.metrics import DeviceMemStats

        self.stats = DeviceMemStats
        self.device_name = "cpu"
        self.device_capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.device_capacity_gib = self.device_capacity / 2**30

    def get_peak_stats(self) -> Any:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        pct = 100 * peak / self.device_capacity
        return self.stats(peak / 2**30, pct, peak / 2**30, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        pass


def metrics_processor(config: Any, model: nn.Module, world: int) -> Any:
    """torchtitan's ``MetricsProcessor``, built from the config's ``metrics`` section as
    torchtitan's trainer builds it, with the CPU memory monitor."""
    from torchtitan.components import metrics
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.utils import get_dense_model_nparams_and_flops

    metrics.build_device_memory_monitor = CPUMemoryMonitor  # the device-bound part
    processor = config.metrics.build(
        parallel_dims=ParallelDims.from_config(config.parallelism, world),
        dump_folder=config.dump_folder,
        pp_schedule=config.parallelism.pipeline_parallel_schedule,
    )
    _, processor.num_flops_per_token = get_dense_model_nparams_and_flops(
        model,
        n_layers=len(model.layers),  # type: ignore[arg-type]
        n_heads=HEADS,
        head_dims=2 * (WIDTH // HEADS),
        seq_len=config.training.seq_len,
    )
    return processor


def say(**fields: Any) -> None:
    print("[island] " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    from torchtitan.config import ConfigManager
    from torchtitan.experiments.torchft.manager import maybe_semi_sync_training
    from torchtitan.tools.logging import init_logger, logger

    init_logger()  # torchtitan's: root logger at INFO on stdout (torchft's lines included)
    logging.getLogger("torchft").setLevel(logging.INFO)
    torch.manual_seed(0)  # identical initial weights on every island, as a seed checkpoint gives
    torch.set_num_threads(1)

    config: Any = ConfigManager().parse_args(sys.argv[1:] if argv is None else argv)
    ft, training = config.fault_tolerance, config.training
    dist.init_process_group("gloo")  # the island's own world (torchrun's env://)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 1:
        raise SystemExit(
            f"the CPU stand-in trains one process per island (no FSDP); WORLD_SIZE={world}"
        )
    ft_manager = ft.build()  # torchtitan's TorchFTManager → torchft.Manager
    dp_degree, dp_rank = ft_manager.get_dp_info(world, rank)
    global_batch = training.global_batch_size
    if global_batch < 0:
        global_batch = training.local_batch_size * dp_degree
    if global_batch % (training.local_batch_size * dp_degree):
        raise SystemExit(
            f"global batch size must be a multiple of local batch size times data-parallel "
            f"degree ({global_batch} % ({training.local_batch_size} * {dp_degree}) != 0)"
        )
    accumulation = global_batch // (training.local_batch_size * dp_degree)
    say(
        event="start",
        replica_id=ft.replica_id,
        group_size=ft.group_size,
        dp_rank=dp_rank,
        dp_degree=dp_degree,
        local_batch_size=training.local_batch_size,
        global_batch_size=global_batch,
        gradient_accumulation_steps=accumulation,
        seq_len=training.seq_len,
        steps=training.steps,
        semi_sync_method=ft.semi_sync_method,
        sync_steps=ft.sync_steps,
        num_fragments=ft.num_fragments,
        fragment_sync_delay=ft.fragment_sync_delay,
        process_group=ft.process_group,
        lighthouse=os.environ.get("TORCHFT_LIGHTHOUSE", ""),
        vocab_size=config.model_spec.model.vocab_size,
    )

    spec = config.model_spec.model
    model = TinyDecoder(spec.vocab_size, len(spec.layers), training.seq_len)
    optimizers = config.optimizer.build(model_parts=[model], ft_manager=ft_manager)
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=training.steps)
    data = token_batches(spec.vocab_size, training.seq_len, training.local_batch_size, dp_rank)
    metrics = metrics_processor(config, model, world)
    tokens_seen = 0
    manager = ft_manager.manager
    with maybe_semi_sync_training(
        ft,
        ft_manager=ft_manager,
        model=model,
        n_layers=len(model.layers),
        optimizer=optimizers,
        fragment_fn=getattr(config.model_spec, "fragment_fn", None),
    ) as diloco:
        fragments = getattr(diloco, "_fragments", [])
        for j, fragment in enumerate(fragments):
            names = sorted({n.split(".")[0] for n, _ in fragment._model_fragment.named_modules()})
            say(event="fragment", fragment=j, modules=",".join(n for n in names if n))
        logger.info("Training starts at step 1")  # torchtitan's line (Trainer.train)
        for step in range(1, training.steps + 1):
            say(event="step_begin", step=step)
            began = time.perf_counter()
            optimizers.zero_grad()
            lr = schedulers.schedulers[0].get_last_lr()[0]
            pairs = []
            for _ in range(accumulation):  # as torchtitan's batch_generator counts them
                loading = time.perf_counter()
                pairs.append(next(data))
                metrics.ntokens_since_last_log += pairs[-1][1].numel()
                metrics.data_loading_times.append(time.perf_counter() - loading)
            valid_tokens = sum(labels.numel() for _, labels in pairs)
            tokens_seen += valid_tokens
            loss_sum = 0.0
            for inputs, labels in pairs:
                logits = model(inputs)
                loss = functional.cross_entropy(
                    logits.flatten(0, 1).float(), labels.flatten(), reduction="sum"
                )
                (loss / valid_tokens).backward()
                loss_sum += loss.item()
                say(
                    event="micro_batch", step=step, sequences=inputs.shape[0], tokens=inputs.numel()
                )
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_norm)
            stepping = time.perf_counter()
            optimizers.step()  # DiLoCo's post-step hook prepares/syncs fragments here
            optimizer_s = time.perf_counter() - stepping
            schedulers.step()
            step_s = time.perf_counter() - began
            if metrics.should_log(step):  # torchtitan's own metric line
                loss = loss_sum / valid_tokens
                metrics.log(
                    step, loss, loss, grad_norm.item(), {"n_tokens_seen": tokens_seen, "lr": lr}
                )
            say(
                event="step_end",
                step=step,
                loss=f"{loss_sum / valid_tokens:.4f}",
                tokens=valid_tokens,
                manager_step=manager.current_step(),
                participants=manager.num_participants() if manager.current_step() else 0,
                step_s=f"{step_s:.6f}",
                optimizer_s=f"{optimizer_s:.6f}",
            )
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    say(event="done", steps=training.steps, perplexity=f"{math.exp(loss_sum / valid_tokens):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
