"""Vision-language models behind an OpenAI-compatible chat-completions endpoint.

Serves OpenAI, Gemini's OpenAI-compatible endpoint and local vLLM/TGI servers. Images enter as
float32 in [0, 1], (H, W) or (H, W, 3) numpy arrays (the medrobust convention), are quantised to
uint8 and sent as base64 PNG data URLs in the OpenAI vision message format; ``None`` sends a
text-only message (plain string content, no image part).

Contract of :meth:`ApiVLM.generate` / :meth:`ApiVLM.score`: every input gets exactly one result in
input order and no failed request raises; failures are counted outcomes (:data:`Outcome`). Input
validation (length mismatch, bad image shape, non-finite pixels) raises ``ValueError`` before any
request is sent.

Retries: 429, 5xx, timeouts and connection errors are retried up to ``max_retries`` times with
exponential backoff and full jitter (``uniform(0, min(backoff_max_s, backoff_base_s * 2**k))``);
the jitter comes from :func:`medrobust_lib.seeding.rng_for` keyed on the request, so a rerun waits
the same. A ``Retry-After`` header (seconds or HTTP date) on 429/503 replaces the backoff (capped
at ``retry_after_max_s``). Other 4xx are final. A 200 whose body is not a chat completion is
``bad_response`` and not retried (a deterministic server fault would only burn quota).

The API key is read from the environment variable named by ``api_key_env`` when the adapter is
built; it is never a config field and never appears in a repr, result, error string or log record
(every response body is scrubbed of it whole, before it is parsed, cut, cached or logged). A key
is never sent in clear text: an ``http://`` base URL with ``api_key_env`` set is refused unless
the host is loopback (a local vLLM/TGI server), and proxy variables (``HTTP_PROXY``, ``ALL_PROXY``,
...) are ignored: requests go straight to the base URL's host.

Limits: ``deadline_s`` bounds one request's whole life (every attempt and backoff wait; within an
attempt connect, TLS, headers and the body to its last byte, enforced by a watchdog that closes
the connection: :mod:`medrobust_lib.models.http_deadline`); past it the outcome is ``timeout``.
``max_response_bytes`` caps a response body (read streamed; a larger body is ``bad_response``
without being kept in memory).

Cache faults never lose an answer (:mod:`medrobust_lib.models.cache`): a failed read is a miss, a
failed write after an HTTP 200 is a logged warning and the answer is returned as ``ok``.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import io
import json
import logging
import math
import os
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
import numpy as np
from PIL import Image

from medrobust_lib.config.vlm import ApiSettings
from medrobust_lib.models.base import VisionLanguageEndpoint
from medrobust_lib.models.cache import ResponseCache, cache_key
from medrobust_lib.models.http_deadline import DeadlineTransport, deadline
from medrobust_lib.models.secret_scrub import SecretScrubber
from medrobust_lib.seeding import rng_for

if TYPE_CHECKING:
    from medrobust_lib.config.vlm import VLMModelConfig
    from medrobust_lib.models.factory import VLMInputs

logger = logging.getLogger(__name__)

Outcome = Literal["ok", "http_error", "timeout", "connection_error", "bad_response", "refused", "client_error"]
"""``ok``: text returned. ``http_error``: final non-2xx (4xx other than 429 at once, 429/5xx after
all retries). ``timeout`` / ``connection_error``: transport failure after all retries.
``bad_response``: 200 whose body is not a usable chat completion (garbage JSON, no choices, no
content). ``refused``: the model declined (``refusal`` field or ``finish_reason ==
'content_filter'``). ``client_error``: an unexpected exception in the adapter itself."""

OUTCOMES: tuple[str, ...] = (
    "ok", "http_error", "timeout", "connection_error", "bad_response", "refused", "client_error",
)

TOP_LOGPROBS = 20
"""How many alternatives :meth:`ApiVLM.score` asks for (the OpenAI maximum)."""


class _BodyTooLarge(Exception):
    pass


@dataclass(frozen=True)
class ApiResult:
    """Outcome of one request.

    ``attempts`` counts HTTP attempts (0 for a cache hit). ``latency_s`` is wall time from the
    first attempt to the result, backoff waits included. ``logprobs`` maps the first generated
    token's top alternatives (token text as returned) to natural-log probabilities, when requested
    and returned. ``error`` is a short description, never containing the API key.
    """

    text: str | None
    outcome: str
    status_code: int | None = None
    attempts: int = 0
    latency_s: float = 0.0
    cache_hit: bool = False
    error: str | None = None
    logprobs: dict[str, float] | None = None
    waits_s: tuple[float, ...] = field(default=())
    truncated: bool | None = None
    """The answer stopped at ``max_tokens`` (``finish_reason == "length"``); None: no answer."""
    sanitized: bool = False
    """``text`` had characters no store can hold or a terminal should print (lone surrogates, NUL,
    ESC, other control characters), replaced by U+FFFD (:func:`sanitize_text`)."""

    @property
    def ok(self) -> bool:
        """True when the outcome is ``ok``."""
        return self.outcome == "ok"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (for stores and JSON)."""
        d = asdict(self)
        d["waits_s"] = list(self.waits_s)
        return d


# ---------------------------------------------------------------------------------------------
# functional core


def read_api_key(env: str) -> str:
    """The API key in environment variable ``env``; ``ValueError`` (one line, naming ``env``, never
    the value) when it is unset, empty, has whitespace at an end or holds a control character (a
    CRLF ``.env`` file or ``kubectl create secret --from-file`` leaves a trailing ``\\r``/``\\n``:
    such a header is refused by the HTTP library with the key printed escaped in its message)."""
    key = os.environ.get(env)
    if not key:
        raise ValueError(f"environment variable {env!r} (API key) is not set or empty")
    if key != key.strip():
        raise ValueError(f"environment variable {env!r} (API key) has whitespace or a line break at its start "
                         "or end (a CRLF .env file or kubectl --from-file leaves one): remove it; the key "
                         "is not used")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in key):
        raise ValueError(f"environment variable {env!r} (API key) holds a control character: remove it; the "
                         "key is not used")
    return key


def quantize_image(image: np.ndarray) -> np.ndarray:
    """float [0, 1] (H, W) or (H, W, 3) -> uint8 of the same shape (values clipped, rounded).

    Raises ``ValueError`` for other shapes or non-finite values.
    """
    arr = np.asarray(image)
    if not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
        raise ValueError(f"image must be (H, W) or (H, W, 3), got shape {arr.shape}")
    if arr.dtype == np.uint8:
        return arr
    arr = arr.astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError("image contains non-finite values")
    return np.rint(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)


def image_hash(pixels: np.ndarray) -> str:
    """SHA-256 hex of a uint8 image's shape and bytes (independent of the PNG encoder version)."""
    h = hashlib.sha256(repr(pixels.shape).encode("ascii"))
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.hexdigest()


def png_data_url(pixels: np.ndarray) -> str:
    """uint8 (H, W) or (H, W, 3) -> ``data:image/png;base64,...``."""
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="L" if pixels.ndim == 2 else "RGB").save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


_UNSAFE = re.compile("[\ud800-\udfff\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]")
"""Characters replaced in an answer: surrogates (lone ones cannot be encoded as UTF-8: SQLite,
Parquet and the terminal refuse them), C0 controls but tab and line feed, DEL, C1 controls, the
Unicode line/paragraph separators and the noncharacters U+FFFE/U+FFFF."""


def sanitize_text(text: str) -> tuple[str, bool]:
    """``(text with every :data:`_UNSAFE` character replaced by U+FFFD, whether any was)``. A
    surrogate pair (valid in JSON, not in UTF-8) becomes two U+FFFD; ``\\r\\n`` becomes ``\\n``
    (not counted as a replacement)."""
    if not _UNSAFE.search(text):
        return text, False
    text = text.replace("\r\n", "\n")
    out = _UNSAFE.sub("\ufffd", text)
    return out, out != text


def build_messages(data_url: str | None, prompt: str, system: str | None = None) -> list[dict[str, Any]]:
    """One user message: image part then text part, or plain-string content when text-only;
    after a system message when ``system`` is given."""
    head: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    if data_url is None:
        return [*head, {"role": "user", "content": prompt}]
    return [*head, {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": data_url}},
            {"type": "text", "text": prompt},
        ],
    }]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or HTTP date; past dates -> 0); ``None`` if absent
    or unparseable. ``now`` is a POSIX time (default: current time)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        ref = datetime.now(UTC).timestamp() if now is None else now
        return max(0.0, when.timestamp() - ref)
    return max(0.0, seconds) if math.isfinite(seconds) else None


def backoff_wait(attempt: int, base_s: float, max_s: float, rng: np.random.Generator) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (1-based):
    ``uniform(0, min(max_s, base_s * 2**(attempt-1)))``."""
    cap = min(max_s, base_s * (2.0 ** (attempt - 1)))
    return float(rng.uniform(0.0, cap)) if cap > 0 else 0.0


def parse_completion(body: Any) -> tuple[str, str | None, str | None, dict[str, float] | None]:
    """Chat-completion JSON -> ``(outcome, text, error, first-token top logprobs)``.

    ``outcome`` is ``ok``, ``refused`` or ``bad_response``.
    """
    if not isinstance(body, dict):
        return "bad_response", None, "response is not a JSON object", None
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "bad_response", None, "response has no choices", None
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return "bad_response", None, "choice has no message", None
    logprobs = _first_token_logprobs(choice.get("logprobs"))
    content = message.get("content")
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        return "refused", refusal, "model refused", logprobs
    if choice.get("finish_reason") == "content_filter":
        return "refused", content if isinstance(content, str) else None, "content filtered", logprobs
    if not isinstance(content, str):
        return "bad_response", None, "message has no text content", logprobs
    return "ok", content, None, logprobs


def hit_token_cap(body: Any) -> bool | None:
    """True when a chat completion stopped at its token cap (``finish_reason == "length"``), False
    for any other finish reason, None when the body names none."""
    try:
        reason = body["choices"][0].get("finish_reason")
    except (TypeError, KeyError, IndexError, AttributeError):
        return None
    return None if reason is None else reason == "length"


def _first_token_logprobs(lp: Any) -> dict[str, float] | None:
    """``choice.logprobs.content[0].top_logprobs`` -> {token: logprob}; ``None`` when absent.
    The chosen token itself is included (some servers leave it out of its own top list)."""
    if not isinstance(lp, dict):
        return None
    content = lp.get("content")
    if not isinstance(content, list) or not content or not isinstance(content[0], dict):
        return None
    first = content[0]
    out: dict[str, float] = {}
    for item in first.get("top_logprobs") or []:
        if isinstance(item, dict) and isinstance(item.get("token"), str) and _is_number(item.get("logprob")):
            out.setdefault(item["token"], float(item["logprob"]))
    if isinstance(first.get("token"), str) and _is_number(first.get("logprob")):
        out.setdefault(first["token"], float(first["logprob"]))
    return out or None


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def option_logprobs(top: dict[str, float], options: Sequence[str]) -> dict[str, float | None]:
    """Map answer options to log-probabilities from a first-token top list.

    A token matches an option when they are equal after stripping whitespace and case-folding
    (" Yes" matches "yes"); several matching tokens are combined by log-sum-exp (total probability).
    Options with no matching token get ``None`` (below the top-k cut, not impossible).
    """
    out: dict[str, float | None] = {}
    for opt in options:
        norm = opt.strip().casefold()
        vals = [v for tok, v in top.items() if tok.strip().casefold() == norm]
        if not vals:
            out[opt] = None
        else:
            m = max(vals)
            out[opt] = m + math.log(sum(math.exp(v - m) for v in vals))
    return out


# ---------------------------------------------------------------------------------------------
# stateful shell


@dataclass(frozen=True)
class _Prepared:
    payload: dict[str, Any]
    key: str


class ApiVLM:
    """Batched client for an OpenAI-compatible ``/chat/completions`` endpoint.

    ``sleep`` is called with each backoff wait in seconds (inject a recorder in tests);
    ``clock`` measures latency. The object holds one pooled ``httpx.Client`` (thread-safe); call
    :meth:`close` or use it as a context manager.
    """

    def __init__(
        self,
        config: ApiSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        system_prompt: str | None = None,
    ) -> None:
        self.config = config
        self.system_prompt = system_prompt
        self.model_id = config.model
        self._sleep = sleep
        self._clock = clock
        self._key: str | None = None
        self._scrubber: SecretScrubber | None = None
        if config.api_key_env is not None:
            self._key = read_api_key(config.api_key_env)
            self._scrubber = SecretScrubber(self._key)
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
        # trust_env=False: proxy variables (HTTP_PROXY, ALL_PROXY, ...) are ignored, so a keyed
        # request goes only to its own host; DeadlineTransport bounds each request's whole life.
        self._client = httpx.Client(timeout=httpx.Timeout(config.timeout_s), trust_env=False,
                                    transport=DeadlineTransport(limits))
        self._cache = ResponseCache(config.cache_path) if config.cache_path else None
        self._lock = threading.Lock()
        self.http_calls = 0
        """HTTP attempts made by this adapter (all calls together)."""

    @classmethod
    def from_config(cls, m: VLMModelConfig, inputs: VLMInputs) -> ApiVLM:
        """The client of a suite's ``kind: api`` entry: its ``api`` settings, with the response
        cache at ``inputs.cache_path`` (folder created) and ``inputs.seed`` unless the settings
        name their own; the constructor that :func:`medrobust_lib.models.factory.build_vlm`
        calls."""
        if m.api is None:
            raise ValueError(f"VLM {m.id!r} has no 'api' settings")
        given = m.api.model_fields_set
        update: dict[str, Any] = {} if "seed" in given else {"seed": inputs.seed}
        if inputs.cache_path is not None and "cache_path" not in given:
            update["cache_path"] = inputs.cache_path
        settings = m.api.model_copy(update=update)
        if settings.cache_path:
            Path(settings.cache_path).parent.mkdir(parents=True, exist_ok=True)
        return cls(settings, system_prompt=m.system_prompt)

    def __repr__(self) -> str:
        return f"ApiVLM(model={self.config.model!r}, base_url={self.config.base_url!r})"

    def __enter__(self) -> ApiVLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP pool and the cache."""
        self._client.close()
        if self._cache is not None:
            self._cache.close()

    # -- public API ----------------------------------------------------------------------------

    def generate(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> list[ApiResult]:
        """One :class:`ApiResult` per (image, prompt), in input order; never raises for a failed
        request. ``images[i]`` is float32 [0, 1] (H, W) or (H, W, 3), or ``None`` (text-only)."""
        settings: dict[str, Any] = {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                                    **self._sampling()}
        if self.config.request_logprobs:
            settings.update(logprobs=True, top_logprobs=TOP_LOGPROBS)
        return self._run(self._prepare(images, prompts, settings))

    def score(
        self, images: Sequence[np.ndarray | None], prompts: Sequence[str], options: Sequence[str]
    ) -> list[dict[str, float | None] | None]:
        """Log-probabilities of ``options`` as the first generated token (see
        :func:`option_logprobs`), one dict per input; ``None`` where the endpoint returned no
        logprobs or the request failed, so the caller falls back to :meth:`generate` plus
        parsing and marks that answer's source as generation."""
        if not options:
            raise ValueError("options must be a non-empty sequence of answer strings")
        return [self._options(r, options) for r in self.score_results(images, prompts)]

    def score_results(self, images: Sequence[np.ndarray | None], prompts: Sequence[str]) -> list[ApiResult]:
        """The raw results behind :meth:`score` (``max_tokens=1``, ``logprobs``,
        ``top_logprobs=20``), for callers that also record outcomes."""
        settings = {"temperature": self.config.temperature, "max_tokens": 1,
                    "logprobs": True, "top_logprobs": TOP_LOGPROBS}
        return self._run(self._prepare(images, prompts, settings))

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _options(result: ApiResult, options: Sequence[str]) -> dict[str, float | None] | None:
        if result.outcome != "ok" or not result.logprobs:
            return None
        return option_logprobs(result.logprobs, options)

    def _sampling(self) -> dict[str, Any]:
        """What a generation request adds for sampling: ``top_p`` when set; ``seed`` when it samples
        (temperature > 0; OpenAI's best-effort reproducibility). Nothing for greedy requests, so
        their bodies and cache keys stay as before."""
        out: dict[str, Any] = {}
        if self.config.top_p is not None:
            out["top_p"] = self.config.top_p
        if self.config.temperature > 0:
            out["seed"] = self.config.seed
        return out

    def _prepare(
        self, images: Sequence[np.ndarray | None], prompts: Sequence[str], settings: dict[str, Any]
    ) -> list[_Prepared]:
        if len(images) != len(prompts):
            raise ValueError(f"images and prompts differ in length: {len(images)} != {len(prompts)}")
        prepared = []
        key_settings = {**settings, "base_url": self.config.base_url}
        if self.system_prompt is not None:
            key_settings["system_prompt"] = self.system_prompt
        for img, prompt in zip(images, prompts, strict=True):
            if not isinstance(prompt, str):
                raise ValueError(f"prompts must be str, got {type(prompt).__name__}")
            url, ihash = None, None
            if img is not None:
                pixels = quantize_image(img)
                ihash = image_hash(pixels)
                url = png_data_url(pixels)
            payload = {"model": self.config.model, "messages": build_messages(url, prompt, self.system_prompt),
                       **settings}
            prepared.append(_Prepared(payload, cache_key(ihash, prompt, self.config.model, key_settings)))
        return prepared

    def _run(self, prepared: list[_Prepared]) -> list[ApiResult]:
        if not prepared:
            return []
        workers = min(self.config.concurrency, len(prepared))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="api_vlm") as pool:
            return list(pool.map(self._safe_one, prepared))

    def _safe_one(self, req: _Prepared) -> ApiResult:
        try:
            return self._one(req)
        except Exception as exc:  # the contract: one result per input, never an exception
            return ApiResult(None, "client_error", error=self._scrub(f"{type(exc).__name__}: {exc}"))

    def _one(self, req: _Prepared) -> ApiResult:
        if self._cache is not None:
            cached = self._cache.get(req.key)
            if cached is not None:
                outcome, text, err, lps = parse_completion(cached)
                if outcome == "ok" and text is not None:
                    text, changed = sanitize_text(text)
                    return ApiResult(text, "ok", 200, 0, 0.0, True, None, lps, truncated=hit_token_cap(cached),
                                     sanitized=changed)
        rng = rng_for("api_vlm", self.config.seed, req.key)
        headers = {"Authorization": f"Bearer {self._key}"} if self._key is not None else {}
        start = self._clock()
        waits: list[float] = []
        attempt = 0
        while True:
            attempt += 1
            with self._lock:
                self.http_calls += 1
            status: int | None = None
            retry_after: float | None = None
            remaining = self.config.deadline_s - (self._clock() - start)
            if remaining <= 0:
                return self._fail("timeout", status, attempt - 1, start,
                                  f"deadline of {self.config.deadline_s}s passed before attempt {attempt}", waits)
            try:
                status, raw, resp_headers = self._post(req.payload, headers, remaining)
            except _BodyTooLarge as exc:
                return self._fail("bad_response", 200, attempt, start, str(exc), waits)
            except httpx.TimeoutException as exc:
                outcome, error = "timeout", f"timeout after {min(self.config.timeout_s, remaining):.3g}s " \
                                            f"({type(exc).__name__}: {exc})"
            except httpx.TransportError as exc:
                outcome, error = "connection_error", f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    try:
                        body = json.loads(raw)
                    except (ValueError, RecursionError):  # nested past the parser's depth: a bad body too
                        body = None
                    outcome, text, err, lps = parse_completion(body)
                    if body is None:
                        err = "response body is not valid JSON"
                    if outcome == "ok" and self._cache is not None:
                        # first: a paid answer is cached as sent before anything that may fail; a
                        # failed write is a warning
                        try:
                            self._cache.put(req.key, body)
                        except Exception as exc:
                            logger.warning("%s: caching an answer failed (%s); the answer is kept",
                                           self.config.model, type(exc).__name__)
                    changed = False
                    if text is not None:
                        text, changed = sanitize_text(text)
                    return ApiResult(text, outcome, status, attempt, self._clock() - start, False,
                                     self._scrub(sanitize_text(err)[0]) if err else None, lps, tuple(waits),
                                     truncated=hit_token_cap(body) if text is not None else None,
                                     sanitized=changed)
                outcome, error = "http_error", f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
                if status in (429, 503):
                    retry_after = parse_retry_after(resp_headers.get("Retry-After"))
                if status != 429 and status < 500:
                    return self._fail(outcome, status, attempt, start, error, waits)
            if attempt > self.config.max_retries:
                return self._fail(outcome, status, attempt, start, error, waits)
            if retry_after is not None:
                wait = min(retry_after, self.config.retry_after_max_s)
            else:
                wait = backoff_wait(attempt, self.config.backoff_base_s, self.config.backoff_max_s, rng)
            if self._clock() - start + wait >= self.config.deadline_s:
                return self._fail("timeout", status, attempt, start,
                                  f"{error}; no retry: the wait would pass the {self.config.deadline_s}s deadline",
                                  waits)
            logger.info("%s: %s (attempt %d/%d), retrying in %.2fs", self.config.model,
                        self._scrub(error)[:120], attempt, self.config.max_retries + 1, wait)
            waits.append(wait)
            self._sleep(wait)

    def _post(self, payload: dict[str, Any], headers: dict[str, str],
              remaining: float) -> tuple[int, bytes, httpx.Headers]:
        """One POST, streamed: (status, body bytes with the key scrubbed, headers). Connect,
        headers and body together must finish within ``remaining`` seconds (a watchdog closes the
        connection then: :mod:`medrobust_lib.models.http_deadline`), else ``httpx.ReadTimeout``;
        each phase also obeys ``timeout_s``. A body over ``max_response_bytes`` (declared or read)
        raises :class:`_BodyTooLarge`."""
        cap = self.config.max_response_bytes
        timeout = httpx.Timeout(max(0.001, min(self.config.timeout_s, remaining)))
        with deadline(remaining) as watch:
            try:
                with self._client.stream("POST", self._url, json=payload, headers=headers, timeout=timeout) as resp:
                    declared = resp.headers.get("Content-Length")
                    if declared is not None and declared.isdigit() and int(declared) > cap:
                        raise _BodyTooLarge(f"response declares {int(declared):,} bytes, "
                                            f"over max_response_bytes {cap:,}")
                    chunks: list[bytes] = []
                    size = 0
                    for chunk in resp.iter_bytes():
                        size += len(chunk)
                        if size > cap:
                            raise _BodyTooLarge(f"response body over max_response_bytes {cap:,}")
                        chunks.append(chunk)
                    if watch.expired:  # the watchdog's shutdown can look like a close-delimited body's end
                        raise httpx.ReadTimeout("watchdog closed the connection")
                    return resp.status_code, self._scrub_bytes(b"".join(chunks)), resp.headers
            except httpx.TransportError as exc:
                if watch.expired or watch.remaining() <= 0:
                    raise httpx.ReadTimeout(f"deadline of {remaining:.3g}s passed during the request "
                                            f"({type(exc).__name__})") from exc
                raise

    def _fail(self, outcome: str, status: int | None, attempts: int, start: float, error: str,
              waits: list[float]) -> ApiResult:
        msg = self._scrub(sanitize_text(error)[0])
        logger.warning("%s: request failed after %d attempt(s): %s", self.config.model, attempts, msg[:200])
        return ApiResult(None, outcome, status, attempts, self._clock() - start, False, msg, None, tuple(waits))

    def _scrub(self, text: str) -> str:
        """Remove the API key from a message (servers may echo headers back in error bodies;
        libraries print it escaped or as a bytes repr): every printed form of it and every run of
        12+ of its characters (:class:`~medrobust_lib.models.secret_scrub.SecretScrubber`)."""
        return self._scrubber.text(text) if self._scrubber is not None else text

    def _scrub_bytes(self, raw: bytes) -> bytes:
        """Remove the API key from a whole response body, before it is parsed, cut, stored or
        logged, in every form :meth:`_scrub` removes."""
        return self._scrubber.bytes_(raw) if self._scrubber is not None else raw


_PROTOCOL: type[VisionLanguageEndpoint] = ApiVLM
"""Static proof (mypy) that the adapter satisfies :class:`VisionLanguageEndpoint`."""
