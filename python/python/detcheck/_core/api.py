"""``detcheck.check`` and ``detcheck.compare``: the command line's checks and comparisons as
Python calls that return report objects.

Both run the ``detcheck`` command of this package (``python -m detcheck``, the cargo binary's
implementation) in a subprocess with ``--format json`` and read its JSON lines, so a Python
caller gets exactly what the command reports: verdict per check, first divergence with its
element and operator, environment differences, and the text a person reads. A divergence is
data: it is in the report, never raised. What is raised: ``ValueError`` for arguments detcheck
refuses (exit 2: a bad flag, a bad scenario file), ``DetcheckError`` when the command could not
report at all.

Determinism: a report is a function of the command's output; the JSON lines carry no time.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._detcheck import DetcheckError

__all__ = ["check", "compare", "CheckReport", "ScenarioOutcome", "Comparison"]


class _Fields:
    """Attribute access to a JSON object's fields (``report.first_divergence.element``)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._fields[name])
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return _wrap(self._fields[name])

    def get(self, name: str, default: Any = None) -> Any:
        return _wrap(self._fields.get(name, default))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, as parsed."""
        return self._fields

    def __repr__(self) -> str:
        return f"{type(self).__name__}({json.dumps(self._fields)[:200]})"


def _wrap(value: Any) -> Any:
    if isinstance(value, dict):
        return _Fields(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class ScenarioOutcome(_Fields):
    """One scenario of a check: ``name``, ``status`` (``passed``, ``failed``, ``errored``,
    ``ignored``, ``skipped``), ``verdict`` (``ok``, ``ok (caught)``, ``FAIL``...), ``passed``,
    ``checks`` (each with ``check``, ``holds``, ``found``, ``comparison``), ``first_divergence``
    (``step``, ``rank``, ``name``, ``element``, ``operator``; ``None`` when none),
    ``environment`` (the differences of the first check that has some), ``error`` and ``text``
    (what ``detcheck check`` prints about it)."""

    @property
    def name(self) -> str:
        return self._fields["scenario"]["name"]

    @property
    def passed(self) -> bool:
        return self._fields["status"] in ("passed", "ignored", "skipped")

    @property
    def environment(self) -> Any:
        for c in self._fields.get("checks", []):
            env = (c.get("comparison") or {}).get("environment")
            if env:
                return _wrap(env)
        return []

    @property
    def text(self) -> str:
        return self._fields.get("detail") or ""


class CheckReport:
    """What ``detcheck.check`` found: ``scenarios`` (``ScenarioOutcome`` each), ``passed``,
    ``exit_code`` (the command's: 0 every check holds, 1 one does not, 3 a run failed),
    ``summary`` (the counts), and ``text``: the failures and caught controls as the command
    prints them."""

    def __init__(
        self, scenarios: list[ScenarioOutcome], summary: dict[str, Any], stderr: str
    ) -> None:
        self.scenarios = scenarios
        self.summary = _wrap(summary)
        self.exit_code = summary["exit_code"]
        self.stderr = stderr

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        parts = [s.text for s in self.scenarios if s.text]
        parts += [f"{s.name}: {s.error}" for s in self.scenarios if s.get("error")]
        return "\n".join(parts)

    def __getitem__(self, name: str) -> ScenarioOutcome:
        for s in self.scenarios:
            if s.name == name:
                return s
        raise KeyError(name)

    def __repr__(self) -> str:
        verdicts = ", ".join(f"{s.name}: {s.verdict}" for s in self.scenarios)
        return f"CheckReport(exit_code={self.exit_code}, {verdicts})"


class Comparison(_Fields):
    """What ``detcheck.compare`` found: ``identical``, ``exit_code``, ``comparison`` (the
    engine's: ``first``, ``rows``, ``environment``, counts) and ``text``."""

    @property
    def first(self) -> Any:
        return _wrap(self._fields["comparison"].get("first"))


def _command(
    args: list[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    full_env = dict(os.environ if env is None else env)
    done = subprocess.run(
        [sys.executable, "-m", "detcheck", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
    )
    lines: list[dict[str, Any]] = []
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if done.returncode == 2 and not any(line.get("type") == "summary" for line in lines):
        raise ValueError((done.stderr or done.stdout).strip().removeprefix("error: "))
    return done, lines


def _line_of(
    done: subprocess.CompletedProcess[str], lines: list[dict[str, Any]], kind: str, command: str
) -> dict[str, Any]:
    """The JSON line of type ``kind`` the command printed; ``DetcheckError`` when there is none."""
    found = next((line for line in lines if line.get("type") == kind), None)
    if found is None:
        raise DetcheckError(
            f"detcheck {command} gave no report (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()}"
        )
    return found


def _flag_args(options: Mapping[str, Any]) -> list[str]:
    args: list[str] = []
    for name, value in options.items():
        if value is None or value == [] or value == ():
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        args += [flag, str(value)]
    return args


def check(
    scenarios: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | None = None,
    *,
    program: str | Sequence[object] | None = None,
    ranks: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    launcher: str | None = None,
    checks: str | Sequence[str] | None = None,
    expect: str | None = None,
    world_sizes: str | Sequence[int] | None = None,
    timeout: int | None = None,
    name: str | None = None,
    diagnosis: bool = True,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> CheckReport:
    """Runs ``detcheck check`` and returns a ``CheckReport``.

    ``scenarios``: a scenario file or folder, or a list of them (not with ``program``).

    ``program``: the command of a program to check without a file: a list of arguments, or a
    string split like a shell's.

    ``ranks``, ``steps``, ``seed``, ``launcher``, ``checks``, ``expect``, ``world_sizes``,
    ``timeout``, ``name``: the one-liner's options, only with ``program``, as ``detcheck check
    --ranks ... -- PROGRAM`` takes them (python/README.md lists their meanings).

    ``diagnosis``: ``False`` skips the re-runs that name the element and operator.

    ``env``, ``cwd``: the command's environment and folder (this process's by default).

    A divergence is in the report, not raised. Raises ``ValueError`` for what detcheck refuses
    (a bad option or scenario file: its message names the flag or field), ``DetcheckError``
    when the command gave no report.
    """
    args = ["check", "--no-progress", "--format", "json"]
    if not diagnosis:
        args.append("--no-diagnosis")
    one_liner = dict(
        ranks=ranks,
        steps=steps,
        seed=seed,
        launcher=launcher,
        checks=checks,
        expect=expect,
        world_sizes=world_sizes,
        timeout=timeout,
        name=name,
    )
    if program is not None:
        if scenarios is not None:
            raise ValueError("give scenarios or a program, not both")
        if isinstance(program, str):
            program = shlex.split(program)
        args += _flag_args(one_liner) + ["--", *map(str, program)]
    else:
        given = [k for k, v in one_liner.items() if v not in (None, [], ())]
        if given:
            raise ValueError(f"{', '.join(given)}: only with a program (program=...)")
        if scenarios is not None:
            if isinstance(scenarios, (str, os.PathLike)):
                scenarios = [scenarios]
            args += [os.fspath(s) for s in scenarios]
    done, lines = _command(args, env=env, cwd=cwd)
    summary = _line_of(done, lines, "summary", "check")
    outcomes = [ScenarioOutcome(line) for line in lines if line.get("type") == "scenario"]
    return CheckReport(outcomes, summary, done.stderr)


def compare(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    max_rows: int = 50,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Comparison:
    """Runs ``detcheck compare A B`` on two dumps (detcheck trace folders, msprobe dumps) and
    returns a ``Comparison``; two dumps that differ are a result, not an error. Raises
    ``ValueError`` for a dump detcheck cannot read (exit 2)."""
    args = ["compare", "--format", "json", "--max-rows", str(max_rows), os.fspath(a), os.fspath(b)]
    done, lines = _command(args, env=env, cwd=cwd)
    return Comparison(_line_of(done, lines, "comparison", "compare"))
