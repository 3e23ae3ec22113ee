"""The googletrans backend against a fake of the service on httpx's mock transport: the
real googletrans client builds the requests and parses the answers; the fake decides
what the service says (translations, 429, 503, the source text handed back)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from mule.clients.googletrans import GoogleOptions, GoogleTranslateBackend, TranslationServiceError

FAST = GoogleOptions(concurrency=2, retries=3, backoff_s=1.0, timeout_s=5.0)


def answer(text: str, src: str) -> httpx.Response:
    return httpx.Response(200, text=json.dumps([[[text, None, None, None, 10]], None, src]))


class FakeService:
    """Translates by tagging (`[de] a dog runs`); scripts per sentence say what to answer first."""

    def __init__(self, scripts: dict[str, list] | None = None, delay: float = 0.0):
        self.scripts = {k: list(v) for k, v in (scripts or {}).items()}
        self.requests: list[str] = []
        self.in_flight = self.max_in_flight = 0
        self.delay = delay

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host == "translate.googleapis.com" and request.url.path == "/translate_a/single"
        query, src, dest = (request.url.params[k] for k in ("q", "sl", "tl"))
        self.requests.append(query)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            script = self.scripts.get(query)
            step = script.pop(0) if script else "ok"
            if step == "ok":
                return answer(f"[{dest}] {query}", src)
            if step == "same":
                return answer(query, src)  # the silent failure
            return httpx.Response(step)
        finally:
            self.in_flight -= 1


def run(service: FakeService, texts: list[str], options: GoogleOptions = FAST):
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    backend = GoogleTranslateBackend(options, transport=httpx.MockTransport(service), sleep=sleep, rng=random.Random(0))
    results: dict[int, tuple] = {}
    error = None
    try:
        backend.translate(texts, "en", "de", lambda i, text, reason: results.__setitem__(i, (text, reason)))
    except TranslationServiceError as e:
        error = e
    return backend, results, sleeps, error


def test_success_one_request_per_sentence():
    service = FakeService()
    backend, results, sleeps, error = run(service, ["a dog runs", "two men talk"])
    assert error is None and results == {0: ("[de] a dog runs", ""), 1: ("[de] two men talk", "")}
    assert backend.stats.requests == 2 and sleeps == []
    assert backend.version.startswith("googletrans-4")


def test_429_then_success_after_backoff_with_jitter():
    service = FakeService({"a dog runs": [429, 429, "ok"]})
    backend, results, sleeps, error = run(service, ["a dog runs"])
    assert error is None and results[0] == ("[de] a dog runs", "")
    assert backend.stats.retries == 2 and backend.stats.statuses == {429: 2}
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0  # doubling, full jitter


def test_persistent_5xx_is_a_clear_error_and_the_rows_already_translated_are_delivered():
    service = FakeService({"the third": [503] * 10})
    backend, results, _, error = run(service, ["a dog runs", "two men talk", "the third"], GoogleOptions(
        concurrency=1, retries=3, backoff_s=0.01))  # fmt: skip
    assert isinstance(error, TranslationServiceError)
    assert "kept failing (HTTP 503 after 3 retries" in str(error) and "rerun later to resume" in str(error)
    assert results == {0: ("[de] a dog runs", ""), 1: ("[de] two men talk", "")}
    assert service.requests.count("the third") == 4


def test_the_source_handed_back_is_retried_then_rejected_never_stored():
    service = FakeService({"a dog runs": ["same", "ok"], "two men talk": ["same"] * 10})
    backend, results, _, error = run(service, ["a dog runs", "two men talk", "Paris"])
    assert error is None
    assert results[0] == ("[de] a dog runs", "")
    assert results[1] == (None, "the service returned the source text unchanged (4 attempts)")
    assert results[2] == ("[de] Paris", "")  # one word may stay as it is; this fake tags it anyway
    assert backend.stats.unchanged == 5


def test_the_concurrency_limit_is_respected():
    service = FakeService(delay=0.02)
    backend, results, _, _ = run(service, [f"sentence number {i}" for i in range(12)], GoogleOptions(concurrency=3))
    assert len(results) == 12 and service.max_in_flight == 3


def test_an_unreachable_service_fails_fast_and_says_what_to_do():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Name or service not known", request=request)

    backend = GoogleTranslateBackend(FAST, transport=httpx.MockTransport(refuse))
    with pytest.raises(
        TranslationServiceError, match="cannot reach translate.googleapis.com .*translate.backend=lexicon"
    ):
        backend.translate(["a dog runs"], "en", "de", lambda *args: None)
    assert backend.stats.requests == 1
