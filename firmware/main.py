# Board boot file; no update replaces it. lockboot (beside it, outside lib/) first puts
# a whole app in lib/ -- it finishes or undoes an update's switch -- and is dropped
# before the app starts, so it holds no heap. The app lives in lib/lockapp (.mpy).
import sys
import lockboot
if lockboot.boot():
    lockboot.run_trial()        # an update on trial: if it cannot run, the old app
del lockboot
sys.modules.pop("lockboot", None)
import lockapp.app
lockapp.app.run()
