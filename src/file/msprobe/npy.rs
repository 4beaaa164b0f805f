//! numpy's `.npy` files (format versions 1, 2 and 3): the header, then the elements.
//!
//! The header is a Python dict literal, `{'descr': '<f4', 'fortran_order': False, 'shape': (2,
//! 3), }`; [`read`] parses it, checks that the file holds exactly the bytes the header announces
//! (a truncated or appended file is an error, and a size from the file is never trusted before
//! it is checked against the file's length), and returns the elements in row-major order as
//! little-endian bytes (Fortran-order and big-endian files are converted).
//!
//! dtypes: `f2`, `f4`, `f8`, `i1`, `i2`, `i4`, `i8`, `u1`, `u2`, `b1` (bool bytes must be 0 or
//! 1), `c8` and `c16` (complex64 and complex128: a big-endian file's parts are swapped one by
//! one), and 2-byte void (`V2`), which is how numpy saves `ml_dtypes.bfloat16`: read as bf16 only
//! when the record says bfloat16. msprobe itself saves bf16 tensors as float32 (`.float()` before
//! `np.save`); those read as f32, exactly. numpy has no 8-bit float, so none is read.

use super::Elements;
use crate::value::tensor::DType;

/// Why a `.npy` file cannot be read (the caller names the file).
pub(super) type NpyError = String;

/// Reads a `.npy` file's bytes. `bf16` says the record is a bfloat16 tensor.
pub(super) fn read(file: &[u8], bf16: bool) -> Result<Elements, NpyError> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if file.len() < MAGIC.len() + 2 || !file.starts_with(MAGIC) {
        return Err("not a .npy file (it does not start with \\x93NUMPY)".into());
    }
    let (major, minor) = (file[6], file[7]);
    let (len_bytes, start): (usize, usize) = match major {
        1 => (2, 10),
        2 | 3 => (4, 12),
        _ => {
            return Err(format!(
                "npy format version {major}.{minor} is not supported (1 to 3 are)"
            ))
        }
    };
    let Some(len_field) = file.get(8..8 + len_bytes) else {
        return Err("truncated: the file ends inside its header length".into());
    };
    let header_len = len_field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    let Some(header) = start
        .checked_add(header_len)
        .and_then(|end| file.get(start..end))
    else {
        return Err(format!(
            "truncated: the header announces {header_len} bytes but the file has {}",
            file.len().saturating_sub(start)
        ));
    };
    let header =
        std::str::from_utf8(header).map_err(|_| "the header is not text (UTF-8)".to_owned())?;
    let header = parse_header(header)?;
    let (dtype, size, swap) = descr_dtype(&header.descr, bf16)?;
    // The unit a big-endian file is swapped in: an element, or a complex element's part.
    let swap_unit = if dtype.is_complex() { size / 2 } else { size };
    let shape: Vec<usize> = header
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
        .collect::<Result<_, _>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} holds more elements than memory can"))?;
    let data = &file[start + header_len..];
    let want = count
        .checked_mul(size)
        .ok_or_else(|| format!("shape {shape:?} holds more bytes than memory can"))?;
    if data.len() != want {
        return Err(if data.len() < want {
            format!(
                "truncated: shape {shape:?} of {} needs {want} bytes of data but the file has {}",
                header.descr,
                data.len()
            )
        } else {
            format!(
                "{} bytes follow the {want} bytes of data that shape {shape:?} of {} needs",
                data.len() - want,
                header.descr
            )
        });
    }
    let mut bytes = if header.fortran_order && shape.len() > 1 {
        fortran_to_c(data, &shape, size)
    } else {
        data.to_vec()
    };
    if swap {
        for element in bytes.chunks_exact_mut(swap_unit) {
            element.reverse();
        }
    }
    if dtype == DType::Bool {
        if let Some(i) = bytes.iter().position(|&b| b > 1) {
            return Err(format!(
                "bool element {i} is the byte {}, not 0 or 1",
                bytes[i]
            ));
        }
    }
    Ok(Elements {
        dtype,
        shape,
        bytes,
    })
}

/// The parts of the header dict that matter.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<u64>,
}

/// Parses `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` (keys in any order,
/// either quote, optional trailing commas and padding).
fn parse_header(text: &str) -> Result<Header, NpyError> {
    let bad = |what: &str| format!("header `{}`: {what}", text.trim_end());
    let mut p = Parser {
        s: text.as_bytes(),
        i: 0,
    };
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    p.eat(b'{').ok_or_else(|| bad("expected a dict"))?;
    loop {
        p.ws();
        if p.eat(b'}').is_some() {
            break;
        }
        let key = p.string().ok_or_else(|| bad("expected a quoted key"))?;
        p.eat(b':').ok_or_else(|| bad("expected `:` after a key"))?;
        p.ws();
        match key.as_str() {
            "descr" => {
                descr = Some(p.string().ok_or_else(|| {
                    bad("`descr` is not a string (structured dtypes are not supported)")
                })?);
            }
            "fortran_order" => {
                fortran = Some(if p.word("True") {
                    true
                } else if p.word("False") {
                    false
                } else {
                    return Err(bad("`fortran_order` is not True or False"));
                });
            }
            "shape" => {
                shape = Some(
                    p.int_tuple()
                        .ok_or_else(|| bad("`shape` is not a tuple of integers"))?,
                );
            }
            other => return Err(bad(&format!("unknown key `{other}`"))),
        }
        p.ws();
        if p.eat(b',').is_none() {
            p.ws();
            p.eat(b'}').ok_or_else(|| bad("expected `,` or `}`"))?;
            break;
        }
    }
    p.ws();
    if p.i != p.s.len() {
        return Err(bad("text after the dict"));
    }
    Ok(Header {
        descr: descr.ok_or_else(|| bad("no `descr`"))?,
        fortran_order: fortran.ok_or_else(|| bad("no `fortran_order`"))?,
        shape: shape.ok_or_else(|| bad("no `shape`"))?,
    })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.ws();
        (self.s.get(self.i) == Some(&b)).then(|| self.i += 1)
    }

    fn word(&mut self, w: &str) -> bool {
        let ok = self.s[self.i..].starts_with(w.as_bytes());
        if ok {
            self.i += w.len();
        }
        ok
    }

    fn string(&mut self) -> Option<String> {
        self.ws();
        let quote = *self.s.get(self.i)?;
        if quote != b'\'' && quote != b'"' {
            return None;
        }
        let start = self.i + 1;
        let len = self.s[start..].iter().position(|&b| b == quote)?;
        self.i = start + len + 1;
        String::from_utf8(self.s[start..start + len].to_vec()).ok()
    }

    /// `()`, `(3,)`, `(2, 3)`, `(2L, 3L)` (Python 2's longs).
    fn int_tuple(&mut self) -> Option<Vec<u64>> {
        self.eat(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.ws();
            if self.eat(b')').is_some() {
                return Some(dims);
            }
            let start = self.i;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
            let digits = std::str::from_utf8(&self.s[start..self.i]).ok()?;
            dims.push(digits.parse().ok()?);
            if self.s.get(self.i) == Some(&b'L') {
                self.i += 1;
            }
            self.ws();
            if self.eat(b',').is_none() {
                self.eat(b')')?;
                return Some(dims);
            }
        }
    }
}

/// (dtype, element size, byte-swap needed) of a `descr` such as `<f4`, `|b1`, `>i8`.
fn descr_dtype(descr: &str, bf16: bool) -> Result<(DType, usize, bool), NpyError> {
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        "f2" | "e" => DType::F16,
        "f4" | "f" => DType::F32,
        "f8" | "d" => DType::F64,
        "i1" | "b" => DType::I8,
        "i2" | "h" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" | "B" => DType::U8,
        "u2" | "H" => DType::U16,
        "c8" | "F" => DType::C64,
        "c16" | "D" => DType::C128,
        "b1" | "?" => DType::Bool,
        "V2" if bf16 => DType::BF16,
        "V2" => {
            return Err(format!(
                "dtype `{descr}` (2-byte void) is read only for records whose dtype is bfloat16"
            ))
        }
        _ => {
            return Err(format!(
                "dtype `{descr}` is not supported (f2, f4, f8, i1, i2, i4, i8, u1, u2, b1, c8, \
                 c16 and bfloat16 are)"
            ))
        }
    };
    // `=` is the writer's native order: little-endian on every machine msprobe runs on.
    Ok((dtype, dtype.size_of(), order == b'>' && dtype.size_of() > 1))
}

/// Reorders column-major elements (`size` bytes each) to row-major.
fn fortran_to_c(data: &[u8], shape: &[usize], size: usize) -> Vec<u8> {
    let count = data.len() / size;
    let mut out = vec![0u8; data.len()];
    // Column-major strides, in elements.
    let mut strides = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        strides[k] = strides[k - 1] * shape[k - 1];
    }
    let mut index = vec![0usize; shape.len()];
    for c in 0..count {
        let f: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out[c * size..(c + 1) * size].copy_from_slice(&data[f * size..(f + 1) * size]);
        // The next row-major index: the last dimension moves fastest.
        for k in (0..shape.len()).rev() {
            index[k] += 1;
            if index[k] < shape[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A `.npy` file as numpy 2.x writes it (version 1.0, header padded to 64 bytes).
    pub(crate) fn npy(descr: &str, fortran: bool, shape: &[u64], data: &[u8]) -> Vec<u8> {
        let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
        let tuple = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        let fortran = if fortran { "True" } else { "False" };
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {tuple}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn le<T: Copy, const N: usize>(xs: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
        xs.iter().flat_map(|&x| f(x)).collect()
    }

    #[test]
    fn dtypes_orders_and_versions() {
        let f32s = le(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], f32::to_le_bytes);
        let e = read(&npy("<f4", false, &[2, 3], &f32s), false).unwrap();
        assert_eq!(
            (e.dtype, e.shape.clone(), e.bytes.clone()),
            (DType::F32, vec![2, 3], f32s.clone())
        );
        // The same values stored column-major: 1 4 2 5 3 6.
        let cols = le(&[1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0], f32::to_le_bytes);
        let f = read(&npy("<f4", true, &[2, 3], &cols), false).unwrap();
        assert_eq!(f.bytes, f32s);
        // Big-endian i8 and a version 2 header.
        let be = le(&[-7i64, 3], i64::to_be_bytes);
        let mut v2 = npy(">i8", false, &[2], &be);
        let hl = u16::from_le_bytes([v2[8], v2[9]]);
        v2.splice(
            6..10,
            [2u8, 0]
                .into_iter()
                .chain((u32::from(hl) + 2).to_le_bytes()),
        );
        v2.splice(12..12, *b"  ");
        let i = read(&v2, false).unwrap();
        assert_eq!(
            (i.dtype, i.bytes),
            (DType::I64, le(&[-7i64, 3], i64::to_le_bytes))
        );
        for (descr, dtype, data) in [
            ("<f2", DType::F16, vec![0, 0x3c]),
            ("<f8", DType::F64, 1.5f64.to_le_bytes().to_vec()),
            ("<i4", DType::I32, (-2i32).to_le_bytes().to_vec()),
            ("|u1", DType::U8, vec![200]),
            ("|b1", DType::Bool, vec![1]),
            ("|i1", DType::I8, vec![0xfe]),
            ("<i2", DType::I16, (-300i16).to_le_bytes().to_vec()),
            ("<u2", DType::U16, 60000u16.to_le_bytes().to_vec()),
            ("<c8", DType::C64, le(&[1.5f32, -2.0], f32::to_le_bytes)),
            ("<c16", DType::C128, le(&[0.25f64, 3.0], f64::to_le_bytes)),
        ] {
            let e = read(&npy(descr, false, &[1], &data), false).unwrap();
            assert_eq!((e.dtype, e.bytes), (dtype, data), "{descr}");
        }
        // A big-endian complex: each part is swapped on its own, real part first.
        let be = le(&[1.5f32, -2.0, 0.5, 4.0], f32::to_be_bytes);
        let c = read(&npy(">c8", false, &[2], &be), false).unwrap();
        assert_eq!(
            (c.dtype, c.bytes),
            (DType::C64, le(&[1.5f32, -2.0, 0.5, 4.0], f32::to_le_bytes))
        );
        // A scalar (shape ()) and an empty tensor.
        assert_eq!(
            read(&npy("<f4", false, &[], &f32s[..4]), false)
                .unwrap()
                .shape,
            Vec::<usize>::new()
        );
        assert_eq!(
            read(&npy("<f4", false, &[0, 3], &[]), false).unwrap().bytes,
            Vec::<u8>::new()
        );
        // bf16 as ml_dtypes saves it: read only for a bfloat16 record.
        let b = read(&npy("<V2", false, &[1], &[0x80, 0x3f]), true).unwrap();
        assert_eq!(b.dtype, DType::BF16);
        assert!(read(&npy("<V2", false, &[1], &[0x80, 0x3f]), false)
            .unwrap_err()
            .contains("bfloat16"));
    }

    #[test]
    fn damaged_files_are_errors_not_panics() {
        let good = npy("<f4", false, &[2, 3], &[0; 24]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"PK\x03\x04".to_vec(), "not a .npy file"),
            (good[..9].to_vec(), "header length"),
            (good[..40].to_vec(), "truncated: the header"),
            (good[..good.len() - 1].to_vec(), "truncated: shape [2, 3]"),
            ([good.clone(), vec![0]].concat(), "1 bytes follow"),
            (npy("<u4", false, &[1], &[0; 4]), "not supported"),
            (npy("|b1", false, &[2], &[0, 2]), "not 0 or 1"),
            (npy("<f4", false, &[u64::MAX, 4], &[]), "more elements"),
            (npy("<f4", false, &[1 << 62, 1], &[]), "more bytes"),
            (
                {
                    let mut f = good.clone();
                    f[6] = 9;
                    f
                },
                "version 9",
            ),
            (
                {
                    let mut f = good.clone();
                    f[8] = 0xff;
                    f[9] = 0xff;
                    f
                },
                "truncated: the header announces 65535",
            ),
            (
                {
                    let mut f = good.clone();
                    let at = f.windows(5).position(|w| w == b"shape").unwrap();
                    f[at..at + 5].copy_from_slice(b"shapx");
                    f
                },
                "unknown key `shapx`",
            ),
        ];
        for (file, want) in cases {
            let err = read(&file, false).unwrap_err();
            assert!(err.contains(want), "want {want:?}, got {err:?}");
        }
    }
}
