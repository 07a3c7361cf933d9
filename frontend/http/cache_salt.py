"""Tenant prefix-cache salts: a keyed hash with a secret of the deployment.

The engine scopes its prefix cache by `cache_salt`, and `cached_tokens` tells a
client how much of its prompt was cached. A salt that was a plain hash of the
tenant's name could be computed by anyone who reaches the backend's gRPC port,
who could then probe another tenant's cache prompt by prompt. So the salt is
HMAC-SHA256 under a secret only the gateways hold. Every gateway of a
deployment must hold the same secret (they share the backends' caches and
route by them), and it must outlive restarts (or every tenant starts cold):

    $KVSERVE_CACHE_SALT_SECRET            wins (deploy/k8s passes a Secret this way)
    --cache-salt-secret-file FILE         else read, or generated there once (mode 0600)
    default FILE                          $XDG_STATE_HOME/kvserve/cache-salt-secret
                                          (~/.local/state/kvserve/cache-salt-secret)
An unwritable file falls back to a secret of this process only, with a warning.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger("kvserve.gateway")
SECRET_ENV = "KVSERVE_CACHE_SALT_SECRET"


def default_secret_file() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "kvserve" / "cache-salt-secret"


def load_secret(path: str | os.PathLike[str] | None = None) -> bytes:
    """The deployment's salt secret (see the module docstring for where it comes from)."""
    value = os.environ.get(SECRET_ENV)
    if value:
        return value.encode("utf-8")
    file = Path(path) if path else default_secret_file()
    try:
        text = file.read_text(encoding="utf-8").strip()
        if text:
            return text.encode("utf-8")
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OSError(f"cache salt secret file {file}: {exc.strerror or exc}") from None
    generated = secrets.token_hex(32)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: two gateways starting together keep whichever secret was written first.
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(generated + "\n")
    except FileExistsError:
        return load_secret(file)
    except OSError as exc:
        log.warning("cache salt secret not kept (%s): tenants' cached prefixes will not survive a restart, "
                    "and other gateways will not share them; set %s", exc.strerror or type(exc).__name__,
                    SECRET_ENV)
    return generated.encode("utf-8")


def effective_cache_salt(secret: bytes, tenant: str | None, client_salt: str | None) -> str | None:
    """The prefix-cache salt the engine sees: the authenticated tenant plus the client's own
    salt, under the deployment's secret, so no client can name, compute or guess its way into
    another tenant's cache entries. Without authentication and without a client salt everyone
    shares one cache, as before."""
    if tenant is None and client_salt is None:
        return None
    material = json.dumps([tenant, client_salt])  # unambiguous: no (tenant, salt) pair can pose as another
    return "t-" + hmac.new(secret, material.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
