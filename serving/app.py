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
gallery) runs on a bounded pool of threads, never on the event loop, so a slow upload
does not stall the other requests; at most `max_in_flight` requests are admitted (the
next get 503 with Retry-After); an upload's pixels are checked from its header against
a budget before anything is decoded; the Host header must name this server (a page on
another site cannot reach a loopback server by DNS rebinding); images go out with the
type their own bytes declare and `X-Content-Type-Options: nosniff`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from functools import partial
from importlib import resources
from pathlib import Path

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mule.mule_core.embedder import MAX_QUERY_PIXELS, Embedder, EmbedError

from .gallery import Gallery

MAX_K = 100
LOOPBACK = ("127.0.0.1", "localhost", "::1")
STATUS = {"too large": 413, "not an image": 415, "not found": 404}  # every other EmbedError: 400
log = logging.getLogger("mule.serve")


class BadRequest(EmbedError):
    pass


def create_app(embedder: Embedder, gallery: Gallery, max_upload_bytes: int = 10 * 2**20, dataset: str = "", *,
               max_pixels: int = MAX_QUERY_PIXELS, max_in_flight: int = 64, cpu_threads: int | None = None,
               allowed_hosts: tuple[str, ...] = LOOPBACK) -> FastAPI:  # fmt: skip
    """The search page and API over `gallery`. allowed_hosts: the names the Host header may
    carry (serve.allowed_hosts_for: the bound address's); () checks nothing."""
    app = FastAPI(title="mule", docs_url="/api/docs", redoc_url=None, openapi_url="/api/openapi.json")
    page = resources.files("mule.serving").joinpath("page.html").read_text(encoding="utf-8")
    cpu = anyio.CapacityLimiter(cpu_threads or os.cpu_count() or 1)

    async def on_cpu(work, *args):
        """CPU work on the bounded pool (its own threads: the event loop keeps answering)."""
        return await anyio.to_thread.run_sync(partial(work, *args), limiter=cpu)

    app.add_middleware(Guard, allowed_hosts=tuple(h.lower() for h in allowed_hosts), max_in_flight=max_in_flight)

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

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/api/info")
    async def info() -> dict:
        return {"model": embedder.label, "dataset": dataset, "languages": embedder.languages,
                "images": len(gallery.image_ids), "captions": {k: len(v.ids) for k, v in gallery.captions.items()},
                "extractor": embedder.extractor, "max_k": MAX_K, "max_upload_bytes": max_upload_bytes,
                "max_pixels": max_pixels, "index": gallery.index_kind}  # fmt: skip

    def text_search(q: str, lang: str | None, k: int) -> tuple:
        found = embedder.text(q, lang or None)
        return found, gallery.top_images(found.vector, k)

    @app.get("/api/search")
    async def search(q: str = "", lang: str | None = None, k: int = 10) -> dict:
        started = time.perf_counter()
        _check_k(k)
        found, results = await on_cpu(text_search, q, lang, k)
        for r in results:
            r["url"] = f"/images/{r['image_id']}" if r["image_id"] in gallery.files else None
        return {"query": q, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
                "composed_words": found.composed_words,
                "gallery": len(gallery.image_ids), "results": results,
                "ms": round(1000 * (time.perf_counter() - started), 2)}  # fmt: skip

    @app.get("/api/embed")
    async def embed(q: str = "", lang: str | None = None) -> dict:
        found = await on_cpu(embedder.text, q, lang or None)
        return {"query": q, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
                "composed_words": found.composed_words, "vector": found.vector.tolist()}  # fmt: skip

    @app.post("/api/image")
    async def image(request: Request, k: int = 5) -> dict:
        started = time.perf_counter()
        _check_k(k)
        body = await _body(request, max_upload_bytes)
        results = await on_cpu(lambda: gallery.top_captions(embedder.image(body, max_pixels), k))
        return {"bytes": len(body), "results": results, "ms": round(1000 * (time.perf_counter() - started), 2)}

    @app.get("/images/{image_id}")
    async def image_file(image_id: str) -> FileResponse:
        path = gallery.files.get(image_id)  # the catalog's table, never the request's string as a path
        kind = await anyio.to_thread.run_sync(image_type, path) if path is not None else None
        if kind is None:  # gone, or no longer an image (the file changed since the catalog was made)
            raise StarletteHTTPException(404, f"no image {image_id!r} in the gallery")
        return FileResponse(path, media_type=kind)

    return app


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
    """ASGI middleware in front of every route: the Host check, the admission bound (503
    with Retry-After past it) and nosniff on every response."""

    def __init__(self, app, allowed_hosts: tuple[str, ...], max_in_flight: int):
        self.app, self.allowed_hosts, self.max_in_flight = app, allowed_hosts, max_in_flight
        self.in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = _host_name(headers.get(b"host", b"").decode("latin-1"))
        if self.allowed_hosts and host not in self.allowed_hosts:
            return await _refuse(send, 421, f"this server does not answer to the host {host!r} (it answers to "
                                            f"{', '.join(self.allowed_hosts)}; mule serve --allowed-host adds one)")  # fmt: skip
        if self.in_flight >= self.max_in_flight:
            return await _refuse(send, 503, f"busy: {self.in_flight} requests in flight; try again in a second",
                                 [(b"retry-after", b"1")])  # fmt: skip
        self.in_flight += 1

        async def send_nosniff(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
            await send(message)

        try:
            await self.app(scope, receive, send_nosniff)
        finally:
            self.in_flight -= 1


async def _refuse(send, status: int, error: str, headers: list | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"x-content-type-options", b"nosniff"), *(headers or [])]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def _check_k(k: int) -> None:
    if not 1 <= k <= MAX_K:
        raise BadRequest(f"k must be between 1 and {MAX_K}, got {k}")


async def _body(request: Request, limit: int) -> bytes:
    """The upload, refused as soon as it passes the limit (never read whole first)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the upload is {int(declared):,} bytes; at most {limit:,}", "too large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the upload is more than {limit:,} bytes", "too large")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise BadRequest("no image: the request's body is empty (send the image's bytes)", "empty")
    return body
