//! CUDA found before it is used: the driver, NVRTC and NCCL libraries, the devices, and NVRTC
//! compilations; one of the four modules of the crate with `unsafe` (feature `nccl`; `src/lib.rs`
//! says which and why).
//!
//! cudarc opens each CUDA library at run time, when its first function is called, and panics
//! when the library cannot be loaded. So every function here that reaches cudarc first calls
//! [`locate_library`], which tries the names cudarc would try ([`CudaLibrary::candidates`], in
//! cudarc's order, through the same loader: `dlopen` via libloading) and returns
//! [`CudaError::LibraryMissing`] with the library, the names tried and how to get it. The main
//! type is [`CudaError`]; [`count_devices`] counts the GPUs (or says why there are none), and
//! [`compile_ptx`] / [`compile_cubin`] run NVRTC on a CUDA C source
//! (`device/kernels.rs` holds detcheck's kernels and compiles them with these).
//!
//! Invariant (no panic for a missing CUDA library): cudarc panics when it cannot load the driver,
//! NVRTC or NCCL, so every path into cudarc first loads the library by cudarc's own names and
//! returns `CudaError::LibraryMissing` (names tried, how to get it) instead.
//!
//! Determinism: NVRTC always gets [`NVRTC_OPTIONS`]: `--fmad=false`, so `a * b + c` is never
//! contracted into one fused multiply-add (which rounds once where the CPU rounds twice;
//! measured on an H100: 13% of f32 triples differ with the default `--fmad=true`), and IEEE
//! division, square root and subnormals (`--prec-div`, `--prec-sqrt`, `--ftz=false`), as the
//! CPU computes them. Which NVRTC compiled a kernel is [`nvrtc_version`]; the bits of the PTX
//! or cubin it emits are not promised by NVIDIA across versions, and nothing here relies on them.
//!
//! Limits: Linux library names only. A probe opens the library (its initialisers run) and closes
//! it again; a library that loads but lacks a function cudarc calls later is cudarc's error
//! then, not a probe's. pip's NCCL wheel ships `libnccl.so.2`, a name cudarc 0.19 does not try:
//! the probe says so and how to link it. This module finds libraries, counts devices and
//! compiles; `device/gpu.rs` launches kernels and `comm/nccl.rs` is the NCCL communicator.

// The FFI of the `nccl` feature: `dlopen` (libloading) and NVRTC's C API (cudarc's `result` and
// `sys` modules). Every `unsafe` block says why it holds.
#![allow(unsafe_code)]

use cudarc::nvrtc::result as nvrtc;
use cudarc::nvrtc::sys as nvrtc_sys;
use std::ffi::{c_char, c_int, CString};
use std::fmt;
use thiserror::Error;

/// A CUDA library that the `nccl` feature loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CudaLibrary {
    /// The CUDA driver, `libcuda.so.1`: comes with the NVIDIA driver, never with pip.
    Driver,
    /// The runtime compiler, `libnvrtc.so.13` for CUDA 13 (pip: `nvidia-cuda-nvrtc`).
    Nvrtc,
    /// NCCL, `libnccl.so.2` (pip: `nvidia-nccl-cu13`).
    Nccl,
}

impl CudaLibrary {
    /// Every library, in the order a GPU run needs them.
    pub const ALL: [CudaLibrary; 3] = [CudaLibrary::Driver, CudaLibrary::Nvrtc, CudaLibrary::Nccl];

    /// The file people know the library by: `libcuda.so.1`, `libnvrtc.so.*`, `libnccl.so.2`.
    #[must_use]
    pub fn file_name(self) -> &'static str {
        match self {
            CudaLibrary::Driver => "libcuda.so.1",
            CudaLibrary::Nvrtc => "libnvrtc.so.*",
            CudaLibrary::Nccl => "libnccl.so.2",
        }
    }

    /// The base names cudarc 0.19's `sys` modules load (`driver/sys`, `nvrtc/sys`, `nccl/sys`).
    fn base_names(self) -> &'static [&'static str] {
        match self {
            CudaLibrary::Driver => &["cuda", "nvcuda"],
            CudaLibrary::Nvrtc => &["nvrtc"],
            CudaLibrary::Nccl => &["nccl"],
        }
    }

    /// The file names cudarc tries for this library, in its order: the first that loads is the
    /// one it uses (`cudarc::get_lib_name_candidates` of each base name; CUDA 13's names with
    /// the `cuda-13000` feature, so `libnvrtc.so.13`). cudarc's repeats are left out: a name
    /// that did not load the first time does not load the second.
    #[must_use]
    pub fn candidates(self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for name in self
            .base_names()
            .iter()
            .flat_map(|name| cudarc::get_lib_name_candidates(name))
        {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// How to get the library, for [`CudaError::LibraryMissing`].
    fn hint(self) -> &'static str {
        match self {
            CudaLibrary::Driver => {
                "libcuda.so.1 comes with the NVIDIA driver (not with the CUDA toolkit or pip): run \
                 on a machine with an NVIDIA GPU and its driver (a container needs the NVIDIA \
                 container toolkit, `docker run --gpus all`); if the driver is installed outside \
                 the loader's search path, add its folder (often /usr/local/nvidia/lib64) to \
                 LD_LIBRARY_PATH"
            }
            CudaLibrary::Nvrtc => {
                "install CUDA 13's NVRTC with `pip install nvidia-cuda-nvrtc==13.0.88` \
                 (`nvidia-cuda-nvrtc-cu13` is an empty stub; scripts/install-nvrtc.sh installs it \
                 into target/venv-cuda) and set LD_LIBRARY_PATH to the wheel's nvidia/cu13/lib \
                 folder, which `scripts/find-cuda-libs.sh VENV` prints; a CUDA 13 toolkit's \
                 lib64 folder works too"
            }
            CudaLibrary::Nccl => {
                "install NCCL with `pip install nvidia-nccl-cu13` and set LD_LIBRARY_PATH to the \
                 wheel's nvidia/nccl/lib folder, which `scripts/find-cuda-libs.sh VENV` prints; \
                 the wheel ships only libnccl.so.2, a name cudarc does not try, so link \
                 libnccl.so to it there (`scripts/find-cuda-libs.sh --link-nccl VENV`)"
            }
        }
    }
}

impl fmt::Display for CudaLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            CudaLibrary::Driver => "the CUDA driver",
            CudaLibrary::Nvrtc => "NVRTC",
            CudaLibrary::Nccl => "NCCL",
        };
        write!(f, "{what} ({})", self.file_name())
    }
}

/// A library that [`locate_library`] loaded: the name the dynamic loader found, the same one
/// cudarc will load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedLibrary {
    /// Which library.
    pub library: CudaLibrary,
    /// The file name that loaded (a name, searched for as `dlopen` does, not a path).
    pub name: String,
}

/// Why CUDA cannot be used here: what is missing, or what failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CudaError {
    /// None of the names cudarc would try loads.
    #[error("cannot load {library}: the loader found none of {} ({}); {hint}", tried.join(", "), detail)]
    LibraryMissing {
        /// The library.
        library: CudaLibrary,
        /// Every name tried, in order.
        tried: Vec<String>,
        /// The loader's own words: its first error other than "no such file", or the error of
        /// the last name tried.
        detail: String,
        /// How to get the library.
        hint: String,
    },
    /// The driver loads but reports no device.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// A driver call failed for another reason.
    #[error("the CUDA driver failed in {call}: {message}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// Its error.
        message: String,
    },
    /// An NCCL call failed, or an NCCL communicator could not be set up (`comm/nccl.rs`).
    #[error("NCCL failed in {call}: {message}")]
    Nccl {
        /// The NCCL function, or the step of the setup.
        call: &'static str,
        /// NCCL's error code and text, or what went wrong.
        message: String,
    },
    /// NVRTC refused a program (its log says why) or one of its calls failed.
    #[error("nvrtc cannot compile {program} for {arch}: {message}")]
    Compile {
        /// The program's name (a `.cu` file name, as NVRTC's log prints it).
        program: String,
        /// The architecture asked for (`compute_90`, `sm_90`).
        arch: String,
        /// NVRTC's error and its log.
        message: String,
    },
}

/// Loads `library` by each name cudarc would try, in its order, and returns the first that
/// loads; [`CudaError::LibraryMissing`] when none does. cudarc itself would panic then, so call
/// this before anything that reaches cudarc (the functions of this module do).
///
/// # Errors
/// [`CudaError::LibraryMissing`], naming the library, every name tried, the loader's error and
/// how to get it.
pub fn locate_library(library: CudaLibrary) -> Result<LocatedLibrary, CudaError> {
    let tried = library.candidates();
    locate_by_names(library, &tried).map_err(|missing| match (library, missing) {
        (
            CudaLibrary::Nccl,
            CudaError::LibraryMissing {
                library,
                tried,
                detail,
                hint,
            },
        ) if load("libnccl.so.2").is_ok() => CudaError::LibraryMissing {
            library,
            tried,
            detail,
            hint: format!(
                "libnccl.so.2 loads, but cudarc never tries that name: link libnccl.so to it in \
                 a folder on LD_LIBRARY_PATH (`ln -s libnccl.so.2 libnccl.so` beside it; \
                 `scripts/find-cuda-libs.sh --link-nccl VENV` does it for pip's wheel); {hint}"
            ),
        },
        (_, other) => other,
    })
}

/// [`locate_library`] over the given names (tests give names that cannot exist).
fn locate_by_names(library: CudaLibrary, names: &[String]) -> Result<LocatedLibrary, CudaError> {
    let mut errors = Vec::with_capacity(names.len());
    for name in names {
        match load(name) {
            Ok(()) => {
                return Ok(LocatedLibrary {
                    library,
                    name: name.clone(),
                })
            }
            Err(error) => errors.push(error),
        }
    }
    let detail = errors
        .iter()
        .find(|e| !e.contains("No such file or directory"))
        .or(errors.last())
        .cloned()
        .unwrap_or_else(|| "no names to try".to_owned());
    Err(CudaError::LibraryMissing {
        library,
        tried: names.to_vec(),
        detail,
        hint: library.hint().to_owned(),
    })
}

/// Opens and closes the library `name` (searched for as `dlopen` searches), or the loader's error.
fn load(name: &str) -> Result<(), String> {
    // SAFETY: loading a shared library runs its initialisers, which could do anything; these are
    // the CUDA libraries cudarc loads by the same names right after (or a test's libc), and
    // loading them is what this module exists for. No symbol is taken from the handle, which
    // is closed when dropped here.
    let library = unsafe { libloading::Library::new(name) };
    library.map(drop).map_err(|e| {
        // libloading says "dlopen failed"; the loader's own words are its source.
        match std::error::Error::source(&e) {
            Some(source) => source.to_string(),
            None => e.to_string(),
        }
    })
}

/// The number of CUDA devices the driver sees: at least one.
///
/// # Errors
/// [`CudaError::LibraryMissing`] without the driver library; [`CudaError::NoDevice`] when the
/// driver sees no device (or has none to initialise); [`CudaError::Driver`] for any other
/// failure of `cuInit` or `cuDeviceGetCount`.
pub fn count_devices() -> Result<usize, CudaError> {
    locate_library(CudaLibrary::Driver)?;
    let count = cudarc::driver::CudaContext::device_count().map_err(|e| {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE {
            CudaError::NoDevice {
                reason: format!("{e:?}"),
            }
        } else {
            CudaError::Driver {
                call: "cuInit/cuDeviceGetCount",
                message: format!("{e:?}"),
            }
        }
    })?;
    match usize::try_from(count) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CudaError::NoDevice {
            reason: format!("the driver counts {count} devices"),
        }),
    }
}

/// The options every NVRTC compilation gets, before `--gpu-architecture`: no fused
/// multiply-add, IEEE division and square root, subnormals kept (the CPU's arithmetic).
pub const NVRTC_OPTIONS: [&str; 4] = [
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// NVRTC's version, `(major, minor)`, e.g. `(13, 0)`.
///
/// # Errors
/// [`CudaError::LibraryMissing`] without NVRTC; [`CudaError::Compile`] if the call fails.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    locate_library(CudaLibrary::Nvrtc)?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are to live locals, which nvrtcVersion writes once each.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Compile {
            program: "nvrtcVersion".to_owned(),
            arch: String::new(),
            message: format!("{e:?}"),
        })?;
    Ok((major, minor))
}

/// Compiles the CUDA C `source` (named `program` in NVRTC's messages) to PTX for the virtual
/// architecture `arch` (`compute_90`), with [`NVRTC_OPTIONS`].
///
/// # Errors
/// [`CudaError::LibraryMissing`] without NVRTC; [`CudaError::Compile`] with NVRTC's log when the
/// source does not compile (or NVRTC fails).
pub fn compile_ptx(program: &str, source: &str, arch: &str) -> Result<String, CudaError> {
    let compiled = Program::compile(program, source, arch)?;
    let ptx = compiled.ptx()?;
    String::from_utf8(ptx).map_err(|e| compiled.error(format!("its PTX is not UTF-8: {e}")))
}

/// Compiles the CUDA C `source` to a cubin, the machine code of the real architecture `arch`
/// (`sm_90`), with [`NVRTC_OPTIONS`]: an ELF image that `cuModuleLoadData` loads without a
/// JIT step.
///
/// # Errors
/// As [`compile_ptx`]; a virtual architecture (`compute_90`) has no cubin, which NVRTC refuses.
pub fn compile_cubin(program: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    Program::compile(program, source, arch)?.cubin()
}

/// An NVRTC program, compiled, destroyed when dropped.
struct Program {
    handle: nvrtc_sys::nvrtcProgram,
    name: String,
    arch: String,
    // NVRTC may keep pointers into the source and name until the program is destroyed.
    _source: CString,
    _name: CString,
}

impl Program {
    /// Creates and compiles the program (after finding NVRTC).
    fn compile(program: &str, source: &str, arch: &str) -> Result<Program, CudaError> {
        let fail = |message: String| CudaError::Compile {
            program: program.to_owned(),
            arch: arch.to_owned(),
            message,
        };
        locate_library(CudaLibrary::Nvrtc)?;
        let c_source =
            CString::new(source).map_err(|_| fail("the source holds a NUL byte".to_owned()))?;
        let c_name =
            CString::new(program).map_err(|_| fail("the name holds a NUL byte".to_owned()))?;
        let handle = nvrtc::create_program(&c_source, Some(&c_name))
            .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
        let program = Program {
            handle,
            name: program.to_owned(),
            arch: arch.to_owned(),
            _source: c_source,
            _name: c_name,
        };
        let mut options: Vec<String> = NVRTC_OPTIONS.iter().map(|&o| o.to_owned()).collect();
        options.push(format!("--gpu-architecture={arch}"));
        // SAFETY: `handle` was created above and is destroyed only by `drop`.
        let compiled = unsafe { nvrtc::compile_program(program.handle, &options) };
        if let Err(e) = compiled {
            let log = program.log();
            // NVRTC loads libnvrtc-builtins.so.* at compile time, by the loader's search only
            // (seen with pip's wheel: loaded by its path alone, libnvrtc fails with this code).
            let hint = if e.0 == nvrtc_sys::nvrtcResult::NVRTC_ERROR_BUILTIN_OPERATION_FAILURE {
                " (NVRTC could not load its libnvrtc-builtins.so: put NVRTC's lib folder on \
                 LD_LIBRARY_PATH, as `scripts/find-cuda-libs.sh VENV` prints it)"
            } else {
                ""
            };
            return Err(program.error(format!(
                "{e:?}{hint} with {}:\n{}",
                options.join(" "),
                log.trim_end()
            )));
        }
        Ok(program)
    }

    /// The compiler's log (warnings, or why it failed), empty if it cannot be read.
    fn log(&self) -> String {
        // SAFETY: `handle` is a live program (destroyed only by `drop`).
        let log = unsafe { nvrtc::get_program_log(self.handle) };
        log.map(|chars| text_of(&chars)).unwrap_or_default()
    }

    /// The PTX, without its terminating NUL.
    fn ptx(&self) -> Result<Vec<u8>, CudaError> {
        // SAFETY: `handle` is a live, compiled program.
        let ptx = unsafe { nvrtc::get_ptx(self.handle) }
            .map_err(|e| self.error(format!("nvrtcGetPTX: {e:?}")))?;
        Ok(text_of(&ptx).into_bytes())
    }

    /// The cubin (ELF), when the program was compiled for a real architecture.
    fn cubin(&self) -> Result<Vec<u8>, CudaError> {
        let mut size = 0usize;
        // SAFETY: `handle` is a live, compiled program; `size` is a live local.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(self.handle, &mut size) }
            .result()
            .map_err(|e| self.error(format!("nvrtcGetCUBINSize: {e:?}")))?;
        if size == 0 {
            return Err(self.error(format!(
                "no cubin: {} is not a real architecture (sm_XX)",
                self.arch
            )));
        }
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds the `size` bytes nvrtcGetCUBINSize asked for, and NVRTC writes
        // no more than that.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(self.handle, cubin.as_mut_ptr().cast::<c_char>()) }
            .result()
            .map_err(|e| self.error(format!("nvrtcGetCUBIN: {e:?}")))?;
        Ok(cubin)
    }

    fn error(&self, message: String) -> CudaError {
        CudaError::Compile {
            program: self.name.clone(),
            arch: self.arch.clone(),
            message,
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `handle` was created by nvrtcCreateProgram and is destroyed only here, once.
        // An error here has no one to report to; the program's memory is NVRTC's either way.
        let _ = unsafe { nvrtc::destroy_program(self.handle) };
    }
}

/// C characters up to the first NUL, as text (NVRTC's PTX and logs are ASCII).
fn text_of(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Whether a test that needs NVRTC must fail without it: `DETCHECK_REQUIRE_NVRTC=1` (CI sets it);
/// otherwise such a test says what it would check and passes.
#[cfg(test)]
pub(crate) fn nvrtc_required() -> bool {
    std::env::var_os("DETCHECK_REQUIRE_NVRTC").is_some_and(|v| v == "1")
}

/// What every kernel module's NVRTC test checks, in one place: the program compiles to PTX for
/// `ptx_arch` and to a cubin for `cubin_arch`; the PTX's entry points are exactly `kernels`, it
/// has no fused multiply-add, and every float add of `floats` is pinned to round-to-nearest
/// (`add.rn`: `--fmad=false` took effect, ptxas may not contract it; never a plain `add.f32`);
/// the cubin is a CUDA ELF image naming every kernel. Returns the PTX's instruction mnemonics for
/// a module's own checks, or `None` (after saying what it would check) without NVRTC, unless
/// `DETCHECK_REQUIRE_NVRTC=1`.
#[cfg(test)]
pub(crate) fn assert_compiles_with_nvrtc(
    (program, source): (&str, &str),
    (ptx_arch, cubin_arch): (&str, &str),
    kernels: &[&str],
    floats: &[&str],
) -> Option<Vec<String>> {
    use std::collections::BTreeSet;
    if let Err(missing) = locate_library(CudaLibrary::Nvrtc) {
        assert!(!nvrtc_required(), "DETCHECK_REQUIRE_NVRTC=1: {missing}");
        println!(
            "NVRTC not found: would compile the {} kernels of {program} to PTX ({ptx_arch}) and a \
             cubin ({cubin_arch}) with --fmad=false and check that each is there and no FMA is \
             ({missing})",
            kernels.len()
        );
        return None;
    }
    let (major, minor) = nvrtc_version().unwrap();
    let ptx = compile_ptx(program, source, ptx_arch).unwrap();
    let cubin = compile_cubin(program, source, cubin_arch).unwrap();
    println!(
        "NVRTC {major}.{minor}: {program}: {} kernels, {} bytes of PTX, {} bytes of cubin",
        kernels.len(),
        ptx.len(),
        cubin.len()
    );

    assert!(
        ptx.contains(&format!(".target {}", ptx_arch.replace("compute", "sm"))),
        "{ptx}"
    );
    let entries: BTreeSet<&str> = ptx
        .lines()
        .filter_map(|line| line.split(".entry ").nth(1))
        .map(|rest| rest.trim_end_matches(['(', ' ']))
        .collect();
    assert_eq!(entries, kernels.iter().copied().collect::<BTreeSet<&str>>());
    assert!(!ptx.contains("fma."), "a fused multiply-add in the PTX");
    let instructions: Vec<String> = ptx
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    for float in floats {
        let (pinned, plain) = (format!("add.rn.{float}"), format!("add.{float}"));
        assert!(
            instructions.contains(&pinned),
            "no {pinned} in the PTX: {ptx}"
        );
        assert!(
            !instructions.contains(&plain),
            "a {plain} in the PTX: {ptx}"
        );
    }

    // Cubin: an ELF image for the CUDA machine (EM_CUDA = 190) naming every kernel.
    assert_eq!(&cubin[..4], b"\x7fELF");
    assert_eq!(u16::from_le_bytes([cubin[18], cubin[19]]), 190);
    for kernel in kernels {
        let name = kernel.as_bytes();
        assert!(
            cubin.windows(name.len()).any(|w| w == name),
            "{kernel} is not in the cubin"
        );
    }
    Some(instructions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_by_no_loadable_name_is_an_error_naming_every_name_tried() {
        let names = vec![
            "libdetcheck-absent.so.1".to_owned(),
            "libdetcheck-absent.so".to_owned(),
        ];
        let err = locate_by_names(CudaLibrary::Driver, &names).unwrap_err();
        let CudaError::LibraryMissing {
            library,
            tried,
            detail,
            hint,
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*library, CudaLibrary::Driver);
        assert_eq!(tried, &names);
        assert!(detail.contains("libdetcheck-absent.so"), "{detail}");
        assert!(hint.contains("NVIDIA driver"), "{hint}");
        let message = err.to_string();
        assert!(
            message.starts_with("cannot load the CUDA driver (libcuda.so.1): "),
            "{message}"
        );
        assert!(message.contains("libdetcheck-absent.so.1, libdetcheck-absent.so"));
    }

    #[test]
    fn a_library_that_loads_is_located_by_the_first_name_that_loads() {
        let names = vec!["libdetcheck-absent.so".to_owned(), "libc.so.6".to_owned()];
        let found = locate_by_names(CudaLibrary::Nvrtc, &names).unwrap();
        assert_eq!(found.name, "libc.so.6");
        assert_eq!(found.library, CudaLibrary::Nvrtc);
    }

    #[test]
    fn the_names_tried_are_cudarcs_for_cuda_13() {
        let driver = CudaLibrary::Driver.candidates();
        assert_eq!(driver[0], "libcuda.so");
        assert!(driver.contains(&"libcuda.so.1".to_owned()));
        assert!(driver.iter().any(|n| n.contains("nvcuda")));
        assert!(CudaLibrary::Nvrtc
            .candidates()
            .contains(&"libnvrtc.so.13".to_owned()));
        // pip's NCCL is libnccl.so.2, which cudarc does not try: the probe's NCCL hint says so.
        let nccl = CudaLibrary::Nccl.candidates();
        assert!(nccl.contains(&"libnccl.so".to_owned()));
        assert!(!nccl.contains(&"libnccl.so.2".to_owned()));
        for library in CudaLibrary::ALL {
            assert!(library.to_string().contains(library.file_name()));
        }
    }

    /// On a machine without the NVIDIA driver (this project's CI) the probe returns an error
    /// naming libcuda.so.1, where cudarc would panic; with a driver it finds it.
    #[test]
    fn a_missing_driver_is_an_error_not_a_panic() {
        match locate_library(CudaLibrary::Driver) {
            Ok(found) => {
                println!("the CUDA driver loads here as {}", found.name);
                match count_devices() {
                    Ok(n) => println!("{n} CUDA devices"),
                    Err(e) => println!("{e}"),
                }
            }
            Err(err) => {
                let message = err.to_string();
                assert!(matches!(err, CudaError::LibraryMissing { .. }), "{err:?}");
                assert!(message.contains("libcuda.so.1"), "{message}");
                assert!(message.contains("NVIDIA driver"), "{message}");
                // Every function that reaches the driver returns the same error.
                let counted = count_devices().unwrap_err();
                assert_eq!(counted.to_string(), message);
            }
        }
    }

    /// Each library is found, or its error names it and how to get it; pip's libnccl.so.2
    /// alone (on LD_LIBRARY_PATH, without the libnccl.so link) gets the hint to link it.
    #[test]
    fn every_library_is_found_or_named_with_a_hint() {
        for library in CudaLibrary::ALL {
            match locate_library(library) {
                Ok(found) => println!("{library} loads as {}", found.name),
                Err(err) => {
                    let message = err.to_string();
                    println!("{message}");
                    let CudaError::LibraryMissing { tried, hint, .. } = &err else {
                        panic!("{err:?}")
                    };
                    assert_eq!(tried, &library.candidates());
                    assert!(message.contains(library.file_name()), "{message}");
                    let nccl_2_alone = library == CudaLibrary::Nccl && load("libnccl.so.2").is_ok();
                    assert_eq!(hint.contains("libnccl.so.2 loads"), nccl_2_alone, "{hint}");
                }
            }
        }
    }

    #[test]
    fn nvrtc_reports_a_bad_program_with_its_log() {
        if locate_library(CudaLibrary::Nvrtc).is_err() && !nvrtc_required() {
            println!(
                "NVRTC not found: would check that a program with an error is refused with \
                 NVRTC's log (set DETCHECK_REQUIRE_NVRTC=1 to fail instead)"
            );
            return;
        }
        let (major, minor) = nvrtc_version().unwrap();
        println!("NVRTC {major}.{minor}");
        assert!(major >= 12, "{major}.{minor}");
        let err = compile_ptx(
            "broken.cu",
            "extern \"C\" __global__ void k() { undeclared(); }",
            "compute_90",
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("nvrtc cannot compile broken.cu for compute_90: "),
            "{message}"
        );
        assert!(message.contains("undeclared"), "{message}");
        assert!(message.contains("--fmad=false"), "{message}");
        // A virtual architecture has no cubin.
        let source = "extern \"C\" __global__ void k() {}";
        assert!(compile_cubin("empty.cu", source, "compute_90").is_err());
        assert!(compile_ptx("nul.cu", "\0", "compute_90").is_err());
    }
}
