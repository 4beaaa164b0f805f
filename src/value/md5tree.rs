//! The tree digest: a record's digest, computed from independent 4 KiB chunks, so that SIMD lanes
//! on a CPU and thousands of threads on a GPU compute the same 16 bytes in parallel.
//!
//! Definition (docs/trace-format.md, "The digest"): with `C` = [`CHUNK_BYTES`] = 4096,
//!
//! ```text
//! D(x) = md5(x)                                              if len(x) <= C
//! D(x) = D(md5(x[0..C]) || md5(x[C..2C]) || ... || md5(x[(k-1)C..]))   otherwise
//! ```
//!
//! where `x` is a tensor's canonical bytes ([`crate::value::TensorView::bytes`]), the last chunk
//! may be shorter, and `||` concatenates the 16-byte digests. A tensor of at most one chunk (1,024
//! f32 values) is digested exactly as plain md5, as every record was before format version 3; a
//! larger one goes through one level of chunk digests per factor of 256 in size (two levels up to
//! 1 MiB, three up to 256 MiB). The Python package's Triton kernel (`detcheck/_torch/device.py`)
//! computes the same function on a GPU; golden vectors pin it on both sides.
//!
//! Main types: [`TreeLanes`], the streaming form (buffers in, digests out, chunks of every buffer
//! hashed side by side in [`Md5Lanes`]); [`tree_digest_of_many`], the one-call form;
//! [`DigestKind`], which digest a trace's records carry.
//!
//! Why 4 KiB: md5 is a chain of 64-byte blocks, so a chunk is hashed in `C / 64 + 1` dependent
//! block steps: on a GPU (about 0.7 us a block) a 64 KiB chunk would hold every record's kernel
//! for 0.7 ms, a 4 KiB one for 45 us; on a CPU every 16 chunks fill AVX-512's lanes, so a 64 KiB
//! tensor already runs at full width. The price is 1/64 more blocks (padding) and 16 bytes of
//! chunk digest per 4 KiB (0.4%).
//!
//! Invariant (one record digest, on every device): a record carries the tree digest of its
//! canonical bytes, whoever computes it (the recorder, the Python writer's thread, the Triton
//! kernel of `detcheck/_torch/device.py`, a program through `TraceWriter::record_digested`); golden
//! vectors pin it on both sides. Records of traces with different digests compare only up to one
//! chunk, where the kinds agree; beyond it the engine refuses (`DumpError::MixedDigests`), never
//! reports "differs".
//!
//! Determinism: a pure function of the bytes; lanes, widths, CPUs and GPUs give the same digest.
//! Limits: not a cryptographic commitment beyond md5's own (a record's dtype and shape are
//! compared beside it, so two tensors of different lengths never meet on one digest).

use crate::value::digest::Md5Digest;
use crate::value::md5x::Md5Lanes;
use crate::value::tensor::{Tensor, TensorView};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The chunk of the tree digest: 4 KiB.
pub const CHUNK_BYTES: usize = 4096;

/// Which digest a trace's records carry (its header says; docs/trace-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DigestKind {
    /// Plain md5 of the canonical bytes (trace format versions 1 and 2).
    #[serde(rename = "md5")]
    Md5,
    /// The tree digest of this module (format version 3 on).
    #[serde(rename = "md5-tree-4k")]
    Md5Tree4k,
}

impl DigestKind {
    /// The kind this version of detcheck writes.
    pub const CURRENT: DigestKind = DigestKind::Md5Tree4k;

    /// The name in trace headers and messages.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DigestKind::Md5 => "md5",
            DigestKind::Md5Tree4k => "md5-tree-4k",
        }
    }

    /// The kind named `name`, if any.
    #[must_use]
    pub fn from_name(name: &str) -> Option<DigestKind> {
        [DigestKind::Md5, DigestKind::Md5Tree4k]
            .into_iter()
            .find(|k| k.name() == name)
    }

    /// `true` when a record of `len` bytes has the same digest under both kinds: every kind is
    /// plain md5 up to one chunk, so such records compare across kinds.
    #[must_use]
    pub fn agree_at(self, other: DigestKind, len: usize) -> bool {
        self == other || len <= CHUNK_BYTES
    }
}

impl Default for DigestKind {
    /// [`DigestKind::CURRENT`].
    fn default() -> Self {
        DigestKind::CURRENT
    }
}

impl fmt::Display for DigestKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Md5Digest {
    /// A tensor's digest: the tree digest of its canonical bytes.
    #[must_use]
    pub fn of_tensor(tensor: &Tensor) -> Self {
        tensor.with_view(Md5Digest::of_view)
    }

    /// A view's digest: the tree digest of its canonical bytes, read in place.
    #[must_use]
    pub fn of_view(view: TensorView<'_>) -> Self {
        tree_digest(view.bytes())
    }
}

/// The tree digest of one buffer; its chunks are hashed side by side.
#[must_use]
pub fn tree_digest(bytes: &[u8]) -> Md5Digest {
    if bytes.len() <= CHUNK_BYTES {
        return Md5Digest::of_bytes(bytes);
    }
    tree_digest_of_many(&[bytes])[0]
}

/// The tree digest of each buffer, in order: every chunk of every buffer goes through the lanes.
#[must_use]
pub fn tree_digest_of_many(buffers: &[&[u8]]) -> Vec<Md5Digest> {
    let mut lanes: TreeLanes<&[u8], usize> = TreeLanes::new();
    let mut out = vec![Md5Digest([0; 16]); buffers.len()];
    for (i, buffer) in buffers.iter().enumerate() {
        lanes.push(buffer, i);
    }
    while !lanes.is_idle() {
        lanes.run(usize::MAX, |_, i, digest| out[i] = digest);
    }
    out
}

/// Part of a buffer (a chunk of the data, or of one level's chunk digests) in a lane.
enum Piece<B> {
    Data(Arc<B>, usize, usize),
    Digests(Arc<Vec<u8>>, usize, usize),
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for Piece<B> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Piece::Data(data, from, to) => &data.as_ref().as_ref()[*from..*to],
            Piece::Digests(digests, from, to) => &digests[*from..*to],
        }
    }
}

/// A buffer on its way through the levels.
struct Job<B, T> {
    data: Arc<B>,
    tag: T,
    /// This level's chunk digests, in chunk order.
    digests: Vec<u8>,
    /// Chunks of this level not hashed yet.
    remaining: usize,
}

/// Tree digests of buffers as they come: [`TreeLanes::push`] a buffer with a tag, call
/// [`TreeLanes::run`] until [`TreeLanes::is_idle`]; each buffer comes back with its tag and
/// digest once its last level is hashed. The buffers' chunks share the lanes, so one large buffer
/// fills them all.
pub struct TreeLanes<B, T> {
    lanes: Md5Lanes<Piece<B>, (usize, usize)>,
    /// Jobs by slot; `None` slots are free, and listed in `free`.
    jobs: Vec<Option<Job<B, T>>>,
    free: Vec<usize>,
}

impl<B: AsRef<[u8]>, T> Default for TreeLanes<B, T> {
    fn default() -> Self {
        TreeLanes::new()
    }
}

impl<B: AsRef<[u8]>, T> TreeLanes<B, T> {
    /// As many lanes as this CPU's vectors hold ([`Md5Lanes::new`]).
    #[must_use]
    pub fn new() -> Self {
        TreeLanes::with_max_lanes(16)
    }

    /// At most `max` lanes ([`Md5Lanes::with_max_lanes`]).
    #[must_use]
    pub fn with_max_lanes(max: usize) -> Self {
        TreeLanes {
            lanes: Md5Lanes::with_max_lanes(max),
            jobs: Vec::new(),
            free: Vec::new(),
        }
    }

    /// How many chunks are hashed at once.
    #[must_use]
    pub fn num_lanes(&self) -> usize {
        self.lanes.num_lanes()
    }

    /// Queues `data` for its tree digest.
    pub fn push(&mut self, data: B, tag: T) {
        let slot = match self.free.pop() {
            Some(free) => free,
            None => {
                self.jobs.push(None);
                self.jobs.len() - 1
            }
        };
        let data = Arc::new(data);
        let len = data.as_ref().as_ref().len();
        let chunks = chunks_of(len);
        for (i, (from, to)) in chunks.clone().enumerate() {
            self.lanes
                .push(Piece::Data(Arc::clone(&data), from, to), (slot, i));
        }
        self.jobs[slot] = Some(Job {
            data,
            tag,
            digests: vec![0; 16 * chunks.len()],
            remaining: chunks.len(),
        });
    }

    /// `true` when no buffer is waiting or being hashed.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.lanes.is_idle()
    }

    /// Hashes up to `budget` blocks per lane ([`Md5Lanes::run`]) and hands each buffer whose
    /// digest is complete to `done` with its tag and digest.
    pub fn run(&mut self, budget: usize, mut done: impl FnMut(B, T, Md5Digest)) {
        let mut level_done = Vec::new();
        let jobs = &mut self.jobs;
        self.lanes.run(budget, |piece, (slot, i), md5| {
            drop(piece); // its share of the buffer, before the buffer is handed back
            let job = jobs[slot].as_mut().expect("a hashed piece's job is live");
            job.digests[16 * i..16 * i + 16].copy_from_slice(&md5.0);
            job.remaining -= 1;
            if job.remaining == 0 {
                level_done.push(slot);
            }
        });
        for slot in level_done {
            let job = self.jobs[slot].as_mut().expect("live");
            if job.digests.len() == 16 {
                let job = self.jobs[slot].take().expect("live");
                self.free.push(slot);
                let data =
                    Arc::into_inner(job.data).expect("every piece of a finished job is gone");
                let mut digest = [0; 16];
                digest.copy_from_slice(&job.digests);
                done(data, job.tag, Md5Digest(digest));
                continue;
            }
            // The next level: this level's digests, in chunks of their own.
            let level = Arc::new(std::mem::take(&mut job.digests));
            let chunks = chunks_of(level.len());
            job.digests = vec![0; 16 * chunks.len()];
            job.remaining = chunks.len();
            for (i, (from, to)) in chunks.enumerate() {
                self.lanes
                    .push(Piece::Digests(Arc::clone(&level), from, to), (slot, i));
            }
        }
    }
}

/// The chunks of `len` bytes as ranges; one (empty or short) chunk for `len <= CHUNK_BYTES`.
fn chunks_of(len: usize) -> impl ExactSizeIterator<Item = (usize, usize)> + Clone {
    let count = len.div_ceil(CHUNK_BYTES).max(1);
    (0..count).map(move |i| (i * CHUNK_BYTES, ((i + 1) * CHUNK_BYTES).min(len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, written as plainly as it reads (md-5 one buffer at a time).
    fn reference(bytes: &[u8]) -> Md5Digest {
        let mut level = bytes.to_vec();
        while level.len() > CHUNK_BYTES {
            level = level
                .chunks(CHUNK_BYTES)
                .flat_map(|c| Md5Digest::of_bytes(c).0)
                .collect();
        }
        Md5Digest::of_bytes(&level)
    }

    fn bytes(len: usize, seed: u32) -> Vec<u8> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[1])
            .collect()
    }

    #[test]
    fn one_chunk_is_plain_md5_and_larger_buffers_follow_the_definition() {
        let lens = [
            0,
            1,
            63,
            64,
            4095,
            4096,
            4097,
            8192,
            8193,
            12345,
            (1 << 20) + 37,
        ];
        for len in lens {
            let data = bytes(len, 7);
            assert_eq!(tree_digest(&data), reference(&data), "length {len}");
            if len <= CHUNK_BYTES {
                assert_eq!(tree_digest(&data), Md5Digest::of_bytes(&data));
            }
        }
    }

    #[test]
    fn many_buffers_at_every_width_give_each_ones_digest() {
        let inputs: Vec<Vec<u8>> = (0..37)
            .map(|i| bytes(i * 1531 % 20_000, i as u32))
            .collect();
        let want: Vec<Md5Digest> = inputs.iter().map(|b| reference(b)).collect();
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        assert_eq!(tree_digest_of_many(&views), want);
        for width in [1, 4, 8, 16] {
            let mut lanes = TreeLanes::with_max_lanes(width);
            let mut got = vec![None; inputs.len()];
            for (i, data) in inputs.iter().enumerate() {
                lanes.push(data.clone(), i);
                if i % 5 == 0 {
                    lanes.run(3, |data, i, d| got[i] = Some((data, d)));
                }
            }
            while !lanes.is_idle() {
                lanes.run(3, |data, i, d| got[i] = Some((data, d)));
            }
            for (i, slot) in got.into_iter().enumerate() {
                let (data, digest) = slot.expect("every buffer comes back");
                assert_eq!(
                    (data.len(), digest),
                    (inputs[i].len(), want[i]),
                    "width {width}"
                );
            }
        }
    }

    /// Golden vectors: the same values as the Python package's Triton kernel gives
    /// (python/tests/test_device_digest.py) and as the definition gives with hashlib.
    #[test]
    fn golden_vectors() {
        let pattern = |len: usize| -> Vec<u8> { (0..len).map(|i| (i % 251) as u8).collect() };
        let cases = [
            (0, "d41d8cd98f00b204e9800998ecf8427e"),
            (4096, "a0c16616c91907bd14e999986cf822d5"),
            (4097, "2ceb87b71224e06bee318e091ea9ac90"),
            ((1 << 20) + 37, "327403957042bee4e14a55e5c3a40f98"),
        ];
        for (len, hex) in cases {
            assert_eq!(tree_digest(&pattern(len)).to_string(), hex, "length {len}");
        }
    }

    #[test]
    fn kinds_agree_up_to_one_chunk() {
        let (a, b) = (DigestKind::Md5, DigestKind::Md5Tree4k);
        assert!(a.agree_at(b, CHUNK_BYTES) && !a.agree_at(b, CHUNK_BYTES + 1));
        assert!(b.agree_at(b, 1 << 30));
        assert_eq!(DigestKind::from_name("md5-tree-4k"), Some(b));
        assert_eq!(DigestKind::from_name("sha1"), None);
    }
}
