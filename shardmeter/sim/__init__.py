"""Execution-graph simulation (paper §III-C, §IV-C/D): FSDP steps, blocking DiLoCo and
Streaming DiLoCo, bottleneck verdicts (their traces and timelines are drawn by
``shardmeter.output``)."""
