# One line per event on stdout: "<level> <area> <what> [key=value ...]".
# The HIL rig greps these lines; the exact set is listed in firmware/README.md.


def info(msg):
    print("I " + msg)


def warn(msg):
    print("W " + msg)


def error(msg):
    print("E " + msg)


def clean(value):
    # Values in key=value pairs never contain spaces.
    s = str(value)
    if " " in s:
        s = s.replace(" ", "_")
    return s
