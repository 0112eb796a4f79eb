"""Names for the JSON records the storage A/B passes between its stages. results.jsonl's records
(a measured cell, a failure, a location-effect measurement) and the model's projection rows are
plain dicts written to and read back from JSON, so their values are any JSON; these names say
which record a dict is."""
from __future__ import annotations

from typing import Any

#: One record of results.jsonl as written and read back: ``kind`` is "cell", "error" or
#: "location-effect" (ab/results.py builds them).
Record = dict[str, Any]

#: A measured cell's place in the matrix: (store, node, framework).
CellKey = tuple[str, str, str]

#: One projection of an option on a machine (model/cost.py ``projection_row``): rate, time, $ and
#: bottleneck, with the instance's cloud and price when it is a catalog instance.
ProjectionRow = dict[str, Any]
