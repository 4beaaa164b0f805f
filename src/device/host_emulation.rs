//! The host emulation's Rust side (tests only, feature `nccl`): the CUDA kernels of
//! `device/reprosum.rs`, `device/kernels.rs` and `device/ops.rs` compiled by g++ for the
//! CPU and run on cases the tests write, so that their arithmetic is checked bit for bit against
//! the CPU references on a machine without a GPU (CI has none).
//!
//! [`host_kernels`] writes the very text of the chosen sources (under their NVRTC names), the
//! shim `host_shim.h` (the bits of CUDA C they use) and the driver `host_driver.cpp`
//! into a temporary folder and compiles them, each source selected by its `-D` macro
//! (`DETCHECK_HOST_<NAME>` for `detcheck_<name>.cu`; each kernel module names its
//! [`HostSource`]); [`Cases`] writes the driver's case file (its format is in the driver's
//! header), [`run`] runs it and [`Results`] reads what it wrote, in the cases' order.
//! The driver launches a kernel with its blocks one at a time in a seeded, shuffled order, and a
//! block's threads as `std::thread`s sharing a `std::barrier`, so a kernel whose bits depend on
//! the order of blocks or threads shows it.
//!
//! What this checks: g++'s IEEE arithmetic (`-ffp-contract=off`: no fused multiply-add) on the
//! kernels' own text against the Rust references, and the kernels' independence of launch
//! configurations and block orders. What it cannot: that a GPU gives the same bits (its own
//! rounding of special cases, such as the NaN an add returns); `scripts/gpu-selftest.sh` runs the
//! kernels' GPU tests on a GPU for that.

use crate::device::cuda::nvrtc_required;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A kernel source for the driver: its NVRTC program name (the file the driver includes) and its
/// text. The kernel modules name their own (this module knows none of them, so none of them
/// depends on another through it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HostSource {
    /// `detcheck_<name>.cu`: the driver includes it when `DETCHECK_HOST_<NAME>` is defined.
    pub(crate) program: &'static str,
    /// The CUDA C.
    pub(crate) source: &'static str,
}

impl HostSource {
    /// The macro that makes the driver include it: `detcheck_reduce.cu` is
    /// `DETCHECK_HOST_REDUCE`.
    fn define(self) -> String {
        let name = self
            .program
            .strip_prefix("detcheck_")
            .and_then(|p| p.strip_suffix(".cu"))
            .unwrap_or_else(|| panic!("{}: not detcheck_<name>.cu", self.program));
        format!("DETCHECK_HOST_{}", name.to_uppercase())
    }
}

/// Kernels compiled for the CPU with g++, in a temporary folder.
pub(crate) struct HostKernels {
    folder: tempfile::TempDir,
    driver: PathBuf,
}

/// `true` when g++ runs; otherwise says what `checks` would have checked and returns `false`,
/// or fails when `DETCHECK_REQUIRE_NVRTC=1` (CI, where a skipped emulation would hide a bug).
fn have_gxx(checks: &str) -> bool {
    if Command::new("g++").arg("--version").output().is_ok() {
        return true;
    }
    assert!(!nvrtc_required(), "DETCHECK_REQUIRE_NVRTC=1 and no g++");
    println!("g++ not found: would {checks}");
    false
}

/// Writes `sources`, the shim and the driver into a temporary folder and runs g++ on the driver
/// with `options` (`-D` definitions, `-fsyntax-only`) and the sources' macros; `None` without g++.
fn gxx(
    sources: &[HostSource],
    options: &[String],
    checks: &str,
) -> Option<(tempfile::TempDir, PathBuf)> {
    if !have_gxx(checks) {
        return None;
    }
    let folder = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(folder.path().join(name), text).unwrap();
    for source in sources {
        write(source.program, source.source);
    }
    write("host_shim.h", include_str!("host_shim.h"));
    write("host_driver.cpp", include_str!("host_driver.cpp"));
    let driver = folder.path().join("driver");
    let output = Command::new("g++")
        .args([
            "-std=c++20",
            "-O1",
            "-pthread",
            "-ffp-contract=off",
            "-fno-strict-aliasing",
        ])
        .args(sources.iter().map(|s| format!("-D{}", s.define())))
        .args(options)
        .arg(folder.path().join("host_driver.cpp"))
        .arg("-o")
        .arg(&driver)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "g++ failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some((folder, driver))
}

/// `true` when `sources` compile into one driver (g++ `-fsyntax-only`), so their names do not
/// clash; `false` (after saying that it would `checks`) without g++.
pub(crate) fn compile_together(sources: &[HostSource], checks: &str) -> bool {
    gxx(sources, &["-fsyntax-only".into()], checks).is_some()
}

/// The driver for `source`, compiled with `defines` (`NAME=VALUE`, each given as `-DNAME=VALUE`);
/// `None` (after saying that it would `checks`) without g++, unless `DETCHECK_REQUIRE_NVRTC=1`.
pub(crate) fn host_kernels(
    source: HostSource,
    defines: &[String],
    checks: &str,
) -> Option<HostKernels> {
    let options: Vec<String> = defines.iter().map(|d| format!("-D{d}")).collect();
    let (folder, driver) = gxx(&[source], &options, checks)?;
    Some(HostKernels { folder, driver })
}

/// Cases for the driver (its file format is in `host_driver.cpp`).
#[derive(Default)]
pub(crate) struct Cases {
    bytes: Vec<u8>,
}

impl Cases {
    /// Little-endian `u64`s: a case's kind and parameters.
    pub(crate) fn words(&mut self, words: &[u64]) {
        for w in words {
            self.bytes.extend(w.to_le_bytes());
        }
    }

    /// Raw little-endian bytes: a case's terms.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// `f32`s, little-endian.
    pub(crate) fn f32s(&mut self, values: &[f32]) {
        values
            .iter()
            .for_each(|x| self.bytes.extend(x.to_le_bytes()));
    }

    /// `f64`s, little-endian.
    pub(crate) fn f64s(&mut self, values: &[f64]) {
        values
            .iter()
            .for_each(|x| self.bytes.extend(x.to_le_bytes()));
    }

    /// `u32`s, little-endian.
    pub(crate) fn u32s(&mut self, values: &[u32]) {
        values
            .iter()
            .for_each(|x| self.bytes.extend(x.to_le_bytes()));
    }
}

/// The driver's results, read in the order of the cases.
pub(crate) struct Results {
    bytes: Vec<u8>,
    at: usize,
}

impl Results {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let chunk = self.bytes[self.at..self.at + N].try_into().unwrap();
        self.at += N;
        chunk
    }

    /// `len` `f32`s, as bits.
    pub(crate) fn f32s(&mut self, len: usize) -> Vec<u32> {
        (0..len).map(|_| u32::from_le_bytes(self.take())).collect()
    }

    /// `len` `f64`s, as bits.
    pub(crate) fn f64s(&mut self, len: usize) -> Vec<u64> {
        (0..len).map(|_| u64::from_le_bytes(self.take())).collect()
    }

    /// `len` elements of `width` bytes each (1, 4 or 8), as bits.
    pub(crate) fn elements(&mut self, len: usize, width: usize) -> Vec<u64> {
        (0..len)
            .map(|_| match width {
                1 => u64::from(u8::from_le_bytes(self.take())),
                4 => u64::from(u32::from_le_bytes(self.take())),
                8 => u64::from_le_bytes(self.take()),
                _ => panic!("no {width}-byte elements"),
            })
            .collect()
    }

    /// `N` `u64`s.
    pub(crate) fn words<const N: usize>(&mut self) -> [u64; N] {
        std::array::from_fn(|_| u64::from_le_bytes(self.take()))
    }

    /// Every result was read.
    pub(crate) fn assert_done(&self) {
        assert_eq!(self.at, self.bytes.len(), "results left over");
    }
}

/// Runs the driver on `cases`.
pub(crate) fn run(kernels: &HostKernels, cases: &Cases) -> Results {
    let output = try_run(kernels, cases);
    assert!(
        output.status.success(),
        "the driver failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Results {
        bytes: std::fs::read(kernels.folder.path().join("results.bin")).unwrap(),
        at: 0,
    }
}

/// Runs the driver on `cases`, failing or not: its exit status and messages.
pub(crate) fn try_run(kernels: &HostKernels, cases: &Cases) -> std::process::Output {
    let folder: &Path = kernels.folder.path();
    let (input, output) = (folder.join("cases.bin"), folder.join("results.bin"));
    std::fs::write(&input, &cases.bytes).unwrap();
    Command::new(&kernels.driver)
        .arg(&input)
        .arg(&output)
        .output()
        .unwrap()
}
