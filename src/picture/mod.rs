//! Pictures: a tiny vector figure drawn both as SVG and as PNG, and the pictures detcheck makes
//! with it (the divergence map in `compare/map.rs`, the loss-curve plot in `compare/curves.rs`).
//!
//! [`Figure`] holds rectangles, polylines and text in pixel coordinates. `to_svg` writes them as
//! SVG elements; `to_png` rasterises them with a small built-in rasteriser (no anti-aliasing,
//! lines stamped along their length, text from a 7×13 bitmap font generated from DejaVu Sans Mono
//! by `scripts/gen_font.py`) and encodes the pixels with the `png` crate.
//!
//! Invariant (pictures are deterministic): no system fonts, fixed number formats; the same data
//! gives the same PNG and SVG bytes.
//!
//! Determinism: both outputs are pure functions of the figure: no clock, no fonts looked up on
//! the system, numbers printed with fixed precision, so the same data gives the same bytes.
//! Limits: ASCII text only (other characters are drawn as `?`); no curves, only polylines.

mod font;

use crate::file::{write_atomically, DumpError};
use std::fmt::Write as _;
use std::path::Path;

/// An RGB colour.
pub(crate) type Rgb = [u8; 3];

pub(crate) const WHITE: Rgb = [255, 255, 255];
pub(crate) const BLACK: Rgb = [0, 0, 0];
pub(crate) const GREY: Rgb = [120, 120, 120];
pub(crate) const LIGHT_GREY: Rgb = [225, 225, 225];

/// Qualitative colours (Tableau 10), for curves and tensors.
pub(crate) const PALETTE: [Rgb; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [188, 189, 34],
    [23, 190, 207],
    [44, 160, 44],
    [127, 127, 127],
];

/// Where a text's x coordinate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Debug, Clone)]
enum Item {
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Rgb,
    },
    Line {
        points: Vec<(f64, f64)>,
        color: Rgb,
        width: f64,
    },
    /// `y` is the baseline.
    Text {
        x: f64,
        y: f64,
        text: String,
        color: Rgb,
        anchor: Anchor,
    },
}

/// A drawing in pixel coordinates, (0, 0) at the top left.
#[derive(Debug, Clone)]
pub(crate) struct Figure {
    width: u32,
    height: u32,
    items: Vec<Item>,
}

impl Figure {
    pub(crate) fn new(width: u32, height: u32) -> Self {
        Figure {
            width,
            height,
            items: vec![Item::Rect {
                x: 0.0,
                y: 0.0,
                w: f64::from(width),
                h: f64::from(height),
                fill: WHITE,
            }],
        }
    }

    pub(crate) fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb) {
        self.items.push(Item::Rect { x, y, w, h, fill });
    }

    /// A rectangle's outline, one pixel wide.
    pub(crate) fn frame(&mut self, x: f64, y: f64, w: f64, h: f64, color: Rgb) {
        let points = vec![(x, y), (x + w, y), (x + w, y + h), (x, y + h), (x, y)];
        self.line(points, color, 1.0);
    }

    pub(crate) fn line(&mut self, points: Vec<(f64, f64)>, color: Rgb, width: f64) {
        if points.len() >= 2 {
            self.items.push(Item::Line {
                points,
                color,
                width,
            });
        }
    }

    pub(crate) fn text(&mut self, x: f64, y: f64, text: &str, color: Rgb, anchor: Anchor) {
        self.items.push(Item::Text {
            x,
            y,
            text: text.to_owned(),
            color,
            anchor,
        });
    }

    /// Whether every text drawn from its start (`Anchor::Start`) ends inside the picture.
    #[cfg(test)]
    pub(crate) fn texts_fit(&self) -> bool {
        self.items.iter().all(|item| match item {
            Item::Text {
                x,
                text,
                anchor: Anchor::Start,
                ..
            } => x + Self::text_width(text) <= f64::from(self.width),
            _ => true,
        })
    }

    /// The width of `text` in pixels, in the PNG's font.
    pub(crate) fn text_width(text: &str) -> f64 {
        (text.chars().count() * font::GLYPH_W) as f64
    }

    pub(crate) fn to_svg(&self) -> String {
        let hex = |c: Rgb| format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2]);
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
             font-family=\"DejaVu Sans Mono, monospace\" font-size=\"11\">\n",
            w = self.width,
            h = self.height
        );
        for item in &self.items {
            let _ = match item {
                Item::Rect { x, y, w, h, fill } => writeln!(
                    out,
                    "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"{}\"/>",
                    hex(*fill)
                ),
                Item::Line {
                    points,
                    color,
                    width,
                } => {
                    let pts: Vec<String> =
                        points.iter().map(|(x, y)| format!("{x:.2},{y:.2}")).collect();
                    writeln!(
                        out,
                        "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{width:.1}\"/>",
                        pts.join(" "),
                        hex(*color)
                    )
                }
                Item::Text {
                    x,
                    y,
                    text,
                    color,
                    anchor,
                } => {
                    let anchor = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                        Anchor::End => "end",
                    };
                    writeln!(
                        out,
                        "<text x=\"{x:.2}\" y=\"{y:.2}\" fill=\"{}\" text-anchor=\"{anchor}\">{}</text>",
                        hex(*color),
                        escape_xml(text)
                    )
                }
            };
        }
        out.push_str("</svg>\n");
        out
    }

    /// The raster image, RGB, row-major.
    fn rasterize(&self) -> Vec<u8> {
        let (w, h) = (self.width as usize, self.height as usize);
        let mut px = vec![255u8; w * h * 3];
        let mut put = |x: i64, y: i64, c: Rgb| {
            if x >= 0 && y >= 0 && (x as usize) < w && (y as usize) < h {
                let i = (y as usize * w + x as usize) * 3;
                px[i..i + 3].copy_from_slice(&c);
            }
        };
        for item in &self.items {
            match item {
                Item::Rect { x, y, w, h, fill } => {
                    let (x0, y0) = (x.round() as i64, y.round() as i64);
                    let (x1, y1) = ((x + w).round() as i64, (y + h).round() as i64);
                    for yy in y0..y1 {
                        for xx in x0..x1 {
                            put(xx, yy, *fill);
                        }
                    }
                }
                Item::Line {
                    points,
                    color,
                    width,
                } => {
                    let r = ((width - 1.0) / 2.0).max(0.0);
                    for seg in points.windows(2) {
                        let ((xa, ya), (xb, yb)) = (seg[0], seg[1]);
                        let n =
                            ((xb - xa).abs().max((yb - ya).abs()) * 2.0).ceil().max(1.0) as usize;
                        for k in 0..=n {
                            let t = k as f64 / n as f64;
                            let (cx, cy) = (xa + (xb - xa) * t, ya + (yb - ya) * t);
                            let (x0, x1) = ((cx - r).round() as i64, (cx + r).round() as i64);
                            let (y0, y1) = ((cy - r).round() as i64, (cy + r).round() as i64);
                            for yy in y0..=y1 {
                                for xx in x0..=x1 {
                                    put(xx, yy, *color);
                                }
                            }
                        }
                    }
                }
                Item::Text {
                    x,
                    y,
                    text,
                    color,
                    anchor,
                } => {
                    let width = Figure::text_width(text);
                    let left = match anchor {
                        Anchor::Start => *x,
                        Anchor::Middle => x - width / 2.0,
                        Anchor::End => x - width,
                    }
                    .round() as i64;
                    // The font's baseline is 3 rows above the bottom of its cell.
                    let top = y.round() as i64 - (font::GLYPH_H as i64 - 3);
                    for (i, ch) in text.chars().enumerate() {
                        let code = if (' '..='~').contains(&ch) { ch } else { '?' };
                        let glyph = &font::GLYPHS[code as usize - 32];
                        for (row, bits) in glyph.iter().enumerate() {
                            for col in 0..font::GLYPH_W {
                                if bits >> (font::GLYPH_W - 1 - col) & 1 == 1 {
                                    let gx = left + (i * font::GLYPH_W + col) as i64;
                                    put(gx, top + row as i64, *color);
                                }
                            }
                        }
                    }
                }
            }
        }
        px
    }

    pub(crate) fn to_png(&self) -> Vec<u8> {
        let pixels = self.rasterize();
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        // Encoding into memory with a valid size cannot fail.
        let mut writer = encoder.write_header().expect("png header into memory");
        writer
            .write_image_data(&pixels)
            .expect("png data of the declared size");
        writer.finish().expect("png end into memory");
        out
    }

    /// Writes the PNG to `path` atomically.
    pub(crate) fn write_png(&self, path: &Path) -> Result<(), DumpError> {
        write_atomically(path, &self.to_png())
    }

    /// Writes the SVG to `path` atomically.
    pub(crate) fn write_svg(&self, path: &Path) -> Result<(), DumpError> {
        write_atomically(path, self.to_svg().as_bytes())
    }
}

fn escape_xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A short label for a number on an axis.
pub(crate) fn axis_label(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.abs() >= 1e4 || x.abs() < 1e-2 {
        format!("{x:.2e}")
    } else {
        let s = format!("{x:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_gives_the_same_bytes_every_time() {
        let draw = || {
            let mut f = Figure::new(40, 20);
            f.rect(1.0, 1.0, 5.0, 5.0, PALETTE[0]);
            f.line(vec![(0.0, 19.0), (39.0, 0.0)], BLACK, 2.0);
            f.text(20.0, 15.0, "a<b", BLACK, Anchor::Middle);
            f
        };
        let (a, b) = (draw(), draw());
        assert_eq!(a.to_png(), b.to_png());
        assert!(a.to_png().starts_with(b"\x89PNG\r\n\x1a\n"));
        let svg = a.to_svg();
        assert!(svg.contains("a&lt;b"), "{svg}");
        assert!(svg.starts_with("<svg "));
        // The rectangle is drawn where it was put.
        let px = a.rasterize();
        let at = |x: usize, y: usize| &px[(y * 40 + x) * 3..(y * 40 + x) * 3 + 3];
        assert_eq!(at(2, 2), PALETTE[0]);
        assert_eq!(at(39, 19), WHITE);
    }

    #[test]
    fn axis_labels_are_short() {
        assert_eq!(axis_label(0.5), "0.5");
        assert_eq!(axis_label(2.0), "2");
        assert_eq!(axis_label(1e-5), "1.00e-5");
    }
}
