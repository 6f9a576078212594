"""`SimpleProfiler`: wall-clock time per action, reported as one table.

This module owns the timing of actions (``time.perf_counter`` and a few dict operations per
``start`` / ``stop`` pair) and the table's layout, which keeps Lightning's column names.
It does not choose the actions (the Trainer and the user do) nor where the report goes (the
`Profiler` base class does).
"""

from __future__ import annotations

import os
from time import perf_counter

from trainer.errors import ConfigurationError
from trainer.profilers.profiler import Profiler

__all__ = ["SimpleProfiler"]

_EXTENDED_COLUMNS = ("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
_COLUMNS = ("Action", "Mean duration (s)", "Total time (s)")


class SimpleProfiler(Profiler):
    """Record how long each action takes; report calls, mean, total and share of the run.

    The run's time is measured from ``setup`` (or from construction when the profiler is used
    without a Trainer) to ``summary()``. Each stage's report covers that stage only: ``setup``
    clears what an earlier stage recorded. Actions may nest (``run_training_batch`` contains
    ``training_step``), so the percentages of nested actions add up to more than 100.

    Args:
        dirpath: folder of the report file; ``None`` uses the Trainer's log directory.
        filename: when given, the report is appended to ``<dirpath>/<stage>-<filename>.txt``
            instead of being printed.
        extended: ``True`` reports ``Num calls`` and ``Percentage %`` too, sorted by total time;
            ``False`` reports mean and total only, sorted by mean duration (as Lightning).

    Raises:
        ConfigurationError: from ``start``, when the action is already running; from ``stop``,
            when it was never started.

    Example:
        >>> import time
        >>> profiler = SimpleProfiler()
        >>> for _ in range(3):
        ...     with profiler.profile("load_batch"):
        ...         time.sleep(0.002)
        >>> with profiler.profile("save"):
        ...     time.sleep(0.01)
        >>> print(profiler.summary())  # doctest: +SKIP
        Profiler Report
        <BLANKLINE>
        | Action     | Mean duration (s) | Num calls | Total time (s) | Percentage % |
        ...
        | save       | 0.010071          | 1         | 0.010071       | 60.2         |
        | load_batch | 0.0021097         | 3         | 0.0063291      | 37.8         |
    """

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        extended: bool = True,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.extended = extended
        self._running: dict[str, float] = {}
        self._records: dict[str, list[float]] = {}  # action -> [number of calls, total seconds]
        self._run_start = perf_counter()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank=local_rank, log_dir=log_dir)
        self._running.clear()
        self._records.clear()
        self._run_start = perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self._running:
            raise ConfigurationError(
                f"SimpleProfiler.start({action_name!r}): the action is already running. Stop it "
                "first, or give the nested block another name."
            )
        self._running[action_name] = perf_counter()

    def stop(self, action_name: str) -> None:
        end = perf_counter()
        begin = self._running.pop(action_name, None)
        if begin is None:
            raise ConfigurationError(
                f"SimpleProfiler.stop({action_name!r}): the action was never started. Call "
                f"start({action_name!r}) first, or use `with profiler.profile(...)`."
            )
        record = self._records.get(action_name)
        if record is None:
            self._records[action_name] = [1, end - begin]
        else:
            record[0] += 1
            record[1] += end - begin

    def summary(self) -> str:
        """The table, one row per action (Lightning's columns); only the title when nothing ran."""
        title = f"{self._stage.upper()} Profiler Report" if self._stage else "Profiler Report"
        if not self._records:
            return title + "\n"
        run_seconds = perf_counter() - self._run_start
        if self.extended:
            rows = sorted(self._records.items(), key=lambda item: item[1][1], reverse=True)
            table = [_EXTENDED_COLUMNS]
            calls = sum(int(count) for count, _ in self._records.values())
            table.append(("Total", "-", str(calls), f"{run_seconds:.5g}", "100 %"))
            for action, (count, total) in rows:
                mean, share = total / count, 100.0 * total / run_seconds if run_seconds else 0.0
                table.append(
                    (action, f"{mean:.5g}", str(int(count)), f"{total:.5g}", f"{share:.5g}")
                )
            rules = (1, 2)  # below the header, below the Total row
        else:
            rows = sorted(self._records.items(), key=lambda item: item[1][1] / item[1][0])
            table = [_COLUMNS]
            for action, (count, total) in reversed(rows):
                table.append((action, f"{total / count:.5g}", f"{total:.5g}"))
            rules = (1,)
        return f"{title}\n\n{_format_table(table, rules)}\n"


def _format_table(rows: list[tuple[str, ...]], rules: tuple[int, ...]) -> str:
    """Rows as ``| a | b |`` lines padded to the widest cell, ruled above, below and at ``rules``."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    rule = "-" * len(lines[0])
    for index in sorted(rules, reverse=True):
        lines.insert(index, rule)
    return "\n".join([rule, *lines, rule])
