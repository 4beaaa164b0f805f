"""detcheck's command line from the wheel: the ``detcheck`` console script and
``python -m detcheck`` (``detcheck check``, ``compare``, ``env``...; ``detcheck --help``).

It is the cargo binary's implementation (``detcheck::cli::run``, compiled into the native
module), run in this process: no Rust toolchain is needed to use it, and its output, reports and
exit codes are the binary's.
"""

import signal
import sys


def main(argv=None):
    """Runs ``detcheck`` with ``argv`` (default: this process's arguments) and returns its exit
    code."""
    from ._detcheck import cli

    args = sys.argv[1:] if argv is None else list(argv)
    # Whatever Python printed first comes first: the command writes to the same descriptors.
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C stops the command as it stops the binary (Python's own handler would only run once
    # the command returned). Every process a check launched leads its own process group and is
    # killed with it.
    if hasattr(signal, "SIGINT"):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return cli(["detcheck", *args])


if __name__ == "__main__":
    sys.exit(main())
