#!/usr/bin/env bash
# Issue 45: run the six studies whose Published-findings rows were registered before their runs,
# one after the other, on one thread at the lowest priority, and ship each report with its data:
#
#     nohup ./reissue.sh > runs/reissue.log 2>&1 &       # from the repository root
#     ./reissue.sh rope-vs-learned gqa-vs-mha             # only these studies, in this order
#
# Resumable: each study trains into runs/<name>/ (the default --out, not tracked), and
# `workbench run` keeps the finished runs of its folder, so running this again after an
# interruption (Ctrl-C, a reboot) trains only what is missing; a study already complete retrains
# nothing and only rewrites its report. Never pass --fresh here: it would discard those runs.
# `--reports reports` puts its report in the shipped reports/<name>/ (the default is beside the
# results, runs/<name>/reports/). Then `workbench report runs/<name> --out reports --with-data`
# rewrites reports/<name>/ with data/ (the store, and the weights of the lowest finished seed of each variant, what the pictures load), so that
# `workbench report reports/<name>/data` rebuilds it from a clone. The index is rewritten last.
# A study whose runs fail (exit status 3) does not stop the next; the script exits non-zero.
#
# Planned cost (each study file's header, 2026-12-03), CPU minutes on one thread, expected (at
# most): alibi-extrapolation-text 7 (18), rope-vs-learned 7 (14), gqa-vs-mha 28 (36),
# rmsnorm-vs-layernorm 32 (40), swiglu-vs-gelu 18 (26), postnorm-warmup 12 (26): about 105 in all,
# at most about 160; wall time is longer on a shared machine at nice 19.
set -u
cd "$(dirname "$0")"

STUDIES=(alibi-extrapolation-text rope-vs-learned gqa-vs-mha rmsnorm-vs-layernorm swiglu-vs-gelu postnorm-warmup)
[ "$#" -gt 0 ] && STUDIES=("$@")
BIN=.venv/bin
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p runs
failed=()

for name in "${STUDIES[@]}"; do
    study="studies/$name.yaml"
    [ -f "$study" ] || { echo "reissue: no $study" >&2; failed+=("$name"); continue; }
    echo "reissue: $name: start $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    if nice -n 19 "$BIN/workbench" run "$study" --jobs 1 --quiet --reports reports; then
        nice -n 19 "$BIN/workbench" report "runs/$name" --out reports --with-data || failed+=("$name (report)")
    else
        rc=$?
        echo "reissue: $name: workbench run exited $rc (rerun this script to resume it)" >&2
        failed+=("$name (run: exit $rc)")
        if [ "$rc" -eq 130 ] || [ "$rc" -eq 143 ]; then break; fi  # stopped by Ctrl-C / kill: stop here too
    fi
    echo "reissue: $name: end $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
done

"$BIN/workbench" report-index || failed+=("report-index")
if [ "${#failed[@]}" -gt 0 ]; then
    echo "reissue: not complete: ${failed[*]}" >&2
    exit 1
fi
echo "reissue: all done; commit reports/ (each <name>/ with its data/) and reports/README.md"
