#!/usr/bin/env bash
# The H200 runs behind results/nvidia-h200 (through the device tool; see ../shared/device/README.md):
#   carry [".gl", ".whl"], command: bash scripts/h200-run.sh bench   (then: ... extra)
#   the device receives the files with a stale .git, so name the commit the runs record:
#   KBENCH_GIT_REVISION=$(git rev-parse HEAD) written out in the command, e.g. KBENCH_GIT_REVISION=1b4df67 bash ...
# bench: the issue-7 cases with the PyTorch/CUDA peer in the same run (one `kbench bench`), the transfer probe
#        and the streamed-transfer tests.
# extra: kernel probes (variants, fp16 matrix-vector peer), queue configurations, validate, runtime tests.
# packed: quantized_matmul on repacked weights (layout=packed): its tests, the probe's variants beside the
#         automatic kernel, and the bench's Q4_0/Q8_0/Q6_K cases with it, peer in the same run.
# foreign: third-party kernels (issue 18): Yule's declared shaders through validate and bench, and kbench's own
#          kernels beside ggml's Vulkan backend (--peer ggml) on the same shapes; carry also
#          ["third_party/yule", "third_party/ggml-bin"] (scripts/build-ggml-peer.sh; the binary may be xz'd).
# batches: the packed kernel's tests, batches of 1-8 vectors with x held per workgroup (chunks) against x from a
#          first dispatch (16- and 8-bit x) beside torch's fp16 mm, and the bench's rotated quantized cases
# round3: issue 20's ratios in one session: the read floor, the bench beside torch (quantized, fp32/fp16/bf16
#         matmul, 64 MiB copy; batches of 2, 4 and 8 vectors), the batch probe, then kbench beside ggml's full-feature build where
#         both re-read one matrix; carry also ["third_party/ggml-carry"]: `xz -9` of the full-feature build's
#         third_party/ggml-bin-full/test-backend-ops, its build.json, and lib/ with the build machine's
#         libstdc++.so.6 and libgomp.so.1 (real files) for a device whose own are older.
#         Then: python scripts/issue20_targets.py RUNS... --read-floor read_floor.log
# round5: ablate's twins of the halving reduction (1 vector; batches of 2, 4, 8), the bench's batches
#         beside torch, then quantized (carry as round3); about 7 minutes
# coop: batches of 2, 4, 8 vectors on cooperative matrices (the coop knob; knob sets in $COOP_KNOBS) beside the
#       automatic packed kernel and torch's fp16 mm, after the kernel's tests on the device's real matrices; then
#       at 8 vectors of Q4_0 its timeline twin (workgroups resident at once, a step's time) and ablated twins
#       ($COOP_CUTS: no weight reads, no decoding, no products), compiled on the device by a glslang >= 13 copied
#       to .gl/glslang (with this machine's libstdc++.so.6 in .gl/lib/ for a device whose own is older), and the
#       knob sets (each with the twins of $COOP_KNOB_CUTS, default: its timeline)
# units: one vector of every format with the packed kernel's timeline, then batches of 2, 4, 8 vectors beside
#        torch's fp16 mm (Q6_K's packed layout by unit, README round 8); about 4 minutes
# splits: the packed kernel with its rows split over $SPLITS (default "2 2:last 4:last") workgroups each (knob splits;
#         partial sums added by a second dispatch, or with :last by the last split) for 1 and 8 vectors, beside the automatic kernel's and torch's figures of
#         the same call; with $SPLIT_CUT=timeline also each split kernel's timeline; about 3 minutes
# kquants: one vector of Q4_K and Q6_K (the ggml gaps of round 5) under the GGUF kernels, packed and fp32-decoding
#          shapes beside the automatic kernel (ggml's Q4_K reads x as fp32 with 16 lanes a superblock, 2 rows a
#          workgroup of one subgroup: fast:16:1:2 has that split, fast:32:2:1 and fast:64:2:1 are wider; where k > 4096
#          ggml quantizes x to 8 bits (q8_1, its MMVQ path on NVIDIA): packedw8 is kbench's like for like); about a
#          minute ($KQ_VARIANTS: fewer)
# quantized: round3's quantized_matmul rows alone (read floor, bench beside torch, ggml like for like, and kbench's
#            8-bit x where ggml quantizes x: probe_x8_reread.log); carry as round3; about 3 minutes
# ablate: where the packed kernel's time goes: the automatic kernel beside its ablated twins (cut: variants of
#         `kbench probe qmatvec`: a butterfly of every sum as before the halving reduction, x by a lane per
#         block as before the quads, no x quantization, no decoding and dots, no weight loads) and the shapes of
#         $VARIANTS, with the driver's registers per invocation (--stats), and the pipeline-statistics tests;
#         then 8-vector batches of Q4_0 at the automatic shape, its cut twins and the knob sets of $BATCH_KNOBS,
#         with registers
# mainjob: the main job beside the torch peer (`kbench bench --validate --peer torch`, what `nox -s bench -- --peer
#          torch` runs) and `kbench bench --quick --peer torch`, each timed by the shell (issue 20's 5 minutes and 90
#          seconds); logs main-job.log and quick.log with their "where the time went" summaries, the torch peer's
#          tests at the end of gpu.txt; about 6 minutes
# onevec: one vector of Q4_0, Q8_0, Q4_K, Q6_K (or $DTYPES) under each knob set of $ONE_KNOBS (sets split by ';';
#         default: the automatic kernel (rows spread evenly over the SMs; long rows with staggered first loads),
#         each lane quantizing the blocks of x its units meet (xq=lane: no x in shared memory, no barrier) at the
#         automatic rows per team and at 4 and 8 rows a team one unit ahead (each lane's x then serves more rows),
#         and the automatic kernel without staggered loads (stagger=false)), with registers,
#         each kernel's timeline twin (how many workgroups were resident at once; ONE_CUT= leaves it out) and the
#         read floor; about two minutes
# cm2: matmul_f16 at 4096^3 and 8192^3 on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2) under
#      the variants of $CM2_TILES (cm2:BMxBNxBKxTHREADSxGROUP_MxUNROLL, the probe's --coop-variant, cm2t: the same
#      reading B transposed, written once by a transpose pass; default: the automatic 128x256x32 on 256 invocations unrolled 16
#      times, it and ggml's 128x256x64 reading B transposed, a shallower slice unrolled deeper, other row-group
#      sweeps, deeper unrolls, 128-invocation and 256x128 tiles) beside torch's fp16 matmul; about three minutes
# ggml8: 8 vectors of Q4_0 / Q8_0 / Q4_K / Q6_K beside torch's fp16 mm (the batch probe), then re-reading one matrix
#        (the bench's rotate_mib=0,n_vecs=8 rows, --full) beside ggml's full-feature build, with kbench's and ggml's
#        fp16 matmul at 4096^3 and 8192^3; carry also ["third_party/ggml-carry"] (as round3); about 5 minutes
# Writes result runs and logs under $OUT (at most 8 files come back); with several parts named, each part's under
# $OUT/<part>/.
set -u
out=${OUT:-out}; mkdir -p "$out"
# several parts in one call (each device start costs minutes): bash scripts/h200-run.sh onevec cm2 runs each
# part in turn (each sets the machine up itself), its files under $OUT/<part>/ (at most 8 files come back in all)
if [ $# -gt 1 ]; then
  for part in "$@"; do
    echo "### $part"
    OUT=$out/$part bash "$0" "$part"
  done
  exit 0
fi
source .gl/device-env.sh
# the probes' cut twins are compiled on the device: by the glslang that built the shipped SPIR-V where one is carried
# as .gl/glslang (cp third_party/glslang/bin/glslangValidator .gl/glslang, with this machine's libstdc++.so.6 in
# .gl/lib/ for a device whose own is older; docs/shaders.md), else by the device's glslang 12 (the probe says so)
if [ -x .gl/glslang ]; then
  export KBENCH_GLSLANG=$PWD/.gl/glslang
  "$KBENCH_GLSLANG" --version > /dev/null 2>&1 || export LD_LIBRARY_PATH=$PWD/.gl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export PYTHONUNBUFFERED=1
what=${1:-bench}
# the card, driver and clocks at the start of a run
gpu_txt() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt" 2>&1
}
# ggml's test-backend-ops from a carried folder DIR (the binary, maybe xz'd, and lib/): sets $bin; the binary was
# built on Debian bookworm: where this machine's libstdc++/libgomp are older, the carried ones are used
ggml_binary() {
  bin=$1/test-backend-ops
  [ -f "$bin.xz" ] && [ ! -f "$bin" ] && xz -dk "$bin.xz" && chmod +x "$bin"
  "$bin" --list-ops > /dev/null 2>&1 || export LD_LIBRARY_PATH=$PWD/$1/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  "$bin" --list-ops > /dev/null 2>&1 || echo "ggml binary does not run here: $("$bin" --list-ops 2>&1 | tail -2)"
}
if [ "$what" = bench ]; then
  mkdir -p "$out/b"
  gpu_txt
  k=()
  for c in add element_mul silu; do k+=(-k "$c[size=16777216]" -k "$c[size=268435456]"); done
  for c in softmax rms_norm; do k+=(-k "$c[size=16777216," -k "$c[size=268435456,"); done
  for d in Q4_0 Q8_0 Q4_K Q6_K F16; do k+=(-k "rotate_mib=256,dtype=$d]"); done
  k+=(-k "matmul[m=4096" -k "matmul[m=8192" -k "matmul_f16[m=4096" -k "matmul_f16[m=8192" \
      -k "attention[head_dim=128,seq_len=8192" -k "copy_buffer[size=1073741824]" -k "copy_buffer[size=67108864]" \
      -k "copy_roundtrip[size=536870912]" -k "issue_rate" -k "kp_sync[size=16777216,dtype=float32]")
  timeout ${BENCH_S:-540} python3 -m kbench bench --full --peer torch --quiet --out "$out/b" "${k[@]}" > "$out/bench.log" 2>&1
  tail -8 "$out/bench.log"
  # the peer's fp16 matrix-vector product of the quantized_matmul shapes (torch.mv, CUDA events), same machine
  timeout 40 python3 -m kbench.probes qmatvec --torch-only > "$out/torch_mv.log" 2>&1
  cat "$out/torch_mv.log"
  # the two halves of a staged transfer and the streamed syncs; the streamed-transfer tests
  timeout ${TRANSFER_S:-60} python3 -m kbench.probes transfer --mib 256 > "$out/probe_transfer.log" 2>&1
  tail -14 "$out/probe_transfer.log"
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-60} python3 -m pytest tests/test_runtime_transfer.py -q -p no:cacheprovider > "$out/tests.log" 2>&1
  tail -2 "$out/tests.log"
elif [ "$what" = mainjob ]; then
  mkdir -p "$out/m" "$out/q"
  gpu_txt
  # the torch peer's tests (its weights dequantized once per matrix): they need CUDA, so they run here
  KBENCH_VALIDATION=0 timeout 120 python3 -m pytest tests/test_torch_peer_weights.py -q -rs -p no:cacheprovider \
    >> "$out/gpu.txt" 2>&1
  tail -2 "$out/gpu.txt"
  { time timeout ${MAIN_S:-420} python3 -m kbench bench --validate --peer torch --out "$out/m"; echo "exit $?"; } \
    > "$out/main-job.log" 2>&1
  tail -12 "$out/main-job.log"
  { time timeout ${QUICK_S:-150} python3 -m kbench bench --quick --peer torch --out "$out/q"; echo "exit $?"; } \
    > "$out/quick.log" 2>&1
  tail -12 "$out/quick.log"
  tar czf "$out/runs.tgz" -C "$out" m q && rm -rf "$out/m" "$out/q"
elif [ "$what" = round3 ]; then
  mkdir -p "$out/b"
  gpu_txt
  timeout 60 python3 -m kbench.probes read_floor > "$out/read_floor.log" 2>&1
  grep "^# floor" "$out/read_floor.log"
  k=()
  for d in Q4_0 Q8_0 Q4_K Q6_K; do k+=(-k "rotate_mib=256,dtype=$d]"); done
  k+=(-k "matmul[m=4096" -k "matmul[m=8192" -k "matmul_f16[m=4096" -k "matmul_f16[m=8192" -k "matmul_bf16[m=4096" \
      -k "copy_buffer[size=67108864]")
  timeout ${BENCH_S:-200} python3 -m kbench bench --peer torch --quiet --out "$out/b" "${k[@]}" > "$out/bench.log" 2>&1
  tail -8 "$out/bench.log"
  # batches of 2, 4, 8 vectors (--full instances) beside the torch peer; the probe adds torch's fp16 mm and 8-bit x
  timeout ${BATCH_S:-200} python3 -m kbench bench --full --peer torch --quiet --out "$out/b" -k "rotate_mib=256,n_vecs=" \
    > "$out/bench-batches.log" 2>&1
  tail -4 "$out/bench-batches.log"
  timeout 90 python3 -m kbench.probes qmatvec --vecs 1 2 4 8 --x-bits 16 8 --dtypes Q4_0 --repeats 3 > "$out/probe_vecs.log" 2>&1
  tail -16 "$out/probe_vecs.log"
  ggml_binary third_party/ggml-carry
  g=()
  for d in Q4_0 Q8_0 Q4_K Q6_K; do g+=(-k "rotate_mib=0,dtype=$d]"); done
  g+=(-k "matmul_f16[m=4096" -k "matmul_f16[m=8192" -k "matmul_bf16[m=4096")
  timeout ${GGML_S:-200} python3 -m kbench bench --full --peer ggml --ggml-bin "$bin" --quiet --out "$out/b" "${g[@]}" \
    > "$out/ggml-bench.log" 2>&1
  tail -8 "$out/ggml-bench.log"
  tar czf "$out/runs.tgz" -C "$out" b && rm -rf "$out/b"
elif [ "$what" = round5 ]; then
  # one session's figures (about 7 minutes): ablate's halving twins for 1 vector and batches of 2, 4, 8,
  # the bench's batches beside torch, then quantized's rows; logs packed in logs.tgz, result runs in runs.tgz
  export CUT_VARIANTS=${CUT_VARIANTS:-auto cut:halving:auto cut:x:auto cut:x+dots:auto cut:x+loads+dots:auto}
  export VECS=${VECS:-2 4 8} BATCH_CUTS=${BATCH_CUTS:-halving dots} BATCH_KNOBS=${BATCH_KNOBS:-}
  OUT=$out/ablate bash "$0" ablate | grep -v '^# warmed'
  mkdir -p "$out/quantized/b"
  timeout ${BATCH_S:-150} python3 -m kbench bench --full --peer torch --quiet --out "$out/quantized/b" \
    -k "rotate_mib=256,n_vecs=" > "$out/quantized/bench-batches.log" 2>&1
  tail -4 "$out/quantized/bench-batches.log"
  OUT=$out/quantized bash "$0" quantized
  mv "$out/quantized/runs.tgz" "$out/runs.tgz"
  tar czf "$out/logs.tgz" -C "$out" ablate quantized && rm -rf "$out/ablate" "$out/quantized"
elif [ "$what" = coop ]; then
  # batches on cooperative matrices (shaders/qmatmul_coop.comp, the coop knob) against the automatic packed
  # kernel and torch's fp16 mm, same run: its tests on the real matrices first, then shapes and splits
  gpu_txt
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-90} python3 -m pytest tests/test_qmatmul_coop.py -q -p no:cacheprovider \
    > "$out/tests.log" 2>&1
  tail -3 "$out/tests.log"
  p=(python3 -m kbench.probes qmatvec --stats --repeats 3 --dtypes ${DTYPES:-Q4_0 Q8_0} --vecs ${VECS:-2 4 8})
  timeout ${BATCH_S:-120} "${p[@]}" > "$out/probe_coop.log" 2>&1
  echo "# knobs: coop=true" >> "$out/probe_coop.log"
  CUDA_VISIBLE_DEVICES= timeout ${BATCH_S:-120} "${p[@]}" --knobs coop=true >> "$out/probe_coop.log" 2>&1
  # launch shapes at 8 vectors (Q4_0) beside the default (README, rounds 6-8): one subgroup, one block a step,
  # 4 splits, loads one step ahead; each with its timeline (workgroups resident per SM, a step's time)
  echo "# knobs: coop=true, cuts: ${COOP_CUTS-timeline loads decode dots}" >> "$out/probe_coop.log"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES= timeout ${KNOB_S:-45} python3 -m kbench.probes qmatvec --stats --repeats 3 --dtypes Q4_0 \
    --vecs 8 --knobs coop=true --cut ${COOP_CUTS-timeline loads decode dots} >> "$out/probe_coop.log" 2>&1
  IFS=';' read -ra sets <<< "${COOP_KNOBS-coop=true coop_subgroups=1;coop=true coop_unroll=1;coop=true coop_splits=4;coop=true coop_depth=1}"
  knob_cuts=${COOP_KNOB_CUTS-timeline}
  for set in "${sets[@]}"; do
    echo "# knobs: $set" >> "$out/probe_coop.log"
    # shellcheck disable=SC2086  # (no CUDA device: torch's figure is the first run's)
    CUDA_VISIBLE_DEVICES= timeout ${KNOB_S:-45} python3 -m kbench.probes qmatvec --stats --repeats 3 --dtypes Q4_0 \
      --vecs 8 --knobs $set ${knob_cuts:+--cut $knob_cuts} >> "$out/probe_coop.log" 2>&1
  done
  grep -v "^# warmed" "$out/probe_coop.log"
elif [ "$what" = units ]; then
  # Q6_K's packed layout by unit (README, performance round 8): one vector of every format with the packed
  # kernel's timeline (workgroups per SM), then batches of 2, 4 and 8 vectors beside torch's fp16 mm
  gpu_txt
  CUDA_VISIBLE_DEVICES= timeout ${ONE_S:-80} python3 -m kbench.probes qmatvec --stats --repeats 3 --no-floor \
    --variants auto cut:timeline:packedw > "$out/probe_one.log" 2>&1
  # shellcheck disable=SC2086
  timeout ${BATCH_S:-150} python3 -m kbench.probes qmatvec --stats --repeats 3 --vecs ${VECS:-2 4 8} \
    > "$out/probe_vecs.log" 2>&1
  grep -v "^# warmed" "$out/probe_one.log" "$out/probe_vecs.log"
elif [ "$what" = splits ]; then
  gpu_txt
  for sp in auto ${SPLITS:-2 2:last 4:last}; do
    kn=(layout=packed); [ "$sp" != auto ] && kn+=("splits=${sp%%:*}"); [ "${sp#*:}" = last ] && kn+=(split_sum=last)
    echo "## knobs ${kn[*]}"
    # shellcheck disable=SC2086
    timeout ${SPLIT_S:-75} python3 -m kbench.probes qmatvec --vecs 1 8 --repeats 3 --stats --knobs "${kn[@]}" \
      ${SPLIT_CUT:+--cut $SPLIT_CUT} 2>&1 | grep -v "^# warmed"
  done > "$out/probe_splits.log"
  cat "$out/probe_splits.log"
elif [ "$what" = onevec ]; then
  gpu_txt
  timeout 60 python3 -m kbench.probes read_floor > "$out/read_floor.log" 2>&1
  grep "^# floor" "$out/read_floor.log"
  IFS=';' read -ra sets <<< "${ONE_KNOBS:-;xq=lane;xq=lane rows=4 unroll=1;xq=lane rows=8 unroll=1;stagger=false}"
  for ks in "${sets[@]}"; do
    # shellcheck disable=SC2086
    kn=(layout=packed $ks)
    echo "## knobs ${kn[*]}"
    # shellcheck disable=SC2086
    timeout ${ONE_S:-100} python3 -m kbench.probes qmatvec --vecs 1 --repeats 3 --stats --dtypes ${DTYPES:-Q4_0 Q8_0 Q4_K Q6_K} \
      --knobs "${kn[@]}" ${ONE_CUT---cut timeline} 2>&1 | grep -v "^# warmed\|^fp16"
  done > "$out/probe_onevec.log"
  cat "$out/probe_onevec.log"
elif [ "$what" = cm2 ]; then
  gpu_txt
  v=()
  # cm2t: the same tile reading B transposed (written once by a transpose pass, timed on its own), as ggml's coopmat2 matmul
  # reads its operands (its 128x256x64 on 256 invocations was 301 / 312 TFLOP/s where ours read 245 / 271)
  for t in ${CM2_TILES:-cm2:128x256x32x256x8x16 cm2t:128x256x32x256x8x16 cm2t:128x256x64x256x8x8 \
      cm2t:128x128x32x128x8x16 cm2:128x256x16x256x8x32 cm2:128x256x32x256x4x16 cm2:128x256x32x256x16x16 \
      cm2:128x256x32x256x8x32 cm2:128x128x32x128x8x16 cm2:256x128x32x256x8x16 cm2:128x128x64x256x8x8}; do
    v+=(--coop-variant "$t")
  done
  # the coopmat2 tests on the device's real matrices first (B as given and transposed, against float64)
  KBENCH_VALIDATION=0 timeout 90 python3 -m pytest tests/test_matmul_coop2.py -q -rs -p no:cacheprovider > "$out/tests-cm2.log" 2>&1
  tail -2 "$out/tests-cm2.log"
  timeout ${CM2_S:-230} python3 -m kbench.probes matmul --kinds fp16 --budget 200 "${v[@]}" > "$out/probe_matmul_cm2.log" 2>&1
  grep -v "^#\|flexible\|^  16" "$out/probe_matmul_cm2.log" | tail -24
elif [ "$what" = ggml8 ]; then
  # 8 vectors beside torch's fp16 mm (the probe: weights rotating past the L2, as torch's), then re-reading one
  # matrix beside ggml's full-feature build, with both fp16 matmuls
  mkdir -p "$out/b"
  gpu_txt
  timeout ${BATCH_S:-120} python3 -m kbench.probes qmatvec --vecs 8 --dtypes Q4_0 Q8_0 Q4_K Q6_K --repeats 3 \
    > "$out/probe_vecs8.log" 2>&1
  tail -12 "$out/probe_vecs8.log"
  ggml_binary third_party/ggml-carry
  timeout ${GGML_S:-240} python3 -m kbench bench --full --peer ggml --ggml-bin "$bin" --quiet --out "$out/b" \
    -k "rotate_mib=0,n_vecs=8" -k "matmul_f16[m=4096" -k "matmul_f16[m=8192" > "$out/ggml-bench.log" 2>&1
  tail -8 "$out/ggml-bench.log"
  tar czf "$out/runs.tgz" -C "$out" b && rm -rf "$out/b"
elif [ "$what" = kquants ]; then
  gpu_txt
  # shellcheck disable=SC2086
  timeout ${KQ_S:-75} python3 -m kbench.probes qmatvec --stats --repeats 3 --dtypes ${DTYPES:-Q4_K Q6_K} --variants \
    ${KQ_VARIANTS:-auto gguf packed packed:64:4 packed:128:4 packed:256:2 packedw:128:16 packedw:256:16 packedw8 \
    fast:16:1:2 fast:32:2:1 fast:64:2:1 fast:128:4:1 fast:256:2:1 dot:256:4:1 dotx:256:4:1} > "$out/probe_kquants.log" 2>&1
  grep -v "^# warmed" "$out/probe_kquants.log" | tail -45
elif [ "$what" = quantized ]; then
  # round3's quantized_matmul part alone: read floor, bench beside torch, ggml like for like
  mkdir -p "$out/b"
  gpu_txt
  timeout 60 python3 -m kbench.probes read_floor > "$out/read_floor.log" 2>&1
  grep "^# floor" "$out/read_floor.log"
  k=(); g=()
  for d in Q4_0 Q8_0 Q4_K Q6_K; do k+=(-k "rotate_mib=256,dtype=$d]"); g+=(-k "rotate_mib=0,dtype=$d]"); done
  timeout ${BENCH_S:-150} python3 -m kbench bench --peer torch --quiet --out "$out/b" "${k[@]}" \
    -k "copy_buffer[size=67108864]" > "$out/bench.log" 2>&1
  tail -4 "$out/bench.log"
  ggml_binary third_party/ggml-carry
  timeout ${GGML_S:-150} python3 -m kbench bench --full --peer ggml --ggml-bin "$bin" --quiet --out "$out/b" "${g[@]}" \
    > "$out/ggml-bench.log" 2>&1
  tail -4 "$out/ggml-bench.log"
  # ggml's precision where it quantizes x to 8 bits (q8_1: Q4_0 and Q4_K with k > 4096 on NVIDIA), re-reading one matrix
  timeout 60 python3 -m kbench.probes qmatvec --vecs 1 --copies 1 --x-bits 16 8 --dtypes Q4_0 Q4_K --shapes 4096x14336 \
    --repeats 3 > "$out/probe_x8_reread.log" 2>&1
  grep "^Q4_" "$out/probe_x8_reread.log"
  tar czf "$out/runs.tgz" -C "$out" b && rm -rf "$out/b"
elif [ "$what" = ablate ]; then
  gpu_txt
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-60} python3 -m pytest tests/test_runtime_pipeline_statistics.py -q -rs \
    -p no:cacheprovider > "$out/tests.log" 2>&1
  tail -3 "$out/tests.log"
  timeout ${PROBE_S:-300} python3 -m kbench.probes qmatvec --stats --repeats 3 --dtypes ${DTYPES:-Q4_0 Q8_0 Q6_K} \
    --variants ${CUT_VARIANTS:-auto cut:halving:auto cut:quads:auto cut:x:auto cut:dots:auto cut:x+dots:auto cut:loads:auto \
    cut:x+loads+dots:auto} ${VARIANTS:-} \
    > "$out/probe_ablate.log" 2>&1
  cat "$out/probe_ablate.log"
  # 8 vectors (the batch that does not beat torch's fp16 mm): the automatic shape and the knob sets of
  # $BATCH_KNOBS (';' between sets), registers per invocation beside each
  IFS=';' read -ra sets <<< "${BATCH_KNOBS-layout=packed rows=1;layout=packed rows=2 unroll=1;layout=packed lanes=16 rows=1}"
  timeout ${BATCH_S:-120} python3 -m kbench.probes qmatvec --vecs ${VECS:-8} --x-bits 16 8 --stats --dtypes Q4_0 \
    --repeats 3 > "$out/probe_vecs8.log" 2>&1
  # where a batch's time goes: its ablated twins (butterfly reduction, x by a lane per block, no x, no dots,
  # no loads)
  CUDA_VISIBLE_DEVICES= timeout ${BATCH_S:-120} python3 -m kbench.probes qmatvec --vecs ${VECS:-8} --stats \
    --dtypes Q4_0 --repeats 3 --knobs layout=packed --cut ${BATCH_CUTS:-halving quads x dots x+dots loads} \
    >> "$out/probe_vecs8.log" 2>&1
  for set in "${sets[@]}"; do
    echo "# knobs: $set" >> "$out/probe_vecs8.log"
    # shellcheck disable=SC2086  # (no CUDA device: torch's figure is the first run's)
    CUDA_VISIBLE_DEVICES= timeout ${BATCH_S:-120} python3 -m kbench.probes qmatvec --vecs 8 --stats --dtypes Q4_0 \
      --repeats 3 --knobs $set >> "$out/probe_vecs8.log" 2>&1
  done
  cat "$out/probe_vecs8.log"
elif [ "$what" = batches ]; then
  mkdir -p "$out/b"
  gpu_txt
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-150} python3 -m pytest tests/test_qmatvec_vectors.py tests/test_qmatvec_packed.py \
    tests/test_qmatvec_kernels.py -k "packed or chunk or vector" -q -p no:cacheprovider > "$out/tests.log" 2>&1
  tail -3 "$out/tests.log"
  # batches of vectors: x held by each workgroup (in chunks where it does not fit whole) against x from a first
  # dispatch, 16- and 8-bit x, beside torch's fp16 mm of the same batch
  timeout ${PROBE_S:-240} python3 -m kbench.probes qmatvec --vecs 1 2 4 8 --x-bits 16 8 --x-from auto dispatch \
    --dtypes ${DTYPES:-Q4_0 Q6_K} --repeats 3 > "$out/probe_vecs.log" 2>&1
  cat "$out/probe_vecs.log"
  k=()
  for d in Q4_0 Q8_0 Q4_K Q6_K; do k+=(-k "rotate_mib=256,dtype=$d]"); done
  timeout ${BENCH_S:-150} python3 -m kbench bench --quiet --out "$out/b" "${k[@]}" -k "copy_buffer[size=67108864]" \
    > "$out/bench.log" 2>&1
  tail -12 "$out/bench.log"
  tar czf "$out/runs.tgz" -C "$out" b && rm -rf "$out/b"
elif [ "$what" = foreign ]; then
  mkdir -p "$out/f"
  gpu_txt
  ggml_binary third_party/ggml-bin
  timeout ${VALIDATE_S:-120} python3 -m kbench validate --kernels yule --source third_party/yule -q single --quiet \
    --out "$out/f" > "$out/yule-validate.log" 2>&1
  tail -20 "$out/yule-validate.log"
  k=()
  for c in add element_mul; do k+=(-k "$c[size=16777216]" -k "$c[size=268435456]"); done
  for c in softmax rms_norm; do k+=(-k "$c[size=16777216,"); done
  g=()  # ggml re-reads one matrix: its quantized rows go to the rotate_mib=0 instances (peer_ggml.py)
  for d in Q4_0 Q8_0 Q4_K Q6_K F16; do k+=(-k "rotate_mib=256,dtype=$d]"); g+=(-k "rotate_mib=0,dtype=$d]"); done
  timeout ${BENCH_S:-260} python3 -m kbench bench --full --peer ggml --ggml-bin "$bin" --quiet --out "$out/f" "${k[@]}" \
    "${g[@]}" > "$out/ggml-bench.log" 2>&1
  tail -6 "$out/ggml-bench.log"
  timeout ${YULE_S:-200} python3 -m kbench bench --full --kernels yule --source third_party/yule --quiet --timeout 60 \
    --out "$out/f" "${k[@]}" -k "silu_mul[size=16777216]" -k "attention[head_dim=128,seq_len=8192" \
    -k "matmul[m=1024" -k "rope[head_dim=128,n_heads_q=32" > "$out/yule-bench.log" 2>&1
  tail -6 "$out/yule-bench.log"
  tar czf "$out/runs.tgz" -C "$out" f && rm -rf "$out/f"
  cat "$out"/*.log > "$out/logs.txt" && rm -f "$out"/*.log
elif [ "$what" = packed ]; then
  mkdir -p "$out/p"
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-60} python3 -m pytest tests/test_qmatvec_packed.py tests/test_qmatvec_kernels.py \
    -k "packed or auto" -q -rs -p no:cacheprovider > "$out/tests.log" 2>&1
  tail -3 "$out/tests.log"
  timeout ${PROBE_S:-200} python3 -m kbench.probes qmatvec --dtypes Q4_0 Q8_0 Q6_K --variants auto packed packed:64:4 \
    packed:128:2 packed:128:4 packed:128:8 packed:256:4 packed:256:8 packed:512:4 packedw:128:8 packedw:128:16 \
    packedw:256:16 packedw:256:32 > "$out/probe_qmatvec_packed.log" 2>&1
  tail -24 "$out/probe_qmatvec_packed.log"
  KBENCH_QMATVEC=layout=packed timeout ${BENCH_S:-200} python3 -m kbench bench --peer torch --quiet --out "$out/p" \
    -k "rotate_mib=256,dtype=Q4_0]" -k "rotate_mib=256,dtype=Q8_0]" -k "rotate_mib=256,dtype=Q6_K]" \
    -k "copy_buffer[size=67108864]" > "$out/bench.log" 2>&1
  tail -6 "$out/bench.log"
else
  mkdir -p "$out/q" "$out/v"
  for p in matmul qmatvec; do
    timeout 170 python3 -m kbench.probes "$p" > "$out/probe_$p.log" 2>&1
    tail -40 "$out/probe_$p.log"
  done
  # the new kernels through the bench, with the peer in the same run
  mkdir -p "$out/k"
  timeout ${KBENCH_S:-200} python3 -m kbench bench --peer torch --quiet --out "$out/k" \
    -k "rotate_mib=256,dtype=Q4_0]" -k "rotate_mib=256,dtype=Q8_0]" -k "rotate_mib=256,dtype=Q4_K]" \
    -k "rotate_mib=256,dtype=Q6_K]" -k "matmul[m=4096" -k "matmul[m=8192" -k "matmul_f16[m=4096" -k "matmul_f16[m=8192" \
    -k "softmax[size=16777216," -k "rms_norm[size=16777216," > "$out/kbench.log" 2>&1
  tail -5 "$out/kbench.log"
  # parallel queues: one queue, several queues of family 0, one queue per compute family (0 and 2), async
  timeout ${QUEUE_S:-80} python3 -m kbench bench -q all --no-peaks --quiet --out "$out/q" \
    -k "add[size=16777216]" -k "matmul[m=1024" -k "kp_mult[size=16777216]" > "$out/queues.log" 2>&1
  tail -4 "$out/queues.log"
  # the driver's instance-cycle limit, and fd/thread growth across Manager cycles
  timeout 100 python3 -m kbench.probes lifetimes --cycles 100 --raw-instances 60 > "$out/lifetimes.log" 2>&1
  tail -3 "$out/lifetimes.log"
  KBENCH_VALIDATION=0 timeout ${TESTS_S:-150} python3 -m pytest tests/test_runtime_kompute.py tests/test_runtime_semantics.py \
    tests/test_runtime_lifetimes.py tests/test_runtime_device.py tests/test_vulkan_backend.py tests/test_reductions.py \
    tests/test_qmatvec_kernels.py -q -rs -p no:cacheprovider > "$out/tests.log" 2>&1
  tail -4 "$out/tests.log"
fi
