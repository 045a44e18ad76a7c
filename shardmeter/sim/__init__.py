"""Execution-graph simulation (paper §III-C, §IV-C/D): FSDP steps, blocking DiLoCo and
Streaming DiLoCo, bottleneck verdicts, traces and timelines."""
