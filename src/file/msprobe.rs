//! Reading msprobe dump folders (`step{N}/rank{M}/dump.json`), statistics and md5 modes.
//!
//! msprobe (Ascend's PyTorch precision tool) writes one `dump.json` per step and rank. Its `data`
//! object maps each API or module call (`Functional.conv2d.0.forward`) to its `input_args`,
//! `input_kwargs` and `output`; each tensor there has `type`, `dtype`, `shape`, `Max`, `Min`,
//! `Mean`, `Norm` and, in `summary_mode: md5`, an `md5` field (msprobe's checksum, CRC-32 in hex).
//! Each tensor becomes one record named as msprobe's compare names it:
//! `Functional.conv2d.0.forward.input.0`, `....output.0`, `....input.<kwarg>`; records keep the
//! order of the calls in the file (the call order), so "first" means the same as in msprobe.
//!
//! Limits: the tensor-mode `.npy`/`.pt` files are not read; non-tensor arguments are skipped;
//! a single-card dump's `rank` folder (no number) is rank 0.

use crate::file::format::{Digest, Entry};
use crate::file::source::{Batch, Layout, RankSource};
use crate::file::DumpError;
use crate::value::digest::{ExactF64, Stats};
use crate::value::tensor::Tensor;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

/// An msprobe dump folder: its steps and ranks.
#[derive(Debug)]
pub(crate) struct MsprobeDump {
    dir: PathBuf,
    /// (step, rank) -> dump.json, in (step, rank) order.
    files: BTreeMap<(u64, u32), PathBuf>,
    world_size: u32,
}

/// Parses `step12` or `rank3` (and a bare `rank`, which msprobe writes on a single card).
fn numbered(name: &str, prefix: &str) -> Option<u64> {
    let rest = name.strip_prefix(prefix)?;
    if rest.is_empty() && prefix == "rank" {
        return Some(0);
    }
    rest.parse().ok()
}

fn sorted_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>, DumpError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DumpError::io("read folder", dir, e))? {
        let entry = entry.map_err(|e| DumpError::io("read folder", dir, e))?;
        if entry.path().is_dir() {
            out.push((
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            ));
        }
    }
    out.sort();
    Ok(out)
}

impl MsprobeDump {
    pub(crate) fn open(dir: &Path) -> Result<Self, DumpError> {
        let mut files = BTreeMap::new();
        for (step_name, step_dir) in sorted_dir(dir)? {
            let Some(step) = numbered(&step_name, "step") else {
                continue;
            };
            for (rank_name, rank_dir) in sorted_dir(&step_dir)? {
                let Some(rank) = numbered(&rank_name, "rank") else {
                    continue;
                };
                let json = rank_dir.join("dump.json");
                if !json.is_file() {
                    return Err(DumpError::Folder {
                        path: rank_dir,
                        detail: "has no dump.json".into(),
                    });
                }
                let rank = u32::try_from(rank).map_err(|_| DumpError::Folder {
                    path: rank_dir.clone(),
                    detail: "rank number out of range".into(),
                })?;
                files.insert((step, rank), json);
            }
        }
        let world_size =
            files
                .keys()
                .map(|&(_, r)| r + 1)
                .max()
                .ok_or_else(|| DumpError::Folder {
                    path: dir.to_owned(),
                    detail: "holds step<N>/ folders but no step<N>/rank<M>/dump.json".into(),
                })?;
        Ok(MsprobeDump {
            dir: dir.to_owned(),
            files,
            world_size,
        })
    }

    pub(crate) fn world_size(&self) -> u32 {
        self.world_size
    }

    pub(crate) fn describe(&self) -> String {
        format!("msprobe dump at {}", self.dir.display())
    }

    pub(crate) fn open_rank(&self, rank: u32) -> MsprobeRank {
        MsprobeRank {
            files: self
                .files
                .iter()
                .filter(|((_, r), _)| *r == rank)
                .map(|(&(step, _), path)| (step, path.clone()))
                .collect(),
            next: 0,
            names: Vec::new(),
            name_ids: HashMap::new(),
            layouts: Vec::new(),
        }
    }
}

/// One rank of an msprobe dump: one `dump.json` per step.
pub(crate) struct MsprobeRank {
    files: Vec<(u64, PathBuf)>,
    next: usize,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    layouts: Vec<Layout>,
}

impl RankSource for MsprobeRank {
    fn next_step(&mut self, out: &mut Batch) -> Result<Option<u64>, DumpError> {
        out.clear();
        let Some((step, path)) = self.files.get(self.next).cloned() else {
            return Ok(None);
        };
        self.next += 1;
        let text = std::fs::read(&path).map_err(|e| DumpError::io("read", &path, e))?;
        let mut de = serde_json::Deserializer::from_slice(&text);
        let doc: DumpJson =
            serde_path_to_error::deserialize(&mut de).map_err(|e| DumpError::Field {
                path: path.clone(),
                field: e.path().to_string(),
                detail: e.inner().to_string(),
            })?;
        let mut tensors = Vec::new();
        for (op, value) in &doc.data.0 {
            if !value.is_object() {
                return Err(DumpError::Field {
                    path: path.clone(),
                    field: format!("data.{op}"),
                    detail: "expected an object of inputs and outputs".into(),
                });
            }
            collect_tensors(op, value, &mut tensors);
        }
        for (seq, (name, field, tensor)) in tensors.into_iter().enumerate() {
            let bad = |detail: String| DumpError::Field {
                path: path.clone(),
                field: format!("data.{field}"),
                detail,
            };
            let (entry, stats) = self.entry(step, seq as u32, name, tensor).map_err(bad)?;
            // Every entry gets statistics (all absent where msprobe wrote none).
            out.push(entry, Some(stats.unwrap_or_default()));
        }
        Ok(Some(step))
    }

    fn names(&self) -> &[String] {
        &self.names
    }

    fn layouts(&self) -> &[Layout] {
        &self.layouts
    }

    fn tensor(&mut self, _entry: &Entry) -> Result<Option<Tensor>, DumpError> {
        Ok(None)
    }
}

impl MsprobeRank {
    fn entry(
        &mut self,
        step: u64,
        seq: u32,
        name: String,
        t: &Value,
    ) -> Result<(Entry, Option<Stats>), String> {
        let dtype = t
            .get("dtype")
            .and_then(Value::as_str)
            .ok_or("`dtype`: expected a string such as \"torch.float32\"")?;
        let dtype = dtype.rsplit('.').next().unwrap_or(dtype).to_owned();
        let shape = t
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|dims| dims.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or("`shape`: expected an array of non-negative integers")?;
        let stat = |key: &str| -> Result<Option<ExactF64>, String> {
            match t.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(n.as_f64().map(ExactF64)),
                Some(Value::String(s)) => parse_special(s)
                    .map(|x| Some(ExactF64(x)))
                    .ok_or(format!("`{key}`: expected a number, got \"{s}\"")),
                Some(other) => Err(format!("`{key}`: expected a number, got {other}")),
            }
        };
        let (max, min, mean, norm) = (stat("Max")?, stat("Min")?, stat("Mean")?, stat("Norm")?);
        let stats = [max, min, mean, norm]
            .iter()
            .any(Option::is_some)
            .then_some(Stats {
                max,
                min,
                mean,
                norm,
                ..Stats::default()
            });
        let digest = match t.get("md5") {
            None | Some(Value::Null) => Digest::NONE,
            Some(Value::String(hex)) => parse_hex(hex).ok_or(format!(
                "`md5`: expected up to 32 hex digits, got \"{hex}\""
            ))?,
            Some(other) => return Err(format!("`md5`: expected a hex string, got {other}")),
        };
        let layout = Layout { dtype, shape };
        let layout_id = match self.layouts.iter().position(|l| *l == layout) {
            Some(i) => i as u32,
            None => {
                self.layouts.push(layout);
                (self.layouts.len() - 1) as u32
            }
        };
        let name_id = match self.name_ids.get(&name) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.push(name.clone());
                self.name_ids.insert(name, id);
                id
            }
        };
        let entry = Entry {
            step,
            seq,
            name: name_id,
            layout: layout_id,
            replicated: false,
            digest,
        };
        Ok((entry, stats))
    }
}

/// `inf`, `-inf`, `nan` (any case) and numbers written as strings.
fn parse_special(s: &str) -> Option<f64> {
    match s.trim().to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "+inf" | "infinity" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

fn parse_hex(hex: &str) -> Option<Digest> {
    if hex.is_empty() || hex.len() > 32 || hex.len() % 2 != 0 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().take(hex.len() / 2).enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Digest {
        bytes,
        len: (hex.len() / 2) as u8,
    })
}

/// Collects (record name, field path, tensor) of one call, in the order msprobe compares them.
fn collect_tensors<'v>(op: &str, call: &'v Value, out: &mut Vec<(String, String, &'v Value)>) {
    fn walk<'v>(
        name: String,
        field: String,
        v: &'v Value,
        out: &mut Vec<(String, String, &'v Value)>,
    ) {
        match v {
            Value::Object(map) if map.contains_key("type") => {
                let is_tensor = map
                    .get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| t.ends_with("Tensor"));
                if is_tensor {
                    out.push((name, field, v));
                }
            }
            Value::Object(map) => {
                for (k, x) in map {
                    walk(format!("{name}.{k}"), format!("{field}.{k}"), x, out);
                }
            }
            Value::Array(items) => {
                for (i, x) in items.iter().enumerate() {
                    walk(format!("{name}.{i}"), format!("{field}.{i}"), x, out);
                }
            }
            _ => {}
        }
    }
    let Value::Object(parts) = call else { return };
    // input_args, input_kwargs, output: inputs before outputs, as msprobe lists them.
    let order = |k: &str| match k {
        "input_args" | "input" => 0,
        "input_kwargs" => 1,
        "output" => 2,
        _ => 3,
    };
    let mut keys: Vec<&String> = parts.keys().collect();
    keys.sort_by_key(|k| (order(k), k.as_str()));
    for key in keys {
        let role = match key.as_str() {
            "input_args" | "input_kwargs" => "input",
            other => other,
        };
        walk(
            format!("{op}.{role}"),
            format!("{op}.{key}"),
            &parts[key],
            out,
        );
    }
}

/// The parts of `dump.json` that are read; other fields (`task`, `level`, ...) are ignored.
#[derive(Deserialize)]
struct DumpJson {
    data: OrderedCalls,
}

/// The `data` object with its calls in file order (serde_json's map would sort them by name).
struct OrderedCalls(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for OrderedCalls {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CallsVisitor;
        impl<'de> Visitor<'de> for CallsVisitor {
            type Value = OrderedCalls;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of calls")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<OrderedCalls, A::Error> {
                let mut calls = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Value>()? {
                    calls.push((k, v));
                }
                Ok(OrderedCalls(calls))
            }
        }
        deserializer.deserialize_map(CallsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_keep_file_order_and_tensors_get_msprobe_names() {
        let doc: DumpJson = serde_json::from_str(
            r#"{"task": "statistics", "data": {
                "Tensor.zz.0.forward": {"output": [{"type": "torch.Tensor", "dtype": "torch.float16",
                    "shape": [2], "Max": "inf", "Min": 1, "Mean": null, "Norm": 2.5, "md5": "0a1b2c3d"}]},
                "Functional.aa.0.forward": {
                    "input_kwargs": {"w": {"type": "torch.Tensor", "dtype": "torch.float32", "shape": []}},
                    "input_args": [{"type": "int", "value": 3},
                                   [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1]}]]}}}"#,
        )
        .unwrap();
        let mut found = Vec::new();
        for (op, v) in &doc.data.0 {
            collect_tensors(op, v, &mut found);
        }
        let names: Vec<&str> = found.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "Tensor.zz.0.forward.output.0",
                "Functional.aa.0.forward.input.1.0",
                "Functional.aa.0.forward.input.w"
            ]
        );
        let mut rank = MsprobeDump {
            dir: PathBuf::new(),
            files: BTreeMap::new(),
            world_size: 1,
        }
        .open_rank(0);
        let (e, s) = rank.entry(0, 0, names[0].into(), found[0].2).unwrap();
        assert_eq!(e.digest.hex(), "0a1b2c3d");
        let s = s.unwrap();
        assert_eq!(s.max, Some(ExactF64(f64::INFINITY)));
        assert_eq!(s.mean, None);
        assert_eq!(rank.layouts[0].describe(), "float16[2]");
        let bad = serde_json::json!({"type": "torch.Tensor", "dtype": "torch.float32", "shape": [1], "Max": "big"});
        assert_eq!(
            rank.entry(0, 1, "x".into(), &bad).unwrap_err(),
            "`Max`: expected a number, got \"big\""
        );
    }
}
