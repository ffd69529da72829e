"""Log lines with the ``extra`` fields a call site passes: JSON, one object per line (for
log pipelines; the manifests' default), or text, ``key=value`` after the message (for
people at a terminal; the CLI's default)."""

from __future__ import annotations

import itertools
import logging
import sys
import time

import orjson

# color_message: uvicorn's copy of msg with terminal colours.
_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {
    "message",
    "asctime",
    "color_message",
}


FORMATS = ("json", "text")

# Libraries whose INFO lines are chatter, not news: httpx logs one line per API request
# (the reconciler's watches and writes: most of its log), uvicorn one lifecycle line per
# listener (serve has two, so each came twice); our own start and stop lines say the same
# once. Their warnings and errors still show; at level debug everything does.
QUIET_LOGGERS = ("httpx", "httpcore", "uvicorn.error")


# A record's own attributes come first in its __dict__, the call site's extra after them.
_OWN = len(vars(logging.makeLogRecord({})))

# The most characters of one field's text a line carries: fields hold what requests and
# objects say (a pod's name, a bad review's error), and a name of 100,000 characters must not
# make a 100 KB line. A cut field ends in "...[+N chars]", so a reader knows it was cut. The
# message itself is ours and is not cut.
FIELD_LIMIT = 512


def cap(value: str, limit: int = FIELD_LIMIT) -> str:
    """``value`` itself, or its first ``limit`` characters marked with how many were cut."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}...[+{len(value) - limit} chars]"


def _capped(value: object) -> object:
    if isinstance(value, str):
        return value if len(value) <= FIELD_LIMIT else cap(value)
    if isinstance(value, list | tuple):
        # A list (warnings) is cut as one field: its items, then how many were left out.
        kept: list[object] = []
        budget = FIELD_LIMIT
        for n, item in enumerate(value):
            if budget <= 0:
                kept.append(f"...[+{len(value) - n} items]")
                break
            text = item if isinstance(item, str) else str(item)
            kept.append(cap(text, budget) if isinstance(item, str) else item)
            budget -= len(text)
        return kept
    return value


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {
        key: _capped(value)
        for key, value in itertools.islice(record.__dict__.items(), _OWN, None)
        if key not in _STANDARD and not key.startswith("_")
    }


def _timestamp(record: logging.LogRecord) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: message key=value ...``; values with spaces or quotes are quoted
    as JSON strings, so a line stays one line and splits unambiguously."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            _timestamp(record),
            record.levelname,
            f"{record.name}:",
            record.getMessage(),
        ]
        for key, value in _fields(record).items():
            if value is None:
                continue
            parts.append(f"{key}={_text_value(value)}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: object) -> str:
    if isinstance(value, str):
        if value and not any(c in value for c in ' "=\n\t\\'):
            return value
        return orjson.dumps(value).decode()
    if isinstance(value, bool | int | float):
        return str(value).lower() if isinstance(value, bool) else str(value)
    return orjson.dumps(value, default=str).decode()


class _LifecycleOnce(logging.Filter):
    """uvicorn's INFO lifecycle lines ("Started server process [7]", "Shutting down") come
    once per listener, and serve has two: at level debug, where they show, each shows once.
    Its warnings and errors (a malformed HTTP request) always pass."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO:
            return True
        message = record.getMessage()
        if message in self.seen:
            return False
        if len(self.seen) < 64:  # a handful of lifecycle lines; stay bounded regardless
            self.seen.add(message)
        return True


def setup(level: str = "info", fmt: str = "json") -> None:
    # Neither format prints the caller's file and line, thread, process or task names, so
    # spare every record finding them (the logging HOWTO's "Optimization"): it halves the
    # cost of an admission's log line.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if fmt == "text" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's own loggers go through ours; its access log is off (the hot path).
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    lifecycle = logging.getLogger("uvicorn.error")
    lifecycle.filters[:] = [f for f in lifecycle.filters if not isinstance(f, _LifecycleOnce)]
    lifecycle.addFilter(_LifecycleOnce())
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(quiet)
