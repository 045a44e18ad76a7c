"""Test support for ShardMeter: an in-memory Kubernetes API server and helpers to use it.

* :mod:`support.kube_emulator` — :class:`~support.kube_emulator.KubeEmulator`, a subclass of
  ``kmock.KubernetesEmulator`` that behaves enough like a real API server for kopf and kubectl.
* :mod:`support.cluster` — context managers, kubectl wrappers and the kopf login handler.
"""
