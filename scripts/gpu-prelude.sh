# Sourced by the GPU scripts (scripts/gpu-zero-change.sh, scripts/gpu-device-digests.sh), which
# run on a lent GPU machine without a Rust toolchain: installs the carried wheel ($1) into a venv
# that sees the machine's torch (--system-site-packages), puts it first on PATH, and defines
# `item NAME EXPECTED-EXIT COMMAND...`, which prints PASS or FAIL (with the output's tail) and
# sets `failed=1` on a failure.
wheel=${1:?usage: $0 WHEEL}
venv=${VENV:-/tmp/detcheck-gpu-venv}
python3 -m venv --system-site-packages "$venv"
# --system-site-packages sees the base interpreter's packages only: where the machine's python3
# is itself a virtual environment (the GPU image's /opt/torch/.venv holds torch), its
# site-packages are added to the new one by a .pth file.
python3 -c 'import site, sys; sys.prefix != sys.base_prefix and print("\n".join(site.getsitepackages()))' \
    >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/detcheck-gpu-parent.pth"
"$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$wheel" || exit 1
export PATH="$venv/bin:$PATH"
failed=0
item() {
    local name=$1 want=$2
    shift 2
    out=$("$@" 2>&1)
    code=$?
    if [ "$code" = "$want" ]; then echo "PASS $name"; else echo "FAIL $name (exit $code)"; echo "$out" | tail -30; failed=1; fi
}
