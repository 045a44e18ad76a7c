"""ShardMeter: a performance model for FSDP and (Streaming) DiLoCo training.

The package is pure Python + numpy + scikit-learn + pydantic. It never imports kopf,
kubernetes, torch or prometheus_client (a test enforces it).
"""

__version__ = "0.1.0"
