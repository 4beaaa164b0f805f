//! Pictures: a tiny vector figure drawn both as SVG and as PNG, and the pictures detcheck makes
//! with it (the divergence map in `compare/map.rs`, the loss-curve plot in `compare/curves.rs`).
//!
//! [`Figure`] holds rectangles, polylines and text in pixel coordinates. `to_svg` writes them as
//! SVG elements (the browser draws them); `to_png` has them drawn by a library made for it,
//! `plotters` (its bitmap backend: filled rectangles, stroked paths, anti-aliased text through
//! `ab_glyph`), in DejaVu Sans Mono embedded in the binary (`font/`, its licence beside it), and
//! encodes the pixels with the `png` crate. Why plotters (docs/decisions.md, "Pictures"): it is
//! kept, pure Rust, draws into a buffer we own with a font we give it (no system font looked up,
//! no C library), and its text is measured and anchored by the font's own metrics, where the
//! bitmap font drawn here by hand before clipped a real report's title.
//!
//! Invariant (pictures are deterministic): no system fonts, fixed number formats; the same data
//! gives the same PNG and SVG bytes.
//!
//! Determinism: both outputs are pure functions of the figure: no clock, no fonts looked up on
//! the system (the one font is compiled in), numbers printed with fixed precision, so the same
//! data gives the same bytes. Limits: text in the font's glyphs (a character it lacks is drawn
//! as its missing-glyph box); no curves, only polylines; layouts reserve [`Figure::text_width`]
//! a text, 7 pixels a character, which the font's advance (6.6 pixels at 11 pixels an em) stays
//! within.

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

    /// The width layouts reserve for `text`: 7 pixels a character, at least the PNG font's
    /// advance (6.6 pixels) and the SVG's (the same font at 11 pixels an em).
    pub(crate) fn text_width(text: &str) -> f64 {
        (text.chars().count() * 7) as f64
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

    /// The raster image, RGB, row-major, drawn by plotters' bitmap backend.
    fn rasterize(&self) -> Vec<u8> {
        use plotters::prelude::{
            BitMapBackend, IntoDrawingArea, IntoFont, PathElement, RGBColor, Rectangle, Text,
        };
        use plotters::style::text_anchor::{HPos, Pos, VPos};
        use plotters::style::{Color, TextStyle};
        register_font();
        let (w, h) = (self.width as usize, self.height as usize);
        let mut px = vec![255u8; w * h * 3];
        let at = |x: f64, y: f64| (x.round() as i32, y.round() as i32);
        let rgb = |c: Rgb| RGBColor(c[0], c[1], c[2]);
        {
            let area =
                BitMapBackend::with_buffer(&mut px, (self.width, self.height)).into_drawing_area();
            // Drawing into a buffer of the figure's size cannot fail once the font is known
            // (`register_font`): a failure is a defect of this module, found by its tests.
            let drawn = "a figure drawn into memory";
            for item in &self.items {
                match item {
                    Item::Rect { x, y, w, h, fill } => {
                        // plotters fills both corners' pixels: the far corner is one pixel in.
                        let (x0, y0) = at(*x, *y);
                        let (x1, y1) = at(x + w, y + h);
                        if x1 > x0 && y1 > y0 {
                            let corners = [(x0, y0), (x1 - 1, y1 - 1)];
                            let rect = Rectangle::new(corners, rgb(*fill).filled());
                            area.draw(&rect).expect(drawn);
                        }
                    }
                    Item::Line {
                        points,
                        color,
                        width,
                    } => {
                        let points: Vec<(i32, i32)> =
                            points.iter().map(|&(x, y)| at(x, y)).collect();
                        let stroke = rgb(*color).stroke_width(width.round().max(1.0) as u32);
                        area.draw(&PathElement::new(points, stroke)).expect(drawn);
                    }
                    Item::Text {
                        x,
                        y,
                        text,
                        color,
                        anchor,
                    } => {
                        let h = match anchor {
                            Anchor::Start => HPos::Left,
                            Anchor::Middle => HPos::Center,
                            Anchor::End => HPos::Right,
                        };
                        // `y` is the baseline; plotters anchors the text's box by its bottom,
                        // the font's descent below the baseline.
                        let color = rgb(*color);
                        let style = TextStyle::from((FONT, FONT_SIZE).into_font())
                            .color(&color)
                            .pos(Pos::new(h, VPos::Bottom));
                        let (tx, ty) = at(*x, y + DESCENT);
                        area.draw(&Text::new(text.as_str(), (tx, ty), style))
                            .expect(drawn);
                    }
                }
            }
            area.present().expect(drawn);
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

/// The name the embedded font is registered under with plotters.
const FONT: &str = "detcheck-dejavu-sans-mono";

/// plotters' font size for 11 pixels an em, as the SVG's `font-size="11"`: its size is the
/// font's height from descent to ascent (2,384 of DejaVu's 2,048 units an em).
const FONT_SIZE: f64 = 11.0 * 2384.0 / 2048.0;

/// The font's descent below the baseline at [`FONT_SIZE`], in pixels (483 of 2,384 units).
const DESCENT: f64 = FONT_SIZE * 483.0 / 2384.0;

/// DejaVu Sans Mono, compiled in (`font/LICENSE`).
static FONT_BYTES: &[u8] = include_bytes!("font/DejaVuSansMono.ttf");

/// Registers the embedded font with plotters, once a process.
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font compiled in: a failure is a defect of this
        // module, found by its tests (they draw text).
        plotters::style::register_font(FONT, plotters::style::FontStyle::Normal, FONT_BYTES)
            .unwrap_or_else(|_| panic!("the embedded font parses"));
    });
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
