"""Progress of long commands (``work``, ``demo``, ``replay --against-sandbox``), on stderr.

On a terminal: a rich live display, one row per phase with a spinner, its count and the time it
took. Elsewhere (a pipe, a log file, CI): one plain line per phase, printed as it starts, so
that a log shows where a run is without a line per second.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class Phases:
    """A run's phases, shown as they go.

    Use as a context manager; :meth:`phase` starts the next phase (ending the previous one),
    :meth:`update` moves the current phase's count (``completed`` of ``total`` units) or its
    detail text; on a terminal only, since a plain log gets one line per phase.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> Phases:
        if self.live:
            self._progress = Progress(
                SpinnerColumn(finished_text="[green]✓[/green]"),
                TextColumn("{task.description}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}", markup=False),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish_current()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def phase(self, description: str, total: int | None = None) -> None:
        """Start a phase (``total``: units of work it has, if known)."""
        self._finish_current()
        if self._progress is None:
            self.console.print(description, markup=False, highlight=False)
            return
        self._task = self._progress.add_task(description, total=total, detail="")

    def update(self, completed: int | None = None, detail: str | None = None) -> None:
        """Move the current phase on (terminal only): units done, or a short detail text."""
        if self._progress is None or self._task is None:
            return
        if detail is not None:
            self._progress.update(self._task, detail=detail)
        if completed is not None:
            self._progress.update(self._task, completed=completed)

    def _finish_current(self) -> None:
        if self._progress is None or self._task is None:
            return
        task = self._progress.tasks[self._task]
        total = task.total if task.total is not None else max(task.completed, 1)
        self._progress.update(self._task, total=total, completed=total)
        self._progress.stop_task(self._task)
        self._task = None
