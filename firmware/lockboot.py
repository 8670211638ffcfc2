# The boot-time half of an update (docs/firmware.md, "Updates that cannot brick"),
# imported by main.py before any app code and dropped after: it lives beside main.py,
# outside the app's lib/, so no update of the app replaces it.
#   lib/      the app that runs          lib.new/  an update, complete and verified
#   lib.old/  the app before the update, kept until the new one has proved itself
#   ota.dat   the update's state (JSON; lockapp/ota.py writes it, boot() moves it on)
# Every step is a rename or is repeated after a power cut until its state is saved.
# It imports nothing from lib/ (it must run when lib/ is damaged or half-swapped), so
# the file helpers both halves need live here, once: lockapp/ota.py imports rm().
import os
import json


def _has(p):
    try:
        os.stat(p)
        return True
    except OSError:
        return False


def rm(p):
    # a file, or a folder and all below it; nothing when absent
    try:
        m = os.stat(p)[0]
    except OSError:
        return
    if m & 0x4000:
        for n in os.listdir(p):
            rm(p + "/" + n)
        os.rmdir(p)
    else:
        os.remove(p)


def _save(s):
    f = open("ota.dat.new", "w")
    f.write(json.dumps(s))
    f.close()
    os.rename("ota.dat.new", "ota.dat")


def boot():
    # Put a whole app in lib/; True when it is an update on trial.
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
                rm("lib.old")       # a leftover of an earlier update
                os.rename("lib", "lib.old")
            os.rename("lib.new", "lib")
        s["st"] = st = "trial"
        s["boots"] = 0
        _save(s)                    # (the app counts the trial's boots: lockapp/ota.py)
    if st == "revert":              # back to the app that ran before the update
        rm("lib")                   # (a frozen board had no lib/: its image's app again)
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
    return st == "trial"


def run_trial():
    # The update on trial runs from here (this module stays loaded meanwhile).
    try:
        import lockapp.app
        lockapp.app.run()
    except Exception as e:
        crashed(e)


def crashed(e):
    # The new app could not even run: the old one at the next boot, which is now.
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
        sys.exit(3)                 # unix port: status 3 is a reset (the rig boots it again)


