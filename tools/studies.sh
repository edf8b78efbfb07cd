#!/usr/bin/env bash
# The runs and tables of docs/studies.md: the five CPU-vs-GPU studies hotops grew out of, asked again.
#
#   tools/studies.sh run [--study NAME] OUT.json    one bench process over the studies' entries (f32),
#                                                   or one study's
#   tools/studies.sh tables RUN.json [GPU.json]     the Markdown tables of docs/studies.md from that run
#   tools/studies.sh tables --study NAME RUN.json [GPU.json]   one study's tables (tinymlp, classifierdl,
#                                                   pyspark, woolf, tf2)
#   tools/studies.sh tables --cpu-variant threads:1 ...   the CPU side of speed-ups and breakdowns
#                                                   from its one-thread entries (a shared, small CPU)
#   tools/studies.sh doc docs/studies.md [RUN.json [GPU.json]]  makes the page's tables again
#   tools/studies.sh filter [--study NAME]          the --benchmark_filter that `run` uses
#
# `tables` reads one run that holds both backends (the GPU host's), or a CPU machine's run and a GPU
# machine's run (speed-ups join the first's CPU entries with the second's CUDA entries; thread
# scaling and breakdowns read each run as it is).
# Environment: BUILD (default build) holds bench and hotops-compare, or BENCH and HOTOPS_COMPARE
# name them; the cost per million samples prices the CPU machine at CPU_USD_PER_VCPU_HOUR (default
# 0.05) times the CPU run's num_cpus, and the GPU machine at GPU_USD_PER_HOUR (default 3.00); `run`
# passes BENCH_ARGS on to bench.
# shellcheck disable=SC2034  # MODELS_*, FOCUS_* and TITLE_* are read through ${!name}
set -euo pipefail

BUILD=${BUILD:-build}
BENCH=${BENCH:-$BUILD/bench}
COMPARE=${HOTOPS_COMPARE:-$BUILD/hotops-compare}
CPU_USD_PER_VCPU_HOUR=${CPU_USD_PER_VCPU_HOUR:-0.05}
GPU_USD_PER_HOUR=${GPU_USD_PER_HOUR:-3.00}

usage() {
  sed -n '4,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "studies.sh: $*" >&2
  exit 2
}

# Each study's hotops models (docs/models.md says which script each stands for).
MODELS_tinymlp='mlp_tiny'
MODELS_classifierdl='classifierdl'
MODELS_pyspark='bert_layer|vit_layer|convnext_block'
MODELS_woolf='mlp_mnist|cnn_mnist|vgg_cifar|fasttext_imdb|bilstm_imdb|lstm_textgen'
MODELS_tf2='keras_cnn'
STUDIES='tinymlp classifierdl pyspark woolf tf2'

# The step each study's breakdown shows: the train step at the batch of the study's own script.
FOCUS_tinymlp='mlp_tiny/[a-z]+/f32/train/batch:10'
FOCUS_classifierdl='classifierdl/[a-z]+/f32/train/batch:(32|1024)'
FOCUS_pyspark='(bert_layer|vit_layer|convnext_block)/[a-z]+/f32/train/(shape:[a-z0-9.]+/)?batch:32'
FOCUS_woolf='((mlp_mnist|cnn_mnist|lstm_textgen)/[a-z]+/f32/train/batch:128|(vgg_cifar|fasttext_imdb|bilstm_imdb)/[a-z]+/f32/train/batch:32)'
FOCUS_tf2='keras_cnn/[a-z]+/f32/train/batch:64'

TITLE_tinymlp='The PyTorch tiny-MLP notebook'
TITLE_classifierdl='The Spark NLP ClassifierDL study'
TITLE_pyspark='The PySpark GPU-vs-CPU profiling project'
TITLE_woolf="Max Woolf's cloud CPU/GPU benchmarks"
TITLE_tf2='The TensorFlow 2 CPU-vs-GPU comparison'

# What `run` measures, f32 only (every study trained in f32). Models: the CPU step on all threads
# and on one; the CUDA step in device time and end to end (e2e:1). The cheap models, among them
# all of Max Woolf's but the BiLSTM, also on 4 and 8 threads (his 8-64 vCPU sweep); the three
# dense models also as one CUDA graph (graph:1: what launches cost the smallest steps). The BiLSTM,
# the encoder layers, ConvNeXt and the Keras CNN take seconds per CPU entry (their checks against
# the double-precision reference most of it), so their sweep stops at one thread; the Keras CNN,
# whose train entries take about 10 s each, is measured on one thread and end to end at the
# comparison's own batch, 64, only. Ops: the
# PySpark profiles' hot ops (addmm, mm, bmm, gelu, the AdamW step, ConvNeXt's depthwise conv) on
# the BERT, ViT and ConvNeXt shapes at batch 32.
filter() {
  local study=${1:-}
  local swept='mlp_tiny|classifierdl|mlp_mnist|cnn_mnist|vgg_cifar|fasttext_imdb|lstm_textgen'
  local slow='bilstm_imdb|bert_layer|vit_layer|convnext_block'
  local keras=keras_cnn ops=1
  if [[ -n $study ]]; then  # the study's models in each group, and the ops for PySpark's alone
    local models_var="MODELS_$study"
    swept=$(only_of "$swept" "${!models_var}") slow=$(only_of "$slow" "${!models_var}")
    keras=$(only_of "$keras" "${!models_var}")
    [[ $study == pyspark ]] || ops=0
  fi
  local step='/f32/(infer|train)/(shape:[a-z0-9.]+/)?batch:[0-9]+/'
  local parts=()
  local all
  all=$(join_of "$swept" "$slow" "$keras")
  [[ -n $all ]] && parts+=("^model\.($all)/(cpu|cuda)${step}(real|manual)_time$")
  all=$(join_of "$swept" "$slow")
  [[ -n $all ]] && parts+=("^model\.($all)/cpu${step}threads:1/real_time$")
  [[ -n $swept ]] && parts+=("^model\.($swept)/cpu${step}threads:(4|8)/real_time$")
  [[ -n $all ]] && parts+=("^model\.($all)/cuda${step}e2e:1/manual_time$")
  if [[ -n $keras ]]; then
    parts+=("^model\.keras_cnn/cpu/f32/(infer|train)/batch:64/threads:1/real_time$"
      "^model\.keras_cnn/cuda/f32/(infer|train)/batch:64/e2e:1/manual_time$")
  fi
  all=$(only_of 'mlp_tiny|classifierdl|mlp_mnist' "$swept")
  [[ -n $all ]] && parts+=("^model\.($all)/cuda/f32/train/batch:[0-9]+/graph:1/manual_time$")
  if [[ $ops == 1 ]]; then
    parts+=(
      "^(mm|addmm)/(cpu|cuda)/f32/(fwd|bwd_data|bwd_weight)/shape:(bert|vit)\.[a-z_]+/batch:32/M:[0-9]+/N:[0-9]+/K:[0-9]+/(real|manual)_time$"
      "^bmm/(cpu|cuda)/f32/(fwd|bwd_data|bwd_weight)/shape:(bert|vit)\.attn_[a-z]+/batch:32/heads:12/M:[0-9]+/N:[0-9]+/K:[0-9]+/(real|manual)_time$"
      "^gelu/(cpu|cuda)/f32/(fwd|bwd)/shape:(bert|vit)\.[a-z]+/batch:32/dims:[0-9x]+/approx:none/(real|manual)_time$"
      "^adamw/(cpu|cuda)/f32/step/params:bert_base/.*(real|manual)_time$"
      "^conv2d/(cpu|cuda)/f32/(fwd|bwd_data|bwd_weight)/shape:convnext\.s[13]_dwconv/batch:32/.*/layout:nchw/(real|manual)_time$"
    )
  fi
  local IFS='|'
  echo "${parts[*]}"
}

# The names of the |-list $1 that the |-list $2 holds, as a |-list.
only_of() {
  local out=() m
  local IFS='|'
  for m in $1; do [[ "|$2|" == *"|$m|"* ]] && out+=("$m"); done
  echo "${out[*]}"
}

# The non-empty |-lists of the arguments joined into one.
join_of() {
  local out=() m
  for m in "$@"; do [[ -n $m ]] && out+=("$m"); done
  local IFS='|'
  echo "${out[*]}"
}

# The study's name after --study, checked; empty without the option.
study_arg() {
  [[ $# -eq 2 && $1 == --study ]] || usage
  [[ " $STUDIES " == *" $2 "* ]] || die "--study $2: expected one of: $STUDIES"
  echo "$2"
}

cmd_run() {
  local study=''
  if [[ ${1:-} == --study ]]; then
    study=$(study_arg "${@:1:2}") || exit 2
    shift 2
  fi
  [[ $# -eq 1 ]] || usage
  [[ -x $BENCH ]] || die "$BENCH: no bench executable (build it, or set BUILD or BENCH)"
  # One process: the run's context (machine, versions, settings) then holds for every entry.
  # shellcheck disable=SC2086
  OMP_PROC_BIND=${OMP_PROC_BIND:-close} OMP_PLACES=${OMP_PLACES:-cores} \
    "$BENCH" --benchmark_filter="$(filter "$study")" --benchmark_out="$1" --benchmark_out_format=json ${BENCH_ARGS:-}
}

# The CPU machine's price: CPU_USD_PER_VCPU_HOUR times the run's CPU count.
cpu_price() {
  python3 - "$1" "$CPU_USD_PER_VCPU_HOUR" <<'PY'
import json, sys
n = int(json.load(open(sys.argv[1])).get("context", {}).get("num_cpus", 0))
if n <= 0:
    sys.exit("studies.sh: %s: its context has no num_cpus to price the CPU by" % sys.argv[1])
print("%.2f" % (n * float(sys.argv[2])))
PY
}

# One line on where a run's numbers come from: file, CPU, GPU, hotops revision, verification.
describe() {
  python3 - "$1" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])).get("context", {})
gpu = c.get("gpu_name") or "none"
verify = "" if c.get("hotops_verify", "1") == "1" else ", not verified (--hotops_verify=0)"
print(f"`{sys.argv[1]}`: CPU {c.get('cpu_model', '?')} ({c.get('num_cpus', '?')} CPUs, {c.get('threads', '?')} threads), "
      f"GPU {gpu}; hotops {c.get('hotops_git_revision', '?')}, {c.get('date', '?')[:10]}{verify}")
PY
}

# Runs one hotops-compare report in Markdown without its own title line; a report the run has no
# entries for becomes one line saying so, and the other tables go on.
report() {
  local out err
  err=$(mktemp)
  if out=$("$COMPARE" "$@" --format=md 2>"$err"); then
    # A failed entry's message can list every tensor it checked: its row keeps the first 300 characters.
    printf '%s\n' "$out" | sed -e '/^### hotops-compare /d' -e 's/^#### /##### /' |
      awk '/^\| / && length($0) > 300 { print substr($0, 1, 300) " ... |"; next } { print }'
  else
    echo
    echo "_No table: $(tail -n 1 "$err" | sed 's/^hotops-compare: //')._"
  fi
  rm -f "$err"
}

study_tables() {
  local study=$1 variant=$2 run=$3 gpu=${4:-}
  local models_var="MODELS_$study" focus_var="FOCUS_$study" title_var="TITLE_$study"
  local models=${!models_var} focus=${!focus_var}
  local both=("$run")
  [[ -n $gpu ]] && both+=("$gpu")
  local cpu_usd
  cpu_usd=$(cpu_price "$run")
  local cost="cpu=$cpu_usd,cuda=$GPU_USD_PER_HOUR"

  echo "### ${!title_var}: tables from \`${both[*]}\`"
  echo
  echo "Made by \`tools/studies.sh tables --study $study ${variant:+--cpu-variant $variant }${both[*]}\`. Run: $(describe "$run")${gpu:+; GPU side: $(describe "$gpu")}."
  echo "Prices: the CPU machine $cpu_usd USD/hour ($CPU_USD_PER_VCPU_HOUR a vCPU), the GPU machine $GPU_USD_PER_HOUR USD/hour."
  echo
  # The CPU's entries with the variant's arg, when one is asked for, in the speed-ups and breakdowns.
  local on=() cpu_side='' step_end='(real|manual)_time'
  if [[ -n $variant ]]; then
    on=(--cpu-variant "$variant")
    cpu_side=", the CPU's $variant entries"
    step_end="(${variant}/real_time|manual_time)"
  fi
  echo "#### CPU vs GPU, GPU device time$cpu_side"
  report speedup "${both[@]}" --filter "^model\.($models)/[a-z]+/f32/" --cost "$cost" "${on[@]}"
  if [[ $study == pyspark ]]; then
    # The ops have no thread sweep: their CPU entries run on all the run's threads.
    echo
    echo "#### The profiles' ops, CPU vs GPU, GPU device time"
    report speedup "${both[@]}" --filter "^(mm|addmm|bmm|gelu|adamw|conv2d)/[a-z]+/f32/"
  fi
  echo
  echo "#### CPU vs GPU, GPU end to end (e2e:1: the batch copied from host memory, launches, the result read back)$cpu_side"
  report speedup "${both[@]}" --filter "^model\.($models)/[a-z]+/f32/" --cuda-variant e2e:1 --cost "$cost" "${on[@]}"
  echo
  echo "#### CPU thread scaling"
  report threads "$run" --filter "^model\.($models)/cpu/f32/"
  echo
  echo "#### Where the time goes"
  local r
  for r in "${both[@]}"; do
    report breakdown "$r" --filter "^model\.$focus/$step_end$"
  done
  echo
}

cmd_tables() {
  local only='' variant=''
  while [[ ${1:-} == --* ]]; do
    [[ $# -ge 2 ]] || usage
    case $1 in
      --study) only=$2 ;;
      --cpu-variant) variant=$2 ;;
      *) usage ;;
    esac
    shift 2
  done
  [[ -z $only || " $STUDIES " == *" $only "* ]] || die "--study $only: expected one of: $STUDIES"
  [[ $# -ge 1 && $# -le 2 ]] || usage
  local f
  for f in "$@"; do [[ -r $f ]] || die "$f: cannot read"; done
  [[ -x $COMPARE ]] || die "$COMPARE: no hotops-compare executable (build it, or set BUILD or HOTOPS_COMPARE)"
  local s
  for s in $STUDIES; do
    if [[ -z $only || $only == "$s" ]]; then study_tables "$s" "$variant" "$@"; fi
  done
}

# Rewrites the generated blocks of a page (docs/studies.md). Each block sits between
#   <!-- studies.sh tables --study NAME [--cpu-variant KEY:VALUE] RUN.json [GPU.json] -->  and
#   <!-- end studies.sh -->
# Without runs, each block is made again from the arguments its marker names; with runs, every
# study's first block is made from them alone (its marker updated) and its further blocks are removed.
cmd_doc() {
  [[ $# -ge 1 && $# -le 3 ]] || usage
  local page=$1
  shift
  [[ -r $page ]] || die "$page: cannot read"
  python3 - "$0" "$page" "$@" <<'PY'
import re, subprocess, sys
script, page, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
text = open(page).read()
block = re.compile(r"<!-- studies\.sh tables --study (\S+) ([^>]*?) -->\n.*?<!-- end studies\.sh -->", re.S)
seen = set()
def make(m):
    study, args = m.group(1), m.group(2).split()
    if runs:
        if study in seen:
            return ""
        args = runs
    seen.add(study)
    out = subprocess.run(["bash", script, "tables", "--study", study, *args], check=True, capture_output=True, text=True).stdout
    return "<!-- studies.sh tables --study %s %s -->\n%s<!-- end studies.sh -->" % (study, " ".join(args), out)
new, n = block.subn(make, text)
if n == 0:
    sys.exit("studies.sh: %s has no generated block (<!-- studies.sh tables --study ... -->)" % page)
open(page, "w").write(re.sub(r"\n{3,}", "\n\n", new))
print("studies.sh: %d block(s) of %s made again" % (n, page), file=sys.stderr)
PY
}

case ${1:-} in
  run) shift; cmd_run "$@" ;;
  tables) shift; cmd_tables "$@" ;;
  doc) shift; cmd_doc "$@" ;;
  filter)
    shift
    study=''
    if [[ $# -gt 0 ]]; then study=$(study_arg "$@") || exit 2; fi
    filter "$study"
    ;;
  *) usage ;;
esac
