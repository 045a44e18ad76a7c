"""The only code that calls the Kubernetes API server.

* :mod:`.client` — the facade over the blocking ``kubernetes`` client (every call in a worker
  thread, with a timeout; one error type with the server's ``Retry-After``);
* :mod:`.children` — listing a plan's children and creating them by the launch's adoption rule;
* :mod:`.pods` — an island's pods and which runs rank 0; :mod:`.documents` — the pools'
  coefficients ConfigMaps;
* :mod:`.retry` — when a failed reconcile runs again; :mod:`.watchguard` — kopf's watch
  streams kept alive through removed CRDs and outages;
* :mod:`.permissions` — every permission these calls need (the chart's RBAC is generated
  from it).
"""
