# Board boot file. The app lives in lib/ (lockapp + lockmq.protocol, .mpy); this file
# is never part of an update, so it can always put a working app in lib/ before
# importing it (docs/firmware.md, "Updates that cannot brick"):
#   lib/      the app that runs          lib.new/  an update, complete and verified
#   lib.old/  the app before the update, kept until the new one has proved itself
#   ota.dat   the update's state (JSON; absent when no update is under way)
# Every step is a rename or is repeated after a power cut until its state is saved.
import os
import json


def _has(p):
    try:
        os.stat(p)
        return True
    except OSError:
        return False


def _rm(p):
    try:
        m = os.stat(p)[0]
    except OSError:
        return
    if m & 0x4000:
        for n in os.listdir(p):
            _rm(p + "/" + n)
        os.rmdir(p)
    else:
        os.remove(p)


def _save(s):
    f = open("ota.dat.new", "w")
    f.write(json.dumps(s))
    f.close()
    os.rename("ota.dat.new", "ota.dat")


def _boot():
    try:
        f = open("ota.dat")
        s = json.loads(f.read())
        f.close()
    except (OSError, ValueError):
        s = None
    st = s and s.get("st")
    if st == "staged":              # switch to the update (fw-update verified lib.new)
        if _has("lib.new"):
            if _has("lib"):         # (no lib: cut after this rename; lib.old is the app)
                _rm("lib.old")      # a leftover of an earlier update
                os.rename("lib", "lib.old")
            os.rename("lib.new", "lib")
        s["st"] = st = "trial"
        s["boots"] = 0
        _save(s)                    # (the app counts the trial's boots: lockapp/ota.py)
    if st == "revert":              # back to the app that ran before the update
        _rm("lib")                  # (a frozen board had no lib/: its image's app again)
        if _has("lib.old"):
            os.rename("lib.old", "lib")
        s["st"] = st = "failed"
        _save(s)
    if not _has("lib") and _has("lib.old"):
        os.rename("lib.old", "lib")  # a deploy cut between its two renames
    if _has("lib"):                 # before the image's frozen app (ESP32: .frozen first)
        import sys
        if sys.path[0] != "lib":
            sys.path.insert(0, "lib")
    return st


_trial = _boot() == "trial"
del _boot, _has, _rm            # not held in the app's heap
if _trial:
    try:
        import lockapp.app
        lockapp.app.run()
    except Exception as e:          # the new app cannot even run: the old one next boot
        f = open("ota.dat")
        s = json.loads(f.read())
        f.close()
        s["st"] = "revert"
        s["why"] = "crash_" + type(e).__name__
        _save(s)
        print("E ota trial failed why=" + s["why"])
        try:
            import machine
            machine.reset()
        except (ImportError, AttributeError):
            import sys
            sys.exit(3)             # unix port: status 3 is a reset (the rig boots it again)
else:
    import lockapp.app
    lockapp.app.run()
