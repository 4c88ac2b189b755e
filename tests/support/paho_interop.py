"""Run Eclipse Paho's MQTT interoperability suite (github.com/eclipse/paho.mqtt.testing, ``interoperability/``)
against a running broker and print pass / fail per test.

    .venv/bin/python tests/support/paho_interop.py --suite-dir /path/to/paho.mqtt.testing/interoperability \
        --host 127.0.0.1 --port 1883 [--version 4|5|both] [--json FILE] [--test-timeout 60]

The suite is not copied into this repository (EPL / EDL, kept where it is checked out): its ``client_test.py``
(MQTT 3.1.1) and ``client_test5.py`` (MQTT 5) are imported from ``--suite-dir``, given the host, port and topic
globals their ``__main__`` blocks would set, and run test by test with unittest, each suite in a child
process of its own (the suites keep module-level clients, and a hung test must not hang the run).  Exit
status 0 when every test passed, 1 otherwise, 2 on bad arguments."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import unittest
from dataclasses import asdict, dataclass
from pathlib import Path

SUITES = {4: "client_test", 5: "client_test5"}


@dataclass(frozen=True)
class Outcome:
    suite: str
    test: str
    status: str       # "pass" | "fail" | "error" | "timeout" | "skip"
    seconds: float
    detail: str = ""  # the last line of the failure's traceback


class _TestTimeout(Exception):
    pass


def _set_globals(module, version: int, host: str, port: int) -> None:
    """What each suite's ``if __name__ == "__main__"`` block sets before unittest.main()."""
    module.host, module.port = host, port
    if version == 5:
        prefix = "client_test5/"
        module.topic_prefix = prefix
        module.topics = [prefix + t for t in ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")]
        module.wildtopics = [prefix + t for t in ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")]
    else:
        module.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
        module.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
    module.nosubscribe_topics = ("test/nosubscribe",)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def run_child(suite_dir: Path, version: int, host: str, port: int, test_timeout: float) -> int:
    """In the child: import the suite, run each test, print one JSON line per outcome."""
    import importlib
    import logging

    sys.path.insert(0, str(suite_dir))
    os.chdir(suite_dir)
    module = importlib.import_module(SUITES[version])
    _set_globals(module, version, host, port)
    logging.getLogger().setLevel(logging.ERROR)
    names = unittest.TestLoader().getTestCaseNames(module.Test)

    def alarm(signum, frame):
        raise _TestTimeout(f"no result after {test_timeout:.0f} s")

    signal.signal(signal.SIGALRM, alarm)
    try:
        module.Test.setUpClass()
    except Exception as error:  # noqa: BLE001 - reported, not raised: the suite could not start
        print(json.dumps(asdict(Outcome(SUITES[version], "setUpClass", "error", 0.0, repr(error)[:300]))), flush=True)
        return 1
    for name in names:
        result = unittest.TestResult()
        started = time.monotonic()
        signal.alarm(int(test_timeout))
        try:
            module.Test(name).run(result)
        except _TestTimeout as error:
            result.errors.append((None, f"_TestTimeout: {error}"))
        finally:
            signal.alarm(0)
        took = round(time.monotonic() - started, 1)
        if any("_TestTimeout" in text for _, text in result.errors):
            status, detail = "timeout", f"no result after {test_timeout:.0f} s"
        elif result.failures:
            status, detail = "fail", _last_line(result.failures[0][1])
        elif result.errors:
            status, detail = "error", _last_line(result.errors[0][1])
        elif result.skipped:
            status, detail = "skip", result.skipped[0][1]
        else:
            status, detail = "pass", ""
        print(json.dumps(asdict(Outcome(SUITES[version], name, status, took, detail))), flush=True)
    return 0


def run_suite(suite_dir: Path, version: int, host: str, port: int, test_timeout: float) -> list[Outcome]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--suite-dir", str(suite_dir),
               "--host", host, "--port", str(port), "--version", str(version), "--test-timeout", str(test_timeout)]
    # the whole suite's bound: every test at its own timeout, plus the suite's set-up
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          start_new_session=True) as child:
        try:
            out, _ = child.communicate(timeout=test_timeout * 40 + 60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, _ = child.communicate()
    outcomes = []
    for line in out.splitlines():
        if line.startswith("{"):
            outcomes.append(Outcome(**json.loads(line)))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite-dir", required=True, type=Path,
                        help="the interoperability/ directory of a paho.mqtt.testing checkout")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--version", default="both", choices=("4", "5", "both"),
                        help="4: client_test.py (MQTT 3.1.1), 5: client_test5.py (MQTT 5), both (default)")
    parser.add_argument("--test-timeout", type=float, default=60.0, help="seconds one test may take (default 60)")
    parser.add_argument("--json", type=Path, help="also write the outcomes to this file as a JSON list")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    suite_dir = args.suite_dir.resolve()
    versions = (4, 5) if args.version == "both" else (int(args.version),)
    missing = [SUITES[v] + ".py" for v in versions if not (suite_dir / f"{SUITES[v]}.py").is_file()]
    if missing:
        print(f"error: --suite-dir {suite_dir}: {', '.join(missing)} not found (expected the interoperability/ "
              "directory of github.com/eclipse/paho.mqtt.testing)", file=sys.stderr)
        return 2
    if args.child:
        return run_child(suite_dir, versions[0], args.host, args.port, args.test_timeout)
    outcomes: list[Outcome] = []
    for version in versions:
        found = run_suite(suite_dir, version, args.host, args.port, args.test_timeout)
        outcomes.extend(found)
        for o in found:
            print(f"{o.suite:13} {o.test:40} {o.status.upper():7} {o.seconds:6.1f}s  {o.detail}", flush=True)
        passed = sum(o.status == "pass" for o in found)
        print(f"{SUITES[version]}: {passed} of {len(found)} passed", flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0 if outcomes and all(o.status == "pass" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
