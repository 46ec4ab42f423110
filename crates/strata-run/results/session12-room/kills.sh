#!/bin/bash
b=$1; n=$2
for i in $(seq 1 $n); do
  ./run.sh k-on-$b-$i $b
  ./run.sh k-off-$b-$i $b STRATA_RUN_KEEP_ROOM=off
done
