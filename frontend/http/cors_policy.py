"""Which cross-origin requests the gateway allows (see cors.py for where it applies)."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

ANY = "*"


@dataclass(slots=True, frozen=True)
class CorsPolicy:
    origins: tuple[str, ...] = ()  # empty: CORS off
    methods: tuple[str, ...] = (ANY,)
    headers: tuple[str, ...] = (ANY,)
    allow_credentials: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def allow_origin(self, origin: str) -> str | None:
        """The Access-Control-Allow-Origin value for this origin, None if it is not allowed."""
        if ANY in self.origins:
            # With credentials, browsers refuse "*": the origin itself must be named.
            return origin if self.allow_credentials else ANY
        return origin if origin in self.origins else None

    def allows_method(self, method: str) -> bool:
        return ANY in self.methods or method.upper() in (m.upper() for m in self.methods)  # preflights only

    def allow_headers(self, requested: str) -> str:
        return requested if ANY in self.headers else ", ".join(self.headers)

    def response_headers(self, origin: str) -> dict[str, str]:
        allowed = self.allow_origin(origin)
        if allowed is None:
            return {}
        headers = {"Access-Control-Allow-Origin": allowed}
        if allowed != ANY:
            headers["Vary"] = "Origin"
        if self.allow_credentials:
            headers["Access-Control-Allow-Credentials"] = "true"
        return headers


def json_list(text: str) -> tuple[str, ...]:
    """vLLM's syntax: a JSON list of strings, e.g. '["https://app.example"]'."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, e.g. '[\"*\"]', got {text!r}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise argparse.ArgumentTypeError(f"expected a JSON list of non-empty strings, got {text!r}")
    return tuple(value)


def add_cors_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("CORS (vLLM's flags; off unless --allowed-origins is given)")
    group.add_argument("--allowed-origins", type=json_list, default=(),
                       help='origins browsers may call from, as a JSON list: \'["https://app.example"]\' or \'["*"]\'')
    group.add_argument("--allowed-methods", type=json_list, default=(ANY,), help='JSON list (default ["*"])')
    group.add_argument("--allowed-headers", type=json_list, default=(ANY,), help='JSON list (default ["*"])')
    group.add_argument("--allow-credentials", action="store_true", help="allow cookies and HTTP auth cross-origin")


def cors_policy_from_args(args: argparse.Namespace) -> CorsPolicy:
    return CorsPolicy(origins=args.allowed_origins, methods=args.allowed_methods, headers=args.allowed_headers,
                      allow_credentials=args.allow_credentials)
