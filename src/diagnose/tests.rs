//! Diagnosis end to end, through the checks that ask for it: a control's element named by
//! the re-runs (`element`), for `repeat`, `world_sizes` and `restart`. A test file: it may use
//! any layer (tests/tidy.rs), here `check` to run the controls.

use crate::check::run_checks;
use crate::compare::ElementFinding;
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

/// OS entropy changes every run: the re-runs do not reproduce runs 1 and 2, but differ
/// from each other, and the element between them is named as such.
#[test]
fn an_irreproducible_divergence_names_the_element_between_the_reruns() {
    let report = control("control_os_entropy_init");
    let d = report.outcomes[0].comparison.first.clone().unwrap();
    let Some(ElementFinding::FoundInReruns(e)) = &d.element else {
        panic!("{:?}", d.element);
    };
    assert_ne!(e.left_bits, e.right_bits);
    let text = report.explain_caught();
    assert!(
        text.contains("(between the two re-runs: they did not reproduce"),
        "{text}"
    );
    assert!(text.contains("re-run of run 1 "), "{text}");
    assert_eq!(d.operator, None, "built-in kinds trace no operators");
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
