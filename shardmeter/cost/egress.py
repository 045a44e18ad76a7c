"""WAN egress of DiLoCo's outer all_reduce between sites.

The outer all_reduce runs as a ring ordered by site (`shardmeter.sim.outer`): with M islands
every edge of the ring carries ``2·(M − 1)/M`` × the payload per outer step (reduce-scatter
then all-gather, 1/M of the payload per hop), and each site sends out over exactly one edge
to the next site. So per outer step each site of a plan that spans sites sends
``2·(M − 1)/M × payload`` bytes out of its uplink — billed at its ``wanEgressUsdPerGB``. A
plan at one site sends nothing over a WAN. Clouds bill decimal gigabytes (10⁹ bytes).
"""

from __future__ import annotations

from collections.abc import Iterable

from shardmeter.spec.pool import PoolSpec

BYTES_PER_GB = 1e9


def egress_bytes_per_site(payload_bytes: float, islands: int) -> float:
    """Bytes one site sends out per outer step (see the module docstring)."""
    if islands <= 1:
        return 0.0
    return 2.0 * (islands - 1) / islands * payload_bytes


def site_egress_usd_per_gb(pools: Iterable[PoolSpec]) -> dict[str, float]:
    """Each site's egress price: the dearest its pools state (a site has one uplink)."""
    out: dict[str, float] = {}
    for p in pools:
        out[p.site] = max(out.get(p.site, 0.0), p.wan_egress_usd_per_gb)
    return out


def run_egress(
    payload_bytes: float,
    islands: int,
    outer_steps: float,
    sites: Iterable[str],
    prices: dict[str, float],
) -> tuple[float, float]:
    """(GB, USD) leaving the ``sites`` of a plan over ``outer_steps`` outer steps; nothing
    when the plan is at one site."""
    used = sorted(set(sites))
    if len(used) < 2:
        return 0.0, 0.0
    per_site_gb = egress_bytes_per_site(payload_bytes, islands) * outer_steps / BYTES_PER_GB
    return per_site_gb * len(used), per_site_gb * sum(prices.get(s, 0.0) for s in used)


__all__ = [
    "BYTES_PER_GB",
    "egress_bytes_per_site",
    "run_egress",
    "site_egress_usd_per_gb",
]
