#!/usr/bin/env python3
"""Checks a JUnit XML file against the rules of the Jenkins JUnit schema that CI systems read.

    python3 scripts/check_junit.py junit.xml      # exit 0: valid; 1: the problems, one a line

An independent reader of `detcheck check --junit FILE` (standard library only: xml.etree), as
scripts/dctrace.py is of the trace files; tests/reports.rs runs it where python3 is installed.
The rules, from the Jenkins flavour nextest writes: `testsuites` holds only `testsuite`s; a
`testsuite` has `name` and `tests`, and holds `properties`?, `testcase`*, `system-out`?,
`system-err`?; a `testcase` has `name`, and holds at most one of `skipped`, `error`, `failure`
(failures and errors may repeat), then `system-out`*, `system-err`*; only the schema's attributes
appear; `time` is an `xs:decimal`; counts are non-negative integers that match the children.
"""

import re
import sys
import xml.etree.ElementTree as ET

ATTRIBUTES = {
    "testsuites": {"name", "time", "tests", "failures", "errors", "skipped", "disabled"},
    "testsuite": {
        "name", "tests", "failures", "errors", "skipped", "disabled", "time", "timestamp",
        "hostname", "id", "package", "file", "log", "url", "version", "group",
    },
    "testcase": {"name", "classname", "time", "assertions", "status", "file", "line"},
    "failure": {"message", "type"},
    "error": {"message", "type"},
    "skipped": {"message"},
    "properties": set(),
    "property": {"name", "value"},
    "system-out": set(),
    "system-err": set(),
}
REQUIRED = {"testsuite": {"name", "tests"}, "testcase": {"name"}, "property": {"name", "value"}}
DECIMAL = re.compile(r"^[0-9]+(\.[0-9]+)?$")
COUNT = re.compile(r"^[0-9]+$")


def check(path):
    problems = []

    def where(element, index):
        return f"{element.tag}[{index}] ({element.get('name', '')})"

    def attributes(element, label):
        allowed = ATTRIBUTES.get(element.tag)
        if allowed is None:
            problems.append(f"{label}: element <{element.tag}> is not in the schema")
            return
        for name in element.attrib:
            if name not in allowed:
                problems.append(f"{label}: attribute `{name}` is not in the schema")
        for name in REQUIRED.get(element.tag, ()):
            if name not in element.attrib:
                problems.append(f"{label}: required attribute `{name}` is missing")
        if "time" in element.attrib and not DECIMAL.match(element.get("time")):
            problems.append(f"{label}: time {element.get('time')!r} is not a decimal")
        for name in ("tests", "failures", "errors", "skipped", "disabled"):
            if name in element.attrib and not COUNT.match(element.get(name)):
                problems.append(f"{label}: {name} {element.get(name)!r} is not a count")

    def counted(cases):
        counts = {"tests": len(cases), "failures": 0, "errors": 0, "skipped": 0}
        for case in cases:
            tags = {child.tag for child in case}
            counts["failures"] += "failure" in tags
            counts["errors"] += "error" in tags
            counts["skipped"] += "skipped" in tags
        return counts

    def counts_match(element, cases, label):
        for name, value in counted(cases).items():
            if name in element.attrib and COUNT.match(element.get(name)) and int(element.get(name)) != value:
                problems.append(f"{label}: {name}={element.get(name)} but it holds {value}")

    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as e:
        return [f"{path}: {e}"]
    if root.tag != "testsuites":
        return [f"{path}: the root is <{root.tag}>, not <testsuites>"]
    attributes(root, "testsuites")
    all_cases = []
    for i, suite in enumerate(root):
        label = where(suite, i)
        if suite.tag != "testsuite":
            problems.append(f"testsuites: child <{suite.tag}> is not a <testsuite>")
            continue
        attributes(suite, label)
        order = {"properties": 0, "testcase": 1, "system-out": 2, "system-err": 3}
        last = -1
        for child in suite:
            rank = order.get(child.tag)
            if rank is None:
                problems.append(f"{label}: child <{child.tag}> is not allowed in a testsuite")
            elif rank < last or (rank == last and rank != 1):
                problems.append(f"{label}: <{child.tag}> is out of the schema's order")
            else:
                last = rank
        cases = [c for c in suite if c.tag == "testcase"]
        counts_match(suite, cases, label)
        all_cases += cases
        for j, case in enumerate(cases):
            case_label = f"{label} {where(case, j)}"
            attributes(case, case_label)
            outcomes = [c.tag for c in case if c.tag in ("skipped", "error", "failure")]
            if len(set(outcomes)) > 1 or outcomes.count("skipped") > 1:
                problems.append(f"{case_label}: more than one outcome: {outcomes}")
            seen_output = False
            for child in case:
                attributes(child, f"{case_label} <{child.tag}>")
                if child.tag in ("system-out", "system-err"):
                    seen_output = True
                elif child.tag in ("skipped", "error", "failure"):
                    if seen_output:
                        problems.append(f"{case_label}: <{child.tag}> after the output")
                elif child.tag != "properties":
                    problems.append(f"{case_label}: child <{child.tag}> is not allowed")
    counts_match(root, all_cases, "testsuites")
    return problems


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    problems = check(sys.argv[1])
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{sys.argv[1]}: valid JUnit XML")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
