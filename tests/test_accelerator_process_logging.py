"""`get_logger`'s records name the caller's line, whichever method made them."""

from __future__ import annotations

import logging

from trainer import get_logger


def test_every_call_reports_the_line_that_made_it():
    # Failed before: every record named the caller's caller (stacklevel one too high).
    lines: list[tuple[str, int]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append((record.funcName, record.lineno - _log_from_here.__code__.co_firstlineno))

    logging.getLogger("tests.process_logging").addHandler(Keep())
    _log_from_here(get_logger("tests.process_logging", log_level="INFO"))
    assert lines == [("_log_from_here", offset) for offset in (1, 2, 3, 5, 6)]


def _log_from_here(logger):
    logger.info("info")
    logger.log(logging.WARNING, "by level")
    logger.exception("with the traceback")
    for _ in range(2):  # once: the second call logs nothing
        logger.warning_once("once")
    logger.warning_once("twice, another message")
