"""An HTTP error answer, and vLLM's error body for it.

vLLM answers every refused request with ``{"error": {"message", "type", "param", "code"}}``
(``tests/fixtures/vllm/error_*.json``). A request the server understood but refuses has
``type`` the status as an exception name (``BadRequestError``, ``NotFoundError``); a body
that breaks the request schema (a wrong JSON type, a missing field) has ``type`` the
status phrase (``Bad Request``) and ``param`` the field as ``body.<path>``.
"""

from __future__ import annotations

import reprlib
from http import HTTPStatus

import msgspec

from ..errors import RolloutRecoveryError

__all__ = ["ApiError", "bad_request", "error_body", "error_type", "schema_error", "shown"]

# A request's value quoted in an error message: bounded in depth and length, so a refused
# 60 MiB string or a list nested 900 deep makes a short message (and no deep recursion).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel = 3
_SHOWN.maxstring = 60
_SHOWN.maxother = 60
_SHOWN.maxlong = 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = 6


def shown(value: object) -> str:
    """``repr(value)``, shortened for an error message (``'xxxx...xxxx'``, ``[[[...]]]``)."""
    return _SHOWN.repr(value)


def error_type(status: int) -> str:
    """``400`` -> ``BadRequestError``, ``404`` -> ``NotFoundError``, as vLLM names them."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "Error"
    name = "".join(word[:1].upper() + word[1:] for word in phrase.replace("-", " ").split())
    return name if name.endswith("Error") else f"{name}Error"


def error_body(
    status: int, message: str, *, param: str | None = None, type: str | None = None
) -> bytes:
    """The JSON body of an error answer with ``status`` (``type`` defaults by status)."""
    error = {
        "message": message,
        "type": error_type(status) if type is None else type,
        "param": param,
        "code": status,
    }
    return msgspec.json.encode({"error": error})


class ApiError(RolloutRecoveryError):
    """A request refused with an HTTP ``status``; ``param`` names the request field at fault.

    Raised inside the server only, and turned into vLLM's error body; it never reaches a
    library caller. ``headers`` are extra response headers (``Allow`` on a 405); ``close``
    ends the connection after the answer.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        type: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.headers = headers
        self.close = close

    def body(self) -> bytes:
        return error_body(self.status, self.message, param=self.param, type=self.type)


def bad_request(message: str, *, param: str | None = None) -> ApiError:
    """A 400 refusal: the request is well formed but asks for what this server cannot do."""
    return ApiError(HTTPStatus.BAD_REQUEST, message, param=param)


def schema_error(message: str, *, field: str | None) -> ApiError:
    """A 400 for a body that breaks the request schema; ``field`` is its path (``a.b[1]``)."""
    return ApiError(
        HTTPStatus.BAD_REQUEST,
        message,
        param=None if field is None else f"body.{field}",
        type=HTTPStatus.BAD_REQUEST.phrase,
    )
