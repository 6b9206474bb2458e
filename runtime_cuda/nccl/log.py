"""The `gc3.nccl` logger, switched by GC3_DEBUG like NCCL_DEBUG.

GC3_DEBUG unset or WARN: warnings only (a skipped XML file is always reported).
GC3_DEBUG=INFO: also which algorithm each (collective, size bucket) ran and,
for a fallback to NCCL, every candidate that was rejected and why.
GC3_DEBUG=TRACE (or DEBUG): one line per call.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Mapping, Optional

from gc3 import settings

LOGGER_NAME = "gc3.nccl"
_LEVELS = {"": logging.WARNING, "0": logging.WARNING, "WARN": logging.WARNING, "WARNING": logging.WARNING,
           "INFO": logging.INFO, "TRACE": logging.DEBUG, "DEBUG": logging.DEBUG}


class _CurrentStderr(logging.StreamHandler):
    # Resolve sys.stderr at each record so redirections made after import
    # (pytest capture, a launcher re-opening stderr) still see the messages.
    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def get_logger(env: Optional[Mapping[str, str]] = None) -> logging.Logger:
    """The gc3.nccl logger with its level taken from GC3_DEBUG in `env`."""
    env = os.environ if env is None else env
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(process)d gc3 %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    raw = settings.get("GC3_DEBUG", env).upper()
    level = _LEVELS.get(raw)
    if level is None:
        logger.setLevel(logging.WARNING)
        logger.warning("GC3_DEBUG=%r is not one of WARN, INFO, TRACE; using WARN", raw)
    elif logger.level != level:
        # setLevel clears every logger's level cache: tens of microseconds on a hot path.
        logger.setLevel(level)
    return logger
