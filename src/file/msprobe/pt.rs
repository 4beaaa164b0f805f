//! PyTorch's `.pt` files (`torch.save` of one tensor), as msprobe's PyTorch tensor mode writes
//! them: a zip archive, stored without compression, of `{archive}/data.pkl` (a pickle that
//! rebuilds the tensor from a storage: `torch._utils._rebuild_tensor_v2(storage, offset, size,
//! stride, ...)`), `{archive}/data/{key}` (the storage's raw little-endian bytes) and
//! `{archive}/byteorder`.
//!
//! [`Archive::open`] reads only the zip's directory and the pickle, which a small interpreter
//! runs (the opcodes `torch.save` emits, protocols 2 to 5; anything that is not a plain tensor
//! is refused, and nothing is executed). [`Archive::checksum`] gives msprobe's md5-mode checksum
//! of the tensor, the CRC-32 of its bytes, from the zip directory when the storage is exactly
//! the tensor (what msprobe saves: `clone().contiguous()`), so comparing tensor dumps reads no
//! tensor data; [`Archive::elements`] reads the storage, checks its CRC-32 against the zip's, and
//! gathers the elements in row-major order. Every offset and size read from the file is checked
//! against the file's length before it is used.
//!
//! Limits: compressed entries (never written by `torch.save`), big-endian archives, and storage
//! types other than float, double, half, bfloat16, long, int, short, char (int8), byte, bool,
//! complex float and complex double are refused; so are the tensors torch saves with an untyped
//! storage and `_rebuild_tensor_v3` (uint16 and the float8 dtypes).

use super::Elements;
use crate::value::tensor::DType;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::Path;

/// Why a `.pt` file cannot be read (the caller names the file).
pub(super) type PtError = String;

/// The largest `data.pkl` read: a single tensor's pickle is a few hundred bytes.
const MAX_PICKLE: u64 = 1 << 20;

/// A zip entry: where its bytes are and their CRC-32.
#[derive(Debug, Clone)]
struct ZipEntry {
    name: String,
    crc32: u32,
    size: u64,
    method: u16,
    local_header: u64,
}

/// An opened `.pt` file: its tensor's description and where its storage is.
pub(super) struct Archive {
    file: File,
    len: u64,
    storage: ZipEntry,
    meta: TensorMeta,
}

/// What `data.pkl` says: the storage's dtype, key and length, and the view of it.
#[derive(Debug, Clone, PartialEq)]
struct TensorMeta {
    dtype: DType,
    key: String,
    numel: u64,
    offset: u64,
    size: Vec<u64>,
    stride: Vec<u64>,
}

fn io(what: &str, e: &std::io::Error) -> PtError {
    format!("cannot {what}: {e}")
}

impl Archive {
    /// Reads the zip directory and the pickle of a `.pt` file.
    pub(super) fn open(path: &Path) -> Result<Archive, PtError> {
        let mut file = crate::file::open_input(path).map_err(|e| io("open", &e))?;
        let len = file.metadata().map_err(|e| io("read", &e))?.len();
        let entries = read_directory(&mut file, len)?;
        let pickle = entries
            .iter()
            .find(|e| e.name == "data.pkl" || e.name.ends_with("/data.pkl"))
            .ok_or("not a torch.save archive: no data.pkl in the zip")?;
        let prefix = &pickle.name[..pickle.name.len() - "data.pkl".len()];
        if let Some(order) = entries
            .iter()
            .find(|e| e.name == format!("{prefix}byteorder"))
        {
            let bytes = read_entry(&mut file, len, order, 16)?;
            if bytes != b"little" {
                return Err(format!(
                    "byteorder `{}`: only little-endian archives are read",
                    String::from_utf8_lossy(&bytes)
                ));
            }
        }
        let program = read_entry(&mut file, len, pickle, MAX_PICKLE)?;
        let meta = unpickle(&program)?;
        let storage_name = format!("{prefix}data/{}", meta.key);
        let storage = entries
            .iter()
            .find(|e| e.name == storage_name)
            .ok_or_else(|| {
                format!("the pickle names storage `{storage_name}`, which the zip lacks")
            })?
            .clone();
        let element = meta.dtype.size_of() as u64;
        let want = meta.numel.checked_mul(element);
        if want != Some(storage.size) {
            return Err(format!(
                "storage `{storage_name}` holds {} bytes, but the pickle says {} elements of {}",
                storage.size,
                meta.numel,
                meta.dtype.name()
            ));
        }
        // The view holds at most its storage's elements (msprobe saves a contiguous clone, which
        // holds exactly them), and the last element it reaches lies inside the storage.
        let count = meta
            .size
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d));
        if count.is_none_or(|c| c > meta.numel) {
            return Err(format!(
                "the tensor's shape {:?} holds more elements than its storage ({})",
                meta.size, meta.numel
            ));
        }
        if meta.size.iter().all(|&d| d > 0) {
            let last = meta
                .size
                .iter()
                .zip(&meta.stride)
                .try_fold(meta.offset, |acc, (&d, &s)| {
                    (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
                });
            if last.is_none_or(|l| l >= meta.numel) {
                return Err(format!(
                    "the tensor's view (offset {}, size {:?}, stride {:?}) reaches past its storage of {} elements",
                    meta.offset, meta.size, meta.stride, meta.numel
                ));
            }
        }
        Ok(Archive {
            file,
            len,
            storage,
            meta,
        })
    }

    /// The number of elements of the view.
    fn count(&self) -> Option<u64> {
        self.meta
            .size
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// `true` when the view is the whole storage in row-major order.
    fn is_whole_storage(&self) -> bool {
        let mut expect = 1u64;
        for (&d, &s) in self.meta.size.iter().zip(&self.meta.stride).rev() {
            if d != 1 && s != expect {
                return false;
            }
            expect = expect.saturating_mul(d);
        }
        self.meta.offset == 0 && self.count() == Some(self.meta.numel)
    }

    /// msprobe's md5-mode checksum of the tensor: the CRC-32 of its row-major bytes.
    pub(super) fn checksum(&mut self) -> Result<u32, PtError> {
        if self.is_whole_storage() {
            return Ok(self.storage.crc32);
        }
        Ok(crc32fast::hash(&self.elements()?.bytes))
    }

    /// The elements, in row-major order; the storage's CRC-32 is checked against the zip's.
    pub(super) fn elements(&mut self) -> Result<Elements, PtError> {
        let storage = read_entry(&mut self.file, self.len, &self.storage, u64::MAX)?;
        if crc32fast::hash(&storage) != self.storage.crc32 {
            return Err(format!(
                "storage `{}` does not match its CRC-32 (the file is damaged)",
                self.storage.name
            ));
        }
        let shape: Vec<usize> = self
            .meta
            .size
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
            .collect::<Result<_, _>>()?;
        let size = self.meta.dtype.size_of();
        let bytes = if self.is_whole_storage() {
            storage
        } else {
            gather(&storage, size, &self.meta)
        };
        if self.meta.dtype == DType::Bool {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(format!(
                    "bool element {i} is the byte {}, not 0 or 1",
                    bytes[i]
                ));
            }
        }
        Ok(Elements {
            dtype: self.meta.dtype,
            shape,
            bytes,
        })
    }
}

/// Copies a strided view's elements in row-major order (bounds checked by [`Archive::open`]).
fn gather(storage: &[u8], size: usize, meta: &TensorMeta) -> Vec<u8> {
    let count: u64 = meta.size.iter().product();
    let mut out = Vec::with_capacity(count as usize * size);
    if count == 0 {
        return out;
    }
    let mut index = vec![0u64; meta.size.len()];
    for _ in 0..count {
        let at = meta.offset
            + index
                .iter()
                .zip(&meta.stride)
                .map(|(i, s)| i * s)
                .sum::<u64>();
        let at = at as usize * size;
        out.extend_from_slice(&storage[at..at + size]);
        for k in (0..index.len()).rev() {
            index[k] += 1;
            if index[k] < meta.size[k] {
                break;
            }
            index[k] = 0;
        }
    }
    out
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads `len` bytes at `offset`, checked against the file's length.
fn read_at(file: &mut File, file_len: u64, offset: u64, len: u64) -> Result<Vec<u8>, PtError> {
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(format!(
            "truncated: {len} bytes at offset {offset} lie past the end of the file ({file_len} bytes)"
        ));
    }
    let len = usize::try_from(len).map_err(|_| format!("{len} bytes do not fit in memory"))?;
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.read_exact(&mut buf))
        .map_err(|e| io("read", &e))?;
    Ok(buf)
}

/// The entries of the zip's central directory (zip64 included).
fn read_directory(file: &mut File, len: u64) -> Result<Vec<ZipEntry>, PtError> {
    const EOCD: u32 = 0x0605_4b50;
    let tail_len = len.min(22 + 0xffff);
    let tail = read_at(file, len, len - tail_len, tail_len)?;
    let at = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(&tail, i) == EOCD)
        .ok_or("not a zip archive (no end of central directory): truncated, or not a .pt file")?;
    let eocd_offset = len - tail_len + at as u64;
    let e = &tail[at..];
    let mut count = u64::from(u16_at(e, 10));
    let mut cd_size = u64::from(u32_at(e, 12));
    let mut cd_offset = u64::from(u32_at(e, 16));
    if count == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
        // Zip64: a locator 20 bytes before the end record points at the zip64 end record.
        let locator = eocd_offset
            .checked_sub(20)
            .ok_or("truncated zip64 archive: no zip64 locator")?;
        let loc = read_at(file, len, locator, 20)?;
        if u32_at(&loc, 0) != 0x0706_4b50 {
            return Err("zip64 archive without its zip64 locator".into());
        }
        let record = read_at(file, len, u64_at(&loc, 8), 56)?;
        if u32_at(&record, 0) != 0x0606_4b50 {
            return Err("zip64 locator points at no zip64 end record".into());
        }
        count = u64_at(&record, 32);
        cd_size = u64_at(&record, 40);
        cd_offset = u64_at(&record, 48);
    }
    if cd_size > len {
        return Err(format!(
            "the central directory claims {cd_size} bytes in a file of {len}"
        ));
    }
    let cd = read_at(file, len, cd_offset, cd_size)?;
    let mut entries = Vec::new();
    let mut p = 0usize;
    for _ in 0..count {
        let fixed = cd.get(p..p + 46).ok_or("truncated central directory")?;
        if u32_at(fixed, 0) != 0x0201_4b50 {
            return Err(format!(
                "bad central directory entry at offset {}",
                cd_offset + p as u64
            ));
        }
        let method = u16_at(fixed, 10);
        let crc32 = u32_at(fixed, 16);
        let mut compressed = u64::from(u32_at(fixed, 20));
        let mut size = u64::from(u32_at(fixed, 24));
        let (name_len, extra_len, comment_len) = (
            usize::from(u16_at(fixed, 28)),
            usize::from(u16_at(fixed, 30)),
            usize::from(u16_at(fixed, 32)),
        );
        let mut local_header = u64::from(u32_at(fixed, 42));
        let name = cd
            .get(p + 46..p + 46 + name_len)
            .ok_or("truncated central directory")?;
        let name = String::from_utf8_lossy(name).into_owned();
        let extra = cd
            .get(p + 46 + name_len..p + 46 + name_len + extra_len)
            .ok_or("truncated central directory")?;
        // The zip64 extra field holds, in this order, the fields set to 0xffffffff above.
        let mut x = 0;
        while x + 4 <= extra.len() {
            let (id, n) = (u16_at(extra, x), usize::from(u16_at(extra, x + 2)));
            let body = extra
                .get(x + 4..x + 4 + n)
                .ok_or("truncated zip extra field")?;
            if id == 1 {
                let mut values = body.chunks_exact(8).map(|c| u64_at(c, 0));
                for field in [&mut size, &mut compressed, &mut local_header] {
                    if *field == 0xffff_ffff {
                        *field = values.next().ok_or("truncated zip64 extra field")?;
                    }
                }
            }
            x += 4 + n;
        }
        if method == 0 && compressed != size {
            return Err(format!("entry `{name}` is stored with two different sizes"));
        }
        entries.push(ZipEntry {
            name,
            crc32,
            size,
            method,
            local_header,
        });
        p += 46 + name_len + extra_len + comment_len;
    }
    Ok(entries)
}

/// An entry's bytes (at most `max` of them), through its local header.
fn read_entry(file: &mut File, len: u64, e: &ZipEntry, max: u64) -> Result<Vec<u8>, PtError> {
    if e.method != 0 {
        return Err(format!(
            "entry `{}` is compressed (method {}); torch.save stores entries uncompressed",
            e.name, e.method
        ));
    }
    if e.size > max {
        return Err(format!(
            "entry `{}` is {} bytes, more than {max}",
            e.name, e.size
        ));
    }
    let header = read_at(file, len, e.local_header, 30)?;
    if u32_at(&header, 0) != 0x0403_4b50 {
        return Err(format!(
            "entry `{}` has no local header at offset {}",
            e.name, e.local_header
        ));
    }
    let skip = 30 + u64::from(u16_at(&header, 26)) + u64::from(u16_at(&header, 28));
    read_at(file, len, e.local_header + skip, e.size)
}

/// The values of the pickle machine.
#[derive(Debug, Clone, PartialEq)]
enum Py {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    /// Items and nesting depth.
    Tuple(Vec<Py>, u32),
    List(Vec<Py>, u32),
    /// A dict's contents are not needed (backward hooks, metadata).
    Dict,
    Global(String, String),
    Storage {
        dtype: DType,
        key: String,
        numel: u64,
    },
    Tensor(TensorMeta),
}

/// Deeper nesting than this is refused (a tensor's pickle nests 3 levels).
const MAX_NESTING: u32 = 32;

fn depth_of(items: &[Py]) -> u32 {
    1 + items
        .iter()
        .map(|p| match p {
            Py::Tuple(_, d) | Py::List(_, d) => *d,
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

fn storage_dtype(name: &str) -> Option<DType> {
    Some(match name {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "LongStorage" => DType::I64,
        "IntStorage" => DType::I32,
        "ByteStorage" => DType::U8,
        "BoolStorage" => DType::Bool,
        "CharStorage" => DType::I8,
        "ShortStorage" => DType::I16,
        "ComplexFloatStorage" => DType::C64,
        "ComplexDoubleStorage" => DType::C128,
        _ => return None,
    })
}

/// Runs a pickle that rebuilds one tensor; returns what it describes.
fn unpickle(code: &[u8]) -> Result<TensorMeta, PtError> {
    let mut m = Unpickler {
        code,
        i: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: std::collections::HashMap::new(),
    };
    loop {
        let op = *m.take(1)?.first().expect("one byte");
        match op {
            0x80 => {
                m.take(1)?; // PROTO
            }
            0x95 => {
                m.take(8)?; // FRAME
            }
            b'c' => m.global()?,
            0x93 => m.stack_global()?,
            b'q' | b'r' | 0x94 => m.memoize(op)?,
            b'h' | b'j' => m.recall(op)?,
            b'(' => m.marks.push(m.stack.len()),
            b't' => {
                let items = m.since_mark()?;
                m.stack.push(tuple(items)?);
            }
            b')' => m.stack.push(Py::Tuple(Vec::new(), 1)),
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                if m.stack.len() < n {
                    return Err(bad("stack underflow".into()));
                }
                let items = m.stack.split_off(m.stack.len() - n);
                m.stack.push(tuple(items)?);
            }
            b']' => m.stack.push(Py::List(Vec::new(), 1)),
            b'a' | b'e' => m.append(op)?,
            b'}' => m.stack.push(Py::Dict),
            b's' | b'u' => m.set_items(op)?,
            b'X' | 0x8c | 0x8d => m.unicode(op)?,
            b'J' | b'K' | b'M' | 0x8a => m.int(op)?,
            b'G' => {
                let v = f64::from_be_bytes(m.take(8)?.try_into().expect("8 bytes"));
                m.stack.push(Py::Float(v));
            }
            0x88 => m.stack.push(Py::Bool(true)),
            0x89 => m.stack.push(Py::Bool(false)),
            b'N' => m.stack.push(Py::None),
            b'Q' => m.persistent_id()?,
            b'R' => m.reduce()?,
            b'.' => {
                return match m.stack.pop() {
                    Some(Py::Tensor(meta)) => Ok(meta),
                    _ => Err(bad("the pickle is not a single tensor".into())),
                };
            }
            other => return Err(bad(format!("opcode 0x{other:02x} is not supported"))),
        }
    }
}

/// An error in `data.pkl`.
fn bad(what: String) -> PtError {
    format!("data.pkl: {what}")
}

/// A tuple of `items`, refused when nested deeper than [`MAX_NESTING`].
fn tuple(items: Vec<Py>) -> Result<Py, PtError> {
    let d = depth_of(&items);
    if d > MAX_NESTING {
        return Err(bad(format!("nested deeper than {MAX_NESTING} levels")));
    }
    Ok(Py::Tuple(items, d))
}

/// The state of [`unpickle`]'s interpreter: the pickle, the next opcode's offset, the stack, the
/// marks and the memo.
struct Unpickler<'c> {
    code: &'c [u8],
    i: usize,
    stack: Vec<Py>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u32, Py>,
}

impl<'c> Unpickler<'c> {
    /// The next `n` bytes of the pickle, consumed.
    fn take(&mut self, n: usize) -> Result<&'c [u8], PtError> {
        let s = self
            .code
            .get(self.i..self.i.saturating_add(n))
            .ok_or_else(|| bad("ends inside an opcode (truncated)".into()))?;
        self.i += n;
        Ok(s)
    }

    /// The top of the stack, popped.
    fn pop(&mut self) -> Result<Py, PtError> {
        self.stack
            .pop()
            .ok_or_else(|| bad("stack underflow".into()))
    }

    /// The items above the last mark, popped with it.
    fn since_mark(&mut self) -> Result<Vec<Py>, PtError> {
        let m = self.marks.pop().ok_or_else(|| bad("no mark".into()))?;
        if m > self.stack.len() {
            return Err(bad("mark above the stack".into()));
        }
        Ok(self.stack.split_off(m))
    }

    /// GLOBAL: `module\nname\n`, pushed as a global.
    fn global(&mut self) -> Result<(), PtError> {
        // GLOBAL "module\nname\n"
        let rest = &self.code[self.i..];
        let nl1 = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("bad GLOBAL".into()))?;
        let nl2 = rest[nl1 + 1..]
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| bad("bad GLOBAL".into()))?;
        let module = String::from_utf8_lossy(&rest[..nl1]).into_owned();
        let name = String::from_utf8_lossy(&rest[nl1 + 1..nl1 + 1 + nl2]).into_owned();
        self.i += nl1 + nl2 + 2;
        self.stack.push(Py::Global(module, name));
        Ok(())
    }

    /// STACK_GLOBAL: the global named by the two strings on top of the stack.
    fn stack_global(&mut self) -> Result<(), PtError> {
        // STACK_GLOBAL
        let (name, module) = (self.pop()?, self.pop()?);
        match (module, name) {
            (Py::Str(m), Py::Str(n)) => self.stack.push(Py::Global(m, n)),
            _ => return Err(bad("STACK_GLOBAL of non-strings".into())),
        }
        Ok(())
    }

    /// BINPUT, LONG_BINPUT and MEMOIZE (`op`): the top of the stack, kept in the memo.
    fn memoize(&mut self, op: u8) -> Result<(), PtError> {
        let key = match op {
            b'q' => u32::from(self.take(1)?[0]),
            b'r' => u32_at(self.take(4)?, 0),
            _ => self.memo.len() as u32,
        };
        let top = self
            .stack
            .last()
            .ok_or_else(|| bad("memo of an empty stack".into()))?;
        self.memo.insert(key, top.clone());
        Ok(())
    }

    /// BINGET and LONG_BINGET (`op`): a memo entry, pushed.
    fn recall(&mut self, op: u8) -> Result<(), PtError> {
        let key = if op == b'h' {
            u32::from(self.take(1)?[0])
        } else {
            u32_at(self.take(4)?, 0)
        };
        let v = self
            .memo
            .get(&key)
            .ok_or_else(|| bad(format!("memo {key} is unset")))?;
        self.stack.push(v.clone());
        Ok(())
    }

    /// APPEND and APPENDS (`op`): items added to the list below them.
    fn append(&mut self, op: u8) -> Result<(), PtError> {
        let items = if op == b'a' {
            vec![self.pop()?]
        } else {
            self.since_mark()?
        };
        match self.stack.last_mut() {
            Some(Py::List(list, depth)) => {
                list.extend(items);
                *depth = depth_of(list);
                if *depth > MAX_NESTING {
                    return Err(bad(format!("nested deeper than {MAX_NESTING} levels")));
                }
            }
            _ => return Err(bad("APPEND to a non-list".into())),
        }
        Ok(())
    }

    /// SETITEM and SETITEMS (`op`): items set in the dict below them (a dict's items are not
    /// kept).
    fn set_items(&mut self, op: u8) -> Result<(), PtError> {
        if op == b's' {
            self.pop()?;
            self.pop()?;
        } else {
            self.since_mark()?;
        }
        if self.stack.last() != Some(&Py::Dict) {
            return Err(bad("SETITEM on a non-dict".into()));
        }
        Ok(())
    }

    /// BINUNICODE, SHORT_BINUNICODE and BINUNICODE8 (`op`): a UTF-8 string, pushed.
    fn unicode(&mut self, op: u8) -> Result<(), PtError> {
        let n = match op {
            b'X' => u64::from(u32_at(self.take(4)?, 0)),
            0x8c => u64::from(self.take(1)?[0]),
            _ => u64_at(self.take(8)?, 0),
        };
        let n = usize::try_from(n).map_err(|_| bad("string too long".into()))?;
        let b = self.take(n)?;
        let s = String::from_utf8(b.to_vec())
            .map(Py::Str)
            .map_err(|_| bad("a string is not UTF-8".into()))?;
        self.stack.push(s);
        Ok(())
    }

    /// BININT, BININT1, BININT2 and LONG1 (`op`): an integer, pushed.
    fn int(&mut self, op: u8) -> Result<(), PtError> {
        let v = match op {
            b'J' => i64::from(i32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            )),
            b'K' => i64::from(self.take(1)?[0]),
            b'M' => i64::from(u16_at(self.take(2)?, 0)),
            _ => {
                // LONG1: n little-endian two's complement bytes.
                let n = usize::from(self.take(1)?[0]);
                let b = self.take(n)?;
                if n > 8 {
                    return Err(bad("an integer wider than 64 bits".into()));
                }
                let mut v: i64 = if b.last().is_some_and(|&x| x & 0x80 != 0) {
                    -1
                } else {
                    0
                };
                for &x in b.iter().rev() {
                    v = (v << 8) | i64::from(x);
                }
                v
            }
        };
        self.stack.push(Py::Int(v));
        Ok(())
    }

    /// BINPERSID: the persistent id on top of the stack, a torch storage, pushed as one.
    fn persistent_id(&mut self) -> Result<(), PtError> {
        // BINPERSID: ('storage', torch.<X>Storage, key, location, numel)
        let pid = self.pop()?;
        let Py::Tuple(items, _) = pid else {
            return Err(bad("a persistent id that is not a tuple".into()));
        };
        match items.as_slice() {
            [Py::Str(kind), Py::Global(module, class), Py::Str(key), _, Py::Int(numel)]
                if kind == "storage" && module == "torch" =>
            {
                let dtype = storage_dtype(class)
                    .ok_or_else(|| bad(format!("storage type torch.{class} is not supported")))?;
                let numel =
                    u64::try_from(*numel).map_err(|_| bad("a negative storage size".into()))?;
                self.stack.push(Py::Storage {
                    dtype,
                    key: key.clone(),
                    numel,
                });
            }
            _ => return Err(bad("a persistent id that is not a torch storage".into())),
        }
        Ok(())
    }

    /// REDUCE: a call of one of the few functions that rebuild a tensor, its value pushed.
    fn reduce(&mut self) -> Result<(), PtError> {
        let (args, callable) = (self.pop()?, self.pop()?);
        let (Py::Global(module, name), Py::Tuple(args, _)) = (callable, args) else {
            return Err(bad("REDUCE of something other than a known function".into()));
        };
        let value = match (module.as_str(), name.as_str(), args.as_slice()) {
            (
                "torch._utils",
                "_rebuild_tensor_v2" | "_rebuild_tensor",
                [storage, offset, size, stride, ..],
            ) => rebuild_tensor(storage, offset, size, stride).map_err(bad)?,
            (
                "torch._utils",
                "_rebuild_parameter" | "_rebuild_parameter_with_state",
                [t @ Py::Tensor(_), ..],
            ) => t.clone(),
            ("collections", "OrderedDict", []) => Py::Dict,
            _ => {
                return Err(bad(format!(
                    "{module}.{name} is not a tensor (only a single tensor is read)"
                )))
            }
        };
        self.stack.push(value);
        Ok(())
    }
}

fn rebuild_tensor(storage: &Py, offset: &Py, size: &Py, stride: &Py) -> Result<Py, String> {
    let ints = |p: &Py| -> Option<Vec<u64>> {
        match p {
            Py::Tuple(items, _) => items
                .iter()
                .map(|x| match x {
                    Py::Int(v) => u64::try_from(*v).ok(),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    };
    let (Py::Storage { dtype, key, numel }, Py::Int(offset)) = (storage, offset) else {
        return Err("_rebuild_tensor_v2 without a storage and offset".into());
    };
    let offset = u64::try_from(*offset).map_err(|_| "a negative storage offset".to_owned())?;
    let size = ints(size).ok_or("a size that is not a tuple of non-negative integers")?;
    let stride = ints(stride).ok_or("a stride that is not a tuple of non-negative integers")?;
    if size.len() != stride.len() {
        return Err(format!(
            "size {size:?} and stride {stride:?} differ in length"
        ));
    }
    Ok(Py::Tensor(TensorMeta {
        dtype: *dtype,
        key: key.clone(),
        numel: *numel,
        offset,
        size,
        stride,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pickle `torch.save(torch.ones(2, 3))` writes (torch 2.15).
    const ONES_2X3: &[u8] = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01ctorch\nFloatStorage\nq\x02X\x01\x00\x00\x000q\x03X\x03\x00\x00\x00cpuq\x04K\x06tq\x05QK\x00K\x02K\x03\x86q\x06K\x03K\x01\x86q\x07\x89ccollections\nOrderedDict\nq\x08)Rq\ttq\nRq\x0b.";

    #[test]
    fn the_pickle_of_a_saved_tensor() {
        let meta = unpickle(ONES_2X3).unwrap();
        assert_eq!(
            meta,
            TensorMeta {
                dtype: DType::F32,
                key: "0".into(),
                numel: 6,
                offset: 0,
                size: vec![2, 3],
                stride: vec![3, 1],
            }
        );
        // Truncated anywhere, or holding something else: an error, never a panic.
        for n in 0..ONES_2X3.len() {
            assert!(unpickle(&ONES_2X3[..n]).is_err(), "{n}");
        }
        let os = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00lsq\x00\x85R.";
        assert!(unpickle(os)
            .unwrap_err()
            .contains("os.system is not a tensor"));
        let deep = [
            b"\x80\x02".to_vec(),
            vec![b')'],
            vec![0x85; 40],
            b".".to_vec(),
        ]
        .concat();
        assert!(unpickle(&deep).unwrap_err().contains("nested deeper"));
    }
}
