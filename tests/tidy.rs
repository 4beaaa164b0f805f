//! Tidy checks over the source tree: the layer rules of `ARCHITECTURE.md` and its code map.
//!
//! Invariant (layers): the top-level modules of `src/` are layers, in the order of `LAYERS` (and
//! of `ARCHITECTURE.md`'s table of layers); code in one uses (`crate::x`) only the layers before
//! it and itself, and the submodules of a layer use each other without a cycle, so the module
//! graph has no cycle, and a newcomer can read the crate from the bottom up. `lib.rs` only
//! declares and re-exports; the command line (`cli/`, and the binary in `src/bin/`) uses only the
//! public API (`detcheck::` paths). A new module goes into a layer (or becomes one, added to
//! `LAYERS` and to `ARCHITECTURE.md`'s table and code map). One GPU (`device/`: libraries, memory,
//! kernels, operators) is below the ranks that share or span GPUs (`comm/`): device code never
//! names `crate::comm`, and a collective's code is never in `device/`.
//!
//! Invariant (the Python package's layers): each module of `python/python/detcheck/` imports only
//! the modules before it in `PYTHON_LAYERS` (relative imports, `detcheck.x` imports, and
//! `import_module`/`sys.modules` by name), so the package has no import cycle. One recording
//! engine (`_core.engine.Recording`) serves `watch`, the zero-change recorder and the callbacks,
//! reaching a framework only through `_core.contract.FrontEnd`; one stand-down channel (the native
//! `_program_records`); one dtype table (Rust's `DType::ALL`, `supported_dtypes()`); one
//! operator-name grammar (`src/compare/operator.rs`, called by the tracer).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The crates of `Cargo.lock` that may depend on `num-traits`: they enable its `std` feature,
/// which switches every `num_traits::Float` user in the build from the `libm` crate to the
/// platform's math library (docs/design.md). None is on a deterministic path: `plotters` draws
/// the PNG pictures (its arithmetic places pixels, no recorded value), `proptest` is for tests.
/// A crate that samples or reduces through `num-traits` (`rand_distr`) must not join them.
const NUM_TRAITS_USERS: [&str; 2] = ["plotters", "proptest"];

/// The packages of a `Cargo.lock` text that list `num-traits` among their dependencies.
fn num_traits_users(lock: &str) -> BTreeSet<String> {
    lock.split("[[package]]")
        .filter(|block| {
            block
                .lines()
                .any(|l| l.trim_start().starts_with("\"num-traits"))
        })
        .filter_map(|block| {
            let line = block.lines().find(|l| l.starts_with("name = "))?;
            Some(line["name = ".len()..].trim_matches('"').to_owned())
        })
        .collect()
}

#[test]
fn only_crates_off_the_deterministic_path_use_num_traits() {
    let lock = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock"))
        .expect("Cargo.lock is committed");
    let users = num_traits_users(&lock);
    let allowed: BTreeSet<String> = NUM_TRAITS_USERS.iter().map(|s| (*s).to_owned()).collect();
    let extra: Vec<&String> = users.difference(&allowed).collect();
    assert!(
        extra.is_empty(),
        "crates that use num-traits: {extra:?} (NUM_TRAITS_USERS)"
    );
    let planted = "[[package]]\nname = \"rand_distr\"\ndependencies = [\n \"num-traits\",\n]\n";
    assert_eq!(
        num_traits_users(planted),
        BTreeSet::from(["rand_distr".to_owned()])
    );
}

/// The layers, bottom first. A new top-level module must be placed here (and in
/// ARCHITECTURE.md's code map).
const LAYERS: [&str; 15] = [
    "value",
    "record",
    "file",
    "launch",
    "picture",
    "compare",
    "device",
    "comm",
    "data",
    "checkpoint",
    "scenario",
    "run",
    "diagnose",
    "check",
    "cli",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layers a piece of code names as `crate::<layer>`, outside comments.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::` preceded by an identifier character is another path (`mycrate::`).
            if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
                found.insert(name);
            }
            rest = after;
        }
        // `use crate::{a::x, b::y}` names several layers at once.
        if let Some(at) = line.find("crate::{") {
            let group = &line[at + "crate::{".len()..];
            for part in group.split([',', '{', '}']) {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
    found
}

/// Which layer a file of `src/` belongs to (`None` for `lib.rs` and the binary).
fn layer_of(src: &Path, file: &Path) -> Option<&'static str> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?;
    let name = name.strip_suffix(".rs").unwrap_or(name);
    LAYERS.iter().copied().find(|&l| l == name)
}

/// Every use of a later layer (or of a module that is no layer) in the library under `src`.
fn layer_violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(src).unwrap().display().to_string();
        // Test files may use any layer: they build what they test (compare's tests dump runs).
        if rel == "lib.rs" || rel.starts_with("bin") || rel.ends_with("/tests.rs") {
            continue;
        }
        let code = std::fs::read_to_string(file).unwrap();
        let Some(layer) = layer_of(src, file) else {
            violations.push(format!("{rel}: not inside a layer listed in tests/tidy.rs"));
            continue;
        };
        let index = LAYERS.iter().position(|&l| l == layer).unwrap();
        for used in crate_paths(&code) {
            match LAYERS.iter().position(|l| *l == used) {
                Some(u) if u <= index => {}
                Some(_) => violations.push(format!(
                    "{rel}: layer `{layer}` uses `crate::{used}`, a layer above it"
                )),
                None => violations.push(format!(
                    "{rel}: uses `crate::{used}`; name the layer (the root only re-exports)"
                )),
            }
        }
    }
    violations
}

#[test]
fn every_layer_uses_only_the_layers_before_it() {
    let violations = layer_violations(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        violations.is_empty(),
        "the layer rule (ARCHITECTURE.md) is broken:\n{}",
        violations.join("\n")
    );
}

/// The rule catches what it must: an upward use, a root path, a file outside the layers.
#[test]
fn a_planted_upward_use_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("value")).unwrap();
    std::fs::create_dir_all(src.join("check")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub use crate::check::run_checks;").unwrap();
    std::fs::write(
        src.join("value/mod.rs"),
        "use crate::check::Report;\nfn f() { crate::Tensor::new(); }",
    )
    .unwrap();
    std::fs::write(src.join("check/mod.rs"), "use crate::value::Tensor;").unwrap();
    std::fs::write(src.join("utils.rs"), "").unwrap();
    let violations = layer_violations(src);
    assert_eq!(
        violations,
        [
            "utils.rs: not inside a layer listed in tests/tidy.rs",
            "value/mod.rs: uses `crate::Tensor`; name the layer (the root only re-exports)",
            "value/mod.rs: layer `value` uses `crate::check`, a layer above it",
        ]
    );
}

/// One GPU (`device/`: driver, memory, kernels) is below the collectives between ranks (`comm/`,
/// which builds GPU ranks on it): device code never names `crate::comm`.
#[test]
fn the_device_layer_never_uses_comm() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("device")).unwrap();
    std::fs::create_dir_all(src.join("comm")).unwrap();
    std::fs::write(src.join("device/gpu.rs"), "use crate::comm::CommError;").unwrap();
    std::fs::write(src.join("comm/nccl.rs"), "use crate::device::Gpu;").unwrap();
    assert_eq!(
        layer_violations(src),
        ["device/gpu.rs: layer `device` uses `crate::comm`, a layer above it"]
    );
}

/// The submodules of one layer a file names: `crate::<layer>::<sub>` and `super::<sub>`.
fn sibling_uses(code: &str, layer: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        for prefix in [format!("crate::{layer}::"), "super::".to_owned()] {
            let mut rest = line;
            while let Some(at) = rest.find(&prefix) {
                let after = &rest[at + prefix.len()..];
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.insert(name);
                }
                rest = after;
            }
        }
    }
    found
}

/// Cycles among the submodules of each layer (a submodule is a file, or a folder taken whole;
/// `mod.rs`, which declares and re-exports them, is not one).
fn submodule_cycles(src: &Path) -> Vec<String> {
    let mut cycles = Vec::new();
    for layer in LAYERS {
        let dir = src.join(layer);
        if !dir.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&dir, &mut files);
        let mut uses: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
        for file in &files {
            let rel = file.strip_prefix(&dir).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_str()
                .unwrap();
            let module = first.strip_suffix(".rs").unwrap_or(first).to_owned();
            if module == "mod" {
                continue;
            }
            let code = std::fs::read_to_string(file).unwrap();
            let entry = uses.entry(module.clone()).or_default();
            // Inside a folder submodule, `super::` is the folder itself, not a sibling.
            let names = if rel.components().count() > 1 {
                sibling_uses(&code.replace("super::", "self_folder::"), layer)
            } else {
                sibling_uses(&code, layer)
            };
            entry.extend(names.into_iter().filter(|n| *n != module));
        }
        let modules: Vec<String> = uses.keys().cloned().collect();
        for start in &modules {
            // Depth-first from `start`: a path back to it is a cycle.
            let mut stack = vec![(start.clone(), vec![start.clone()])];
            let mut seen = BTreeSet::new();
            while let Some((at, path)) = stack.pop() {
                for next in uses.get(&at).into_iter().flatten() {
                    if next == start {
                        let mut cycle = path.clone();
                        cycle.push(next.clone());
                        cycles.push(format!("{layer}: {}", cycle.join(" -> ")));
                    } else if uses.contains_key(next) && seen.insert(next.clone()) {
                        let mut longer = path.clone();
                        longer.push(next.clone());
                        stack.push((next.clone(), longer));
                    }
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    cycles
}

#[test]
fn no_submodules_of_a_layer_use_each_other_in_a_cycle() {
    let cycles = submodule_cycles(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(cycles.is_empty(), "module cycles: {cycles:?}");
}

#[test]
fn a_planted_submodule_cycle_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::create_dir_all(&file).unwrap();
    std::fs::write(file.join("mod.rs"), "mod reader; mod msprobe; mod format;").unwrap();
    std::fs::write(file.join("reader.rs"), "use crate::file::msprobe::Dump;").unwrap();
    std::fs::write(
        file.join("msprobe.rs"),
        "use super::reader::Batch; use super::format::E;",
    )
    .unwrap();
    std::fs::write(file.join("format.rs"), "use crate::file::DumpError;").unwrap();
    let cycles = submodule_cycles(dir.path());
    assert!(
        cycles.contains(&"file: msprobe -> reader -> msprobe".to_owned())
            && cycles.contains(&"file: reader -> msprobe -> reader".to_owned()),
        "{cycles:?}"
    );
    std::fs::write(file.join("reader.rs"), "use crate::file::format::Header;").unwrap();
    assert_eq!(submodule_cycles(dir.path()), Vec::<String>::new());
}

#[test]
fn the_command_line_sees_only_the_public_api() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src.join("bin"), &mut files);
    rust_files(&src.join("cli"), &mut files);
    assert!(files.len() >= 6, "{files:?}");
    for file in files {
        let code = std::fs::read_to_string(&file).unwrap();
        for used in crate_paths(&code) {
            assert!(
                !LAYERS.contains(&used.as_str()),
                "{}: the CLI reaches into the library's `crate::{used}`; use `detcheck::`",
                file.display()
            );
        }
    }
}

/// The code map of ARCHITECTURE.md is by folder: it names every folder of `src/` that holds Rust
/// files (as `src/x/y/`), and every layer; what is in a folder is said there and in its files'
/// module docs.
#[test]
fn the_code_map_names_every_source_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let folders: BTreeSet<String> = files
        .iter()
        .map(|f| f.parent().unwrap().strip_prefix(root).unwrap())
        .map(|folder| format!("{}/", folder.display()))
        .collect();
    assert!(folders.len() >= LAYERS.len(), "{folders:?}");
    let missing: Vec<&String> = folders
        .iter()
        .filter(|f| !map.contains(f.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name the folders: {missing:?}"
    );
    for layer in LAYERS {
        assert!(
            map.contains(&format!("src/{layer}/")),
            "ARCHITECTURE.md's code map does not name the layer src/{layer}/"
        );
    }
}

#[test]
fn the_checker_finds_crate_paths() {
    let code = "use crate::value::tensor::Tensor;\nuse crate::{record::Trace, file::DumpMode};\n\
                // crate::check in a comment\nlet x = crate::comm::launch();\nmycrate::check();";
    let found: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(found, ["comm", "file", "record", "value"]);
    assert_eq!(
        layer_of(Path::new("/s"), Path::new("/s/run/mpi.rs")),
        Some("run")
    );
}

/// The Python package's modules (python/python/detcheck/), by dotted name inside the package and
/// bottom first: each may import only the modules before it (and the native `_detcheck`), so the
/// package has no import cycle and reads from the bottom up (python/README.md, "Layout"). The
/// folders are the roles: `_core` (the engine and its contract, no framework), one folder per
/// framework front end (`FRONT_ENDS`), `_launch` (the start-up hook of a launched rank); the
/// public modules and the integrations are at the top. A folder's `__init__.py` is named by the
/// folder and comes before its modules. A new module must be placed here.
const PYTHON_LAYERS: [&str; 38] = [
    "_core",
    "_core.contract",
    "_core.arrays",
    "_core.settings",
    "_core.evidence",
    "_core.api",
    "_core.lifecycle",
    "_core.engine",
    "_torch",
    "_torch.subclasses",
    "_torch.tensors",
    "_torch.device",
    "_torch.device_records",
    "_torch.ops",
    "_torch.frontend",
    "_torch.batch",
    "_torch.rows",
    "_torch.auto",
    "_torch.plugin",
    "logprobs",
    "torch",
    "_mindspore",
    "_mindspore.ops",
    "_mindspore.frontend",
    "_mindspore.auto",
    "_mindspore.plugin",
    "mindspore",
    "_callbacks",
    "_launch",
    "_launch.single_rank",
    "_launch.arrival",
    "_launch.startup",
    "hf",
    "lightning",
    "replay",
    "pytest_plugin",
    "__main__",
    "__init__",
];

/// The framework front ends, one folder each, plugins of one contract (`_core.contract`): none
/// imports another's folder, so the next framework adds a folder, not copies.
const FRONT_ENDS: [&str; 2] = ["_torch", "_mindspore"];

/// The folder of a dotted module name (`_torch.ops` -> `_torch`), or `""` at the top.
fn python_folder(module: &str) -> &str {
    module.rsplit_once('.').map_or("", |(folder, _)| folder)
}

/// The package's modules a Python file of `folder` (`""` at the top) imports, by dotted name,
/// however it reaches them: `from . import x, y`, `from .x import`, `from .. import x`,
/// `from ..x import y` (`y` a module of `x` or a name in it), `import detcheck.x`,
/// `from detcheck.x import`, and by name (`importlib.import_module("detcheck.x")`,
/// `sys.modules.get("detcheck.x")`). Docstrings are skipped.
fn python_imports(code: &str, folder: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
            .collect()
    };
    let join = |a: &str, b: &str| -> String {
        match (a.is_empty(), b.is_empty()) {
            (true, _) => b.to_owned(),
            (_, true) => a.to_owned(),
            _ => format!("{a}.{b}"),
        }
    };
    // `from TARGET import NAMES`: each name that is a module of TARGET, else TARGET itself.
    let from_import = |found: &mut BTreeSet<String>, target: &str, names: &str| {
        let names: Vec<String> = names.split(',').map(|n| ident(n.trim())).collect();
        for name in names.iter().filter(|n| !n.is_empty()) {
            let module = join(target, name);
            if PYTHON_LAYERS.contains(&module.as_str()) || target.is_empty() {
                found.insert(module);
            } else {
                found.insert(target.to_owned());
            }
        }
        if names.iter().all(String::is_empty) && !target.is_empty() {
            found.insert(target.to_owned()); // `from .x import (` over several lines
        }
    };
    let mut found = BTreeSet::new();
    let mut in_docstring = false;
    for line in code.lines() {
        let quotes = line.matches("\"\"\"").count();
        if in_docstring {
            in_docstring = quotes % 2 == 0;
            continue;
        }
        if quotes % 2 == 1 {
            in_docstring = true;
            continue;
        }
        if quotes > 0 {
            continue; // a one-line docstring
        }
        let code = line.split('#').next().unwrap_or("").trim();
        if let Some(rest) = code.strip_prefix("from .") {
            // `from .x import`, `from ..x import`: one dot is the file's folder, two its parent.
            let (base, rest) = match rest.strip_prefix('.') {
                Some(rest) => ("", rest),
                None => (folder, rest),
            };
            if let Some((module, names)) = rest.split_once(" import ") {
                from_import(&mut found, &join(base, module.trim()), names);
            }
        }
        for prefix in ["import detcheck.", "from detcheck"] {
            if let Some(rest) = code.strip_prefix(prefix) {
                match rest.split_once(" import ") {
                    Some((module, names)) if prefix.starts_with("from") => {
                        let module = module.trim().trim_start_matches('.');
                        from_import(&mut found, module, names);
                    }
                    _ => {
                        found.insert(ident(rest.trim_start_matches('.')));
                    }
                }
            }
        }
        // A module reached by its name: `import_module("detcheck.x")`, `sys.modules["detcheck.x"]`.
        let by_name = code.contains("import_module(") || code.contains("sys.modules");
        for quote in ['"', '\''].into_iter().filter(|_| by_name) {
            let prefix = format!("{quote}detcheck.");
            let mut rest = code;
            while let Some(at) = rest.find(&prefix) {
                rest = &rest[at + prefix.len()..];
                let name = ident(rest);
                if rest[name.len()..].starts_with(quote) {
                    found.insert(name);
                }
            }
        }
    }
    found.retain(|n| !n.is_empty() && n != "_detcheck");
    found
}

/// The package's Python files under `package`, with their dotted module names
/// (`_torch/ops.py` -> `_torch.ops`, `_torch/__init__.py` -> `_torch`), sorted by path.
fn python_modules(package: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut folders = vec![package.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "__pycache__") {
                folders.push(path);
            } else if path.extension().is_some_and(|x| x == "py") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(package).unwrap().with_extension("");
            let parts: Vec<&str> = rel.iter().map(|p| p.to_str().unwrap()).collect();
            let module = match parts.as_slice() {
                [folder, "__init__"] => (*folder).to_owned(),
                _ => parts.join("."),
            };
            (file, module)
        })
        .collect()
}

/// Imports that break the package's order: a module not in `PYTHON_LAYERS`, one importing a
/// module at or above its own place, or a front end importing another's folder.
fn python_layer_violations(package: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (file, module) in python_modules(package) {
        let shown = file.strip_prefix(package).unwrap().display().to_string();
        let Some(place) = PYTHON_LAYERS.iter().position(|&m| m == module) else {
            bad.push(format!("{shown}: not in tidy.rs's PYTHON_LAYERS"));
            continue;
        };
        let own_folder = if module.contains('.') {
            python_folder(&module)
        } else {
            module.as_str()
        };
        let code = std::fs::read_to_string(&file).unwrap();
        let folder = if shown.contains('/') { own_folder } else { "" };
        for used in python_imports(&code, folder) {
            if used == module {
                continue;
            }
            let used_folder = if used.contains('.') {
                python_folder(&used)
            } else {
                used.as_str()
            };
            match PYTHON_LAYERS.iter().position(|&m| m == used) {
                Some(_)
                    if FRONT_ENDS.contains(&own_folder)
                        && FRONT_ENDS.contains(&used_folder)
                        && own_folder != used_folder =>
                {
                    bad.push(format!(
                        "{shown} imports {used}, another front end's (FRONT_ENDS)"
                    ))
                }
                Some(at) if at < place => {}
                Some(_) => bad.push(format!("{shown} imports {used}, which comes after it")),
                None => bad.push(format!("{shown} imports {used}, no module of the package")),
            }
        }
    }
    bad
}

#[test]
fn the_python_package_imports_only_modules_below_each_module() {
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/python/detcheck");
    let bad = python_layer_violations(&package);
    assert!(bad.is_empty(), "the Python package's layers: {bad:?}");
}

#[test]
fn a_planted_python_import_cycle_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, code: &str| {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, code).unwrap()
    };
    write(
        "_torch/ops.py",
        "\"\"\"Doc:\nfrom ..torch import watch\n\"\"\"\nfrom .tensors import host\n",
    );
    write(
        "_torch/tensors.py",
        "import torch\nfrom . import ops, subclasses  # a cycle\nfrom .._core import arrays\n",
    );
    write("_torch/__init__.py", "\"\"\"The folder.\"\"\"\n");
    write(
        "_mindspore/frontend.py",
        "from .._torch import tensors as _tensors\nfrom .._core.contract import ROOT\n",
    );
    write(
        "torch.py",
        "m = sys.modules.get(\"detcheck._launch.startup\")\nfrom ._detcheck import cli\n\
         from ._torch.frontend import TORCH\nfrom detcheck._core import engine\n",
    );
    write("_new.py", "");
    assert_eq!(
        python_layer_violations(dir.path()),
        [
            "_mindspore/frontend.py imports _torch.tensors, another front end's (FRONT_ENDS)",
            "_new.py: not in tidy.rs's PYTHON_LAYERS",
            "_torch/tensors.py imports _torch.ops, which comes after it",
            "torch.py imports _launch.startup, which comes after it",
        ]
    );
    assert_eq!(
        python_imports("from .._core import evidence as _evidence, api\n", "_torch"),
        BTreeSet::from(["_core.api".to_owned(), "_core.evidence".to_owned()])
    );
}
