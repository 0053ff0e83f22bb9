#!/usr/bin/env bash
# The GPU check in one call, for a fresh machine whose Python already has a CUDA build of torch:
# install the project keeping that torch, run the CUDA tests, `python -m benchmarks.gpu` (every
# section) and a one-GPU `workbench run --profile gpu`, and write everything into ONE folder.
# Each step has its own time budget and the whole script a hard one (default 480 s), so it stops
# by itself inside a 9-minute lease; a failing or timed-out step is recorded and the next runs.
#
#   bash benchmarks/gpu_check.sh [OPTIONS] [OUT]          # OUT: the output folder (default $OUT)
#   bash benchmarks/gpu_check.sh --device cpu --tiny --no-install /tmp/rehearsal   # CPU rehearsal
#
# Options:
#   --device cuda|cpu   where to measure (default cuda)
#   --tiny              toy sizes, fewer training steps, and of the tests only those that need CUDA
#   --no-install        skip the pip install (the project is installed already)
#   --wheels DIR        install offline, only from the wheels in DIR (benchmarks/gpu_wheels.sh)
#   --commit SHA        the commit checked, for a copy of the tree without .git
#   --steps LIST        comma-separated subset of: install,tests,benchmark,study (default: all)
#   --sections "A B"    only these sections of python -m benchmarks.gpu (its --only)
#   --tests "ARGS"      pytest arguments instead of the CUDA test files
#   --budget STEP=S     a step's budget in seconds, repeatable (install 45, tests 90, benchmark 270, study 60)
#   --total S           hard limit of the whole script in seconds (default 480)
#   --helper-limit S    limit of each short helper call: torch info, study results, the record (default 60)
#   --python PATH       the Python with torch (default python3)
#
# OUT receives (at most 8 files, what the device tool brings back): check.json (device, torch,
# CUDA, commit, each step's status / exit status / seconds / budget, test counts, benchmark
# sections and checks, study runs), gpu.json (python -m benchmarks.gpu), study.json (workbench
# results of the study), tests.xml (junit), and one log per step: install.log, tests.log,
# gpu.log, study.log. Exit status 0 when every step that ran passed, 1 otherwise, 2 on bad usage.
set -u

usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }

STEPS="install tests benchmark study"
# install: ~16 small wheels and the project; tests: 24 FlexAttention compiles on 4 workers; benchmark:
# ~5 minutes if every section runs, so its last (decode, no goal) may be cut, the others kept
declare -A BUDGET=([install]=45 [tests]=90 [benchmark]=270 [study]=60)
TOTAL=480
HELPER_LIMIT=60  # a helper call only imports torch or reads records: past this it hangs
RESERVE=15   # seconds kept back from the steps for collecting results and writing check.json
GRACE=5      # after a step's budget, SIGTERM; this much later, SIGKILL
DEVICE=cuda TINY="" INSTALL=1 WHEELS="" COMMIT="" SECTIONS="" TEST_ARGS="" PYTHON=python3 OUT_DIR="${OUT:-}"
ARGV="bash benchmarks/gpu_check.sh $*"

value() { (($# >= 2)) && [[ -n $2 ]] || die "$1: needs a value (see --help)"; }
while (($#)); do
  case $1 in
    --device) value "$@"; DEVICE=$2; shift ;;
    --tiny) TINY=1 ;;
    --no-install) INSTALL="" ;;
    --wheels) value "$@"; WHEELS=$2; shift ;;
    --commit) value "$@"; COMMIT=$2; shift ;;
    --steps) value "$@"; STEPS=${2//,/ }; shift ;;
    --sections) value "$@"; SECTIONS=$2; shift ;;
    --tests) value "$@"; TEST_ARGS=$2; shift ;;
    --budget) [[ ${2:-} =~ ^(install|tests|benchmark|study)=([0-9]+)$ ]] \
                || die "--budget: expected STEP=SECONDS with STEP one of install, tests, benchmark, study; got '${2:-}'"
              BUDGET[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift ;;
    --total) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--total: expected whole seconds, got '${2:-}'"; TOTAL=$2; shift ;;
    --helper-limit) [[ ${2:-} =~ ^[0-9]+$ ]] || die "--helper-limit: expected whole seconds, got '${2:-}'"
                    HELPER_LIMIT=$2; shift ;;
    --python) value "$@"; PYTHON=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) OUT_DIR=$1 ;;
  esac
  shift
done
[[ $DEVICE == cuda || $DEVICE == cpu ]] || die "--device: expected cuda or cpu, got '$DEVICE'"
for step in $STEPS; do
  [[ -v BUDGET[$step] ]] || die "--steps: unknown step '$step' (valid: install, tests, benchmark, study)"
done
[[ -n $OUT_DIR ]] || die "no output folder: pass one as the last argument (or set OUT)"
[[ -z $WHEELS || -d $WHEELS ]] || die "--wheels: $WHEELS is not a folder (benchmarks/gpu_wheels.sh makes one)"
((TOTAL > RESERVE)) || die "--total: $TOTAL s leaves nothing after the $RESERVE s kept for the results"

# paths given relative to where the script was called from, before it moves to the repository
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd) || die "cannot create the output folder $OUT_DIR"
[[ -z $WHEELS ]] || WHEELS=$(cd "$WHEELS" && pwd)
[[ $PYTHON != */* ]] || PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
cd "$(dirname "$0")/.." || exit 2
# files of an earlier check in the same folder would pass for this one's
rm -f "$OUT_DIR"/{check.json,gpu.json,gpu.json.partial,study.json,tests.xml,install.log,tests.log,gpu.log,study.log}
SCRATCH=$(mktemp -d)  # torch records, step records, the study's run folders (checkpoints)
trap 'rm -rf "$SCRATCH"' EXIT
export PYTHONUNBUFFERED=1
START=$SECONDS STARTED=$(date +%s.%N)

say() { echo "[gpu_check $(date -u +%H:%M:%S)] $*"; }
selected() { [[ " $STEPS " == *" $1 "* ]]; }
record() {  # record NAME STATUS RC SECONDS BUDGET LOG NOTE
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$SCRATCH/steps.tsv"
}

# step NAME LOG COMMAND...: COMMAND within NAME's budget, cut to what the total leaves; its
# output to OUT/LOG. timeout signals COMMAND's whole process group (workers, measuring processes).
step() {
  local name=$1 log=$2; shift 2
  local left=$((TOTAL - RESERVE - (SECONDS - START))) budget=${BUDGET[$name]}
  if ((left < 5)); then
    say "$name: skipped, no time left of the $TOTAL s total"
    record "$name" skipped "" 0 "" "" "no time left of the $TOTAL s total"
    return
  fi
  ((budget > left)) && budget=$left
  say "$name: started, budget $budget s"
  local t0 rc seconds status
  t0=$(date +%s.%N)
  timeout --kill-after=$GRACE "$budget" "$@" </dev/null >"$OUT_DIR/$log" 2>&1
  rc=$?
  seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if ((rc == 0)); then status=passed
  elif ((rc == 124)) || { ((rc == 137)) && awk -v s="$seconds" -v b="$budget" 'BEGIN { exit !(s >= b) }'; }; then
    status=timeout
  else status=failed
  fi
  record "$name" "$status" "$rc" "$seconds" "$budget" "$log" ""
  say "$name: $status (exit status $rc) after $seconds s"
  if [[ $status != passed ]]; then
    tail -n 15 "$OUT_DIR/$log" | sed 's/^/    | /'
  fi
}

skip() {  # skip NAME NOTE
  say "$1: skipped ($2)"
  record "$1" skipped "" 0 "" "" "$2"
}

# ---- the machine and its torch ---------------------------------------------------------------
timeout "$HELPER_LIMIT" "$PYTHON" -m benchmarks.gpu_check info >"$SCRATCH/torch-before.json" 2>"$SCRATCH/info.err"
say "python: $PYTHON; torch: $(tr -d '\n ' <"$SCRATCH/torch-before.json" | head -c 400)"
if [[ $DEVICE == cuda ]] && ! grep -q '"cuda_available": true' "$SCRATCH/torch-before.json"; then
  say "WARNING: --device cuda, but this torch sees no CUDA GPU: the GPU steps will fail (--device cpu --tiny rehearses)"
fi
ABORT=""

# ---- 1. install, keeping the machine's torch ---------------------------------------------------
if ! selected install; then skip install "not in --steps"
elif [[ -z $INSTALL ]]; then skip install "--no-install"
else
  step install install.log "$PYTHON" -m benchmarks.gpu_check install --torch-before "$SCRATCH/torch-before.json" \
    --record "$SCRATCH/install.json" ${WHEELS:+--wheels "$WHEELS"}
  timeout "$HELPER_LIMIT" "$PYTHON" -m benchmarks.gpu_check info >"$SCRATCH/torch-after.json" 2>>"$OUT_DIR/install.log"
  if ! verdict=$("$PYTHON" -m benchmarks.gpu_check same-torch "$SCRATCH/torch-before.json" "$SCRATCH/torch-after.json" 2>&1); then
    ABORT="torch was replaced by the install"
  fi
  echo "$verdict" | tee -a "$OUT_DIR/install.log"
fi

# ---- 2. the CUDA tests -----------------------------------------------------------------------------
# The test files of the GPU path; with --tiny only the cases that need CUDA (they skip on a CPU:
# the rehearsal checks this step's wiring without repeating the suite's CPU cases).
if [[ -z $TEST_ARGS ]]; then
  if [[ -n $TINY ]]; then
    TEST_ARGS="tests/model/test_flex_attention.py::test_flex_equals_dense_on_cuda
      tests/run/test_gpu_paths.py::test_a_run_on_the_gpu_finishes_and_a_diverging_one_is_recorded_at_its_first_bad_step"
  else
    TEST_ARGS="tests/model/test_flex_attention.py tests/run/test_gpu_paths.py tests/run/test_gpu_placement.py
      tests/cost/test_measure_memory_limit.py"
  fi
fi
PARALLEL=()  # FlexAttention compiles each case on the CPU: 4 workers share the GPU's 16 cores' work
if [[ $DEVICE == cuda && -z $TINY ]] && "$PYTHON" -c "import xdist" 2>/dev/null; then PARALLEL=(-n 4); fi
if [[ -n $ABORT ]]; then skip tests "$ABORT"
elif ! selected tests; then skip tests "not in --steps"
else
  # shellcheck disable=SC2086 # TEST_ARGS is a list of pytest arguments
  step tests tests.log "$PYTHON" -m pytest -v -rfEs -p no:cacheprovider "${PARALLEL[@]}" \
    --junitxml="$OUT_DIR/tests.xml" $TEST_ARGS
fi

# ---- 3. python -m benchmarks.gpu: every section ----------------------------------------------------
if [[ -n $ABORT ]]; then skip benchmark "$ABORT"
elif ! selected benchmark; then skip benchmark "not in --steps"
else
  # shellcheck disable=SC2086 # SECTIONS is a list of section names
  step benchmark gpu.log "$PYTHON" -m benchmarks.gpu --device "$DEVICE" ${TINY:+--tiny} --out "$OUT_DIR/gpu.json" \
    ${SECTIONS:+--only $SECTIONS}
fi

# ---- 4. a study through the CLI, on one GPU ------------------------------------------------------------
# studies/tiny.yaml (2 runs) with its gpu profile (bf16-mixed): the command a GPU user types, with
# its worker process, GPU placement and report; the quickstart's speed is the benchmark's section.
STUDY_SET=()
[[ $DEVICE == cpu ]] && STUDY_SET+=(--set train.precision=32 --set train.accelerator=cpu)
[[ -n $TINY ]] && STUDY_SET+=(--set train.steps=4 --set train.eval_every=4 --set train.log_every=2 --set task.n_eval=16)
if [[ -n $ABORT ]]; then skip study "$ABORT"
elif ! selected study; then skip study "not in --steps"
else
  step study study.log "$PYTHON" -m workbench run studies/tiny.yaml --profile gpu "${STUDY_SET[@]}" \
    --out "$SCRATCH/study" --fresh --quiet --jobs 1
  if [[ -f $SCRATCH/study/results.db ]]; then
    timeout "$HELPER_LIMIT" "$PYTHON" -m workbench results "$SCRATCH/study" --format json >"$OUT_DIR/study.json" 2>>"$OUT_DIR/study.log"
  fi
fi

# ---- the record ----------------------------------------------------------------------------------------
timeout "$HELPER_LIMIT" "$PYTHON" -m benchmarks.gpu_check summary "$OUT_DIR" "$SCRATCH" --argv "$ARGV" --started "$STARTED" \
  --total "$TOTAL" --device "$DEVICE" ${TINY:+--tiny} ${COMMIT:+--commit "$COMMIT"}
say "wrote $OUT_DIR/check.json after $((SECONDS - START)) s"
"$PYTHON" -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['passed'] else 1)" "$OUT_DIR/check.json" 2>/dev/null
