"""Reading the pools' coefficients documents from their ConfigMaps (the operator namespace)."""

from __future__ import annotations

from shardmeter.cost.coefficients import CoefficientsDocument
from shardmeter.errors import SpecError
from shardmeter_operator.config import OperatorConfig
from shardmeter_operator.k8s.client import Kube
from shardmeter_operator.render.benchmark import coefficients_configmap_name


async def read_documents(
    names: list[str], cfg: OperatorConfig, kube: Kube
) -> tuple[dict[str, CoefficientsDocument | None], list[str]]:
    """Each pool's coefficients document as its ConfigMap holds it (None: missing or
    unreadable, with a note)."""
    docs: dict[str, CoefficientsDocument | None] = {}
    notes: list[str] = []
    for name in names:
        cm = await kube.get("v1", "ConfigMap", cfg.namespace, coefficients_configmap_name(name))
        doc = None
        if cm is not None:
            try:
                doc = CoefficientsDocument.from_configmap_data(cm.get("data"), name)
            except SpecError as exc:
                notes.append(
                    f"pool {name}: unreadable coefficients ({exc}); using datasheet priors"
                )
        docs[name] = doc
    return docs, notes
