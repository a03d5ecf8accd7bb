#!/usr/bin/env bash
# One-step setup for qrl: installs everything the build, the tests and the demo need.
# Idempotent; says what it installs. Run from anywhere:  deploy/setup.sh
#
#   1. Debian packages (apt-get): compilers, gRPC C core, protobuf-c, libuv, librdkafka,
#      jansson, libyaml, PCRE2, utf8proc, Criterion, libmicrohttpd, gnuplot, jq, clang (fuzzing),
#      openssl (the CLI: the rpc tests make self-signed TLS certificates), iproute2; the list
#      is deploy/packages.txt.
#   2. The CUDA 13 compiler, headers, cuBLAS and NCCL from NVIDIA's PyPI wheels into
#      $QRL_DEPS/cuda, only where no CUDA toolkit is installed (so CUDA code compiles on a
#      machine without a GPU).
#   3. Apache Kafka 4.x jars from Maven Central into $QRL_DEPS/kafka (deploy/kafka/).
#
# QRL_DEPS defaults to <repo>/.deps (git-ignored).  QRL_SETUP_SKIP_CUDA=1 / _KAFKA=1 skip steps.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps=${QRL_DEPS:-$root/.deps}
mkdir -p "$deps"
say() { printf 'setup: %s\n' "$*"; }

# ---- 1. Debian packages -------------------------------------------------------------
# the list is deploy/packages.txt (the container image, deploy/docker/, reads it too)
# shellcheck disable=SC2207 # one package name a word
pkgs=($(sed 's/#.*//' "$root/deploy/packages.txt"))
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  log="$deps/apt.log"
  if ! { $sudo_cmd apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
           "${missing[@]}"; } >"$log" 2>&1; then
    tail -30 "$log"; say "apt-get failed (full log: $log)"; exit 1
  fi
else
  say "Debian packages: all present"
fi

# ---- 2. CUDA toolchain from PyPI (only without a system toolkit) --------------------
if [ "${QRL_SETUP_SKIP_CUDA:-0}" != 1 ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    say "CUDA toolkit: system nvcc found, nothing to install"
  elif [ -x "$deps/cuda/nvidia/cu13/bin/nvcc" ]; then
    say "CUDA toolkit: $deps/cuda/nvidia/cu13 already installed"
  else
    say "installing the CUDA 13 compiler, runtime, cuBLAS and NCCL wheels into $deps/cuda"
    wheels=('nvidia-cuda-nvcc>=13,<14' 'nvidia-cuda-runtime>=13,<14' 'nvidia-cuda-cccl>=13,<14'
            'nvidia-cuda-crt>=13,<14' 'nvidia-nccl-cu13' 'nvidia-cublas>=13,<14')
    pip_cmd=(python3 -m pip install -q --disable-pip-version-check --no-warn-script-location
             --target "$deps/cuda")
    # A Debian-managed python refuses installs (PEP 668) unless told; --target keeps it
    # out of the system's site-packages either way.
    "${pip_cmd[@]}" "${wheels[@]}" 2>/dev/null || "${pip_cmd[@]}" --break-system-packages "${wheels[@]}"
  fi
  # The wheels ship versioned .so files only; the linker wants the plain names.
  for libdir in "$deps/cuda/nvidia/cu13/lib" "$deps/cuda/nvidia/nccl/lib"; do
    [ -d "$libdir" ] || continue
    for lib in cudart cublas cublasLt nccl; do
      [ -e "$libdir/lib$lib.so" ] && continue
      real=$(ls "$libdir/lib$lib.so."* 2>/dev/null | head -1 || true)
      [ -n "$real" ] && ln -sf "$(basename "$real")" "$libdir/lib$lib.so"
    done
  done
fi

# ---- 3. Apache Kafka jars ----------------------------------------------------------
if [ "${QRL_SETUP_SKIP_KAFKA:-0}" != 1 ] && [ -f "$root/deploy/kafka/fetch.sh" ]; then
  "$root/deploy/kafka/fetch.sh" "$deps/kafka"
fi
say "done (dependencies under $deps)"
