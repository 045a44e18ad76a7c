"""The ShardMeter Kubernetes operator (kopf)."""
