#!/usr/bin/env bash
# Fetch the wheels a lent GPU machine lacks for benchmarks/gpu.py, and print the one command to run there.
#
# The lent machines (H100/H200: Python 3.12, torch 2.11, torchvision 0.26, Lightning, torchmetrics,
# numpy, pillow, matplotlib, tqdm, PyYAML preinstalled) reach no package registry. This downloads,
# into the repository's gitignored .gpu-wheels/, the wheels of what the package imports that they
# lack (cp312, manylinux x86_64, no dependencies resolved: each one named here), then prints the
# device command and the folder to carry. Run it on a machine that reaches PyPI:
#
#     bash benchmarks/gpu_carry.sh            # about 45 MiB
#
# Carried (versions the package is tested with, within pyproject.toml's ranges):
#   simplejpeg      the CPU JPEG decode (libjpeg-turbo), imported by every frame and store reader
#   av              PyAV: writes the synthetic videos, packs the stores, reads mp4 (FFmpeg bundled; ~34 MiB)
#   torchcodec      the device JPEG decode (nvjpeg): 0.17.0, built for torch >= 2.11 (its table: 0.11 is
#                   2.11 only, 0.12-0.17 >= 2.11) and CUDA-enabled on PyPI for Linux (bundles libnvjpeg
#                   13.0, matching torch's cu130); 0.11 on PyPI is CPU-only. Without it, torchvision's
#                   decode_jpeg decodes on the device instead. Its mp4 decoder needs FFmpeg's shared
#                   libraries, which the machine lacks: the NVDEC probe will say so.
#   jsonargparse, docstring-parser, typeshed-client
#                   the LightningCLI (`lightning-multigrid fit`); gpu.py does not import them
# Left out:
#   pytorchvideo (and fvcore, iopath)   no wheel on PyPI (source only); only benchmarks/loader.py
#                                       --pytorchvideo and pytorchvideo hub weights use it, not gpu.py
#   torch, torchvision, lightning, pytorch-lightning, torchmetrics, numpy, pillow, matplotlib, tqdm,
#   PyYAML, typing-extensions           preinstalled there
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=.gpu-wheels
PACKAGES=(
    simplejpeg==1.9.0
    av==18.1.0
    torchcodec==0.17.0
    jsonargparse==4.53.0
    docstring-parser==0.18.0
    typeshed-client==2.15.0
)

rm -rf "$WHEELS"  # one version of each: two stop the install there
mkdir -p "$WHEELS"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${PACKAGES[@]}"

if ! git check-ignore -q "$WHEELS/x.whl"; then
    echo "warning: $WHEELS/ is not gitignored; it must not be committed" >&2
fi
ls -l "$WHEELS"
total=$(du -cb "$WHEELS"/*.whl | tail -1 | cut -f1)
echo "total: $((total / 1024 / 1024)) MiB in $(ls "$WHEELS"/*.whl | wc -l) wheels (the working tree and these travel together: at most 64 MiB)"
cat <<'EOF'

On the device (the `run` tool), carry [".gpu-wheels"], timeout_s 560, command:

set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --target .gpu-site .gpu-wheels/*.whl && mkdir -p $OUT/gpu && PYTHONPATH=.gpu-site:. PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --out $OUT/gpu --budget-s 480 2>&1 | tee $OUT/gpu/log.txt
EOF
