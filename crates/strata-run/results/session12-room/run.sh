#!/bin/bash
# usage: run.sh LABEL BUDGET_BYTES [env...]   runs sort in a 32 MiB v1 group with BIN=strata binary, SAMPLE=1 samples the group
G=/sys/fs/cgroup/memory/room$$
mkdir $G
echo 0 > $G/memory.swappiness; echo 0 > $G/memory.oom_control
echo $((32<<20)) > $G/memory.limit_in_bytes; echo $((32<<20)) > $G/memory.memsw.limit_in_bytes
echo 0 > $G/memory.max_usage_in_bytes
kills0=$(grep '^oom_kill ' $G/memory.oom_control | awk '{print $2}')
label=$1; budget=$2; shift 2
BIN=${BIN:-/work/wt-room/target/release/strata}
mkdir -p /tmp/room/store
if [ -n "$SAMPLE" ]; then python3 /tmp/room/sample.py $G /tmp/room/sample-$label.csv & SP=$!; fi
start=$(date +%s.%N)
( echo $BASHPID > $G/tasks; exec env STRATA_STORE=file:/tmp/room/store STRATA_FILE_DIRECT=true "$@" $BIN run --memory ${budget}b --stats /tmp/room/stats-$label.json -- sort -S 100663296b --parallel=1 /tmp/exp/input.txt > /tmp/room/out-$label.txt )
rc=$?
end=$(date +%s.%N)
[ -n "$SAMPLE" ] && kill $SP
kills1=$(grep '^oom_kill ' $G/memory.oom_control | awk '{print $2}')
same=$(cmp -s /tmp/room/out-$label.txt /tmp/exp/ref.txt && echo same || echo DIFF)
faults=$(python3 -c "import json;d=json.load(open('/tmp/room/stats-$label.json'))['totals'];print(d['faults'], round(d['fault_wait_ns']/1e9,2), d['bytes_read']>>20)" 2>/dev/null)
echo "$label rc=$rc $(echo "$end - $start" | bc) s maxusage=$(( $(cat $G/memory.max_usage_in_bytes) >> 10 ))KiB kills=$((kills1-kills0)) $same faults=$faults"
rm -f /tmp/room/out-$label.txt
rmdir $G
