#!/usr/bin/env bash
# Issue 45: re-issue shipped studies under the current verdict rule, one after the other, on one
# thread at the lowest priority, and ship each report with its data:
#
#     nohup ./reissue.sh heads families > runs/reissue.log 2>&1 &   # from the repository root
#     ./reissue.sh rope-vs-learned gqa-vs-mha                        # these studies, in this order
#
# Before a study is re-issued, its file is registered in a commit of its own: `seeds:` adaptive
# with `max` of at least 12 (or a line saying why not), and the findings of earlier runs taken
# out of `notes:`, which the report prints (findings written after the run go in the header, and
# say so). A descriptive study's notes can be rewritten from its new report and stored with it by
# running this again: a study already complete retrains nothing and stores the study file anew.
#
# Resumable within a session: each study trains into runs/<name>/ (the default --out, not
# tracked), and `workbench run` keeps the finished runs of its folder, so running this again
# after an interruption (Ctrl-C, a reboot) trains only what is missing. runs/ does not reach a
# new session's checkout: start a study only where it can finish. Never pass --fresh here.
# `--reports reports` puts its report in the shipped reports/<name>/ (the default is beside the
# results, runs/<name>/reports/). Then `workbench report runs/<name> --out reports --with-data`
# rewrites reports/<name>/ with data/ (the store, and the weights the pictures load: the lowest
# finished seed of each variant the expect: entries compare, at a ladder's first rung), so that `workbench report reports/<name>/data` rebuilds
# it from a clone. The index is rewritten last.
# A study whose runs fail (exit status 3) does not stop the next; the script exits non-zero.
#
# REISSUE_RUNS names another folder for the studies' folders (default runs/): one outside the
# checkout survives a new session's checkout, so a section of hours resumes across sessions (the
# 2026 table: `REISSUE_RUNS=/work/table-runs ./reissue.sh qk-norm-lr gated-attention ...`). Every
# other study's folder there is offered to `workbench run --reuse`: a run of the same id another
# study finished (the 2026 studies share their baseline arm) is copied in, not trained again.
#
# Default list: none. Since 2026-12-04 (evening) every shipped study is issued under the current
# rule, so name the studies to re-issue. Where an earlier issue shipped its data, size the
# re-issue with `workbench plan studies/<name>.yaml --from reports/<name>/data` (nothing trains).
# A change of which runs the rule asks for (not of how verdicts read them: futility, 2026-12-04)
# re-issues a shipped adaptive study without training: `python -m benchmarks.decide --reissue
# reports/<name>/data runs/<name>` keeps the runs the runner's loop asks for, then `workbench
# report runs/<name> --out reports --with-data` as below.
#
# A name is a study file's name in studies/ (letters, digits, '-', '_', '.'; no path): anything
# else, or a file that is a link out of studies/, is refused. The study's own `name:` (which the
# run's folder, runs/<name>/, and its report are named after) is read from the file, since it
# may differ from the file's name. REISSUE_BIN names another folder of `workbench` and `python`
# (the tests give one that records what it is asked).
set -u
cd "$(dirname "$0")"

[ "$#" -gt 0 ] || { echo "reissue: name the studies to re-issue (e.g. ./reissue.sh heads)" >&2; exit 2; }
STUDIES=("$@")
BIN=${REISSUE_BIN:-.venv/bin}
RUNS=${REISSUE_RUNS:-runs}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$RUNS"
failed=()

# The `name:` of a study file, as the workbench validates it (a plain folder name), or nothing.
study_name() {
    "$BIN/python" -c 'import sys
from workbench.study import load_study
print(load_study(sys.argv[1]).study.name)' "$1"
}

for file in "${STUDIES[@]}"; do
    study="studies/$file.yaml"
    if ! [[ "$file" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]]; then
        echo "reissue: '$file' is not the name of a study file in studies/ (letters, digits, '-', '_', '.'); skipped" >&2
        failed+=("$file"); continue
    fi
    [ -f "$study" ] || { echo "reissue: no $study" >&2; failed+=("$file"); continue; }
    if [ "$(realpath "$study")" != "$(realpath studies)/$file.yaml" ]; then
        echo "reissue: $study is a link out of studies/ (to $(realpath "$study")); skipped" >&2
        failed+=("$file"); continue
    fi
    if ! name=$(study_name "$study") || [ -z "$name" ]; then
        echo "reissue: $study: its study name could not be read (see above); skipped" >&2
        failed+=("$file"); continue
    fi
    echo "reissue: $name ($study): start $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    reuse=()
    for other in "$RUNS"/*/; do
        other=${other%/}
        if [ "$other" != "$RUNS/$name" ] && [ -f "$other/results.db" ]; then reuse+=(--reuse "$other"); fi
    done
    if nice -n 19 "$BIN/workbench" run "$study" --out "$RUNS/$name" --jobs 1 --quiet --reports reports "${reuse[@]}"; then
        nice -n 19 "$BIN/workbench" report "$RUNS/$name" --out reports --with-data || failed+=("$name (report)")
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
