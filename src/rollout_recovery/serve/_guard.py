"""Who may talk to a server: checks on a request's method, path and headers alone.

They run before the body is read (the transport asks :meth:`ServeApp.refusal` first), so a
refused client never makes the server buffer a body. In order:

- ``Host`` (DNS rebinding: a page of ``evil.example`` whose name now resolves to 127.0.0.1
  reaches a loopback server with ``Host: evil.example``): only ``127.0.0.1``, ``::1`` and
  ``localhost`` (any port), plus the names a server bound elsewhere was told to answer to
  (``--allow-host``); anything else is a 421, a missing or repeated ``Host`` a 400.
- ``Origin`` (a web page's ``fetch``): only the server's own origin, ``http://`` + its
  ``Host``; any other origin, ``null`` included, is a 403. Clients that are not browsers
  send no ``Origin``.
- ``Authorization: Bearer <key>`` when the server has an API key (the job's launched
  servers always do), on every route, ``/health`` included: the job's probe of ``/health``
  must fail on a server that would refuse its calls (another job's server on a reused port,
  a restart with another key), not pass it and lose every call. Compared in constant time.
  Missing or wrong: a 401.
- ``Content-Type: application/json`` on every POST (415 otherwise): a web page can send a
  cross-origin ``text/plain`` POST without asking first, never a JSON one.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from http import HTTPStatus
from urllib.parse import urlsplit

from ._api_error import ApiError, shown

__all__ = ["LOOPBACK_HOSTS", "RequestGuard", "normalize_host"]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
_ANY_HOST = "*"
_JSON = "application/json"
_UTF8 = frozenset({"utf-8", "utf8"})

Headers = Sequence[tuple[str, str]]


def normalize_host(name: str) -> str:
    """A host name as compared: lower case, an IPv6 address without its brackets."""
    name = name.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        return name[1:-1]
    return name


def _split_authority(value: str) -> tuple[str, int] | None:
    """``host[:port]`` (``[v6][:port]``) as (normalized host, port); None if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        host, rest = value[1:end], value[end + 1 :]
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    if not host:
        return None
    if not rest:
        return host, 80
    digits = rest[1:]
    if not rest.startswith(":") or not digits.isascii() or not digits.isdigit() or len(digits) > 5:
        return None
    return host, int(digits)


def _only(headers: Headers, name: str) -> str | None:
    """The value of header ``name`` (None when absent); a 400 when it is repeated."""
    values = [value for key, value in headers if key.lower() == name]
    if len(values) > 1:
        raise ApiError(HTTPStatus.BAD_REQUEST, f"the {name.title()} header is repeated")
    return values[0] if values else None


class RequestGuard:
    """The checks of the module docstring for one server's ``api_key`` and allowed hosts."""

    def __init__(self, *, api_key: str | None, allowed_hosts: Iterable[str] = ()) -> None:
        self._key = None if api_key is None else api_key.encode()
        extra = {normalize_host(name) for name in allowed_hosts}
        self._any_host = _ANY_HOST in extra
        self._hosts = LOOPBACK_HOSTS | (extra - {_ANY_HOST})

    def check_headers(self, headers: Headers) -> None:
        """Host, Origin and the API key: raises the :class:`ApiError` that refuses them."""
        authority = self._check_host(_only(headers, "host"))
        self._check_origin(_only(headers, "origin"), authority)
        self._check_key(_only(headers, "authorization"))

    def _check_host(self, value: str | None) -> tuple[str, int]:
        if value is None:
            raise ApiError(HTTPStatus.BAD_REQUEST, "a request needs a Host header")
        authority = _split_authority(value)
        if authority is None:
            raise ApiError(HTTPStatus.BAD_REQUEST, f"malformed Host header {shown(value)}")
        if not self._any_host and authority[0] not in self._hosts:
            raise ApiError(
                HTTPStatus.MISDIRECTED_REQUEST,
                f"this server does not answer requests for host {shown(authority[0])} (it "
                f"answers {', '.join(sorted(self._hosts))}; a server bound to another "
                "address is told the names it is reached by with --allow-host)",
            )
        return authority

    def _check_origin(self, value: str | None, authority: tuple[str, int]) -> None:
        if value is None:
            return
        parts = urlsplit(value.strip().lower())
        own = parts.scheme == "http" and parts.path in ("", "/") and not parts.query
        if own:
            origin = _split_authority(parts.netloc)
            own = origin == authority
        if not own:
            raise ApiError(
                HTTPStatus.FORBIDDEN,
                f"cross-origin requests are refused (Origin {shown(value)})",
            )

    def _check_key(self, value: str | None) -> None:
        if self._key is None:
            return
        scheme, _, token = (value or "").strip().partition(" ")
        given = token.strip().encode("utf-8", "replace")
        # Constant time: how long a refusal takes says nothing about how much was right.
        if not (scheme.lower() == "bearer" and hmac.compare_digest(given, self._key)):
            raise ApiError(
                HTTPStatus.UNAUTHORIZED,
                "this server needs its API key: send Authorization: Bearer <key>",
                headers=(("WWW-Authenticate", "Bearer"),),
            )

    @staticmethod
    def check_content_type(headers: Headers) -> None:
        """A POST's body must be declared JSON (UTF-8): a 415 otherwise."""
        value = _only(headers, "content-type")
        media, *params = (value or "").split(";")
        charsets = [
            v.strip().strip('"').lower()
            for k, _, v in (p.partition("=") for p in params)
            if k.strip().lower() == "charset"
        ]
        if media.strip().lower() != _JSON or any(c not in _UTF8 for c in charsets):
            got = "none" if value is None else shown(value)
            raise ApiError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                f"request bodies must be JSON: send Content-Type: {_JSON} (got {got})",
            )
