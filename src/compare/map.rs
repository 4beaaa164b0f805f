//! The divergence map: ranks × steps, each cell coloured by the first tensor that differs there.
//!
//! [`DivergenceMap`] is built by the compare engine (`compare --map`) or for a check from the
//! comparison that gave it its verdict (`check --report-dir`). Tensors are numbered in the order the engine finds
//! them (rank 0's steps first), so the colours are the same for the same traces.
//! Limits: more than 600 steps are grouped into columns (a group shows its earliest difference);
//! the legend names the first 12 tensors.

use crate::file::DumpError;
use crate::picture::{Anchor, Figure, BLACK, GREY, LIGHT_GREY, PALETTE, WHITE};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a cell of the map shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapCell {
    /// Neither side has records of this rank at this step.
    NoData,
    /// Every record matches.
    Identical,
    /// Only one side has this rank's records at this step.
    OneSide,
    /// The first differing tensor, as an index into [`DivergenceMap::tensors`].
    Diverged(usize),
}

/// Ranks × steps: where two traces differ, and which tensor differs first in each cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DivergenceMap {
    world_size: u32,
    steps: Vec<u64>,
    /// Row-major by step: `cells[step_index * world_size + rank]`, codes as in `dump::compare`.
    cells: Vec<u32>,
    tensors: Vec<String>,
}

const CELL_NO_DATA: u32 = super::cell_codes::NO_DATA;
const CELL_IDENTICAL: u32 = super::cell_codes::IDENTICAL;
const CELL_ONE_SIDE: u32 = super::cell_codes::ONE_SIDE;
const CELL_TENSOR: u32 = super::cell_codes::TENSOR;

impl DivergenceMap {
    pub(crate) fn new(
        world_size: u32,
        steps: Vec<u64>,
        cells: Vec<u32>,
        tensors: Vec<String>,
    ) -> Self {
        debug_assert_eq!(cells.len(), steps.len() * world_size as usize);
        DivergenceMap {
            world_size,
            steps,
            cells,
            tensors,
        }
    }

    /// The number of ranks (rows).
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The steps (columns), ascending.
    #[must_use]
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    /// The names of the tensors that differ first somewhere, in order of discovery.
    #[must_use]
    pub fn tensors(&self) -> &[String] {
        &self.tensors
    }

    /// The cell of `rank` at the `column`-th step.
    #[must_use]
    pub fn cell(&self, rank: u32, column: usize) -> MapCell {
        let code = self.cells[column * self.world_size as usize + rank as usize];
        match code {
            CELL_NO_DATA => MapCell::NoData,
            CELL_IDENTICAL => MapCell::Identical,
            CELL_ONE_SIDE => MapCell::OneSide,
            c => MapCell::Diverged((c - CELL_TENSOR) as usize),
        }
    }

    /// Draws the map: one row per rank, one column per step (steps are grouped when there are
    /// more than fit; a group shows its earliest difference), a legend of the tensors below.
    pub(crate) fn figure(&self, title: &str) -> Figure {
        const MAX_COLUMNS: usize = 600;
        const LEGEND_ROWS: usize = 12;
        let num_steps = self.steps.len().max(1);
        let group = num_steps.div_ceil(MAX_COLUMNS);
        let columns = num_steps.div_ceil(group);
        let cell_w = (720.0 / columns as f64).clamp(1.0, 48.0).floor();
        let cell_h = (360.0 / f64::from(self.world_size))
            .clamp(2.0, 28.0)
            .floor();
        let left = 70.0;
        let top = 48.0;
        let grid_w = cell_w * columns as f64;
        let grid_h = cell_h * f64::from(self.world_size);
        let legend: Vec<(String, crate::picture::Rgb)> = [
            ("identical".to_owned(), LIGHT_GREY),
            ("only in one trace".to_owned(), GREY),
        ]
        .into_iter()
        .chain(
            self.tensors
                .iter()
                .take(LEGEND_ROWS)
                .enumerate()
                .map(|(i, name)| (format!("first differs: {name}"), PALETTE[i % PALETTE.len()])),
        )
        .collect();
        let extra = self.tensors.len().saturating_sub(LEGEND_ROWS);
        let legend_h = 18.0 * (legend.len() + usize::from(extra > 0)) as f64;
        let longest = legend
            .iter()
            .map(|(t, _)| Figure::text_width(t))
            .fold(Figure::text_width(title), f64::max);
        // The title starts at `left`, the legend's labels 18 pixels further: the widest must
        // end inside the picture (a long scenario name was clipped at its edge).
        let width = (left + grid_w + 30.0)
            .max(left + 18.0 + longest + 12.0)
            .max(360.0);
        let height = top + grid_h + 44.0 + legend_h + 10.0;
        let mut f = Figure::new(width.ceil() as u32, height.ceil() as u32);
        f.text(left, 18.0, title, BLACK, Anchor::Start);
        f.text(
            left,
            36.0,
            "ranks (rows) x steps (columns)",
            GREY,
            Anchor::Start,
        );
        for rank in 0..self.world_size {
            let y = top + cell_h * f64::from(rank);
            for column in 0..columns {
                let first = column * group;
                let last = (first + group).min(self.steps.len());
                // The group's cell: its earliest difference, else identical if any data.
                let mut shown = MapCell::NoData;
                for c in first..last {
                    match self.cell(rank, c) {
                        MapCell::NoData => {}
                        MapCell::Identical => {
                            if shown == MapCell::NoData {
                                shown = MapCell::Identical;
                            }
                        }
                        other => {
                            shown = other;
                            break;
                        }
                    }
                }
                let color = match shown {
                    MapCell::NoData => WHITE,
                    MapCell::Identical => LIGHT_GREY,
                    MapCell::OneSide => GREY,
                    MapCell::Diverged(i) => PALETTE[i % PALETTE.len()],
                };
                // A one-pixel white gap between cells large enough to show it.
                let gap = if cell_w >= 6.0 && cell_h >= 6.0 {
                    1.0
                } else {
                    0.0
                };
                f.rect(
                    left + cell_w * column as f64,
                    y,
                    cell_w - gap,
                    cell_h - gap,
                    color,
                );
            }
            let every = (12.0 / cell_h).ceil().max(1.0) as u32;
            if rank % every == 0 {
                f.text(
                    left - 6.0,
                    y + cell_h / 2.0 + 4.0,
                    &format!("rank {rank}"),
                    BLACK,
                    Anchor::End,
                );
            }
        }
        f.frame(left, top, grid_w, grid_h, BLACK);
        // Step labels: the first, the last, and a few between, never overlapping.
        let label_every = ((44.0 / cell_w).ceil() as usize).max(1);
        for column in (0..columns).step_by(label_every) {
            if let Some(step) = self.steps.get(column * group) {
                let x = left + cell_w * (column as f64 + 0.5);
                f.line(vec![(x, top + grid_h), (x, top + grid_h + 4.0)], BLACK, 1.0);
                f.text(
                    x,
                    top + grid_h + 16.0,
                    &step.to_string(),
                    BLACK,
                    Anchor::Middle,
                );
            }
        }
        f.text(
            left + grid_w / 2.0,
            top + grid_h + 32.0,
            if group > 1 { "step (grouped)" } else { "step" },
            GREY,
            Anchor::Middle,
        );
        let mut y = top + grid_h + 44.0;
        for (label, color) in &legend {
            f.rect(left, y, 12.0, 12.0, *color);
            f.frame(left, y, 12.0, 12.0, GREY);
            f.text(left + 18.0, y + 10.0, label, BLACK, Anchor::Start);
            y += 18.0;
        }
        if extra > 0 {
            f.text(
                left + 18.0,
                y + 10.0,
                &format!("... and {extra} more tensors"),
                GREY,
                Anchor::Start,
            );
        }
        f
    }

    /// Writes the map as a PNG to `path`, atomically.
    ///
    /// # Errors
    /// [`DumpError::Io`] when the file cannot be written.
    pub fn write_png(&self, path: &Path, title: &str) -> Result<(), DumpError> {
        self.figure(title).write_png(path)
    }

    /// The map as SVG text (the same drawing as [`DivergenceMap::write_png`]'s), to embed in a
    /// page; every name in it is escaped. The same map and title give the same bytes.
    #[must_use]
    pub fn to_svg(&self, title: &str) -> String {
        self.figure(title).to_svg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{compare_traces, TraceView};
    use crate::record::Trace;
    use crate::record::{RecordLevel, Recorder};
    use crate::value::tensor::Tensor;

    #[test]
    fn a_long_title_and_legend_fit_inside_the_picture() {
        let name = "transformer.h.0.attn.c_attn.weight_of_a_deeply_nested_module";
        let run = |v: f32| {
            let mut rec = Recorder::new(0, RecordLevel::Stats);
            rec.record(0, name, &Tensor::scalar(v));
            Trace {
                ranks: vec![rec.finish()],
            }
        };
        let map = compare_traces(&run(1.0), &run(2.0), TraceView::All)
            .map
            .unwrap();
        assert_eq!(map.tensors(), [name]);
        let title = "main_of_a_long_scenario_name: repeat check, first divergent tensor";
        assert!(
            map.figure(title).texts_fit(),
            "a text runs past the right edge"
        );
    }

    #[test]
    fn the_replicas_map_shows_the_rank_that_disagrees_with_rank_zero() {
        let ranks = (0..3u32)
            .map(|r| {
                let mut rec = Recorder::new(r, RecordLevel::Stats);
                for step in 0..2 {
                    rec.record(step, "local", &Tensor::scalar(r as f32));
                    let w = if r == 2 && step == 1 { 9.0f32 } else { 1.0 };
                    rec.record_replicated(step, "w", &Tensor::scalar(w));
                }
                rec.finish()
            })
            .collect();
        let trace = Trace { ranks };
        let map = compare_traces(&trace, &trace, TraceView::Replicas)
            .map
            .unwrap();
        assert_eq!(map.steps(), [0, 1]);
        assert_eq!(map.cell(2, 1), MapCell::Diverged(0));
        assert_eq!(map.cell(2, 0), MapCell::Identical);
        assert_eq!(
            map.cell(1, 1),
            MapCell::Identical,
            "local records are not replicas"
        );
        assert_eq!(map.tensors(), ["w"]);
        let png = map.figure("t").to_png();
        assert_eq!(png, map.figure("t").to_png());
    }
}
