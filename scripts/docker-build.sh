#!/usr/bin/env bash
# Builds the image `tessera:local` without pulling anything: compiles the
# tessera binary (also the coordinator and worker, by the links named so),
# stages it (and Debian's etcd, for HA coordinators; the Vulkan loader and
# Mesa's lavapipe for the GPU device) with the shared libraries they link
# (found by ldd) in docker/rootfs/, and builds the `FROM scratch`
# Dockerfile on top. Works the same with or without registry
# access.
#
# Usage: scripts/docker-build.sh [--debug]
#   --debug: use the debug binaries of `cargo test` (what CI has built
#            already) instead of a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/need-protoc.sh
# etcd for HA coordinators (compose runs one): Debian's etcd-server.
if ! command -v etcd >/dev/null && command -v apt-get >/dev/null; then
  { apt-get install -y -q etcd-server || { apt-get update -q && apt-get install -y -q etcd-server; }; } >/dev/null 2>&1
fi
command -v etcd >/dev/null || { echo "etcd is needed in the image (apt-get install etcd-server)" >&2; exit 1; }
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  # The test build makes the binaries too (and is what CI has warm).
  cargo test --workspace --no-run --quiet
else
  profile=release
  cargo build --release --workspace --bins --quiet
fi
root=docker/rootfs
rm -rf "$root"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$root/certs"
chmod 1777 "$root/tmp"
# One binary: `tessera` is also `coordinator` and `worker` when called by
# those names (links), instead of three copies of the same code.
objcopy --strip-debug "target/$profile/tessera" "$root/usr/local/bin/tessera"
for bin in coordinator worker; do
  ln -s tessera "$root/usr/local/bin/$bin"
done
cp "$(command -v etcd)" "$root/usr/local/bin/etcd"
# onnxruntime's library for the CPU device, from the onnxruntime==1.32.0
# wheel (no Python in the image; ORT_DYLIB_PATH in the Dockerfile names it).
ort_lib=libonnxruntime.so.1.32.0
ort_dir=.cache/onnxruntime-1.32.0
if [ ! -f "$ort_dir/$ort_lib" ]; then
  mkdir -p "$ort_dir"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$ort_dir" onnxruntime==1.32.0
  python3 - "$ort_dir" "$ort_lib" <<'PY'
import glob, sys, zipfile
d, lib = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{d}/onnxruntime-1.32.0-*.whl")[0]
with zipfile.ZipFile(wheel) as z, open(f"{d}/{lib}", "wb") as out:
    out.write(z.read(f"onnxruntime/capi/{lib}"))
PY
fi
mkdir -p "$root/usr/local/lib/tessera"
cp "$ort_dir/$ort_lib" "$root/usr/local/lib/tessera/$ort_lib"
# The GPU device (wgpu over Vulkan): the Vulkan loader, and Mesa's lavapipe,
# a software Vulkan device, for machines without a GPU. On an NVIDIA node
# the NVIDIA container toolkit mounts the driver and its ICD
# (/etc/vulkan/icd.d/nvidia_icd.json) when NVIDIA_DRIVER_CAPABILITIES
# names graphics; the loader then lists both and wgpu prefers the real GPU.
# Mesa's device-selection layer is left out (it only reorders devices).
# The loader cache is read once into a variable, never piped into a reader
# that stops early (grep -q, awk's exit): under pipefail ldconfig's SIGPIPE
# (exit 141) fails the script once the cache outgrows a pipe's 64 KiB, as
# it did in CI after the test installs.
lvp_icd=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json
ld_cache=$(ldconfig -p)
if [ ! -e "$lvp_icd" ] || ! grep -q 'libvulkan.so.1 ' <<<"$ld_cache"; then
  if command -v apt-get >/dev/null; then
    { apt-get install -y -q mesa-vulkan-drivers libvulkan1 ||
      { apt-get update -q && apt-get install -y -q mesa-vulkan-drivers libvulkan1; }; } >/dev/null 2>&1
  fi
  ld_cache=$(ldconfig -p)
fi
[ -e "$lvp_icd" ] || { echo "the image's GPU device needs Mesa's lavapipe (apt-get install mesa-vulkan-drivers)" >&2; exit 1; }
vulkan_loader=$(awk '/libvulkan.so.1 .*x86-64/ {print $NF; exit}' <<<"$ld_cache")
[ -n "$vulkan_loader" ] || { echo "the image's GPU device needs the Vulkan loader (apt-get install libvulkan1)" >&2; exit 1; }
lvp_lib=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ICD"]["library_path"])' "$lvp_icd")
gpu_libs=("$vulkan_loader" "$lvp_lib")
for lib in "${gpu_libs[@]}"; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
mkdir -p "$root/usr/share/vulkan/icd.d"
cp "$lvp_icd" "$root$lvp_icd"
# The dynamic loader and every library the binaries, onnxruntime and the
# Vulkan libraries link.
libs=$(for bin in "$root"/usr/local/bin/* "$root/usr/local/lib/tessera/$ort_lib" "${gpu_libs[@]}"; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u)
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
du -sh "$root"
docker build --quiet -t tessera:local .
docker image ls tessera:local
# With the GPU device it stays under 400 MB (340 MB measured, debug build).
size=$(docker image inspect -f '{{.Size}}' tessera:local)
[ "$size" -le 400000000 ] || { echo "the image is $((size / 1000000)) MB, over 400 MB" >&2; exit 1; }
