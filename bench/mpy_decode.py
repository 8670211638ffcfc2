# MicroPython side of bench_protocol.py: decode rate and heap per frame.
# Usage: micropython mpy_decode.py FRAMES
import sys
import gc
import time

from lockmq import protocol as p

n = int(sys.argv[1])
frame = p.encode_frame(p.Op.PUBLISH, "LK-0A1B2C3D",
                       p.Publish("lock.events", 1, 1763800000123, bytes(24)).encode(), 5)
chunk = frame * 16
dec = p.FrameDecoder()
gc.collect()
free_before = gc.mem_free()
t0 = time.ticks_us()
count = 0
low = free_before
while count < n:
    dec.feed(chunk)
    for f in dec.frames():
        count += 1
    free = gc.mem_free()
    if free < low:
        low = free
elapsed = time.ticks_diff(time.ticks_us(), t0)
gc.collect()
# Allocation per frame: decode one batch with the collector off.
gc.disable()
a = gc.mem_alloc()
dec.feed(chunk)
k = 0
for f in dec.frames():
    k += 1
per_frame = (gc.mem_alloc() - a) / k
gc.enable()
print("frames=%d us=%d bytes_per_frame=%d frame_size=%d peak_heap_use=%d" % (
    count, elapsed, per_frame, len(frame), free_before - low))
