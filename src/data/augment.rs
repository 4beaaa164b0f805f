//! Per-sample data augmentation: random crop, horizontal flip and Gaussian noise.
//!
//! An [`Augmenter`] applies an [`Augmentation`] to one [`Sample`] of an epoch. Its random draws
//! come from an [`AugmentRng`]: [`AugmentRng::PerSample`] derives a fresh stream for every
//! (sample, epoch), `derive_stream(seed, Stream::Augment, index, epoch)`, so the bits of an
//! augmented sample are the same whichever worker augments it and whenever.
//! [`AugmentRng::Shared`] is the planted fault loaders commonly have: one generator for all
//! workers, consumed in the order in which they happen to get to it.
//!
//! Draw order per sample (fixed: changing it changes every augmented bit): the crop offsets `dy`
//! then `dx` (each `below(2p + 1)`, only if `crop_padding` p > 0), the flip decision
//! (`bernoulli(0.5)`, only if `flip`), then one normal per value in row-major order of the
//! cropped and flipped sample (only if `noise_std` > 0), added as `noise_std · normal_f32()`.
//! With nothing enabled nothing is drawn.
//!
//! Crop: the `H × W` plane of each channel is padded with `p` zeros on every side and the
//! `H × W` window at `(dy, dx)` is kept (`dy = dx = p` is the identity). Flip mirrors each row.
//!
//! Limits: crop and flip need `[C, H, W]` samples; the same offsets and flip apply to every
//! channel; no colour or scale augmentation.

use super::{DataError, Sample};
use crate::value::seed::{derive_stream, RankRng, Stream};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, PoisonError};

/// Random crop (zero padding), horizontal flip and Gaussian noise; all off by default.
///
/// In a scenario file it is an object (`{"flip": true, "noise_std": 0.1}`), and only an object:
/// scenario files are read strictly (`file::strict`), which refuses an array of the fields
/// in order (`"augment": [1]` is not a crop of 1).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case", deny_unknown_fields)]
pub struct Augmentation {
    /// Zeros added on each side before a random `H × W` window is cut (0: no crop).
    pub crop_padding: usize,
    /// Mirror each row with probability 1/2.
    pub flip: bool,
    /// Standard deviation of the noise added to every value (0: no noise).
    pub noise_std: f32,
}

impl Augmentation {
    /// `true` when some augmentation is on (and so something is drawn).
    fn is_enabled(&self) -> bool {
        self.crop_padding > 0 || self.flip || self.noise_std > 0.0
    }
}

/// Where augmentation draws come from.
#[derive(Debug, Clone)]
pub enum AugmentRng {
    /// Sample `index` of `epoch` draws from `derive_stream(seed, Stream::Augment, index, epoch)`:
    /// bits independent of workers and timing.
    PerSample {
        /// The run's augmentation seed.
        seed: u64,
    },
    /// A planted fault (negative control): one generator shared by all workers, locked per
    /// sample, consumed in timing order.
    Shared(Arc<Mutex<RankRng>>),
}

/// Applies an [`Augmentation`] to samples of one shape, drawing from an [`AugmentRng`].
#[derive(Debug, Clone)]
pub struct Augmenter {
    augmentation: Augmentation,
    rng: AugmentRng,
    /// The shape the augmenter was built for (empty for [`Augmenter::none`]).
    sample_shape: Vec<usize>,
}

/// One sample's random draws, taken in the documented order before any value changes.
struct Draws {
    /// Crop window offsets (dy, dx), when cropping.
    offset: Option<(usize, usize)>,
    flip: bool,
    /// One normal per value, when adding noise.
    noise: Vec<f32>,
}

impl Augmenter {
    /// An augmenter of samples of `sample_shape`.
    ///
    /// # Errors
    /// [`DataError::Invalid`]: crop or flip on a sample shape that is not `[C, H, W]` (naming
    /// `augment.crop_padding` or `augment.flip`); a `noise_std` that is negative or not finite
    /// (naming `augment.noise_std`).
    pub fn new(
        augmentation: Augmentation,
        rng: AugmentRng,
        sample_shape: &[usize],
    ) -> Result<Self, DataError> {
        let needs_image = |field: &str| {
            DataError::invalid(
                field,
                format!("needs [C, H, W] samples, but samples have shape {sample_shape:?}"),
            )
        };
        if augmentation.crop_padding > 0 && sample_shape.len() != 3 {
            return Err(needs_image("augment.crop_padding"));
        }
        if augmentation.flip && sample_shape.len() != 3 {
            return Err(needs_image("augment.flip"));
        }
        // A padding beyond the image crops only zeros, and its offsets would overflow.
        let side = sample_shape.iter().skip(1).copied().max().unwrap_or(0);
        if augmentation.crop_padding > side {
            return Err(DataError::invalid(
                "augment.crop_padding",
                format!(
                    "must be at most the image's larger side ({side}), got {}",
                    augmentation.crop_padding
                ),
            ));
        }
        let noise = augmentation.noise_std;
        if !(noise.is_finite() && noise >= 0.0) {
            return Err(DataError::invalid(
                "augment.noise_std",
                format!("must be a finite number >= 0, got {noise}"),
            ));
        }
        Ok(Augmenter {
            augmentation,
            rng,
            sample_shape: sample_shape.to_vec(),
        })
    }

    /// No augmentation at all.
    #[must_use]
    pub fn none() -> Self {
        Augmenter {
            augmentation: Augmentation::default(),
            rng: AugmentRng::PerSample { seed: 0 },
            sample_shape: Vec::new(),
        }
    }

    /// Augments `sample`, which is sample `index` of the dataset, in `epoch`.
    ///
    /// # Panics
    /// Panics if the sample does not hold as many values as the shape the augmenter was built
    /// for (a loader checks shapes before it starts).
    pub fn apply(&self, sample: &mut Sample, epoch: u64, index: u64) {
        if !self.augmentation.is_enabled() {
            return;
        }
        let len: usize = self.sample_shape.iter().product();
        assert_eq!(
            sample.values.len(),
            len,
            "sample {index} holds {} values, but the augmenter was built for shape {:?}",
            sample.values.len(),
            self.sample_shape
        );
        let draws = match &self.rng {
            AugmentRng::PerSample { seed } => self.draw(
                &mut derive_stream(*seed, Stream::Augment, index, epoch),
                len,
            ),
            // The lock is held for all of one sample's draws, so samples never interleave draws;
            // which sample gets which draws is still the order in which workers get here.
            AugmentRng::Shared(shared) => {
                let mut rng = shared.lock().unwrap_or_else(PoisonError::into_inner);
                self.draw(&mut rng, len)
            }
        };
        if let Some((dy, dx)) = draws.offset {
            let image = self.image_shape();
            sample.values = crop(
                &sample.values,
                image,
                self.augmentation.crop_padding,
                dy,
                dx,
            );
        }
        if draws.flip {
            flip_rows(&mut sample.values, self.image_shape()[2]);
        }
        let std = self.augmentation.noise_std;
        for (value, z) in sample.values.iter_mut().zip(&draws.noise) {
            *value += std * z;
        }
    }

    /// `Ok` when this augmenter can augment samples of `shape` (anything, when it does nothing).
    pub(crate) fn check_shape(&self, shape: &[usize]) -> Result<(), DataError> {
        if self.augmentation.is_enabled() && shape != self.sample_shape.as_slice() {
            return Err(DataError::invalid(
                "augment",
                format!(
                    "the augmenter was built for samples of shape {:?}, but the dataset's \
                     have shape {shape:?}",
                    self.sample_shape
                ),
            ));
        }
        Ok(())
    }

    /// `[C, H, W]`; only called when crop or flip is on, which `new` allows only for such shapes.
    fn image_shape(&self) -> [usize; 3] {
        let s = &self.sample_shape;
        [s[0], s[1], s[2]]
    }

    /// Draws one sample's randomness from `rng`, in the documented order.
    fn draw(&self, rng: &mut RankRng, len: usize) -> Draws {
        let a = &self.augmentation;
        let offset = (a.crop_padding > 0).then(|| {
            let choices = 2 * a.crop_padding as u64 + 1;
            let dy = rng.below(choices) as usize;
            let dx = rng.below(choices) as usize;
            (dy, dx)
        });
        let flip = a.flip && rng.bernoulli(0.5);
        let noise = if a.noise_std > 0.0 {
            (0..len).map(|_| rng.normal_f32()).collect()
        } else {
            Vec::new()
        };
        Draws {
            offset,
            flip,
            noise,
        }
    }
}

/// The `H × W` window at `(dy, dx)` of each channel padded by `padding` zeros on every side.
fn crop(
    values: &[f32],
    [channels, height, width]: [usize; 3],
    padding: usize,
    dy: usize,
    dx: usize,
) -> Vec<f32> {
    let mut out = vec![0.0; values.len()];
    // Output column x reads source column x + dx - padding; these x have a source column.
    let x_lo = padding.saturating_sub(dx).min(width);
    let x_hi = (width + padding).saturating_sub(dx).min(width);
    if x_lo >= x_hi {
        return out;
    }
    let (src_lo, src_hi) = (x_lo + dx - padding, x_hi + dx - padding);
    for channel in 0..channels {
        for y in 0..height {
            let Some(source_y) = (y + dy).checked_sub(padding).filter(|&sy| sy < height) else {
                continue;
            };
            let src = (channel * height + source_y) * width;
            let dst = (channel * height + y) * width;
            out[dst + x_lo..dst + x_hi].copy_from_slice(&values[src + src_lo..src + src_hi]);
        }
    }
    out
}

/// Mirrors every row of `width` values.
fn flip_rows(values: &mut [f32], width: usize) {
    if width == 0 {
        return;
    }
    for row in values.chunks_exact_mut(width) {
        row.reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Dataset, SyntheticImages, SyntheticVectors};

    const SHAPE: [usize; 3] = [3, 6, 5];

    fn image(index: u64) -> Sample {
        SyntheticImages::new(9, 100, SHAPE[0], SHAPE[1], SHAPE[2], 4).get(index)
    }

    #[test]
    fn an_augmentation_is_read_from_an_object_only() {
        // As scenario files are read.
        let read = |text: &str| {
            crate::file::strict::from_slice::<Augmentation>(text.as_bytes())
                .map_err(|e| e.into_inner())
        };
        assert_eq!(
            read(r#"{"crop_padding": 1, "noise_std": 0.5}"#).unwrap(),
            Augmentation {
                crop_padding: 1,
                flip: false,
                noise_std: 0.5
            }
        );
        assert_eq!(read("{}").unwrap(), Augmentation::default());
        // serde's derive would read an array as the fields in order: `[1]` as a crop of 1.
        for wrong in ["[1]", "[0, true, 0.5]", "[]"] {
            let error = read(wrong).unwrap_err().to_string();
            assert!(error.starts_with("expected an object"), "{wrong}: {error}");
        }
        for wrong in ["1", "true", "null", "\"flip\""] {
            let error = read(wrong).unwrap_err().to_string();
            assert!(error.starts_with("invalid type"), "{wrong}: {error}");
        }
        assert!(read(r#"{"rotate": 1}"#).is_err());
    }

    fn augmenter(augmentation: Augmentation) -> Augmenter {
        Augmenter::new(augmentation, AugmentRng::PerSample { seed: 17 }, &SHAPE).unwrap()
    }

    fn all() -> Augmentation {
        Augmentation {
            crop_padding: 2,
            flip: true,
            noise_std: 0.1,
        }
    }

    fn bits(values: &[f32]) -> Vec<u32> {
        values.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn crop_at_the_centre_is_the_identity_and_elsewhere_a_shift_with_zeros() {
        let source = image(0).values;
        for padding in [0, 1, 2, 7] {
            assert_eq!(crop(&source, SHAPE, padding, padding, padding), source);
        }
        // (0, 0): the window starts in the padding, so content moves down-right by 2.
        let shifted = crop(&source, SHAPE, 2, 0, 0);
        let [c, h, w] = SHAPE;
        for ch in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let got = shifted[(ch * h + y) * w + x];
                    let want = if y < 2 || x < 2 {
                        0.0
                    } else {
                        source[(ch * h + y - 2) * w + x - 2]
                    };
                    assert_eq!(got, want, "channel {ch} at ({y}, {x})");
                }
            }
        }
        // Padding larger than the image, window entirely in the padding: all zeros.
        assert!(crop(&source, SHAPE, 7, 0, 14).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn flip_mirrors_rows_and_twice_is_the_identity() {
        let source = image(1).values;
        let mut flipped = source.clone();
        flip_rows(&mut flipped, SHAPE[2]);
        assert_ne!(flipped, source);
        assert_eq!(flipped[0], source[SHAPE[2] - 1]);
        assert_eq!(flipped[SHAPE[2]], source[2 * SHAPE[2] - 1]);
        flip_rows(&mut flipped, SHAPE[2]);
        assert_eq!(flipped, source);
    }

    /// Every crop-and-flip output is one of the (2p+1)² windows, mirrored or not, of its input.
    #[test]
    fn crop_and_flip_give_a_mirrored_or_plain_window_of_the_input() {
        let a = augmenter(Augmentation {
            crop_padding: 2,
            flip: true,
            noise_std: 0.0,
        });
        let (mut flips, mut offsets) = (0, std::collections::BTreeSet::new());
        for index in 0..60 {
            let source = image(index);
            let mut sample = source.clone();
            a.apply(&mut sample, 3, index);
            assert_eq!(sample.label, source.label, "augmentation keeps the label");
            let found = (0..5)
                .flat_map(|dy| (0..5).map(move |dx| (dy, dx)))
                .flat_map(|(dy, dx)| [(dy, dx, false), (dy, dx, true)])
                .find(|&(dy, dx, flip)| {
                    let mut want = crop(&source.values, SHAPE, 2, dy, dx);
                    if flip {
                        flip_rows(&mut want, SHAPE[2]);
                    }
                    want == sample.values
                });
            let (dy, dx, flip) = found.expect("the output is a window of the input");
            flips += usize::from(flip);
            offsets.insert((dy, dx));
        }
        assert!((10..=50).contains(&flips), "{flips} flips in 60");
        assert!(offsets.len() > 10, "offsets vary: {offsets:?}");
    }

    /// Pins the documented draw order: dy, dx, flip, then one normal per value.
    #[test]
    fn draws_follow_the_documented_order() {
        let (epoch, index) = (4, 33);
        let source = image(index);
        let mut sample = source.clone();
        augmenter(all()).apply(&mut sample, epoch, index);

        let mut rng = derive_stream(17, Stream::Augment, index, epoch);
        let dy = rng.below(5) as usize;
        let dx = rng.below(5) as usize;
        let mut want = crop(&source.values, SHAPE, 2, dy, dx);
        if rng.bernoulli(0.5) {
            flip_rows(&mut want, SHAPE[2]);
        }
        for v in &mut want {
            *v += 0.1 * rng.normal_f32();
        }
        assert_eq!(bits(&sample.values), bits(&want));
    }

    #[test]
    fn per_sample_draws_depend_on_sample_and_epoch_only() {
        let a = augmenter(all());
        let augmented = |epoch, index| {
            let mut s = image(index);
            a.apply(&mut s, epoch, index);
            bits(&s.values)
        };
        assert_eq!(augmented(2, 5), augmented(2, 5));
        // A clone (another worker's copy) draws the same bits.
        let mut s = image(5);
        a.clone().apply(&mut s, 2, 5);
        assert_eq!(bits(&s.values), augmented(2, 5));
        assert_ne!(augmented(2, 5), augmented(3, 5), "a new epoch redraws");
    }

    #[test]
    fn a_shared_generator_seeded_like_a_sample_draws_what_that_sample_draws() {
        let (epoch, index) = (1, 8);
        let rng = derive_stream(17, Stream::Augment, index, epoch);
        let shared =
            Augmenter::new(all(), AugmentRng::Shared(Arc::new(Mutex::new(rng))), &SHAPE).unwrap();
        let (mut a, mut b) = (image(index), image(index));
        shared.apply(&mut a, epoch, index);
        augmenter(all()).apply(&mut b, epoch, index);
        assert_eq!(bits(&a.values), bits(&b.values));
        // The next sample through the shared generator continues its stream instead.
        let (mut a, mut b) = (image(index), image(index));
        shared.apply(&mut a, epoch, index);
        augmenter(all()).apply(&mut b, epoch, index);
        assert_ne!(bits(&a.values), bits(&b.values));
    }

    #[test]
    fn nothing_enabled_draws_nothing_and_changes_nothing() {
        let rng = derive_stream(1, Stream::Augment, 0, 0);
        let shared = Arc::new(Mutex::new(rng.clone()));
        let a = Augmenter::new(
            Augmentation::default(),
            AugmentRng::Shared(shared.clone()),
            &SHAPE,
        )
        .unwrap();
        let mut sample = image(2);
        a.apply(&mut sample, 0, 2);
        Augmenter::none().apply(&mut sample, 0, 2);
        assert_eq!(sample, image(2));
        assert_eq!(*shared.lock().unwrap(), rng, "no draw was taken");

        // Flip alone takes exactly one draw.
        let flip = Augmentation {
            flip: true,
            ..Augmentation::default()
        };
        let a = Augmenter::new(flip, AugmentRng::Shared(shared.clone()), &SHAPE).unwrap();
        a.apply(&mut sample, 0, 2);
        let mut expected = rng;
        expected.uniform_f64();
        assert_eq!(*shared.lock().unwrap(), expected);
    }

    #[test]
    fn noise_has_the_requested_spread_and_works_on_any_shape() {
        let dataset = SyntheticVectors::new(2, 10, 4000, 3);
        let noise = Augmentation {
            noise_std: 0.5,
            ..Augmentation::default()
        };
        let a = Augmenter::new(noise, AugmentRng::PerSample { seed: 1 }, &[4000]).unwrap();
        let source = dataset.get(7);
        let mut sample = source.clone();
        a.apply(&mut sample, 0, 7);
        let diffs: Vec<f64> = sample
            .values
            .iter()
            .zip(&source.values)
            .map(|(a, b)| f64::from(a - b))
            .collect();
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / diffs.len() as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.05, "std {}", var.sqrt());
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |augmentation, shape: &[usize]| match Augmenter::new(
            augmentation,
            AugmentRng::PerSample { seed: 0 },
            shape,
        ) {
            Err(DataError::Invalid { field, .. }) => field,
            other => panic!("expected a rejection, got {other:?}"),
        };
        let crop = Augmentation {
            crop_padding: 1,
            ..Augmentation::default()
        };
        let flip = Augmentation {
            flip: true,
            ..Augmentation::default()
        };
        assert_eq!(field(crop, &[16]), "augment.crop_padding");
        assert_eq!(field(crop, &[4, 4]), "augment.crop_padding");
        assert_eq!(field(flip, &[1, 3, 4, 4]), "augment.flip");
        for noise_std in [-0.1, f32::NAN, f32::INFINITY] {
            let noise = Augmentation {
                noise_std,
                ..Augmentation::default()
            };
            assert_eq!(field(noise, &SHAPE), "augment.noise_std");
        }
        let a = augmenter(all());
        assert!(a.check_shape(&SHAPE).is_ok());
        assert!(matches!(
            a.check_shape(&[3, 5, 6]),
            Err(DataError::Invalid { field, .. }) if field == "augment"
        ));
        assert!(Augmenter::none().check_shape(&[7]).is_ok());
    }

    #[test]
    fn configuration_is_snake_case_json_with_everything_off_by_default() {
        let parse = serde_json::from_str::<Augmentation>;
        assert_eq!(parse("{}").unwrap(), Augmentation::default());
        assert_eq!(
            parse(r#"{"crop_padding": 4, "flip": true, "noise_std": 0.25}"#).unwrap(),
            Augmentation {
                crop_padding: 4,
                flip: true,
                noise_std: 0.25
            }
        );
        let err = parse(r#"{"flip": true, "rotate": 90}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `rotate`"), "{err}");
    }

    /// A padding from a scenario file larger than the image is refused, naming the field (a
    /// padding near 2^64 overflowed the crop's offsets).
    #[test]
    fn crop_padding_is_at_most_the_larger_side() {
        let padded = |crop_padding| Augmentation {
            crop_padding,
            ..Augmentation::default()
        };
        let rng = || AugmentRng::PerSample { seed: 1 };
        assert!(Augmenter::new(padded(16), rng(), &[3, 8, 16]).is_ok());
        let err = Augmenter::new(padded(usize::MAX), rng(), &[3, 8, 16]).unwrap_err();
        assert_eq!(
            err.to_string(),
            DataError::invalid(
                "augment.crop_padding",
                format!(
                    "must be at most the image's larger side (16), got {}",
                    usize::MAX
                )
            )
            .to_string()
        );
    }
}
