"""An in-memory Kubernetes API server for tests: kmock's emulator, good enough for kopf & kubectl.

``kmock.KubernetesEmulator`` (kmock 0.8) stores objects in memory and serves them over HTTP, but
it is a loose mock: objects have no ``resourceVersion``/``uid``/``generation``, there is no PUT,
no optimistic concurrency, no label/field selectors, no status subresource, watches replay
everything as ``application/octet-stream``, CRDs do not register their resources, the core
discovery reports ``groupVersion: "/v1"``, and ``/api/v1/namespaces`` cannot even be parsed.
:class:`KubeEmulator` keeps kmock's machinery (the request log, ``emu.objects`` with histories,
``emu.resources``, discovery and the ``emu[...] << payload`` reactions) and replaces the object
API with stricter semantics:

* every write goes through one synchronous path (:meth:`KubeEmulator._commit`): a global,
  monotonic ``resourceVersion``; ``uid``/``creationTimestamp``/``generation`` on create;
  ``generation`` bumps only when something other than ``metadata``/``status`` changes;
  no-op writes change nothing; stale ``resourceVersion`` → 409 Conflict, duplicates → 409
  AlreadyExists, misses → 404 NotFound, all as proper ``Status`` bodies;
* PUT, and PATCH as merge-patch, JSON-patch (incl. ``test`` → 422), strategic-merge-patch
  (merge-patch plus merging by ``name`` for ``containers``/``env``/``volumes``/… and the
  ``$patch``/``$retainKeys``/``$deleteFromPrimitiveList`` directives; 415 for custom resources,
  as in Kubernetes), and a simplified server-side apply (create, or merge-patch the intent);
* the ``status`` subresource is separated from the main resource; the objects of a deleted
  owner are garbage-collected (by ``ownerReferences[].uid``, and the content of a deleted
  namespace); finalizers postpone deletion (``deletionTimestamp``) until they are removed;
* lists have ``kind``/``apiVersion``/``metadata.resourceVersion``, label & field selectors,
  ``limit``/``continue``, and ``meta.k8s.io/v1`` Tables (for ``kubectl get``) with the CRDs'
  ``additionalPrinterColumns``;
* watches are newline-delimited ``application/json``, start after ``resourceVersion`` (or with
  ADDED events for the existing objects), honour selectors and ``timeoutSeconds``, support
  ``sendInitialEvents`` and send a final BOOKMARK when ``allowWatchBookmarks=true``;
* a created/updated/deleted CustomResourceDefinition (un)registers its served versions, so they
  appear in discovery and can be used; all served versions share the objects (no conversion);
  the ``default`` values of the CRD schemas are applied; builtins come from kmock's bundled list;
* every write is admitted as kube-apiserver admits it (``KubeEmulator._admit``): Kubernetes' own
  schemas for built-in kinds (kubernetes-validate, strict) and their name rules, label and
  annotation limits, 3 MiB request bodies; for custom resources pruning of unknown fields,
  schema defaults, OpenAPI validation and CEL rules (cel-python); structural CRDs only;
* ``/openapi/v3`` lists the operations, so ``kubectl apply`` validates strictly (server-side).
* Job pods as the Job controller makes them (``create_job_pod``) and the ``pods/log``
  subresource serving the logs a test sets (``set_pod_log``; ``tailLines``, ``limitBytes``,
  ``container``, ``previous`` and kube-apiserver's refusals), in ``podlogs``.

Requests intercepted by user reactions (``emu['patch', kmock.resource('batch/v1/jobs')] << 500``)
are answered by kmock's DSL and change no state — handy for fault injection. Not emulated:
admission webhooks, quotas and PodSecurity (see ``reject_job_pods``), CEL cost limits, protobuf, field managers, Foreground deletion (treated
as Background), immutable fields, the namespace lifecycle (objects may be created in any
namespace), ``core/v1`` and ``events.k8s.io/v1`` Events as one resource, ``scale``, ``Table``
watches (``kubectl get -w``), authentication (any token is accepted).
All state changes are synchronous (no awaits), so they are atomic in the event loop; call the
Python API (``emu.create()``, ``emu.set_job_succeeded()``…) from the loop's thread only.

Run it standalone (e.g. for black-box tests) from the ``tests`` directory::

    python -m support.kube_emulator --port 0 --kubeconfig /tmp/kubeconfig [--crds ../crds]

It writes the kubeconfig once the server listens, then prints ``READY <url>``; SIGTERM stops it.
"""

# The package is split by topic; everything the single module used to expose is re-exported:
#   resources  — type aliases, well-known resources, version ordering, API paths, timestamps
#   errors     — ``Status`` errors and their HTTP responses
#   patches    — merge-patch, strategic-merge-patch, JSON-patch
#   selectors  — label & field selectors
#   tables     — printer columns: JSONPath, ages, ``meta.k8s.io/v1`` Tables
#   crds       — CRD validation, registration of served versions, schema defaults
#   discovery  — ``/api``, ``/apis``, ``/version`` (overrides of kmock's hooks)
#   handlers   — the aiohttp entry point, routing, the object API over HTTP
#   watches    — watch events and watch-streams
#   conveniences — the Python helpers for tests (apply, set_job_succeeded, api_requests…)
#   podlogs    — Job pods and the ``pods/log`` subresource
#   emulator   — :class:`KubeEmulator`: its state, the object API in Python, the write path
#   runner     — the kubeconfig, the standalone server and its command line

from support.kube_emulator.crds import CRD_VERBS, apply_schema_defaults
from support.kube_emulator.emulator import SYSTEM_FIELDS, KubeEmulator
from support.kube_emulator.errors import api_error
from support.kube_emulator.handlers import logger
from support.kube_emulator.patches import MERGED_BY_NAME, merge_patch, strategic_merge_patch
from support.kube_emulator.resources import (
    CRD,
    DEFAULT_NAMESPACES,
    JOBS,
    NAMESPACES,
    SKIPPED_GROUPS,
    Body,
    ObjectKey,
    now_iso,
    parse_api_path,
    version_priority,
)
from support.kube_emulator.runner import main, serve, write_kubeconfig
from support.kube_emulator.selectors import (
    field_selector_matcher,
    label_selector_matcher,
    lookup,
    split_selector,
)
from support.kube_emulator.tables import human_age, jsonpath
from support.kube_emulator.watches import WatchEvent

__all__ = [
    "CRD",
    "CRD_VERBS",
    "DEFAULT_NAMESPACES",
    "JOBS",
    "MERGED_BY_NAME",
    "NAMESPACES",
    "SKIPPED_GROUPS",
    "SYSTEM_FIELDS",
    "Body",
    "KubeEmulator",
    "ObjectKey",
    "WatchEvent",
    "api_error",
    "apply_schema_defaults",
    "field_selector_matcher",
    "human_age",
    "jsonpath",
    "label_selector_matcher",
    "logger",
    "lookup",
    "main",
    "merge_patch",
    "now_iso",
    "parse_api_path",
    "serve",
    "split_selector",
    "strategic_merge_patch",
    "version_priority",
    "write_kubeconfig",
]
