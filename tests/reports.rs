//! `detcheck check`'s reports end to end: the JSON lines of `--format json`, the JUnit XML of
//! `--junit` (read back with an XML parser, and checked against the JUnit schema's rules by
//! `scripts/check_junit.py` where python3 is installed), and the HTML page of a failed check
//! (`--report-dir`), rendered in headless Chromium where one is installed (`scripts/install-
//! chromium.sh`; `DETCHECK_REQUIRE_CHROMIUM=1`, as CI sets, fails instead of skipping).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn detcheck(args: &[&str], cwd: &Path) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_detcheck"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("the detcheck binary runs");
    Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `detcheck` in `dir` and asserts the exit code, with the output in the message.
fn expect(args: &[&str], dir: &Path, code: i32) -> Outcome {
    let out = detcheck(args, dir);
    assert_eq!(
        out.code, code,
        "detcheck {args:?}\nstdout:\n{}\nstderr:\n{}",
        out.stdout, out.stderr
    );
    out
}

/// A 3-rank collective scenario; `fields` adds or overrides fields after the defaults.
fn collective(reduction: &str, fields: &str) -> String {
    format!(
        r#"{{"kind": "collective", "world_size": 3, "steps": 2, "seed": 1,
            "reduction": "{reduction}", "deterministic_comm": true, "expect": "identical"{fields}}}"#
    )
}

/// A folder `suite/` with one scenario of each outcome: `ok` (identical), `arrival` (arrival
/// order claimed identical: fails `repeat`), `broken` (a rank errors: the run fails, exit 3),
/// `slow` (ignored).
fn suite(dir: &Path) -> PathBuf {
    let suite = dir.join("suite");
    std::fs::create_dir_all(&suite).unwrap();
    for (name, text) in [
        ("ok", collective("ring", "")),
        (
            "arrival",
            collective(
                "arrival_order",
                r#", "description": "adds <in> arrival & order""#,
            ),
        ),
        (
            "broken",
            collective(
                "ring",
                r#", "params": {"fault": {"rank": 1, "step": 0, "kind": "error"}}"#,
            ),
        ),
        ("slow", collective("ring", r#", "ignored": true"#)),
    ] {
        std::fs::write(suite.join(format!("{name}.json")), text).unwrap();
    }
    suite
}

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn json_lines_hold_one_object_per_scenario_then_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    suite(dir.path());
    let out = expect(
        &["check", "--no-progress", "--format", "json", "suite"],
        dir.path(),
        3,
    );
    let lines = lines(&out.stdout);
    assert_eq!(lines.len(), 5, "{}", out.stdout);
    for line in &lines {
        assert_eq!(line["format_version"], 1, "{line}");
    }
    let by_name = |name: &str| {
        lines
            .iter()
            .find(|l| l["scenario"]["name"] == name)
            .unwrap_or_else(|| panic!("no line for {name}:\n{}", out.stdout))
    };

    let arrival = by_name("arrival");
    assert_eq!(arrival["type"], "scenario");
    assert_eq!(arrival["status"], "failed");
    assert_eq!(arrival["verdict"], "FAIL");
    assert_eq!(arrival["exit_code"], 1);
    assert_eq!(arrival["scenario"]["file"], "suite/arrival.json");
    assert_eq!(arrival["scenario"]["folder"], "suite");
    assert_eq!(arrival["scenario"]["spec"]["reduction"], "arrival_order");
    assert_eq!(
        arrival["scenario"]["spec"]["description"],
        "adds <in> arrival & order"
    );
    let first = &arrival["first_divergence"];
    assert_eq!(first["check"], "repeat");
    assert_eq!(
        first["text"],
        "step 0 rank 0 seq 4 `allreduce/sum`: md5 differs"
    );
    assert_eq!(
        (
            &first["step"],
            &first["rank"],
            &first["seq"],
            &first["name"]
        ),
        (
            &Value::from(0),
            &Value::from(0),
            &Value::from(4),
            &Value::from("allreduce/sum")
        )
    );
    assert_eq!(first["difference"], "digest");
    for side in ["left", "right"] {
        assert_eq!(first[side]["layout"], "f32[4096]");
        assert_eq!(first[side]["digest"].as_str().unwrap().len(), 32);
        // Stats keep their exact bits, as in every detcheck file.
        assert!(first[side]["stats"]["mean"]
            .as_str()
            .unwrap()
            .starts_with("0x"));
    }
    assert_ne!(first["left"]["digest"], first["right"]["digest"]);
    let checks = arrival["checks"].as_array().unwrap();
    assert_eq!(checks[0]["check"], "repeat");
    assert_eq!(checks[0]["expectation"], "identical");
    assert_eq!(checks[0]["status"], "failed");
    assert_eq!(checks[0]["holds"], false);
    assert_eq!(checks[0]["found"], "diverges");
    assert_eq!(checks[0]["sides"], serde_json::json!(["run 1", "run 2"]));
    let comparison = &checks[0]["comparison"];
    assert!(comparison.get("map").is_none(), "the map is a picture");
    assert_eq!(comparison["first"]["name"], "allreduce/sum");
    let counts = &arrival["counts"];
    assert_eq!(counts["checks_failed"], 1);
    assert_eq!(
        counts["records_compared"],
        comparison["num_compared"].as_u64().unwrap()
            + checks[1]["comparison"]["num_compared"].as_u64().unwrap()
    );
    assert!(counts["records_differing"].as_u64().unwrap() > 0);

    let ok = by_name("ok");
    assert_eq!(
        (&ok["status"], &ok["verdict"]),
        (&Value::from("passed"), &Value::from("ok"))
    );
    assert_eq!(ok["first_divergence"], Value::Null);
    assert!(ok["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["holds"] == true && c["found"] == "identical"));

    let broken = by_name("broken");
    assert_eq!(broken["status"], "errored");
    assert_eq!(broken["exit_code"], 3);
    let error = broken["error"].as_str().unwrap();
    assert!(
        error.contains("rank 1 failed: planted error at step 0"),
        "{error}"
    );

    let slow = by_name("slow");
    assert_eq!(slow["status"], "ignored");
    assert!(slow["skip_reason"]
        .as_str()
        .unwrap()
        .contains("--include-ignored"));

    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["session"], "thread ranks");
    for (key, n) in [
        ("scenarios", 4),
        ("passed", 1),
        ("failed", 1),
        ("errored", 1),
        ("ignored", 1),
        ("skipped", 0),
        ("exit_code", 3),
    ] {
        assert_eq!(summary[key], n, "{key}: {summary}");
    }
}

#[test]
fn json_lines_are_the_same_bytes_every_time() {
    let dir = tempfile::tempdir().unwrap();
    suite(dir.path());
    let args = [
        "check",
        "--no-progress",
        "--format",
        "json",
        "suite/ok.json",
        "suite/arrival.json",
    ];
    let once = expect(&args, dir.path(), 1).stdout;
    assert_eq!(once, expect(&args, dir.path(), 1).stdout);
}

/// The attribute of `node`, which must be there.
fn attr<'a>(node: roxmltree::Node<'a, '_>, name: &str) -> &'a str {
    node.attribute(name)
        .unwrap_or_else(|| panic!("<{}> lacks `{name}`", node.tag_name().name()))
}

fn elements<'a, 'i>(node: roxmltree::Node<'a, 'i>) -> Vec<roxmltree::Node<'a, 'i>> {
    node.children()
        .filter(roxmltree::Node::is_element)
        .collect()
}

#[test]
fn junit_xml_has_a_testcase_per_scenario_with_failures_errors_and_skips() {
    let dir = tempfile::tempdir().unwrap();
    suite(dir.path());
    let out = expect(
        &[
            "check",
            "--no-progress",
            "--junit",
            "out/junit.xml",
            "suite",
        ],
        dir.path(),
        3,
    );
    // Text stays the default: the table, then the summary.
    assert!(out.stdout.starts_with("scenario "), "{}", out.stdout);
    let path = dir.path().join("out/junit.xml");
    assert!(!dir.path().join("out/junit.xml.tmp").exists());
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"));
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    assert_eq!(attr(root, "name"), "detcheck");
    for (key, value) in [
        ("tests", "4"),
        ("failures", "1"),
        ("errors", "1"),
        ("skipped", "1"),
    ] {
        assert_eq!(attr(root, key), value, "testsuites {key}");
    }
    let suites = elements(root);
    assert_eq!(suites.len(), 1);
    let suite = suites[0];
    assert_eq!(suite.tag_name().name(), "testsuite");
    assert_eq!(attr(suite, "name"), "suite");
    assert_eq!(attr(suite, "tests"), "4");
    let cases = elements(suite);
    let names: Vec<&str> = cases.iter().map(|c| attr(*c, "name")).collect();
    assert_eq!(names, ["arrival", "broken", "ok", "slow"]);
    for case in &cases {
        assert_eq!(case.tag_name().name(), "testcase");
        assert_eq!(attr(*case, "classname"), "suite");
        let time = attr(*case, "time");
        assert!(
            time.parse::<f64>().is_ok_and(|t| t >= 0.0)
                && time.split('.').nth(1).map(str::len) == Some(3),
            "time {time:?}"
        );
    }
    let children = |i: usize| -> Vec<String> {
        elements(cases[i])
            .iter()
            .map(|n| n.tag_name().name().to_owned())
            .collect()
    };
    assert_eq!(children(0), ["failure", "system-out"]);
    assert_eq!(children(1), ["error", "system-out"]);
    assert_eq!(children(2), ["system-out"]);
    assert_eq!(children(3), ["skipped"]);

    let failure = elements(cases[0])[0];
    assert_eq!(
        attr(failure, "message"),
        "repeat: expected identical, but 6 of 36 compared records differ"
    );
    assert_eq!(attr(failure, "type"), "divergence");
    let body = failure.text().unwrap();
    assert!(
        body.contains("first divergence: step 0 rank 0 seq 4 `allreduce/sum`: md5 differs"),
        "{body}"
    );
    let error = elements(cases[1])[0];
    assert_eq!(attr(error, "type"), "run failed");
    assert!(attr(error, "message").contains("rank 1 failed: planted error at step 0"));
    let skipped = elements(cases[3])[0];
    assert!(attr(skipped, "message").starts_with("ignored: "));
    let out = elements(cases[0])[1].text().unwrap();
    assert!(
        out.contains("scenario: arrival (suite/arrival.json)\n"),
        "{out}"
    );
    assert!(
        out.contains("check repeat: does NOT hold (6 of 36 compared records differ)"),
        "{out}"
    );

    // The schema's rules, by an independent reader (where python3 is installed).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check_junit.py");
    match Command::new("python3").arg(&script).arg(&path).output() {
        Ok(run) => assert!(
            run.status.success(),
            "scripts/check_junit.py:\n{}{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        ),
        Err(e) => eprintln!("skipped the schema check of scripts/check_junit.py: python3: {e}"),
    }
}

#[test]
fn a_junit_file_that_cannot_be_written_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    suite(dir.path());
    std::fs::write(dir.path().join("file"), "").unwrap();
    let out = expect(
        &[
            "check",
            "--no-progress",
            "--junit",
            "file/junit.xml",
            "suite/ok.json",
        ],
        dir.path(),
        2,
    );
    assert!(
        out.stderr.contains("--junit file/junit.xml"),
        "{}",
        out.stderr
    );
}

/// Writes the page of `arrival`'s failed `repeat` check into `dir/reports`; returns its path.
fn report_page(dir: &Path) -> PathBuf {
    suite(dir);
    let out = expect(
        &[
            "check",
            "--no-progress",
            "--report-dir",
            "reports",
            "suite/arrival.json",
        ],
        dir,
        1,
    );
    assert!(
        out.stdout
            .contains("  repeat: report page reports/arrival.repeat.html\n"),
        "{}",
        out.stdout
    );
    dir.join("reports/arrival.repeat.html")
}

#[test]
fn the_report_page_is_self_contained_escaped_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let path = report_page(dir.path());
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for needle in [
        "<code>repeat</code> check failed",
        "repeat: expected identical, but 6 of 36 compared records differ",
        "adds &lt;in&gt; arrival &amp; order",
        "step <b>0</b> &middot; rank <b>0</b> &middot; seq <b>4</b> &middot; <code>allreduce/sum</code>: md5 differs",
        "<h2 id=\"map\">Divergence map</h2>",
        "<svg xmlns=\"http://www.w3.org/2000/svg\"",
    ] {
        assert!(html.contains(needle), "the page lacks {needle:?}:\n{html}");
    }
    assert!(
        !html.contains("<in>"),
        "a name from the scenario is not escaped"
    );
    for resource in [" src=", " href=", "<script", "<link", "url("] {
        assert!(
            !html.contains(resource),
            "the page loads something: {resource}"
        );
    }
    let again = report_page(dir.path());
    assert_eq!(html, std::fs::read_to_string(again).unwrap());
}

/// The Chromium binary: `$DETCHECK_CHROMIUM`, or `chromium`, `chromium-browser`,
/// `google-chrome` on the PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("DETCHECK_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| {
        ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .map(|name| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs headless Chromium on `page` with `args`; its standard output. Killed after two minutes.
fn headless(browser: &Path, profile: &Path, args: &[&str], page: &Path) -> String {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut text).map(|_| text)
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "chromium {args:?}: {status}");
    reader.join().unwrap().unwrap()
}

#[test]
fn the_report_page_renders_in_a_headless_browser() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("DETCHECK_REQUIRE_CHROMIUM").is_none(),
            "DETCHECK_REQUIRE_CHROMIUM is set, but no chromium was found"
        );
        eprintln!(
            "skipped: no chromium on the PATH (scripts/install-chromium.sh installs it; \
             DETCHECK_CHROMIUM names another binary)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let page = report_page(dir.path()).canonicalize().unwrap();
    let profile = dir.path().join("profile");

    // The DOM the browser built: the first divergence is there, as text.
    let dom = headless(&browser, &profile, &["--dump-dom"], &page);
    for needle in [
        "First divergence",
        "allreduce/sum</code>: md5 differs",
        "adds &lt;in&gt; arrival &amp; order",
        "<svg",
    ] {
        assert!(dom.contains(needle), "the DOM lacks {needle:?}:\n{dom}");
    }

    // The picture: the page's size, mostly white, with the map's colours in it.
    let shot = dir.path().join("page.png");
    headless(
        &browser,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,3200",
        ],
        &page,
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((info.width, info.height), (1200, 3200));
    let channels = info.color_type.samples();
    let colours: std::collections::BTreeSet<[u8; 3]> = pixels[..info.buffer_size()]
        .chunks(channels)
        .map(|p| [p[0], p[1], p[2]])
        .collect();
    let white = pixels[..info.buffer_size()]
        .chunks(channels)
        .filter(|p| p[..3] == [255, 255, 255])
        .count();
    let total = (info.width * info.height) as usize;
    assert!(
        colours.len() > 50,
        "a blank page: {} colours",
        colours.len()
    );
    assert!(
        white > total / 3 && white < total,
        "white pixels: {white} of {total}"
    );
    // The map's cells of the first differing tensor (the palette's first colour, #1f77b4).
    assert!(
        colours.contains(&[31, 119, 180]),
        "the divergence map is not drawn in the screenshot"
    );
}
