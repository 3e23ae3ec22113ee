"""Machine translation through googletrans (an unofficial client of Google's free web
translator), used so that it cannot get a user banned nor lose work.

googletrans 4 is async and, by default, answers a failed request with the *source text*
as if it were the translation. Here it runs with `raise_exception=True` on the API host
(`translate.googleapis.com`, no web-page token scraping), and this module owns what the
client lacks: a concurrency limit, a per-request timeout, retries with exponential
backoff and full jitter on 429 and 5xx, a fast and clear error when the service cannot
be reached, and detection of its silent failure (a "translation" equal to the source is
retried, then rejected, never stored). Each result is handed to `on_result` as soon as it
arrives, so the caller stores it before more requests are made: an interrupted run
loses at most the requests in flight.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from mule.mule_core.errors import UserError

_STATUS = re.compile(r'Unexpected status code "(\d+)"')
SERVICE = "translate.googleapis.com"


class TranslationServiceError(UserError):
    pass


@dataclass
class ServiceStats:
    requests: int = 0
    retries: int = 0
    unchanged: int = 0
    failures: int = 0
    statuses: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GoogleOptions:
    concurrency: int = 4  # requests in flight at once
    timeout_s: float = 10.0  # per request
    retries: int = 5  # per sentence, on 429, 5xx, timeouts and unchanged text
    backoff_s: float = 1.0  # first backoff; doubles each retry, full jitter
    max_backoff_s: float = 60.0
    service_url: str = SERVICE


def looks_untranslated(source: str, translation: str) -> bool:
    """googletrans's silent failure: the source handed back. A sentence of two or more
    words is never identical in two different languages."""
    words = re.findall(r"\w+", source)
    return len(words) >= 2 and translation.strip().casefold() == source.strip().casefold()


class GoogleTranslateBackend:
    name = "googletrans"

    def __init__(self, options: GoogleOptions | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 sleep: Callable[[float], object] = asyncio.sleep, rng: random.Random | None = None):  # fmt: skip
        from importlib.metadata import version

        self.options = options or GoogleOptions()
        self.version = f"googletrans-{version('googletrans')}"
        self._transport = transport  # tests: a fake of the service under the real client
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.stats = ServiceStats()

    def translate(self, texts: Sequence[str], src: str, dest: str,
                  on_result: Callable[[int, str | None, str], None]) -> ServiceStats:  # fmt: skip
        """Translates texts[i] for every i; calls on_result(i, translation, '') or
        on_result(i, None, reason) for each as it completes. Raises TranslationServiceError
        when the service is unreachable or keeps failing (results so far were delivered)."""
        asyncio.run(self._translate_all(list(texts), src, dest, on_result))
        return self.stats

    async def _translate_all(self, texts, src, dest, on_result) -> None:
        from googletrans import Translator

        async with Translator(service_urls=[self.options.service_url], raise_exception=True,
                              timeout=httpx.Timeout(self.options.timeout_s)) as translator:  # fmt: skip
            if self._transport is not None:
                await translator.client.aclose()
                translator.client = httpx.AsyncClient(transport=self._transport,
                                                      timeout=httpx.Timeout(self.options.timeout_s))  # fmt: skip
            semaphore = asyncio.Semaphore(self.options.concurrency)

            async def one(index: int) -> None:
                async with semaphore:
                    translation, reason = await self._with_retries(translator, texts[index], src, dest)
                on_result(index, translation, reason)

            tasks = [asyncio.create_task(one(i)) for i in range(len(texts))]
            try:
                await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _with_retries(self, translator, text: str, src: str, dest: str) -> tuple[str | None, str]:
        options, last = self.options, ""
        for attempt in range(options.retries + 1):
            if attempt:
                self.stats.retries += 1
                delay = min(options.max_backoff_s, options.backoff_s * 2 ** (attempt - 1))
                await self._sleep(self._rng.uniform(0, delay))  # full jitter
            self.stats.requests += 1
            try:
                result = await translator.translate(text, src=src, dest=dest)
            except httpx.ConnectError as error:
                raise TranslationServiceError(
                    f"cannot reach {options.service_url} ({error}): no network here? The offline backends need "
                    "none: --set translate.backend=lexicon (or induced)"
                ) from None
            except httpx.TimeoutException:
                last = f"no answer within {options.timeout_s:g} s"
                continue
            except Exception as error:  # googletrans raises a bare Exception for a bad status
                status = _STATUS.search(str(error))
                if status is None:
                    raise
                code = int(status.group(1))
                self.stats.statuses[code] = self.stats.statuses.get(code, 0) + 1
                if code == 429 or code >= 500:
                    last = f"HTTP {code}"
                    continue
                raise TranslationServiceError(
                    f"{options.service_url} answered HTTP {code} to a translation request"
                ) from None
            if looks_untranslated(text, result.text):
                self.stats.unchanged += 1
                last = "the service returned the source text unchanged"
                continue
            return result.text, ""
        self.stats.failures += 1
        if last.startswith("HTTP") or last.startswith("no answer"):
            raise TranslationServiceError(
                f"{options.service_url} kept failing ({last} after {options.retries} retries with backoff); "
                "the translations received so far are stored: rerun later to resume"
            )
        return None, f"{last} ({options.retries + 1} attempts)"
