# Between steps 1 and 2, for a plan with KTO runs, once carrying .gpu/k and once .gpu/m:
#   bash .gpu/k/stepk.sh   then   bash .gpu/m/stepk.sh
# puts the carried wheels (pyarrow; TRL, datasets, pandas, ...) into /tmp/site beside step 1's.
set -x
here=$(dirname "$0")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$here"/whl/*.whl
PYTHONPATH=/tmp/site python3 -c "import trl, datasets; print('trl', trl.__version__, 'datasets', datasets.__version__)" \
  || echo "not yet complete: carry the other KTO part (.gpu/k or .gpu/m) too"
