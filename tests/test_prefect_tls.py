"""Prefect's clients of mule's own server (plain HTTP on loopback) load a CA file of one
certificate that vouches for no server, instead of certifi's bundle each time one is made
(flows.runtime.LOOPBACK_CA); a user's own Prefect server keeps Prefect's defaults."""

import os
import ssl

from mule.flows.runtime import LOOPBACK_CA, prepare_environment, trust_no_server


def test_the_loopback_ca_is_one_self_signed_certificate_made_for_this():
    context = ssl.create_default_context(cafile=str(LOOPBACK_CA))
    [certificate] = context.get_ca_certs()
    assert certificate["subject"] == certificate["issuer"]  # self-signed: a CA of its own, signing nothing
    assert dict(x[0] for x in certificate["subject"])["commonName"] == "mule loopback CA (its key was discarded)"


def test_a_ca_file_the_user_named_is_kept():
    environ = {"PREFECT_API_SSL_CERT_FILE": "/etc/my-ca.pem"}
    trust_no_server(environ)
    assert environ == {"PREFECT_API_SSL_CERT_FILE": "/etc/my-ca.pem"}
    environ = {}
    trust_no_server(environ)
    assert environ == {"PREFECT_API_SSL_CERT_FILE": str(LOOPBACK_CA)}


def test_only_mules_own_server_gets_it(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_SSL_CERT_FILE", raising=False)
    monkeypatch.setenv("PREFECT_API_URL", "https://prefect.example.org/api")  # the user's server
    prepare_environment(tmp_path)
    assert "PREFECT_API_SSL_CERT_FILE" not in os.environ
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    prepare_environment(tmp_path)
    assert os.environ["PREFECT_API_SSL_CERT_FILE"] == str(LOOPBACK_CA)


def test_prefect_reads_it_in_a_process_prepared_as_mule_prepares_its_own():
    """tests/conftest.py prepares the test processes with flows.runtime.prepare_environment
    before Prefect is imported, as `mule` does."""
    from prefect.settings import get_current_settings

    assert str(get_current_settings().api.ssl_cert_file) == str(LOOPBACK_CA)
