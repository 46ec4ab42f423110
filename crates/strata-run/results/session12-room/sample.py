import sys, time
g, out = sys.argv[1], sys.argv[2]
keys = ["cache","rss","mapped_file","dirty","writeback","inactive_file","active_file","inactive_anon","active_anon"]
f = open(out, "w"); f.write("t,usage," + ",".join(keys) + "\n")
t0 = time.time()
u = open(g + "/memory.usage_in_bytes"); s = open(g + "/memory.stat")
while True:
    try:
        u.seek(0); usage = int(u.read()); s.seek(0); st = dict(l.split() for l in s.read().splitlines())
    except Exception:
        break
    f.write("%.4f,%d,%s\n" % (time.time() - t0, usage, ",".join(st.get(k, "0") for k in keys)))
    time.sleep(0.001)
