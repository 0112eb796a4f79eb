"""trainfeed.converters.redact: every kind of secret the CLIs may see is masked, nothing else is."""
from __future__ import annotations

import json

import pytest

from trainfeed.converters import redact as r


@pytest.mark.parametrize("text, secret", [
    ("error: abfs://c/x.npy?sv=2024-01-01&sig=Zm9vYmFy%2B: not found", "Zm9vYmFy"),
    ("https://acct.blob.core.windows.net/c/v?se=2030&sp=r&sig=PLANTED", "PLANTED"),
    ("s3://AKIAUSER:SuperSecret@bucket/prefix/x.npy", "SuperSecret"),
    ("DefaultEndpointsProtocol=http;AccountName=dev;AccountKey=Eby8vdM02xNO==;BlobEndpoint=http://h", "Eby8vdM02xNO"),
    ("BlobEndpoint=https://h/;SharedAccessSignature=sv=2020&sig=XYZSIG", "XYZSIG"),
    ("options: account_key=abcdEFGH, account_name=dev", "abcdEFGH"),
    ('{"sas_token": "tok12345", "anon": false}', "tok12345"),
    ("client_secret: s3cr3tvalue", "s3cr3tvalue"),
])
def test_redact_masks_secret_patterns(text, secret):
    out = r.redact(text)
    assert secret not in out
    assert r.MASK in out or "@" not in out


def test_registered_values_are_masked_anywhere():
    r.register_storage_options({"account_key": "registered-key-value", "account_name": "devstoreaccount1"})
    out = r.redact("auth failed with registered-key-value for devstoreaccount1")
    assert "registered-key-value" not in out
    assert "devstoreaccount1" in out  # an account name is no secret


def test_connection_string_parts_are_registered():
    r.register_secret("AccountName=a;AccountKey=partKEY999;EndpointSuffix=core")
    assert "partKEY999" not in r.redact("the server rejected partKEY999")


def test_environment_credentials(monkeypatch):
    """A cloud's credential variables (its ``secret_environment``, registered with the cloud)."""
    from trainfeed.converters.storage.clouds import cloud_for

    assert "AWS_SECRET_ACCESS_KEY" in cloud_for("s3").secret_environment
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-0042")
    r.register_environment()
    assert r.redact("signature for env-secret-0042 did not match") == "signature for *** did not match"


def test_a_variable_registered_as_a_credential_is_masked_at_once(monkeypatch):
    monkeypatch.setenv("TRAINFEED_TEST_CREDENTIAL", "env-secret-7781")
    r.register_secret_environment(["TRAINFEED_TEST_CREDENTIAL"])
    assert r.redact("token env-secret-7781 expired") == "token *** expired"


def test_plain_text_is_left_alone():
    text = "/data/vols/v001.npy: corrupt or truncated .npy: header promises 400 bytes, file holds 12"
    assert r.redact(text) == text
    assert r.redact("monkey: 3, key_id=AKIA") == "monkey: 3, key_id=AKIA"


def test_redact_url_keeps_location():
    assert r.redact_url("abfs://user:pw@container/vols?sv=1&sig=2") == "abfs://container/vols"
    assert r.redact_url("/local/path") == "/local/path"


def test_redact_json_masks_secret_named_values_and_strings():
    out = json.loads(r.redact_json({"storage_options": {"connection_string": "x", "anon": False},
                                    "source": "az://c/p?sig=abc", "samples": 3}))
    assert out == {"storage_options": {"connection_string": r.MASK, "anon": False},
                   "source": f"az://c/p?{r.MASK}", "samples": 3}
