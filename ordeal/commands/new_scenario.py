"""``ordeal new-scenario``: a newcomer's first scenario for their own broker, from its start command and config
file: an external target with the config embedded as ``config_text``, a small P2P workload, one SIGKILL, the
promises at their most modest, each key with a one-line comment (new_scenario.toml.j2).  The text is checked
with the scenario loader before it is written, so the file it writes loads (``ordeal plan FILE``).

It does not read the broker's config: it embeds it (braces doubled, so only the run's placeholders are filled
in) and leaves a TODO where the listener must take {host}:{port}, naming the lines that mention the port."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import click
import jinja2

from contracts.errors import UsageError

TEMPLATE = "new_scenario.toml.j2"
COMMENT_COLUMN = 37  # where the keys' one-line comments start
DEFAULT_PORT_HINT = 1883  # the lines naming this port are pointed at when --port is not given
MAX_HINTS = 5


@dataclass(frozen=True)
class Skeleton:
    """What the skeleton is made of (the command's options, read)."""

    name: str
    start: tuple[str, ...]
    config_name: str = ""  # the file name config_text is written to under {run_dir}; "" = no config file
    config_text: str = ""
    port: int = 0
    path: str = ""  # where it is written, for its "check it" comment
    hints: tuple[tuple[int, str], ...] = field(default=())


def _toml(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's."""
    return json.dumps(value, ensure_ascii=False)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _toml_multiline(text: str) -> str:
    """The text as a TOML multi-line string that reads back to exactly it: literal ('''...''', no escapes, as
    the file was) when it can be, else basic with escapes.  The newline after the opening quotes is dropped
    by TOML; the text always ends with one, so the closing quotes sit on a line of their own."""
    text = text.replace("\r\n", "\n")
    if not text.endswith("\n"):
        text += "\n"
    if "'''" not in text and not _CONTROL.search(text) and "\r" not in text:
        return f"'''\n{text}'''"
    escaped = text.replace("\\", "\\\\").replace("\r", "\\r")
    escaped = _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", escaped)
    escaped = escaped.replace('"""', '""\\"')
    return f'"""\n{escaped}"""'


def _kv(key: str, value: str) -> str:
    line = f"{key} = {value}"
    return line + " " * max(1, COMMENT_COLUMN - len(line))


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent),
    autoescape=False,  # TOML, not HTML: every value goes through the toml filters instead
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENVIRONMENT.filters["toml"] = _toml
_ENVIRONMENT.filters["toml_multiline"] = _toml_multiline
_ENVIRONMENT.globals["kv"] = _kv


def listener_hints(text: str, port: int) -> tuple[tuple[int, str], ...]:
    """The config's lines that name the port (a whole number): where the listener probably is.  A hint for
    the TODO, not a reading of the config."""
    pattern = re.compile(rf"(?<![\d.]){port}(?!\d)")
    found = [(number, _CONTROL.sub("", line.strip())[:100]) for number, line in enumerate(text.splitlines(), 1)
             if pattern.search(line)]
    return tuple(found[:MAX_HINTS])


def _named_in_start(argv: tuple[str, ...]) -> str:
    """The one file name the start command reads from the run directory ({run_dir}/NAME), if it names one."""
    names = {match for arg in argv for match in re.findall(r"\{run_dir\}/([A-Za-z0-9][A-Za-z0-9_.-]*)", arg)}
    return names.pop() if len(names) == 1 else ""


def skeleton(name: str, start: str, *, config: Path | None = None, config_text: str | None = None, port: int = 0,
             path: str = "") -> Skeleton:
    """The options read: the start command split like a shell would, the config file's name and text."""
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise UsageError(f"new-scenario NAME {name!r}: may only contain letters, digits, '-' and '_' (it names the "
                         "scenario, its run directories and the broker's node and log file)")
    try:
        argv = tuple(shlex.split(start))
    except ValueError as error:
        raise UsageError(f"--start {start!r}: cannot split it into arguments: {error}") from None
    if not argv:
        raise UsageError("--start: the command that runs the broker in the foreground is empty")
    text, file_name = "", ""
    if config is not None:
        try:
            text = config.read_text(encoding="utf-8") if config_text is None else config_text
        except (OSError, UnicodeDecodeError) as error:
            raise UsageError(f"--config {config}: cannot read it as text: {error}") from None
        if not text.strip():
            raise UsageError(f"--config {config}: the file is empty; leave --config out for a broker without one")
        file_name = _named_in_start(argv) or config.name.lstrip(".") or f"{name}.conf"
    return Skeleton(name=name, start=argv, config_name=file_name, config_text=text, port=port, path=path,
                    hints=listener_hints(text, port or DEFAULT_PORT_HINT) if text else ())


# The run's own placeholders (docs/scenarios.md): kept as they are in an embedded config, every other brace doubled
RUN_PLACEHOLDERS = re.compile(r"(\{(?:run_dir|data_dir|log_dir|conf_dir|host|port|pid)\})")


def escape_braces(text: str) -> str:
    """The config's braces doubled (``str.format`` fills config_text in), the run's placeholders kept."""
    parts = RUN_PLACEHOLDERS.split(text)
    return "".join(part if index % 2 else part.replace("{", "{{").replace("}", "}}")
                   for index, part in enumerate(parts))


def render(spec: Skeleton) -> str:
    """The scenario file's text."""
    escaped = escape_braces(spec.config_text)
    mentions = any(f"{{run_dir}}/{spec.config_name}" in arg for arg in spec.start)
    return _ENVIRONMENT.get_template(TEMPLATE).render(
        name=spec.name, path=spec.path or f"{spec.name}.toml",
        description=f"{spec.name} under a P2P workload with one SIGKILL and restart (ordeal new-scenario)",
        start=list(spec.start), port=spec.port, config_file=spec.config_name, config_text=escaped,
        braces=escaped != spec.config_text, hints=list(spec.hints), hint_port=spec.port or DEFAULT_PORT_HINT,
        mentions_config=mentions)


def checked(text: str, source: str):
    """The text read back by the scenario loader (every stage registered, as `ordeal plan` reads it)."""
    import harness.model  # noqa: F401  (registers the stages into the scenario model)
    from contracts.scenario import parse_scenario

    return parse_scenario(text, source=source)


@click.command(name="new-scenario")
@click.argument("name")
@click.option("--start", required=True, metavar="COMMAND",
              help="The broker's start command, in the foreground, as one shell-quoted string; placeholders "
                   "{run_dir} {data_dir} {log_dir} {host} {port}, e.g. \"mosquitto -c {run_dir}/mosquitto.conf\".")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The broker's config file: embedded as config_text, written at start to {run_dir}/<the name "
                   "--start reads there, else the file's own name>.")
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default=True,
              help="The MQTT port (0: 1883 on the run's own address when isolated, else a free port).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The scenario file to write (default: NAME.toml in the current directory).")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
def new_scenario(name: str, start: str, config: Path | None, port: int, out: Path | None, force: bool) -> None:
    """Write a scenario skeleton for your own broker NAME: an external target started by --start with --config
    embedded, a small P2P workload, one process_kill fault and modest promises, each key explained.  Then:
    finish its TODO lines, `ordeal plan FILE`, `ordeal run FILE`."""
    out = out or Path(f"{name}.toml")
    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; not overwritten (pass --force to replace it)")
    spec = skeleton(name, start, config=config, port=port, path=str(out))
    text = render(spec)
    checked(text, str(out))  # a skeleton that does not load is this command's bug: say so before writing
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    click.echo(f"wrote {out}", err=True)
    todo = "finish its TODO lines (the listener on {host}:{port}), then " if spec.config_name else ""
    click.echo(f"next: {todo}`ordeal plan {out}`, then `ordeal run {out}`", err=True)
