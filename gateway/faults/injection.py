"""Injected errors and retry hints: what a generation request gets instead of an answer.

Knows: the error types real servers send (status, OpenAI error `type` and `code`,
message), each once in `INJECTED`; per-model settings (a probability and the set of types
to draw from, retry hints) with defaults for models without their own; scripts ("the
next N requests get X, then normal"), per model or for every model; one seeded random
generator, so a run with the same seed and the same order of requests replays exactly;
counts of what was injected; and the retry hints (`retry-after`, `retry-after-ms`,
`x-should-retry`) a 529, 429 or 503 carries. The state is a plain value that can be
shown (`view`) and saved and restored (`snapshot` / `restore`).

Does not know: HTTP or aiohttp (gateway.faults.control applies the decisions), TOML
(gateway.faults.config), or the engine.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from inference_lab.common.fault_names import ERROR_TYPES, OK_STEP


# The names live in inference_lab.common.fault_names (experiment scenarios read them too).
ErrorType = enum.StrEnum("ErrorType", [(name.upper(), name) for name in ERROR_TYPES])


@dataclass(frozen=True, slots=True)
class Injected:
    status: int
    type: str  # OpenAI error type
    code: str
    message: str
    param: str | None = None


# The one table: each type as a real server sends it (OpenAI's shapes; 529 as this lab's
# own saturation refusal, which is Anthropic's overloaded_error status).
INJECTED: dict[ErrorType, Injected] = {
    ErrorType.RATE_LIMIT: Injected(
        429, "rate_limit_error", "rate_limit_exceeded",
        "Rate limit reached for requests. Please try again later. (injected fault)"),
    ErrorType.INVALID_API_KEY: Injected(
        401, "authentication_error", "invalid_api_key",
        "Incorrect API key provided. (injected fault)"),
    ErrorType.CONTEXT_LENGTH: Injected(
        400, "invalid_request_error", "context_length_exceeded",
        "This model's maximum context length was exceeded. Please reduce the length of the "
        "messages. (injected fault)", "messages"),
    ErrorType.SERVER_ERROR: Injected(
        500, "server_error", "internal_error",
        "The server had an error while processing your request. (injected fault)"),
    ErrorType.OVERLOADED: Injected(
        503, "server_error", "service_unavailable",
        "The server is overloaded, please try again later. (injected fault)"),
    ErrorType.MODEL_NOT_FOUND: Injected(
        404, "invalid_request_error", "model_not_found",
        "The model does not exist or you do not have access to it. (injected fault)"),
    ErrorType.QUEUE_SATURATED: Injected(
        529, "overloaded_error", "queue_saturated",
        "Server is at capacity. Retry with reduced concurrency. (injected fault)"),
}
TYPES = ERROR_TYPES
OK = OK_STEP  # a script step that lets requests through
HINTED_STATUSES = frozenset({429, 503, 529})  # the statuses retry hints go on


@dataclass(frozen=True, slots=True)
class RetryHints:
    retry_after: float | None = None  # seconds, sent as `retry-after`
    retry_after_ms: int | None = None  # sent as `retry-after-ms`
    should_retry: bool | None = None  # sent as `x-should-retry: true|false`

    def headers(self) -> dict[str, str]:
        out = {}
        if self.retry_after is not None:
            value = self.retry_after
            out["retry-after"] = str(int(value)) if value == int(value) else f"{value:g}"
        if self.retry_after_ms is not None:
            out["retry-after-ms"] = str(self.retry_after_ms)
        if self.should_retry is not None:
            out["x-should-retry"] = "true" if self.should_retry else "false"
        return out


@dataclass(frozen=True, slots=True)
class ModelFaults:
    """One model's settings (or the defaults every other model uses)."""

    rate: float = 0.0  # probability that a request gets an injected error
    types: tuple[ErrorType, ...] = tuple(ErrorType)  # drawn from uniformly (default: all)
    hints: RetryHints = RetryHints()

    def view(self) -> dict[str, Any]:
        return {"rate": self.rate, "types": [t.value for t in self.types],
                "retry_after": self.hints.retry_after,
                "retry_after_ms": self.hints.retry_after_ms,
                "should_retry": self.hints.should_retry}


@dataclass(slots=True)
class ScriptStep:
    error: str  # an ErrorType value or OK
    count: int  # requests left in this step


ALL = "*"  # the scope of settings and scripts that apply to every model


@dataclass(slots=True)
class FaultState:
    seed: int = 0
    defaults: ModelFaults = ModelFaults()
    models: dict[str, ModelFaults] = field(default_factory=dict)
    scripts: dict[str, deque[ScriptStep]] = field(default_factory=dict)  # model or ALL
    injected: dict[str, int] = field(default_factory=dict)  # error type -> count
    requests: int = 0  # generation requests seen
    _rng: random.Random = field(init=False, repr=False)
    _active: bool | None = field(default=None, init=False, repr=False)  # None: recompute

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def clear(self) -> None:
        """Every setting and script back to the defaults (the seed and counts stay)."""
        self.defaults, self.models, self.scripts = ModelFaults(), {}, {}
        self.reseed(self.seed)
        self._active = None

    # ---- settings ---------------------------------------------------------------------
    def settings(self, model: str) -> ModelFaults:
        return self.models.get(model, self.defaults)

    def reseed(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)

    def update(self, model: str | None, **changes: Any) -> None:
        """Change some fields of one model's settings (None: the defaults)."""
        hints = {k: changes.pop(k) for k in ("retry_after", "retry_after_ms", "should_retry")
                 if k in changes}
        base = self.defaults if model is None else self.models.get(model, self.defaults)
        new = replace(base, **changes)
        if hints:
            new = replace(new, hints=replace(new.hints, **hints))
        if model is None:
            self.defaults = new
        else:
            self.models[model] = new
        self._active = None

    def set_script(self, model: str | None, steps: list[tuple[str, int]]) -> None:
        """Replace the script of one model (None: every model's). Empty: no script."""
        key = model or ALL
        self._active = None
        if steps:
            self.scripts[key] = deque(ScriptStep(e, n) for e, n in steps if n > 0)
        else:
            self.scripts.pop(key, None)

    @property
    def active(self) -> bool:
        """Whether any request may be touched (the hot path skips everything otherwise);
        recomputed only after a change."""
        if self._active is None:
            self._active = bool(self.scripts) or any(
                s.rate > 0 or s.hints != RetryHints()
                for s in (self.defaults, *self.models.values()))
        return self._active

    # ---- per request ------------------------------------------------------------------
    def _script_step(self, model: str) -> str | None:
        for key in (model, ALL):
            steps = self.scripts.get(key)
            if steps:
                step = steps[0]
                step.count -= 1
                if step.count <= 0:
                    steps.popleft()
                if not steps:
                    del self.scripts[key]
                    self._active = None
                return step.error
        return None

    def decide(self, model: str) -> ErrorType | None:
        """The error this request gets, or None. Scripts first (the model's, then every
        model's), then a draw at the model's rate."""
        self.requests += 1
        step = self._script_step(model)
        if step is not None:
            error = None if step == OK else ErrorType(step)
        else:
            s = self.settings(model)
            error = None
            if s.rate > 0 and self._rng.random() < s.rate:
                error = s.types[self._rng.randrange(len(s.types))] if len(s.types) > 1 \
                    else s.types[0]
        if error is not None:
            self.injected[error.value] = self.injected.get(error.value, 0) + 1
        return error

    def hints(self, model: str, status: int) -> dict[str, str]:
        if status not in HINTED_STATUSES:
            return {}
        return self.settings(model).hints.headers()

    # ---- showing and saving ---------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "defaults": self.defaults.view(),
            "models": {name: s.view() for name, s in sorted(self.models.items())},
            "scripts": {key: [{"error": st.error, "count": st.count} for st in steps]
                        for key, steps in self.scripts.items()},
            "injected": dict(sorted(self.injected.items())),
            "requests": self.requests,
            "types": list(TYPES),
        }

    def snapshot(self) -> dict[str, Any]:
        """What survives a restart: settings, scripts and seed (not the counters)."""
        view = self.view()
        return {k: view[k] for k in ("seed", "defaults", "models", "scripts")}

    @classmethod
    def restore(cls, data: dict[str, Any]) -> "FaultState":
        state = cls(seed=int(data.get("seed", 0)))
        state.defaults = settings_from(data.get("defaults") or {})
        state.models = {k: settings_from(v) for k, v in (data.get("models") or {}).items()}
        for key, steps in (data.get("scripts") or {}).items():
            state.set_script(None if key == ALL else key,
                             [(s["error"], int(s["count"])) for s in steps])
        return state


def settings_from(view: dict[str, Any], base: ModelFaults = ModelFaults()) -> ModelFaults:
    """ModelFaults from its `view()` shape (validated by the caller)."""
    hints = RetryHints(
        retry_after=view.get("retry_after", base.hints.retry_after),
        retry_after_ms=view.get("retry_after_ms", base.hints.retry_after_ms),
        should_retry=view.get("should_retry", base.hints.should_retry))
    types = view.get("types")
    return ModelFaults(
        rate=float(view.get("rate", base.rate)),
        types=tuple(ErrorType(t) for t in types) if types else base.types,
        hints=hints)
