"""Optional authentication (bearer tokens, mutual TLS), the topic policy, and what /healthz tells whom.

Services on uvicorn, 127.0.0.1, real Kafka. The TLS material (a CA, a server certificate for
127.0.0.1, a client certificate it signed, and a self-signed impostor) is made per module with
the openssl command line.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from purgatory.adapters.kafka.settings import KafkaSettings
from purgatory.adapters.service import create_app
from purgatory.adapters.service.server._server import BackgroundServer
from purgatory.adapters.service.settings import ServiceSettings

from purgatory.settings import Settings

TOKENS = ("token-alpha-6f1c2b", "token-beta-93ad07")
OPENSSL_TIMEOUT_S = 30


def _served(kafka: KafkaSettings, **service: object) -> BackgroundServer:
    settings = Settings(kafka=kafka, service=ServiceSettings.model_validate(service))
    return BackgroundServer(create_app(settings))


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


# -- bearer tokens --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_service(kafka_settings: KafkaSettings) -> Iterator[str]:
    with _served(kafka_settings, auth_tokens=list(TOKENS)) as server:
        yield server.url


@pytest.mark.parametrize(
    "headers",
    [
        {},
        _bearer("wrong"),
        _bearer(TOKENS[0][:-1]),  # a prefix of a valid token
        _bearer(TOKENS[0] + "x"),  # a valid token and more
        {"authorization": f"Basic {TOKENS[0]}"},  # the right secret under another scheme
        {"authorization": TOKENS[0]},
    ],
    ids=["none", "wrong", "prefix", "suffix", "basic", "no-scheme"],
)
def test_without_a_valid_bearer_token_every_route_but_healthz_is_401(
    token_service: str, kafka_topic_factory: object, headers: dict[str, str]
) -> None:
    with httpx.Client(base_url=token_service, timeout=30.0) as client:
        for method, path in (
            ("GET", "/topics/t/partitions/0/records"),
            ("POST", "/topics/t/records"),
            ("GET", "/metrics"),
        ):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
            assert response.json()["field"] == "authorization"
        assert client.get("/healthz", headers=headers).status_code == 200


@pytest.mark.parametrize("token", TOKENS)
def test_any_configured_token_is_accepted(
    token_service: str, kafka_topic_factory: object, token: str
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    with httpx.Client(base_url=token_service, timeout=30.0, headers=_bearer(token)) as client:
        produced = client.post(f"/topics/{topic}/records", json={"records": [{"value": "a"}]})
        assert produced.status_code == 200, produced.text
        fetched = client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0})
        assert [r["value"] for r in fetched.json()["records"]] == ["a"]
        assert client.get("/metrics").status_code == 200


def test_healthz_shows_cluster_details_only_to_an_authenticated_client(
    token_service: str, kafka_bootstrap: str
) -> None:
    with httpx.Client(base_url=token_service, timeout=30.0) as client:
        anonymous = client.get("/healthz")
        authenticated = client.get("/healthz", headers=_bearer(TOKENS[1]))
    assert anonymous.status_code == authenticated.status_code == 200
    assert "kafka" not in anonymous.json() and kafka_bootstrap not in anonymous.text
    assert authenticated.json()["kafka"]["bootstrap_servers"] == kafka_bootstrap


def test_without_authentication_configured_healthz_shows_no_cluster_details(
    kafka_settings: KafkaSettings, kafka_bootstrap: str
) -> None:
    with _served(kafka_settings) as server, httpx.Client(base_url=server.url) as client:
        health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert kafka_bootstrap not in health.text


# -- topic policy ---------------------------------------------------------------------------------


def test_topics_outside_the_allow_list_are_403_and_denied_patterns_win(
    kafka_settings: KafkaSettings, kafka_topic_factory: object
) -> None:
    allowed = kafka_topic_factory(1, prefix="orders")  # type: ignore[operator]
    other = kafka_topic_factory(1, prefix="payments")  # type: ignore[operator]
    with (
        _served(
            kafka_settings, allowed_topics=["orders-*"], denied_topics=["orders-secret*", "_*"]
        ) as server,
        httpx.Client(base_url=server.url, timeout=30.0) as client,
    ):
        assert (
            client.post(f"/topics/{allowed}/records", json={"records": [{"value": "a"}]}).status_code == 200
        )
        for topic in (other, "orders-secret-1", "__consumer_offsets"):
            for response in (
                client.get(f"/topics/{topic}/partitions/0/records", params={"offset": 0}),
                client.post(f"/topics/{topic}/records", json={"records": [{"value": "a"}]}),
            ):
                assert response.status_code == 403, (topic, response.text)
                assert response.json() == {
                    "error": "TOPIC_AUTHORIZATION_FAILED",
                    "field": "topic",
                    "message": response.json()["message"],
                }


# -- mutual TLS -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    impostor_cert: Path
    impostor_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S)


def _signed(directory: Path, name: str, subject: str, ca: Path, ca_key: Path, ext: str) -> tuple[Path, Path]:
    key, csr, cert, extfile = (directory / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    extfile.write_text(ext)
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", extfile,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.fail("the mTLS tests need the openssl command line")
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = d / "ca.pem", d / "ca.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
        "-days", "2", "-subj", "/CN=purgatory test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    server_cert, server_key = _signed(
        d, "server", "/CN=127.0.0.1", ca, ca_key, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    )
    client_cert, client_key = _signed(
        d, "client", "/CN=trusted-client", ca, ca_key, "extendedKeyUsage=clientAuth\n"
    )
    impostor_cert, impostor_key = d / "impostor.pem", d / "impostor.key"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", impostor_key, "-out", impostor_cert,
        "-days", "2", "-subj", "/CN=trusted-client",
    )  # fmt: skip
    return Pki(ca, server_cert, server_key, client_cert, client_key, impostor_cert, impostor_key)


@pytest.fixture(scope="module")
def mtls_service(kafka_settings: KafkaSettings, pki: Pki) -> Iterator[str]:
    with _served(
        kafka_settings,
        tls_certfile=str(pki.server_cert),
        tls_keyfile=str(pki.server_key),
        tls_ca_certs=str(pki.ca),
        tls_client_auth="required",
    ) as server:
        assert server.url.startswith("https://")
        yield server.url


def _tls_client(url: str, pki: Pki, cert: tuple[Path, Path] | None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(base_url=url, verify=context, timeout=30.0)


def test_a_client_with_a_certificate_the_ca_signed_is_served_and_authenticated(
    mtls_service: str, pki: Pki, kafka_bootstrap: str, kafka_topic_factory: object
) -> None:
    topic = kafka_topic_factory(1)  # type: ignore[operator]
    with _tls_client(mtls_service, pki, (pki.client_cert, pki.client_key)) as client:
        produced = client.post(f"/topics/{topic}/records", json={"records": [{"value": "tls"}]})
        assert produced.status_code == 200, produced.text
        health = client.get("/healthz")
    assert health.json()["kafka"]["bootstrap_servers"] == kafka_bootstrap, "mTLS counts as authenticated"


@pytest.mark.parametrize("who", ["no certificate", "self-signed impostor"])
def test_a_client_without_a_certificate_the_ca_signed_is_refused_at_the_handshake(
    mtls_service: str, pki: Pki, who: str
) -> None:
    # With TLS 1.3 the client hears of it after its own handshake finished: the server hangs up
    # (a transport error either way, never an HTTP answer).
    cert = None if who == "no certificate" else (pki.impostor_cert, pki.impostor_key)
    with _tls_client(mtls_service, pki, cert) as client, pytest.raises(httpx.TransportError):
        client.get("/healthz")
    with _tls_client(mtls_service, pki, (pki.client_cert, pki.client_key)) as client:
        assert client.get("/healthz").status_code == 200, "the server keeps serving"
