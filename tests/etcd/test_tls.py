"""``etcds://``: TLS to a private etcd node whose certificate a test-made CA signs."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tenure
from tests.support.etcd_server import EtcdCluster


def _certificates(where: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate for 127.0.0.1 that it signs (openssl)."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "openssl is required by this test"
    ca_key, ca, key, csr, cert = (
        where / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem")
    )
    ext = where / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=tenure-test-ca",
        "-keyout", str(ca_key), "-out", str(ca))  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", str(key), "-out", str(csr))  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "1", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
    return cert, key, ca


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[EtcdCluster, Path]]:
    cert, key, ca = _certificates(tmp_path)
    with EtcdCluster(tls=(cert, key, ca)) as made:
        yield made, ca


@pytest.mark.asyncio
async def test_etcds_talks_tls_to_a_server_its_ca_signed(node: tuple[EtcdCluster, Path]) -> None:
    cluster, ca = node
    url = f"etcds://{cluster.endpoints[0]}?ca={ca}&prefix=tls/"
    async with tenure.from_url(url) as backend:
        granted = await backend.acquire_lease("k", "alice", 5000)
        assert granted.acquired
        assert await backend.get_lease_owner("k") == "alice"


@pytest.mark.asyncio
async def test_etcds_refuses_a_server_it_cannot_verify(node: tuple[EtcdCluster, Path]) -> None:
    cluster, _ = node
    async with tenure.from_url(f"etcds://{cluster.endpoints[0]}?timeout=2") as backend:
        with pytest.raises(tenure.BackendUnavailable):
            await backend.get_lease("k")
    # Plain text to a TLS port fails too, rather than talking in the clear.
    async with tenure.from_url(f"etcd://{cluster.endpoints[0]}?timeout=2") as backend:
        with pytest.raises(tenure.BackendUnavailable):
            await backend.get_lease("k")
