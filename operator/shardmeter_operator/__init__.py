"""The ShardMeter Kubernetes operator (kopf).

Top to bottom (the import contracts in pyproject.toml hold these layers):

* :mod:`.__main__` (flags, ``kopf.run``) and :mod:`.handlers` (kopf's wiring: watch events
  to the controller);
* :mod:`.controller` — one reconcile at a time per object, requeues, the only status writer;
  :mod:`.events` (Events through the status) and :mod:`.metrics` (gauges from the status);
* :mod:`.gpupool` and :mod:`.trainingplan` — read → decide → apply of the two kinds;
* :mod:`.launch` (a launched plan's state machine, workload, following) and :mod:`.observe`
  (reading the running islands);
* :mod:`.k8s` — the only code that calls the API server;
* :mod:`.render` — pure builders of every object the operator creates;
* :mod:`.decision` — the types a decision reads and returns; :mod:`.api` — the custom
  resources; :mod:`.config`, :mod:`.worker` (the planning thread), :mod:`.log`.
"""
