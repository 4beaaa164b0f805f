//! A streaming JSON scanner over bytes, for msprobe's `dump.json`: it reads the file in chunks
//! of [`CHUNK`] bytes and hands its caller one token at a time (keys, strings, numbers), so a
//! caller keeps only what it needs and never builds a document tree.
//!
//! Grammar: JSON (RFC 8259) plus the literals Python's `json` module writes for non-finite
//! floats, `NaN`, `Infinity` and `-Infinity` (msprobe writes them for tensors holding NaN or
//! Inf). Strings are checked for escapes and UTF-8; numbers for JSON's number grammar; nesting is
//! limited to [`MAX_DEPTH`] levels (a deeper file is an error, never a stack overflow); whatever
//! follows the top-level value other than whitespace is an error (see [`Scanner::finish`]).
//! Errors carry the byte offset at which they were found.

use std::io::Read;

/// Bytes read from the file at a time.
const CHUNK: usize = 256 * 1024;

/// The deepest nesting of arrays and objects accepted.
pub(super) const MAX_DEPTH: usize = 128;

/// Why the scanner stopped.
#[derive(Debug)]
pub(super) enum ScanError {
    /// Reading the file failed.
    Io(std::io::Error),
    /// The bytes are not JSON: what was expected and where (byte offset).
    Syntax { offset: u64, detail: String },
}

/// A value that is neither an object nor an array.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Scalar {
    Null,
    Bool(bool),
    /// A number (also `NaN`, `Infinity`, `-Infinity`).
    Number(f64),
    /// A string; its text is in [`Scanner::text`].
    String,
}

/// The kind of the next value, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    Object,
    Array,
    String,
    /// A number, a literal (`true`, `null`, `NaN` ...) or an invalid byte (found when read).
    Other,
}

/// A pull scanner over a reader.
pub(super) struct Scanner<R> {
    src: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// The file offset of `buf[0]`.
    base: u64,
    eof: bool,
    /// The last string or key read (checked UTF-8), or a token that spans two chunks.
    scratch: Vec<u8>,
    /// Where the last string or key is when it lies in `buf` as it is (no escape, one chunk):
    /// then it is not copied to `scratch`. Valid until the next call that reads.
    in_buf: Option<(usize, usize)>,
    /// The last number read, when it was written as a non-negative integer that fits a u64.
    last_int: Option<u64>,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

impl<R: Read> Scanner<R> {
    pub(super) fn new(src: R) -> Self {
        Scanner {
            src,
            buf: vec![0; CHUNK],
            pos: 0,
            end: 0,
            base: 0,
            eof: false,
            scratch: Vec::with_capacity(256),
            in_buf: None,
            last_int: None,
        }
    }

    /// The offset of the next unread byte.
    pub(super) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn syntax(&self, detail: impl Into<String>) -> ScanError {
        ScanError::Syntax {
            offset: self.offset(),
            detail: detail.into(),
        }
    }

    fn eof_error(&self, what: &str) -> ScanError {
        self.syntax(format!(
            "the file ends inside {what} (truncated: msprobe completes dump.json only when the dump is stopped)"
        ))
    }

    /// Reads the next chunk once everything buffered is consumed; `false` at the end of the file.
    fn refill(&mut self) -> Result<bool, ScanError> {
        debug_assert_eq!(self.pos, self.end);
        if self.eof {
            return Ok(false);
        }
        self.base += self.end as u64;
        self.pos = 0;
        self.end = 0;
        loop {
            match self.src.read(&mut self.buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end = n;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ScanError::Io(e)),
            }
        }
    }

    /// The next byte, consumed; `None` at the end of the file.
    #[inline]
    fn next_byte(&mut self) -> Result<Option<u8>, ScanError> {
        if self.pos == self.end && !self.refill()? {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }

    /// Skips whitespace; the next byte, not consumed (`None` at the end of the file).
    #[inline]
    pub(super) fn peek(&mut self) -> Result<Option<u8>, ScanError> {
        while self.pos < self.end {
            let b = self.buf[self.pos];
            if !is_ws(b) {
                return Ok(Some(b));
            }
            self.pos += 1;
        }
        self.peek_slow()
    }

    #[cold]
    fn peek_slow(&mut self) -> Result<Option<u8>, ScanError> {
        loop {
            while self.pos < self.end {
                let b = self.buf[self.pos];
                if !is_ws(b) {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if !self.refill()? {
                return Ok(None);
            }
        }
    }

    /// The kind of the next value (whitespace skipped).
    #[inline]
    pub(super) fn next_kind(&mut self, inside: &str) -> Result<Next, ScanError> {
        match self.peek()? {
            Some(b'{') => Ok(Next::Object),
            Some(b'[') => Ok(Next::Array),
            Some(b'"') => Ok(Next::String),
            Some(_) => Ok(Next::Other),
            None => Err(self.eof_error(inside)),
        }
    }

    /// Consumes `want` (after whitespace).
    #[inline]
    fn expect(&mut self, want: u8, inside: &str) -> Result<(), ScanError> {
        if self.pos < self.end && self.buf[self.pos] == want {
            self.pos += 1;
            return Ok(());
        }
        match self.peek()? {
            Some(b) if b == want => {
                self.pos += 1;
                Ok(())
            }
            Some(b) => Err(self.syntax(format!(
                "expected `{}` but found {}",
                want as char,
                show_byte(b)
            ))),
            None => Err(self.eof_error(inside)),
        }
    }

    /// Consumes the `{` of an object.
    pub(super) fn begin_object(&mut self) -> Result<(), ScanError> {
        self.expect(b'{', "an object")
    }

    /// The next key of an object (its text in [`Scanner::text`], the `:` consumed), or `None`
    /// after its `}`. `first` is `true` before the first key and is cleared here.
    pub(super) fn next_key(&mut self, first: &mut bool) -> Result<Option<&[u8]>, ScanError> {
        let b = self.peek()?.ok_or_else(|| self.eof_error("an object"))?;
        if b == b'}' {
            self.pos += 1;
            return Ok(None);
        }
        if !*first {
            if b != b',' {
                return Err(self.syntax(format!(
                    "expected `,` or `}}` after a value in an object but found {}",
                    show_byte(b)
                )));
            }
            self.pos += 1;
        }
        *first = false;
        match self.peek()? {
            Some(b'"') => {}
            Some(b) => {
                return Err(self.syntax(format!(
                    "expected a key (a string) but found {}",
                    show_byte(b)
                )))
            }
            None => return Err(self.eof_error("an object")),
        }
        self.pos += 1;
        self.read_string()?;
        if self.pos < self.end && self.buf[self.pos] == b':' {
            self.pos += 1;
        } else {
            // Finding the `:` may read the next chunk, over the key's bytes: keep a copy.
            if let Some((start, end)) = self.in_buf.take() {
                self.scratch.clear();
                self.scratch.extend_from_slice(&self.buf[start..end]);
            }
            self.expect(b':', "an object")?;
        }
        Ok(Some(self.text()))
    }

    /// Consumes the `[` of an array.
    pub(super) fn begin_array(&mut self) -> Result<(), ScanError> {
        self.expect(b'[', "an array")
    }

    /// `true` when the array has another element (the `,` before it consumed), `false` after its
    /// `]`. `first` is `true` before the first element and is cleared here.
    pub(super) fn next_element(&mut self, first: &mut bool) -> Result<bool, ScanError> {
        let b = self.peek()?.ok_or_else(|| self.eof_error("an array"))?;
        if b == b']' {
            self.pos += 1;
            return Ok(false);
        }
        if !*first {
            if b != b',' {
                return Err(self.syntax(format!(
                    "expected `,` or `]` after a value in an array but found {}",
                    show_byte(b)
                )));
            }
            self.pos += 1;
        }
        *first = false;
        Ok(true)
    }

    /// The text of the last string or key read (checked UTF-8).
    pub(super) fn text(&self) -> &[u8] {
        match self.in_buf {
            Some((start, end)) => &self.buf[start..end],
            None => &self.scratch,
        }
    }

    /// Reads a string's characters after its opening quote into `scratch`, escapes decoded.
    fn read_string(&mut self) -> Result<(), ScanError> {
        // The common case: no escape, and the closing quote in this chunk.
        let start = self.pos;
        let buf = &self.buf[..self.end];
        let mut i = start;
        while i < buf.len() && buf[i] != b'"' && buf[i] != b'\\' && buf[i] >= 0x20 {
            i += 1;
        }
        if i < buf.len() && buf[i] == b'"' {
            let text = &buf[start..i];
            if !text.is_ascii() && std::str::from_utf8(text).is_err() {
                return Err(self.syntax("a string is not valid UTF-8"));
            }
            self.in_buf = Some((start, i));
            self.pos = i + 1;
            return Ok(());
        }
        self.in_buf = None;
        self.scratch.clear();
        loop {
            let start = self.pos;
            let mut i = start;
            let buf = &self.buf[..self.end];
            while i < buf.len() {
                let b = buf[i];
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                i += 1;
            }
            self.scratch.extend_from_slice(&buf[start..i]);
            self.pos = i;
            if i == self.end {
                if !self.refill()? {
                    return Err(self.eof_error("a string"));
                }
                continue;
            }
            let b = buf[i];
            self.pos += 1;
            match b {
                b'"' => break,
                b'\\' => self.read_escape()?,
                _ => {
                    self.pos -= 1;
                    return Err(self.syntax(format!(
                        "control character {} inside a string (JSON needs it escaped)",
                        show_byte(b)
                    )));
                }
            }
        }
        if !self.scratch.is_ascii() && std::str::from_utf8(&self.scratch).is_err() {
            return Err(self.syntax("a string is not valid UTF-8"));
        }
        Ok(())
    }

    fn read_escape(&mut self) -> Result<(), ScanError> {
        let b = self
            .next_byte()?
            .ok_or_else(|| self.eof_error("a string"))?;
        let c = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let hi = self.read_hex4()?;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    // A surrogate pair: `\uD83D\uDE00`.
                    if self.next_byte()? != Some(b'\\') || self.next_byte()? != Some(b'u') {
                        return Err(self.syntax("a lone surrogate in a \\u escape"));
                    }
                    let lo = self.read_hex4()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return Err(self.syntax("a lone surrogate in a \\u escape"));
                    }
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                let ch = char::from_u32(code)
                    .ok_or_else(|| self.syntax("a lone surrogate in a \\u escape"))?;
                let mut utf8 = [0u8; 4];
                self.scratch
                    .extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
                return Ok(());
            }
            other => {
                return Err(self.syntax(format!("invalid escape `\\{}` in a string", other as char)))
            }
        };
        self.scratch.push(c);
        Ok(())
    }

    fn read_hex4(&mut self) -> Result<u32, ScanError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let b = self
                .next_byte()?
                .ok_or_else(|| self.eof_error("a string"))?;
            let d = (b as char)
                .to_digit(16)
                .ok_or_else(|| self.syntax("a \\u escape needs 4 hex digits"))?;
            v = v * 16 + d;
        }
        Ok(v)
    }

    /// Reads a value that is not an object or array.
    pub(super) fn scalar(&mut self) -> Result<Scalar, ScanError> {
        let next = self.peek()?;
        let at = self.offset();
        match next {
            None => return Err(self.eof_error("a value")),
            Some(b'"') => {
                self.pos += 1;
                self.read_string()?;
                return Ok(Scalar::String);
            }
            Some(b) if is_token_byte(b) => {}
            Some(b) => {
                return Err(self.syntax(format!("expected a value but found {}", show_byte(b))))
            }
        }
        // A number or word: read in place when the chunk holds all of it (the common case).
        let start = self.pos;
        let mut i = start;
        while i < self.end && is_token_byte(self.buf[i]) {
            i += 1;
        }
        let (scalar, int) = if i < self.end || self.eof {
            self.pos = i;
            token(&self.buf[start..i], at)?
        } else {
            self.scratch.clear();
            self.scratch.extend_from_slice(&self.buf[start..i]);
            self.pos = i;
            while self.refill()? {
                let mut j = 0;
                while j < self.end && is_token_byte(self.buf[j]) {
                    j += 1;
                }
                self.scratch.extend_from_slice(&self.buf[..j]);
                self.pos = j;
                if j < self.end {
                    break;
                }
            }
            token(&self.scratch, at)?
        };
        self.last_int = int;
        Ok(scalar)
    }

    /// The last number read as a non-negative integer, if it was written as one (`12`, not
    /// `12.0` or `-1`) and fits a u64.
    pub(super) fn last_as_u64(&self) -> Option<u64> {
        self.last_int
    }

    /// Skips one value of any kind, checking its syntax. `depth` is the nesting of the value.
    pub(super) fn skip_value(&mut self, depth: usize) -> Result<(), ScanError> {
        if depth > MAX_DEPTH {
            return Err(self.syntax(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        match self.next_kind("a value")? {
            Next::Object => {
                self.begin_object()?;
                let mut first = true;
                while self.next_key(&mut first)?.is_some() {
                    self.skip_value(depth + 1)?;
                }
            }
            Next::Array => {
                self.begin_array()?;
                let mut first = true;
                while self.next_element(&mut first)? {
                    self.skip_value(depth + 1)?;
                }
            }
            Next::String | Next::Other => {
                self.scalar()?;
            }
        }
        Ok(())
    }

    /// Checks that only whitespace follows the top-level value.
    pub(super) fn finish(&mut self) -> Result<(), ScanError> {
        match self.peek()? {
            None => Ok(()),
            Some(b) => Err(self.syntax(format!(
                "{} after the end of the JSON document (only whitespace may follow it)",
                show_byte(b)
            ))),
        }
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')
}

/// A number or word (`null`, `true`, `NaN` ...) starting at byte `at`; and its value when it is
/// a non-negative integer.
fn token(word: &[u8], at: u64) -> Result<(Scalar, Option<u64>), ScanError> {
    let scalar = match word {
        b"null" => Scalar::Null,
        b"true" => Scalar::Bool(true),
        b"false" => Scalar::Bool(false),
        b"NaN" => Scalar::Number(f64::NAN),
        b"Infinity" => Scalar::Number(f64::INFINITY),
        b"-Infinity" => Scalar::Number(f64::NEG_INFINITY),
        _ if is_json_number(word) => {
            if word.iter().all(u8::is_ascii_digit) {
                let int = word.iter().try_fold(0u64, |acc, &d| {
                    acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                });
                if let Some(v) = int {
                    return Ok((Scalar::Number(v as f64), Some(v)));
                }
            }
            // JSON's grammar was checked: ASCII digits, `-`, `.`, `e`; Rust parses it exactly.
            let text = std::str::from_utf8(word).unwrap_or_default();
            Scalar::Number(text.parse().map_err(|_| ScanError::Syntax {
                offset: at,
                detail: format!("`{text}` is not a number"),
            })?)
        }
        _ => {
            return Err(ScanError::Syntax {
                offset: at,
                detail: format!(
                    "`{}` is not a JSON value",
                    String::from_utf8_lossy(word)
                        .chars()
                        .take(40)
                        .collect::<String>()
                ),
            })
        }
    };
    Ok((scalar, None))
}

/// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
fn is_json_number(w: &[u8]) -> bool {
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < w.len() && w[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if w.first() == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    let n = digits(&mut i);
    if n == 0 || (n > 1 && w[int_start] == b'0') {
        return false;
    }
    if w.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    }
    if matches!(w.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(w.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == w.len()
}

fn show_byte(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("`{}`", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// A reader that gives at most `.1` bytes per read, so tokens straddle the scanner's chunks
/// (the tests of the scanner and of the dump.json reader).
#[cfg(test)]
pub(super) struct Slow<'a>(pub(super) &'a [u8], pub(super) usize);

#[cfg(test)]
impl Read for Slow<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.len().min(self.1).min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every scalar of a document, in order (keys excluded), or the error's offset and text.
    fn scalars(text: &str, chunk: usize) -> Result<Vec<String>, (u64, String)> {
        fn walk<R: Read>(s: &mut Scanner<R>, out: &mut Vec<String>) -> Result<(), ScanError> {
            match s.next_kind("a value")? {
                Next::Object => {
                    s.begin_object()?;
                    let mut first = true;
                    while let Some(k) = s.next_key(&mut first)? {
                        out.push(format!("{}:", String::from_utf8_lossy(k)));
                        walk(s, out)?;
                    }
                }
                Next::Array => {
                    s.begin_array()?;
                    let mut first = true;
                    while s.next_element(&mut first)? {
                        walk(s, out)?;
                    }
                }
                _ => match s.scalar()? {
                    Scalar::String => out.push(format!("{:?}", String::from_utf8_lossy(s.text()))),
                    other => out.push(format!("{other:?}")),
                },
            }
            Ok(())
        }
        let mut s = Scanner::new(Slow(text.as_bytes(), chunk));
        let mut out = Vec::new();
        let r = walk(&mut s, &mut out).and_then(|()| s.finish());
        match r {
            Ok(()) => Ok(out),
            Err(ScanError::Syntax { offset, detail }) => Err((offset, detail)),
            Err(ScanError::Io(e)) => Err((0, e.to_string())),
        }
    }

    #[test]
    fn values_escapes_and_python_literals_in_any_chunking() {
        let doc = r#" {"a": [1, -2.5e-3, 0, NaN, Infinity, -Infinity], "b\"\u00e9\ud83d\ude00": "x\\y\n",
                     "c": {"d": null, "e": true, "f": false}, "g": []} "#;
        let want = vec![
            "a:",
            "Number(1.0)",
            "Number(-0.0025)",
            "Number(0.0)",
            "Number(NaN)",
            "Number(inf)",
            "Number(-inf)",
            "b\"é😀:",
            "\"x\\\\y\\n\"",
            "c:",
            "d:",
            "Null",
            "e:",
            "Bool(true)",
            "f:",
            "Bool(false)",
            "g:",
        ];
        for chunk in [1, 2, 3, 7, 4096] {
            assert_eq!(scalars(doc, chunk).unwrap(), want, "chunk {chunk}");
        }
    }

    #[test]
    fn bad_json_is_an_error_with_its_offset() {
        let cases: &[(&str, u64, &str)] = &[
            ("{\"a\": 1} x", 9, "after the end of the JSON document"),
            ("{\"a\": 1}{}", 8, "after the end"),
            ("{\"a\": 1", 7, "the file ends inside an object"),
            ("{\"a\": [1, 2", 11, "ends inside an array"),
            ("{\"a\": \"abc", 10, "ends inside a string"),
            ("{\"a\" 1}", 5, "expected `:`"),
            ("{\"a\": 1 \"b\": 2}", 8, "expected `,` or `}`"),
            ("{\"a\": 01}", 6, "`01` is not a JSON value"),
            ("{\"a\": 1.}", 6, "is not a JSON value"),
            ("{\"a\": nan}", 6, "`nan` is not a JSON value"),
            ("{\"a\": \"\\x\"}", 9, "invalid escape"),
            ("{\"a\": \"\t\"}", 7, "control character"),
            ("{a: 1}", 1, "expected a key"),
            ("[1,]", 3, "expected a value"),
            ("", 0, "ends inside a value"),
        ];
        for &(doc, offset, detail) in cases {
            let (at, text) = scalars(doc, 3).unwrap_err();
            assert!(text.contains(detail), "{doc:?}: {text}");
            assert_eq!(at, offset, "{doc:?}: {text}");
        }
        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        let mut s = Scanner::new(deep.as_bytes());
        match s.skip_value(0) {
            Err(ScanError::Syntax { detail, .. }) => assert!(detail.contains("nested deeper")),
            other => panic!("{other:?}"),
        }
        let bad_utf8: &[u8] = b"\"\xff\"";
        let mut s = Scanner::new(bad_utf8);
        assert!(matches!(s.scalar(), Err(ScanError::Syntax { .. })));
    }

    #[test]
    fn integers_are_told_from_other_numbers() {
        for (text, want) in [
            ("12", Some(12)),
            ("12.0", None),
            ("-1", None),
            ("1e3", None),
        ] {
            let mut s = Scanner::new(text.as_bytes());
            assert!(matches!(s.scalar().unwrap(), Scalar::Number(_)));
            assert_eq!(s.last_as_u64(), want, "{text}");
        }
    }
}
