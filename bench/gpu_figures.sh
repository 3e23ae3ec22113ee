#!/usr/bin/env bash
# docs/benchmarks-journal.md's GPU figures on a GPU machine that has torch but not mule's other
# dependencies: `mule demo` at the demo's size, at Multi30K's (29k) and with the paper
# preset, and the real Multi30K text with the real photographs (real), each through
# bench/stage_times.py (the script that measures the CPU's figures), as far as SECONDS
# allow (RUNS: which of demo, 29k, paper and real, in the order given; demo 29k paper by
# default). bench/cuda_paths.py runs first (CHECK=0 skips it): the trainer must learn a toy
# task on CUDA with AMP, or nothing else runs. Then a tiny demo (SMOKE=0 skips it): if the
# bundle lacks something, that shows in seconds, not after the first real run.
#
#   python bench/offline_bundle.py --have their-pip-list.txt --python 3.12 --out BUNDLE --for demo   # here
#   bash bench/gpu_figures.sh BUNDLE OUT [SECONDS [RUNS...]]                              # there
#
# real needs REAL_DATA=DIR holding multi30k/data (the official files) and images/ (the
# photographs). The bundle (59 MiB) and the real data (28 MB) together are more than one
# copy to the machine carries (64 MiB): a second call to a machine the first left warm may
# pass a BUNDLE folder without site.tar.xz*, and the site the first call unpacked in /tmp is used.
#
# OUT gets each run's table (NAME.txt), its output line by line with seconds (NAME.log) and
# the stage records of every workdir (records.tgz). The paper preset runs with random
# extractor weights: ImageNet's ResNet-152 is a download such a machine cannot make.
set -uo pipefail
bundle=$1 out=$2 budget=${3:-560}
runs=("${@:4}")
[ ${#runs[@]} -gt 0 ] || runs=(demo 29k paper)
for name in "${runs[@]}"; do
  case $name in demo | 29k | paper | real) ;; *)
    echo "unknown run '$name': choose from demo, 29k, paper, real" >&2
    exit 2
    ;;
  esac
done
started=$(date +%s)
left() { echo $((budget - ($(date +%s) - started))); }
export PYTHONUNBUFFERED=1
mkdir -p "$out"
if compgen -G "$bundle/site.tar.xz*" >/dev/null; then
  rm -rf /tmp/site
  cat "$bundle"/site.tar.xz* | tar -xJ -C /tmp || exit 1
elif [ -d /tmp/site ]; then
  echo "no bundle in $bundle: the site an earlier call unpacked in /tmp/site (a warm machine)"
else
  echo "no bundle in $bundle and no /tmp/site: this machine is a fresh one; carry the bundle" >&2
  exit 1
fi
# mule as installed, for the processes a stage starts with `python -m mule...`: mule.<folder>
# is the checkout's folder (a namespace package, as stage_times.py's runner maps it in-process)
mkdir -p /tmp/mule-checkout
ln -sfn "$PWD" /tmp/mule-checkout/mule
export PYTHONPATH=/tmp/site:/tmp/mule-checkout${PYTHONPATH:+:$PYTHONPATH}
echo "bundle unpacked in $(($(date +%s) - started)) s; $(nproc) CPUs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import prefect, mlflow, duckdb, faiss, fasttext, sacremoses, torch, mule.tasks.shared.fasttext_worker
print('imports: ok; torch', torch.__version__, '; CUDA', torch.cuda.is_available())" || exit 1

run() { # NAME [stage_times.py arguments]: one run, cut off when the budget is spent
  local name=$1 limit
  shift
  limit=$(left)
  if [ "$limit" -lt 30 ]; then
    echo "$name: not run ($limit s left)"
    return 1
  fi
  rm -rf "/tmp/st-$name" # from an empty workdir, also on a machine an earlier call left warm
  timeout -k 5 "$limit" python3 bench/stage_times.py --quiet-wait 0 --root "/tmp/st-$name" --log "$out/$name.log" \
    "$@" 2>&1 | tee "$out/$name.txt"
  local status=${PIPESTATUS[0]}
  pkill -f -- "--workdir /tmp/st-$name/" # a run cut off leaves its `mule demo` behind: stop it
  for _ in 1 2 3 4 5 6 7 8 9 10; do pgrep -f -- "--workdir /tmp/st-$name/" >/dev/null && sleep 1; done
  pkill -9 -f -- "--workdir /tmp/st-$name/"
  [ "$status" = 0 ] || echo "$name: stopped with status $status after $(($(date +%s) - started)) s"
  return "$status"
}

# the model library on CUDA first (a minute at most): the toy task must be learned with AMP
# on, or the long runs would measure a model that does not train (as on 2026-11-28)
if [ "${CHECK:-1}" != 0 ]; then
  timeout -k 5 "$(left)" python3 bench/cuda_paths.py --images 64 2>&1 | tee "$out/cuda_paths.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "the CUDA check failed: no figures taken" >&2; exit 1; }
fi
if [ "${SMOKE:-1}" != 0 ]; then
  run tiny --set data.train_images=60 --set data.val_images=20 --set data.test_images=20 || exit 1
fi
declare -A arguments=([demo]="" [29k]="--size 29k" [paper]="--preset paper --set features.weights=random"
  [real]="--size real --source ${REAL_DATA:-}/multi30k --images ${REAL_DATA:-}/images")
for name in "${runs[@]}"; do
  if [ "$name" = real ] && [ ! -d "${REAL_DATA:-}/images" ]; then
    echo "real: not run (REAL_DATA=${REAL_DATA:-} holds no images/ folder)"
    continue
  fi
  # shellcheck disable=SC2086 # the arguments split into words on purpose
  run "$name" ${arguments[$name]}
done
tar -czf "$out/records.tgz" /tmp/st-*/*/state/stages 2>/dev/null
echo "done in $(($(date +%s) - started)) s"
