"""The llama-server a command names: `host:port` or a URL made whole, and, when it does not answer
as asked, which of three things is wrong: nothing answers there, something answers that is not
llama-server, or llama-server answers but lacks what was asked of it (--metrics)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests


class ServerURLError(ValueError):
    """A URL that names no server: a scheme other than http(s), or no host."""


class NothingAnswers(ConnectionError):
    """No server answers at the URL."""


class NotLlamaServer(RuntimeError):
    """Something answers at the URL, but not llama-server."""


def server_url(url: str, flag: str = "URL") -> str:
    """The base URL of a server given as `host:port`, `host` or a URL (`http://` is added when no
    scheme is given), without a trailing slash."""
    text = url.strip()
    if not text:
        raise ServerURLError(f"{flag}: expected host:port or a URL like http://127.0.0.1:8080, got an empty string")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ServerURLError(f"{flag}: {url!r} is not an http:// or https:// URL")
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if not parts.hostname or not port_ok:
        raise ServerURLError(f"{flag}: {url!r} names no server (expected host:port or a URL like http://127.0.0.1:8080)")
    return text.rstrip("/")


def get(session: requests.Session, base: str, path: str, timeout: float) -> requests.Response:
    """GET base+path; NothingAnswers when no server answers at base."""
    try:
        return session.get(base + path, timeout=timeout)
    except requests.RequestException as e:
        raise NothingAnswers(f"nothing answers at {base} ({e.__class__.__name__}): is llama-server running, "
                             f"on that host and port?") from None


def llama_server_props(session: requests.Session, base: str, timeout: float) -> dict[str, Any]:
    """llama-server's /props at base; NotLlamaServer when what answers there is something else,
    NothingAnswers when nothing does."""
    r = get(session, base, "/props", timeout)
    try:
        props = r.json()
    except ValueError:
        props = None
    # every llama-server answers GET /props with its slots and generation settings (ours add llama_preempt);
    # one that wants an API key answers 401 with its own error shape
    if isinstance(props, dict) and ("default_generation_settings" in props or "total_slots" in props):
        return props
    err = props.get("error") if isinstance(props, dict) else None
    if r.status_code == 401 and isinstance(err, dict) and err.get("type") == "authentication_error":
        raise NotLlamaServer(f"llama-server at {base} wants an API key (--api-key); this command sends none")
    raise NotLlamaServer(f"{base} answers, but is not llama-server (GET /props: HTTP {r.status_code}, "
                         f"{'no llama.cpp properties' if r.status_code == 200 else r.reason}): check the host and port")
