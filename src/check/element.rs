//! The first differing element of a check's divergence: the two runs are run again, each
//! capturing only the divergent record's tensor (`crate::file::capture`), and the captured
//! tensors are compared element by element.
//!
//! A check's traces hold digests and statistics, not tensors; recording every tensor of every
//! step to name one element would cost what a full dump costs. A re-run costs one run per side
//! and keeps one tensor. It is only trusted when it reproduces: each captured tensor's md5 must
//! equal the digest its side recorded in the check. When it does not, the finding says so
//! plainly (the divergence itself depends on timing) and names no element.
//!
//! Determinism: a re-run is the same request as the run it repeats (same spec, perturbation and
//! plan), with a capture added; what it captures is a function of the program.

use crate::compare::{Divergence, ElementFinding, NoElementDetail};
use crate::file::capture::read_capture;
use crate::file::Capture;
use crate::record::Trace;
use crate::run::RunError;
use crate::value::digest::Md5Digest;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs one side of a comparison again with a capture (the folder the captured tensor goes to).
pub(crate) type Rerun<'a> = Box<dyn Fn(&Capture, &Path) -> Result<Trace, RunError> + 'a>;

/// One side of a check's comparison: how to run it again, and which rank's record it is.
pub(crate) struct Side<'a> {
    /// Runs the side again.
    pub(crate) rerun: Rerun<'a>,
    /// The rank whose record this side is (the divergence's rank, or rank 0 for the left side
    /// of `replicas` and both sides of `world_sizes`).
    pub(crate) rank: u32,
    /// The side's name in reports (`run 1`, `threads`...).
    pub(crate) label: &'static str,
}

/// A folder for one capture, removed when dropped.
struct CaptureFolder(PathBuf);

impl CaptureFolder {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("detcheck-capture-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        CaptureFolder(dir)
    }
}

impl Drop for CaptureFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Which record of its name in its step the divergence's left record is (the engine pairs the
/// k-th record of a name on one side with the k-th on the other).
fn occurrence(trace: &Trace, rank: u32, d: &Divergence) -> u32 {
    trace.ranks.get(rank as usize).map_or(0, |r| {
        r.records
            .iter()
            .filter(|rec| rec.step == d.step && rec.name == d.name && rec.seq < d.seq)
            .count() as u32
    })
}

/// Runs both sides again capturing the divergent record, and compares what they captured.
/// `left_trace` is the left side's trace from the check (it numbers the occurrence).
pub(crate) fn find(
    d: &Divergence,
    left_trace: &Trace,
    left: &Side<'_>,
    right: &Side<'_>,
) -> ElementFinding {
    let k = occurrence(left_trace, left.rank, d);
    let mut tensors = Vec::with_capacity(2);
    for (side, recorded) in [(left, &d.left), (right, &d.right)] {
        let Some(recorded) = recorded.as_ref().and_then(|r| r.digest.clone()) else {
            return ElementFinding::Unavailable(NoElementDetail::NotCaptured {
                reason: format!("{} has no record there", side.label),
            });
        };
        let folder = CaptureFolder::new();
        let capture = Capture {
            rank: side.rank,
            step: d.step,
            name: d.name.clone(),
            occurrence: k,
        };
        let captured = (side.rerun)(&capture, &folder.0)
            .map_err(|e| format!("the re-run of {} failed: {e}", side.label))
            .and_then(|_| read_capture(&folder.0, side.rank).map_err(|e| e.to_string()));
        let tensor = match captured {
            Ok(Some(t)) => t,
            Ok(None) => {
                return ElementFinding::Unavailable(NoElementDetail::NotCaptured {
                    reason: format!(
                        "the re-run of {} wrote no capture of the record (it did not record it \
                         again, or its writer predates captures)",
                        side.label
                    ),
                })
            }
            Err(reason) => {
                return ElementFinding::Unavailable(NoElementDetail::NotCaptured { reason })
            }
        };
        if Md5Digest::of_tensor(&tensor).to_string() != recorded {
            return ElementFinding::Unavailable(NoElementDetail::NotReproduced {
                side: side.label.to_owned(),
            });
        }
        tensors.push(tensor);
    }
    ElementFinding::between(&tensors[0], &tensors[1]).unwrap_or_else(|| {
        ElementFinding::Unavailable(NoElementDetail::NotCaptured {
            reason: "the captured tensors are bit for bit equal".to_owned(),
        })
    })
}

#[cfg(test)]
mod tests {
    use crate::check::run_checks;
    use crate::compare::{ElementFinding, NoElementDetail};
    use crate::run::CheckOptions;
    use crate::scenario::KindRegistry;

    fn control(file: &str) -> crate::check::ScenarioReport {
        let path = format!("{}/scenarios/{file}.json", env!("CARGO_MANIFEST_DIR"));
        let scenario = KindRegistry::builtin()
            .load_file(std::path::Path::new(&path))
            .unwrap();
        run_checks(&scenario, &CheckOptions::default()).unwrap()
    }

    /// The arrival-order control's divergence is reproducible under the same perturbations:
    /// the element is named, with both values' bits and their ULP distance.
    #[test]
    fn the_arrival_order_control_names_its_first_element() {
        let report = control("control_arrival_order_3ranks");
        let d = report.outcomes[0].comparison.first.clone().unwrap();
        let Some(ElementFinding::Found(e)) = d.element else {
            panic!("no element: {:?}", d.element);
        };
        assert_eq!(e.index.len(), 1);
        assert!(e.ulps.is_some_and(|u| u >= 1), "{e:?}");
        assert_ne!(e.left_bits, e.right_bits);
        assert!(e.num_differing >= 1 && e.num_differing <= e.num_elements);
        assert!(report
            .explain_caught()
            .contains("first differing element: ["));
    }

    /// OS entropy changes every run: the re-run does not reproduce run 1, and the finding says
    /// so instead of naming an element.
    #[test]
    fn an_irreproducible_divergence_names_no_element() {
        let report = control("control_os_entropy_init");
        let d = report.outcomes[0].comparison.first.clone().unwrap();
        assert!(
            matches!(
                d.element,
                Some(ElementFinding::Unavailable(
                    NoElementDetail::NotReproduced { .. }
                ))
            ),
            "{:?}",
            d.element
        );
    }

    /// The sides of `world_sizes` (resized runs) and of `restart` (a stopped launch, then the
    /// resumed one) are re-run too.
    #[test]
    fn world_sizes_and_restart_controls_name_their_elements() {
        for file in [
            "control_rank_ordered_world_sizes",
            "control_resume_without_rng_state",
        ] {
            let report = control(file);
            let d = report.outcomes[0].comparison.first.clone().unwrap();
            assert!(
                matches!(d.element, Some(ElementFinding::Found(_))),
                "{file}: {:?}",
                d.element
            );
        }
    }

    #[test]
    fn element_detail_can_be_switched_off() {
        let path = format!(
            "{}/scenarios/control_arrival_order_3ranks.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let scenario = KindRegistry::builtin()
            .load_file(std::path::Path::new(&path))
            .unwrap();
        let options = CheckOptions {
            element_detail: false,
            ..CheckOptions::default()
        };
        let report = run_checks(&scenario, &options).unwrap();
        assert_eq!(
            report.outcomes[0]
                .comparison
                .first
                .as_ref()
                .unwrap()
                .element,
            None
        );
    }
}
