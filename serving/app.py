"""`mule serve`: one process, one model, the catalog's gallery in memory; a search page
and a JSON API.

    GET  /                          the page: type a sentence, or drop an image
    GET  /api/info                  the model, its languages, the gallery's size
    GET  /api/search?q=...&lang=&k= images for a sentence (language optional: detected)
    GET  /api/embed?q=...&lang=     a sentence's vector in the shared space (for an index of your own)
    POST /api/image?k=              sentences per language for an image (the body: its bytes)
    GET  /images/{image_id}         a gallery image's file, by id

Only the catalog's images are ever opened, looked up by id in a table made at start-up:
nothing in a request is used as a path. A bad request gets a 4xx with a JSON
`{"error": ...}` that says what was wrong; an unexpected failure a 500 without a traceback.

Safe to leave running: the CPU work (the sentence and image encoders, the scan of the
gallery) runs on bounded pools of threads, never on the event loop, so a slow upload
does not stall the other requests; uploads decode on a pool of their own, one thread
fewer than the cores, so a burst of large images never queues in front of a search and
leaves the searches a core; uploads and
the other requests are admitted apart (at most `max_uploads` uploads and `max_in_flight`
others at once, the next get 503 with Retry-After), so uploads in flight never starve
the page or a search; a request's headers must arrive within `header_timeout` seconds and
an upload's body within `body_timeout` (408 otherwise: a client sending a byte a second
holds nothing for long), and a client that stops reading an answer is dropped after
`send_timeout` seconds of a full send buffer;
an upload's pixels and decoded bytes are checked from its header against budgets before
anything is decoded, and only JPEG, PNG, WebP, GIF, BMP and TIFF are opened (415 for the
rest); the Host header must name this server (a page on another site cannot reach a
loopback server by DNS rebinding); images go out with the type their own bytes declare
and `X-Content-Type-Options: nosniff`.

What it serves can change under it: `Live` holds the model and the gallery, and
serving.live reloads them (a new champion, new images) without a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from functools import partial
from importlib import resources
from pathlib import Path
from urllib.parse import quote

import anyio
import h11
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from mule.mule_core.embedder import MAX_QUERY_PIXELS, Embedder, EmbedError
from mule.serving.gallery import Gallery

MAX_K = 100
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STATUS = {"too large": 413, "not an image": 415, "not found": 404, "too slow": 408}  # every other EmbedError: 400
UPLOAD = ("POST", "/api/image")  # what the upload slots admit; every other request takes a general slot
log = logging.getLogger("mule.serve")


class BadRequest(EmbedError):
    pass


class ClientGone(Exception):
    """The client hung up before its upload was read: nobody to answer, nothing to log but a line."""


@dataclass(frozen=True)
class Served:
    """What answers the requests: the model as a function and the gallery it searches."""

    embedder: Embedder
    gallery: Gallery
    note: str = ""  # what it is, for /api/info (the registered version, when it was loaded)


class Live:
    """The Served in use; `swap` replaces it at once (a request in flight keeps the one it began with)."""

    def __init__(self, served: Served):
        self.current = served

    def swap(self, served: Served) -> None:
        self.current = served


@dataclass(frozen=True)
class Limits:
    """What one server grants its clients (mule serve's options). allowed_hosts: the names
    the Host header may carry (allowed_hosts_for: the bound address's); () checks nothing."""

    max_upload_bytes: int = 10 * 2**20
    max_pixels: int = MAX_QUERY_PIXELS
    max_in_flight: int = 64
    max_uploads: int = 8
    body_timeout: float = 10.0
    cpu_threads: int | None = None
    allowed_hosts: tuple[str, ...] = LOOPBACK


def create_app(embedder: Embedder, gallery: Gallery, dataset: str = "", limits: Limits = Limits(),
               live: Live | None = None) -> FastAPI:  # fmt: skip
    """The search page and API over `gallery`, within `limits`. `live`: what serving.live
    reloads (else made here from `embedder` and `gallery`)."""
    app = FastAPI(title="mule", docs_url="/api/docs", redoc_url=None, openapi_url="/api/openapi.json")
    page = resources.files("mule.serving").joinpath("page.html").read_text(encoding="utf-8")
    max_upload_bytes, max_pixels = limits.max_upload_bytes, limits.max_pixels
    threads = limits.cpu_threads or os.cpu_count() or 1
    cpu = anyio.CapacityLimiter(threads)
    # Uploads decode and run the CNN on threads of their own, one fewer than the cores: a
    # burst of large images queues there, never in front of a search, and the searches
    # keep a core (a niced upload pool of as many threads starved the uploads instead).
    upload_cpu = anyio.CapacityLimiter(max(1, threads - 1))
    live = live or Live(Served(embedder, gallery))
    app.state.live = live

    async def on_cpu(work, *args, limiter=cpu):
        """CPU work on a bounded pool (its own threads: the event loop keeps answering)."""
        return await anyio.to_thread.run_sync(partial(work, *args), limiter=limiter)

    app.add_middleware(Guard, allowed_hosts=tuple(h.lower() for h in limits.allowed_hosts),
                       max_in_flight=limits.max_in_flight, max_uploads=limits.max_uploads)  # fmt: skip
    _error_answers(app)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/api/info")
    async def info() -> dict:
        return _info(live.current, dataset, limits)

    def text_search(served: Served, q: str, lang: str | None, k: int) -> tuple:
        found = served.embedder.encode_text(q, lang or None, details=True)[0]
        return found, served.gallery.top_images(found.vector, k)

    @app.get("/api/search")
    async def search(q: str = "", lang: str | None = None, k: int = 10) -> dict:
        started, served = time.perf_counter(), live.current
        _check_k(k)
        found, results = await on_cpu(text_search, served, q, lang, k)
        for r in results:
            # an id is a path in the table layout (shoes/0001.jpg): quoted, its slashes kept
            r["url"] = f"/images/{quote(r['image_id'])}" if r["image_id"] in served.gallery.files else None
        return {"query": q, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
                "composed_words": found.composed_words,
                "gallery": len(served.gallery.image_ids), "results": results,
                "ms": round(1000 * (time.perf_counter() - started), 2)}  # fmt: skip

    @app.get("/api/embed")
    async def embed(q: str = "", lang: str | None = None) -> dict:
        found = await on_cpu(lambda: live.current.embedder.encode_text(q, lang or None, details=True)[0])
        return {"query": q, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
                "composed_words": found.composed_words, "vector": found.vector.tolist()}  # fmt: skip

    @app.post("/api/image")
    async def image(request: Request, k: int = 5) -> dict:
        started, served = time.perf_counter(), live.current
        _check_k(k)
        body = await _body(request, max_upload_bytes, limits.body_timeout)
        results = await on_cpu(lambda: served.gallery.top_captions(served.embedder.encode_image(body, max_pixels)[0], k),
                               limiter=upload_cpu)  # fmt: skip
        return {"bytes": len(body), "results": results, "ms": round(1000 * (time.perf_counter() - started), 2)}

    @app.get("/images/{image_id:path}")
    async def image_file(image_id: str) -> FileResponse:
        path = live.current.gallery.files.get(image_id)  # the catalog's table, never the request's string as a path
        kind = await anyio.to_thread.run_sync(image_type, path) if path is not None else None
        if kind is None:  # gone, or no longer an image (the file changed since the catalog was made)
            raise StarletteHTTPException(404, f"no image {image_id!r} in the gallery")
        return FileResponse(path, media_type=kind)

    return app


def _info(served: Served, dataset: str, limits: Limits) -> dict:
    """/api/info: what is served, and the limits a client must keep to."""
    embedder, gallery = served.embedder, served.gallery
    return {"model": embedder.label, "dataset": dataset, "languages": embedder.languages,
            "images": len(gallery.image_ids), "captions": {k: len(v.ids) for k, v in gallery.captions.items()},
            "extractor": embedder.extractor, "max_k": MAX_K, "max_upload_bytes": limits.max_upload_bytes,
            "max_pixels": limits.max_pixels, "index": gallery.index_kind, "loaded": served.note,
            "tokenizers": embedder.meta.get("tokenizers") or embedder.tokenizers,
            "tokenizer_drift": {lang: {"trained": t, "installed": i}
                                for lang, (t, i) in embedder.tokenizer_drift().items()}}  # fmt: skip


def _error_answers(app: FastAPI) -> None:
    """Every error a client can cause answers one JSON line; a bug answers 500 and leaves its
    traceback in the server's log."""

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, error: ClientGone) -> Response:
        log.info("%s %s: the client hung up before its upload arrived", request.method, request.url.path)
        return Response(status_code=400)  # nobody reads it

    @app.exception_handler(EmbedError)
    async def embed_error(request: Request, error: EmbedError) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=STATUS.get(error.kind, 400))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in error.errors())
        return JSONResponse({"error": problems or "bad request"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)  # the traceback stays in the server's log
        return JSONResponse({"error": "internal error (the server's log has the details)"}, status_code=500)


# An image's type, from its own first bytes (never from its name).
SIGNATURES = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF87a", "image/gif"),
              (b"GIF89a", "image/gif"), (b"BM", "image/bmp"), (b"II*\x00", "image/tiff"), (b"MM\x00*", "image/tiff"))  # fmt: skip


def image_type(path: Path) -> str | None:
    """The media type a file's bytes declare (JPEG, PNG, GIF, WebP, BMP, TIFF); None for a
    file that is missing or not one of them."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(16)
    except OSError:
        return None
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for signature, kind in SIGNATURES if head.startswith(signature)), None)


def allowed_hosts_for(host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The Host names a server bound to `host` answers to: the address itself and the
    loopback names, this machine's names when bound to every interface, and `extra`."""
    import socket

    names = [host, *LOOPBACK]
    if host in ("0.0.0.0", "::", ""):
        names += [socket.gethostname(), socket.getfqdn()]
    return tuple(dict.fromkeys(n.lower() for n in [*names, *extra] if n))


def _host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8000" -> "::1")."""
    if header.startswith("["):
        return header[1 : header.find("]")].lower()
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


class Guard:
    """ASGI middleware in front of every route: the Host check, admission (503 with
    Retry-After past it; uploads in slots of their own, so that they never starve the page
    or a search) and nosniff on every response."""

    def __init__(self, app, allowed_hosts: tuple[str, ...], max_in_flight: int, max_uploads: int = 8):
        self.app, self.allowed_hosts = app, allowed_hosts
        self.limits = {"upload": max_uploads, "other": max_in_flight}
        self.in_flight = {"upload": 0, "other": 0}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.allowed_hosts and host not in self.allowed_hosts:
            return await _refuse(send, 421, f"this server does not answer to the host {host!r} (it answers to "
                                            f"{', '.join(self.allowed_hosts)}; mule serve --allowed-host adds one)")  # fmt: skip
        kind = "upload" if (scope.get("method"), scope.get("path")) == UPLOAD else "other"
        if self.in_flight[kind] >= self.limits[kind]:
            what = "uploads" if kind == "upload" else "requests"
            return await _refuse(send, 503, f"busy: {self.in_flight[kind]} {what} in flight; try again in a second",
                                 [(b"retry-after", b"1")])  # fmt: skip
        self.in_flight[kind] += 1

        async def send_nosniff(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
            await send(message)

        try:
            await self.app(scope, receive, send_nosniff)
        finally:
            self.in_flight[kind] -= 1


async def _refuse(send, status: int, error: str, headers: list | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-content-type-options", b"nosniff"), *(headers or [])]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _check_k(k: int) -> None:
    if not 1 <= k <= MAX_K:
        raise BadRequest(f"k must be between 1 and {MAX_K}, got {k}")


async def _body(request: Request, limit: int, timeout: float = 10.0) -> bytes:
    """The upload, refused as soon as it passes the limit (never read whole first), and
    when it has not all arrived within `timeout` seconds (408): a client that sends a byte
    a second holds its slot for seconds, not for as long as it likes."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the upload is {int(declared):,} bytes; at most {limit:,}", "too large")
    chunks, size = [], 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise BadRequest(f"the upload is more than {limit:,} bytes", "too large")
                chunks.append(chunk)
    except TimeoutError:
        raise BadRequest(f"the upload did not arrive within {timeout:g} s ({size:,} bytes came)", "too slow") from None
    except ClientDisconnect:
        raise ClientGone() from None
    body = b"".join(chunks)
    if not body:
        raise BadRequest("no image: the request's body is empty (send the image's bytes)", "empty")
    return body


class DeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with deadlines uvicorn alone does not keep (it waits for
    ever): a connection that has not sent a whole request head within `header_timeout`
    seconds of opening (or of its last answer) gets 408 and is closed; one that stops
    reading an answer (a large /images/... file) is dropped when its send buffer has stayed
    full for `send_timeout` seconds, so its request ends and gives its slot back."""

    header_timeout = 10.0
    send_timeout = 30.0
    _timer: asyncio.TimerHandle | None = None
    _send_timer: asyncio.TimerHandle | None = None

    def pause_writing(self) -> None:
        super().pause_writing()  # the client reads slower than we write: the answer waits
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout, self._reads_too_slowly)

    def resume_writing(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def _reads_too_slowly(self) -> None:
        self._send_timer = None
        if not self.transport.is_closing():
            log.info("%s: dropped a client that read nothing of its answer for %g s", self.client, self.send_timeout)
            self.transport.abort()  # connection_lost follows: the request's send returns, its slot is free

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole request head has come
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head, on a kept-alive connection

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)

    def _headers_too_slow(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        body = json.dumps({"error": f"the request's headers did not arrive within {self.header_timeout:g} s"}).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
        self.transport.close()


def deadline_protocol(header_timeout: float, send_timeout: float = 30.0) -> type[DeadlineProtocol]:
    """DeadlineProtocol with these deadlines, for uvicorn.run(http=...)."""
    return type("DeadlineProtocol", (DeadlineProtocol,), {"header_timeout": header_timeout, "send_timeout": send_timeout})
