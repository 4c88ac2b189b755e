"""The one JUnit writer (CI): a run's invariants (spark_checkers/reports.py) and the self-test's judged runs
(ordeal/selftest/outputs.py) are both written through ``junit_xml``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from xml.etree import ElementTree as ET

OUTCOMES = ("pass", "failure", "error", "skipped")


@dataclass(frozen=True)
class Case:
    classname: str
    name: str
    outcome: str = "pass"  # pass | failure | error | skipped
    message: str = ""  # failure / error / skipped message
    text: str = ""  # failure / error body, or system-out of a passing case
    time_s: float | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"JUnit case {self.name!r}: outcome {self.outcome!r}, expected one of {OUTCOMES}")


def junit_xml(suite_name: str, cases: Iterable[Case], time_s: float | None = None) -> str:
    """``<testsuites><testsuite ...>`` with one ``<testcase>`` per case and the counts JUnit readers show."""
    cases = list(cases)
    suite = ET.Element("testsuite", name=suite_name, tests=str(len(cases)),
                       failures=str(sum(c.outcome == "failure" for c in cases)),
                       errors=str(sum(c.outcome == "error" for c in cases)),
                       skipped=str(sum(c.outcome == "skipped" for c in cases)),
                       time=str(time_s or 0))
    for c in cases:
        attributes = {"classname": c.classname, "name": c.name}
        if c.time_s is not None:
            attributes["time"] = str(c.time_s)
        case = ET.SubElement(suite, "testcase", **attributes)
        if c.outcome == "pass":
            if c.text:
                ET.SubElement(case, "system-out").text = c.text
            continue
        node = ET.SubElement(case, c.outcome, message=c.message)
        if c.outcome != "skipped":
            node.text = c.text
    suites = ET.Element("testsuites")
    suites.append(suite)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)
