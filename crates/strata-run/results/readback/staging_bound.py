#!/usr/bin/env python3
"""Replay of a pager trace (see readback_bound.py) for a read-back cache kept outside the
mapping: read-back pages (eviction-order neighbours of each fault that reads the store) wait
in a FIFO of S slots; a fault on one is served from it (no store read). Prints store reads
cut and read-back pages wasted for a few S and k.

Usage: staging_bound.py TRACE"""
import sys
from array import array
from collections import OrderedDict
def run(path, k, S, kind="evseq"):
    a=array("Q"); a.frombytes(open(path,"rb").read())
    absent={}; order=array("Q"); stage=OrderedDict()
    sync=0; hits=0; rb=0; base=0
    for i in range(2,len(a),2):
        h=a[i]; x=a[i+1]; ev=h>>56; p=h&((1<<56)-1)
        if ev==1:
            absent[p]=len(order); order.append(p); stage.pop(p,None); continue
        if ev==3:
            absent.pop(p,None); stage.pop(p,None); continue
        if ev!=2: continue
        if x==1: absent.pop(p,None); stage.pop(p,None); continue
        base+=1
        pos=absent.pop(p,None)
        if p in stage: del stage[p]; hits+=1; continue
        sync+=1
        if pos is None or k<=1: continue
        c=0
        for d in range(1,2*k+1):
            for q2 in (pos+d,pos-d):
                if c>=k-1: break
                if 0<=q2<len(order):
                    q=order[q2]
                    if absent.get(q)==q2 and q not in stage:
                        stage[q]=1; c+=1; rb+=1
                        if len(stage)>S: stage.popitem(last=False)
    return base,sync,hits,rb
path=sys.argv[1]
for S in (256,1024):
    for k in (2,4,8):
        base,sync,hits,rb=run(path,k,S)
        print(f"stage {S:5d} k {k}: demand {base} sync {sync} cut {1-sync/base:.1%} read back {rb} hits {hits} waste {1-hits/max(rb,1):.1%}")
