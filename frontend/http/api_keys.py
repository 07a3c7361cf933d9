"""API keys and the tenants they belong to.

`--api-key KEY` (repeatable, or $KVSERVE_API_KEY) adds keys of the tenant
"default"; `--api-keys-file FILE` adds `KEY TENANT` lines (blank lines and
`#` comments ignored). The tenant scopes the prefix cache: requests of one
tenant never reuse another's cached KV blocks (see cache_salt.py).
"""
from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

# Keys given with --api-key (not the keys file) belong to this tenant.
DEFAULT_TENANT = "default"


class KeyFileError(ValueError):
    pass


def parse_keys_file(text: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            # The line itself is not quoted back: it holds a secret.
            raise KeyFileError(f"api keys file, line {number}: expected 'KEY TENANT'")
        key, tenant = parts
        if keys.get(key, tenant) != tenant:
            raise KeyFileError(f"api keys file, line {number}: this key is already given to another tenant")
        keys[key] = tenant
    return keys


def load_api_keys(cli_keys: list[str] | None, keys_file: str | None) -> dict[str, str]:
    """Every accepted key -> its tenant; empty when authentication is off."""
    keys: dict[str, str] = {}
    if keys_file:
        keys.update(parse_keys_file(Path(keys_file).expanduser().read_text(encoding="utf-8")))
    for key in cli_keys or []:
        if key:
            if keys.get(key, DEFAULT_TENANT) != DEFAULT_TENANT:
                raise KeyFileError("an --api-key is also in the api keys file under another tenant")
            keys[key] = DEFAULT_TENANT
    return keys


def key_digest(key: str) -> bytes:
    """The one digest of a key, for the table built at start-up and for each presented token
    alike. surrogatepass: a key read from argv or a header may hold lone surrogates, and it must
    still encode (to the same bytes on both sides) rather than fail."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def match_key(token: str, digests: list[tuple[bytes, str]]) -> str | None:
    """The tenant of `token`, compared against every key in constant time.

    No early exit: the time taken does not depend on which key (if any)
    matched; comparing fixed-length digests also hides the keys' lengths."""
    presented = key_digest(token)
    tenant = None
    for digest, owner in digests:
        if hmac.compare_digest(presented, digest):
            tenant = owner
    return tenant
