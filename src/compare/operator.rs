//! The operator drill-down's data: the names of an operator trace (the grammar the tracer
//! writes and `compare --align` reads) and the shape of its finding ([`OperatorFinding`]). The
//! analysis that reads two traces for a finding is `crate::diagnose::operator`'s.
//!
//! When a check's first divergence is a record of `detcheck.torch.watch` (`fwd/<module>`,
//! `grad/<param>`, `param/<param>`), the re-runs that capture it (`crate::diagnose`) also record,
//! inside that record's module only, the inputs and outputs of every operator it runs (the
//! package's `detcheck/_torch/ops.py`, a `TorchDispatchMode`), into a trace file of their own.
//! `diagnose::find_operator` pairs the two sides' records in order and classifies the first
//! operator whose output differs ([`OperatorFinding`]):
//!
//! - its traced inputs were bit-identical: the operator itself is nondeterministic (with the
//!   advice of the one hint table, `crate::record::hints`, when it is a known one);
//! - an input already differed: where it came from, by the provenance the tracer wrote into its
//!   name: no traced operator made it (the value came from outside the traced operators: Python
//!   `set`/`dict` order, numpy or `random` without a seed, a file, the clock), it is one of the
//!   module's own inputs (made before the module ran), or an earlier operator made it with equal
//!   bits and it changed afterwards (an in-place write the tracer cannot see).
//!
//! The names the tracer writes (docs/operators.md), all at the captured step:
//!
//! | name | what |
//! | --- | --- |
//! | `window/in{j}`, `window/grad_out{j}` | the module's tensor inputs (forward), or the gradients of its outputs (backward) |
//! | `window/out{j}` | the module's tensor outputs (forward; only in the full traces of `detcheck run --inside`) |
//! | `op/{i}/{module}/{operator}/in{j}` | input `j` of the `i`-th operator call, taken before the call |
//! | `op/{i}/{module}/{operator}/in{j}<op{k}.out{m}` | ... which is output `m` of call `k` (`<in{m}`, `<grad_out{m}`: a window input) |
//! | `op/{i}/{module}/{operator}/out{j}` | output `j` of the call |
//!
//! Determinism: a pure function of the two traces' records (names, dtypes, shapes, digests).
//!
//! Limits: only tensors the writer can record are traced (an input of another dtype is not
//! seen, so an operator may read as nondeterministic when such an input differed); the trace
//! holds digests and statistics, not tensors, so the operator's first differing element is not
//! named here (the record's element is).
use crate::record::hints::Advice;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One operator call of an operator trace, as reports show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCall {
    /// Its position among the calls of the traced window, from 0.
    pub index: u32,
    /// The operator, as the dispatcher names it (`aten.addmm.default`, `myns.myop.default`).
    pub operator: String,
    /// The innermost module whose code called it (`(model)` for the model itself).
    pub module: String,
    /// Its traced tensor inputs' dtypes and shapes, in order (`f32[16,32]`).
    pub inputs: Vec<String>,
    /// Its first output whose bits differ between the two sides.
    pub output: u32,
    /// The program's line that called it (`model.py:42`: the innermost frame outside torch,
    /// detcheck, installed packages and the standard library), from the tracer's `site:op:N`
    /// entries; `None` when the trace has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// Where a sample sat in its batch at the two sizes of a `batch_sizes` finding, from the
/// drill-down's re-runs (`detcheck.rows.row`, `detcheck.rows.threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleRows {
    /// The sample's row in its batch at the first size, then at the other.
    pub row: (usize, usize),
    /// The rows of the other size's batch (padding included).
    pub of: usize,
    /// The samples at rows before it in the other size's batch: the first divergence is the
    /// first differing sample, so each of them was compared equal.
    pub before: usize,
    /// The intra-op CPU threads of the other size's re-run (`torch.get_num_threads()`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
}

/// Where a differing input of an operator came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum InputSource {
    /// No traced operator produced it, and it is none of the module's inputs: a parameter,
    /// buffer or tensor made outside the dispatcher (numpy, a file, Python arithmetic).
    Untraced,
    /// The module's own input (forward) or the gradient of its output `index` (backward).
    WindowInput {
        /// `in` or `grad_out`.
        kind: String,
        /// Which one.
        index: u32,
    },
    /// A Python number passed to the operator (not a tensor): computed outside torch.
    Scalar,
    /// Output `output` of call `call`, which had equal bits on both sides when it was made.
    ChangedAfter {
        /// The call that made it.
        call: u32,
        /// Which of its outputs.
        output: u32,
    },
}

/// What the operator drill-down found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum OperatorFinding {
    /// The operator's traced inputs were bit-identical and its output was not: the operator
    /// itself is nondeterministic.
    Nondeterministic {
        /// The traced window: `forward`, `backward` or `optimizer step`.
        window: String,
        /// The call.
        call: OperatorCall,
        /// What is known of this operator and how to make it deterministic.
        hint: Option<Advice>,
    },
    /// An input of the operator already differed, and no traced operator produced it so.
    InputFromOutside {
        /// The traced window.
        window: String,
        /// The call.
        call: OperatorCall,
        /// The first differing input.
        input: u32,
        /// Where that input came from.
        source: InputSource,
    },
    /// Every traced operator's outputs agree, yet the record differs: the value changed
    /// outside the traced operators.
    NoOperatorDiffers {
        /// The traced window.
        window: String,
        /// The number of calls traced.
        calls: u32,
        /// The `torch.compile`d module, when the model is one (`site:compiled`): its generated
        /// kernels run where the tracer cannot see, so the difference may come from them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        compiled: Option<String>,
    },
    /// The two sides ran different operators (control flow that depends on a value).
    DifferentOperators {
        /// The traced window.
        window: String,
        /// The first call where they differ.
        index: u32,
        /// The left side's operator there (`(none)` when it ran fewer).
        left: String,
        /// The right side's.
        right: String,
    },
    /// The re-runs did not diverge at the record (the divergence changes from launch to
    /// launch), and the module's traced calls include a random operator: the one part of its
    /// work whose output follows more than its inputs (a generator's state, drawn in an order
    /// that can depend on timing).
    RandomNotReproduced {
        /// The traced window.
        window: String,
        /// How many pairs of re-runs were made.
        pairs: u32,
        /// The first random operator's call (`output` 0).
        call: OperatorCall,
        /// What is known of this operator and how to make it reproducible.
        hint: Option<Advice>,
    },
    /// The `batch_sizes` check: the first operator of the module's call that reads the batch
    /// and gives the sample other output rows at the other batch size, every operator before it
    /// having given the sample equal rows (so its input rows were equal): its arithmetic
    /// depends on the batch (its shapes, a split of a reduction, a kernel chosen by size).
    BatchVariant {
        /// The traced window (`forward`).
        window: String,
        /// The call, its inputs' shapes at the first size.
        call: OperatorCall,
        /// The two batch sizes, the first then the other.
        sizes: (usize, usize),
        /// Its inputs' shapes at the other size.
        other_inputs: Vec<String>,
        /// Operators that only one size ran before it (`aten.where.self at batch 1`: a mask's
        /// fix-up where the batch holds padding rows), left out of the pairing.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        one_sided: Vec<String>,
        /// Where the sample sat in its batch at each size, where the re-runs said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rows: Option<SampleRows>,
    },
    /// An input of the operator differed in shape between the sides: the two sides split the
    /// module's work differently (a tensor-parallel layer's weight is a shard at more ranks,
    /// whole at one), and where a collective inside the module joins the parts' results, it is
    /// named: a sum split over ranks and added by a collective is rounded in an order that
    /// follows the split, so its bits follow the world size.
    SplitWork {
        /// The traced window.
        window: String,
        /// The first call whose output differs, its inputs' layouts on the left side.
        call: OperatorCall,
        /// The input that differs in shape.
        input: u32,
        /// That input's layout on the right side.
        other: String,
        /// The first collective inside the window (`c10d.*`), on the side that ran it, or
        /// `None` when neither side ran one there.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        collective: Option<OperatorCall>,
    },
    /// Why the operators could not be compared.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for OperatorCall {
    /// `aten.add.Tensor (call #3 in `block`, inputs f32[16,64], f32[16,64])`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` (call #{} in `{}`, inputs {})",
            self.operator,
            self.index,
            self.module,
            if self.inputs.is_empty() {
                "none traced".to_owned()
            } else {
                self.inputs.join(", ")
            }
        )?;
        match &self.site {
            Some(site) => write!(f, " at {site}"),
            None => Ok(()),
        }
    }
}

impl InputSource {
    /// The rest of an input-from-outside finding's sentence: where the differing input came
    /// from.
    fn fmt_after_input(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputSource::Untraced => f.write_str(
                ", and no traced operator produced it: the value came from outside the \
                 traced operators (Python set/dict order, numpy or random without a \
                 seed, a file, the clock)",
            ),
            InputSource::WindowInput { kind, index } if kind == "in" => write!(
                f,
                ": it is the module's input {index}, which differed when the module was \
                 called (made before it, outside its operators: data, or code of the \
                 module that called it)"
            ),
            InputSource::WindowInput { index, .. } => write!(
                f,
                ": it is the gradient of the module's output {index}, which differed \
                 when its backward began (made by the layers after it)"
            ),
            InputSource::Scalar => f.write_str(
                ": it is a Python number passed to the operator, not a tensor, computed \
                 outside torch (Python set/dict order, random without a seed, the clock)",
            ),
            InputSource::ChangedAfter { call, output } => write!(
                f,
                ": call #{call} made it (output {output}) with equal bits on both \
                 sides, and it changed afterwards outside the traced operators (an \
                 in-place write through numpy, .data or another thread)"
            ),
        }
    }
}

/// A batch-variant finding's sentence: a split of the work by the rows' positions where
/// samples before this one in its batch at the other size gave equal records (the first
/// divergence is the first differing sample, so they were compared equal) or where the
/// inputs' shapes are alike at both sizes; a shape dependence otherwise.
fn fmt_batch_variant(
    f: &mut fmt::Formatter<'_>,
    window: &str,
    call: &OperatorCall,
    (first, other): (usize, usize),
    other_inputs: &[String],
    one_sided: &[String],
    rows: Option<&SampleRows>,
) -> fmt::Result {
    write!(
        f,
        "{call} ({window}) gave the sample other output rows at batch {other} than at batch \
         {first} from equal input rows"
    )?;
    if !one_sided.is_empty() {
        write!(
            f,
            " (every operator both sizes ran before it gave equal rows; only one size ran {})",
            one_sided.join(", ")
        )?;
    }
    let same_shapes = call.inputs == other_inputs;
    if !same_shapes {
        write!(
            f,
            "; its inputs at batch {other}: {}",
            other_inputs.join(", ")
        )?;
    }
    let threads = match rows.and_then(|r| r.threads) {
        Some(n) => format!("the CPU's {n} intra-op threads"),
        None => "CPU threads or a kernel's tiles".to_owned(),
    };
    let fix = "the model run one sample at a time (`with detcheck.torch.batch_invariant():` \
               around its call), or one intra-op thread (`torch.set_num_threads(1)`) with every \
               batch padded to one size (docs/causes.md, shape dependence)";
    match rows {
        Some(r) if r.before > 0 => write!(
            f,
            ": {} before it in the same batch at batch {other} gave equal records, and this \
             one, at row {} of {} there (row {} at batch {first}), did not: what differs is \
             the row's position, where {threads} split the batch; {fix}",
            match r.before {
                1 => "the sample".to_owned(),
                n => format!("the {n} samples"),
            },
            r.row.1,
            r.of,
            r.row.0
        ),
        _ if same_shapes => write!(
            f,
            ", in inputs of the same shapes at both: not the shape but the split of the work \
             differs, such as {threads} splitting the batch by the rows' positions (the sample \
             is another row at each size); {fix}"
        ),
        _ => write!(
            f,
            ": its arithmetic depends on the shape (a kernel or a split of its reduction chosen \
             by the shape); run the model one sample at a time (`with \
             detcheck.torch.batch_invariant():` around its call), or pad every batch to one \
             fixed size (which holds on one CPU thread: on more, the threads split the batch \
             by position) (docs/causes.md, shape dependence)"
        ),
    }
}

impl fmt::Display for OperatorFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OperatorFinding::Nondeterministic { window, call, hint } => {
                write!(
                    f,
                    "{call} gave different output {} from bit-identical inputs ({window}): the \
                     operator itself is nondeterministic",
                    call.output
                )?;
                match hint {
                    Some(hint) => write!(f, "; hint: {hint}"),
                    None => f.write_str(
                        "; it is not in detcheck's table of known operators (an operator of \
                         the program's own? make its reduction order fixed)",
                    ),
                }
            }
            OperatorFinding::InputFromOutside {
                window,
                call,
                input,
                source,
            } => {
                write!(
                    f,
                    "{call} ({window}): its output {} differs because its input {input} already \
                     differed",
                    call.output
                )?;
                source.fmt_after_input(f)
            }
            OperatorFinding::NoOperatorDiffers {
                window,
                calls,
                compiled: Some(module),
            } => write!(
                f,
                "none of the {calls} traced operator calls ({window}) gave different outputs, \
                 and `{module}` is `torch.compile`d: its generated kernels run where the tracer \
                 cannot see, so the value most likely changed inside them"
            ),
            OperatorFinding::NoOperatorDiffers {
                window,
                calls,
                compiled: None,
            } => write!(
                f,
                "none of the {calls} traced operator calls ({window}) gave different outputs: \
                 the value changed outside the traced operators (an in-place write through \
                 numpy or .data, or code that is not an operator of the framework)"
            ),
            OperatorFinding::DifferentOperators {
                window,
                index,
                left,
                right,
            } => write!(
                f,
                "the two sides ran different operators at call #{index} ({window}): `{left}` \
                 vs `{right}` (control flow that depends on a value)"
            ),
            OperatorFinding::RandomNotReproduced {
                window,
                pairs,
                call,
                hint,
            } => {
                write!(
                    f,
                    "{call} ({window}) is a random draw, and the module's output differed between \
                     the checked runs where every record before it was equal; {pairs} pairs of \
                     re-runs gave equal values there, so the draw depends on timing"
                )?;
                match hint {
                    Some(hint) => write!(f, "; hint: {hint}"),
                    None => Ok(()),
                }
            }
            OperatorFinding::BatchVariant {
                window,
                call,
                sizes,
                other_inputs,
                one_sided,
                rows,
            } => fmt_batch_variant(
                f,
                window,
                call,
                *sizes,
                other_inputs,
                one_sided,
                rows.as_ref(),
            ),
            OperatorFinding::SplitWork {
                window,
                call,
                input,
                other,
                collective,
            } => {
                let here = call.inputs.get(*input as usize).map_or("?", String::as_str);
                let split = format!(
                    "the two sides split the module's work differently: input {input} of {call} \
                     is {here} on one side and {other} on the other (a shard of a \
                     tensor-parallel layer's weight)"
                );
                match collective {
                    Some(c) => write!(
                        f,
                        "{c} ({window}) adds the ranks' partial results, and {split}: a sum \
                         split over ranks and added by a collective is rounded in an order that \
                         follows the split, so its bits follow the world size; a reduction whose \
                         order does not (each rank's partial sums of fixed chunks, gathered and \
                         added in chunk order at every size) makes them equal (docs/causes.md, \
                         split reduction)"
                    ),
                    None => write!(
                        f,
                        "{split} ({window}): a reduction split otherwise is rounded otherwise \
                         (docs/causes.md, split reduction)"
                    ),
                }
            }
            OperatorFinding::Unavailable { reason } => write!(f, "not named: {reason}"),
        }
    }
}

/// The traced window of a record of `detcheck.torch.watch`, by its name's prefix: `None` for
/// a record of another kind (no operator is traced for it).
#[must_use]
pub fn traced_window(record: &str) -> Option<&'static str> {
    if record.starts_with("fwd/") {
        Some("forward")
    } else if record.starts_with("grad/") {
        Some("backward")
    } else if record.starts_with("param/") {
        Some("optimizer step")
    } else {
        None
    }
}

/// One record of an operator trace, by its name.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Entry<'a> {
    /// `window/in{j}` or `window/grad_out{j}`.
    Window,
    /// An input or output of call `index`.
    Port {
        index: u32,
        module: &'a str,
        operator: &'a str,
        port: Port,
    },
}

/// One tensor of an operator call: the tracer's half of a record's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    /// Input `index`, taken before the call, and where that tensor came from
    /// ([`InputSource::Untraced`]: nothing is written).
    Input {
        /// Which input (tensor leaves first, then Python floats).
        index: u32,
        /// Its provenance.
        source: InputSource,
    },
    /// Output `index`, taken after the call.
    Output(u32),
}

/// The name of the record of `port` of call `call` of `operator` in `module`: the grammar
/// `parse` reads, written in one place (the Python tracer calls it through the native
/// module's `operator_record_name`).
#[must_use]
pub fn operator_record_name(call: u32, module: &str, operator: &str, port: &Port) -> String {
    let port = match port {
        Port::Output(index) => format!("out{index}"),
        Port::Input { index, source } => match source {
            InputSource::Untraced => format!("in{index}"),
            InputSource::Scalar => format!("in{index}<scalar"),
            InputSource::ChangedAfter { call, output } => format!("in{index}<op{call}.out{output}"),
            InputSource::WindowInput { kind, index: from } => format!("in{index}<{kind}{from}"),
        },
    };
    format!("op/{call:04}/{module}/{operator}/{port}")
}

/// The name of a window's record: `window/in{index}` (a forward window's input),
/// `window/grad_out{index}` (a backward window's output gradient) or `window/out{index}` (a
/// forward window's output, traced by `detcheck run --inside`); `None` for another kind.
#[must_use]
pub fn window_record_name(kind: &str, index: u32) -> Option<String> {
    matches!(kind, "in" | "grad_out" | "out").then(|| format!("window/{kind}{index}"))
}

/// The index of a forward window's input record (`window/in{index}`, [`window_record_name`]);
/// `None` for another name.
pub(crate) fn window_input_index(name: &str) -> Option<u32> {
    name.strip_prefix("window/in")?.parse().ok()
}

/// A record of an operator call, read from its name
/// (`op/0003/blocks.0.act/aten.gelu.default/out0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OperatorRecord<'a> {
    /// The call's part of the name (`op/0003/blocks.0.act/aten.gelu.default`).
    pub(crate) call: &'a str,
    /// The call's index in the window.
    pub(crate) index: u32,
    /// The module whose forward ran it.
    pub(crate) module: &'a str,
    /// The operator (`aten.gelu.default`).
    pub(crate) operator: &'a str,
    /// Whether the record is one of the call's inputs (else an output).
    pub(crate) input: bool,
    /// Whether it is an input that no traced operator or window input made (a parameter, a
    /// buffer, a tensor made before the window): a value from outside the window.
    pub(crate) from_outside: bool,
}

/// An operator call's record, by its name; `None` for another name. Precision alignment
/// (`super::align`) reads the data flow of an operator trace by it: a call's outputs follow its
/// inputs, as in msprobe's dumps.
pub(crate) fn operator_call(name: &str) -> Option<OperatorRecord<'_>> {
    let Some(Entry::Port {
        index,
        module,
        operator,
        port,
    }) = parse(name)
    else {
        return None;
    };
    Some(OperatorRecord {
        call: &name[..name.rfind('/')?],
        index,
        module,
        operator,
        input: matches!(port, Port::Input { .. }),
        from_outside: matches!(
            port,
            Port::Input {
                source: InputSource::Untraced,
                ..
            }
        ),
    })
}

/// The entry a record's name describes (`None`: not a name of the tracer's).
pub(crate) fn parse(name: &str) -> Option<Entry<'_>> {
    if name.starts_with("window/") {
        return Some(Entry::Window);
    }
    let rest = name.strip_prefix("op/")?;
    let (index, rest) = rest.split_once('/')?;
    let (rest, port) = rest.rsplit_once('/')?;
    let (module, operator) = rest.rsplit_once('/')?;
    let port = if let Some(output) = port.strip_prefix("out") {
        Port::Output(output.parse().ok()?)
    } else {
        let port = port.strip_prefix("in")?;
        let (index, source) = match port.split_once('<') {
            None => (port, InputSource::Untraced),
            Some((index, from)) => (index, parse_source(from)?),
        };
        Port::Input {
            index: index.parse().ok()?,
            source,
        }
    };
    Some(Entry::Port {
        index: index.parse().ok()?,
        module,
        operator,
        port,
    })
}

/// `op3.out0`, `in1`, `grad_out0`, `scalar`.
fn parse_source(from: &str) -> Option<InputSource> {
    if from == "scalar" {
        return Some(InputSource::Scalar);
    }
    if let Some(call) = from.strip_prefix("op") {
        let (call, output) = call.split_once(".out")?;
        return Some(InputSource::ChangedAfter {
            call: call.parse().ok()?,
            output: output.parse().ok()?,
        });
    }
    let (kind, index) = if let Some(i) = from.strip_prefix("grad_out") {
        ("grad_out", i)
    } else {
        ("in", from.strip_prefix("in")?)
    };
    Some(InputSource::WindowInput {
        kind: kind.to_owned(),
        index: index.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `batch_sizes` finding's cause in words: the row's position where samples before it
    /// in its batch were equal (with the threads, where known), the split of the work where
    /// the shapes are alike, the shape otherwise; one-sided operators and the other size's
    /// inputs are named.
    #[test]
    fn a_batch_variant_finding_names_the_position_the_split_or_the_shape() {
        let call = |inputs: &[&str]| OperatorCall {
            index: 13,
            operator: "aten.sdpa".into(),
            module: "h.1.attn".into(),
            inputs: inputs.iter().map(|s| (*s).to_owned()).collect(),
            output: 0,
            site: None,
        };
        let finding = |inputs: &[&str], other: &[&str], rows| {
            OperatorFinding::BatchVariant {
                window: "forward".into(),
                call: call(inputs),
                sizes: (1, 8),
                other_inputs: other.iter().map(|s| (*s).to_owned()).collect(),
                one_sided: vec!["`aten.where.self` at batch 1".into()],
                rows,
            }
            .to_string()
        };
        let rows = |before, threads| SampleRows {
            row: (0, 4),
            of: 8,
            before,
            threads,
        };
        let position = finding(&["8x32", "8x8"], &["8x32"], Some(rows(4, Some(2))));
        for words in [
            "only one size ran `aten.where.self` at batch 1",
            "its inputs at batch 8: 8x32:",
            "the 4 samples before it in the same batch at batch 8 gave equal records",
            "at row 4 of 8 there (row 0 at batch 1)",
            "where the CPU's 2 intra-op threads split the batch",
        ] {
            assert!(position.contains(words), "{words:?} in {position}");
        }
        let position = finding(&["8x32"], &["8x32"], Some(rows(1, None)));
        assert!(position.contains(": the sample before it in"), "{position}");
        assert!(
            position.contains("CPU threads or a kernel's tiles split"),
            "{position}"
        );
        // the first sample of its batch: no position evidence
        let split = finding(&["8x32"], &["8x32"], Some(rows(0, Some(2))));
        assert!(
            split.contains("not the shape but the split of the work"),
            "{split}"
        );
        let shape = finding(&["1x32"], &["8x32"], None);
        assert!(
            shape.contains("its arithmetic depends on the shape"),
            "{shape}"
        );
    }

    #[test]
    fn every_name_the_writer_makes_parses_back() {
        let sources = [
            InputSource::Untraced,
            InputSource::Scalar,
            InputSource::ChangedAfter {
                call: 10,
                output: 2,
            },
            InputSource::WindowInput {
                kind: "in".into(),
                index: 1,
            },
            InputSource::WindowInput {
                kind: "grad_out".into(),
                index: 0,
            },
        ];
        let mut ports: Vec<Port> = sources
            .into_iter()
            .map(|source| Port::Input { index: 3, source })
            .collect();
        ports.push(Port::Output(4));
        for port in ports {
            let name = operator_record_name(12, "a/b.c", "myns.op.default", &port);
            assert!(name.starts_with("op/0012/a/b.c/myns.op.default/"), "{name}");
            assert_eq!(
                parse(&name),
                Some(Entry::Port {
                    index: 12,
                    module: "a/b.c",
                    operator: "myns.op.default",
                    port
                }),
                "{name}"
            );
        }
        assert_eq!(
            window_record_name("grad_out", 2).as_deref(),
            Some("window/grad_out2")
        );
        assert_eq!(parse("window/in0"), Some(Entry::Window));
        assert_eq!(window_record_name("out", 0).as_deref(), Some("window/out0"));
        assert_eq!(window_record_name("grad", 0), None);
        assert_eq!(window_input_index("window/in3"), Some(3));
        assert_eq!(window_input_index("window/out3"), None);
        assert_eq!(
            operator_call("op/0012/a/b.c/myns.op.default/in3<op10.out2"),
            Some(OperatorRecord {
                call: "op/0012/a/b.c/myns.op.default",
                index: 12,
                module: "a/b.c",
                operator: "myns.op.default",
                input: true,
                from_outside: false
            })
        );
        assert_eq!(
            operator_call("op/0001/m/aten.gelu.default/out0").map(|r| (r.call, r.input)),
            Some(("op/0001/m/aten.gelu.default", false))
        );
        assert_eq!(operator_call("window/out0"), None);
        assert_eq!(operator_call("fwd/blocks.0.act"), None);
    }

    #[test]
    fn names_parse_with_slashes_in_modules_and_bad_ones_do_not() {
        assert_eq!(
            parse("op/0012/a/b.c/myns.op.default/in3<op10.out2"),
            Some(Entry::Port {
                index: 12,
                module: "a/b.c",
                operator: "myns.op.default",
                port: Port::Input {
                    index: 3,
                    source: InputSource::ChangedAfter {
                        call: 10,
                        output: 2
                    }
                }
            })
        );
        assert!(matches!(
            parse("op/1/m/f/in0<grad_out2"),
            Some(Entry::Port {
                port: Port::Input {
                    source: InputSource::WindowInput { index: 2, .. },
                    ..
                },
                ..
            })
        ));
        for bad in [
            "op/x/m/f/in0",
            "op/1/m/f/inx",
            "op/1/f/out0",
            "op/1/m/f/in0<foo",
            "x",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
