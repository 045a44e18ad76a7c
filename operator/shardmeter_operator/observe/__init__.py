"""Observing running islands — how observed step times reach a pool:

1. :mod:`.read` reads rank 0's log of each running island (or Prometheus: :mod:`.prometheus`);
2. :mod:`.logparse` parses torchtitan's and torchft's lines, :mod:`.summary` turns them into
   an island's observation (step times, throughput, syncs);
3. :mod:`.evaluate` holds them against the model: drift, the samples of the pool's observed
   correction, the outer step re-checked; :mod:`.record` writes the plan's status;
4. the samples go to the pool's reconcile: :mod:`shardmeter_operator.gpupool.correction`.
"""
