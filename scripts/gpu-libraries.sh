# Sourced by the GPU scripts that run carried binaries (scripts/gpu-selftest.sh,
# scripts/gpu-round2.sh): puts NVRTC's and NCCL's folders from pip's NVIDIA wheels in the
# machine's Python (nvidia/<part>/lib under its site-packages) on LD_LIBRARY_PATH. cudarc never
# tries the NCCL wheel's libnccl.so.2, so a libnccl.so link to it is made in a folder of our own
# (the site-packages are not touched). The driver's libcuda.so.1 is the machine's.
links=${TMPDIR:-/tmp}/detcheck-cuda-links
mkdir -p "$links"
mapfile -t folders < <(
    python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null |
    while read -r dir; do
        [ -d "$dir/nvidia" ] && find "$dir/nvidia" -path '*/lib/*' \( -name 'libnvrtc.so*' -o -name 'libnccl.so*' \) -printf '%h\n'
    done | sort -u
)
for folder in "${folders[@]}"; do
    [ -e "$folder/libnccl.so.2" ] && ln -sf "$folder/libnccl.so.2" "$links/libnccl.so"
done
export LD_LIBRARY_PATH="$links:$(IFS=:; echo "${folders[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "CUDA library folders: $LD_LIBRARY_PATH"
