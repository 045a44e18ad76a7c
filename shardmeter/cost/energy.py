"""Power, energy and CO₂ of GPUs in training (the paper's outlook, §VII).

**Power of one GPU** while its island trains::

    P = P_static + (P_limit − P_static) · u

* P_limit — the pool's ``powerCapWatts``, else the board's TDP (``GPUSpec.tdp_watts``, the
  datasheet figure). Training compute runs power-limited: `shardmeter.cost.power` models the
  clock that holds the board at its limit, so while the compute stream is busy the board
  draws its limit;
* P_static = ``GPUSpec.static_power_fraction`` × TDP — the draw that does not scale with the
  SM clock (leakage, HBM, I/O), the same share the power-cap model uses; an idle or
  communication-only GPU draws about this;
* u — the compute stream's busy share of the island's step (its *utilisation*), from the
  simulated FSDP step (`shardmeter.sim.fsdp.StepResult.compute_busy_s` ÷ ``step_s``).

GPUs of ``exclusiveNodes`` that an island leaves unused draw P_static. **Facility energy** =
GPU energy × the site's PUE; **CO₂e** = facility energy × the site's grid carbon intensity.
Not counted: host CPUs, NICs and switches (an underestimate of a node's draw by roughly a
fifth on HGX servers), embodied emissions, and the WAN.
"""

from __future__ import annotations

from shardmeter.spec.hardware import GPUSpec
from shardmeter.spec.pool import PoolHardware

WATT_HOURS_PER_KWH = 1000.0
GRAMS_PER_KG = 1000.0


def power_limit_watts(gpu: GPUSpec, power_cap_watts: float | None) -> float:
    """The board's limit: the lowest of the TDP, the GPU variant's ``power_limit_watts`` and
    the pool's cap."""
    return gpu.power_limit(power_cap_watts)


def static_power_watts(gpu: GPUSpec) -> float:
    """What the board draws at any clock: ``static_power_fraction`` × TDP."""
    return gpu.static_power_fraction * gpu.tdp_watts


def gpu_power_watts(gpu: GPUSpec, power_cap_watts: float | None, utilisation: float) -> float:
    """Average draw of one training GPU whose compute stream is busy ``utilisation`` of the
    time (clamped to [0, 1])."""
    u = min(max(utilisation, 0.0), 1.0)
    static = static_power_watts(gpu)
    return static + (power_limit_watts(gpu, power_cap_watts) - static) * u


def facility_kwh(gpu_watts: float, hours: float, pue: float) -> float:
    """Energy at the site's meter for ``gpu_watts`` drawn for ``hours``."""
    return gpu_watts * hours * pue / WATT_HOURS_PER_KWH


def co2_kg(kwh: float, grid_carbon_intensity_g_per_kwh: float) -> float:
    """kg CO₂e of ``kwh`` from a grid of that intensity."""
    return kwh * grid_carbon_intensity_g_per_kwh / GRAMS_PER_KG


def islands_facility_watts(
    pool: PoolHardware, islands: int, nodes: int, ranks: int, utilisation: float
) -> float:
    """Facility power of ``islands`` islands of ``nodes`` nodes and ``ranks`` GPUs each of
    ``pool`` while they train: their GPUs at `gpu_power_watts`, with ``exclusiveNodes`` the
    nodes' unused GPUs at their static draw, × the site's PUE. The one rule for plans
    (`shardmeter.plan.options`) and simulations."""
    gpus = islands * ranks
    idle = islands * nodes * pool.gpus_per_node - gpus if pool.exclusive_nodes else 0
    draw = gpu_power_watts(pool.gpu, pool.power_cap_watts, utilisation)
    return (gpus * draw + idle * static_power_watts(pool.gpu)) * pool.pue
