"""How collectives are benchmarked: all_gather, reduce_scatter and all_reduce timed over
payloads and process groups inside and across nodes (`timing`), on ranks from a launcher or
spawned locally (`distributed`, which every multi-rank phase of a run uses)."""
