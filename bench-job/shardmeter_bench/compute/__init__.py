"""How a forward/backward time is measured: the seeded catalog of shapes (`catalog`, with the
memory estimate that bounds it on a CPU, `footprint`), the profiled model (`blocks`), the
hook-driven ranges that time each unit (`profiling`), and the batch sweep over the catalog
that turns them into compute, memory and optimizer-step samples (`sweep`)."""
