"""A secured mode of the embedded cluster: TLS, SASL/SCRAM, OAUTHBEARER and ACLs.

:class:`SecureCluster` is a :class:`~tidemark.devtools.kafka.cluster.LocalCluster` whose
nodes listen for clients on two ports: ``SASL_SSL`` (mechanisms ``SCRAM-SHA-512`` and
``OAUTHBEARER``, the latter checked by Kafka's unsecured-JWT validator) on the node's broker
port, and ``SSL`` with required client certificates (mTLS) on a second port. Brokers talk to
each other and to the controllers over mTLS as the principal ``broker``. Authorization is
KRaft's ``StandardAuthorizer``; ``broker`` and ``admin`` are super users, every other
principal gets only the ACLs someone creates. The test CA, the brokers' and clients'
certificates (Python ``cryptography``) and the SCRAM users (created at format time with
``StorageTool format --add-scram``) live under the cluster's home; certificate subjects map
to principals by their CN (``CN=feed`` is ``User:feed``), as SCRAM user names and the JWT
``sub`` do, so one principal's ACLs hold whichever mechanism it uses.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tidemark.devtools.kafka.cluster import ClusterState, LocalCluster, Node, free_port
from tidemark.errors import LocalKafkaError
from tidemark.kafka.connection import KafkaConnection

# cryptography is imported inside the functions that make or read certificates: 0.7 s to import (measured),
# and the test suite imports this module in every session, secured cluster or not.

SUPER_USERS = ("broker", "admin")
SCRAM = "SCRAM-SHA-512"
# Users with a SCRAM credential from the start; others can be added with the admin API.
SCRAM_USERS = ("admin", "feed")
Mechanism = Literal["scram", "mtls", "oauthbearer"]
MECHANISMS: tuple[Mechanism, ...] = ("scram", "mtls", "oauthbearer")
_VALID_DAYS = 30
# (resource type, resource name, operation): ("topic", "orders", "read"), ("group", "g", "describe"), ...
Grant = tuple[str, str, str]


@dataclass(frozen=True)
class SecureSettings:
    """What clients of a secured cluster need besides the node list: ports, passwords, the CA."""

    ssl_ports: dict[int, int]  # node id -> port of its mTLS listener
    passwords: dict[str, str]  # SCRAM user -> password

    def to_json(self) -> str:
        return json.dumps({"ssl_ports": self.ssl_ports, "passwords": self.passwords}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SecureSettings:
        doc = json.loads(text)
        return cls({int(k): int(v) for k, v in doc["ssl_ports"].items()}, dict(doc["passwords"]))


class SecureCluster(LocalCluster):
    """The embedded KRaft cluster with TLS, SASL and an authorizer (see the module docstring)."""

    def __init__(self, home: Path | None = None) -> None:
        super().__init__(home)
        self.secure_file = self.home / "secure.json"
        self.tls_dir = self.home / "tls"

    # -- what clients use ------------------------------------------------------------

    def secure_settings(self) -> SecureSettings:
        if not self.secure_file.exists():
            raise LocalKafkaError(f"no secured cluster at {self.home}; start it with SecureCluster.up() first")
        return SecureSettings.from_json(self.secure_file.read_text())

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

    def sasl_bootstrap(self) -> str:
        return self._require_state().bootstrap_servers

    def ssl_bootstrap(self) -> str:
        ports = self.secure_settings().ssl_ports
        return ",".join(f"127.0.0.1:{ports[n.node_id]}" for n in self._require_state().nodes)

    def connection(self, mechanism: Mechanism, principal: str, *, pem: bool = False) -> KafkaConnection:
        """Client settings that authenticate as ``principal``.

        ``pem``: certificates and keys as PEM strings (``ssl.ca.pem``, ...) instead of file paths.
        SCRAM needs a user with a credential (:data:`SCRAM_USERS` or :meth:`add_scram_user`);
        mTLS gets a certificate for ``principal`` signed by the cluster's CA on first use.
        """
        tls = self._client_tls(principal if mechanism == "mtls" else None, pem)
        if mechanism == "mtls":
            return KafkaConnection(self.ssl_bootstrap(), {"security.protocol": "SSL", **tls})
        if mechanism == "scram":
            password = self.secure_settings().passwords.get(principal)
            if password is None:
                raise LocalKafkaError(f"SCRAM user '{principal}' has no credential on the cluster at {self.home}")
            return KafkaConnection(
                self.sasl_bootstrap(),
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SCRAM,
                    "sasl.username": principal,
                    "sasl.password": password,
                    **tls,
                },
            )
        return KafkaConnection(
            self.sasl_bootstrap(),
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": "true",
                "sasl.oauthbearer.config": f"principal={principal}",
                **tls,
            },
        )

    def admin_connection(self) -> KafkaConnection:
        return self.connection("scram", "admin")

    def add_scram_user(self, user: str) -> str:
        """Create (or reset) a SCRAM-SHA-512 credential for ``user``; returns its password."""
        password = secrets.token_urlsafe(18)
        admin = AdminClient(self.admin_connection().client_config())
        upsert = UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=30)
        settings = self.secure_settings()
        self._write_private(
            self.secure_file, SecureSettings(settings.ssl_ports, {**settings.passwords, user: password}).to_json()
        )
        return password

    def grant(self, principal: str, grants: Iterable[Grant]) -> None:
        """Allow ``principal`` each ``(resource type, resource name, operation)``, e.g. ``("topic", "t", "read")``."""
        admin = self._acl_admin()
        for future in admin.create_acls([_binding(principal, g) for g in grants]).values():
            future.result(timeout=30)

    def revoke(self, principal: str, grants: Iterable[Grant]) -> None:
        admin = self._acl_admin()
        for future in admin.delete_acls([_binding(principal, g) for g in grants]).values():
            future.result(timeout=30)

    def _acl_admin(self) -> Any:
        return AdminClient(self.admin_connection().client_config())

    def _client_tls(self, principal: str | None, pem: bool) -> dict[str, str]:
        files = {"ssl.ca": self.ca_file}
        if principal is not None:
            cert, key = self._client_files(principal)
            files |= {"ssl.certificate": cert, "ssl.key": key}
        if pem:
            return {f"{name}.pem": path.read_text() for name, path in files.items()}
        return {f"{name}.location": str(path) for name, path in files.items()}

    def _client_files(self, principal: str) -> tuple[Path, Path]:
        cert, key = self.tls_dir / f"client-{principal}.pem", self.tls_dir / f"client-{principal}.key"
        if not cert.exists():
            ca_key, ca_cert = _load_ca(self.tls_dir)
            pair = _issue(principal, ca_key, ca_cert, server=False)
            self._write_private(key, pair[0])
            cert.write_text(pair[1])
        return cert, key

    # -- lifecycle hooks of LocalCluster --------------------------------------------

    def _create(self, brokers: int, settings: dict[str, str]) -> ClusterState:
        self.home.mkdir(parents=True, exist_ok=True)
        self._make_tls()
        ports: dict[int, int] = {}
        while len(ports) < brokers:
            port = free_port()
            if port not in ports.values():
                ports[len(ports) + 1] = port
        self._write_private(
            self.secure_file, SecureSettings(ports, {u: secrets.token_urlsafe(18) for u in SCRAM_USERS}).to_json()
        )
        return super()._create(brokers, settings)

    def _format_extra(self) -> list[str]:
        passwords = self.secure_settings().passwords
        return [f"--add-scram={SCRAM}=[name={u},password={passwords[u]}]" for u in SCRAM_USERS]

    def _properties(self, state: ClusterState, node: Node) -> dict[str, str]:
        ssl_port = self.secure_settings().ssl_ports[node.node_id]
        sasl = "listener.name.sasl_ssl."
        props = super()._properties(state, node)
        props.update(
            {
                "listeners": (
                    f"SASL_SSL://127.0.0.1:{node.broker_port},SSL://127.0.0.1:{ssl_port},"
                    f"CONTROLLER://127.0.0.1:{node.controller_port}"
                ),
                "advertised.listeners": f"SASL_SSL://127.0.0.1:{node.broker_port},SSL://127.0.0.1:{ssl_port}",
                "listener.security.protocol.map": "SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:SSL",
                "inter.broker.listener.name": "SSL",
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(self.tls_dir / "broker-keystore.pem"),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca_file),
                "listener.name.ssl.ssl.client.auth": "required",
                "listener.name.controller.ssl.client.auth": "required",
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
                f"{sasl}sasl.enabled.mechanisms": f"{SCRAM},OAUTHBEARER",
                f"{sasl}scram-sha-512.sasl.jaas.config": (
                    "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                ),
                # The default server callback for OAUTHBEARER is the unsecured-JWT validator: a token's
                # `sub` becomes the principal, no signature is checked (tests only).
                f"{sasl}oauthbearer.sasl.jaas.config": (
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
                ),
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": ";".join(f"User:{u}" for u in SUPER_USERS),
                "allow.everyone.if.no.acl.found": "false",
            }
        )
        return props

    def _admin_config(self, node: Node) -> dict[str, Any]:
        return self.admin_connection().client_config(**{"bootstrap.servers": node.address})

    # -- certificates ----------------------------------------------------------------

    def _make_tls(self) -> None:
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        if self.ca_file.exists():
            return
        ca_key, ca_cert = _new_ca()
        self._write_private(self.tls_dir / "ca.key", _key_pem(ca_key))
        from cryptography.hazmat.primitives.serialization import Encoding

        self.ca_file.write_text(ca_cert.public_bytes(Encoding.PEM).decode())
        key, cert = _issue("broker", ca_key, ca_cert, server=True)
        # Kafka's PEM keystore: the private key (unencrypted PKCS#8) then the certificate chain.
        self._write_private(self.tls_dir / "broker-keystore.pem", key + cert)

    @staticmethod
    def _write_private(path: Path, text: str) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.touch(mode=0o600)
        tmp.chmod(0o600)
        tmp.write_text(text)
        tmp.replace(path)


def feed_grants(topics: Iterable[str], group: str, *, retention_warnings: bool = True) -> list[Grant]:
    """The ACLs a feed's principal needs for every run type (docs/deploy.md has the table and the why)."""
    grants: list[Grant] = []
    for topic in topics:
        grants += [("topic", topic, "describe"), ("topic", topic, "read")]
        if retention_warnings:
            grants.append(("topic", topic, "describe_configs"))
    if retention_warnings:
        grants.append(("broker", "kafka-cluster", "describe_configs"))
    return [*grants, ("group", group, "read"), ("group", group, "describe")]


def _binding(principal: str, grant: Grant) -> Any:
    kind, name, operation = grant
    return AclBinding(
        ResourceType[kind.upper()],
        name,
        ResourcePatternType.LITERAL,
        f"User:{principal}",
        "*",
        AclOperation[operation.upper()],
        AclPermissionType.ALLOW,
    )


def _key_pem(key: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    return str(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode())


def _name(cn: str) -> Any:
    from cryptography.x509 import Name, NameAttribute
    from cryptography.x509.oid import NameOID

    return Name([NameAttribute(NameOID.COMMON_NAME, cn)])


_NO_USAGE = dict.fromkeys(
    ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment", "key_agreement",
     "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"),
    False,
)  # fmt: skip


def _new_ca() -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tidemark-test-ca"))
        .issuer_name(_name("tidemark-test-ca"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(**{**_NO_USAGE, "digital_signature": True, "key_cert_sign": True, "crl_sign": True}),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _load_ca(tls_dir: Path) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key((tls_dir / "ca.key").read_bytes(), password=None)
    return key, x509.load_pem_x509_certificate((tls_dir / "ca.pem").read_bytes())


def _issue(cn: str, ca_key: Any, ca_cert: Any, *, server: bool) -> tuple[str, str]:
    """A key and a certificate for ``CN=cn`` signed by the CA, as PEM texts.

    Broker certificates serve both sides of mTLS (inter-broker and controller links) and name
    127.0.0.1 and localhost, which clients verify (``ssl.endpoint.identification.algorithm=https``).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH, *([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return _key_pem(key), cert.public_bytes(Encoding.PEM).decode()
