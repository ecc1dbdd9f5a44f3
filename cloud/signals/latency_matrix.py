"""Round-trip times between Google Cloud regions: the measured matrix, with distance-based
values for the regions it lacks. This is data (a signal); request latency per node is
estimated from it in ``cloud.green.latency``.

Measured: `umassos_raw_gcp_latency.csv` (34 GCP regions, every ordered pair; the
"Google Latency" dataset of the AT&T Center for Virtualization, SMU, via
umassos/decarbonization-potential, Apache-2.0). The two directions of a pair
differ by at most 2 ms, so the file is taken to hold round-trip times and the
two directions are averaged; within a region the RTT is 0.

Estimated (regions the matrix lacks, such as africa-south1, Johannesburg, where
the default fleet's ZA nodes sit): great-circle distance d between the regions'
cities, at the speed of light in fibre (v = 204.19 km/ms, refractive index
1.468), stretched by a routing factor f and a fixed overhead a:

    rtt_ms = a + f · 2·d / v

f and a are fitted on the matrix itself (least squares on relative error over
all 561 measured pairs) each time the matrix is loaded; `fit()` reports them with
the fit's error, and `python -m cloud.signals.latency_matrix` prints it. On the
shipped matrix f ≈ 1.58 and a ≈ 2.3 ms, mean absolute error ≈ 27 ms, median
absolute error ≈ 14 % of the measured RTT. Caveat: routes from southern Africa often
detour through Europe, so estimates for africa-south1 to Asia and the Americas
are probably optimistic.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType

import numpy as np

from cloud.signals.datasets import latency_rows

FIBRE_KM_PER_MS = 204.19  # c / 1.468
EARTH_RADIUS_KM = 6371.0088

# Google Cloud region → (latitude, longitude) of its city, from Google's published
# region locations; a superset of the matrix so that any of them can be estimated.
REGION_LOCATIONS: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "africa-south1": (-26.20, 28.05),  # Johannesburg
        "asia-east1": (24.05, 120.52),  # Changhua County, Taiwan
        "asia-east2": (22.32, 114.17),  # Hong Kong
        "asia-northeast1": (35.68, 139.69),  # Tokyo
        "asia-northeast2": (34.69, 135.50),  # Osaka
        "asia-northeast3": (37.57, 126.98),  # Seoul
        "asia-south1": (19.08, 72.88),  # Mumbai
        "asia-south2": (28.61, 77.21),  # Delhi
        "asia-southeast1": (1.34, 103.71),  # Jurong West, Singapore
        "asia-southeast2": (-6.21, 106.85),  # Jakarta
        "australia-southeast1": (-33.87, 151.21),  # Sydney
        "australia-southeast2": (-37.81, 144.96),  # Melbourne
        "europe-central2": (52.23, 21.01),  # Warsaw
        "europe-north1": (60.57, 27.20),  # Hamina
        "europe-north2": (59.33, 18.07),  # Stockholm
        "europe-southwest1": (40.42, -3.70),  # Madrid
        "europe-west1": (50.45, 3.82),  # St. Ghislain
        "europe-west2": (51.51, -0.13),  # London
        "europe-west3": (50.11, 8.68),  # Frankfurt
        "europe-west4": (53.44, 6.83),  # Eemshaven
        "europe-west6": (47.38, 8.54),  # Zurich
        "europe-west8": (45.46, 9.19),  # Milan
        "europe-west9": (48.86, 2.35),  # Paris
        "europe-west10": (52.52, 13.40),  # Berlin
        "europe-west12": (45.07, 7.69),  # Turin
        "me-central1": (25.29, 51.53),  # Doha
        "me-central2": (26.43, 50.10),  # Dammam
        "me-west1": (32.09, 34.78),  # Tel Aviv
        "northamerica-northeast1": (45.50, -73.57),  # Montréal
        "northamerica-northeast2": (43.65, -79.38),  # Toronto
        "northamerica-south1": (20.59, -100.39),  # Querétaro
        "southamerica-east1": (-23.53, -46.79),  # Osasco (São Paulo)
        "southamerica-west1": (-33.45, -70.67),  # Santiago
        "us-central1": (41.26, -95.86),  # Council Bluffs, Iowa
        "us-east1": (33.20, -80.01),  # Moncks Corner, South Carolina
        "us-east4": (39.04, -77.49),  # Ashburn, Virginia
        "us-east5": (39.96, -83.00),  # Columbus, Ohio
        "us-south1": (32.78, -96.80),  # Dallas
        "us-west1": (45.59, -121.18),  # The Dalles, Oregon
        "us-west2": (34.05, -118.24),  # Los Angeles
        "us-west3": (40.76, -111.89),  # Salt Lake City
        "us-west4": (36.17, -115.14),  # Las Vegas
    }
)


class UnknownRegion(KeyError):
    """A region neither in the matrix nor in REGION_LOCATIONS."""


def great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(math.sqrt(min(1.0, h)))


def fibre_rtt_ms(distance_km: float) -> float:
    """Round trip at the speed of light in fibre along the great circle (no detours)."""
    return 2 * distance_km / FIBRE_KM_PER_MS


@dataclass(frozen=True, slots=True)
class DistanceFit:
    routing_factor: float  # f: how much longer than the great circle real routes are
    overhead_ms: float  # a: fixed cost (equipment, last miles)
    pairs: int
    mean_abs_error_ms: float
    median_abs_error_pct: float
    max_abs_error_ms: float

    def estimate_ms(self, distance_km: float) -> float:
        return self.overhead_ms + self.routing_factor * fibre_rtt_ms(distance_km)


class LatencyMatrix:
    """Symmetric RTT between regions: measured where the matrix has the pair, else estimated."""

    def __init__(
        self,
        measured_ms: Mapping[tuple[str, str], float],
        locations: Mapping[str, tuple[float, float]] = REGION_LOCATIONS,
    ) -> None:
        pairs: dict[tuple[str, str], list[float]] = {}
        for (sender, receiver), milliseconds in measured_ms.items():
            if sender != receiver:
                pairs.setdefault(_key(sender, receiver), []).append(milliseconds)
        self._measured = {pair: sum(values) / len(values) for pair, values in pairs.items()}
        self._regions = frozenset(region for pair in self._measured for region in pair)
        self._locations = dict(locations)
        self._fit = self._fit_distance_model()

    @property
    def measured_regions(self) -> frozenset[str]:
        return self._regions

    @property
    def regions(self) -> frozenset[str]:
        """Every region an RTT can be given for (measured or with a known location)."""
        return self._regions | frozenset(self._locations)

    def fit(self) -> DistanceFit:
        return self._fit

    def is_measured(self, a: str, b: str) -> bool:
        return a == b or _key(a, b) in self._measured

    def rtt_ms(self, a: str, b: str) -> float:
        """Measured RTT (mean of both directions), 0 within a region, else the estimate."""
        if a == b:
            return 0.0
        measured = self._measured.get(_key(a, b))
        if measured is not None:
            return measured
        return self.estimate_ms(a, b)

    def estimate_ms(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        return self._fit.estimate_ms(great_circle_km(self._location(a), self._location(b)))

    def _location(self, region: str) -> tuple[float, float]:
        try:
            return self._locations[region]
        except KeyError:
            raise UnknownRegion(f"no location known for region {region!r}") from None

    def _fit_distance_model(self, leave_out: str | None = None) -> DistanceFit:
        usable = [
            (pair, rtt)
            for pair, rtt in sorted(self._measured.items())
            if pair[0] in self._locations
            and pair[1] in self._locations
            and rtt > 0
            and leave_out not in pair
        ]
        if len(usable) < 2:
            raise ValueError("need at least two measured pairs with known locations to fit")
        measured = np.array([rtt for _, rtt in usable])
        fibre = np.array(
            [
                fibre_rtt_ms(great_circle_km(self._locations[a], self._locations[b]))
                for (a, b), _ in usable
            ]
        )
        # Least squares on relative error (divide each row by the measured RTT), so that
        # short intra-continent pairs count as much as long intercontinental ones.
        design = np.column_stack((fibre, np.ones_like(fibre))) / measured[:, None]
        (factor, overhead), *_ = np.linalg.lstsq(design, np.ones_like(measured), rcond=None)
        error = overhead + factor * fibre - measured
        return DistanceFit(
            routing_factor=float(factor),
            overhead_ms=float(overhead),
            pairs=len(usable),
            mean_abs_error_ms=float(np.mean(np.abs(error))),
            median_abs_error_pct=float(np.median(np.abs(error) / measured) * 100),
            max_abs_error_ms=float(np.max(np.abs(error))),
        )

    def leave_one_region_out_error(self) -> tuple[float, float]:
        """(mean abs error ms, median abs error %) of estimates for each region's pairs when
        that region is left out of the fit: how well a region missing from the matrix is
        estimated."""
        errors: list[float] = []
        relative: list[float] = []
        for region in sorted(self._regions & frozenset(self._locations)):
            fit = self._fit_distance_model(leave_out=region)
            for (a, b), rtt in self._measured.items():
                if region in (a, b) and a in self._locations and b in self._locations:
                    error = abs(
                        fit.estimate_ms(great_circle_km(self._locations[a], self._locations[b]))
                        - rtt
                    )
                    errors.append(error)
                    relative.append(error / rtt * 100)
        return float(np.mean(errors)), float(np.median(relative))

    def rtt_table(self, regions: Iterable[str] | None = None) -> dict[tuple[str, str], float]:
        """Both orderings of every pair (and each region with itself) among `regions`."""
        chosen = sorted(self.regions if regions is None else set(regions))
        return {(a, b): self.rtt_ms(a, b) for a in chosen for b in chosen}


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@cache
def shipped_latency_matrix() -> LatencyMatrix:
    return LatencyMatrix({(a, b): ms for a, b, ms in latency_rows()})


def region_rtt_table(
    regions: Iterable[str] | None = None, *, matrix: LatencyMatrix | None = None
) -> Mapping[tuple[str, str], float]:
    """Read-only RTT table among `regions` (all known regions otherwise, about 1,800
    pairs): both orderings of every pair, 0 within a region. Regions the matrix does
    not know at all are left out, for the estimator's default RTT to cover."""
    source = matrix or shipped_latency_matrix()
    known = None if regions is None else [region for region in regions if region in source.regions]
    return MappingProxyType(source.rtt_table(known))


def main() -> None:
    matrix = shipped_latency_matrix()
    fit = matrix.fit()
    loro_ms, loro_pct = matrix.leave_one_region_out_error()
    print(
        f"rtt_ms = {fit.overhead_ms:.1f} + {fit.routing_factor:.3f} × 2·d / "
        f"{FIBRE_KM_PER_MS} km/ms "
        f"over {fit.pairs} measured pairs: mean abs error {fit.mean_abs_error_ms:.1f} ms, "
        f"median abs error {fit.median_abs_error_pct:.1f} %, max {fit.max_abs_error_ms:.0f} ms; "
        f"leaving each region out of the fit: mean abs error {loro_ms:.1f} ms, "
        f"median {loro_pct:.1f} %",
        file=sys.stdout,
    )
    for region in ("europe-west3", "europe-west2", "us-west2", "northamerica-northeast2"):
        print(
            f"africa-south1 ↔ {region}: {matrix.rtt_ms('africa-south1', region):.0f} ms (estimate)"
        )


if __name__ == "__main__":
    main()
