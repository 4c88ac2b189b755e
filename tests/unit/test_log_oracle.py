"""The log oracle without Spark: [checks.logs] validation, the default patterns per target (each with a
planted line that must count and a near-miss line that must not), incidents, unknown for unread logs, and
the harness's collection into history/logs.parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness.model  # noqa: F401  (registers the stages into the scenario model)
from contracts.history_schema import LOG_TABLE_NAME, read_log_table
from contracts.invariants import default_log_patterns
from contracts.scenario import ScenarioError, load_scenario, parse_scenario
from harness.node_logs import collect_logs, line_time_us
from ordeal.cli import main
from spark_checkers import synthetic as s
from spark_checkers.guarantees import Guarantees
from spark_checkers.rules.logs import ERROR_LINES, REPORTED_LINES, judge_logs, match_lines

HEAD = "[scenario]\nname = 'x'\nduration_s = 5\n"
RETRY = {"incoming_failure_strategy": "retry_forever", "persisted_failure_strategy": "retry_forever"}
TS = "2026-11-24 11:10:58,893 broker-1"


def _rows(lines, node="broker-1", role="broker", times=True):
    return [{"node": node, "role": role, "line_no": i, "t_wall_us": (i if times else None), "t_mono_us": i,
             "line": line} for i, line in enumerate(lines, start=1)]


def _verdicts(lines, patterns, **kwargs):
    return [(i.pattern.name, i.pattern.verdict, i.lines) for i in match_lines(_rows(lines, **kwargs), patterns)]


# -- [checks.logs] in a scenario: validated at load, naming the key -------------------------------------------


@pytest.mark.parametrize("table, expected", [
    ("[[checks.logs.patterns]]\nname = 'p'\nregex = '(unclosed'\n",
     "[checks.logs] patterns[0].regex = '(unclosed': not a valid regular expression"),
    ("[[checks.logs.patterns]]\nname = 'p'\nregex = 'x'\nverdict = 'warn'\n",
     "[checks.logs] patterns[0].verdict = 'warn': must be one of fail, report, ignore"),
    ("[[checks.logs.patterns]]\nname = 'p'\nregex = 'x'\nlevel = 'x'\n", "patterns[0]: unknown key(s) ['level']"),
    ("[[checks.logs.patterns]]\nregex = 'x'\n", "patterns[0].name = None: required"),
    ("[[checks.logs.patterns]]\nname = 'p'\nregex = 'x'\nroles = 'broker'\n", "patterns[0].roles = 'broker'"),
    ("[[checks.logs.patterns]]\nname = 'p'\nregex = 'x'\n[[checks.logs.patterns]]\nname = 'p'\nregex = 'y'\n",
     "each pattern name may appear once"),
    ("[checks.logs]\npreset = 'kafka'\n", "[checks.logs] preset = 'kafka': must be one of"),
    ("[checks.logs]\ndefaults = 'no'\n", "[checks.logs] defaults = 'no': must be true or false"),
    ("[checks.logs]\npatern = []\n", "[checks.logs] unknown key 'patern'"),
])
def test_a_bad_log_declaration_is_refused_at_load_naming_the_key(table, expected):
    with pytest.raises(ScenarioError) as error:
        parse_scenario(HEAD + table, source="bad.toml")
    assert expected in str(error.value) and str(error.value).startswith("bad.toml: ")


def test_ordeal_run_exits_3_on_a_bad_regex_before_anything_starts(tmp_path: Path):
    bad = tmp_path / "bad.toml"
    bad.write_text(HEAD + "[[checks.logs.patterns]]\nname = 'p'\nregex = '[a-'\n")
    result = CliRunner().invoke(main, ["run", str(bad), "--seed", "1", "--out", str(tmp_path / "runs")])
    assert result.exit_code == 3 and "patterns[0].regex = '[a-'" in result.output, result.output
    assert not (tmp_path / "runs").exists()


def test_declared_patterns_come_first_and_replace_a_default_by_name():
    scenario = parse_scenario(HEAD + "[broker]\npersisted_failure_strategy = 'retry_forever'\n"
                              "[[checks.logs.patterns]]\nname = 'slow'\nregex = 'slow batch'\nverdict = 'report'\n"
                              "[[checks.logs.patterns]]\nname = 'broker_error'\nregex = 'ERROR reference_broker'\n"
                              "verdict = 'report'\n")
    logs = scenario.to_dict()["checks"]["logs"]
    names = [p["name"] for p in logs["effective"]]
    assert logs["preset"] == "reference" and names[:2] == ["slow", "broker_error"] and names.count("broker_error") == 1
    verdicts = {p["name"]: p["verdict"] for p in logs["effective"]}
    assert verdicts["committing_anyway.persisted"] == "fail" and verdicts["committing_anyway.incoming"] == "report"
    assert [p["source"] for p in logs["effective"][:2]] == ["scenario", "scenario"]
    none = parse_scenario(HEAD + "[checks.logs]\ndefaults = false\n").to_dict()["checks"]["logs"]
    assert none["effective"] == []


def test_shipped_scenarios_get_their_targets_presets_and_round_trip_through_scenario_json():
    root = Path(__file__).resolve().parents[2] / "scenarios"
    presets = {}
    for name in ("p2p-smoke", "redis-master-kill", "mosquitto-kill", "rabbitmq-kill"):
        scenario = load_scenario(root / f"{name}.toml")
        document = json.loads(json.dumps(scenario.to_dict()))
        g = Guarantees.from_scenario(document)
        assert g.log_patterns == scenario.log_patterns()
        presets[name] = g.log_preset
    assert presets == {"p2p-smoke": "reference", "redis-master-kill": "reference", "mosquitto-kill": "mosquitto",
                       "rabbitmq-kill": "rabbitmq"}


def test_a_scenario_json_from_before_the_oracle_gets_the_defaults():
    g = Guarantees.from_scenario({"broker": RETRY, "checks": {}, "target": {"kind": "reference"}})
    assert g.log_patterns == default_log_patterns("reference", RETRY) and g.log_preset == "reference"
    external = Guarantees.from_scenario({"target": {"kind": "external", "start": ["/usr/sbin/mosquitto", "-c", "x"]}})
    assert external.log_preset == "mosquitto"
    with pytest.raises(ValueError, match=r"checks.logs.effective\[0\].regex"):
        Guarantees.from_scenario({"checks": {"logs": {"effective": [{"name": "p", "regex": "("}]}}})


# -- The reference broker's defaults: planted lines and their near-miss twins ---------------------------------


def test_committing_anyway_fails_where_nothing_may_be_skipped_and_is_reported_under_skip():
    line = (f"{TS} ERROR reference_broker.pipeline: tbmq.msg.persisted: giving up on 3 records after 4 attempts "
            "(ConnectionError()); committing anyway")
    assert _verdicts([line], default_log_patterns("reference", RETRY)) == [("committing_anyway.persisted", "fail", 1)]
    assert _verdicts([line], default_log_patterns("reference", {})) == [("committing_anyway.persisted", "report", 1)]
    # the stage is told by the topic: an incoming stage under skip reports while persisted fails
    mixed = {"incoming_failure_strategy": "skip", "persisted_failure_strategy": "retry_forever"}
    incoming = line.replace("tbmq.msg.persisted", "tbmq.msg.all")
    assert _verdicts([incoming, line], default_log_patterns("reference", mixed)) == [
        ("committing_anyway.incoming", "report", 1), ("committing_anyway.persisted", "fail", 1)]


@pytest.mark.parametrize("line, expected", [
    # planted
    (f"{TS} WARNING reference_broker.session: sub-1: delivery read failed: ResponseError('user_script:12: "
     "attempt to compare nil with number'); retrying", "lua_script_error"),
    (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 1): "
     "ResponseError('Error running script (call to f_0a1b): @user_script:3: oops'); retrying", "lua_script_error"),
    # Redis 7's own text, as the broker logs it (its log filter adds the message to redis-py's repr)
    (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 1): "
     "server:ResponseError: Unknown Redis command called from script script: 4f5958, on @user_script:1.; "
     "retrying", "lua_script_error"),
    (f"{TS} ERROR reference_broker: background task died; stopping the node", "broker_error"),
    (f"{TS} CRITICAL reference_broker.server: out of file descriptors", "broker_error"),
    ("Traceback (most recent call last):", "python_traceback"),
    # near misses: what the correct broker logs under the shipped faults, and words that only look alike
    (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 2): "
     "server:ResponseError: save script for sub-1_messages not run: no master took it after 3 attempts "
     "(redirected or script missing); retrying", None),
    (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 3): "
     "server:ClusterDownError; retrying", None),
    (f"{TS} WARNING reference_broker.session: sub-2: delivery read failed: AttributeError(\"'NoneType' object "
     "has no attribute 'writelines'\"); retrying", None),
    (f"{TS} INFO reference_broker.session: ERROR_client_7: connected (clean start 0)", None),
    (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.all: slow batch of 45 records: poll 0.0 s", None),
    ("  File \"/x/reference_broker/session.py\", line 3, in Traceback (most recent call last):", None),
])
def test_reference_broker_lines(line, expected):
    found = _verdicts([line], default_log_patterns("reference", RETRY))
    assert found == ([(expected, "fail", 1)] if expected else []), found


def test_a_script_redis_refused_on_a_full_disk_is_reported_and_any_other_script_error_fails():
    """MISCONF (Redis's AOF cannot be written: disk-full-redis) refuses a script at its first write, so it wrote
    nothing and the broker retries: reported.  Near miss: the same script failing on anything else still fails."""
    misconf = (f"{TS} WARNING reference_broker.pipeline: tbmq.msg.persisted: processing failed (attempt 1): "
               "server:ResponseError: MISCONF Errors writing to the AOF file: No space left on device script: "
               "b738c3e2, on @user_script:83.; retrying")
    other = misconf.replace("MISCONF Errors writing to the AOF file: No space left on device",
                            "WRONGTYPE Operation against a key holding the wrong kind of value")
    patterns = default_log_patterns("reference", RETRY)
    assert _verdicts([misconf], patterns) == [("redis_refused_write", "report", 1)]
    assert _verdicts([other], patterns) == [("lua_script_error", "fail", 1)]


def test_library_errors_under_a_kafka_kill_are_reported_not_failed():
    # Every kafka-broker-kill run of the correct broker logs these (aiokafka retrying while Tansu is down).
    lines = [f"{TS} ERROR aiokafka: Unable connect to node with id 0: [Errno 111] Connect call failed",
             f"{TS} ERROR aiokafka.consumer.fetcher: Failed fetch messages from 0: NodeNotReadyError: Attempt"]
    assert _verdicts(lines, default_log_patterns("reference", RETRY)) == [("library_error", "report", 1)] * 2


def test_a_traceback_is_one_incident_with_the_error_line_that_logged_it():
    lines = [f"{TS} ERROR reference_broker.session: sub-1: connection failed", "Traceback (most recent call last):",
             '  File "reference_broker/session.py", line 171, in run', "KeyError: 'x'",
             f"{TS} INFO reference_broker.session: sub-1: connected"]
    rows = _rows(lines)
    for row in rows[1:4]:
        row["t_wall_us"] = None  # a traceback's lines carry no time stamp
    incidents = match_lines(rows, default_log_patterns("reference", RETRY))
    assert [(i.pattern.name, i.lines, i.context[-1]) for i in incidents] == [("broker_error", 4, "KeyError: 'x'")]


@pytest.mark.parametrize("node, role, lines, expected", [
    ("redis-2", "redis", ["7:M 24 Nov 2026 11:10:21.123 # === REDIS BUG REPORT START: Cut & paste ==="],
     [("redis_crash", "fail", 1)]),
    ("redis-2", "redis", ["7:S 24 Nov 2026 11:10:21.123 # Connection with master lost.",
                          "7:S 24 Nov 2026 11:10:22.123 # Error condition on socket for SYNC: Connection refused",
                          "7:M 24 Nov 2026 11:10:23.123 # Cluster state changed: fail"], []),
    ("kafka", "kafka", ["thread 'tokio-runtime-worker' panicked at tansu-storage/src/s3.rs:10:5:"],
     [("tansu_panic", "fail", 1)]),
    ("kafka", "kafka", ["ready in 66ms"], []),
    ("s3", "storage", ['127.0.0.1 - - [24/Nov/2026 11:10:22] "GET /tansu/x/meta.json HTTP/1.1" 404 -'], []),
    ("s3", "storage", ['127.0.0.1 - - [24/Nov/2026 11:10:22] "PUT /tansu/x HTTP/1.1" 500 -'],
     [("storage_error", "report", 1)]),
])
def test_reference_topology_nodes(node, role, lines, expected):
    assert _verdicts(lines, default_log_patterns("reference", RETRY), node=node, role=role) == expected


def test_a_pattern_applies_only_to_its_roles_and_node_globs():
    from contracts.invariants import LogPattern

    patterns = (LogPattern("only_b2", "boom", nodes=("broker-2",)), LogPattern("redis_boom", "boom", roles=("redis",)))
    assert _verdicts(["boom"], patterns, node="broker-1") == []
    assert _verdicts(["boom"], patterns, node="broker-2") == [("only_b2", "fail", 1)]
    assert _verdicts(["boom"], patterns, node="redis-3", role="redis") == [("redis_boom", "fail", 1)]


def test_an_ignore_pattern_declared_first_narrows_a_default():
    from contracts.invariants import LogPattern

    patterns = (LogPattern("known_shutdown_error", r"background task died", "ignore"),
                *default_log_patterns("reference", RETRY))
    lines = [f"{TS} ERROR reference_broker: background task died; stopping the node",
             f"{TS} ERROR reference_broker.session: sub-1: connection failed"]
    assert _verdicts(lines, patterns) == [("broker_error", "fail", 1)]


# -- Mosquitto and RabbitMQ (lines from real runs of mosquitto-kill and rabbitmq-kill) ------------------------


@pytest.mark.parametrize("preset, line, expected", [
    ("mosquitto", "1795518730: Error: Out of memory.", "fail"),
    ("mosquitto", "1795518730: Warning: Unable to open persistence file for reading.", "report"),
    ("mosquitto", "1795518730: Socket error on client test_sub_client_2_0, disconnecting.", None),
    ("mosquitto", "1795518730: Client test_sub_client_2_0 disconnected.", None),
    ("rabbitmq", "2026-11-24 10:29:22.570825+00:00 [error] <0.757.0> MQTT cannot parse a frame on connection", "fail"),
    ("rabbitmq", "2026-11-24 10:29:19.228794+00:00 [warning] <0.620.0> Message store \"x\": rebuilding indices "
                 "from scratch", "report"),
    ("rabbitmq", "2026-11-24 10:29:16.809267+00:00 [info] <0.223.0> Feature flags:   [ ] quorum_queue", None),
])
def test_external_broker_lines(preset, line, expected):
    found = _verdicts([line], default_log_patterns(preset), node="x", role="mqtt-broker")
    assert [v for _, v, _ in found] == ([expected] if expected else [])


def test_a_rabbitmq_multi_line_report_is_one_incident():
    stamp = "2026-11-24 10:29:22.570825+00:00 [error] <0.757.0>"
    rows = _rows([f"{stamp} MQTT cannot parse a frame", f"{stamp}      4,77,81,", f"{stamp}      84,84,5,",
                  f"{stamp} MQTT a second report at the same microsecond"], node="rabbitmq", role="mqtt-broker")
    for row in rows:
        row["t_wall_us"] = 7  # one time stamp on every line of the report
    assert [(i.pattern.name, i.lines) for i in match_lines(rows, default_log_patterns("rabbitmq"))] == [
        ("rabbitmq_error", 3), ("rabbitmq_error", 1)]


# RabbitMQ 3.10 at the drain's disconnects and at SIGTERM (rabbitmq-partition-1, 2026-11-24): a supervisor's
# child stopped with the normal reason "shutdown" -- reported; the same report with another reason fails.
SHUTDOWN_REPORT = """    supervisor: {<0.828.0>,amqp_channel_sup_sup}
    errorContext: shutdown_error
    reason: {{badmatch,x}}
    offender: [{nb_children,1},
               {id,channel_sup},""".splitlines()


@pytest.mark.parametrize("reason, expected", [("shutdown", "rabbitmq_shutdown_report"),
                                              ("noproc", "rabbitmq_shutdown_report"),
                                              ("noproc_elsewhere", "rabbitmq_error"),
                                              ("{{badmatch,x}}", "rabbitmq_error")])
def test_a_rabbitmq_supervisor_report_is_judged_as_a_whole(reason, expected):
    stamp = "2026-11-24 11:28:39.124846+00:00 [error] <0.828.0>"
    lines = [f"{stamp} {line}".replace("{{badmatch,x}}", reason) for line in SHUTDOWN_REPORT]
    rows = _rows(lines, node="rabbitmq", role="mqtt-broker")
    for row in rows:
        row["t_wall_us"] = 7
    assert [(i.pattern.name, i.lines) for i in match_lines(rows, default_log_patterns("rabbitmq"))] == [
        (expected, 5)]


def test_two_python_log_lines_in_one_millisecond_are_two_records():
    lines = [f"{TS} ERROR aiokafka: Unable connect to node with id 0",
             f"{TS} ERROR reference_broker: background task died; stopping the node"]
    rows = _rows(lines)
    for row in rows:
        row["t_wall_us"] = 5
    assert _verdicts_rows(rows) == [("library_error", "report"), ("broker_error", "fail")]


def _verdicts_rows(rows):
    return [(i.pattern.name, i.pattern.verdict) for i in match_lines(rows, default_log_patterns("reference", RETRY))]


# -- From the stored table to the two invariants ---------------------------------------------------------------


def _judge(tmp_path, spec, broker=RETRY):
    s.write_logs(tmp_path, spec)
    return judge_logs(tmp_path, default_log_patterns("reference", broker), origin_us=s.T0_US)


def test_a_clean_log_passes_and_a_planted_line_fails_with_its_node_time_and_line(tmp_path):
    clean = _judge(tmp_path, s.Spec())
    assert (clean[ERROR_LINES].count, clean[ERROR_LINES].unknown, clean[REPORTED_LINES].count) == (0, None, 0)
    planted = f"{TS} ERROR reference_broker.pipeline: tbmq.msg.all: giving up on 1 records after 1 attempts (x); committing anyway"
    found = _judge(tmp_path, s.Spec(log_lines=(*s.clean_log_lines(s.Spec()), ("broker-2", "broker", planted))))
    errors = found[ERROR_LINES]
    assert errors.count == 1 and errors.unknown is None
    witness = errors.witnesses[0]
    assert witness["data"]["node"] == "broker-2" and witness["data"]["line"] == planted
    assert witness["text"].startswith("broker-2 at 0.400 s, line 1: ") and "committing_anyway.incoming" in witness["text"]
    assert errors.details["incidents"] == {"broker-2": {"committing_anyway.incoming": 1}}


def test_an_unread_log_is_unknown_naming_the_node_but_a_proven_failure_still_fails(tmp_path):
    found = _judge(tmp_path, s.Spec(unread_logs=("redis-2",)))
    assert found[ERROR_LINES].count == 0
    assert "the log of node redis-2 (logs/redis-2.log) could not be read" in found[ERROR_LINES].unknown
    assert found[REPORTED_LINES].unknown == found[ERROR_LINES].unknown
    lua = f"{TS} WARNING reference_broker.session: s: delivery read failed: ResponseError('user_script:1: x')"
    failing = _judge(tmp_path, s.Spec(unread_logs=("redis-2",),
                                      log_lines=(*s.clean_log_lines(s.Spec()), ("broker-1", "broker", lua))))
    assert failing[ERROR_LINES].count == 1 and failing[ERROR_LINES].unknown is None
    assert failing[ERROR_LINES].details["unread"]


def test_no_log_table_is_unknown_never_a_pass(tmp_path):
    found = judge_logs(tmp_path, default_log_patterns("reference", RETRY))
    assert all(f.unknown and "logs.parquet is missing" in f.unknown for f in found.values())


def test_a_target_without_patterns_is_not_applicable(tmp_path):
    s.write_logs(tmp_path, s.Spec(target_kind="external"))
    found = judge_logs(tmp_path, ())
    assert all(f.not_applicable for f in found.values())


# -- The harness side: every node's file into the table ---------------------------------------------------------


@pytest.mark.parametrize("line, expected", [
    ("2026-11-24 11:10:58,893 broker-1 INFO x", "2026-11-24 11:10:58.893000"),
    ("7:M 24 Nov 2026 11:10:21.123 # Server initialized", "2026-11-24 11:10:21.123000"),
    ("2026-11-24 10:29:19.228794+00:00 [warning] <0.620.0> x", "2026-11-24 10:29:19.228794+00:00"),
    ("1795518730: New client connected", None),
    ('127.0.0.1 - - [24/Nov/2026 11:10:22] "GET / HTTP/1.1" 200 -', "2026-11-24 11:10:22"),
    ("ready in 66ms", ""),
    ("Traceback (most recent call last):", ""),
])
def test_line_times(line, expected):
    import datetime

    got = line_time_us(line)
    if expected == "":
        assert got is None
    elif expected is None:
        assert got == 1795518730 * 1_000_000
    else:
        when = datetime.datetime.fromisoformat(expected)
        assert got == int(when.timestamp() * 1_000_000)


def test_collect_logs_keeps_every_line_and_names_an_unreadable_node(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "history").mkdir()
    (tmp_path / "logs" / "broker-1.log").write_bytes(b"=== ordeal: start 11:10:51 python -m reference_broker\n"
                                                       b"2026-11-24 11:10:58,893 broker-1 INFO ready\n\xff bad utf8\n")
    nodes = [("broker-1", "broker", tmp_path / "logs" / "broker-1.log"),
             ("redis-2", "redis", tmp_path / "logs" / "redis-2.log")]
    path = collect_logs(tmp_path / "history", tmp_path, nodes, started_wall_us=line_time_us(
        "2026-11-24 11:10:50,000 x"))
    assert path == tmp_path / "history" / LOG_TABLE_NAME
    table, sources = read_log_table(tmp_path / "history")
    rows = table.to_pylist()
    assert [r["line_no"] for r in rows] == [1, 2, 3] and rows[2]["line"] == "\ufffd bad utf8"
    assert rows[1]["t_mono_us"] == 8_893_000 and rows[0]["t_wall_us"] is None
    assert sources[0].lines == 3 and sources[0].file == "logs/broker-1.log" and not sources[0].error
    assert sources[1].node == "redis-2" and "FileNotFoundError" in sources[1].error
    cut = collect_logs(tmp_path / "history", tmp_path, nodes[:1], 0, max_bytes=60)
    assert read_log_table(cut.parent)[1][0].truncated


def test_a_corrupt_log_table_is_unknown_naming_the_file(tmp_path):
    (tmp_path / LOG_TABLE_NAME).write_bytes(b"PAR1 not really")
    found = judge_logs(tmp_path, default_log_patterns("reference", RETRY))
    assert all("logs.parquet: not a readable Parquet file" in f.unknown for f in found.values())


def test_the_broker_logs_a_redis_script_error_with_its_message_and_the_oracle_fails_it():
    """redis-py's repr of a ResponseError is only "server:ResponseError"; the broker's log filter adds the
    message (measured: Redis 7's text for a failing script), so the Lua pattern can see it."""
    import io
    import logging

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ResponseError

    from reference_broker.__main__ import ErrorDetail

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("2026-11-24 11:10:58,893 broker-1 %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(ErrorDetail())
    log = logging.getLogger("reference_broker.pipeline.test")
    log.addHandler(handler)
    log.propagate = False
    try:
        script = ResponseError("invalid expire time in 'set' command script: f729284a, on @user_script:1.")
        log.warning("%s: processing failed (attempt %d): %r; retrying", "tbmq.msg.persisted", 1, script)
        log.warning("%s: processing failed (attempt %d): %r; retrying", "tbmq.msg.persisted", 2,
                    RedisConnectionError("Error 111 connecting to 127.0.0.3:6379. Connection refused."))
        log.warning("plain %r", ValueError("kept as it was"))
    finally:
        log.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert "server:ResponseError: invalid expire time in 'set' command" in lines[0]
    assert lines[2].endswith("plain ValueError('kept as it was')")
    assert _verdicts(lines, default_log_patterns("reference", RETRY)) == [("lua_script_error", "fail", 1)]
