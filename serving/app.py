"""`mule serve`: one process, one model, the catalog's gallery in memory; a search page
and a JSON API.

    GET  /                          the page: type a sentence, or drop an image
    GET  /api/info                  the model, its languages, the gallery's size
    GET  /api/search?q=...&lang=&k= images for a sentence (language optional: detected)
    POST /api/image?k=              sentences per language for an image (the body: its bytes)
    GET  /images/{image_id}         a gallery image's file, by id

Only the catalog's images are ever opened, looked up by id in a table made at start-up:
nothing in a request is used as a path. A bad request gets a 4xx with a JSON
`{"error": ...}` that says what was wrong; an unexpected failure a 500 without a traceback.
"""

from __future__ import annotations

import logging
import time
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from mule_core.embedder import Embedder, EmbedError

from .gallery import Gallery

MAX_K = 100
STATUS = {"too large": 413, "not an image": 415, "not found": 404}  # every other EmbedError: 400
log = logging.getLogger("mule.serve")


class BadRequest(EmbedError):
    pass


def create_app(embedder: Embedder, gallery: Gallery, max_upload_bytes: int = 10 * 2**20,
               dataset: str = "") -> FastAPI:  # fmt: skip
    app = FastAPI(title="mule", docs_url="/api/docs", redoc_url=None, openapi_url="/api/openapi.json")
    page = resources.files("serving").joinpath("page.html").read_text(encoding="utf-8")

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
    def info() -> dict:
        return {"model": embedder.label, "dataset": dataset, "languages": embedder.languages,
                "images": len(gallery.image_ids), "captions": {k: len(v.ids) for k, v in gallery.captions.items()},
                "extractor": embedder.extractor, "max_k": MAX_K, "max_upload_bytes": max_upload_bytes}  # fmt: skip

    @app.get("/api/search")
    def search(q: str = "", lang: str | None = None, k: int = 10) -> dict:
        started = time.perf_counter()
        _check_k(k)
        found = embedder.text(q, lang or None)
        results = gallery.top_images(found.vector, k)
        for r in results:
            r["url"] = f"/images/{r['image_id']}" if r["image_id"] in gallery.files else None
        return {"query": q, "lang": found.lang, "language": found.language, "unknown_words": found.unknown_words,
                "gallery": len(gallery.image_ids), "results": results,
                "ms": round(1000 * (time.perf_counter() - started), 2)}  # fmt: skip

    @app.post("/api/image")
    async def image(request: Request, k: int = 5) -> dict:
        started = time.perf_counter()
        _check_k(k)
        body = await _body(request, max_upload_bytes)
        vector = embedder.image(body)
        results = gallery.top_captions(vector, k)
        return {"bytes": len(body), "results": results, "ms": round(1000 * (time.perf_counter() - started), 2)}

    @app.get("/images/{image_id}")
    def image_file(image_id: str) -> FileResponse:
        path = gallery.files.get(image_id)  # the catalog's table, never the request's string as a path
        if path is None or not path.is_file():
            raise StarletteHTTPException(404, f"no image {image_id!r} in the gallery")
        return FileResponse(path)

    return app


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
