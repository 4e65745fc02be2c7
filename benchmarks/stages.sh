# Stages of one call to the GPU machine, each bounded, each packed as it ends. Sourced by a
# call script (benchmarks/runs/waveN/callN.sh), run from the repository root there:
#
#     . benchmarks/stages.sh call3 570        # the archive's name; the call's seconds
#     stage gpu_tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_budget_gpu.py
#     stage matrix 300 python3 scripts/matrix_gpu.py --out "$OUT/matrix" --in-process ...
#
# A stage runs at most its seconds, and no later than the call's end less a margin for the
# packing; `timeout -k` kills what does not stop on SIGTERM (a training run answers SIGTERM by
# ending after the step in progress, which may be long). Its output goes to $OUT/NAME.txt,
# its end (seconds and exit status) to $OUT/stages.txt; then everything under $OUT is packed
# into the archive ($FINAL/NAME.tgz) and stages.txt copied to $FINAL/log.txt. Nothing under
# $OUT is changed by the packing: a later stage may read what an earlier one wrote.
# So a call cut short at the machine's limit still brings back every stage that ended.
FINAL=$OUT
CALL=$1
CALL_S=${2:-570}
OUT=/tmp/$CALL
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 MINIDNN_REQUIRE_GPU=1
export MINIDNN_CACHE=${MINIDNN_CACHE:-/tmp/cache}
START=$(date +%s)
PACK_S=15           # left at the end for the last packing

elapsed() { echo $(( $(date +%s) - START )); }

# cap SECONDS: SECONDS, or what is left of the call before the packing margin (at least 1).
cap() {
    local left=$(( CALL_S - PACK_S - $(elapsed) ))
    echo $(( left < $1 ? (left > 1 ? left : 1) : $1 ))
}

pack() {
    tar czf "$FINAL/$CALL.tgz" -C "$OUT" .
    cp "$OUT/stages.txt" "$FINAL/log.txt"
}

# stage NAME SECONDS COMMAND...: COMMAND bounded by cap SECONDS, logged, then packed.
stage() {
    local name=$1 limit
    limit=$(cap "$2")
    shift 2
    timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $? at $(elapsed) s (limit $limit s)" | tee -a "$OUT/stages.txt"
    pack
}
