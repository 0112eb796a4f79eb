"""Google Cloud Storage: ``gs://``, ``gcs://`` (gcsfs's ``token`` as a service account file,
or object_store's ``google_*`` names). No emulator runs it in the tests."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trainfeed.converters.storage.clouds import CommonOptions, ObjectStoreCloud


class GCSOptions(CommonOptions, total=False):
    """Storage options for GCS, in gcsfs's names or object_store's (``google_*``)."""

    token: str
    google_service_account: str
    google_service_account_key: str
    google_application_credentials: str


@dataclass(frozen=True, eq=False)
class GCSCloud(ObjectStoreCloud):
    """GCS through obstore's ``GCSStore``."""

    def translate(self, key: str, value: Any) -> dict[str, str]:
        if key == "token" and isinstance(value, str) and os.path.isfile(value):  # a service account file
            return {"google_service_account": value}
        return {}


CLOUD = GCSCloud(
    name="gcs", schemes=("gs", "gcs"), options_type=GCSOptions,
    secret_options=frozenset({"google_service_account_key"}),
    secret_environment=("GOOGLE_APPLICATION_CREDENTIALS_JSON",),
    store_class="GCSStore", native_prefix="google_",
)
