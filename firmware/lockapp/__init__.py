# lockmq lock firmware (MicroPython). See firmware/README.md.
try:
    from lockapp._version import VERSION  # written by `lockmq firmware build`
except ImportError:
    VERSION = "dev"  # run straight from the source tree
