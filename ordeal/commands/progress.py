"""The progress display of ``ordeal run`` and ``ordeal replay``: a rich progress bar fed by the harness'
reporter calls."""

from __future__ import annotations


class RichReporter:
    """A rich progress bar: phase, elapsed of the planned time, sent / acked / delivered, faults active."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[stats]}"), console=console, transient=False)
        self.task = None

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def phase(self, name: str, total_s: float | None = None) -> None:
        if self.task is not None:
            task = self.progress.tasks[self.task]
            self.progress.update(self.task, completed=task.total or 1, total=task.total or 1)
        self.task = self.progress.add_task(name, total=total_s, stats="")

    def tick(self, elapsed_s: float, counters: dict[str, int], faults_active: int) -> None:
        stats = (f"sent {counters['published']}  acked {counters['acked']}  failed {counters['failed']}  "
                 f"indet {counters['indeterminate']}  delivered {counters['delivered']}  "
                 f"faults active {faults_active}")
        self.progress.update(self.task, completed=elapsed_s, stats=stats)

    def message(self, text: str) -> None:
        # plain text: "[target.tls]" / "[target.credentials]" in a message are keys, not rich markup
        self.progress.console.print(text, markup=False)
