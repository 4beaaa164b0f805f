"""Runs the zoo (examples/zoo/zoo.toml): each upstream program as its README runs it, a plain
run beside its clean check, then each planted bug, and says whether every expectation held.

    python examples/zoo/zoo.py [--detcheck BIN] [--ci] [--only NAME] [--table FILE]

`scripts/zoo.sh` runs all of it and writes docs/zoo.md (`--table`; with `--only NAME`, that
program's rows are replaced and the others' kept from the table's last run); python/tests/test_zoo.py
runs the entries marked `ci` through the same functions. Each run gets a fresh copy of the
program's folder in a temporary directory (the vendored files are never changed); a planted bug
is applied to its copy with `git apply`.

Exit status: 0 when every expectation held, 1 when one did not (the table says which), 2 on a
bad manifest or a setup command that failed.

Determinism: the rows are in the manifest's order; times are wall-clock and only reported
(one plain run and one check each: ratios, not a benchmark's medians).
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ZOO = Path(__file__).resolve().parent
ROOT = ZOO.parent.parent
MANIFEST = ZOO / "zoo.toml"


def load(path=MANIFEST):
    """The manifest's programs (dicts as in zoo.toml)."""
    with open(path, "rb") as f:
        return tomllib.load(f)["program"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expand(items, values):
    return [str(item).format(**values) for item in items]


@dataclass
class Copy:
    """A fresh copy of one program's folder, set up and (for a planted bug) patched."""

    root: Path
    cwd: Path
    env: dict
    argv: list


def interpreter(program, python=sys.executable):
    """The program's Python: its manifest's ``venv`` (relative to the repository), else
    ``python``; a missing venv is a RuntimeError naming the script that installs it."""
    if "venv" not in program:
        return python
    found = ROOT / program["venv"] / "bin" / "python"
    if not found.exists():
        raise RuntimeError(f"{found} is missing: run {program['installed_by']}")
    return str(found)


def needs(program, python=sys.executable):
    """Raises RuntimeError, naming the script that installs it, when the program's interpreter
    lacks a module of its manifest's ``requires`` (test_zoo.py asks ``support.requires``)."""
    python = interpreter(program, python)
    for module in program.get("requires", ()):
        probe = f"import importlib.util as u, sys; sys.exit(u.find_spec({module!r}) is None)"
        if subprocess.run([python, "-c", probe]).returncode != 0:
            command = program.get("installed_by", f"bash scripts/install-python.sh --{module}")
            raise RuntimeError(f"{program['name']} needs {module}: run {command}")


def prepare(program, workdir, planted=None, python=sys.executable, batch="{batch}"):
    """Copies the program's folder into ``workdir``, applies ``planted``'s patch, runs the
    setup commands and returns the copy with its command (run by ``interpreter``'s Python,
    whose folder is first on PATH). ``batch``: what ``{batch}`` in the command becomes (kept
    for the check, whose `batch_sizes` runs substitute it; a size for the plain run)."""
    root = Path(workdir) / program["folder"]
    python = interpreter(program, python)
    shutil.copytree(ZOO / program["folder"], root)
    values = {"python": python, "zoo": ZOO, "copy": root, "port": _free_port(), "batch": batch}
    for patch in (program.get("patch"), (planted or {}).get("patch")):
        if patch:
            subprocess.run(["git", "apply", str(ZOO / patch)], cwd=root, check=True)
    cwd = root / program["cwd"]
    env = dict(os.environ)
    env["PATH"] = str(Path(python).parent) + os.pathsep + env.get("PATH", "")
    env.update({k: str(v).format(**values) for k, v in program.get("env", {}).items()})
    for command in [*program.get("setup", []), *((planted or {}).get("setup", []))]:
        done = subprocess.run(
            _expand(command, values), cwd=cwd, env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"setup {command} exited {done.returncode}:\n{done.stderr}")
    argv = _expand(program["argv"], values)
    if planted:
        argv = [planted.get("replace", {}).get(a, a) for a in argv]
        argv += _expand(planted.get("args", []), values)
    return Copy(root, cwd, env, argv)


@dataclass
class Outcome:
    """One row of the table: a clean check or a planted bug."""

    program: str
    case: str
    expected: str
    found: str
    records: str
    seconds: float
    plain_seconds: float | None
    held: bool
    why: list = field(default_factory=list)


def check(detcheck, program, copy):
    argv = [detcheck, "check", "--no-progress", "--format", "json"]
    argv += ["--ranks", str(program["ranks"])] if "ranks" in program else []
    argv += ["--steps", str(program["steps"]), *program.get("detcheck", []), "--", *copy.argv]
    start = time.monotonic()
    done = subprocess.run(argv, cwd=copy.cwd, env=copy.env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    scenarios = [x for x in lines if x.get("type") == "scenario"]
    if len(scenarios) != 1:
        raise RuntimeError(f"detcheck exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return scenarios[0], seconds


def _records(line):
    """'repeat 2931, replicas n/a' from a scenario line's checks."""
    parts = []
    for c in line["checks"]:
        if c["status"] == "skipped":
            parts.append(f"{c['check']} n/a")
        else:
            parts.append(f"{c['check']} {c.get('comparison', {}).get('num_compared', 0)}")
    return ", ".join(parts)


def sites_of(where):
    """The lines a row accepts: its `line`, or each of its list (which operator parts first is
    the CPU kernels' choice: zoo.toml's mnist batch row)."""
    return [where] if isinstance(where, str) and where else [w for w in where or () if w]


def judge(line, verdict, kind, where, compared=()):
    """What the check found, and the expectations it missed (``compared``: the checks that must
    pass having compared records)."""
    why = []
    if line["verdict"] != verdict:
        why.append(f"verdict {line['verdict']}, expected {verdict}")
        if line.get("error"):
            why.append(f"its error: {str(line['error'])[:2000]}")
    for c in line["checks"]:
        if c["status"] == "passed" and c.get("comparison", {}).get("num_compared", 0) == 0:
            why.append(f"{c['check']} passed after comparing nothing")
    statuses = {c["check"]: c for c in line["checks"]}
    for name in compared:
        c = statuses.get(name)
        if c is None or c["status"] != "passed":
            said = "not run" if c is None else f"{c['status']}: {c.get('skip_reason') or ''}"
            why.append(f"{name} expected to pass having compared records ({said})")
    first = line.get("first_divergence") or {}
    cause = first.get("cause") or {}
    found = line["verdict"]
    operator = first.get("operator") or {}
    if kind == "shape_dependence":
        # The `batch_sizes` check names no cause of `repeat`: the operator finding is its class
        # (docs/causes.md, "Shape dependence"), its call's line the program's.
        site = (operator.get("call") or {}).get("site") or ""
        if operator.get("finding") != "batch_variant":
            why.append(f"operator {operator.get('finding')}, expected batch_variant")
        else:
            found = f"{kind} at {site} (`{operator['call']['operator']}`)"
        accepted = sites_of(where)
        if accepted and not any(site.endswith(w) for w in accepted):
            why.append(f"{' or '.join(accepted)} not named (the operator's site {site or '-'})")
    elif cause:
        site = cause.get("site") or ""
        found = f"{cause['kind']}" + (f" at {site}" if site else "")
        if kind and cause["kind"] != kind:
            why.append(f"class {cause['kind']}, expected {kind}")
        said = " ".join(str(cause.get(k) or "") for k in ("site", "fix", "summary"))
        if where and where not in said:
            why.append(f"{where} not named (site {site or '-'}; fix: {cause.get('fix')})")
    elif kind:
        why.append(f"no cause, expected {kind}")
    return found, why


def _kill(proc):
    """Kills the session ``proc`` leads (its children too); one already gone is no error."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _plain(program, copy, timeout=600):
    """Seconds of one plain run of the steps the check stops at: the program to its end (its
    own flags stop it there); with ``plain_until``, until each of its processes printed a line
    matching it, when they are killed; with ``plain_steps``, until torch's global optimizer-step
    hook (plain_stop/sitecustomize.py, nothing else added) ended each at that step. ``ranks``:
    that many processes, each with the variables detcheck's launcher gives a rank."""
    until = program.get("plain_until")
    pattern = re.compile(until) if until else None
    env = dict(copy.env)
    if pattern is not None:
        env["PYTHONUNBUFFERED"] = "1"  # each line as it is printed
    if program.get("plain_steps"):
        env["ZOO_PLAIN_STEPS"] = str(program["steps"])
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (str(ZOO / "plain_stop"), env.get("PYTHONPATH")) if x
        )
    ranks = program.get("ranks")
    port = str(_free_port())
    envs = (
        [
            dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(ranks))
            | {"RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks)}
            for r in range(ranks)
        ]
        if ranks
        else [env]
    )
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            copy.argv,
            cwd=copy.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for env in envs
    ]
    found = [pattern is None] * len(procs)
    ends = []
    output = [[] for _ in procs]

    def watch(index, proc):
        for line in proc.stdout:
            output[index] = [*output[index][-19:], line]
            if not found[index] and pattern.search(line):
                found[index] = True
                ends.append(time.monotonic())
                if all(found):
                    for p in procs:
                        _kill(p)
        proc.stdout.close()

    watchers = [threading.Thread(target=watch, args=(i, p)) for i, p in enumerate(procs)]
    for w in watchers:
        w.start()
    try:
        for p in procs:
            p.wait(timeout=timeout)
        ended = time.monotonic()
    finally:
        for p in procs:
            _kill(p)  # what it started and left running
        for w in watchers:
            w.join()
    if pattern is not None:
        if not all(found):
            raise RuntimeError(f"plain run: no line matching {until!r} (plain_until) in its output")
        return max(ends) - start
    if any(p.returncode != 0 for p in procs):
        tail = "".join(output[0])
        raise RuntimeError(f"plain run exited {[p.returncode for p in procs]}:\n{tail}")
    return ended - start


def run_program(program, detcheck, python=sys.executable, ci_only=False, planted_too=True):
    """The program's clean check (beside a plain run, where it stops by itself) and its planted
    bugs: a list of Outcomes."""
    needs(program, python)
    outcomes = []
    name = program["name"]
    if not ci_only or program.get("ci"):
        with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
            copy = prepare(program, tmp, python=python, batch=str(program.get("plain_batch")))
            plain = _plain(program, copy) if program.get("timed", True) else None
            copy = prepare(program, Path(tmp) / "check", python=python)
            line, seconds = check(detcheck, program, copy)
        verdict = program.get("verdict", "ok")
        sites = " or ".join(sites_of(program.get("line")))
        expected = verdict if verdict == "ok" else f"{program['class']} at {sites}"
        found, why = judge(
            line, verdict, program.get("class"), program.get("line"), program.get("compared", ())
        )
        outcomes.append(
            Outcome(name, "clean", expected, found, _records(line), seconds, plain, not why, why)
        )
    for planted in program.get("planted", []) if planted_too else []:
        if ci_only and not planted.get("ci"):
            continue
        with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
            copy = prepare(program, tmp, planted, python=python)
            line, seconds = check(detcheck, program, copy)
        where = planted.get("line", "")
        expected = planted["class"] + (f" at {where}" if where else "")
        found, why = judge(line, "FAIL", planted["class"], where)
        outcomes.append(
            Outcome(
                name, planted["name"], expected, found, _records(line), seconds, None, not why, why
            )
        )
    return outcomes


def run_deterministic(program, detcheck, python=sys.executable):
    """Each planted bug checked with `--deterministic` (issue 54: which setting fixes it, and in
    how many runs besides the check's own): a list of (case, class, finding, seconds)."""
    needs(program, python)
    rows = []
    for planted in program.get("planted", []):
        with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
            copy = prepare(program, tmp, planted, python=python)
            flagged = {**program, "detcheck": [*program.get("detcheck", []), "--deterministic"]}
            line, seconds = check(detcheck, flagged, copy)
        rows.append((planted["name"], planted["class"], line.get("deterministic"), seconds))
    return rows


def deterministic_table(rows):
    """docs/zoo-deterministic.md's text: (program, case, class, finding, seconds) rows."""
    out = [
        "# The zoo's planted bugs under `--deterministic`",
        "",
        "Written by `scripts/zoo.sh --deterministic` (examples/zoo/zoo.py); do not edit by hand.",
        "Each planted bug of docs/zoo.md checked with `--deterministic`: the settings that alone",
        "make its runs identical (`fixed_by`; none: no setting fixes it, the report says why) and",
        "how many runs the finding took besides the check's own (`runs`; issue 54: at most 3 when",
        "the setting the cause names fixes it).",
        "",
        "| program | case | class | fixed by | runs | time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for program, case, kind, finding, seconds in rows:
        finding = finding or {}
        fixed = ", ".join(f"`{n}`" for n in finding.get("fixed_by", [])) or (
            "none needed" if finding.get("fixes") else "none fixes it"
        )
        out.append(
            f"| {program} | {case} | {kind} | {fixed} | {finding.get('runs', '-')} | "
            f"{seconds:.0f} s |"
        )
    return "\n".join(out) + "\n"


def _rows_by_program(text, programs):
    """The table rows of an earlier docs/zoo.md, by program name, as written (a row whose
    program cell is `"` belongs to the program above it)."""
    names = {f"{p['name']} (`{p['upstream']}`)": p["name"] for p in programs}
    rows, current = {}, None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 9 or cells[0] in ("program", "---"):
            continue
        if cells[0] != '"':
            current = names.get(cells[0])
        if current is not None:
            rows.setdefault(current, []).append(line)
    return rows


def table(programs, outcomes, earlier=None):
    """docs/zoo.md's text. With `earlier` (the text of an earlier docs/zoo.md), the programs
    that `outcomes` has no row of keep their earlier rows (`--only NAME --table`): the table
    stays whole, each program's rows from its own last run."""
    idioms = {p["name"]: (p["idiom"], p["upstream"]) for p in programs}
    kept = _rows_by_program(earlier, programs) if earlier else {}
    rows = [
        "# The zoo: real upstream programs, checked as their READMEs run them",
        "",
        "Written by `scripts/zoo.sh` (examples/zoo/zoo.py from examples/zoo/zoo.toml); do not edit",
        "by hand. Each program is vendored unmodified (examples/zoo/README.md: upstream, commit,",
        "licence). `clean` is the program as shipped; the other rows are bugs planted by a patch",
        "(examples/zoo/planted/), each with the cause class and the line the report must name (in",
        "its site or its fix: `found` shows the site).",
        "`records` is what each check compared (`n/a`: not applicable, with its reason in the",
        "report); `x plain` is the check's time against one plain run of the same steps (one",
        "run each on the 2-core VM, so a rough figure; the plain run stops by the program's own",
        "flags, at the line it prints at the step the check stops at, or by torch's",
        "optimizer-step hook there; `-` where none was taken: a planted bug, or a program",
        "that fails as shipped and takes no flag that stops it).",
        "",
        "| program | launcher idiom | case | expected | found | records | time | x plain | held |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    ran = {o.program for o in outcomes}
    held = total = 0
    for p in programs:
        if p["name"] not in ran:
            earlier_rows = kept.get(p["name"], [])
            rows += earlier_rows
            total += len(earlier_rows)
            held += sum(r.rstrip().endswith("| yes |") for r in earlier_rows)
            continue
        shown = None
        for o in (o for o in outcomes if o.program == p["name"]):
            idiom, upstream = idioms[o.program]
            program = f"{o.program} (`{upstream}`)"
            if o.program == shown:
                program = idiom = '"'
            shown = o.program
            ratio = f"{o.seconds / o.plain_seconds:.2f}x" if o.plain_seconds else "-"
            verdict = "yes" if o.held else "**no**: " + "; ".join(o.why)
            rows.append(
                f"| {program} | {idiom} | {o.case} | {o.expected} | {o.found} "
                f"| {o.records} | {o.seconds:.0f} s | {ratio} | {verdict} |"
            )
            total += 1
            held += o.held
    rows += ["", f"{held} of {total} held."]
    return "\n".join(rows) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detcheck", default=str(ROOT / "target" / "release" / "detcheck"))
    parser.add_argument(
        "--ci",
        action="store_true",
        help="only the entries marked ci (true or \"full\": test_zoo.py's, CI's and the full tier's)",
    )
    parser.add_argument("--only", help="only the program of this name")
    parser.add_argument("--table", help="write the table (markdown) to this file")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="each planted bug with --deterministic: which setting fixes it, in how many runs",
    )
    args = parser.parse_args()
    programs = load()
    chosen = [p for p in programs if not args.only or p["name"] == args.only]
    if not chosen:
        sys.stderr.write(f"zoo.py: --only: no program named {args.only!r} in {MANIFEST}\n")
        sys.exit(2)
    detcheck = str(Path(args.detcheck).resolve())
    if args.deterministic:
        rows = []
        for program in chosen:
            try:
                found = run_deterministic(program, detcheck)
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                sys.stderr.write(f"zoo.py: {program['name']}: {e}\n")
                sys.exit(2)
            for case, kind, finding, seconds in found:
                finding = finding or {}
                print(
                    f"{program['name']}, {case} ({kind}): fixed by {finding.get('fixed_by')} "
                    f"(fixes: {finding.get('fixes')}), {finding.get('runs')} runs more; "
                    f"{seconds:.0f} s",
                    flush=True,
                )
                rows.append((program["name"], case, kind, finding, seconds))
        if args.table:
            Path(args.table).write_text(deterministic_table(rows))
        sys.exit(0)
    outcomes = []
    for program in chosen:
        try:
            found = run_program(program, detcheck, ci_only=args.ci)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            sys.stderr.write(f"zoo.py: {program['name']}: {e}\n")
            sys.exit(2)
        for o in found:
            print(
                f"{'held' if o.held else 'MISSED'}: {o.program}, {o.case}: {o.found} "
                f"({o.records}; {o.seconds:.0f} s"
                + (f", plain {o.plain_seconds:.0f} s" if o.plain_seconds else "")
                + f") {'; '.join(o.why)}",
                flush=True,
            )
            outcomes.append(o)
    if args.table:
        # With --only, the other programs keep their rows of the table's last run.
        table_file = Path(args.table)
        earlier = table_file.read_text() if args.only and table_file.exists() else None
        table_file.write_text(table(programs, outcomes, earlier))
    sys.exit(0 if all(o.held for o in outcomes) else 1)


if __name__ == "__main__":
    main()
