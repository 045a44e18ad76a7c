"""Pure builders of every object the operator creates: plain dicts, no API calls.

Where a launched plan's objects come from — one entry point, :func:`.launch.launch_manifests`:
the torchft lighthouse (:mod:`.lighthouse`), then each island as an Indexed Job from the
user's template (:mod:`.island`) with torchtitan's flags (:mod:`.torchtitan`) — or all islands
as one JobSet (:mod:`.jobset`) — queued in Kueue when asked (:mod:`.kueue`). A GPUPool's
objects (coefficients ConfigMap, the benchmark's Role and Job): :mod:`.benchmark`. Shared:
labels and owner references (:mod:`.labels`), names the API server accepts (:mod:`.names`),
what every Indexed Job has (:mod:`.pods`), stable hashes (:mod:`.revisions`).
"""
