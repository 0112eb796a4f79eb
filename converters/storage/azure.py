"""Azure Blob Storage (and ADLS Gen2): ``abfs://``, ``abfss://``, ``az://``.

What only Azure has: connection strings (adlfs's option and variable, parsed here into
object_store's names), a SAS token in a URL's query (moved into the options), the account in
a URL's host (``container@account.dfs.core.windows.net``), and the uncommitted blocks a killed
block upload leaves (removed through Azure's SDK, which can list them).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from trainfeed.converters.storage.clouds import CommonOptions, ObjectStoreCloud

if TYPE_CHECKING:
    from trainfeed.converters.storage.location import Location


class AzureOptions(CommonOptions, total=False):
    """Storage options for Azure Blob, in adlfs's names or object_store's (``azure_*``)."""

    account_name: str
    account_key: str
    sas_token: str
    connection_string: str
    client_id: str
    client_secret: str
    tenant_id: str
    azure_storage_account_name: str
    azure_storage_account_key: str
    azure_storage_sas_token: str
    azure_storage_endpoint: str
    azure_client_id: str
    azure_client_secret: str
    azure_tenant_id: str
    azure_use_emulator: bool | str


def connection_string_options(text: str) -> dict[str, str]:
    """An Azure connection string's parts in object_store's names. A SAS connection string
    (``BlobEndpoint=...;SharedAccessSignature=...``) names no account: it is the endpoint's
    (``https://ACCOUNT.blob.core.windows.net``, or the emulator's ``http://host:port/ACCOUNT``)."""
    parts = {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in text.split(";") if "=" in p)}
    out = {"account_name": parts.get("AccountName"), "account_key": parts.get("AccountKey"),
           "sas_token": (parts.get("SharedAccessSignature") or "").lstrip("?"), "endpoint": parts.get("BlobEndpoint")}
    if not out["account_name"] and out["endpoint"]:
        endpoint = urlsplit(out["endpoint"])
        first = endpoint.path.strip("/").split("/")[0]
        out["account_name"] = first or (endpoint.hostname or "").split(".")[0]
    return {k: v for k, v in out.items() if v}


@dataclass(frozen=True, eq=False)
class AzureCloud(ObjectStoreCloud):
    """Azure Blob through obstore's ``AzureStore``."""

    def translate(self, key: str, value: Any) -> dict[str, str]:
        return connection_string_options(str(value)) if key == "connection_string" else {}

    def environment_options(self) -> dict[str, str]:
        text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        return connection_string_options(text) if text else {}

    def account_in_url(self, url: str) -> str | None:
        left, at, right = urlsplit(url).netloc.partition("@")
        return right.split(".", 1)[0] if at and ":" not in left and "." in right else None

    def url_options(self, query: str) -> dict[str, str] | None:
        """A SAS token (it has a version ``sv`` and a signature ``sig``) as ``sas_token``."""
        try:
            fields = parse_qs(query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            return None
        return {"sas_token": query} if fields.get("sig") and fields.get("sv") else None

    def remove_uncommitted(self, location: Location, ours: Callable[[str], bool]) -> None:
        """Azure keeps a killed block upload's blocks, uncommitted, under the blob's name (listed
        only with ``include=uncommittedblobs``, collected after 7 days). The native client cannot
        list them; Azure's SDK, a dependency already, can, with the account key or SAS token given
        (other credentials: left to Azure's collection). A blob being uploaded right now by
        another run to this destination loses its blocks, and that run fails, publishing nothing.
        ``ours``: whether a blob (its name in the container) is one trainfeed may remove."""
        if "/" not in location.path:
            return
        from azure.core.exceptions import ResourceNotFoundError
        from azure.storage.blob import ContainerClient

        opts = self.native_options(location.storage_options)
        account = opts.get("account_name") or opts.get("azure_storage_account_name")
        key = opts.get("account_key") or opts.get("azure_storage_account_key")
        sas = opts.get("sas_token") or opts.get("azure_storage_sas_token")
        endpoint = opts.get("endpoint") or opts.get("azure_storage_endpoint") or \
            (f"https://{account}.blob.core.windows.net" if account else None)
        # an account key signs only with the account's name
        credential: dict[str, str] | str | None = {"account_name": account, "account_key": key} \
            if key and account else sas
        if not endpoint or not credential:
            return
        container, prefix = location.path.split("/", 1)
        client = ContainerClient(endpoint, container, credential=credential)
        fs = location.fs
        committed = set(fs.find(location.path)) | set(fs.ls(location.path.rsplit("/", 1)[0], detail=False))
        for blob in client.list_blobs(name_starts_with=prefix, include=["uncommittedblobs"]):
            if not ours(blob.name) or f"{container}/{blob.name}" in committed:
                continue
            blob_client = client.get_blob_client(blob.name)
            try:
                blob_client.delete_blob()
            except ResourceNotFoundError:  # only uncommitted blocks: commit none (an empty blob), then delete it
                blob_client.commit_block_list([])
                blob_client.delete_blob()


CLOUD = AzureCloud(
    name="azure", schemes=("abfs", "abfss", "az"), options_type=AzureOptions, noun="container",
    secret_options=frozenset({"account_key", "sas_token", "connection_string", "client_secret",
                              "azure_storage_account_key", "azure_storage_sas_token", "azure_client_secret"}),
    secret_environment=("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
                        "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET"),
    emulators=("azurite",), url_options_are="a SAS token", store_class="AzureStore", native_prefix="azure_",
    option_names={name: name for name in ("account_name", "account_key", "sas_token", "client_id",
                                          "client_secret", "tenant_id")},
)
