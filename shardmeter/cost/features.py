"""Static features of one FSDP unit's forward or backward pass (paper §III-B).

Every feature is a product of shape parameters for a micro-batch of ``b`` sequences of
``s`` tokens (``t = b·s`` tokens). The regression ``T = Σ c_f · f`` uses a subset of these,
chosen by cross-validation; coefficients are seconds per feature unit.

=============  =========================  ===============================================
feature        value                      what it stands for
=============  =========================  ===============================================
``t_h_q``      t · h · q_dim              Q and output projections
``t_h_kv``     t · h · kv_dim             K and V projections (grouped-query attention)
``t_h_i``      t · mlp_mats · h · i       the MLP matrices (3 gated, 2 plain)
``t_s_q``      t · s · q_dim              attention scores and weighted sum (QKᵀ, AV)
``t_h``        t · h                      norms, residuals, rotary embedding
``t_i``        t · i                      MLP activation function
``t_h_v``      t · h · V                  LM head matmul
``t_v``        t · V                      softmax / cross-entropy over the vocabulary
``v_h``        V · h                      embedding/LM-head weights and their gradient buffer
``p_block``    block matmul weights       a block's weights and weight-gradient buffers
``v_h_tied``   V · h if tied, else 0      summing a tied matrix's embedding and head gradients
``p_local``    parameters per rank        optimizer step (memory bound)
``one``        1                          launch overhead
=============  =========================  ===============================================
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import numpy.typing as npt

from shardmeter.spec.model import TransformerSpec


class Target(StrEnum):
    """A timed quantity with its own regression."""

    BLOCK_FORWARD = "block.forward"
    BLOCK_BACKWARD = "block.backward"
    EMBEDDING_FORWARD = "embedding.forward"
    EMBEDDING_BACKWARD = "embedding.backward"
    HEAD_FORWARD = "head.forward"
    HEAD_BACKWARD = "head.backward"
    OPTIMIZER_STEP = "optimizer.step"

    @property
    def unit(self) -> str:
        return self.value.split(".")[0]


_BLOCK = ("t_h_q", "t_h_kv", "t_h_i", "t_s_q", "t_h", "t_i", "one", "p_block")
CANDIDATE_FEATURES: dict[Target, tuple[str, ...]] = {
    Target.BLOCK_FORWARD: _BLOCK,
    Target.BLOCK_BACKWARD: _BLOCK,
    Target.EMBEDDING_FORWARD: ("t_h", "one"),
    Target.EMBEDDING_BACKWARD: ("t_h", "v_h", "one", "v_h_tied"),
    Target.HEAD_FORWARD: ("t_h_v", "t_v", "t_h", "one", "v_h"),
    Target.HEAD_BACKWARD: ("t_h_v", "t_v", "t_h", "one", "v_h"),
    Target.OPTIMIZER_STEP: ("p_local", "one"),
}
"""The candidate features of each target, in a fixed order (the columns of X)."""


def feature_values(
    spec: TransformerSpec, micro_batch: float, seq_len: float, params_local: float = 0.0
) -> dict[str, float]:
    """All features for one micro-batch; ``params_local`` feeds ``p_local`` only."""
    t = float(micro_batch) * float(seq_len)
    h, i, v = float(spec.hidden_size), float(spec.intermediate_size), float(spec.vocab_size)
    return {
        "t_h_q": t * h * spec.q_dim,
        "t_h_kv": t * h * spec.kv_dim,
        "t_h_i": t * spec.mlp_matrices * h * i,
        "t_s_q": t * float(seq_len) * spec.q_dim,
        "t_h": t * h,
        "t_i": t * i,
        "t_h_v": t * h * v,
        "t_v": t * v,
        "v_h": v * h,
        "v_h_tied": v * h if spec.tie_embeddings else 0.0,
        "p_block": float(spec.matmul_params_per_block),
        "p_local": float(params_local),
        "one": 1.0,
    }


def design_row(
    target: Target,
    spec: TransformerSpec,
    micro_batch: float,
    seq_len: float,
    params_local: float = 0.0,
) -> npt.NDArray[np.float64]:
    """One row of the design matrix for ``target`` (candidate-feature order)."""
    values = feature_values(spec, micro_batch, seq_len, params_local)
    return np.array([values[f] for f in CANDIDATE_FEATURES[target]], dtype=np.float64)
