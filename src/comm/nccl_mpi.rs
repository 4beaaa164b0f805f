//! An NCCL communicator for the ranks of an MPI job (features `mpi` and `nccl`): MPI carries the
//! NCCL id, each process opens its own GPU.
//!
//! [`nccl_comm_over_mpi`] is called by every rank of a run's [`MpiComm`]. Each process first
//! prepares alone: it finds NCCL, opens GPU `local rank % devices` ([`local_rank`]: the
//! launcher's variable, so the ranks of one node take different GPUs), and rank 0 creates the
//! [`NcclId`]. One MPI allgather of a fixed-size record then tells every rank whether every
//! other one is ready (and if not, why) and carries rank 0's id; only when all are ready do they
//! call `ncclCommInitRank`, which waits for every rank, so a rank that cannot take part is an
//! error on every rank, within MPI's deadline, never a hang in NCCL.
//!
//! Determinism: nothing here touches data; which GPU a rank gets depends on its local rank only.
//!
//! Limits: the local rank is read from `OMPI_COMM_WORLD_LOCAL_RANK` (Open MPI),
//! `MPI_LOCALRANKID` (MPICH's Hydra, Intel MPI) or `PMI_LOCAL_RANK` (PMI launchers), else 0:
//! without one of them several ranks of a node share GPU 0, which NCCL refuses. The NCCL
//! communicator's deadline is the MPI communicator's.

use super::mpi::MpiComm;
use super::nccl::{NcclComm, NcclId, NCCL_ID_BYTES};
use super::Communicator;
use crate::device::{count_devices, locate_library, CudaError, CudaLibrary, Gpu};
use crate::value::tensor::Tensor;
use std::sync::Arc;

/// The variables launchers set to a process's rank among the processes of its node, in the
/// order they are read.
const LOCAL_RANK_VARIABLES: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "PMI_LOCAL_RANK",
];

/// The bytes of a rank's readiness record: ready (1 byte), rank 0's id, the length of the
/// reason it is not ready (2), the reason (truncated).
const READY_BYTES: usize = 512;
const REASON_AT: usize = 1 + NCCL_ID_BYTES + 2;

/// This process's rank among the processes of its node: the first of
/// [`LOCAL_RANK_VARIABLES`] that `lookup` gives as a number, else 0.
pub(crate) fn local_rank(lookup: impl Fn(&str) -> Option<String>) -> usize {
    LOCAL_RANK_VARIABLES
        .iter()
        .find_map(|name| lookup(name)?.trim().parse().ok())
        .unwrap_or(0)
}

/// An NCCL communicator of `mpi`'s ranks (same ranks, same size), each on GPU
/// `local_rank % device count`; called by every rank of `mpi` together.
///
/// # Errors
/// This rank's own [`CudaError`] when it cannot take part (no NCCL, no GPU, NCCL's refusal);
/// [`CudaError::Nccl`] naming the first other rank that cannot, with its reason, or the MPI
/// allgather's failure.
pub(crate) fn nccl_comm_over_mpi(mpi: &MpiComm<'_>) -> Result<NcclComm, CudaError> {
    let (rank, size) = (mpi.rank(), mpi.size());
    let prepared = (|| {
        locate_library(CudaLibrary::Nccl)?;
        let devices = count_devices()?;
        let gpu = Gpu::open(local_rank(|name| std::env::var(name).ok()) % devices)?;
        let id = if rank == 0 {
            Some(NcclId::new()?)
        } else {
            None
        };
        Ok::<_, CudaError>((gpu, id))
    })();
    let record = ready_record(&prepared);
    let gathered = mpi
        .allgather(&Tensor::from_vec(record))
        .map_err(|e| CudaError::Nccl {
            call: "the MPI allgather before ncclCommInitRank",
            message: e.to_string(),
        })?;
    let (gpu, _) = prepared?;
    let records: Vec<Vec<u8>> = gathered
        .iter()
        .map(|t| t.with_view(|v| v.bytes().to_vec()))
        .collect();
    if let Some((other, reason)) = records
        .iter()
        .enumerate()
        .find_map(|(r, record)| not_ready(record).map(|reason| (r, reason)))
    {
        return Err(CudaError::Nccl {
            call: "ncclCommInitRank",
            message: format!("rank {other} cannot take part: {reason}"),
        });
    }
    let id = NcclId::from_bytes(&records[0][1..=NCCL_ID_BYTES])?;
    Ok(NcclComm::new(gpu, rank, size, &id)?.with_deadline(mpi.deadline()))
}

/// This rank's readiness record: ready and (on rank 0) the id, or the reason it is not ready.
fn ready_record(prepared: &Result<(Arc<Gpu>, Option<NcclId>), CudaError>) -> Vec<u8> {
    let mut record = vec![0u8; READY_BYTES];
    match prepared {
        Ok((_, id)) => {
            record[0] = 1;
            if let Some(id) = id {
                record[1..=NCCL_ID_BYTES].copy_from_slice(id.as_bytes());
            }
        }
        Err(e) => {
            let reason = e.to_string();
            let mut len = reason.len().min(READY_BYTES - REASON_AT);
            while !reason.is_char_boundary(len) {
                len -= 1;
            }
            record[REASON_AT - 2..REASON_AT].copy_from_slice(&(len as u16).to_le_bytes());
            record[REASON_AT..REASON_AT + len].copy_from_slice(&reason.as_bytes()[..len]);
        }
    }
    record
}

/// The reason in a record of a rank that is not ready; `None` when it is.
fn not_ready(record: &[u8]) -> Option<String> {
    if record.first() == Some(&1) {
        return None;
    }
    let len = u16::from_le_bytes([record[REASON_AT - 2], record[REASON_AT - 1]]) as usize;
    let len = len.min(record.len().saturating_sub(REASON_AT));
    Some(String::from_utf8_lossy(&record[REASON_AT..REASON_AT + len]).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_rank_is_the_first_launcher_variable_set_else_zero() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(local_rank(env(&[])), 0);
        assert_eq!(local_rank(env(&[("PMI_LOCAL_RANK", "3")])), 3);
        assert_eq!(
            local_rank(env(&[("MPI_LOCALRANKID", "2"), ("PMI_LOCAL_RANK", "3")])),
            2
        );
        assert_eq!(
            local_rank(env(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                ("MPI_LOCALRANKID", "2")
            ])),
            1
        );
        // Not a number: the next variable.
        assert_eq!(
            local_rank(env(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "x"),
                ("PMI_LOCAL_RANK", "4")
            ])),
            4
        );
    }

    #[test]
    fn readiness_records_carry_the_reason_a_rank_cannot_take_part() {
        let failed: Result<(Arc<Gpu>, Option<NcclId>), CudaError> = Err(CudaError::Nccl {
            call: "ncclCommInitRank",
            message: "é".repeat(400),
        });
        let record = ready_record(&failed);
        assert_eq!(record.len(), READY_BYTES);
        let reason = not_ready(&record).expect("not ready");
        assert!(
            !reason.is_empty() && !reason.contains('\u{fffd}'),
            "{reason}"
        );
    }
}
