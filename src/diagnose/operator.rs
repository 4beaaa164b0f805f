//! The operator drill-down's analysis: two operator traces of one module, one per side, give
//! the first operator whose output differs, and why ([`find_operator`]); or, where re-runs did
//! not diverge, the module's first random operator ([`random_operator`]). The traces' names
//! and the finding's shape are `crate::compare::operator`'s (the grammar the tracer writes:
//! docs/operators.md); this is the one place that reads them for a finding.
//!
//! Determinism: a pure function of the two traces' records (names, dtypes, shapes, digests).

use crate::compare::operator::{parse, Entry, Port};
use crate::compare::{InputSource, OperatorCall, OperatorFinding};
use crate::record::hints;
use crate::record::{RankTrace, Record};

fn layout(record: &Record) -> String {
    let dims: Vec<String> = record.shape.iter().map(ToString::to_string).collect();
    format!("{}[{}]", record.dtype, dims.join(","))
}

fn differs(a: &Record, b: &Record) -> bool {
    a.md5 != b.md5 || a.dtype != b.dtype || a.shape != b.shape
}

/// The program's line that made call `index` of an operator trace (its `site:op:N` entry).
fn call_site(trace: &RankTrace, index: u32) -> Option<String> {
    trace
        .environment
        .as_ref()
        .and_then(|e| e.get(&format!("site:op:{index}")))
        .map(str::to_owned)
}

/// The first random operator (`hints::is_random_operator`) among one side's traced calls of a
/// window, for re-runs that did not diverge ([`OperatorFinding::RandomNotReproduced`]); `None`
/// when the module draws nothing.
#[must_use]
pub fn random_operator(trace: &RankTrace, window: &str, pairs: u32) -> Option<OperatorFinding> {
    let call = first_call(trace, hints::is_random_operator)?;
    Some(OperatorFinding::RandomNotReproduced {
        window: window.to_owned(),
        pairs,
        hint: hints::for_operator(&call.operator).map(hints::Hint::advice),
        call,
    })
}

/// The first call of a collective (`c10d.*`, `_c10d_functional.*`) in an operator trace, with its
/// inputs' layouts and its line.
fn first_collective(trace: &RankTrace) -> Option<OperatorCall> {
    first_call(trace, is_collective)
}

/// The first call in an operator trace of an operator that `wanted` accepts, with its inputs'
/// layouts and its line (output 0).
fn first_call(trace: &RankTrace, wanted: impl Fn(&str) -> bool) -> Option<OperatorCall> {
    let mut current: Option<OperatorCall> = None;
    for record in &trace.records {
        let Some(Entry::Port {
            index,
            module,
            operator,
            port,
        }) = parse(&record.name)
        else {
            continue;
        };
        if current.as_ref().map(|c| c.index) != Some(index) {
            if let Some(call) = current.take().filter(|c| wanted(&c.operator)) {
                return Some(call);
            }
            current = Some(OperatorCall {
                index,
                operator: operator.to_owned(),
                module: module.to_owned(),
                inputs: Vec::new(),
                output: 0,
                site: call_site(trace, index),
            });
        }
        if let (Port::Input { .. }, Some(call)) = (port, current.as_mut()) {
            call.inputs.push(layout(record));
        }
    }
    current.filter(|c| wanted(&c.operator))
}

/// Whether `operator` is a collective of `torch.distributed` (`c10d.allreduce_.default`,
/// `_c10d_functional.all_reduce.default`).
pub(crate) fn is_collective(operator: &str) -> bool {
    ["c10d.", "_c10d_functional.", "c10d_functional."]
        .iter()
        .any(|p| operator.starts_with(p))
}

/// The operator whose output first differs between `left` and `right`, the two sides' operator
/// traces of one window (`window`: [`crate::compare::traced_window`] of the divergent record),
/// and why.
#[must_use]
pub fn find_operator(left: &RankTrace, right: &RankTrace, window: &str) -> OperatorFinding {
    let window = window.to_owned();
    let unavailable = |reason: String| OperatorFinding::Unavailable { reason };
    // The inputs of the call being read: (input index, differs, source, layout, the right
    // side's layout where it differs in shape).
    let mut inputs: Vec<(u32, bool, InputSource, String, Option<String>)> = Vec::new();
    let mut current: Option<u32> = None;
    let mut calls = 0u32;
    for (i, (a, b)) in left.records.iter().zip(&right.records).enumerate() {
        let (Some(ea), Some(eb)) = (parse(&a.name), parse(&b.name)) else {
            return unavailable(format!(
                "record {i} of an operator trace, `{}` / `{}`, is not one the tracer writes",
                a.name, b.name
            ));
        };
        if a.name != b.name {
            let call = |e: &Entry<'_>| match e {
                Entry::Port {
                    index, operator, ..
                } => (Some(*index), (*operator).to_owned()),
                Entry::Window => (None, "(window input)".to_owned()),
            };
            let ((ia, left), (ib, right)) = (call(&ea), call(&eb));
            return OperatorFinding::DifferentOperators {
                window,
                index: ia.or(ib).unwrap_or(0),
                left,
                right,
            };
        }
        let Entry::Port {
            index,
            module,
            operator,
            port,
        } = ea
        else {
            continue;
        };
        if current != Some(index) {
            current = Some(index);
            calls = index + 1;
            inputs.clear();
        }
        match port {
            Port::Input { index: j, source } => {
                let reshaped = (a.shape != b.shape).then(|| layout(b));
                inputs.push((j, differs(a, b), source, layout(a), reshaped));
            }
            Port::Output(output) if differs(a, b) => {
                let call = OperatorCall {
                    index,
                    operator: operator.to_owned(),
                    module: module.to_owned(),
                    inputs: inputs.iter().map(|(_, _, _, l, _)| l.clone()).collect(),
                    output,
                    site: call_site(left, index),
                };
                return match inputs.iter().find(|(_, d, ..)| *d) {
                    None => OperatorFinding::Nondeterministic {
                        window,
                        hint: hints::for_operator(operator).map(hints::Hint::advice),
                        call,
                    },
                    Some((input, _, _, _, Some(other))) => OperatorFinding::SplitWork {
                        window,
                        call,
                        input: *input,
                        other: other.clone(),
                        collective: first_collective(left).or_else(|| first_collective(right)),
                    },
                    Some((input, _, source, ..)) => OperatorFinding::InputFromOutside {
                        window,
                        call,
                        input: *input,
                        source: source.clone(),
                    },
                };
            }
            Port::Output(_) => {}
        }
    }
    if left.records.len() != right.records.len() {
        let longer = if left.records.len() > right.records.len() {
            &left.records
        } else {
            &right.records
        };
        let next = longer[left.records.len().min(right.records.len())..]
            .iter()
            .find_map(|r| match parse(&r.name) {
                Some(Entry::Port {
                    index, operator, ..
                }) => Some((index, operator.to_owned())),
                _ => None,
            })
            .unwrap_or((calls, "(none)".to_owned()));
        let (left_op, right_op) = if left.records.len() > right.records.len() {
            (next.1, "(none)".to_owned())
        } else {
            ("(none)".to_owned(), next.1)
        };
        return OperatorFinding::DifferentOperators {
            window,
            index: next.0,
            left: left_op,
            right: right_op,
        };
    }
    let compiled = left
        .environment
        .as_ref()
        .and_then(|e| e.get("site:compiled"))
        .map(str::to_owned);
    OperatorFinding::NoOperatorDiffers {
        window,
        calls,
        compiled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::digest::{Md5Digest, Stats};
    use crate::value::tensor::DType;

    fn trace(records: &[(&str, u8)]) -> RankTrace {
        RankTrace {
            digest: crate::value::DigestKind::CURRENT,
            rank: 0,
            records: records
                .iter()
                .enumerate()
                .map(|(seq, &(name, byte))| Record {
                    rank: 0,
                    step: 2,
                    seq: seq as u32,
                    name: name.to_owned(),
                    replicated: false,
                    dtype: DType::F32,
                    shape: vec![4, 8],
                    md5: Md5Digest([byte; 16]),
                    stats: Stats::default(),
                    shard: None,
                })
                .collect(),
            environment: None,
        }
    }

    const ADDMM_IN: &str = "op/0000/block.fc/aten.addmm.default/in0";
    const ADDMM_IN1: &str = "op/0000/block.fc/aten.addmm.default/in1<in0";
    const ADDMM_OUT: &str = "op/0000/block.fc/aten.addmm.default/out0";
    const ADD_IN0: &str = "op/0001/block/aten.add.Tensor/in0<op0.out0";
    const ADD_IN1: &str = "op/0001/block/aten.add.Tensor/in1";
    const ADD_OUT: &str = "op/0001/block/aten.add.Tensor/out0";

    #[test]
    fn a_random_draw_is_found_among_a_windows_calls() {
        let dropout_in = "op/0000/drop/Dropout/in0";
        let dropout_out = "op/0000/drop/Dropout/out0";
        let left = trace(&[("window/in0", 1), (dropout_in, 1), (dropout_out, 2)]);
        let Some(OperatorFinding::RandomNotReproduced {
            call, pairs, hint, ..
        }) = random_operator(&left, "forward", 4)
        else {
            panic!("no random operator in {left:?}");
        };
        assert_eq!(
            (call.operator.as_str(), call.module.as_str()),
            ("Dropout", "drop")
        );
        assert_eq!((call.index, pairs), (0, 4));
        assert_eq!(call.inputs, ["f32[4,8]"]);
        assert!(hint.is_some());
        // A module that draws nothing has no random operator to name.
        let addmm = trace(&[(ADDMM_IN, 1), (ADDMM_OUT, 2)]);
        assert_eq!(random_operator(&addmm, "forward", 4), None);
    }

    #[test]
    fn a_shard_for_a_whole_weight_names_the_collective_that_adds_the_parts() {
        // One rank's whole weight against a shard of it at two ranks, whose partial products
        // an all-reduce adds: not a value "from outside".
        let mm_in = "op/0000/fc/aten.mm.default/in0<in0";
        let mm_weight = "op/0000/fc/aten.mm.default/in1";
        let mm_out = "op/0000/fc/aten.mm.default/out0";
        let reduce_in = "op/0001/fc/c10d.allreduce_.default/in0<op0.out0";
        let left = trace(&[("window/in0", 1), (mm_in, 1), (mm_weight, 2), (mm_out, 3)]);
        let mut right = trace(&[
            ("window/in0", 1),
            (mm_in, 1),
            (mm_weight, 4),
            (mm_out, 5),
            (reduce_in, 5),
        ]);
        right.records[2].shape = vec![4, 4];
        let finding = find_operator(&left, &right, "forward");
        let OperatorFinding::SplitWork {
            call,
            input,
            other,
            collective: Some(collective),
            ..
        } = &finding
        else {
            panic!("{finding:?}");
        };
        assert_eq!((call.operator.as_str(), *input), ("aten.mm.default", 1));
        assert_eq!(
            (call.inputs[1].as_str(), other.as_str()),
            ("f32[4,8]", "f32[4,4]")
        );
        assert_eq!(
            (collective.operator.as_str(), collective.index),
            ("c10d.allreduce_.default", 1)
        );
        assert_eq!(collective.inputs, ["f32[4,8]"]);
        assert!(finding.to_string().contains("follows the split"));
        // An input that differs in value, not shape, is still one from outside.
        right.records[2].shape = vec![4, 8];
        let finding = find_operator(&left, &right, "forward");
        assert!(
            matches!(finding, OperatorFinding::InputFromOutside { input: 1, .. }),
            "{finding:?}"
        );
    }

    #[test]
    fn an_operator_with_equal_inputs_and_a_different_output_is_nondeterministic() {
        let left = trace(&[("window/in0", 1), (ADDMM_IN, 2), (ADDMM_OUT, 3)]);
        let right = trace(&[("window/in0", 1), (ADDMM_IN, 2), (ADDMM_OUT, 4)]);
        let finding = find_operator(&left, &right, "forward");
        let OperatorFinding::Nondeterministic { call, hint, .. } = &finding else {
            panic!("{finding:?}");
        };
        assert_eq!(call.operator, "aten.addmm.default");
        assert_eq!(call.module, "block.fc");
        assert_eq!(call.inputs, ["f32[4,8]"]);
        assert_eq!(hint.as_ref().unwrap().about, "*mm");
        assert!(finding
            .to_string()
            .contains("itself is nondeterministic; hint: set"));
    }

    #[test]
    fn a_differing_input_is_traced_to_its_source() {
        // input 1 of the add differs and no traced operator made it
        let left = trace(&[
            ("window/in0", 1),
            (ADDMM_IN1, 1),
            (ADDMM_OUT, 3),
            (ADD_IN0, 3),
            (ADD_IN1, 5),
            (ADD_OUT, 6),
        ]);
        let mut right = left.clone();
        right.records[4].md5 = Md5Digest([9; 16]);
        right.records[5].md5 = Md5Digest([9; 16]);
        let finding = find_operator(&left, &right, "forward");
        assert_eq!(
            finding,
            OperatorFinding::InputFromOutside {
                window: "forward".into(),
                call: OperatorCall {
                    index: 1,
                    operator: "aten.add.Tensor".into(),
                    module: "block".into(),
                    inputs: vec!["f32[4,8]".into(), "f32[4,8]".into()],
                    output: 0,
                    site: None,
                },
                input: 1,
                source: InputSource::Untraced,
            }
        );
        assert!(finding
            .to_string()
            .contains("from outside the traced operators"));

        // the module's own input differs: the first call's input from it is named
        let mut right = left.clone();
        for i in [0, 1, 2] {
            right.records[i].md5 = Md5Digest([7; 16]);
        }
        let finding = find_operator(&left, &right, "forward");
        assert!(matches!(
            finding,
            OperatorFinding::InputFromOutside {
                source: InputSource::WindowInput { ref kind, index: 0 },
                input: 1,
                ..
            } if kind == "in"
        ));

        // an output that was equal when made and differs when read again changed in between
        let mut right = left.clone();
        right.records[3].md5 = Md5Digest([8; 16]);
        right.records[5].md5 = Md5Digest([8; 16]);
        assert!(matches!(
            find_operator(&left, &right, "forward"),
            OperatorFinding::InputFromOutside {
                source: InputSource::ChangedAfter { call: 0, output: 0 },
                input: 0,
                ..
            }
        ));
    }

    #[test]
    fn a_differing_python_number_is_named_as_such() {
        let name = "op/0000/(model)/aten.mul.Tensor/in1<scalar";
        let left = trace(&[
            ("op/0000/(model)/aten.mul.Tensor/in0", 1),
            (name, 2),
            ("op/0000/(model)/aten.mul.Tensor/out0", 3),
        ]);
        let mut right = left.clone();
        right.records[1].md5 = Md5Digest([9; 16]);
        right.records[2].md5 = Md5Digest([9; 16]);
        let finding = find_operator(&left, &right, "forward");
        assert!(
            matches!(
                finding,
                OperatorFinding::InputFromOutside {
                    source: InputSource::Scalar,
                    input: 1,
                    ..
                }
            ),
            "{finding:?}"
        );
        assert!(finding
            .to_string()
            .contains("a Python number passed to the operator"));
    }

    #[test]
    fn agreeing_operators_and_different_ones_are_said() {
        let left = trace(&[(ADDMM_IN, 1), (ADDMM_OUT, 3), (ADD_IN1, 1), (ADD_OUT, 2)]);
        assert_eq!(
            find_operator(&left, &left, "backward"),
            OperatorFinding::NoOperatorDiffers {
                window: "backward".into(),
                calls: 2,
                compiled: None,
            }
        );
        let mut right = left.clone();
        right.records[2].name = "op/0001/block/aten.sub.Tensor/in1".into();
        assert!(matches!(
            find_operator(&left, &right, "forward"),
            OperatorFinding::DifferentOperators { index: 1, ref left, ref right, .. }
                if left == "aten.add.Tensor" && right == "aten.sub.Tensor"
        ));
        let shorter = trace(&[(ADDMM_IN, 1), (ADDMM_OUT, 3)]);
        assert!(matches!(
            find_operator(&left, &shorter, "forward"),
            OperatorFinding::DifferentOperators { index: 1, ref right, .. } if right == "(none)"
        ));
        let odd = trace(&[("fwd/x", 1)]);
        assert!(matches!(
            find_operator(&odd, &odd, "forward"),
            OperatorFinding::Unavailable { .. }
        ));
    }
}
