"""PATCH bodies: JSON merge-patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch."""

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from support.kube_emulator.errors import api_error
from support.kube_emulator.resources import Body

MERGED_BY_NAME = {
    "containers",
    "initContainers",
    "ephemeralContainers",
    "env",
    "volumes",
    "volumeMounts",
    "volumeDevices",
    "imagePullSecrets",
}  # strategic-merge lists


def apply_patch(old: Body, patch: Any, content_type: str, *, custom: bool) -> Body:
    """The patched object by the patch's content type (415 for an unsupported one).

    ``custom``: whether it is a custom resource, which has no strategic merge patch.
    """
    if content_type == "application/json-patch+json" and isinstance(patch, list):
        try:
            return jsonpatch.apply_patch(old, patch, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            raise api_error(422, "Invalid", f"the JSON patch cannot be applied: {e}") from e
    elif content_type == "application/merge-patch+json" and isinstance(patch, dict):
        return merge_patch(old, patch)
    elif content_type == "application/strategic-merge-patch+json" and isinstance(patch, dict):
        if custom:
            raise api_error(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an "
                "unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        return strategic_merge_patch(old, patch)
    else:
        raise api_error(415, "UnsupportedMediaType", f"unsupported patch: {content_type!r}")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge-patch: dicts merge recursively, ``None`` deletes, the rest replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A practical subset of the strategic merge patch (None means ``$patch: delete``)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "delete":
        return None
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = copy.deepcopy(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [item for item in result.get(field, []) if item not in value]
        elif key.startswith("$"):  # $setElementOrder/…, $retainKeys, $patch: ordering/pruning hints
            continue
        elif value is None:
            result.pop(key, None)
        elif (
            key in MERGED_BY_NAME and isinstance(value, list) and isinstance(result.get(key), list)
        ):
            result[key] = _merge_lists_by_name(result[key], value)
        elif (merged := strategic_merge_patch(result.get(key), value)) is None:
            result.pop(key, None)
        else:
            result[key] = merged
    if isinstance(patch.get("$retainKeys"), list):
        result = {k: v for k, v in result.items() if k in patch["$retainKeys"]}
    return result


def _merge_lists_by_name(old: list[Any], new: list[Any]) -> list[Any]:
    if not all(isinstance(item, Mapping) and "name" in item for item in [*old, *new]):
        return copy.deepcopy(new)
    items = {item["name"]: item for item in old}
    for item in new:
        merged = strategic_merge_patch(items.get(item["name"]), item)
        if merged is None:
            items.pop(item["name"], None)
        else:
            items[item["name"]] = merged
    return list(items.values())
