//! Datasets: sample `i` as a pure function of `i`.
//!
//! [`Dataset`] is what a loader reads: a length, the shape of one sample, and `get(i)`. The two
//! synthetic datasets draw sample `i` from the shared `data` stream at coordinate `i`
//! (`derive_stream(seed, Stream::Data, SHARED_RANK, i)`), so any sample can be built alone, by any
//! thread, in any order: [`SyntheticVectors`] (normal features labelled by a random linear teacher,
//! exactly the `train` kind's data) and [`SyntheticImages`] (uniform `[C, H, W]` pixels).
//!
//! Determinism: `get` must be a pure function of the index and the dataset's construction; the
//! loader relies on it to give the same batches whichever worker loads a sample.
//!
//! Limits: values are `f32` and labels `i64`; nothing is read from disk.

use super::SHARED_RANK;
use crate::value::seed::{derive_stream, Stream};

/// Stream number of the teacher that labels [`SyntheticVectors`]: the `train` kind's teacher
/// (ASCII `teacher\0`), so both draw the same labels.
const TEACHER_STREAM: u64 = 0x7465_6163_6865_7200;

/// One sample: its values (row-major, shape [`Dataset::sample_shape`]) and its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The values, row-major.
    pub values: Vec<f32>,
    /// The class label.
    pub label: i64,
}

/// A random-access dataset of fixed-shape samples, readable from several threads at once.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> u64;

    /// `true` when the dataset has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shape of one sample's values.
    fn sample_shape(&self) -> &[usize];

    /// Sample `index` (< len). Must be a pure function of the index and the dataset's construction.
    fn get(&self, index: u64) -> Sample;
}

/// Panics with a clear message when `index` is out of range (a caller's bug, like a slice index).
fn check_index(index: u64, len: u64) {
    assert!(
        index < len,
        "sample {index} is out of range: the dataset holds {len} samples"
    );
}

/// Normal feature vectors labelled by a random linear teacher: the `train` kind's dataset.
///
/// Sample `i`: `dim` normals from the shared `data` stream at `i`; its label is the class whose
/// teacher row has the largest dot product with them (the first one on ties).
#[derive(Debug, Clone)]
pub struct SyntheticVectors {
    seed: u64,
    len: u64,
    shape: [usize; 1],
    classes: usize,
    /// `classes` rows of `dim` weights.
    teacher: Vec<f32>,
}

impl SyntheticVectors {
    /// `len` samples of `dim` features in `classes` classes, all drawn from `seed`.
    #[must_use]
    pub fn new(seed: u64, len: u64, dim: usize, classes: usize) -> Self {
        let mut rng = derive_stream(seed, Stream::User(TEACHER_STREAM), SHARED_RANK, 0);
        SyntheticVectors {
            seed,
            len,
            shape: [dim],
            classes,
            teacher: (0..classes * dim).map(|_| rng.normal_f32()).collect(),
        }
    }
}

/// The dot product in index order (the `train` kind's order, which fixes the labels' bits).
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0, |acc, (x, y)| acc + x * y)
}

impl Dataset for SyntheticVectors {
    fn len(&self) -> u64 {
        self.len
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn get(&self, index: u64) -> Sample {
        check_index(index, self.len);
        let dim = self.shape[0];
        let mut rng = derive_stream(self.seed, Stream::Data, SHARED_RANK, index);
        let values: Vec<f32> = (0..dim).map(|_| rng.normal_f32()).collect();
        let mut label = 0;
        let mut best = f32::NEG_INFINITY;
        for class in 0..self.classes {
            let score = dot(&self.teacher[class * dim..(class + 1) * dim], &values);
            if score > best {
                best = score;
                label = class;
            }
        }
        Sample {
            values,
            label: label as i64,
        }
    }
}

/// Uniform `[C, H, W]` images with uniform labels: what the loader benchmark loads.
///
/// Sample `i`: `C·H·W` pixels in `[0, 1)` from the shared `data` stream at `i`, then its label
/// (`below(classes)`) from the same stream.
#[derive(Debug, Clone)]
pub struct SyntheticImages {
    seed: u64,
    len: u64,
    shape: [usize; 3],
    classes: usize,
}

impl SyntheticImages {
    /// `len` images of `channels × height × width` pixels in `classes` classes, drawn from `seed`.
    ///
    /// # Panics
    /// Panics if `classes` is zero (no label can be drawn).
    #[must_use]
    pub fn new(
        seed: u64,
        len: u64,
        channels: usize,
        height: usize,
        width: usize,
        classes: usize,
    ) -> Self {
        assert!(classes > 0, "SyntheticImages needs at least one class");
        SyntheticImages {
            seed,
            len,
            shape: [channels, height, width],
            classes,
        }
    }
}

impl Dataset for SyntheticImages {
    fn len(&self) -> u64 {
        self.len
    }

    fn sample_shape(&self) -> &[usize] {
        &self.shape
    }

    fn get(&self, index: u64) -> Sample {
        check_index(index, self.len);
        let mut rng = derive_stream(self.seed, Stream::Data, SHARED_RANK, index);
        let values: Vec<f32> = (0..self.shape.iter().product::<usize>())
            .map(|_| rng.uniform_f32())
            .collect();
        let label = rng.below(self.classes as u64) as i64;
        Sample { values, label }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of the `train` kind's dataset as it was written in `scenario/builtin/train.rs`
    /// (`Dataset::new` and `Dataset::sample`, with `ctx.shared_stream` spelled out).
    fn train_kind_sample(seed: u64, d: usize, c: usize, index: u64) -> (Vec<f32>, usize) {
        let mut rng = derive_stream(seed, Stream::User(0x7465_6163_6865_7200), u64::MAX, 0);
        let teacher: Vec<f32> = (0..c * d).map(|_| rng.normal_f32()).collect();
        let mut rng = derive_stream(seed, Stream::Data, u64::MAX, index);
        let x: Vec<f32> = (0..d).map(|_| rng.normal_f32()).collect();
        let mut label = 0;
        let mut best = f32::NEG_INFINITY;
        for class in 0..c {
            let a = &teacher[class * d..(class + 1) * d];
            let score = a.iter().zip(&x).fold(0.0, |acc, (x, y)| acc + x * y);
            if score > best {
                best = score;
                label = class;
            }
        }
        (x, label)
    }

    #[test]
    fn synthetic_vectors_are_the_train_kinds_samples() {
        for (seed, d, c) in [(7, 64, 10), (1, 3, 2), (99, 16, 1)] {
            let dataset = SyntheticVectors::new(seed, 50, d, c);
            assert_eq!(dataset.sample_shape(), [d]);
            for index in 0..50 {
                let sample = dataset.get(index);
                let (x, label) = train_kind_sample(seed, d, c, index);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&sample.values), bits(&x), "seed {seed} sample {index}");
                assert_eq!(sample.label, label as i64, "seed {seed} sample {index}");
            }
        }
    }

    #[test]
    fn synthetic_vectors_use_every_class() {
        let dataset = SyntheticVectors::new(3, 400, 8, 4);
        let mut seen = [false; 4];
        for index in 0..dataset.len() {
            seen[dataset.get(index).label as usize] = true;
        }
        assert_eq!(seen, [true; 4]);
    }

    #[test]
    fn synthetic_images_draw_pixels_then_label_from_the_data_stream() {
        let dataset = SyntheticImages::new(5, 20, 3, 4, 2, 10);
        assert_eq!(dataset.sample_shape(), [3, 4, 2]);
        assert_eq!(dataset.len(), 20);
        assert!(!dataset.is_empty());
        let sample = dataset.get(11);
        let mut rng = derive_stream(5, Stream::Data, u64::MAX, 11);
        let pixels: Vec<f32> = (0..24).map(|_| rng.uniform_f32()).collect();
        assert_eq!(sample.values, pixels);
        assert_eq!(sample.label, rng.below(10) as i64);
        assert!(sample.values.iter().all(|v| (0.0..1.0).contains(v)));
        // A pure function of the index: again, and independently of other samples.
        assert_eq!(dataset.get(11), sample);
        assert_ne!(dataset.get(12), sample);
    }

    #[test]
    #[should_panic(expected = "sample 20 is out of range")]
    fn an_index_past_the_end_panics_with_the_index() {
        let _ = SyntheticImages::new(5, 20, 1, 2, 2, 3).get(20);
    }
}
