"""Amazon S3 and S3-compatible servers: ``s3://``, ``s3a://`` (s3fs's option names or
object_store's ``aws_*``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainfeed.converters.storage.clouds import CommonOptions, ObjectStoreCloud, StorageOptions


class S3Options(CommonOptions, total=False):
    """Storage options for S3, in s3fs's names or object_store's (``aws_*``)."""

    key: str
    secret: str
    token: str
    endpoint_url: str
    region_name: str
    client_kwargs: dict[str, str]
    anon: bool
    aws_access_key_id: str
    aws_secret_access_key: str
    aws_session_token: str
    aws_endpoint_url: str
    aws_region: str
    aws_virtual_hosted_style_request: bool | str
    conditional_put: str


_NAMES = {"key": "aws_access_key_id", "secret": "aws_secret_access_key", "token": "aws_session_token",
          "endpoint_url": "aws_endpoint_url", "region_name": "aws_region"}


@dataclass(frozen=True, eq=False)
class S3Cloud(ObjectStoreCloud):
    """S3 through obstore's ``S3Store``."""

    def translate(self, key: str, value: Any) -> dict[str, str]:
        if key == "client_kwargs" and isinstance(value, dict):  # s3fs's botocore arguments
            return {_NAMES[k]: str(v) for k, v in value.items() if k in _NAMES}
        return {}

    def native_options(self, options: StorageOptions) -> dict[str, str]:
        out = super().native_options(options)
        # S3 has no atomic rename: delta-rs commits with conditional writes (If-None-Match),
        # which S3 has supported since 2024, so two writers can never both commit a version.
        out.setdefault("conditional_put", "etag")
        return out


CLOUD = S3Cloud(
    name="s3", schemes=("s3", "s3a"), options_type=S3Options,
    secret_options=frozenset({"secret", "token", "aws_secret_access_key", "aws_session_token"}),
    secret_environment=("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    emulators=("s3server", "s3rver"), store_class="S3Store", native_prefix="aws_", option_names=_NAMES,
)
