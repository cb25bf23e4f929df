"""Prices and cost maths of a run: what one accelerator-hour costs, and how measured seconds become USD.

Used before and during the run (the canary's projection, :mod:`batch_inference.projection`, and the in-run budget
stop, :mod:`batch_inference.budget`) and after it (the cost report, :mod:`batch_inference.report`), so
all three price the same seconds the same way.

Prices: every default (:data:`DEFAULT_PRICES`) carries its source and the date it was taken. They are
list prices for one region and drift over time: pass your own ``spot_usd_per_gpu_hour`` /
``on_demand_usd_per_gpu_hour`` in ``cost_params`` for anything that matters (a negotiated contract,
another region or cloud). A "GPU-hour" here is one accelerator held for one hour *including its share
of the host VM* (vCPUs, memory) that the cloud bundles with it, because that is what a GPU pod pays for.
The ``cpu`` entry is one whole 2-vCPU / 8 GiB machine per hour (local runs and CPU-only workers count one
"device" each).

Cost maths: seconds x devices x $/device-hour, split by stage, and the on-demand/spot counterfactual.
The report prices what the workers measured (``stage_seconds`` of the shard markers, summed over
attempts, so time lost to preemptions is paid for) plus the publish task's seconds. Pod scheduling and
image pulls happen before the worker starts and are not measured, so they are not priced.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from batch_contract.engine_config import ConfigError

PRICES_TAKEN_ON = "2026-11-30"
"""Date the defaults below were looked up (UTC)."""

PRICING_MODES = ("spot", "on_demand")


@dataclass(frozen=True)
class AcceleratorPrice:
    """List prices of one accelerator type, in USD per device-hour.

    Attributes:
        spot_usd_per_hour: spot / preemptible price per device-hour (USD).
        on_demand_usd_per_hour: on-demand price per device-hour (USD).
        source: where the figures come from (URL and what was read there, or how it was derived).
        taken_on: date the figures were looked up (ISO date).
    """

    spot_usd_per_hour: float
    on_demand_usd_per_hour: float
    source: str
    taken_on: str = PRICES_TAKEN_ON


DEFAULT_PRICES: dict[str, AcceleratorPrice] = {
    "nvidia-l4": AcceleratorPrice(
        spot_usd_per_hour=0.30,
        on_demand_usd_per_hour=0.75,
        source=(
            "on-demand: GCP g2-standard-4 (1x L4) ~$0.70-0.80/h, midpoint taken, from "
            "https://costnimbus.com/article/gpu-cost-management-ml-teams ('Current GPU Pricing Reality "
            "(March 2026)'); spot: on-demand x (1 - 0.60), the smallest Spot discount (60-91%) stated on "
            "https://cloud.google.com/spot-vms/pricing, i.e. an upper bound"
        ),
    ),
    "nvidia-a100-80gb": AcceleratorPrice(
        spot_usd_per_hour=0.86,
        on_demand_usd_per_hour=2.15,
        source=(
            "spot: 'A100 80GB at $0.86/hr spot' from https://aiapiplaybook.com/blog/"
            "gpu-cloud-pricing-2026-a100-vs-h100-vs-serverless-inference-compared (2026-01-15, market "
            "survey, not one cloud's sheet); on-demand: spot / (1 - 0.60), the smallest Spot discount on "
            "https://cloud.google.com/spot-vms/pricing"
        ),
    ),
    "nvidia-h100-80gb": AcceleratorPrice(
        spot_usd_per_hour=2.25,
        on_demand_usd_per_hour=3.00,
        source=(
            "GCP A3-High per GPU-hour: on-demand ~$3.00, spot ~$2.25, from "
            "https://costnimbus.com/article/gpu-cost-management-ml-teams ('Current GPU Pricing Reality "
            "(March 2026)')"
        ),
    ),
    "cpu": AcceleratorPrice(
        spot_usd_per_hour=0.0268,
        on_demand_usd_per_hour=0.067,
        source=(
            "one 2 vCPU / 8 GiB machine (GCE e2-standard-2 shape). spot: 2 x $0.00872 per vCPU-hour + "
            "8 x $0.001169 per GiB-hour, E2 Spot rates listed on https://cloud.google.com/spot-vms/pricing; "
            "on-demand: e2-standard-2 us-central1 list price on "
            "https://cloud.google.com/compute/vm-instance-pricing"
        ),
    ),
}
"""Defaults per accelerator type (Kubernetes-style names as in GKE's ``cloud.google.com/gke-accelerator``)."""


@dataclass(frozen=True)
class CostParams:
    """How to price one run; built from the ``cost_params`` dict by :func:`cost_params_from_dict`.

    Attributes:
        accelerator: accelerator type, a key of :data:`DEFAULT_PRICES` unless both prices are given.
        gpu_count: accelerators held by each shard's worker (pod); cost scales linearly with it.
        pricing: ``spot`` or ``on_demand``: which price the run actually paid.
        spot_usd_per_gpu_hour: spot price per accelerator-hour (USD); default from :data:`DEFAULT_PRICES`.
        on_demand_usd_per_gpu_hour: on-demand price per accelerator-hour (USD); default likewise.
        publish_usd_per_hour: price of the machine running the publish task (USD/hour); default: the
            ``cpu`` on-demand price (Airflow workers are ordinary on-demand machines).
        price_source: where the accelerator prices came from (the default's source, or ``user``).
        price_taken_on: date of the default prices, or ``""`` when the user gave both prices.
    """

    accelerator: str = "cpu"
    gpu_count: int = 1
    pricing: str = "spot"
    spot_usd_per_gpu_hour: float = 0.0
    on_demand_usd_per_gpu_hour: float = 0.0
    publish_usd_per_hour: float = 0.0
    price_source: str = ""
    price_taken_on: str = ""

    @property
    def usd_per_gpu_hour(self) -> float:
        """The price actually paid per accelerator-hour (USD), per :attr:`pricing`."""
        return self.spot_usd_per_gpu_hour if self.pricing == "spot" else self.on_demand_usd_per_gpu_hour

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


ALIASES = {
    "gpu_hour_usd_spot": "spot_usd_per_gpu_hour",
    "gpu_hour_usd_on_demand": "on_demand_usd_per_gpu_hour",
}
"""Accepted alternative key names (the DAG Params' names) -> canonical ``cost_params`` keys."""

_USER_KEYS = {
    "accelerator",
    "gpu_count",
    "pricing",
    "spot_usd_per_gpu_hour",
    "on_demand_usd_per_gpu_hour",
    "publish_usd_per_hour",
}


def _price(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"cost_params.{key}: {value!r} is not a number >= 0 (USD per hour)")
    return float(value)


def cost_params_from_dict(data: dict[str, Any] | None) -> CostParams:
    """Validate a ``cost_params`` dict and fill defaults from :data:`DEFAULT_PRICES`.

    Args:
        data: keys ``accelerator`` (default ``cpu``), ``gpu_count`` (int >= 1, default 1), ``pricing``
            (``spot`` | ``on_demand``, default ``spot``), and optional overrides
            ``spot_usd_per_gpu_hour``, ``on_demand_usd_per_gpu_hour``, ``publish_usd_per_hour`` (USD/h);
            the DAG Params' names ``gpu_hour_usd_spot`` / ``gpu_hour_usd_on_demand`` are accepted too.
            ``None`` means all defaults.

    Returns:
        The validated :class:`CostParams`.

    Raises:
        ConfigError: an unknown key, a bad value, or an accelerator without default prices whose two
            prices were not both given (the message names the key and the known accelerators).
    """
    data = dict(data or {})
    for alias, key in ALIASES.items():
        if alias in data:
            if key in data:
                raise ConfigError(f"cost_params: give {key} or its alias {alias}, not both")
            data[key] = data.pop(alias)
    unknown = sorted(set(data) - _USER_KEYS)
    if unknown:
        raise ConfigError(f"cost_params: unknown key(s) {unknown}; known keys are {sorted(_USER_KEYS)}")
    accelerator = str(data.get("accelerator", "cpu"))
    gpu_count = data.get("gpu_count", 1)
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1:
        raise ConfigError(f"cost_params.gpu_count: {gpu_count!r} is not an integer >= 1")
    pricing = data.get("pricing", "spot")
    if pricing not in PRICING_MODES:
        raise ConfigError(f"cost_params.pricing: {pricing!r} is not one of {list(PRICING_MODES)}")
    default = DEFAULT_PRICES.get(accelerator)
    given = {k: _price(data[k], k) for k in ("spot_usd_per_gpu_hour", "on_demand_usd_per_gpu_hour") if k in data}
    if default is None and len(given) < 2:
        raise ConfigError(
            f"cost_params.accelerator: {accelerator!r} has no default prices (known: "
            f"{sorted(DEFAULT_PRICES)}); give spot_usd_per_gpu_hour and on_demand_usd_per_gpu_hour"
        )
    user_priced = len(given) == 2
    publish = data.get("publish_usd_per_hour", DEFAULT_PRICES["cpu"].on_demand_usd_per_hour)
    return CostParams(
        accelerator=accelerator,
        gpu_count=gpu_count,
        pricing=pricing,
        spot_usd_per_gpu_hour=given.get("spot_usd_per_gpu_hour", default.spot_usd_per_hour if default else 0.0),
        on_demand_usd_per_gpu_hour=given.get(
            "on_demand_usd_per_gpu_hour", default.on_demand_usd_per_hour if default else 0.0
        ),
        publish_usd_per_hour=_price(publish, "publish_usd_per_hour"),
        price_source="user" if user_priced else ("user + " if given else "") + default.source,
        price_taken_on="" if user_priced else default.taken_on,
    )

PER_MILLION = 1_000_000
"""Units per million (``*_per_million_*`` figures)."""


def per_million(cost_usd: float, count: int | float) -> float | None:
    """``cost_usd / count * 1e6`` (USD per million units), or ``None`` when ``count`` is 0."""
    return cost_usd / count * PER_MILLION if count else None


def worker_cost(seconds: float, params: CostParams, usd_per_gpu_hour: float | None = None) -> float:
    """USD for ``seconds`` of one worker holding ``params.gpu_count`` accelerators.

    Args:
        seconds: worker wall-clock seconds.
        params: cost parameters.
        usd_per_gpu_hour: price override (default: the price paid, ``params.usd_per_gpu_hour``).
    """
    rate = params.usd_per_gpu_hour if usd_per_gpu_hour is None else usd_per_gpu_hour
    return seconds * params.gpu_count * rate / 3600.0


def cost_by_stage(stage_seconds: dict[str, float], publish_seconds: float, params: CostParams) -> dict[str, float]:
    """USD by stage: worker stages at the accelerator price, ``publish`` at the publish machine price."""
    out = {stage: worker_cost(sec, params) for stage, sec in stage_seconds.items()}
    out["publish"] = publish_seconds * params.publish_usd_per_hour / 3600.0
    return out


def pricing_counterfactuals(
    worker_seconds: float, publish_usd: float, rows: int, params: CostParams
) -> dict[str, Any]:
    """The same measured seconds priced spot and on-demand.

    Returns:
        ``{"spot": {...}, "on_demand": {...}}``, each ``{"cost_usd", "cost_per_million_rows_usd",
        "delta_vs_actual_usd"}`` (positive delta: that mode would have cost more).
    """
    actual = worker_cost(worker_seconds, params) + publish_usd
    out: dict[str, Any] = {}
    for mode, rate in (("spot", params.spot_usd_per_gpu_hour), ("on_demand", params.on_demand_usd_per_gpu_hour)):
        cost = worker_cost(worker_seconds, params, rate) + publish_usd
        out[mode] = {
            "cost_usd": cost,
            "cost_per_million_rows_usd": per_million(cost, rows),
            "delta_vs_actual_usd": cost - actual,
        }
    return out
