#!/usr/bin/env bash
# The owed GPU runs as named stages, each under its own time limit, for one device call.
#
#   source .devbundle/install.sh && bash benchmarks/device_run.sh STAGE[:SECONDS] ...
#
# (through the device tool, with .devbundle/{compiler.so.xz,rest.tar.xz,install.sh} and
# build/py3-none-linux_x86_64/libvtc_tvm_native.so carried). Stages run in the order given, each
# killed at its limit (what it wrote stays: the suite writes its JSON after every case), so a
# call's 600 s go to the most important stage first. Each stage writes under $OUT/<stage>/ (its
# log and JSON) and prints its summary at the end, after the card's name and the commit.
#
#   paper     the paper suite, three columns + torch's best of eager/compile/CUDA graphs (~380 s
#             on an H100)
#   peer      the Llama decode twin timed by our timing and by triton's do_bench (benchmarks/peer_check.py)
#   whole1    whole ShuffleNetV2 / EfficientViT-B1 / YOLO11n at batch 1, no torch (~200 s)
#   whole16   the same at batch 16 (~260 s)
#   ruleab    rule_ab on shufflenet_unit, effvit_attn, yolo_c3k2 at batch 1 and 16
#
# e.g. paper:450 peer:120 in one call, whole1:260 whole16:320 in the next.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?OUT must name the output folder (the device tool sets it)}"
export VTC_TVM_NATIVE_LIB=${VTC_TVM_NATIVE_LIB:-$PWD/build/py3-none-linux_x86_64/libvtc_tvm_native.so}
export PYTHONUNBUFFERED=1
export VTC_COMMIT=${VTC_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}  # the device copy has no .git: pass it
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit $VTC_COMMIT"

declare -A DEFAULT_S=([paper]=450 [peer]=120 [whole1]=260 [whole16]=320 [ruleab]=300)
summaries=()
for spec in "$@"; do
    stage=${spec%%:*}
    limit=${spec#*:}
    [[ "$limit" == "$spec" ]] && limit=${DEFAULT_S[$stage]:-}
    if [[ -z "$limit" ]]; then
        echo "unknown stage: $stage (paper, peer, whole1, whole16, ruleab)" >&2
        exit 2
    fi
    dir=$OUT/$stage
    mkdir -p "$dir"
    case $stage in
        paper) cmd=(python3 -m benchmarks.run --suite paper --batch 1 16 --torch-modes eager compile cudagraphs
                    --repeat 30 --out "$dir")
               summary=(python3 -m benchmarks.paper_summary "$dir/paper.json") ;;
        peer) cmd=(python3 -m benchmarks.peer_check --batch 1 16 --modes eager compile cudagraphs --out "$dir/peer.json")
              summary=(tail -n 12 "$dir/$stage.log") ;;
        whole1|whole16) cmd=(python3 -m benchmarks.run --suite whole --batch "${stage#whole}" --no-torch --repeat 20
                             --out "$dir")
                        summary=(grep -A1 "^== " "$dir/$stage.log") ;;
        ruleab) cmd=(python3 -m benchmarks.rule_ab --workloads shufflenet_unit effvit_attn yolo_c3k2 --batch 1 16
                     --budget-s "$((limit - 40))" --out "$dir")
                summary=(tail -n 20 "$dir/$stage.log") ;;
    esac
    start=$SECONDS
    timeout "$limit" "${cmd[@]}" >"$dir/$stage.log" 2>&1
    rc=$?
    echo "stage $stage: rc=$rc in $((SECONDS - start)) s (limit $limit s)"
    summaries+=("$stage")
    {
        echo "== $stage (rc=$rc)"
        "${summary[@]}" 2>&1 | tail -n 40
    } >"$dir/summary.txt"
done
for stage in "${summaries[@]}"; do cat "$OUT/$stage/summary.txt"; done
