# Board boot file: the app lives in lib/lockapp (compiled .mpy).
import lockapp.app
lockapp.app.run()
