"""A token callback (``oauth_cb``) for the secured test cluster, named by its dotted path in connection settings.

Kafka's unsecured-JWT validator accepts a token signed by nobody (``"alg": "none"``) and takes
its ``sub`` as the principal; the callback builds one for the ``principal=`` in
``sasl.oauthbearer.config``, as an MSK IAM or OIDC callback would fetch a real token.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

LIFETIME_S = 3600


def _b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def unsecured_jwt(oauthbearer_config: str) -> tuple[str, float, str, dict[str, str]]:
    """confluent-kafka's ``oauth_cb``: (token, expiry in epoch seconds, principal, SASL extensions)."""
    options = dict(part.split("=", 1) for part in oauthbearer_config.split() if "=" in part)
    principal = options["principal"]
    now = time.time()
    token = f"{_b64({'alg': 'none'})}.{_b64({'sub': principal, 'iat': now, 'exp': now + LIFETIME_S})}."
    return token, now + LIFETIME_S, principal, {}
