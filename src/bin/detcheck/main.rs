//! The `detcheck` command: the command line of `detcheck::cli`, which the Python wheel's
//! `detcheck` command runs too (one implementation, two ways to install it).
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(detcheck::cli::run(std::env::args_os()))
}
