"""Names and label values the API server accepts, for every object the operator creates.

A TrainingPlan or GPUPool name is a DNS-1123 *subdomain* (up to 253 characters, dots, a
leading digit); the children's names are stricter: a Service name is a DNS-1035 *label*
(≤ 63, starts with a letter), an Indexed Job's ``<name>-<index>`` becomes its pods' hostname
(a DNS-1123 label, so the name keeps room for the index: ``INDEXED_JOB_NAME_MAX``), and a label
value is ≤ 63 characters. :func:`child_name` keeps a name unchanged when it is already valid
and otherwise shortens only the owner's part and appends a stable hash of the owner's full
name, so distinct owners never share a child name and the same owner always gets the same one.
"""

from __future__ import annotations

import hashlib
import re

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
INDEXED_JOB_NAME_MAX = 52
"""63 minus ``-`` and up to 10 digits of a completion index: any Indexed Job's pods fit."""
LABEL_VALUE_MAX = 63
HASH_LENGTH = 8

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def stable_hash(text: str, length: int = HASH_LENGTH) -> str:
    """A short, stable hex digest (the same in every process and release)."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def is_valid(name: str, *, max_len: int = DNS_LABEL_MAX, dns1035: bool = True) -> bool:
    """Whether ``name`` is a DNS-1035 label (or, with ``dns1035=False``, a DNS-1123 label) of
    at most ``max_len`` characters."""
    pattern = _DNS1035 if dns1035 else _DNS1123_LABEL
    return len(name) <= max_len and bool(pattern.fullmatch(name))


def _sanitize(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def child_name(
    prefix: str,
    owner: str,
    suffix: str = "",
    *,
    max_len: int = DNS_LABEL_MAX,
    dns1035: bool = True,
) -> str:
    """``<prefix>-<owner>-<suffix>`` (empty parts left out) as a valid label-like name.

    ``prefix`` and ``suffix`` are the operator's own (lowercase, valid); ``owner`` is the user's
    object name. When the joined name is invalid or too long, the owner part is sanitised,
    shortened, and followed by a hash of the full owner name; a leading non-letter gets an
    ``x`` in front when ``dns1035`` (Services). Raises ValueError if even that cannot fit."""
    plain = "-".join(p for p in (prefix, owner, suffix) if p)
    if is_valid(plain, max_len=max_len, dns1035=dns1035):
        return plain
    fixed = len(prefix) + 1 if prefix else 0
    fixed += len(suffix) + 1 if suffix else 0
    room = max_len - fixed - HASH_LENGTH - 1
    stem = _sanitize(owner)
    if dns1035 and not prefix and not stem[:1].isalpha():
        stem = "x" + stem if stem else "x"
    stem = stem[: max(room, 0)].rstrip("-")
    if room < 0 or (dns1035 and not prefix and not stem):
        raise ValueError(f"no room for a name with prefix {prefix!r} and suffix {suffix!r}")
    name = "-".join(p for p in (prefix, stem, stable_hash(owner), suffix) if p)
    if not is_valid(name, max_len=max_len, dns1035=dns1035):
        raise ValueError(f"cannot make a valid name from {plain!r}")
    return name


def subdomain_name(prefix: str, owner: str) -> str:
    """``<prefix>-<owner>`` as a DNS-1123 subdomain (ConfigMaps, Roles): long owners are
    shortened and hashed as in :func:`child_name`."""
    plain = f"{prefix}-{owner}"
    if len(plain) <= DNS_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(plain):
        return plain
    return child_name(prefix, owner, max_len=DNS_SUBDOMAIN_MAX, dns1035=False)


def label_value(value: str) -> str:
    """``value`` as a label value (≤ 63 characters): unchanged when it fits, else shortened
    with a hash of the whole value. Select by the object's UID label where exactness matters."""
    if len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value):
        return value
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[: LABEL_VALUE_MAX - HASH_LENGTH - 1]
    stem = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", stem)
    return f"{stem}-{stable_hash(value)}" if stem else stable_hash(value)
