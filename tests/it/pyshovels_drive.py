"""Drives every public method of the PyPI client `pyshovels` against a base URL.

Run by tests/it/pyshovels.rs against the real gateway (in front of the
simulator): `python3 pyshovels_drive.py <base_url>/v2 <team token> <samples.json>`.
Prints one JSON summary line; exits 1 when the client logged an ERROR (its
way of reporting a non-200) or a method that must find records found none.
"""

import json
import logging
import sys

from pyshovels import ShovelsAPI


class Errors(logging.Handler):
    """Collects what the client logs at ERROR: every non-200 it met."""

    def __init__(self):
        super().__init__(level=logging.ERROR)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage()[:300])


def main():
    base_url, token, samples_path = sys.argv[1:4]
    with open(samples_path) as f:
        s = json.load(f)
    errors = Errors()
    logger = logging.getLogger("pyshovels-drive")
    logger.addHandler(errors)
    logger.setLevel(logging.INFO)
    api = ShovelsAPI(api_key=token, base_url=base_url, logger=logger)

    window = {"permit_from": s["permit_from"], "permit_to": s["permit_to"]}
    metrics = {"metric_from": s["permit_from"], "metric_to": s["permit_to"], "property_type": "all", "tag": "all"}
    one_page = {"size": 5, "max_iterations": 1}
    permits = api.search_permits(s["state"], dict(window), **one_page)
    ids = list(permits["id"][:3]) if len(permits) else []
    first = permits.iloc[0] if len(permits) else None
    address = first["address"] if first is not None else {}

    calls = {
        "search_permits": lambda: permits,
        "get_permits_by_id": lambda: api.get_permits_by_id(ids),
        "search_contractors": lambda: api.search_contractors(s["state"], dict(window), **one_page),
        "get_contractors_by_id": lambda: api.get_contractors_by_id([s["contractor_id"]]),
        "get_permits_by_contractor_id": lambda: api.get_permits_by_contractor_id(s["contractor_id"], **one_page),
        "get_filtered_metrics_by_contractor_id": lambda: api.get_filtered_metrics_by_contractor_id(
            s["contractor_id"], dict(metrics)
        ),
        "list_contractor_employees": lambda: api.list_contractor_employees(s["contractor_id"]),
        "get_residents": lambda: api.get_residents(s["resident_address_geo_id"]),
        "get_tags": lambda: api.get_tags(),
        "get_data_release_date": lambda: [str(api.get_data_release_date())],
    }
    for level, q in [
        ("states", "calif"),
        ("zipcodes", s["zip"][:3]),
        ("jurisdictions", "city"),
        ("counties", address.get("county", "")),
        ("cities", address.get("city", "")),
        ("addresses", f'{address.get("street_no", "")} {address.get("street", "")}'),
    ]:
        calls[f"search_location[{level}]"] = lambda level=level, q=q: api.search_location(q, level)
    areas = [
        ("addresses", s["address_geo_id"]),
        ("counties", s["county_geo_id"]),
        ("cities", s["city_geo_id"]),
        ("jurisdictions", s["jurisdiction_geo_id"]),
    ]
    for level, geo in areas:
        calls[f"get_location_monthly_metrics[{level}]"] = lambda level=level, geo=geo: (
            api.get_location_monthly_metrics(geo, level, dict(metrics))
        )
        current = {"property_type": "all", "tag": "all"}
        calls[f"get_location_current_metrics[{level}]"] = lambda level=level, geo=geo, p=current: (
            api.get_location_current_metrics(geo, level, dict(p))
        )
    # Detail records: the seed spec answers a bare object, which this client
    # reads through its paginator as `items` (the live API's envelope), so it
    # gets no rows; that is reported, not failed. It must not log an error.
    details = {}
    for level, geo in areas[1:]:
        details[level] = len(api.get_location_details(geo, level))

    counts = {}
    for name, call in calls.items():
        counts[name] = len(call())
    empty = sorted(name for name, n in counts.items() if n == 0)
    print(json.dumps({"counts": counts, "details_rows": details, "empty": empty, "errors": errors.lines}))
    sys.exit(1 if errors.lines or empty else 0)


if __name__ == "__main__":
    main()
