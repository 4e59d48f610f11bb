"""What a generation server's URL may hold, and how a server's key travels instead.

A server's URL is recorded wherever a call is: ``events.jsonl``, ``metrics.jsonl``, every
row's extras, the progress output. A secret in it (``http://user:token@host``,
``?api_key=...``) would be written out in clear text everywhere, so such a URL is refused;
a key travels as an ``Authorization: Bearer`` header, which nothing records.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["bearer_headers", "server_url_problem"]


def server_url_problem(url: str) -> str | None:
    """Why ``url`` may not name a server (it carries credentials, a query or a fragment),
    or None. The reason never quotes the URL: it may hold a secret."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a valid URL"
    if "@" in parts.netloc:
        return "carries credentials (user:password@)"
    if "?" in url or "#" in url:
        return "carries a query or fragment"
    return None


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The headers that present ``api_key`` (none without one)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
