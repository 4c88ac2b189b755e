"""The run's TLS material for a target with ``[target.tls] enabled = true`` (contracts/tls.py), and the
clients' side of it.

Before the target starts, ``write_target_tls`` makes a CA of the run's own and a server certificate signed by
it (trustme: ECDSA P-256) whose subject alternative names are the target's host address(es) (IP SANs),
``localhost`` and the scenario's ``server_name``, and writes them as PEM into ``{run_dir}/tls/``: ``ca.pem``,
``server.pem`` (the server's chain, leaf first) and ``server.key`` (mode 0600; owned by ``[target]
data_owner`` when run as root, since Mosquitto reads its certificates after it drops root).  The target's
argv, env and config files name them with {tls_ca} {tls_cert} {tls_key} {tls_dir} (``tls_placeholders``).

``client_tls`` is what every MQTT connection of the run uses: the run's CA file, the name to verify and send
as SNI, and whether to verify at all.  The private key is written only to ``server.key``: no description,
event or message carries it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pwd
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.tls import TlsSpec

TLS_DIR = "tls"  # under the run directory
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "server.pem", "server.key"
GUIDE = "docs/scenarios.md, \"TLS listeners\""


class TlsError(RuntimeError):
    """The run's certificates cannot be made or written; the message says what to change."""


@dataclass(frozen=True)
class TlsPaths:
    """Where a run's TLS files are (they exist once the target is prepared)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / CA_FILE

    @property
    def cert(self) -> Path:
        return self.directory / CERT_FILE

    @property
    def key(self) -> Path:
        return self.directory / KEY_FILE


def tls_paths(run_dir: str | Path) -> TlsPaths:
    return TlsPaths(Path(run_dir).resolve() / TLS_DIR)


def tls_placeholders(run_dir: str | Path, spec: TlsSpec) -> dict[str, str]:
    """{tls_ca} {tls_cert} {tls_key} {tls_dir} for the target's argv, env and config files; none without TLS
    (the scenario loader refuses them then, contracts/tls.py)."""
    if not spec.enabled:
        return {}
    paths = tls_paths(run_dir)
    return {"tls_dir": str(paths.directory), "tls_ca": str(paths.ca), "tls_cert": str(paths.cert),
            "tls_key": str(paths.key)}


def certificate_names(hosts: Sequence[str], server_name: str = "") -> list[str]:
    """The server certificate's subject alternative names: every host address, localhost, the server name."""
    names: list[str] = []
    for name in (*hosts, "localhost", server_name):
        if name and name not in names:
            names.append(name)
    return names


@dataclass(frozen=True)
class Certificates:
    """A CA and a server certificate it signed, as PEM."""

    ca_pem: bytes
    chain_pem: bytes  # the server's certificate chain, leaf first
    key_pem: bytes = field(repr=False)  # the server's private key
    names: tuple[str, ...] = ()

    @property
    def ca_sha256(self) -> str:
        """The CA certificate's SHA-256 fingerprint (of its DER), as openssl x509 -fingerprint prints it."""
        digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(self.ca_pem.decode())).hexdigest().upper()
        return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def make_certificates(names: Sequence[str]) -> Certificates:
    """A fresh CA and a server certificate for ``names`` (IP addresses become IP SANs, the rest DNS SANs)."""
    import trustme

    if not names:
        raise TlsError("a server certificate needs at least one name or address")
    ca = trustme.CA(organization_name="Ordeal run CA")
    leaf = ca.issue_cert(*names, common_name=names[0], organization_name="Ordeal target")
    return Certificates(ca_pem=ca.cert_pem.bytes(), chain_pem=b"".join(p.bytes() for p in leaf.cert_chain_pems),
                        key_pem=leaf.private_key_pem.bytes(), names=tuple(names))


def write_target_tls(run_dir: str | Path, spec: TlsSpec, hosts: Sequence[str], *,
                     owner: str = "") -> dict[str, Any] | None:
    """With TLS enabled: make the run's CA and a server certificate for ``hosts`` (and localhost, the server
    name) and write them into {run_dir}/tls/, the key readable by its owner only (``owner``: chown to that
    user when root).  Returns what was made (paths, names, the CA's fingerprint; never the key), or None."""
    if not spec.enabled:
        return None
    made = make_certificates(certificate_names(hosts, spec.server_name))
    paths = tls_paths(run_dir)
    paths.directory.mkdir(parents=True, exist_ok=True)
    paths.directory.chmod(0o755)
    paths.ca.write_bytes(made.ca_pem)
    paths.cert.write_bytes(made.chain_pem)
    descriptor = os.open(paths.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as key_file:
        os.fchmod(key_file.fileno(), 0o600)  # an existing file keeps its mode on O_CREAT
        key_file.write(made.key_pem)
    if owner and os.geteuid() == 0:
        try:
            user = pwd.getpwnam(owner)
        except KeyError:
            raise TlsError(f"[target] data_owner = {owner!r}: no such user on this machine (it would own "
                           f"{paths.key})") from None
        for path in (paths.directory, paths.ca, paths.cert, paths.key):
            os.chown(path, user.pw_uid, user.pw_gid)
    return {"ca": str(paths.ca), "cert": str(paths.cert), "key": str(paths.key), "names": list(made.names),
            "ca_sha256": made.ca_sha256, "server_name": spec.server_name, "verify": spec.verify}


# -- the clients' side ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientTls:
    """How a client of the run speaks TLS: verify the server against ``ca_file`` (the run's CA) for
    ``server_name`` (or the address it connects to), or (verify false) encrypt without checking."""

    ca_file: str
    server_name: str = ""
    verify: bool = True

    def context(self) -> ssl.SSLContext:
        """One context per CA file (its contents) and mode, shared by every connection of the run."""
        try:
            stamp = os.stat(self.ca_file).st_mtime_ns if self.verify else 0
        except FileNotFoundError:
            raise TlsError(f"the run's CA file {self.ca_file} does not exist (the target writes it when it is "
                           "prepared)") from None
        return _context(self.ca_file if self.verify else "", stamp)

    def server_hostname(self, host: str) -> str:
        """The name checked against the certificate and sent as SNI (an IP address sends no SNI)."""
        return self.server_name or host

    def describe(self) -> dict[str, Any]:
        return {"ca": self.ca_file, "server_name": self.server_name, "verify": self.verify}


@functools.lru_cache(maxsize=8)
def _context(ca_file: str, _stamp: int) -> ssl.SSLContext:
    if ca_file:
        return ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def client_tls(run_dir: str | Path, spec: TlsSpec) -> ClientTls | None:
    """The TLS every MQTT connection to the target uses; None = plain MQTT ([target.tls] not enabled)."""
    if not spec.enabled:
        return None
    return ClientTls(ca_file=str(tls_paths(run_dir).ca), server_name=spec.server_name, verify=spec.verify)


def failure_words(error: BaseException, tls: ClientTls | None = None) -> str:
    """A TLS failure in words: a certificate that did not verify (against which CA, for which name), or the
    handshake's failure as OpenSSL names it."""
    if isinstance(error, ssl.SSLCertVerificationError):
        against = f" against the run's CA {tls.ca_file}" if tls is not None else ""
        why = error.verify_message or error.reason or str(error)
        return (f"TLS: the broker's certificate did not verify{against}: {why} (the broker must serve the run's "
                "{tls_cert} / {tls_key}, or set [target.tls] server_name / verify; " + GUIDE + ")")
    if isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "TLS: the broker closed the connection during the TLS handshake"
    if isinstance(error, ssl.SSLError):
        reason = error.reason or ""
        hint = " (the port does not speak TLS: is its listener plain MQTT?)" if reason == "WRONG_VERSION_NUMBER" \
            else ""
        return f"TLS: the handshake failed: {reason or error}{hint}"
    return f"TLS: {type(error).__name__}: {error}"


def is_lasting(error: BaseException) -> bool:
    """A TLS failure that waiting will not change (the broker answered: its certificate, a TLS alert, a
    listener that is not TLS); a connection closed during the handshake may be a broker still starting."""
    return isinstance(error, ssl.SSLError) and not isinstance(
        error, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError))
