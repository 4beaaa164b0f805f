//! Values: tensors and their canonical bytes, digests and statistics, seeded random streams,
//! the reduction arithmetic every backend shares (summation orders, reproducible sums), and the
//! CPU references of GPU operators (scatter-add).
//!
//! Main types: [`Tensor`] (and its borrowed [`TensorView`]), [`Md5Digest`], [`Stats`],
//! [`RankRng`] (from [`derive_stream`]), [`ReductionMode`], [`ReduceOp`].
//!
//! Determinism: a digest depends only on dtype, shape and the canonical little-endian bytes; a
//! stream only on (seed, stream, rank, step); a reduction's bits only on its mode, its inputs and
//! (except `reproducible`) the number of ranks, never on the CPU the kernel runs on. This is
//! the bottom layer: it uses no other module of the crate.

pub(crate) mod digest;
pub(crate) mod md5tree;
pub(crate) mod md5x;
pub(crate) mod position;
pub(crate) mod reduce;
pub(crate) mod reprosum;
pub(crate) mod scatter;
pub(crate) mod seed;
pub(crate) mod tensor;

pub use digest::{ExactF64, Md5Digest, Stats, Totals};
/// The `f16` and `bf16` element types (the `half` crate's), for [`TensorData::F16`] and
/// [`TensorData::BF16`].
pub use half::{bf16, f16};
pub use md5tree::{tree_digest, tree_digest_of_many, DigestKind, TreeLanes, CHUNK_BYTES};
pub use md5x::{md5_of_many, Md5Lanes};
pub use position::{Placement, PlacementError, PositionDigest, Shard};
pub use reduce::{selected_kernel, ReduceOp, ReductionMode};
pub use reprosum::{
    reproducible_sum_columns_f32, reproducible_sum_f32, reproducible_sum_f64, ColumnsError,
};
pub use scatter::{check_indices, segmented_sum_f32, segments, ScatterError, Segments};
pub use seed::{derive_stream, RankRng, Stream};
pub use tensor::{DType, Element, ShapeError, Tensor, TensorData, TensorView, ViewError};
