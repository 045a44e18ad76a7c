"""How much host or device memory one training iteration of a shape holds at its peak: the
bound that keeps CPU runs inside a memory budget (``--max-memory-gib``) instead of letting
the kernel's OOM killer end them.

The estimate is deliberately generous (it is a budget, not a prediction): weights and
their gradients, every activation a block saves for backward, the logits with their FP32
copy, log-softmax and gradient, and the largest transient of the backward pass. Checked
against the measured peak RSS of the CPU runs (`benchmarks/bench_compute_memory.py`).
"""

from __future__ import annotations

from shardmeter.spec.model import TransformerSpec

ACTIVATION_ELEMENTS_PER_TOKEN_H = 14
"""Per block and token: norms' inputs and outputs, residuals, attention output and the
rotary copies, in units of the hidden size (generous; measured ~10 on CPU)."""
ACTIVATION_ELEMENTS_PER_TOKEN_I = 5
"""Per block and token: gate, up, activation, product and the down projection's input."""
LOGITS_COPIES = 5
"""Logits, their FP32 copy, log-softmax, its gradient and the logits' gradient."""
PROCESS_BASE_BYTES = 0.5 * 2**30
"""torch, transformers and the interpreter before any model exists (0.22 GiB measured)."""


def iteration_bytes(
    spec: TransformerSpec,
    layers: int,
    micro_batch: int,
    seq_len: int,
    element_bytes: int = 4,
) -> float:
    """Peak bytes of one forward + backward of ``layers`` blocks with embedding and head,
    gradients kept (weights, gradients, saved activations, logits and transients)."""
    params = spec.params_embedding + spec.params_head + layers * spec.params_per_block
    tokens = micro_batch * seq_len
    per_block_token = (
        ACTIVATION_ELEMENTS_PER_TOKEN_H * spec.hidden_size
        + 2 * spec.q_dim
        + 4 * spec.kv_dim
        + ACTIVATION_ELEMENTS_PER_TOKEN_I * spec.intermediate_size
    )
    attention_scores = micro_batch * spec.num_attention_heads * seq_len * seq_len
    activations = layers * tokens * per_block_token + attention_scores
    logits = LOGITS_COPIES * tokens * spec.vocab_size
    # the largest transient of backward: a weight gradient being formed before it is
    # accumulated (the embedding's dense V·h gradient, or one block's); a tied matrix holds
    # the head's gradient, the embedding's and their sum at once (measured: a tied h2304
    # V100352 catalog shape peaks at 5.4 GiB, Llama-3.2-1B at 2 layers at 5.4 GiB)
    embedding_grads = (3 if spec.tie_embeddings else 1) * spec.vocab_size * spec.hidden_size
    transient = max(spec.params_per_block, embedding_grads)
    return float(element_bytes * (2 * params + activations + transient) + 4 * logits)


def process_bytes(
    spec: TransformerSpec, layers: int, micro_batch: int, seq_len: int, element_bytes: int = 4
) -> float:
    """`iteration_bytes` plus what the process holds before any model exists."""
    return PROCESS_BASE_BYTES + iteration_bytes(spec, layers, micro_batch, seq_len, element_bytes)
