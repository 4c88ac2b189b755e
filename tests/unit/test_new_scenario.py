"""`ordeal new-scenario` (ordeal/commands/new_scenario.py): the skeleton for one's own broker loads as written,
embeds the config file exactly (its braces kept as braces), says where {host}:{port} must go, promises the
least, refuses to overwrite without --force (exit 3 naming the file), and `ordeal plan` validates the file."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.errors import UsageError
from contracts.scenario import parse_scenario
from ordeal.cli import main
from ordeal.commands.new_scenario import _toml_multiline, escape_braces, listener_hints, render, skeleton

ROOT = Path(__file__).resolve().parents[2]
MOSQUITTO_CONF = """# my broker's config
listener 1883
allow_anonymous true
persistence true
persistence_location /var/lib/mosquitto/
log_dest stdout
"""
START = "mosquitto -c {run_dir}/mosquitto.conf"


def _config(tmp_path: Path, text: str = MOSQUITTO_CONF, name: str = "mosquitto.conf") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_skeleton_loads_with_every_key_it_promises(tmp_path: Path):
    text = render(skeleton("mybroker", START, config=_config(tmp_path), port=1883, path="scenarios/mybroker.toml"))
    loaded = parse_scenario(text, source="mybroker.toml")
    target = loaded.target
    assert loaded.name == "mybroker" and target.kind == "external" and target.name == "mybroker"
    assert target.start == ("mosquitto", "-c", "{run_dir}/mosquitto.conf") and target.port == 1883
    assert target.config_file == "mosquitto.conf" and target.config_text == MOSQUITTO_CONF
    assert (target.mqtt_versions, target.persistence, target.queue_limit, target.queue_policy,
            target.message_ttl_s) == (("3.1.1",), "none", 0, "none", 0)
    assert loaded.workload.pattern == "p2p" and dict(loaded.workload.protocol_mix) == {4: 1.0}  # 3.1.1
    assert dict(loaded.faults.mix) == {"process_kill": 1.0}
    assert loaded.faults.targets_of("process_kill") == ("node:mybroker",)
    assert "ordeal plan scenarios/mybroker.toml" in text


def test_every_key_has_its_one_line_comment(tmp_path: Path):
    """Beside it, or on the line above (start, config_text: values too long to share a line)."""
    lines = render(skeleton("mybroker", START, config=_config(tmp_path), port=1883)).splitlines()
    inside_config = False
    for before, line in zip(["", *lines], lines, strict=False):
        if inside_config:
            inside_config = line != "'''"
            continue
        inside_config = line.startswith("config_text = ")
        if line and not line.startswith(("#", "[")):
            assert " # " in line or before.startswith("#"), f"a key without its comment: {line!r}"


def test_the_todo_says_where_host_and_port_go_and_points_at_the_listener_line(tmp_path: Path):
    text = render(skeleton("mybroker", START, config=_config(tmp_path), port=1883))
    assert "# TODO: make the broker listen on {host}:{port}" in text
    assert "#       line 2 names port 1883: `listener 1883`" in text
    assert "TODO: your start command does not name" not in text  # it reads {run_dir}/mosquitto.conf
    assert listener_hints("port: 18830\nbind 0.0.0.0:1883\nlistener 1883 ::\n", 1883) == (
        (2, "bind 0.0.0.0:1883"), (3, "listener 1883 ::"))


def test_a_start_command_that_does_not_read_the_config_gets_a_todo(tmp_path: Path):
    spec = skeleton("mybroker", "mybroker --config /etc/mybroker.conf", config=_config(tmp_path, name="my.conf"))
    assert spec.config_name == "my.conf"
    assert "# TODO: your start command does not name {run_dir}/my.conf" in render(spec)


def test_the_config_file_name_is_the_one_the_start_command_reads(tmp_path: Path):
    spec = skeleton("mybroker", "sh -c 'exec mybroker -c {run_dir}/broker.conf'", config=_config(tmp_path))
    assert spec.start == ("sh", "-c", "exec mybroker -c {run_dir}/broker.conf") and spec.config_name == "broker.conf"
    assert parse_scenario(render(spec)).target.config_file == "broker.conf"


def test_the_configs_braces_stay_braces_and_the_run_placeholders_stay_placeholders(tmp_path: Path):
    hocon = 'listeners.tcp.default { bind = "{host}:{port}" }\nnode { data_dir = "{data_dir}" }\n'
    loaded = parse_scenario(render(skeleton("emqx", "emqx foreground", config=_config(tmp_path, hocon, "emqx.conf"))))
    assert "doubled ({{ and }})" in render(skeleton("emqx", "emqx", config=_config(tmp_path, hocon, "emqx.conf")))
    # filled in as the run fills config_text in (str.format): the file the broker reads is the original
    assert loaded.target.config_text.format(host="127.0.0.9", port=1883, data_dir="/d") == (
        'listeners.tcp.default { bind = "127.0.0.9:1883" }\nnode { data_dir = "/d" }\n')
    assert escape_braces("a {b} {port} }") == "a {{b}} {port} }}"


@pytest.mark.parametrize("text", [
    "plain\n", "no newline at the end", "back\\slash and 'quotes'\n", "three ''' singles\n",
    'three """ doubles and a trailing "\n', "a tab\tand a bell \x07\n", "crlf\r\nlines\r\n", "lone \r cr\n",
])
def test_the_embedded_config_reads_back_exactly(text: str):
    expected = text.replace("\r\n", "\n")
    expected = expected if expected.endswith("\n") else expected + "\n"
    assert tomllib.loads(f"x = {_toml_multiline(text)}\n")["x"] == expected


def test_a_broker_without_a_config_file_has_no_config_keys():
    loaded = parse_scenario(render(skeleton("bare", "mybroker --port {port} --bind {host}", port=0)))
    assert loaded.target.config_file == "" and loaded.target.config_text == "" and loaded.target.port == 0
    assert loaded.target.start == ("mybroker", "--port", "{port}", "--bind", "{host}")


def test_the_commented_cluster_example_names_the_nodes_keys_and_the_docs(tmp_path: Path):
    text = render(skeleton("mybroker", START, config=_config(tmp_path), port=1883))
    assert "See docs/scenarios.md, Clustered targets" in text
    block = [line for line in text.splitlines() if line.startswith("# [[target.nodes]]")]
    assert len(block) == 2
    for key in ("# name = \"mybroker-1\"", "# [target.formation]", "# steps = ", "# ready = "):
        assert key in text
    # uncommented as the comment says (no host / port on the target, the fault on a node): it loads
    uncommented = []
    for line in text.splitlines():
        if line.startswith(("host = ", "port = ")):
            continue  # the target's own
        if line.startswith(("# [[target.nodes]]", "# name = ", "# [target.formation]", "# steps = ", "# ready = ")):
            line = line[2:]
        uncommented.append(line.replace('"node:mybroker"', '"node:mybroker-1"'))
    target = parse_scenario("\n".join(uncommented)).target
    assert [(node.name, node.host, node.port) for node in target.nodes] == [("mybroker-1", "", 0), ("mybroker-2", "", 0)]
    assert target.formation.steps and target.formation.ready


@pytest.mark.parametrize("name, start, message", [
    ("my broker", START, "may only contain letters, digits, '-' and '_'"),
    ("mybroker", "", "is empty"),
    ("mybroker", "mosquitto -c 'unterminated", "cannot split it into arguments"),
])
def test_bad_options_are_usage_errors(name: str, start: str, message: str):
    with pytest.raises(UsageError, match=message):
        skeleton(name, start)


def test_an_empty_config_file_is_refused(tmp_path: Path):
    with pytest.raises(UsageError, match="the file is empty"):
        skeleton("mybroker", START, config=_config(tmp_path, "\n\n"))


def test_an_existing_file_is_kept_unless_forced(tmp_path: Path):
    out = tmp_path / "mybroker.toml"
    out.write_text("mine\n")
    args = ["new-scenario", "mybroker", "--start", START, "--config", str(_config(tmp_path)), "--out", str(out)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 3 and out.read_text() == "mine\n"
    assert f"Error: {out}: already exists; not overwritten (pass --force to replace it)" in refused.output
    forced = CliRunner().invoke(main, [*args, "--force"])
    assert forced.exit_code == 0, forced.output
    assert parse_scenario(out.read_text()).target.config_text == MOSQUITTO_CONF


def test_ordeal_plan_validates_the_written_skeleton(tmp_path: Path):
    out = tmp_path / "scenarios" / "mybroker.toml"
    command = [sys.executable, "-m", "ordeal.cli"]
    written = subprocess.run([*command, "new-scenario", "mybroker", "--start", START, "--config",
                              str(_config(tmp_path)), "--port", "1883", "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    assert f"wrote {out}" in written.stderr and "ordeal plan" in written.stderr
    planned = subprocess.run([*command, "plan", str(out), "--summary"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
    assert planned.returncode == 0, planned.stderr
    assert '"scenario": "mybroker"' in planned.stdout and '"faults": 1' in planned.stdout
